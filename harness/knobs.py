"""Environment knobs read by the harness, declared once each: name, type, default, one line of doc.

Read them through `get(name)`; the value is parsed on every call, so a test can set the
variable and see the change. An unparsable value raises KnobError naming the variable.
A knob whose value is a path says so (`path`: "path", or "command" for a name looked up on PATH
or a path): `absolute_paths` anchors relative ones for a process started in another folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from harness.errors import BadInput


class KnobError(BadInput, ValueError):
    """An ORACLE_* environment variable holds a value that cannot be parsed."""


@dataclass(frozen=True)
class Knob:
    name: str
    parse: Callable[[str], object]
    default: Callable[[], object]
    doc: str
    path: str = ""  # "path": the value is a path; "command": a name looked up on PATH, or a path

    def __post_init__(self) -> None:
        if self.path not in ("", "path", "command"):
            raise ValueError(f"knob {self.name}: path {self.path!r} must be '', 'path' or 'command'")

    def get(self):
        return get(self.name)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def _optional_path(text: str) -> Optional[Path]:
    return Path(text).expanduser() if text else None


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("ORACLE_CACHE_DIR", lambda s: Path(s).expanduser(),
             lambda: Path("~/.cache/oracle").expanduser(),
             "Directory of the build cache (cubins and their build logs).", path="path"),
        Knob("ORACLE_NVCC", str, lambda: "nvcc",
             "The nvcc executable (a name looked up on PATH, or a path).", path="command"),
        Knob("ORACLE_NVCC_TIMEOUT_S", _positive_float, lambda: 900.0,
             "Seconds one nvcc compile may take before it is killed and reported as a BuildError."),
        Knob("ORACLE_BUILD_JOBS", positive_int, _usable_cores,
             "The most nvcc compiles the processes sharing one build cache run at once (the others wait "
             "for a slot); default the usable cores."),
        Knob("ORACLE_BUILD_LOCK_TIMEOUT_S", _positive_float, lambda: 2 * get("ORACLE_NVCC_TIMEOUT_S"),
             "Seconds a build waits for its key's build lock or for a compile slot before a LockTimeoutError "
             "names the file and its holder; default twice ORACLE_NVCC_TIMEOUT_S (the holder may wait for a "
             "slot, then compile)."),
        Knob("ORACLE_KERNEL_TIMEOUT_S", _positive_float, lambda: 60.0,
             "Default wall-clock limit in seconds for one kernel run's child process (start-up included)."),
        Knob("ORACLE_CHILD_AHEAD_S", _non_negative_float, lambda: 60.0,
             "Seconds a kernel child started ahead for a process's next run waits to be taken before it is "
             "stopped (a process that runs on after a live run: the server, a script); 0: none is started."),
        Knob("ORACLE_KEEP_RUN_DIR", _bool, lambda: False,
             "Keep each run's temporary directory (request, inputs, outputs, logs) for inspection."),
        Knob("ORACLE_SINK_DIR", _optional_path, lambda: None,
             "Directory for the file-backed host-mapped trace sink; default /dev/shm when writable, "
             "else the run directory.", path="path"),
        Knob("ORACLE_CUBIN_MAX_MB", positive_int, lambda: 512,
             "The most bytes, in MiB, a prebuilt cubin (or fatbin) may have; a larger file is refused unread."),
        Knob("ORACLE_DUMP_MAX_MB", positive_int, lambda: 4096,
             "The most bytes, in MiB, a dump file may hold once decompressed; a gzip dump is read header first "
             "and refused when the data its header declares would pass it."),
        Knob("ORACLE_TRACE_MAX_TAPS_MB", positive_int, lambda: 4096,
             "The most memory, in MiB, the taps parsed from one trace may take (values and masks: twice a full "
             "default 2048 MiB sink of one-byte values); a trace that needs more, or more than the host's "
             "memory, is refused before any tap is assembled."),
    )
}


def register(knob: Knob) -> Knob:
    """Declare a knob of a layer above the harness (the oracle's own) in the same table."""
    if knob.name in KNOBS and KNOBS[knob.name] is not knob:
        raise ValueError(f"knob {knob.name} is declared twice")
    KNOBS[knob.name] = knob
    return knob


def get(name: str):
    """The typed value of knob `name` (its default when the variable is unset or empty)."""
    knob = KNOBS[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return knob.default()
    try:
        return knob.parse(raw)
    except ValueError as exc:
        raise KnobError(f"environment variable {name}={raw!r} is invalid: {exc}. {knob.doc}") from None


def absolute_paths(env: Mapping[str, str], cwd: str) -> dict[str, str]:
    """`env` with each path knob's relative value made absolute against `cwd` (a command knob's
    only when it holds a '/'; a bare name is looked up on PATH), for a process started elsewhere."""
    out = dict(env)
    for knob in KNOBS.values():
        raw = out.get(knob.name)
        if not knob.path or not raw:
            continue
        if knob.path == "command" and os.sep not in raw:
            continue
        out[knob.name] = os.path.join(cwd, os.path.expanduser(raw))
    return out


def describe() -> str:
    """One line per knob, for documentation and `--help` text."""
    return "\n".join(f"{k.name}: {k.doc}" for k in KNOBS.values())

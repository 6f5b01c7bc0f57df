"""NVIDIA's compute-sanitizer around one kernel run, and its report parsed into typed findings.

Data path: sanitize(cubin, entry, launch, tensors, tools) -> for each tool (racecheck, synccheck,
memcheck, initcheck) one run_kernel in a child process whose argv is
`compute-sanitizer --tool T --log-file LOG ... python -m harness._child RUN_DIR` (an argv list,
never a shell), with a time limit -> LOG parsed by parse_report -> SanitizerResult per tool.

Constraints: the sanitizer is looked up on PATH (and in the CUDA toolkit's bin directory); without
it, SanitizerReport.unavailable says so and nothing runs. The parser reads both layouts the tool has
printed over the years: `at 0xPC in FILE:LINE:FUNCTION` and `at FUNCTION+0xPC in FILE:LINE`.
A line it does not understand is kept in the finding's text, never guessed at.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

TOOLS = ("racecheck", "synccheck", "memcheck", "initcheck")
TOOLKIT_BINS = ("/usr/local/cuda/bin",)
MAX_LOG_BYTES = 16 << 20  # a sanitizer log longer than this is read only this far
PRINT_LIMIT = 200  # errors the tool prints per run (--print-limit)

_PREFIX = re.compile(r"^=+ ?")
_AT_OLD = re.compile(r"^at (0x[0-9a-fA-F]+) in (.+)$")
_AT_NEW = re.compile(r"^at (.+?)\+(0x[0-9a-fA-F]+)(?: in (.+))?$")
_ADDRESS = re.compile(r"(?:Address|Access at|access at|at __\w+__) (0x[0-9a-fA-F]+)")
_THREAD = re.compile(r"by thread \(([\d, ]+)\) in block \(([\d, ]+)\)")
_HAZARDS = re.compile(r"\[(\d+) hazards?\]")
_RACE = re.compile(r"^(?:ERROR|Error|WARNING|Warning): Race reported between (\w+) access at (.+?)$")
_RACE_AND = re.compile(r"^and (\w+) access at (.+?)(?: \[\d+ hazards?\])?$")
_HAZARD = re.compile(r"^(?:ERROR|Error|WARNING|Warning): Potential (\w+) hazard detected at (__\w+__) (0x[0-9a-fA-F]+)")
_SPACE = re.compile(r"__(global|shared|local)__")
_SUMMARY = re.compile(r"^(ERROR|RACECHECK|SYNCCHECK|INITCHECK|LEAK) SUMMARY: (\d+)")
_NOISE = ("COMPUTE-SANITIZER", "Saved host backtrace", "Host Frame", "Device Frame", "Target application returned")


class SanitizerError(ValueError):
    """A sanitizer request that cannot be run (an unknown tool, a bad time limit)."""


@dataclass(frozen=True)
class Location:
    """Where in the kernel: the function, the program counter (offset in it) and FILE:LINE when
    the cubin carries line information (-lineinfo)."""

    function: Optional[str] = None
    pc: Optional[int] = None
    file: Optional[str] = None
    line: Optional[int] = None

    def describe(self) -> str:
        where = f"{self.file}:{self.line}" if self.file and self.line is not None else (self.file or "")
        pc = f"+{self.pc:#x}" if self.pc is not None else ""
        fn = f"{self.function}{pc}" if self.function else (pc.lstrip("+") or "?")
        return f"{fn} ({where})" if where else fn

    def to_json(self) -> dict:
        return {"function": self.function, "pc": self.pc, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class SanitizerFinding:
    """One kind of error the tool reported at one place, `count` times (repeats merged; a race
    report's `[N hazards]` adds N)."""

    tool: str
    kind: str  # the tool's own words: "Invalid __global__ read of size 4 bytes", "Race reported ..."
    location: Location
    space: Optional[str] = None  # "shared" | "global" | "local" | None (not said)
    address: Optional[int] = None
    other: Optional[Location] = None  # a race's second access
    count: int = 1
    thread: Optional[str] = None  # the first "(t) in block (b)" reported
    text: tuple[str, ...] = ()  # the report's lines, as printed (first finding of the group)

    def __post_init__(self) -> None:
        if self.tool not in TOOLS:
            raise SanitizerError(f"SanitizerFinding.tool {self.tool!r} is not one of {', '.join(TOOLS)}")
        if self.space not in (None, "shared", "global", "local"):
            raise SanitizerError(f"SanitizerFinding.space {self.space!r} must be shared, global, local or None")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise SanitizerError(f"SanitizerFinding.count {self.count!r} must be a positive int")

    def key(self) -> tuple:
        return (self.tool, self.kind, self.location, self.space, self.other)

    def describe(self) -> str:
        where = self.location.describe() + (f" / {self.other.describe()}" if self.other else "")
        addr = f" {self.space or ''} address {self.address:#x}".replace("  ", " ") if self.address is not None else \
            (f" ({self.space} memory)" if self.space else "")
        return f"{self.tool}: {self.kind} at {where}{addr}, {self.count}x"

    def to_json(self) -> dict:
        return {"tool": self.tool, "kind": self.kind, "location": self.location.to_json(), "space": self.space,
                "address": self.address, "other": self.other.to_json() if self.other else None,
                "count": self.count, "thread": self.thread}


@dataclass(frozen=True)
class SanitizerResult:
    """One tool's run: whether it ran to the end, its findings, the error total its summary gave."""

    tool: str
    ran: bool
    findings: tuple[SanitizerFinding, ...] = ()
    summary_errors: Optional[int] = None
    status: str = ""  # the child's RunStatus value
    message: str = ""

    def to_json(self) -> dict:
        return {"tool": self.tool, "ran": self.ran, "status": self.status, "message": self.message,
                "summary_errors": self.summary_errors, "findings": [f.to_json() for f in self.findings]}


@dataclass(frozen=True)
class SanitizerReport:
    results: tuple[SanitizerResult, ...] = ()
    unavailable: Optional[str] = None  # why nothing ran (no compute-sanitizer)
    executable: Optional[str] = None

    @property
    def findings(self) -> tuple[SanitizerFinding, ...]:
        return tuple(f for r in self.results for f in r.findings)

    def describe(self) -> list[str]:
        if self.unavailable:
            return [self.unavailable]
        lines = []
        for r in self.results:
            if not r.ran:
                lines.append(f"{r.tool}: did not run to the end ({r.status}: {r.message.splitlines()[0] if r.message else ''})")
            elif not r.findings:
                lines.append(f"{r.tool}: no findings" + (f" (summary: {r.summary_errors} errors)"
                                                          if r.summary_errors else ""))
            else:
                lines.extend(f.describe() for f in r.findings)
        return lines

    def to_json(self) -> dict:
        return {"unavailable": self.unavailable, "executable": self.executable,
                "results": [r.to_json() for r in self.results]}


def find_sanitizer() -> Optional[str]:
    """compute-sanitizer on PATH, else in the CUDA toolkit's bin directory, else None."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for d in TOOLKIT_BINS:
        p = Path(d) / "compute-sanitizer"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def unavailable_report() -> SanitizerReport:
    """What --sanitize says, in one line, where there is no compute-sanitizer."""
    return SanitizerReport(unavailable="--sanitize: compute-sanitizer is not on PATH (nor in "
                           f"{', '.join(TOOLKIT_BINS)}): install the CUDA toolkit's sanitizer to run it")


def sanitizer_argv(executable: str, tool: str, log_file: str) -> list[str]:
    """The sanitizer's own arguments (the child's argv follows them)."""
    if tool not in TOOLS:
        raise SanitizerError(f"tool {tool!r} is not one of {', '.join(TOOLS)}")
    argv = [executable, "--tool", tool, "--log-file", log_file, "--print-limit", str(PRINT_LIMIT),
            "--show-backtrace", "device"]
    if tool == "racecheck":
        argv += ["--racecheck-report", "analysis"]
    return argv


# --------------------------------------------------------------------------- parsing


def _location(text: str) -> Location:
    """'0x1a0 in f.cu:12:kern(int *)' / 'kern(int *)+0x1a0 in f.cu:12' / 'kern(int *)+0x1a0' / '0x3b0 in kern(...)'."""
    text = _HAZARDS.sub("", text).strip()
    m = re.match(r"^(0x[0-9a-fA-F]+) in (.+)$", text)
    if m:
        pc, rest = int(m.group(1), 16), m.group(2)
        fl = re.match(r"^(.+?):(\d+):(.+)$", rest)
        if fl:
            return Location(fl.group(3).strip(), pc, fl.group(1), int(fl.group(2)))
        return Location(rest.strip(), pc)
    m = re.match(r"^(.+?)\+(0x[0-9a-fA-F]+)(?: in (.+))?$", text)
    if m:
        fn, pc, rest = m.group(1).strip(), int(m.group(2), 16), m.group(3)
        if rest:
            fl = re.match(r"^(.+?):(\d+)$", rest.strip())
            if fl:
                return Location(fn, pc, fl.group(1), int(fl.group(2)))
            return Location(fn, pc, rest.strip())
        return Location(fn, pc)
    return Location(text or None)


def _blocks(text: str) -> list[list[str]]:
    """The report's lines, prefix removed, grouped: a block starts at an unindented line."""
    blocks: list[list[str]] = []
    for raw in text.splitlines():
        if not raw.startswith("="):
            continue  # the program's own output
        line = _PREFIX.sub("", raw.rstrip())
        if not line.strip():
            continue
        if not line.startswith(" "):
            blocks.append([line.strip()])
        elif blocks:
            blocks[-1].append(line.strip())
    return blocks


def parse_report(tool: str, text: str) -> tuple[tuple[SanitizerFinding, ...], Optional[int]]:
    """(findings with repeats merged, the error count of the summary line or None)."""
    if tool not in TOOLS:
        raise SanitizerError(f"tool {tool!r} is not one of {', '.join(TOOLS)}")
    merged: dict[tuple, SanitizerFinding] = {}
    summary: Optional[int] = None
    for block in _blocks(text):
        head = block[0]
        s = _SUMMARY.match(head)
        if s:
            summary = (summary or 0) + int(s.group(2))
            continue
        if any(head.startswith(n) for n in _NOISE) or head.startswith("Program hit") and tool != "memcheck":
            continue
        finding = _finding(tool, block)
        if finding is None:
            continue
        k = finding.key()
        if k in merged:
            old = merged[k]
            merged[k] = SanitizerFinding(old.tool, old.kind, old.location, old.space, old.address, old.other,
                                         old.count + finding.count, old.thread, old.text)
        else:
            merged[k] = finding
    return tuple(merged.values()), summary


def _finding(tool: str, block: list[str]) -> Optional[SanitizerFinding]:
    head, rest = block[0], block[1:]
    body = [l for l in rest if not any(l.startswith(n) for n in _NOISE)]
    joined = " ".join(block)
    count = 1
    h = _HAZARDS.search(joined)
    if h:
        count = int(h.group(1))
    thread = None
    t = _THREAD.search(joined)
    if t:
        thread = f"thread ({t.group(1).replace(' ', '')}) in block ({t.group(2).replace(' ', '')})"
    race = _RACE.match(head)
    if race:
        first = _location(race.group(2))
        other = None
        for l in body:
            a = _RACE_AND.match(l)
            if a:
                other = _location(a.group(2))
                kind = f"race between {race.group(1).lower()} and {a.group(1).lower()} accesses"
                break
        else:
            kind = f"race involving a {race.group(1).lower()} access"
        return SanitizerFinding(tool, kind, first, "shared", None, other, count, thread, tuple(block))
    hz = _HAZARD.match(head)
    if hz:
        space = _SPACE.search(hz.group(2))
        locs = [_location(re.sub(r"^\w+ Thread \([\d, ]+\) at ", "", l)) for l in body if " Thread (" in l]
        return SanitizerFinding(tool, f"{hz.group(1)} hazard", locs[0] if locs else Location(),
                                space.group(1) if space else "shared", int(hz.group(3), 16),
                                locs[1] if len(locs) > 1 else None, count, thread, tuple(block))
    loc = Location()
    for l in body:
        if l.startswith("at "):
            loc = _location(l[3:])
            break
    addr = None
    a = _ADDRESS.search(joined)
    if a:
        addr = int(a.group(1), 16)
    space = _SPACE.search(head)
    kind = re.sub(r"\s+", " ", head).rstrip(":. ")
    return SanitizerFinding(tool, kind, loc, space.group(1) if space else None, addr, None, count, thread,
                            tuple(block))


# --------------------------------------------------------------------------- running


def sanitize(cubin, entry: str, launch, tensors: Mapping, *, tools: Sequence[str] = TOOLS,
             timeout_s: float = 600.0, executable: Optional[str] = None, child_prefix: Optional[Sequence[str]] = None,
             then: Sequence = ()) -> SanitizerReport:
    """Run the kernel once under each tool (a child process each, `timeout_s` each) and parse the
    reports. `child_prefix` replaces the child's argv (tests); `executable` the sanitizer's path."""
    from harness.runner import DEFAULT_CHILD, run_kernel

    for t in tools:
        if t not in TOOLS:
            raise SanitizerError(f"tool {t!r} is not one of {', '.join(TOOLS)}")
    exe = executable or find_sanitizer()
    if exe is None:
        return unavailable_report()
    results = []
    log_dir = Path(tempfile.mkdtemp(prefix="oracle-sanitizer-"))
    try:
        for tool in tools:
            log = log_dir / f"{tool}.log"
            argv = sanitizer_argv(exe, tool, str(log)) + list(child_prefix or DEFAULT_CHILD)
            run = run_kernel(cubin, entry, launch, tensors, sink=None, timeout_s=timeout_s, child_cmd=argv,
                             then=tuple(then))
            text = _read_log(log)
            findings, summary = parse_report(tool, text)
            ran = run.status.value in ("OK", "CUDA_ERROR") and bool(text)
            results.append(SanitizerResult(tool, ran, findings, summary, run.status.value,
                                           "" if ran else (run.message or "the sanitizer wrote no report")))
    finally:
        for p in log_dir.iterdir():
            if p.is_file() and not p.is_symlink():
                p.unlink()
        log_dir.rmdir()
    return SanitizerReport(tuple(results), executable=exe)


def _read_log(path: Path) -> str:
    try:
        if path.is_symlink() or not path.is_file():
            return ""
        with open(path, "rb") as f:
            return f.read(MAX_LOG_BYTES).decode(errors="replace")
    except OSError:
        return ""

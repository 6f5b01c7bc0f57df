"""What a benchmark's result needs beside its numbers to be compared with the next run: the machine,
the versions (and the oracle's commit), the command line, the seeds, the peer measured in the same
run and the timing discipline.

    doc[provenance.KEY] = provenance.stamp(__file__, argv, seeds=..., peer=..., timing=...)

Every script in benchmarks/ that writes results (and tests/fuzz_inputs.py) puts the stamp under the
key "provenance" of its JSON, beside its own fields; benchmarks/perf_table.py reads it back.

Constraints: works without a GPU, without git and without nvcc. A field that cannot be known is
null, and the `why_null` object beside it says why (a field that does not apply, such as a peer for
a benchmark that times nothing, is given as `NotApplicable(why)`). The host's name is kept only as
a short hash, enough to tell two hosts apart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Union

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "benchmarks.provenance/1"
KEY = "provenance"  # the key of a results file that holds the stamp
TOP_FIELDS = ("schema", "benchmark", "date", "command", "machine", "versions", "seeds", "peer", "timing")
MACHINE_FIELDS = ("gpu_name", "gpu_count", "gpu_memory_gib", "gpu_capability", "driver", "driver_cuda",
                  "cuda_runtime", "cpu_model", "cpu_cores", "usable_cpus", "platform", "host_sha256")
VERSION_FIELDS = ("python", "torch", "triton", "cuda_bindings", "nvidia_cutlass", "numpy", "nvcc", "oracle",
                  "oracle_commit", "oracle_tree_dirty", "oracle_tree_changes", "knobs_set")
_GIT_TIMEOUT_S = 10
_MAX_CHANGES = 20  # changed paths listed in oracle_tree_changes


class ProvenanceError(ValueError):
    """A stamp's argument that cannot describe a run (names the field and the value)."""


def _text(owner: str, field: str, value) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ProvenanceError(f"{owner}.{field} must be a non-empty string, got {value!r}")


@dataclasses.dataclass(frozen=True)
class NotApplicable:
    """A field that does not apply to this benchmark, and why (e.g. no peer: it times nothing)."""

    why: str

    def __post_init__(self):
        _text("NotApplicable", "why", self.why)


@dataclasses.dataclass(frozen=True)
class Peer:
    """What was measured beside the subject in the same run, and what the file's ratio is."""

    name: str  # e.g. "cuBLAS: torch.matmul(a, b_nk.t())"
    ratio: str  # which over which, and which way is better

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _text("Peer", f.name, getattr(self, f.name))


@dataclasses.dataclass(frozen=True)
class Timing:
    """The timing discipline: the clock, the warm-up, the repetitions and the statistic reported."""

    clock: str  # CUDA events, the host's wall clock, process CPU time; cold L2 or not
    warmup: str
    reps: str
    statistic: str

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _text("Timing", f.name, getattr(self, f.name))


SeedValue = Union[int, Sequence[int], str]  # one seed, a list, or where in the file each case keeps its own


def _seeds(seeds) -> dict:
    if not isinstance(seeds, Mapping) or not seeds:
        raise ProvenanceError(f"seeds must be a non-empty mapping of name to seed(s), or NotApplicable, got {seeds!r}")
    out = {}
    for name, v in seeds.items():
        if not isinstance(name, str) or not name:
            raise ProvenanceError(f"seeds: a name must be a non-empty string, got {name!r}")
        if isinstance(v, int) and not isinstance(v, bool):
            out[name] = v
        elif isinstance(v, str) and v.strip():
            out[name] = v
        elif isinstance(v, Sequence) and not isinstance(v, str) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in v):
            out[name] = list(v)
        else:
            raise ProvenanceError(f"seeds[{name!r}] must be an int, a list of ints or a string saying where the "
                                  f"seeds are kept, got {v!r}")
    return out


def _run(argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None), or (None, why it could not run)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`{' '.join(argv[:2])}` could not run: {type(e).__name__}: {e}"
    if done.returncode:
        return None, f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[:200]}"
    return done.stdout, None


def _git(why: dict) -> dict:
    out = {"oracle_commit": None, "oracle_tree_dirty": None, "oracle_tree_changes": None}
    if shutil.which("git") is None:
        for k in out:
            why[k] = "git is not installed here"
        return out
    head, err = _run(["git", "rev-parse", "HEAD"])
    if head is None:
        why["oracle_commit"] = err
    else:
        out["oracle_commit"] = head.strip()
    status, err = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    if status is None:
        why["oracle_tree_dirty"] = why["oracle_tree_changes"] = err
    else:
        changes = [ln[3:] for ln in status.splitlines() if ln.strip()]
        out["oracle_tree_dirty"] = bool(changes)
        out["oracle_tree_changes"] = changes[:_MAX_CHANGES]
    return out


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvidia_driver() -> tuple[str | None, str | None]:
    if shutil.which("nvidia-smi") is None:
        return None, "nvidia-smi is not on PATH"
    out, err = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out is None or not out.strip():
        return None, err or "nvidia-smi printed no driver version"
    return out.strip().splitlines()[0], None


def machine(env: dict) -> dict:
    """The GPU (device 0, as the benchmarks use), its driver, the CPU and the platform."""
    why: dict = {}
    gpus = env.get("gpus") or []
    m = {f: None for f in MACHINE_FIELDS}
    m["cuda_runtime"] = env.get("torch_cuda")
    if m["cuda_runtime"] is None:
        why["cuda_runtime"] = f"torch {env.get('torch')} was built without CUDA"
    m["gpu_count"] = len(gpus)
    if gpus:
        g = gpus[0]
        m.update(gpu_name=g["name"], gpu_memory_gib=g["memory_gib"], gpu_capability=g["capability"])
        drv = env.get("driver")
        if isinstance(drv, int):
            m["driver_cuda"] = f"{drv // 1000}.{drv % 1000 // 10}"
        else:
            why["driver_cuda"] = f"cuDriverGetVersion did not answer: {drv}"
        m["driver"], err = _nvidia_driver()
        if err:
            why["driver"] = err
    else:
        reason = ("no CUDA device visible to torch" + (" (TRITON_INTERPRET=1: the CPU tier)"
                                                       if env.get("triton_interpret") else ""))
        for f in ("gpu_name", "gpu_memory_gib", "gpu_capability", "driver", "driver_cuda"):
            why[f] = reason
    m["cpu_model"] = _cpu_model()
    if m["cpu_model"] is None:
        why["cpu_model"] = "neither /proc/cpuinfo nor platform.processor() names it"
    m["cpu_cores"] = os.cpu_count()
    if m["cpu_cores"] is None:
        why["cpu_cores"] = "os.cpu_count() does not know"
    if hasattr(os, "sched_getaffinity"):
        m["usable_cpus"] = len(os.sched_getaffinity(0))
    else:
        why["usable_cpus"] = "os.sched_getaffinity is not available on this platform"
    m["platform"] = env.get("platform") or platform.platform()
    node = platform.node()
    if node:
        m["host_sha256"] = hashlib.sha256(node.encode()).hexdigest()[:12]
    else:
        why["host_sha256"] = "platform.node() is empty"
    m["why_null"] = why
    return m


def versions(env: dict) -> dict:
    """Python, torch, triton, cuda-bindings, the CUTLASS wheel, numpy, nvcc, the oracle and its
    commit (and whether the tree had changes), and the ORACLE_* knobs that were set."""
    why: dict = {}
    v = {f: None for f in VERSION_FIELDS}
    for f in ("python", "torch", "triton", "cuda_bindings", "nvidia_cutlass", "numpy", "oracle"):
        v[f] = env.get(f)
        if v[f] is None:
            why[f] = f"{f.replace('_', '-')} is not installed"
    v["nvcc"] = (env.get("nvcc") or {}).get("version")
    if v["nvcc"] is None:
        why["nvcc"] = "no nvcc found (ORACLE_NVCC, then PATH)"
    v.update(_git(why))
    v["knobs_set"] = {k: d["value"] for k, d in env.get("knobs", {}).items() if d["value"] is not None}
    v["why_null"] = why
    return v


def command(script: str, argv: Sequence[str] | None) -> str:
    """The command line that ran the script, its path relative to the repository."""
    path = Path(script).resolve()
    shown = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", shown, *args])


def stamp(script: str, argv: Sequence[str] | None, *, seeds, peer, timing) -> dict:
    """The provenance of one run of `script` (its __file__) with `argv` (None: sys.argv[1:]).

    seeds: {name: int | [int] | "where the file keeps them"} or NotApplicable;
    peer: Peer or NotApplicable; timing: Timing or NotApplicable."""
    if not isinstance(peer, (Peer, NotApplicable)):
        raise ProvenanceError(f"peer must be a Peer or NotApplicable, got {peer!r}")
    if not isinstance(timing, (Timing, NotApplicable)):
        raise ProvenanceError(f"timing must be a Timing or NotApplicable, got {timing!r}")
    from oracle.tools.environment import report_environment

    env = report_environment()
    why: dict = {}
    doc = {"schema": SCHEMA, "benchmark": Path(script).stem,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command(script, argv),
           "machine": machine(env), "versions": versions(env)}
    if isinstance(seeds, NotApplicable):
        doc["seeds"], why["seeds"] = None, seeds.why
    else:
        doc["seeds"] = _seeds(seeds)
    for name, value in (("peer", peer), ("timing", timing)):
        if isinstance(value, NotApplicable):
            doc[name], why[name] = None, value.why
        else:
            doc[name] = dataclasses.asdict(value)
    doc["why_null"] = why
    return doc


def nulls_without_reason(obj: dict, where: str = KEY) -> list[str]:
    """The null fields of a stamp (or one of its objects) that its `why_null` does not explain."""
    out = []
    why = obj.get("why_null", {})
    for k, v in obj.items():
        if v is None and k not in why:
            out.append(f"{where}.{k}")
        elif isinstance(v, dict) and k != "why_null" and "why_null" in v:
            out += nulls_without_reason(v, f"{where}.{k}")
    return out

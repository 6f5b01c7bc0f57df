"""Warming a long-lived oracle for the cases it will judge: the references a case's judgement
launches, compiled (or loaded from Triton's disk cache) before the first command arrives.

For each case file: a model kernel's recording of its problem (oracle.run.simulate; its first
and last tiles tapped at every stage and k-block) and the recording's analysis, on the device the
oracle judges on, at the problem's own size: Triton specialises integer arguments (== 1, a
multiple of 16), so a smaller problem could leave a kernel to compile on the first real command.
Under Triton's interpreter nothing compiles and the problem is shrunk to 2 x 2 tiles and 2
k-blocks (each extent keeping its residue mod 16), which runs the same path quickly. A problem the
model cannot run warms the reference GEMM and its bounds alone (expected_output). Nothing of the
case's own kernel is built or run; a case that cannot be warmed is reported, never fatal.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional, Sequence

TILES = 2  # tiles per extent and k-blocks of a problem warmed under the interpreter


@dataclass(frozen=True)
class Warmed:
    case: str
    seconds: float
    how: str  # "analysis" | "reference GEMM" | "" (not warmed)
    problem: str = ""
    error: Optional[str] = None

    def describe(self) -> str:
        if self.error is not None:
            return f"could not warm {self.case}: {self.error}"
        return f"warmed {self.case} in {self.seconds:.1f} s ({self.how} of {self.problem})"


def _shrunk(extent: int, block: int) -> int:
    """At most TILES blocks, with the extent's residue mod 16 (its Triton specialisation)."""
    base = TILES * block
    if extent <= base:
        return extent
    small = base - (base - extent) % 16
    return small if small > 0 else extent


def shrink(spec):
    """The problem at interpreter size: m, n and k shrunk where the spec stays valid, else left."""
    from oracle.problem.spec import SpecError

    t = spec.tile
    small = dict(m=_shrunk(spec.m, t.bm), n=_shrunk(spec.n, t.bn), k=_shrunk(spec.k, t.bk))
    if spec.group_sizes is not None or spec.batch != 1:
        small.pop("m")  # grouped rows and batches keep their layout
    for drop in ((), ("k",), ("k", "n")):
        try:
            return dataclasses.replace(spec, **{k: v for k, v in small.items() if k not in drop})
        except (SpecError, ValueError, TypeError):
            continue
    return spec


def warm_case(path: str) -> Warmed:
    """Compile what judging the case at `path` launches (module docstring)."""
    from kernels_ref._common import interpreting
    from oracle.judging.differential import analyze, expected_output
    from oracle.run.case import load_case
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import simulate

    t0 = time.perf_counter()
    try:
        spec = load_case(path, allow_library=True).spec  # only the problem is used: no kernel is built or run
        if interpreting():
            spec = shrink(spec)
        ops = make_operands(spec, "random", 1)
    except Exception as e:  # a case that does not load is the command's to report, not the warm-up's
        return Warmed(path, time.perf_counter() - t0, "", error=f"{type(e).__name__}: {e}")
    try:
        tiles = sorted({(0, 0), (spec.tiles_m - 1, spec.tiles_n - 1)})
        analyze(simulate(spec, ops, Provenance("random", 1), tap_tiles=tiles))
        how = "analysis"
    except Exception:  # a problem the model kernel cannot run: the reference GEMM still warms
        try:
            expected_output(spec, ops)
            how = "reference GEMM"
        except Exception as e:
            return Warmed(path, time.perf_counter() - t0, "", spec.describe(), f"{type(e).__name__}: {e}")
    return Warmed(path, time.perf_counter() - t0, how, spec.describe())


def warm(paths: Sequence[str], log=print) -> list[Warmed]:
    out = []
    for p in paths:
        w = warm_case(p)
        log(w.describe())
        out.append(w)
    return out

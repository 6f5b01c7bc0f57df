"""A write outside D (or another buffer the kernel writes), seen in the guard bands the harness puts
around each (harness.guard_bands), as the finding at epilogue_store: the store is the stage that
writes global memory, and the band's offset names where. Pure: a recording's breaches and the stage
table's diagnosis in, the diagnosis and first divergence out.

A breach decides the run only where the stage table found nothing earlier: a run that diverges at an
upstream stage keeps that finding (its breaches stay on the Analysis and in the report), a kernel
error stays one.
"""

from __future__ import annotations

from typing import Optional, Sequence

from harness.guard_bands import GuardBreach
from oracle.judging.diagnose import Diagnosis, Kind, Verdict, evidence_kind
from oracle.judging.differential.findings import FirstDivergence

STAGE = "epilogue_store"
FED_BY = "guard band"  # what the finding rests on: the bytes around the buffer, read back after the run


def ordered(breaches: Sequence[GuardBreach]) -> tuple[GuardBreach, ...]:
    """D's first, then the other buffers by name; past the end before before the start."""
    return tuple(sorted(breaches, key=lambda b: (b.tensor != "d", b.tensor, b.side != "after", b.first)))


def out_of_bounds_finding(breaches: Sequence[GuardBreach], diagnosis: Diagnosis, *, inputs_controlled: bool,
                          confounds: Sequence[str], stage: str = STAGE) -> Optional[tuple[Diagnosis, FirstDivergence,
                                                                                            Kind]]:
    """The diagnosis, first divergence and kind a breach gives, or None when there is none or the
    stage table already names a divergence or a kernel error. `stage`: the problem's store stage
    (a GEMM's epilogue_store, an attention's store)."""
    if not breaches or diagnosis.verdict not in (Verdict.MATCH, Verdict.MISTRUSTED):
        return None
    first = ordered(breaches)[0]
    told = "; ".join(b.describe() for b in ordered(breaches))
    diag = Diagnosis(Verdict.DIVERGED, stage, True, f"{stage} wrote outside the buffers it was given: {told}")
    kind = evidence_kind(diag, inputs_controlled=inputs_controlled, confounds=confounds)
    finding = FirstDivergence(stage=stage, tile=None, k_block=None, element=None, element_in_tile=None, received=None,
                              expected=None, bound=None, kind=kind, comparison="teacher_forced",
                              hint=f"{first.describe()} (guard bands of {len(breaches)} breach(es): {told})",
                              fed_by=FED_BY)
    return diag, finding, kind

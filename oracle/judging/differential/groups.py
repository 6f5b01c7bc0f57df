"""A grouped or batched problem judged one GEMM at a time.

Group g (oracle.problem.partition) is its own problem: M = M_g, A's rows [offset_g, offset_g + M_g), B[g],
C's and D's same rows, its column bias, its block scales (A's rows of the group, B's tensor [g]); its
taps are the ones that name group g (their tiles count from the group's first row). The other
groups' block scales go beside it (`scale_peers`), so a scale of another group is named by its group. An empty group has nothing to judge. The run's verdict is the worst
group's: a kernel error, an untrusted reference, a divergence (the one earliest in pipeline order,
then the lowest group), nothing to discriminate, or a match; the report shows that group's stages
and one line for every group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from harness.taps import ALL_STAGES
from oracle.judging.diagnose import Verdict
from oracle.run.inputs import Operands, group_scales
from oracle.problem.partition import group_offsets
from oracle.run.recording import Recording

_PRIORITY = {Verdict.KERNEL_ERROR: 0, Verdict.ORACLE_UNTRUSTED: 1, Verdict.DIVERGED: 2, Verdict.MISTRUSTED: 3,
             Verdict.MATCH: 4}


@dataclass(frozen=True)
class GroupOutcome:
    group: int
    row0: int
    rows: int
    verdict: Optional[Verdict]  # None: an empty group, nothing to judge
    stage: Optional[str] = None
    kind: Optional[str] = None

    def describe(self) -> str:
        where = f"group {self.group} (rows {self.row0}..{self.row0 + self.rows - 1})" if self.rows else \
            f"group {self.group} (empty)"
        if self.verdict is None:
            return f"{where}: nothing to judge"
        tail = f" at {self.stage}, {self.kind}" if self.stage else ""
        return f"{where}: {self.verdict.value}{tail}"


def group_recordings(rec: Recording) -> list[tuple[int, int, Optional[Recording]]]:
    """(group, first row, its recording or None for an empty group), for every group."""
    spec = rec.spec
    offs = group_offsets(spec)
    ops = rec.operands
    out = []
    for g, m_g in enumerate(spec.group_sizes):
        o = offs[g]
        if m_g == 0:
            out.append((g, o, None))
            continue
        sub = dataclasses.replace(spec, m=m_g, groups=None, batch=1)
        bias = None
        if ops.bias is not None:
            bias = ops.bias[o:o + m_g] if spec.bias == "row" else ops.bias[g]
        scale_a, scale_b = group_scales(spec, ops, g)
        sub_ops = Operands(a=ops.a[o:o + m_g], b=ops.b[g], c=None if ops.c is None else ops.c[o:o + m_g],
                           bias=bias, scale_a=scale_a, scale_b=scale_b)
        taps = tuple(dataclasses.replace(t, group=None) for t in rec.taps if t.group == g)
        notes = rec.notes + ((f"group {g} of {len(spec.group_sizes)}: rows {o}..{o + m_g - 1} of A and D, B[{g}]; "
                              f"descriptor fields of a grouped run are not judged"),)
        out.append((g, o, dataclasses.replace(rec, spec=sub, operands=sub_ops,
                                              output=None if rec.output is None else rec.output[o:o + m_g],
                                              taps=taps, descriptors=(), notes=notes,
                                              kernel=f"{rec.kernel} [group {g}]")))
    return out


@dataclass(frozen=True, eq=False)
class ScalePeers:
    """The block scales of the other groups of a grouped (or batched) problem, beside the group being
    judged: (group, its A scales, its B scales) each, so a wrong scale that is another group's is
    named by its group (oracle.judging.scale_hint)."""

    group: int
    word: str  # "group" or "batch entry"
    others: tuple[tuple[int, object, object], ...]


def scale_peers(rec: Recording, g: int) -> Optional[ScalePeers]:
    """The other groups' block scales beside group g (None without block scales)."""
    spec = rec.spec
    if not spec.block_scaled:
        return None
    others = tuple((e, *group_scales(spec, rec.operands, e)) for e, m_e in enumerate(spec.group_sizes)
                   if e != g)
    return ScalePeers(g, "group" if spec.groups is not None else "batch entry", others)


def deciding(analyses) -> int:
    """Index of the analysis whose verdict the run takes (see the module docstring)."""
    def key(i):
        an = analyses[i]
        stage = ALL_STAGES.index(an.diagnosis.stage) if an.diagnosis.stage in ALL_STAGES else len(ALL_STAGES)
        return (_PRIORITY[an.verdict], stage, i)

    return min(range(len(analyses)), key=key)

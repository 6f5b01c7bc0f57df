"""A grouped, batched or K-grouped problem judged one GEMM at a time.

Group g (oracle.problem.partition) is its own problem: M = M_g, A's rows [offset_g, offset_g + M_g), B[g],
C's and D's same rows, its column bias, its block scales (A's rows of the group, B's tensor [g]); its
taps are the ones that name group g (their tiles count from the group's first row). The other
groups' block scales go beside it (`scale_peers`), so a scale of another group is named by its group. An empty group has nothing to judge. The run's verdict is the worst
group's: a kernel error, an untrusted reference, a divergence (the one earliest in pipeline order,
then the lowest group), nothing to discriminate, or a match; the report shows that group's stages
and one line for every group.

A K-grouped problem's group g (oracle.problem.spec: k_groups) is the GEMM M x N x K_g on A's columns
[k0_g, k0_g + K_g) and B's same rows, writing D's rows [g M, (g + 1) M) (and reading C's), with its
column bias and the k-group columns of the block scales of its K slice; its taps are the ones that
name group g, tiles and k-blocks counted from the group's start. An empty group (K_g = 0) is judged
too: its D must be the epilogue of a zero accumulator (alpha * 0 + beta * C_g, ...), so it is judged
output-only (its taps dropped) as a stand-in problem whose A and B are zeros, and a kernel that
left it unwritten diverges at epilogue_store with a hint that says so (`empty_k_group_hint`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

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
    k_range: Optional[tuple[int, int]] = None  # a K-grouped problem's group: (its first k, K_g)
    untapped: bool = False  # the trace selected tiles of this group and no tap of it arrived: judged at D only

    def describe(self) -> str:
        where = f"group {self.group} (rows {self.row0}..{self.row0 + self.rows - 1})" if self.rows else \
            f"group {self.group} (empty)"
        if self.k_range is not None:
            k0, kg = self.k_range
            ks = f"k {k0}..{k0 + kg - 1}" if kg else "K = 0"
            where = f"group {self.group} ({ks}; rows {self.row0}..{self.row0 + self.rows - 1} of D)"
        if self.verdict is None:
            return f"{where}: nothing to judge"
        tail = f" at {self.stage}, {self.kind}" if self.stage else ""
        if self.untapped:
            tail += " (from its output alone: no tap of it arrived)"
        return f"{where}: {self.verdict.value}{tail}"


def group_recordings(rec: Recording) -> list[tuple[int, int, Optional[Recording]]]:
    """(group, first row, its recording or None for an empty group), for every group (a K-grouped
    problem's: k_group_recordings)."""
    spec = rec.spec
    if spec.k_groups is not None:
        return k_group_recordings(rec)
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


def k_group_recordings(rec: Recording) -> list[tuple[int, int, Recording]]:
    """(group, first row of D, its recording) for every group of a K-grouped problem: an empty
    group's is the output-only stand-in of the module docstring."""
    spec = rec.spec
    ops, m, koffs = rec.operands, spec.m, spec.k_offsets
    out = []
    for g, kg in enumerate(spec.k_groups):
        o, k0 = g * m, koffs[g]
        bias = None
        if ops.bias is not None:
            bias = ops.bias[o:o + m] if spec.bias == "row" else ops.bias[g]
        c = None if ops.c is None else ops.c[o:o + m]
        output = None if rec.output is None else rec.output[o:o + m]
        where = f"rows {o}..{o + m - 1} of C and D"
        if kg == 0:
            sub, sub_ops = _zero_accumulator_problem(spec, c, bias)
            dropped = sum(1 for t in rec.taps if t.group == g)
            notes = rec.notes + ((f"group {g} of {len(spec.k_groups)} has K = 0 ({where}): judged output-only against "
                                  f"the epilogue of a zero accumulator (a stand-in problem of K = {sub.k} whose A and B "
                                  f"are zeros)" + (f"; its {dropped} tap(s) not judged" if dropped else "")),)
            out.append((g, o, dataclasses.replace(rec, spec=sub, operands=sub_ops, output=output, taps=(),
                                                  descriptors=(), notes=notes, kernel=f"{rec.kernel} [group {g}]")))
            continue
        sub = dataclasses.replace(spec, k=kg, k_groups=None)
        scale_a, scale_b = group_scales(spec, ops, g)
        sub_ops = Operands(a=ops.a[:, k0:k0 + kg], b=ops.b[k0:k0 + kg], c=c, bias=bias, scale_a=scale_a,
                           scale_b=scale_b)
        taps = tuple(dataclasses.replace(t, group=None) for t in rec.taps if t.group == g)
        notes = rec.notes + ((f"group {g} of {len(spec.k_groups)}: columns {k0}..{k0 + kg - 1} of A and rows of B, "
                              f"{where}; tiles and k-blocks counted from the group's start; descriptor fields of a "
                              f"grouped run are not judged"),)
        out.append((g, o, dataclasses.replace(rec, spec=sub, operands=sub_ops, output=output, taps=taps,
                                              descriptors=(), notes=notes, kernel=f"{rec.kernel} [group {g}]")))
    return out


def _zero_accumulator_problem(spec, c, bias):
    """The stand-in of an empty group of a K-grouped problem: K = one k-block, A and B zeros (the
    accumulator is exactly 0), unit block scales, the group's C and bias."""
    from oracle.run.inputs import make_operands

    sub = dataclasses.replace(spec, k=spec.tile.bk if not spec.block_scaled else spec.scale_a.block[1],
                              k_groups=None)
    ones = make_operands(sub, "ones")
    return sub, dataclasses.replace(ones, a=torch.zeros_like(ones.a), b=torch.zeros_like(ones.b), c=c, bias=bias)


def empty_k_group_hint(spec, g: int, element: Optional[tuple[int, int]]) -> str:
    """The sentence of an empty group's divergence: what D must be, where the kernel's differs
    (`element`: the group's (row, col) of D_g)."""
    terms = (["beta * C"] if spec.beta != 0 else []) + (["bias"] if spec.bias != "none" else [])
    must = " + ".join(terms) or "0"
    if spec.activation != "none":
        must = f"{spec.activation}({must})"
    at = ""
    if element is not None:
        r, c = element
        at = f" at ({r}, {c}) (row {g * spec.m + r} of D)"
    return (f"group {g} has K = 0: D must be {must} (the epilogue of a zero accumulator), the kernel's D differs{at}: "
            f"a kernel that skips an empty group leaves its D unwritten")


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
    others = tuple((e, *group_scales(spec, rec.operands, e)) for e in range(len(spec.group_sizes)) if e != g)
    return ScalePeers(g, "batch entry" if spec.batch > 1 else "group", others)


def deciding(analyses) -> int:
    """Index of the analysis whose verdict the run takes (see the module docstring)."""
    def key(i):
        an = analyses[i]
        stage = ALL_STAGES.index(an.diagnosis.stage) if an.diagnosis.stage in ALL_STAGES else len(ALL_STAGES)
        return (_PRIORITY[an.verdict], stage, i)

    return min(range(len(analyses)), key=key)

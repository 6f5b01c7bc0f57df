"""The scale stages of a block-scaled problem (scale_a, scale_b): the scales each k-block of a tile
applied, per row of A's tile (column of B's) and per scale group of the k-block, judged bit for bit
against the scales the problem implies for that tile and k-block (kernels_ref.scales.tile_scales).

The stage's input is the problem's scale tensor in global memory, so its teacher-forced and chained
comparisons are the same comparison (fed by global memory). An element is compared where its row
(column) lies inside the operand, its scale group starts before K (under a ragged K the last
k-block's groups past K do not exist: kernels_ref.scales.live_groups) and the kernel recorded it. `hint` names which scale of the problem
a wrong value is (oracle.judging.scale_hint); one group of a grouped problem is judged with its own
scales, and a wrong one that another group holds at the same place is named by that group.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels_ref import scales as ref_scales
from oracle.judging.compare import combine
from oracle.judging.differential.context import NOT_RUN_STAGE, Context, StageResult
from oracle.judging.differential.judge import Notebook, StageNotes, with_notes
from oracle.run.confounds import Confound, ConfoundKind
from oracle.judging.evidence import Feed
from oracle.judging.scale_hint import PeerScales, ScaleSite, identify


def scale_stage(ctx: Context, op: str) -> tuple[StageResult, StageNotes]:
    """The scale stage of operand `op`, and what it noted."""
    return with_notes(ctx.geo.dev, lambda nb: _scale_stage(ctx, nb, op))


def _axis(ctx: Context, op: str):
    """(extent, tile extent, rows per scale block) of operand `op`'s scale axis."""
    geo, spec = ctx.geo, ctx.geo.spec
    block = getattr(spec, f"scale_{op}").block
    return (spec.m, geo.bm, block[0]) if op == "a" else (spec.n, geo.bn, block[0])


def values(ctx: Context, op: str) -> torch.Tensor:
    """The problem's scale values of operand `op`, float64 on the CPU: [row blocks, groups]."""
    spec = ctx.geo.spec
    t = ctx.rec.operands.scale_a if op == "a" else ctx.rec.operands.scale_b
    return ref_scales.scale_values(t, getattr(spec, f"scale_{op}").dtype)


def _scale_stage(ctx: Context, nb: Notebook, op: str) -> StageResult:
    geo, tapped = ctx.geo, ctx.taps
    stage = f"scale_{op}"
    taps = tapped.taps_of(stage)
    if not taps:
        return StageResult(stage, NOT_RUN_STAGE, NOT_RUN_STAGE)
    spec = geo.spec
    gk = spec.scale_a.block[1]
    s = ref_scales.groups_per_k_block(gk, geo.bk)
    extent, width, block_rows = _axis(ctx, op)
    vals = values(ctx, op)
    out = []
    for tap in taps:
        row0 = (tap.tile[0] if op == "a" else tap.tile[1]) * width
        received = tap.values.to(geo.dev)
        if tuple(received.shape) != (width, s):
            nb.confound(Confound.of(ConfoundKind.SCALE_TAP_SHAPE, stage, tap=tap.describe(),
                                    shape=str(list(received.shape)), want=f"[{width}, {s}]"))
            continue
        want = ref_scales.tile_scales(vals, block_rows, gk, row0, width, tap.k_block, geo.bk, extent)
        live = ref_scales.live_groups(tap.k_block, gk, geo.bk, spec.k).to(geo.dev)
        valid = (row0 + torch.arange(width, device=geo.dev) < extent)[:, None] & live[None, :]
        recorded = tapped.recorded(tap)
        nb.note_padding(stage, valid, recorded)
        out.append(nb.judge(received.float(), want.float().to(geo.dev), feed=Feed.GLOBAL, valid=valid,
                            recorded=recorded, origin=(row0, tap.k_block * s), tile_index=tap.tile,
                            k_block=tap.k_block, partial=tap.partial))
    return StageResult(stage, combine(out), combine(out))


def origin(spec, stage: str, tile: tuple[int, int], k_block: Optional[int], bm: int, bn: int) -> tuple[int, int]:
    """Where a scale tap's element (0, 0) lies in the stage's space: (its first row of A / column of B,
    k_block x the scale groups of one k-block)."""
    s = ref_scales.groups_of_problem(spec)
    return ((tile[0] * bm) if stage == "scale_a" else (tile[1] * bn)), (k_block or 0) * s


def hint(ctx: Context, stage: str, row: int, col: int, received: float, tile, partial: Optional[int]) -> Optional[str]:
    """Which scale of the problem the applied value at (row, col) of `stage` is: row the row of A
    (column of B), col = k-block x groups per k-block + the group inside it."""
    geo, spec = ctx.geo, ctx.geo.spec
    op = stage[-1]
    gk = spec.scale_a.block[1]
    s = ref_scales.groups_per_k_block(gk, geo.bk)
    kb, j = divmod(col, s)
    g = ref_scales.group_of(kb, j, gk, geo.bk)
    slice0 = None
    if partial:
        mine, first = geo.partial(tile, partial), geo.partial(tile, 0)
        if mine.kb_end > mine.kb_begin and first.kb_end > first.kb_begin:
            slice0 = ref_scales.group_of(first.kb_begin + kb - mine.kb_begin, j, gk, geo.bk)
    _, width, block_rows = _axis(ctx, op)
    other = "b" if op == "a" else "a"
    other_row0 = tile[1] * geo.bn if op == "a" else tile[0] * geo.bm
    site = ScaleSite(op, tuple(tile), kb, row, g, block_rows, width, partial, slice0, other_row0)
    return identify(site, received, values(ctx, op), values(ctx, other), _axis(ctx, other)[2], _peers(ctx, op))


def _peers(ctx: Context, op: str) -> Optional[PeerScales]:
    """Operand `op`'s scale values of the other groups, for one group of a grouped problem."""
    p = ctx.peers
    if p is None:
        return None
    dtype = getattr(ctx.geo.spec, f"scale_{op}").dtype
    return PeerScales(p.word, p.group, tuple((e, ref_scales.scale_values(sa if op == "a" else sb, dtype))
                                             for e, sa, sb in p.others))

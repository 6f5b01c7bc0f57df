"""The mma stage: the accumulator after each tapped k-block.

- chained: against the reference trajectory of the tile (the reference's own operands from zero);
- teacher-forced: each accumulator tap against the reference update over its span of k-blocks,
  started from the kernel's own nearest earlier accumulator tap of the tile (or from zero) and fed
  with the kernel's own operand tiles. Where an operand tile of the span was not tapped, the
  reference tile stands in for it and the comparison says so (its finding is a draft). An
  accumulator element is compared only if the kernel recorded the accumulator it started from and
  every element of its row of A and its column of B in the span.
"""

from __future__ import annotations

import torch

from harness.taps import Tap
from kernels_ref import mma as ref_mma
from oracle import tolerance
from oracle.compare import combine
from oracle.differential.context import NOT_RUN_STAGE, Context, StageResult
from oracle.evidence import Feed


def abs_operand(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        return x.float().abs()
    if x.element_size() == 1:  # fp8: no abs on CUDA; clear the sign bit (exact, and fp8 stays fp8)
        return (x.view(torch.uint8) & 0x7F).view(x.dtype)
    return x.abs()


def mma_kwargs(ctx: Context) -> dict:
    spec = ctx.spec
    return dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ctx.block_a,
                scale_b=ctx.block_b, block_scale_group=ctx.group)


def abs_kwargs(ctx: Context) -> dict:
    """The arguments that make the reference accumulate S = sum |a||b| (times |block scales|)."""
    return dict(mma_kwargs(ctx), acc="fp32", promotion_interval=None,
                scale_a=ctx.block_a.abs() if ctx.block_a is not None else None,
                scale_b=ctx.block_b.abs() if ctx.block_b is not None else None)


def _block_abs(ctx: Context, tile, kb) -> torch.Tensor:
    sa, sb = ctx.block_scales(tile, kb)
    if sa is None:
        return torch.ones((), device=ctx.dev)
    return sa.abs()[:, None] * sb.abs()[None, :]


def mma_stage(ctx: Context) -> tuple[StageResult, dict]:
    """The stage, and the final accumulator tap of each tile (what the epilogue is fed with)."""
    spec = ctx.spec
    last_kb = spec.k_blocks - 1
    taps = ctx.taps_of("mma")
    finals: dict[tuple[int, int], Tap] = {}
    if not taps:
        return StageResult("mma", NOT_RUN_STAGE, NOT_RUN_STAGE), finals
    kb_of = {id(t): (last_kb if t.k_block is None else t.k_block) for t in taps}
    for t in taps:
        if kb_of[id(t)] == last_kb:
            finals[t.tile] = t
    tiles = sorted({t.tile for t in taps})
    traj = ref_mma.mma_trajectory(ctx.a, ctx.b, tiles, ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill,
                                  **mma_kwargs(ctx))
    s_traj = ref_mma.mma_trajectory(abs_operand(ctx.a), abs_operand(ctx.b), tiles, ctx.bm, ctx.bn, ctx.bk,
                                    **abs_kwargs(ctx))
    row_of = {tile: i for i, tile in enumerate(tiles)}
    by_tile: dict[tuple[int, int], dict[int, Tap]] = {}
    for t in taps:
        by_tile.setdefault(t.tile, {})[kb_of[id(t)]] = t
    tf, ch = [], []
    # teacher-forced: each tap's span starts after the nearest earlier accumulator tap of its tile
    j0_of = {id(t): max((j for j in by_tile[t.tile] if j < kb_of[id(t)]), default=-1) for t in taps}
    for op in ("a", "b"):  # the reference operands that stand in for untapped ones, in one launch each
        ctx.prefetch_ref_tiles(op, [(t.tile, j) for t in taps for j in range(j0_of[id(t)] + 1, kb_of[id(t)] + 1)
                                    if (f"load_{op}", t.tile, j) not in ctx.taps])
    for t in taps:
        kb = kb_of[id(t)]
        i = row_of[t.tile]
        received = t.values.to(ctx.dev).float()
        recorded = ctx.recorded(t)
        valid = ctx.valid_mask("mma", t.tile, tuple(received.shape))
        ctx.note_padding("mma", valid, recorded)
        where = dict(origin=ctx.origin("mma", t.tile, kb), tile_index=t.tile, k_block=kb)
        n_k = min((kb + 1) * ctx.bk, spec.k)
        bound = tolerance.mma_bound(spec, torch.zeros_like(s_traj[i, kb]), s_traj[i, kb], n_k)
        ch.append(ctx.judge(received, traj[i, kb].float(), feed=Feed.REFERENCE, valid=valid, recorded=recorded,
                            bound=bound, **where))

        j0 = j0_of[id(t)]  # -1: from zero at the start
        upstream = torch.ones_like(recorded)
        if j0 >= 0:
            start = by_tile[t.tile][j0]
            acc = start.values.to(ctx.dev)
            upstream &= ctx.recorded(start)
            start_abs = acc.float().abs()
        else:
            acc = torch.zeros(ctx.bm, ctx.bn, device=ctx.dev, dtype=traj.dtype)
            start_abs = torch.zeros(ctx.bm, ctx.bn, device=ctx.dev)
        span_s = s_traj[i, kb] - (s_traj[i, j0] if j0 >= 0 else 0)
        stand_ins = []
        for j in range(j0 + 1, kb + 1):
            a_t = ctx.taps.get(("load_a", t.tile, j))
            b_t = ctx.taps.get(("load_b", t.tile, j))
            if a_t is None:
                stand_ins.append(("load_a", t.tile, j))
                a_tile = ctx.ref_tile("a", t.tile, j)
            else:
                a_tile = a_t.values.to(ctx.dev)
                upstream &= ctx.recorded(a_t).all(dim=1)[:, None]
            if b_t is None:
                stand_ins.append(("load_b", t.tile, j))
                b_tile = ctx.ref_tile("b", t.tile, j)
            else:
                b_tile = b_t.values.to(ctx.dev)
                upstream &= ctx.recorded(b_t).all(dim=0)[None, :]
            if a_t is not None or b_t is not None:  # the kernel's own operands may differ in magnitude
                span_s = span_s - (s_traj[i, j] - (s_traj[i, j - 1] if j > 0 else 0)) + \
                    abs_operand(a_tile).float() @ abs_operand(b_tile).float() * _block_abs(ctx, t.tile, j)
            sa, sb = ctx.block_scales(t.tile, j)
            acc = ref_mma.mma_step(acc.to(traj.dtype), a_tile, b_tile, acc=spec.acc_dtype,
                                   promotion_interval=spec.promotion_interval, scale_a=sa, scale_b=sb)
        n_span = min((kb + 1) * ctx.bk, spec.k) - (j0 + 1) * ctx.bk
        bound = tolerance.mma_bound(spec, start_abs, span_s, max(n_span, 1))
        tf.append(ctx.judge(received, acc.float(), feed=Feed.STAND_IN if stand_ins else Feed.KERNEL, valid=valid,
                            recorded=recorded, upstream=upstream, bound=bound, stand_ins=stand_ins, **where))
    return StageResult("mma", combine(tf), combine(ch)), finals

"""The mma stage: the accumulator after each tapped k-block.

- chained: against the reference trajectory of the tile (the reference's own operands from zero);
- teacher-forced: each accumulator tap against the reference update over its span of k-blocks,
  started from the kernel's own nearest earlier accumulator tap of the tile (or from zero) and fed
  with the kernel's own operand tiles (a quantised B: its dequant_b tiles). Where an operand tile
  of the span was not tapped, the
  reference tile stands in for it and the comparison says so (its finding is a draft). An
  accumulator element is compared only if the kernel recorded the accumulator it started from and
  every element of its row of A and its column of B in the span.
A split tile (split-K, stream-K) is judged partial by partial, its partials as its own taps show
them (oracle.problem.partition.observed_partition): each partial's trajectory starts from zero at its first
k-block. A partition no valid kernel has (a k-block tapped in two partials, or in none) is itself a
failing unit of the stage at that partial and k-block, fed by the kernel's taps; a tap that still
falls outside its partial is an open confound and is left out of the trajectory. Where a
partial's first k-block (or, for a tap without a k-block, its last) rests on a boundary the declared
rule placed over untraced k-blocks, every unit that starts from it carries that assumption (an
open confound of the unit: its finding is a DRAFT that names it); so does a gap whose partial
depends on one.
"""

from __future__ import annotations

import torch

from harness.taps import Tap
from kernels_ref import mma as ref_mma
from oracle.judging import tolerance
from oracle.judging.compare import Comparison, Status, TileMetrics, combine
from oracle.judging.differential.context import NOT_RUN_STAGE, Context, StageResult
from oracle.judging.evidence import Evidence, Feed
from oracle.problem.partition import PartitionIssue


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
    """The stage, and the final accumulator tap of each tile's partials: {(tile, partial): tap}, the
    partial None for a tile that is not split (what the reduction, or the epilogue, is fed with)."""
    spec = ctx.spec
    taps = ctx.taps_of("mma")
    finals: dict[tuple, Tap] = {}
    if not taps:
        return StageResult("mma", NOT_RUN_STAGE, NOT_RUN_STAGE), finals
    runs: dict[tuple, dict[int, Tap]] = {}  # (tile, partial) -> {k-block: tap}, in-range taps only
    for t in taps:
        part = ctx.partial(t.tile, t.partial)
        kb = part.kb_end - 1 if t.k_block is None else t.k_block
        if not part.holds(kb):
            ctx.confound(f"mma tile {t.tile} {part.describe()} tapped k-block {kb}, outside its range: the tap is left "
                         f"out of the judgement")
            continue
        runs.setdefault((t.tile, t.partial), {})[kb] = t
        if kb == part.kb_end - 1:
            finals[(t.tile, t.partial)] = t
    tf, ch = [partition_unit(i, ctx.assumed(i.tile, at=i.k_block) if i.kind == "gap" else ())
              for i in ctx.partition_issues], []
    for (tile, p_index), by_kb in sorted(runs.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
        part = ctx.partial(tile, p_index)
        traj, s_traj = _partial_reference(ctx, tile, part)
        stats = ref_mma.trajectory_stats(traj, s_traj, spec.reduction_chunk, ctx.bk)  # what the bounds read
        kbs = sorted(by_kb)
        for op in ("a", "b"):  # the reference operands that stand in for untapped ones, in one launch each
            ctx.prefetch_ref_tiles(op, [(tile, j) for j in range(part.kb_begin, kbs[-1] + 1)
                                        if ctx.tap(ctx.mma_stage_of(op), tile, j, p_index) is None])
        for kb in kbs:
            t = by_kb[kb]
            j0 = max((j for j in kbs if j < kb), default=None)  # None: from zero at the partial's start
            c_tf, c_ch = _judge_span(ctx, t, part, kb, j0, by_kb, traj, s_traj, stats)
            tf.append(c_tf)
            ch.append(c_ch)
    return StageResult("mma", combine(tf), combine(ch)), finals


def partition_unit(issue: PartitionIssue, assumed: tuple[str, ...] = ()) -> Comparison:
    """A partition no valid kernel has, as a failing unit of the mma stage at its partial and
    k-block (no element: the fault is which k-blocks were summed, read from the kernel's taps).
    `assumed`: the assumed boundaries its partial depends on (Context.assumed)."""
    nan = float("nan")
    unit = TileMetrics(issue.tile, issue.k_block, compared=0, excluded=0, mismatches=1, max_abs_err=nan,
                       max_rel_err=nan, max_ratio=float("inf"), rel_l2=nan, cosine=nan, amplification=nan,
                       nan_received=0, nan_expected=0, inf_received=0, inf_expected=0, trivial=False, exact=False,
                       partial=issue.partial, assumed=tuple(assumed))
    return Comparison(Status.MISMATCH, (unit,), (f"partition: {issue.describe()}",)).labelled(Evidence.of(Feed.KERNEL))


def _partial_reference(ctx: Context, tile, part):
    """The reference accumulator of one partial of one tile after each of its k-blocks, and S."""
    spec = ctx.spec
    if part.kb_begin == 0 and part.kb_end == spec.k_blocks:
        traj = ref_mma.mma_trajectory(ctx.a, ctx.b, [tile], ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill,
                                      **mma_kwargs(ctx))
        s_traj = ref_mma.mma_trajectory(abs_operand(ctx.a), abs_operand(ctx.b), [tile], ctx.bm, ctx.bn, ctx.bk,
                                        **abs_kwargs(ctx))
    else:
        traj = ref_mma.partial_trajectory(ctx.a, ctx.b, [tile], ctx.bm, ctx.bn, ctx.bk, part.kb_begin, part.kb_end,
                                          oob_fill=spec.oob_fill, **mma_kwargs(ctx))
        s_traj = ref_mma.partial_trajectory(abs_operand(ctx.a), abs_operand(ctx.b), [tile], ctx.bm, ctx.bn, ctx.bk,
                                            part.kb_begin, part.kb_end, **abs_kwargs(ctx))
    return traj[0], s_traj[0]  # [k-blocks of the partial, BM, BN], local index kb - kb_begin


def _judge_span(ctx: Context, t: Tap, part, kb: int, j0, by_kb: dict, traj, s_traj, stats):
    """Chained and teacher-forced comparisons of one accumulator tap (k-block kb of its partial);
    `stats`: the reference trajectory's partial-sum statistics (trajectory_stats)."""
    spec = ctx.spec
    b0 = part.kb_begin
    # the chained trajectory starts at the partial's first k-block; so does the teacher-forced span
    # when no earlier tap of the partial is there; a tap without a k-block sits at its last
    ends = t.partial if t.k_block is None else None
    from_begin = ctx.assumed(t.tile, begin=t.partial, end=ends)
    received = t.values.to(ctx.dev).float()
    recorded = ctx.recorded(t)
    valid = ctx.valid_mask("mma", t.tile, tuple(received.shape))
    ctx.note_padding("mma", valid, recorded)
    where = dict(origin=ctx.origin("mma", t.tile, kb), tile_index=t.tile, k_block=kb)
    n_k = min((kb + 1) * ctx.bk, spec.k) - b0 * ctx.bk
    bound = tolerance.mma_bound(spec, torch.zeros_like(s_traj[kb - b0]), s_traj[kb - b0], n_k, stats.at(kb - b0),
                                x_abs=traj[kb - b0].abs())
    c_ch = ctx.judge(received, traj[kb - b0].float(), feed=Feed.REFERENCE, valid=valid, recorded=recorded,
                     bound=bound, partial=t.partial, assumed=from_begin, **where)

    upstream = torch.ones_like(recorded)
    if j0 is not None:
        start = by_kb[j0]
        acc = start.values.to(ctx.dev)
        upstream &= ctx.recorded(start)
        start_abs = acc.float().abs()
        first = j0 + 1
    else:
        acc = torch.zeros(ctx.bm, ctx.bn, device=ctx.dev, dtype=traj.dtype)
        start_abs = torch.zeros(ctx.bm, ctx.bn, device=ctx.dev)
        first = b0
    span_s = s_traj[kb - b0] - (s_traj[first - 1 - b0] if first > b0 else 0)
    span = tolerance.SpanStats(acc.float())
    stand_ins = []
    b_stage = ctx.mma_stage_of("b")  # a quantised B: the MMA reads the dequant_b tile
    for j in range(first, kb + 1):
        a_t = ctx.tap("load_a", t.tile, j, t.partial)
        b_t = ctx.tap(b_stage, t.tile, j, t.partial)
        if a_t is None:
            stand_ins.append(("load_a", t.tile, j))
            a_tile = ctx.ref_tile("a", t.tile, j)
        else:
            a_tile = a_t.values.to(ctx.dev)
            upstream &= ctx.recorded(a_t).all(dim=1)[:, None]
        if b_t is None:
            stand_ins.append((b_stage, t.tile, j))
            b_tile = ctx.ref_tile("b", t.tile, j)
        else:
            b_tile = b_t.values.to(ctx.dev)
            upstream &= ctx.recorded(b_t).all(dim=0)[None, :]
        s_blk = s_traj[j - b0] - (s_traj[j - 1 - b0] if j > b0 else 0)
        if a_t is not None or b_t is not None:  # the kernel's own operands may differ in magnitude
            s_own = abs_operand(a_tile).float() @ abs_operand(b_tile).float() * _block_abs(ctx, t.tile, j)
            span_s = span_s - s_blk + s_own
            s_blk = s_own
        sa, sb = ctx.block_scales(t.tile, j)
        acc = ref_mma.mma_step(acc.to(traj.dtype), a_tile, b_tile, acc=spec.acc_dtype,
                               promotion_interval=spec.promotion_interval, scale_a=sa, scale_b=sb)
        span.add(s_blk, acc.float())
    n_span = min((kb + 1) * ctx.bk, spec.k) - first * ctx.bk
    bound = tolerance.mma_bound(spec, start_abs, span_s, max(n_span, 1), span)
    c_tf = ctx.judge(received, acc.float(), feed=Feed.STAND_IN if stand_ins else Feed.KERNEL, valid=valid,
                     recorded=recorded, upstream=upstream, bound=bound, stand_ins=stand_ins, partial=t.partial,
                     assumed=from_begin if j0 is None else ctx.assumed(t.tile, end=ends), **where)
    return c_tf, c_ch

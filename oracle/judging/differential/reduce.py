"""The reduce stage: a split tile's partials summed into the accumulator the epilogue reads.

- teacher-forced: the kernel's reduce tap against the reference sum of the kernel's own final
  partial taps (a partial whose final accumulator was not tapped is stood in for by the reference
  partial, and said so), bound by a reduction in any order;
- chained: against the reference accumulation of the whole tile.
The partials are the tile's own, as its mma taps show them (oracle.problem.partition). It also hands the
epilogue its source per tile: the reduce tap; or, where the reduction was not tapped, the kernel's
partials summed by the reference (a stand-in for the reduce tap); or, for a whole tile (a problem
that is not split, a tile whose taps name no partial, a stream-K tile one worker did alone), its
final mma tap. Which mma tap is a partial's last, and the k-blocks a stand-in partial covers, rest
on the tile's partition: where the declared rule placed a boundary over untraced k-blocks, the
reduce units of the tile, and an epilogue fed by anything but the kernel's reduce tap, carry it
as an open confound (Geometry.assumed).
"""

from __future__ import annotations

import torch

from kernels_ref import reduce as ref_reduce
from oracle.judging import accumulation_bound, tolerance
from oracle.judging.compare import combine
from oracle.judging.differential.context import Context, Source, StageResult
from oracle.judging.differential.judge import Notebook, StageNotes
from oracle.judging.differential.mma import _partial_reference
from oracle.judging.evidence import Feed
from oracle.problem.partition import Partial


def reduce_stage(ctx: Context, finals: dict) -> tuple[StageResult, StageNotes, dict]:
    """The stage, what it noted, and {tile: Source} for the epilogue."""
    nb = Notebook(ctx.geo.dev)
    result, sources = _reduce_stage(ctx, nb, finals)
    return result, nb.notes(), sources


def _reduce_stage(ctx: Context, nb: Notebook, finals: dict) -> tuple[StageResult, dict]:
    geo, tapped = ctx.geo, ctx.taps
    spec = geo.spec
    tiles = sorted({t.tile for t in tapped.records if t.stage in ("mma", "reduce") or t.stage.startswith("epilogue")})
    sources: dict = {}
    tf, ch = [], []
    for tile in tiles:
        tap = tapped.tap("reduce", tile)
        assumed = geo.assumed(tile, every=True)
        if geo.whole(tile):
            final = finals.get((tile, None)) if (tile, None) in finals else finals.get((tile, 0))
            if tap is not None and spec.partitioned:  # the kernel passed the whole tile through its reduction
                sources[tile] = Source(tap.values.to(geo.dev), tapped.recorded(tap), "reduce")
            elif final is not None:
                sources[tile] = Source(final.values.to(geo.dev), tapped.recorded(final), "mma (final accumulator)",
                                       assumed=assumed)
            if tap is not None and final is not None:
                c_tf, c_ch = _judge(ctx, nb, tap, final.values.to(geo.dev).float(), tapped.recorded(final), (), 1,
                                    torch.zeros(geo.bm, geo.bn, dtype=torch.float64, device=geo.dev), None, assumed)
                tf.append(c_tf)
                ch.append(c_ch)
            continue
        parts = geo.partials(tile)
        values, recorded, stand_ins, extra = [], torch.ones(geo.bm, geo.bn, dtype=torch.bool, device=geo.dev), [], 0
        for p in parts:
            t = finals.get((tile, p.index))
            if t is not None:
                values.append(t.values.to(geo.dev).float())
                recorded &= tapped.recorded(t)
            else:  # the reference partial stands in, with its own bound
                traj, s_traj = _tile_reference(ctx, tile, p)
                values.append(traj[-1].float())
                stand_ins.append(("mma", tile, p.kb_end - 1))
                n_k = min(p.kb_end * geo.bk, spec.k) - p.kb_begin * geo.bk
                zero = torch.zeros_like(s_traj[-1])
                extra = extra + accumulation_bound.mma_bound(spec, zero, s_traj[-1], n_k).double()
        summed = ref_reduce.reduce_partials(torch.stack(values))
        if tap is None:
            sources[tile] = Source(summed, recorded, "mma partials through the untapped reduce",
                                   tuple(stand_ins) + (("reduce", tile, None),), assumed)
            continue
        sources[tile] = Source(tap.values.to(geo.dev), tapped.recorded(tap), "reduce")
        c_tf, c_ch = _judge(ctx, nb, tap, summed, recorded, tuple(stand_ins), len(parts), extra,
                            torch.stack(values), assumed)
        tf.append(c_tf)
        ch.append(c_ch)
    if not tf and not ch:
        return StageResult.not_run("reduce"), sources
    return StageResult("reduce", combine(tf), combine(ch)), sources


def _tile_reference(ctx: Context, tile, part):
    """The reference accumulator of one partial of one tile after each of its k-blocks, and S."""
    traj, s_traj = _partial_reference(ctx.geo, ctx.ops, [tile], part.kb_begin, part.kb_end)
    return traj[0], s_traj[0]


def _judge(ctx: Context, nb: Notebook, tap, expected, upstream, stand_ins, n_parts, extra_bound, parts=None,
           assumed=()):
    geo, tapped = ctx.geo, ctx.taps
    spec = geo.spec
    received = tap.values.to(geo.dev).float()
    recorded = tapped.recorded(tap)
    valid = geo.valid_mask("reduce", tap.tile, tuple(received.shape))
    nb.note_padding("reduce", valid, recorded)
    where = dict(origin=geo.origin("reduce", tap.tile, None), tile_index=tap.tile)
    abs_sum = parts.abs().sum(0).double() if parts is not None else expected.abs().double()
    bound = tolerance.reduce_bound(abs_sum, n_parts) + extra_bound
    c_tf = nb.judge(received, expected, feed=Feed.STAND_IN if stand_ins else Feed.KERNEL, valid=valid,
                    recorded=recorded, upstream=upstream, bound=bound, stand_ins=stand_ins, assumed=assumed, **where)
    traj, s_traj = _tile_reference(ctx, tap.tile, Partial(0, 0, spec.k_blocks))
    full = accumulation_bound.mma_bound(spec, torch.zeros_like(s_traj[-1]), s_traj[-1], spec.k).double()
    c_ch = nb.judge(received, traj[-1].float(), feed=Feed.REFERENCE, valid=valid, recorded=recorded,
                    bound=full + tolerance.reduce_bound(s_traj[-1].double(), n_parts), assumed=assumed, **where)
    return c_tf, c_ch

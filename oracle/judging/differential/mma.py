"""The mma stage: the accumulator after each tapped k-block.

- chained: against the reference trajectory of the tile (the reference's own operands from zero);
- teacher-forced: each accumulator tap against the reference update over its span of k-blocks,
  started from the kernel's own nearest earlier accumulator tap of the tile (or from zero) and fed
  with the kernel's own operand tiles (a quantised operand: its dequant_a / dequant_b tiles). Where an operand tile
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
from kernels_ref._common import device_tensor
from kernels_ref import mma as ref_mma
from kernels_ref import mma_stats as ref_stats
from oracle.judging import accumulation_bound, bound_stats
from oracle.judging.compare import Comparison, Status, TileMetrics, combine
from oracle.judging.differential.context import StageResult
from oracle.judging.differential.device_operands import DeviceOperands
from oracle.judging.differential.geometry import Geometry
from oracle.judging.differential.judge import Notebook, StageNotes, Unit
from oracle.judging.differential.tap_index import TapIndex
from oracle.judging.evidence import Evidence, Feed
from oracle.problem.partition import PartitionIssue
from oracle.run.confounds import Confound, ConfoundKind


def abs_operand(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        return x.float().abs()
    if x.element_size() == 1:  # fp8: no abs on CUDA; clear the sign bit (exact, and fp8 stays fp8)
        return (x.view(torch.uint8) & 0x7F).view(x.dtype)
    return x.abs()


def mma_kwargs(ops: DeviceOperands) -> dict:
    spec = ops.geo.spec
    return dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ops.block_a,
                scale_b=ops.block_b, block_scale_group=ops.group)


def abs_kwargs(ops: DeviceOperands) -> dict:
    """The arguments that make the reference accumulate S = sum |a||b| (times |block scales|)."""
    return dict(mma_kwargs(ops), acc="fp32", promotion_interval=None,
                scale_a=ops.block_a.abs() if ops.block_a is not None else None,
                scale_b=ops.block_b.abs() if ops.block_b is not None else None)


def _own_abs_sum(ops: DeviceOperands, a: torch.Tensor, b: torch.Tensor, tiles, kbs) -> torch.Tensor:
    """S of one k-block from the kernel's own operand tiles a [U, BM, BK], b [U, BK, BN]: |a| @ |b|
    times |block scale a| |block scale b|, per scale group where a k-block holds several."""
    sa, sb = ops.block_scales_units(tiles, kbs)
    a, b = abs_operand(a).float(), abs_operand(b).float()
    if sa is None:
        return a @ b
    if sa.dim() == 2:
        return a @ b * (sa.abs()[:, :, None] * sb.abs()[:, None, :])
    width = a.shape[-1] // sa.shape[-1]
    out = torch.zeros(a.shape[0], a.shape[1], b.shape[2], dtype=torch.float32, device=a.device)
    for g in range(sa.shape[-1]):
        k = slice(g * width, (g + 1) * width)
        out = out + a[:, :, k] @ b[:, k, :] * (sa[:, :, g].abs()[:, :, None] * sb[:, :, g].abs()[:, None, :])
    return out


def mma_stage(geo: Geometry, tapped: TapIndex, ops: DeviceOperands) -> tuple[StageResult, StageNotes, dict]:
    """The stage, what it noted, and the final accumulator tap of each tile's partials: {(tile,
    partial): tap}, the partial None for a tile that is not split (what the reduction, or the
    epilogue, is fed with). Every tap is a unit; the units are judged together (judge_units), their
    references launched once per partial range and once per step of the longest teacher-forced span."""
    nb = Notebook(geo.dev)
    result, finals = _mma_stage(geo, tapped, ops, nb)
    return result, nb.notes(), finals


def _mma_stage(geo: Geometry, tapped: TapIndex, ops: DeviceOperands, nb: Notebook) -> tuple[StageResult, dict]:
    taps = tapped.taps_of("mma")
    finals: dict[tuple, Tap] = {}
    if not taps:
        return StageResult.not_run("mma"), finals
    runs: dict[tuple, dict[int, Tap]] = {}  # (tile, partial) -> {k-block: tap}, in-range taps only
    for t in taps:
        part = geo.partial(t.tile, t.partial)
        kb = part.kb_end - 1 if t.k_block is None else t.k_block
        if not part.holds(kb):
            nb.confound(Confound.of(ConfoundKind.MMA_TAP_OUTSIDE_PARTIAL, "mma", tile=str(t.tile),
                                    partial=part.describe(), k_block=kb))
            continue
        runs.setdefault((t.tile, t.partial), {})[kb] = t
        if kb == part.kb_end - 1:
            finals[(t.tile, t.partial)] = t
    tf = [partition_unit(i, geo.assumed(i.tile, at=i.k_block) if i.kind == "gap" else ())
          for i in geo.partition_issues]
    ordered = sorted(runs.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1]))
    if not ordered:
        return StageResult("mma", combine(tf), combine([])), finals
    refs = _References(geo, ops, [(tile, geo.partial(tile, p)) for (tile, p), _ in ordered])
    units = []  # (run index, tap, k-block, j0): j0 the nearest earlier tapped k-block (None: from zero)
    for r, ((tile, p_index), by_kb) in enumerate(ordered):
        kbs = sorted(by_kb)
        for i, kb in enumerate(kbs):
            units.append((r, by_kb[kb], kb, kbs[i - 1] if i else None))
    values, recorded = tapped.stack_taps([t for _, t, _, _ in units])
    chained = _chained(geo, nb, refs, units, values, recorded)
    forced = _teacher_forced(geo, tapped, ops, nb, refs, units, values, recorded)
    return StageResult("mma", combine(tf + forced), combine(chained)), finals


class _References:
    """The reference trajectory, S and their statistics of every (tile, partial) run, launched once
    per partial range, kept as pools of [BM, BN] slices: `at(run, kb)` indexes them (kb a global
    k-block; None: the zero row)."""

    def __init__(self, geo: Geometry, ops: DeviceOperands, runs):
        spec = geo.spec
        self.parts = [part for _, part in runs]
        groups: dict[tuple, list[int]] = {}
        for r, (_, part) in enumerate(runs):
            groups.setdefault((part.kb_begin, part.kb_end), []).append(r)
        pools = {"traj": [], "s": [], "l": [], "v": [], "q": [], "pabs": [], "prun": []}
        self.base: dict[int, tuple[int, int]] = {}  # run -> (first row in the pools, its partial's first k-block)
        row = 0
        for (b0, b1), members in groups.items():
            tiles = [runs[r][0] for r in members]
            traj, s_traj = _partial_reference(geo, ops, tiles, b0, b1)  # [T, k-blocks, BM, BN]
            stats = ref_stats.trajectory_stats(traj, s_traj, spec.reduction_chunk, geo.bk)  # what the bounds read
            n_kb = traj.shape[1]
            for name, x in (("traj", traj), ("s", s_traj), ("l", stats.l), ("v", stats.v), ("q", stats.q),
                            ("pabs", stats.pabs), ("prun", stats.prun)):
                pools[name].append(None if x is None else x.reshape((-1,) + tuple(x.shape[2:])))
            for i, r in enumerate(members):
                self.base[r] = (row + i * n_kb, b0)
            row += len(members) * n_kb
        self.rows = row
        cat = (lambda xs: None if any(x is None for x in xs) else torch.cat(xs) if len(xs) > 1 else xs[0])
        self.traj, self.s = cat(pools["traj"]), cat(pools["s"])
        self.s = torch.cat([self.s, torch.zeros_like(self.s[:1])])  # row `rows`: zero (no k-block before)
        self.stats = ref_stats.MmaStats(*(cat(pools[f]) for f in ("l", "v", "q", "pabs", "prun")))

    def at(self, run: int, kb) -> int:
        if kb is None:
            return self.rows
        first, b0 = self.base[run]
        return first + kb - b0


def _partial_reference(geo: Geometry, ops: DeviceOperands, tiles, kb_begin: int, kb_end: int):
    """The reference accumulator of one partial range of some tiles after each of its k-blocks, and
    S: [tiles, k-blocks of the range, BM, BN], local index kb - kb_begin."""
    spec = geo.spec
    if kb_begin == 0 and kb_end == spec.k_blocks:
        traj = ref_mma.mma_trajectory(ops.a, ops.b, tiles, geo.bm, geo.bn, geo.bk, oob_fill=spec.oob_fill,
                                      **mma_kwargs(ops))
        s_traj = ref_mma.mma_trajectory(abs_operand(ops.a), abs_operand(ops.b), tiles, geo.bm, geo.bn, geo.bk,
                                        **abs_kwargs(ops))
    else:
        traj = ref_mma.partial_trajectory(ops.a, ops.b, tiles, geo.bm, geo.bn, geo.bk, kb_begin, kb_end,
                                          oob_fill=spec.oob_fill, **mma_kwargs(ops))
        s_traj = ref_mma.partial_trajectory(abs_operand(ops.a), abs_operand(ops.b), tiles, geo.bm, geo.bn, geo.bk,
                                            kb_begin, kb_end, **abs_kwargs(ops))
    return traj, s_traj


def _unit_of(geo: Geometry, t: Tap, kb: int, **labels) -> Unit:
    return Unit(origin=geo.origin("mma", t.tile, kb), tile=t.tile, k_block=kb, partial=t.partial, **labels)


def _from_begin(geo: Geometry, t: Tap) -> tuple[str, ...]:
    # the chained trajectory starts at the partial's first k-block; so does the teacher-forced span
    # when no earlier tap of the partial is there; a tap without a k-block sits at its last
    return geo.assumed(t.tile, begin=t.partial, end=t.partial if t.k_block is None else None)


def _chained(geo: Geometry, nb: Notebook, refs: _References, units, values, recorded) -> list:
    """Each accumulator tap against the reference trajectory of its partial."""
    spec = geo.spec
    at = device_tensor([refs.at(r, kb) for r, _, kb, _ in units], geo.dev)
    x, s = refs.traj[at], refs.s[at]
    n_k = [min((kb + 1) * geo.bk, spec.k) - refs.parts[r].kb_begin * geo.bk for r, _, kb, _ in units]
    stats = refs.stats.at(at)
    bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, n_k, stats, x_abs=x.abs())
    valid = geo.valid_units("mma", [t.tile for _, t, _, _ in units], tuple(values.shape[1:]))
    return nb.judge_units([_unit_of(geo, t, kb, feed=Feed.REFERENCE, assumed=_from_begin(geo, t))
                           for _, t, kb, _ in units], values.float(), x.float(), valid=valid, recorded=recorded,
                          bound=bound, padding="mma")


def _teacher_forced(geo: Geometry, tapped: TapIndex, ops: DeviceOperands, nb: Notebook, refs: _References, units,
                    values, recorded) -> list:
    """Each accumulator tap against the reference update over its span of k-blocks, started from
    the kernel's nearest earlier accumulator tap of the partial (or zero) and fed with the kernel's
    own operand tiles (the reference's standing in for untapped ones): the spans advance together,
    one batched mma_step per step of the longest."""
    spec = geo.spec
    n = len(units)
    row_of = {(r, kb): u for u, (r, _, kb, _) in enumerate(units)}
    firsts = [refs.parts[r].kb_begin if j0 is None else j0 + 1 for r, _, _, j0 in units]
    a_stage, b_stage = geo.mma_stage_of("a"), geo.mma_stage_of("b")  # a quantised operand: its dequant tile
    # where each step's operand tiles come from: (op, step) -> [(unit, tap or None, j)]
    steps = max(kb - f + 1 for (_, _, kb, _), f in zip(units, firsts))
    plan = []
    stand_ins = [[] for _ in range(n)]
    for step in range(steps):
        rows = []
        for u, ((r, t, kb, _), f) in enumerate(zip(units, firsts)):
            j = f + step
            if j > kb:
                continue
            a_t = tapped.tap(a_stage, t.tile, j, t.partial)
            b_t = tapped.tap(b_stage, t.tile, j, t.partial)
            if a_t is None:
                stand_ins[u].append((a_stage, t.tile, j))
            if b_t is None:
                stand_ins[u].append((b_stage, t.tile, j))
            rows.append((u, j, a_t, b_t))
        plan.append(rows)
    pools = {}
    for op, k in (("a", 2), ("b", 3)):
        own = list({id(row[k]): row[k] for rows in plan for row in rows if row[k] is not None}.values())
        sites = list(dict.fromkeys((units[row[0]][1].tile, row[1]) for rows in plan for row in rows if row[k] is None))
        parts, ok = [], None
        if own:
            v, rec = tapped.stack_taps(own)
            parts.append(v)
            ok = rec.all(dim=2) if op == "a" else rec.all(dim=1)  # rows of A, columns of B recorded whole
        if sites:
            parts.append(ops.ref_tiles(op, sites))
        pool = torch.cat(parts) if len(parts) > 1 else parts[0]
        index = {id(x): i for i, x in enumerate(own)}
        index.update({("ref",) + site: len(own) + i for i, site in enumerate(sites)})
        pools[op] = (pool, ok, index)

    has_start = [j0 is not None for _, _, _, j0 in units]
    start = device_tensor([row_of[(r, j0)] if j0 is not None else n for r, _, _, j0 in units], geo.dev)
    zero_row = (lambda x: torch.cat([x, torch.zeros_like(x[:1])]))
    acc = zero_row(values)[start]
    upstream = torch.ones_like(recorded)
    if any(has_start):
        upstream = upstream & torch.cat([recorded, torch.ones_like(recorded[:1])])[start]
    start_abs = acc.float().abs()
    traj_dtype = refs.traj.dtype
    s_end = refs.s[device_tensor([refs.at(r, kb) for r, _, kb, _ in units], geo.dev)]
    s_before = refs.s[device_tensor([refs.at(r, f - 1 if f > refs.parts[r].kb_begin else None)
                                     for (r, _, _, _), f in zip(units, firsts)], geo.dev)]
    span_s = s_end - s_before
    span = bound_stats.SpanStats(acc.float())
    acc = acc.to(traj_dtype)
    for rows in plan:
        every = len(rows) == n
        idx = None if every else device_tensor([u for u, *_ in rows], geo.dev)
        sel = (lambda x: x if idx is None else x[idx])
        tiles = {}
        for op, k in (("a", 2), ("b", 3)):
            pool, ok, index = pools[op]
            keys = [id(row[k]) if row[k] is not None else ("ref", units[row[0]][1].tile, row[1]) for row in rows]
            tiles[op] = pool[device_tensor([index[key] for key in keys], geo.dev)]
            own = [i for i, row in enumerate(rows) if row[k] is not None]
            if own:
                who = device_tensor([rows[i][0] for i in own], geo.dev)
                got = ok[device_tensor([index[id(rows[i][k])] for i in own], geo.dev)]
                got = got[:, :, None] if op == "a" else got[:, None, :]
                upstream = upstream.index_put((who,), upstream[who] & got)
        j_now = [refs.at(units[u][0], j) for u, j, _, _ in rows]
        j_prev = [refs.at(units[u][0], j - 1 if j > refs.parts[units[u][0]].kb_begin else None) for u, j, _, _ in rows]
        s_blk = refs.s[device_tensor(j_now, geo.dev)] - refs.s[device_tensor(j_prev, geo.dev)]
        own = [i for i, (_, _, a_t, b_t) in enumerate(rows) if a_t is not None or b_t is not None]
        if own:  # the kernel's own operands may differ in magnitude
            o = device_tensor(own, geo.dev)
            s_own = _own_abs_sum(ops, tiles["a"][o], tiles["b"][o], [units[rows[i][0]][1].tile for i in own],
                                 [rows[i][1] for i in own])
            who = device_tensor([rows[i][0] for i in own], geo.dev)
            span_s = span_s.index_put((who,), span_s[who] - s_blk[o] + s_own)
            s_blk = s_blk.index_put((o,), s_own)
        sa, sb = ops.block_scales_units([units[u][1].tile for u, *_ in rows], [j for _, j, _, _ in rows])
        new = ref_mma.mma_step(sel(acc).to(traj_dtype), tiles["a"], tiles["b"], acc=spec.acc_dtype,
                               promotion_interval=spec.promotion_interval, scale_a=sa, scale_b=sb)
        acc = new if every else acc.index_put((idx,), new)
        span.add_at(idx, s_blk, new.float())
    n_span = [max(min((kb + 1) * geo.bk, spec.k) - f * geo.bk, 1) for (_, _, kb, _), f in zip(units, firsts)]
    bound = accumulation_bound.mma_bound(spec, start_abs, span_s, n_span, span)
    valid = geo.valid_units("mma", [t.tile for _, t, _, _ in units], tuple(values.shape[1:]))
    labels = [_unit_of(geo, t, kb, feed=Feed.STAND_IN if stand_ins[u] else Feed.KERNEL, stand_ins=stand_ins[u],
                       assumed=_from_begin(geo, t) if j0 is None else
                       geo.assumed(t.tile, end=t.partial if t.k_block is None else None))
              for u, (_, t, kb, j0) in enumerate(units)]
    return nb.judge_units(labels, values.float(), acc.float(), valid=valid, recorded=recorded, upstream=upstream,
                          bound=bound)


def partition_unit(issue: PartitionIssue, assumed: tuple[str, ...] = ()) -> Comparison:
    """A partition no valid kernel has, as a failing unit of the mma stage at its partial and
    k-block (no element: the fault is which k-blocks were summed, read from the kernel's taps).
    `assumed`: the assumed boundaries its partial depends on (Geometry.assumed)."""
    nan = float("nan")
    unit = TileMetrics(issue.tile, issue.k_block, compared=0, excluded=0, mismatches=1, max_abs_err=nan,
                       max_rel_err=nan, max_ratio=float("inf"), rel_l2=nan, cosine=nan, amplification=nan,
                       nan_received=0, nan_expected=0, inf_received=0, inf_expected=0, trivial=False, exact=False,
                       partial=issue.partial, assumed=tuple(assumed))
    return Comparison(Status.MISMATCH, (unit,), (f"partition: {issue.describe()}",)).labelled(Evidence.of(Feed.KERNEL))



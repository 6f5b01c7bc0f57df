"""The epilogue's steps, in the problem's declared order (`ProblemSpec.epilogue_nodes`: scale,
alpha/beta, bias, activation, cast by default), and the store of D.

- chained: each step's tap against the reference pipeline over the whole output (one reference
  GEMM and epilogue, with the bound carried step by step);
- teacher-forced: each step's tap against the reference step fed with the kernel's own nearest
  upstream tap of the tile (the final accumulator, or an earlier step). A step in between that
  does something (a scale that exists, alpha != 1 or beta != 0, a bias, an activation, a cast to
  a narrower type, a declared rounding) and was not tapped is run by the reference as a stand-in,
  and said so.
- the store: D against the reference over every tile (chained), and per tapped tile against the
  kernel's last epilogue tap placed at its coordinates (teacher-forced). An output element that
  still holds the harness's poison was never written, whatever value the poison spells.
A node declared with a rounding (`bias:bf16`) is its step followed by the rounding: its stage
holds the rounded value. Taps of an epilogue stage the declaration lacks are an open confound:
the kernel's epilogue is not the declared one.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels_ref import epilogue as ref_epilogue
from kernels_ref import mma as ref_mma
from oracle import knobs
from oracle.judging import accumulation_bound, tolerance
from oracle.judging.compare import combine
from oracle.judging.differential.context import NOT_RUN_STAGE, Context, StageResult
from oracle.judging.differential.judge import Notebook, StageNotes, unwritten
from oracle.judging.differential.mma import abs_kwargs, abs_operand, mma_kwargs
from oracle.judging.evidence import Feed
from oracle.run.confounds import Confound, ConfoundKind


class Vectors:
    """The epilogue's per-row / per-column operands, for the whole output or one tile."""

    def __init__(self, ctx: Context, tile: Optional[tuple[int, int]]):
        geo, ops = ctx.geo, ctx.ops
        spec = geo.spec
        if tile is None:
            r0, c0, h, w = 0, 0, spec.m, spec.n
            self.c = ops.c
        else:
            r0, c0, h, w = tile[0] * geo.bm, tile[1] * geo.bn, geo.bm, geo.bn
            self.c = None
            if ops.c is not None:
                self.c = torch.zeros(h, w, dtype=ops.c.dtype, device=geo.dev)
                part = ops.c[r0:r0 + h, c0:c0 + w]
                self.c[:part.shape[0], :part.shape[1]] = part
        sl = (lambda v, s, n: v if tile is None else geo.tile_slice(v, s, n))
        self.row_scale = sl(ops.row_scale, r0, h)
        self.col_scale = sl(ops.col_scale, c0, w)
        self.tensor_scale = ops.tensor_scale
        self.bias = None
        if ops.bias is not None:
            self.bias = sl(ops.bias, r0, h) if spec.bias == "row" else sl(ops.bias, c0, w)


def step_acts(spec, step: str) -> bool:
    """Does this epilogue step change anything for this problem? (An untapped one that does is a stand-in.)"""
    if any(n.step == step and n.rounds for n in spec.epilogue_nodes):
        return True
    if step == "scale":
        return spec.scale_a.kind in ("tensor", "row") or spec.scale_b.kind in ("tensor", "col")
    if step == "alpha_beta":
        return spec.alpha != 1.0 or spec.beta != 0.0
    if step == "alpha":
        return spec.alpha != 1.0
    if step == "beta_c":
        return spec.beta != 0.0
    if step == "bias":
        return spec.bias != "none"
    if step == "activation":
        return spec.activation != "none"
    return spec.out_dtype != "fp32"


def steps_of(spec) -> tuple[str, ...]:
    """The epilogue's steps in the declared order."""
    return tuple(n.step for n in spec.epilogue_nodes)


def _step_values(spec, step: str, x: torch.Tensor, vec: Vectors):
    """One epilogue step (not the cast): its value, own error and gain."""
    if (step == "scale" and vec.row_scale is None and vec.col_scale is None and vec.tensor_scale is None) or \
            (step == "bias" and vec.bias is None):  # no operand: nothing to apply
        return x, torch.zeros_like(x), torch.ones_like(x)
    if step == "scale":
        y = ref_epilogue.apply_scale(x, row_scale=vec.row_scale, col_scale=vec.col_scale, tensor_scale=vec.tensor_scale)
        factor = torch.ones_like(x)
        if vec.row_scale is not None:
            factor = factor * vec.row_scale[:, None]
        if vec.col_scale is not None:
            factor = factor * vec.col_scale[None, :]
        if vec.tensor_scale is not None:
            factor = factor * vec.tensor_scale
        return (y, *tolerance.scale_step(y, factor))
    if step == "alpha_beta":
        y = ref_epilogue.apply_alpha_beta(x, spec.alpha, spec.beta, vec.c)
        return (y, *tolerance.alpha_beta_step(x, vec.c.float() if vec.c is not None else None, spec.alpha, spec.beta))
    if step == "alpha":
        return ref_epilogue.apply_alpha(x, spec.alpha), *tolerance.alpha_step(x, spec.alpha)
    if step == "beta_c":
        y = ref_epilogue.apply_beta_c(x, spec.beta, vec.c)
        return (y, *tolerance.beta_c_step(x, vec.c.float() if vec.c is not None else None, spec.beta))
    if step == "bias":
        y = ref_epilogue.apply_bias(x, vec.bias, spec.bias)
        bb = vec.bias[:, None] if spec.bias == "row" else vec.bias[None, :]
        return (y, *tolerance.bias_step(x, bb.expand_as(x)))
    y = ref_epilogue.apply_activation(x, spec.activation)  # activation
    return (y, *tolerance.activation_step(x, y, spec.activation, spec.activation_impl))


def run_epilogue(ctx: Context, x: torch.Tensor, bound: torch.Tensor, first_step: int, vec: Vectors,
                 cast_bound: bool = True):
    """Run the declared epilogue's nodes from index `first_step` on, carrying the bound. Yields
    (step, y, bound); a node that rounds yields its rounded value. `cast_bound=False`: the cast's
    bound is not computed (None), for a caller that holds the cast to its value bit for bit."""
    spec = ctx.geo.spec
    x = x.float()
    for node in spec.epilogue_nodes[first_step:]:
        step = node.step
        if step == "cast":
            y = ref_epilogue.apply_cast(x, spec.out_dtype, spec.saturate)
            yield step, y, tolerance.cast_bound(bound, y, spec.out_dtype) if cast_bound else None
            return
        if not step_acts(spec, step):  # its value is x and its bound step 0 own, gain 1: no pass over them
            y = x
        else:
            y, own, gain = _step_values(spec, step, x, vec)
            carried = gain.double() * bound
            if step == "scale":  # scales whose product overflows: an exact input stays exact (not inf * 0)
                carried = torch.where(bound == 0, bound, carried)
            bound = carried + own.double()
        if node.rounds:
            y = ref_epilogue.apply_round(y, node.round)
            bound = tolerance.round_bound(bound, y, node.round)
        yield step, y, bound
        x = y


def reference_accumulation(ctx: Context) -> tuple:
    """The whole output's reference accumulation: the accumulator (float32), S and the partial-sum
    statistics the accumulation bound reads (None for an int32 accumulator): reference_chain's input,
    which the analysis queues first, so that the GPU runs it while the host queues the rest."""
    geo, ops = ctx.geo, ctx.ops
    spec = geo.spec
    if spec.acc_dtype == "int32":
        acc_full = ref_mma.mma_accumulate(ops.a, ops.b, geo.bm, geo.bn, geo.bk, **mma_kwargs(ctx.ops)).float()
        s_full = ref_mma.mma_accumulate(abs_operand(ops.a), abs_operand(ops.b), geo.bm, geo.bn, geo.bk,
                                        **abs_kwargs(ctx.ops)).double()
        return acc_full, s_full, None
    # the accumulator, S and the partial-sum statistics the accumulation bound reads, in one pass
    acc_full, s_full, stats = ref_mma.mma_accumulate(ops.a, ops.b, geo.bm, geo.bn, geo.bk, **mma_kwargs(ctx.ops),
                                                     with_stats=True, stats_chunk=spec.reduction_chunk)
    return acc_full.float(), s_full, stats


def reference_chain(ctx: Context, accumulation: Optional[tuple] = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The reference pipeline over the whole output: each epilogue step's values and bound, from
    `accumulation` (reference_accumulation's, run here if not given)."""
    geo, ops = ctx.geo, ctx.ops
    spec = geo.spec
    acc_full, s_full, stats = accumulation if accumulation is not None else reference_accumulation(ctx)
    zero = torch.zeros((), dtype=torch.float64, device=s_full.device)  # |x0|: the accumulator starts at 0
    bound0 = accumulation_bound.mma_bound(spec, zero, s_full, spec.k, stats, x_abs=lambda: acc_full.abs().double(),
                                          dtype=torch.float64)  # |X|: read by the truncated-operand bound only
    if spec.partitioned:  # the partials' reduction, in whatever order the kernel sums them
        bound0 = bound0 + tolerance.reduce_bound(s_full.double(), geo.max_partials())
    if geo.quant is not None:  # the kernel's dequantised operand may differ from the reference's within its bound
        from oracle.judging.differential.dequant import operand_bound

        w_bound = operand_bound(ctx)
        if w_bound is not None:
            bound0 = bound0 + (ops.a.double().abs() @ w_bound if geo.quant_op == "b"
                               else w_bound @ ops.b.double().abs())
    return {step: (y, b) for step, y, b in run_epilogue(ctx, acc_full, bound0, 0, Vectors(ctx, None))}


def _teacher_forced(ctx: Context, tile, step_index: int, sources: dict):
    """The reference for epilogue step `step_index` of the declared order (its length: the store)
    fed from the kernel's nearest upstream tap of the tile (an epilogue step, else the accumulator
    source: the final mma tap, the reduce tap, or the partials summed). Returns (values, bound,
    recorded mask of the source, stand-ins, note, the partition assumptions the source rests on) or
    None when nothing upstream was tapped."""
    geo, tapped = ctx.geo, ctx.taps
    spec = geo.spec
    steps = steps_of(spec)
    for up in range(step_index - 1, -2, -1):
        src = tapped.tap(f"epilogue_{steps[up]}", tile) if up >= 0 else sources.get(tile)
        if src is None:
            continue
        skipped = [s for s in steps[up + 1:step_index] if step_acts(spec, s)]
        stand_ins = tuple((f"epilogue_{s}", tile, None) for s in skipped)
        assumed = () if up >= 0 else tuple(src.assumed)
        if up >= 0:
            name, recorded = f"the kernel's {src.stage} tap", tapped.recorded(src)
        else:
            name, recorded = f"the kernel's {src.name}", src.recorded
            stand_ins = tuple(src.stand_ins) + stand_ins
        note = name + (f" through untapped {', '.join(f'epilogue_{s}' for s in skipped)}" if skipped else "")
        y = src.values.to(geo.dev)
        b = torch.zeros(y.shape, dtype=torch.float64, device=geo.dev)
        last = min(step_index, len(steps) - 1)  # the store runs every step up to the cast
        if up < last:
            for step, y, b in run_epilogue(ctx, y, b, up + 1, Vectors(ctx, tile)):
                if step == steps[last]:
                    break
        return y, b, recorded, stand_ins, note, assumed
    return None


def undeclared_taps(ctx: Context) -> Optional[Confound]:
    """Taps of epilogue stages the declared epilogue does not have: an open confound (None: none)."""
    geo, tapped = ctx.geo, ctx.taps
    declared = {f"epilogue_{s}" for s in steps_of(geo.spec)}
    extra = sorted({t.stage for t in tapped.records if t.stage.startswith("epilogue_")} - declared)
    if not extra:
        return None
    return Confound.of(ConfoundKind.UNDECLARED_EPILOGUE, tapped=", ".join(extra),
                       declared=" > ".join(n.token for n in geo.spec.epilogue_nodes))


def epilogue_stages(ctx: Context, chain, sources: dict) -> tuple[list[StageResult], StageNotes]:
    """The epilogue's steps and the store, in order, and what they noted."""
    geo, tapped = ctx.geo, ctx.taps
    nb = Notebook(geo.dev)
    undeclared = undeclared_taps(ctx)
    if undeclared is not None:
        nb.confound(undeclared)
    results = []
    for si, step in enumerate(steps_of(geo.spec)):
        stage = f"epilogue_{step}"
        tf, ch = [], []
        for tap in tapped.taps_of(stage):
            received = tap.values.to(geo.dev)
            recorded = tapped.recorded(tap)
            valid = geo.valid_mask(stage, tap.tile, tuple(received.shape))
            nb.note_padding(stage, valid, recorded)
            where = dict(origin=geo.origin(stage, tap.tile, None), tile_index=tap.tile)
            y_full, b_full = chain[step]
            exp, bnd = geo.tile_of(y_full, tap.tile), geo.tile_of(b_full, tap.tile)
            exact = step == "cast" and bool((bnd == 0).all())
            ch.append(nb.judge(received, exp.to(received.dtype) if exact else exp, feed=Feed.REFERENCE, valid=valid,
                               recorded=recorded, bound=None if exact else bnd, **where))
            fed = _teacher_forced(ctx, tap.tile, si, sources)
            if fed is not None:
                y, b, upstream, stand_ins, note, assumed = fed
                exact = bool((b == 0).all()) and y.dtype == received.dtype
                c = nb.judge(received, y if exact else y.float(), feed=Feed.STAND_IN if stand_ins else Feed.KERNEL,
                             valid=valid, recorded=recorded, upstream=upstream, bound=None if exact else b,
                             stand_ins=stand_ins, assumed=assumed, **where)
                tf.append(c.fed(note))
        results.append(StageResult(stage, combine(tf) if tf else NOT_RUN_STAGE, combine(ch) if ch else NOT_RUN_STAGE))
    results.append(store_stage(ctx, nb, chain, sources))
    return results, nb.notes()


def store_stage(ctx: Context, nb: Notebook, chain, sources: dict) -> StageResult:
    """D in global memory: chained against the reference over every tile, and teacher-forced per
    tapped tile against the kernel's last epilogue tap placed at its coordinates."""
    geo, tapped, ops = ctx.geo, ctx.taps, ctx.ops
    if ops.output is None:
        return StageResult.not_run("epilogue_store")
    out = ops.output
    y_ref, b_ref = chain["cast"]
    exact = bool((b_ref == 0).all())
    want = y_ref.to(out.dtype) if exact else y_ref
    ch = nb.judge(out, want, feed=Feed.REFERENCE, valid=None,
                  bound=None if exact else b_ref, unwritten=unwritten(ops.poison, out, y_ref),
                  tile_shape=(geo.bm, geo.bn), max_detail_tiles=knobs.MAX_DETAIL_TILES.get())
    tiles = sorted({t.tile for t in tapped.records if t.stage.startswith("epilogue")} | set(sources))
    tf = []
    for tile in tiles:
        fed = _teacher_forced(ctx, tile, len(steps_of(geo.spec)), sources)
        if fed is None:
            continue
        y, b, upstream, stand_ins, note, assumed = fed
        r0, c0 = tile[0] * geo.bm, tile[1] * geo.bn
        got = out[r0:r0 + geo.bm, c0:c0 + geo.bn]
        h, w = got.shape
        y, b, upstream = y[:h, :w], b[:h, :w], upstream[:h, :w]
        is_exact = bool((b == 0).all()) and y.dtype == got.dtype
        c = nb.judge(got, y if is_exact else y.float(), feed=Feed.STAND_IN if stand_ins else Feed.KERNEL,
                     valid=None, upstream=upstream,
                     bound=None if is_exact else b, stand_ins=stand_ins, unwritten=unwritten(ops.poison, got, y),
                     origin=(r0, c0), tile_index=tile, assumed=assumed)
        tf.append(c.fed(note))
    return StageResult("epilogue_store", combine(tf) if tf else NOT_RUN_STAGE, ch)

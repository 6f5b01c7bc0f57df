"""The Triton references against their float64 host specs, on a few tiles of every run: if they
disagree, the oracle reports itself as untrustworthy instead of blaming the kernel."""

from __future__ import annotations

from typing import Sequence

import torch

from kernels_ref import epilogue as ref_epilogue
from kernels_ref import load as ref_load
from kernels_ref import mma as ref_mma
from kernels_ref import reduce as ref_reduce
from oracle.judging import tolerance
from oracle.judging.compare import Status, compare
from oracle.judging.differential.context import Context
from oracle.judging.differential.epilogue import Vectors, run_epilogue
from oracle.judging.differential.mma import abs_operand


def cross_check(ctx: Context, tiles: Sequence[tuple[int, int]]) -> list[str]:
    """The Triton references against the float64 host specs on a few tiles."""
    spec = ctx.spec
    problems = []
    a_cpu, b_cpu = ctx.a.cpu(), ctx.b.cpu()
    last_kb = spec.k_blocks - 1
    for tile in tiles:
        a_h, b_h, sa_h, sb_h, local = _host_operands(ctx, tile, a_cpu, b_cpu)
        for op in ("a", "b"):
            idx = local[0] if op == "a" else local[1]
            bmn = ctx.bm if op == "a" else ctx.bn
            x = a_h if op == "a" else b_h
            for kb in sorted({0, last_kb}):
                got = ctx.ref_tile(op, tile, kb).cpu()
                want = ref_load.load_tile_host(x, op, idx, kb, bmn, ctx.bk, spec.oob_fill)
                c = compare(got, want.to(got.dtype))
                if c.status is Status.MISMATCH:
                    problems.append(f"load_{op} tile {tile} k-block {kb}: Triton != host spec")
        kw = dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ctx.block_a,
                  scale_b=ctx.block_b, block_scale_group=ctx.group)
        traj = ref_mma.mma_trajectory(ctx.a, ctx.b, [tile], ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill, **kw)
        host_kw = dict(kw, scale_a=sa_h, scale_b=sb_h)
        host = ref_mma.mma_trajectory_host(a_h, b_h, [local], ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill,
                                           **host_kw)
        s = ref_mma.mma_trajectory_host(abs_operand(a_h), abs_operand(b_h), [local], ctx.bm, ctx.bn, ctx.bk,
                                        **dict(host_kw, acc="fp32", promotion_interval=None,
                                               scale_a=sa_h.abs() if sa_h is not None else None,
                                               scale_b=sb_h.abs() if sb_h is not None else None))
        bound = tolerance.mma_bound(spec, torch.zeros_like(s[0, last_kb]), s[0, last_kb], spec.k)
        c = compare(traj[0, last_kb].cpu().double(), host[0, last_kb].double(), bound=bound.double(),
                    mask=accumulator_in_range(s[0, last_kb], spec.acc_dtype))
        if c.status is Status.MISMATCH:
            w = c.worst
            problems.append(f"mma tile {tile}: Triton trajectory != host spec (error/bound {w.max_ratio:.3g})")
        vec = Vectors(ctx, tile)
        x = traj[0, last_kb].float()
        host_x = x.cpu().double()
        for step, y, b in run_epilogue(ctx, x, torch.zeros(x.shape, dtype=torch.float64, device=ctx.dev), 0,
                                        vec):
            want = _host_epilogue_step(ctx, step, host_x, vec)
            node = next(n for n in spec.epilogue_nodes if n.step == step)
            if node.rounds:
                want = ref_epilogue.apply_round_host(want, node.round)
            got = y.cpu()
            if step == "cast":
                c = compare(got, want.to(got.dtype))
            else:
                c = compare(got.double(), want, bound=b.cpu() + 1e-30)
            if c.status is Status.MISMATCH:
                problems.append(f"epilogue_{step} tile {tile}: Triton != host spec")
            host_x = y.cpu().double()
        if spec.partitioned:
            problems.extend(_partials_cross_check(ctx, tile, a_h, b_h, local))
    return problems


def _partials_cross_check(ctx: Context, tile, a_h, b_h, local) -> list[str]:
    """The partial references (each partial from zero) and the reduction against their host specs."""
    spec = ctx.spec
    out, finals = [], []
    for p in ctx.partials(tile):
        got = ref_mma.partial_trajectory(ctx.a, ctx.b, [tile], ctx.bm, ctx.bn, ctx.bk, p.kb_begin, p.kb_end,
                                         oob_fill=spec.oob_fill, acc=spec.acc_dtype)
        want = ref_mma.partial_trajectory_host(a_h, b_h, [local], ctx.bm, ctx.bn, ctx.bk, p.kb_begin, p.kb_end,
                                               oob_fill=spec.oob_fill, acc=spec.acc_dtype)
        s = ref_mma.partial_trajectory_host(abs_operand(a_h), abs_operand(b_h), [local], ctx.bm, ctx.bn, ctx.bk,
                                            p.kb_begin, p.kb_end, acc="fp32")
        n_k = min(p.kb_end * ctx.bk, spec.k) - p.kb_begin * ctx.bk
        bound = tolerance.mma_bound(spec, torch.zeros_like(s[0, -1]), s[0, -1], n_k)
        c = compare(got[0, -1].cpu().double(), want[0, -1].double(), bound=bound.double(),
                    mask=accumulator_in_range(s[0, -1], spec.acc_dtype))
        if c.status is Status.MISMATCH:
            out.append(f"mma tile {tile} {p.describe()}: Triton partial != host spec")
        finals.append(got[0, -1].float())
    stack = torch.stack(finals)
    got, want = ref_reduce.reduce_partials(stack).cpu().double(), ref_reduce.reduce_partials_host(stack)
    if not same_values(got, want):
        out.append(f"reduce tile {tile}: Triton != host spec")
    return out


# The largest magnitude an accumulator of each type holds; half of it is the margin below which no
# order of the additions can overflow (every partial sum is at most sum |a||b|, rounded).
_ACC_MAX = {"fp32": torch.finfo(torch.float32).max, "fp16": torch.finfo(torch.float16).max}


def accumulator_in_range(abs_sum: torch.Tensor, acc: str) -> torch.Tensor:
    """The elements a cross-check can judge: where sum |a||b| keeps every partial sum of the
    accumulator finite. Past it (A filled with bf16's largest value, say) the accumulator
    overflows or not depending on the order of its additions, so the reference and its float64
    spec may rightly differ (inf, NaN or a finite value): those elements are left out."""
    most = _ACC_MAX.get(acc)
    a = abs_sum.cpu().double()
    if most is None:  # int32: exact, no overflow is modelled
        return torch.ones(a.shape, dtype=torch.bool)
    return torch.isnan(a) | (a <= most / 2)  # NaN: a NaN operand, which both sides propagate


def same_values(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-for-bit agreement of two exact results, non-finite values included: NaN agrees with NaN
    (a NaN operand propagates to both), an infinity with the same infinity."""
    return x.shape == y.shape and bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())


def _host_operands(ctx: Context, tile, a_cpu, b_cpu):
    """The rows of A and columns of B (and block scales) that one tile reads, for the float64 host
    specs, with the tile's index in them: the specs then never widen whole operands to float64."""
    tm, tn = tile
    sa = ctx.block_a.cpu() if ctx.block_a is not None else None
    sb = ctx.block_b.cpu() if ctx.block_b is not None else None
    if sa is not None and (ctx.bm % ctx.group[0] or ctx.bn % ctx.group[1]):
        return a_cpu, b_cpu, sa, sb, tile  # block scales that straddle tiles: keep everything
    a = a_cpu[tm * ctx.bm:(tm + 1) * ctx.bm]
    b = b_cpu[:, tn * ctx.bn:(tn + 1) * ctx.bn]
    if sa is not None:
        sa = sa[tm * ctx.bm // ctx.group[0]:(tm + 1) * ctx.bm // ctx.group[0]]
        sb = sb[tn * ctx.bn // ctx.group[1]:(tn + 1) * ctx.bn // ctx.group[1]]
    return a, b, sa, sb, (0, 0)


def _host_epilogue_step(ctx, step, x, vec: Vectors) -> torch.Tensor:
    spec = ctx.spec
    cpu = (lambda v: v.cpu() if v is not None else None)
    if step == "scale":
        if vec.row_scale is None and vec.col_scale is None and vec.tensor_scale is None:
            return x
        return ref_epilogue.apply_scale_host(x, row_scale=cpu(vec.row_scale), col_scale=cpu(vec.col_scale),
                                             tensor_scale=cpu(vec.tensor_scale))
    if step == "alpha_beta":
        return ref_epilogue.apply_alpha_beta_host(x, spec.alpha, spec.beta, cpu(vec.c))
    if step == "alpha":
        return ref_epilogue.apply_alpha_host(x, spec.alpha)
    if step == "beta_c":
        return ref_epilogue.apply_beta_c_host(x, spec.beta, cpu(vec.c))
    if step == "bias":
        return x if vec.bias is None else ref_epilogue.apply_bias_host(x, cpu(vec.bias), spec.bias)
    if step == "activation":
        return ref_epilogue.apply_activation_host(x, spec.activation)
    return ref_epilogue.apply_cast_host(x, spec.out_dtype, spec.saturate)

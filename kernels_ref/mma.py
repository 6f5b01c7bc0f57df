"""MMA stage: the accumulator, k-block after k-block.

Data path: operand tiles A [BM, BK] and B [BK, BN] (loaded with the descriptor's out-of-bounds
fill) -> per-k-block product -> accumulator [BM, BN] in the declared precision, optionally with
S = sum_k |a_mk| |b_kn| (times |scales|) in fp32 beside it for the comparator's error bound.

Accumulator semantics (the host specs emulate exactly these roundings in float64):
  acc "fp32"   per k-block: p = fp32(A_kb @ B_kb); acc = fp32(acc + p). Operands fp32, fp16,
               bf16, e4m3, e5m2 (the two fp8 kinds may be mixed). The order of the fp32 sum inside
               one k-block is the dot's; the host rounds the exact block sum once.
  acc "fp16"   the accumulator is held in fp16 and rounds to nearest even after every MMA
               instruction step of mma_k k-elements (16 for fp16, 32 for fp8 operands):
               s = fp32(sum of the mma_k products); acc = fp16(fp32(acc + s)).
               Operands fp16, e4m3, e5m2; block_k must be a multiple of mma_k.
  acc "int32"  int8 x int8, exact integer accumulation (wrapping on int32 overflow).
  fp8 with promotion_interval P (acc "fp32" only; P a multiple of 32 that divides block_k):
               Hopper's limited-precision tensor-core accumulation. Inside each chunk of P
               k-elements a partial q starts at 0 and after each mma_k = 32 step becomes
               q = trunc13(fp32(q + s)), trunc13 rounding toward zero to 13 explicit mantissa bits
               (a mask on the fp32 bit pattern; inf/NaN untouched); at the end of the chunk
               acc = fp32(acc + q).
  block scales (acc "fp32"): scale_a [ceil(M/gm), ceil(K/gk)], scale_b [ceil(N/gn), ceil(K/gk)],
               block_scale_group (gm, gn, gk), gk a multiple of block_k or a divisor of it. A scale
               group g of the k-block (one group where gk >= block_k, else block_k / gk of them, in
               k order) has s_g = fp32(sa[m//gm, g] * sb[n//gn, g]); each group's product is
               promoted on its own, as DeepGEMM-style and MX kernels do:
               p_g = fp32(A_g @ B_g), acc = fp32(acc + fp32(p_g * s_g)); with promotion (P a
               divisor of gk where the groups are narrower than the k-block), each chunk's q is
               scaled by its group's s instead of p. One group per k-block is the same rule.
               Under a ragged K the last k-block's groups that start at or past K are not in the
               scale tensors: their scale is 0 (their products are the out-of-bounds fill's).
               (`mma_step` takes the already gathered per-row / per-column scales: [..., BM] or
               [..., BM, G] for G groups.)
  partials:    a partial of k-blocks b0..b1-1 (split-K, stream-K) starts from zero and applies the
               scales of its own k-blocks (the scale tensors' columns are cut with the operands).
  with_abs_sum: S accumulates fp32(|A_kb| @ |B_kb|) (times |s|, per scale group) per dot, in fp32.
  with_stats (mma_accumulate): the statistics the accumulation bounds read, per element
               (oracle.judging.tolerance), from the kernel's own accumulator: `kernels_ref.mma_stats`.

Constraints: tile extents need not be powers of two (blocks are padded with zeros inside the
kernel). On the GPU fp32 dots use the ieee path, fp16/fp8 operands are fed to the tensor cores as
fp16 (exact) so accumulation is proper fp32, and fp-contraction is off; each k-block's dot starts
from zero and is added to the accumulator by an fp32 add that rounds to nearest (an inline
`add.rn.f32`, which the compiler cannot fold into the tensor core's truncating accumulator), so
the reference's own error grows with each block's sum |a||b|, not with the running sum. Under
the interpreter every float dot runs on fp32 values. Host specs
return CPU float64 tensors holding values exactly representable in the accumulator type.

One job: the MMA stage's entry, in the shape every stage module has: its Triton references behind
the public launchers (mma_step, mma_trajectory, mma_accumulate, partial_trajectory), their float64
host specifications (the *_host functions) side by side, and check_supported. Its parts live
beside it: the jit mainloop (`_mainloop`, which kernels_ref.gemm reuses, so the full GEMM
accumulates exactly as this stage does), the configuration and kernel arguments
(`mma_params`: check_supported, MmaConfig, MainloopParams), the bound statistics (`mma_stats`:
MmaStats, trajectory_stats, the with_stats kernel) and the cross-check's sampled host spec
(`mma_sample`).
"""

from __future__ import annotations

from typing import Optional, Sequence

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._mainloop import _acc_load, _acc_store_bits, _mainloop, _mma_kblock, _tile_mask, _zero_acc
from kernels_ref.mma_params import (ACC_TORCH, ACCS, MainloopParams, MmaConfig, check_supported, mma_k_of,
                                    scale_groups)
from kernels_ref.mma_stats import MmaStats, accumulate_stats, check_stats_chunk, trajectory_stats

PROMOTION_MANTISSA_BITS = 13


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _mma_step_kernel(prev, a, b, sa, sb, out, absum, MC, HAS_PREV: tl.constexpr, WITH_ABS: tl.constexpr):
    """Tile t of a stack: prev, a, b, out [T, R, C] and the scales sa [T, BM, SG], sb [T, BN, SG] as
    (ptr, stride_t, stride_r[, stride_c]); absum (ptr, stride_t), contiguous tiles. MC: MmaConsts."""
    prev_ptr, sp_t, sp_r, sp_c = prev
    a_ptr, sa_t, sa_m, sa_k = a
    b_ptr, sb_t, sb_k, sb_n = b
    sca_ptr, sca_t, sca_m, sca_g = sa
    scb_ptr, scb_t, scb_n, scb_g = sb
    out_ptr, so_t, so_r, so_c = out
    abs_ptr, sabs_t = absum
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, MC.BMP)[:, None]
    j = tl.arange(0, MC.BNP)[None, :]
    in_tile = (i < MC.BM) & (j < MC.BN)
    if HAS_PREV:
        acc = _acc_load(prev_ptr + t * sp_t + i * sp_r + j * sp_c, in_tile, MC.ACC)
    else:
        acc = _zero_acc(MC)
    ri = tl.arange(0, MC.BMP)
    cj = tl.arange(0, MC.BNP)
    sc = (sca_ptr + t * sca_t + ri * sca_m, ri < MC.BM, sca_g, scb_ptr + t * scb_t + cj * scb_n, cj < MC.BN, scb_g)
    s_acc = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    acc, s_acc = _mma_kblock(acc, s_acc, sc, (a_ptr + t * sa_t, sa_m, sa_k), (b_ptr + t * sb_t, sb_k, sb_n),
                             0, 0, 0, MC.BM, MC.BN, MC.BK, MC, WITH_ABS)
    tl.store(out_ptr + t * so_t + i * so_r + j * so_c, _acc_store_bits(acc, MC.ACC), mask=in_tile)
    if WITH_ABS:
        tl.store(abs_ptr + t * sabs_t + i * MC.BN + j, s_acc, mask=in_tile)


@triton.jit
def _mma_tiles_kernel(ml, tiles_ptr, tr, ts, MC, WITH_ABS: tl.constexpr):
    """The trajectory of tile (tm, tn) = tiles[t]: tr, ts [T, n_kb, BM, BN] as (ptr, *strides)."""
    tr_ptr, tr_t, tr_kb, tr_r, tr_c = tr
    ts_ptr, ts_t, ts_kb, ts_r, ts_c = ts
    t = tl.program_id(0)
    m0 = tl.load(tiles_ptr + 2 * t) * MC.BM
    n0 = tl.load(tiles_ptr + 2 * t + 1) * MC.BN
    t64 = t.to(tl.int64)
    _mainloop(ml, m0, n0, (tr_ptr + t64 * tr_t, tr_kb, tr_r, tr_c), (ts_ptr + t64 * ts_t, ts_kb, ts_r, ts_c), MC,
              WITH_ABS, True)


@triton.jit
def _mma_accumulate_kernel(ml, out, abs_ptr, MC, WITH_ABS: tl.constexpr):
    """The accumulator of tile (program_id 0, 1) into out (ptr, stride_r, stride_c), and S into
    abs_ptr [M, N] when WITH_ABS."""
    out_ptr, so_r, so_c = out
    m0 = tl.program_id(0) * MC.BM
    n0 = tl.program_id(1) * MC.BN
    acc, s_acc = _mainloop(ml, m0, n0, (out_ptr, 0, 0, 0), (abs_ptr, 0, 0, 0), MC, WITH_ABS, False)
    rm, rn, mask = _tile_mask(ml, m0, n0, MC)
    tl.store(out_ptr + rm * so_r + rn * so_c, _acc_store_bits(acc, MC.ACC), mask=mask)
    if WITH_ABS:
        tl.store(abs_ptr + rm * ml.N + rn, s_acc, mask=mask)


# ----------------------------------------------------------------------------------------------
# public launchers
# ----------------------------------------------------------------------------------------------


def mma_step(acc_prev: Optional[torch.Tensor], a_tile: torch.Tensor, b_tile: torch.Tensor, acc: str = "fp32",
             promotion_interval: Optional[int] = None, scale_a: Optional[torch.Tensor] = None,
             scale_b: Optional[torch.Tensor] = None, with_abs_sum: bool = False):
    """One k-block update acc_prev + a_tile @ b_tile in the accumulator precision (teacher forcing).

    a_tile [..., BM, BK], b_tile [..., BK, BN], acc_prev [..., BM, BN] in the accumulator dtype
    (fp32, fp16 or int32 tensor) or None for a zero accumulator. scale_a [..., BM] and scale_b
    [..., BN] are this k-block's block scales per tile row / column; [..., BM, G] and [..., BN, G]
    hold G scale groups of BK / G k-elements each, every group promoted with its own scale (module
    docstring). Returns the new accumulator (and S of this k-block, fp32, when with_abs_sum)."""
    C.require_tensor("a_tile", a_tile)
    C.require_tensor("b_tile", b_tile)
    if a_tile.dim() < 2 or b_tile.dim() != a_tile.dim():
        raise ValueError(f"a_tile {tuple(a_tile.shape)} and b_tile {tuple(b_tile.shape)} must be [..., BM, BK] and "
                         f"[..., BK, BN] with the same leading dims")
    lead = tuple(a_tile.shape[:-2])
    BM, BK = a_tile.shape[-2:]
    BN = b_tile.shape[-1]
    if tuple(b_tile.shape[:-2]) != lead or b_tile.shape[-2] != BK:
        raise ValueError(f"b_tile has shape {tuple(b_tile.shape)}; with a_tile {tuple(a_tile.shape)} it must be "
                         f"{lead + (BK, 'BN')}")
    ad, bd = C.dtype_name("a_tile", a_tile), C.dtype_name("b_tile", b_tile)
    C.require_choice("acc", acc, ACCS)
    scaled = scale_a is not None or scale_b is not None
    if scaled and (scale_a is None or scale_b is None):
        raise ValueError("scale_a and scale_b must be given together or both be None")
    groups = _step_groups(scale_a, scale_b, lead, BM, BN, BK) if scaled else 1
    cfg = MmaConfig(ad, bd, acc, BM, BN, BK, promotion_interval, (1, 1, BK // groups) if groups > 1 else None, scaled)
    if acc_prev is not None:
        C.require_tensor("acc_prev", acc_prev)
        if tuple(acc_prev.shape) != lead + (BM, BN):
            raise ValueError(f"acc_prev has shape {tuple(acc_prev.shape)}; expected {lead + (BM, BN)}")
        if acc_prev.dtype != ACC_TORCH[acc]:
            raise ValueError(f"acc_prev has dtype {acc_prev.dtype}; acc={acc!r} needs {ACC_TORCH[acc]}")
    dev = C.check_device(("a_tile", a_tile), ("b_tile", b_tile), ("acc_prev", acc_prev), ("scale_a", scale_a),
                         ("scale_b", scale_b))
    T = 1
    for d in lead:
        T *= d
    out = torch.empty((T, BM, BN), dtype=ACC_TORCH[acc], device=dev)
    absum = torch.empty((T, BM, BN), dtype=torch.float32, device=dev) if with_abs_sum else out
    prev = C.strided(acc_prev.reshape(T, BM, BN) if acc_prev is not None else out)

    def per_tile(v, n):  # a stack [T, n, G] of per-row or per-column scales: (bits, stride_t, stride, stride_g)
        vb = C.bits_view(v.reshape(T, n, groups))
        return vb, vb.stride(0), vb.stride(1), vb.stride(2)

    sa = per_tile(scale_a, BM) if scaled else (out, 0, 0, 0)
    sb = per_tile(scale_b, BN) if scaled else (out, 0, 0, 0)
    _mma_step_kernel[(T,)](prev, C.strided(a_tile.reshape(T, BM, BK)), C.strided(b_tile.reshape(T, BK, BN)), sa, sb,
                           C.strided(out), (absum, absum.stride(0)), MC=cfg.consts(scale_a, scale_b),
                           HAS_PREV=acc_prev is not None, WITH_ABS=with_abs_sum, **cfg.launch_options(dev))
    out = out.reshape(lead + (BM, BN))
    if with_abs_sum:
        return out, absum.reshape(lead + (BM, BN))
    return out


def _step_groups(scale_a: torch.Tensor, scale_b: torch.Tensor, lead: tuple, BM: int, BN: int, BK: int) -> int:
    """The scale groups of one k-block that mma_step's scales hold (1: [..., BM] and [..., BN])."""
    for nm, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        C.require_tensor(nm, s)
        C.dtype_name(nm, s, C.FLOAT_NAMES[:3])
    tail = tuple(scale_a.shape[len(lead) + 1:len(lead) + 2])
    for nm, s, n in (("scale_a", scale_a, BM), ("scale_b", scale_b, BN)):
        if tuple(s.shape) != lead + (n,) + tail:
            raise ValueError(f"{nm} has shape {tuple(s.shape)}; expected {lead + (n,)} (one scale group per k-block) "
                             f"or {lead + (n, 'G')} (G scale groups, each BK / G deep)")
    groups = tail[0] if tail else 1
    if groups < 1 or BK % groups:
        raise ValueError(f"scale_a holds {groups} scale groups per k-block: a positive divisor of BK={BK} is allowed")
    return groups


def mma_trajectory(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                   acc: str = "fp32", promotion_interval: Optional[int] = None,
                   scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                   block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero",
                   with_abs_sum: bool = False):
    """Accumulator after every k-block for the chosen output tiles: [T, n_kblocks, BM, BN].

    `tiles` is a list of (tm, tn). Rows/columns of a ragged tile past M/N hold what the
    accumulator holds there (products of the out-of-bounds fill). With with_abs_sum also
    returns S after every k-block (fp32, same shape)."""
    p = MainloopParams(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                       block_scale_group, oob_fill)
    dev = C.check_device(("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b))
    M, N = a.shape[0], b.shape[1]
    tiles_t = C.as_index_tensor("tiles", tiles, torch.device("cpu"))
    n_tm, n_tn = C.cdiv(M, block_m), C.cdiv(N, block_n)
    lo, hi = C.pair_bounds(tiles_t)
    if lo[0] < 0 or hi[0] >= n_tm or lo[1] < 0 or hi[1] >= n_tn:
        raise ValueError(f"tiles {tiles_t.tolist() if tiles_t.shape[0] <= 8 else '(list)'} out of range; allowed: "
                         f"tm in 0..{n_tm - 1}, tn in 0..{n_tn - 1}")
    T = tiles_t.shape[0]
    out = torch.empty((T, p.n_kb, block_m, block_n), dtype=ACC_TORCH[acc], device=dev)
    ts = torch.empty((T, p.n_kb, block_m, block_n), dtype=torch.float32, device=dev) if with_abs_sum else out
    _mma_tiles_kernel[(T,)](tiles_ptr=C.to_device(tiles_t, dev), tr=C.strided(out), ts=(ts, *ts.stride()),
                            WITH_ABS=with_abs_sum, **p.kernel_args(), **p.launch_options(dev))
    return (out, ts) if with_abs_sum else out

def mma_accumulate(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int, acc: str = "fp32",
                   promotion_interval: Optional[int] = None, scale_a: Optional[torch.Tensor] = None,
                   scale_b: Optional[torch.Tensor] = None, block_scale_group: Optional[Sequence[int]] = None,
                   with_abs_sum: bool = False, oob_fill: str = "zero", with_stats: bool = False,
                   stats_chunk: Optional[int] = None):
    """The whole accumulator [M, N] (fp32 / fp16 / int32 tensor per acc); with with_abs_sum also
    S[M, N] = sum_k |a_mk| |b_kn| (times |scales|) in fp32, from the same kernel. with_stats returns
    (acc, S, MmaStats) (module docstring; float accumulators only; stats_chunk: split-K partials)."""
    p = MainloopParams(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                       block_scale_group, oob_fill)
    dev = C.check_device(("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b))
    if with_stats:
        return accumulate_stats(p, stats_chunk, dev)
    M, N = a.shape[0], b.shape[1]
    out = torch.empty((M, N), dtype=ACC_TORCH[acc], device=dev)
    s = torch.empty((M, N), dtype=torch.float32, device=dev) if with_abs_sum else out
    if M and N:
        _mma_accumulate_kernel[(C.cdiv(M, block_m), C.cdiv(N, block_n))](
            out=C.strided(out), abs_ptr=s, WITH_ABS=with_abs_sum, **p.kernel_args(), **p.launch_options(dev))
    return (out, s) if with_abs_sum else out


# ----------------------------------------------------------------------------------------------
# host specifications (CPU float64, emulating the accumulator's roundings)
# ----------------------------------------------------------------------------------------------


def _f16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).to(torch.float16).to(torch.float64)


def truncate_mantissa_host(t: torch.Tensor, keep_bits: int = PROMOTION_MANTISSA_BITS) -> torch.Tensor:
    """fp32(t) rounded toward zero to `keep_bits` explicit mantissa bits; inf/NaN unchanged."""
    bits = t.to(torch.float32).view(torch.int32)
    special = (bits & 0x7F800000) == 0x7F800000
    mask = -(1 << (23 - keep_bits))
    return torch.where(special, bits, bits & mask).view(torch.float32).to(torch.float64)


def _wrap_i32(t: torch.Tensor) -> torch.Tensor:
    return torch.remainder(t + 2.0 ** 31, 2.0 ** 32) - 2.0 ** 31


def _kblock_host(acc, s_acc, a, b, acc_kind, mma_k, promotion_interval, scale, with_abs):
    """One k-block on float64 operands a [..., R, BK], b [..., BK, Cn] (module docstring); scale None
    or a tuple of the k-block's G scale groups' fp32(sa * sb) tiles, group g over k g*BK/G .. ."""
    bk = a.shape[-1]
    width = bk // len(scale) if scale is not None else bk  # k of one scale group
    if with_abs:
        if scale is None:
            s_acc = s_acc + torch.abs(a) @ torch.abs(b)
        elif len(scale) == 1:
            s_acc = s_acc + (torch.abs(a) @ torch.abs(b)) * torch.abs(scale[0])
        else:
            for g, sg in enumerate(scale):
                k = slice(g * width, (g + 1) * width)
                s_acc = s_acc + (torch.abs(a[..., k]) @ torch.abs(b[..., k, :])) * torch.abs(sg)
    if acc_kind == "int32":
        return _wrap_i32(acc + a @ b), s_acc
    if acc_kind == "fp16":
        for k0 in range(0, bk, mma_k):
            s = C.f32(a[..., k0:k0 + mma_k] @ b[..., k0:k0 + mma_k, :])
            acc = _f16(C.f32(acc + s))
        return acc, s_acc
    if promotion_interval is None:
        if width == bk:
            parts = [(C.f32(a @ b), 0)]
        else:  # one dot per scale group
            parts = [(C.f32(a[..., g0:g0 + width] @ b[..., g0:g0 + width, :]), g0 // width) for g0 in range(0, bk, width)]
    else:
        parts = []
        for c0 in range(0, bk, promotion_interval):
            q = torch.zeros_like(acc)
            for k0 in range(c0, c0 + promotion_interval, mma_k):
                s = C.f32(a[..., k0:k0 + mma_k] @ b[..., k0:k0 + mma_k, :])
                q = truncate_mantissa_host(C.f32(q + s))
            parts.append((q, c0 // width))
    for p, g in parts:
        acc = C.f32(acc + (C.f32(p * scale[g]) if scale is not None else p))
    return acc, s_acc


def _padded_host(x: torch.Tensor, rows: int, cols: int, oob_fill: str) -> torch.Tensor:
    """x (CPU float64 values) padded with the fill to [rows, cols]."""
    v = x.detach().cpu().to(torch.float64)
    out = torch.full((rows, cols), float("nan") if oob_fill == "nan" else 0.0, dtype=torch.float64)
    out[:v.shape[0], :v.shape[1]] = v
    return out


def mma_step_host(acc_prev: Optional[torch.Tensor], a_tile: torch.Tensor, b_tile: torch.Tensor, acc: str = "fp32",
                  promotion_interval: Optional[int] = None, scale_a: Optional[torch.Tensor] = None,
                  scale_b: Optional[torch.Tensor] = None, with_abs_sum: bool = False):
    """Host spec of `mma_step` (float64 CPU result)."""
    ad, bd = C.dtype_name("a_tile", a_tile), C.dtype_name("b_tile", b_tile)
    BM, BK = a_tile.shape[-2:]
    BN = b_tile.shape[-1]
    scaled = scale_a is not None
    lead = tuple(a_tile.shape[:-2])
    groups = _step_groups(scale_a, scale_b, lead, BM, BN, BK) if scaled else 1
    reasons = check_supported(ad, bd, acc, BM, BN, BK, promotion_interval, (1, 1, BK // groups) if scaled else None,
                              scaled)
    if reasons:
        raise C.reasons_error(reasons)
    a = a_tile.detach().cpu().to(torch.float64)
    b = b_tile.detach().cpu().to(torch.float64)
    prev = torch.zeros(lead + (BM, BN), dtype=torch.float64) if acc_prev is None else \
        acc_prev.detach().cpu().to(torch.float64)
    scale = None
    if scaled:
        sa = scale_a.detach().cpu().double().reshape(lead + (BM, groups))
        sb = scale_b.detach().cpu().double().reshape(lead + (BN, groups))
        scale = tuple(C.f32(sa[..., :, g, None] * sb[..., None, :, g]) for g in range(groups))
    out, s = _kblock_host(prev, torch.zeros_like(prev), a, b, acc, mma_k_of(ad, bd), promotion_interval, scale,
                          with_abs_sum)
    return (out, s) if with_abs_sum else out


def _scale_tile_host(scale_a, scale_b, group, kb, block_k, rows: torch.Tensor, cols: torch.Tensor, M: int, N: int):
    """fp32(sa * sb) of each scale group of the k-block, a tuple; rows past M and columns past N get
    scale 0 (as the kernel), and so does a group wholly past a ragged K (not in the scale tensors)."""
    gm, gn, gk = group
    kc = kb * block_k // gk
    sa = scale_a.detach().cpu().double()
    sb = scale_b.detach().cpu().double()
    out = []
    for g in range(scale_groups(group, block_k)):
        live = kc + g < sa.shape[1]
        col = min(kc + g, sa.shape[1] - 1)
        ra = torch.where((rows < M) & live, sa[torch.clamp(rows // gm, max=sa.shape[0] - 1), col], 0.0)
        cb = torch.where((cols < N) & live, sb[torch.clamp(cols // gn, max=sb.shape[0] - 1), col], 0.0)
        out.append(C.f32(ra[..., :, None] * cb[..., None, :]))
    return tuple(out)


def _trajectory_host(a, b, row_idx, col_idx, block_k, acc, promotion_interval, scale_a, scale_b, group, oob_fill,
                     with_abs, keep=True):
    """Shared host loop: row_idx [T, R], col_idx [T, Cn] index the padded operands; returns
    [T, n_kb, R, Cn] accumulators and S (keep=False: only the last k-block, [T, 1, R, Cn])."""
    ad, bd = C.name_of(a.dtype), C.name_of(b.dtype)
    M, K = a.shape
    N = b.shape[1]
    n_kb = C.cdiv(K, block_k)
    kp = n_kb * block_k
    rows_p = int(row_idx.max()) + 1
    cols_p = int(col_idx.max()) + 1
    ap = _padded_host(a, max(rows_p, M), kp, oob_fill)
    bp = _padded_host(b, kp, max(cols_p, N), oob_fill)
    A = ap[row_idx]  # [T, R, Kp]
    B = bp[:, col_idx].permute(1, 0, 2)  # [T, Kp, Cn]
    T, R = row_idx.shape
    Cn = col_idx.shape[1]
    accv = torch.zeros((T, R, Cn), dtype=torch.float64)
    s_acc = torch.zeros_like(accv)
    traj, straj = [], []
    mk = mma_k_of(ad, bd)
    for kb in range(n_kb):
        ks = slice(kb * block_k, (kb + 1) * block_k)
        scale = _scale_tile_host(scale_a, scale_b, group, kb, block_k, row_idx, col_idx, M, N) \
            if scale_a is not None else None
        accv, s_acc = _kblock_host(accv, s_acc, A[:, :, ks], B[:, ks, :], acc, mk, promotion_interval, scale, with_abs)
        if keep:
            traj.append(accv)
            straj.append(s_acc)
    if not keep:
        return accv[:, None], s_acc[:, None]
    if not traj:
        return accv[:, :0], s_acc[:, :0]
    return torch.stack(traj, 1), torch.stack(straj, 1)


def mma_trajectory_host(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                        acc: str = "fp32", promotion_interval: Optional[int] = None,
                        scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                        block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero",
                        with_abs_sum: bool = False):
    """Host spec of `mma_trajectory` (float64 CPU, [T, n_kblocks, BM, BN])."""
    MainloopParams(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b, block_scale_group,
                   oob_fill)
    tl_ = [(int(tm), int(tn)) for tm, tn in tiles]
    row_idx = torch.stack([torch.arange(tm * block_m, (tm + 1) * block_m) for tm, _ in tl_])
    col_idx = torch.stack([torch.arange(tn * block_n, (tn + 1) * block_n) for _, tn in tl_])
    traj, straj = _trajectory_host(a, b, row_idx, col_idx, block_k, acc, promotion_interval, scale_a, scale_b,
                                   block_scale_group, oob_fill, with_abs_sum)
    return (traj, straj) if with_abs_sum else traj


def mma_accumulate_host(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int,
                        acc: str = "fp32", promotion_interval: Optional[int] = None,
                        scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                        block_scale_group: Optional[Sequence[int]] = None, with_abs_sum: bool = False,
                        oob_fill: str = "zero", with_stats: bool = False, stats_chunk: Optional[int] = None):
    """Host spec of `mma_accumulate` (float64 CPU [M, N]; rows and columns are independent, so the
    whole matrix is one 'tile'). with_stats: (acc, S, MmaStats), the statistics being
    `trajectory_stats` of the host trajectory and q = (a*a) @ (b*b) for fp32 operands."""
    cfg = MainloopParams(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                         block_scale_group, oob_fill).config
    M, N = a.shape[0], b.shape[1]
    row_idx = torch.arange(M)[None, :]
    col_idx = torch.arange(N)[None, :]
    if with_stats:
        if acc == "int32":
            raise ValueError("with_stats describes float accumulation; acc='int32' is exact and needs no statistics")
        check_stats_chunk(stats_chunk, block_k)
        traj, straj = _trajectory_host(a, b, row_idx, col_idx, block_k, acc, promotion_interval, scale_a, scale_b,
                                       block_scale_group, oob_fill, True)
        if traj.shape[1] == 0:
            z = torch.zeros((M, N), dtype=torch.float64)
            return z, z.clone(), MmaStats(z, z.clone(), z.clone(), z.clone(), z.clone())
        q = torch.zeros((M, N), dtype=torch.float64)  # as the kernel: 0 unless both operands are fp32
        if cfg.a_dtype == "fp32" and cfg.b_dtype == "fp32":
            a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
            q = (a64 * a64) @ (b64 * b64)
        st = trajectory_stats(traj, straj, stats_chunk, block_k, q).at(0, -1)
        return traj[0, -1], straj[0, -1], st
    if M == 0 or N == 0:
        z = torch.zeros((M, N), dtype=torch.float64)
        return (z, z.clone()) if with_abs_sum else z
    traj, straj = _trajectory_host(a, b, row_idx, col_idx, block_k, acc, promotion_interval, scale_a, scale_b,
                                   block_scale_group, oob_fill, with_abs_sum, keep=False)
    out, s = traj[0, -1], straj[0, -1]
    return (out, s) if with_abs_sum else out


# ----------------------------------------------------------------------------------------------
# partials (split-K, stream-K)
# ----------------------------------------------------------------------------------------------


def _k_slice(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int, kb_begin: int, kb_end: int,
             kw: dict) -> tuple:
    """The operands' k-slice of k-blocks kb_begin..kb_end-1 and the keywords for it: block scales
    sliced with them, so that every k-block of the slice applies the scales it applies in the
    whole problem (groups at least a k-block wide are taken one column per k-block)."""
    n_kb = C.cdiv(a.shape[1], block_k)
    if not (isinstance(kb_begin, int) and isinstance(kb_end, int) and 0 <= kb_begin < kb_end <= n_kb):
        raise ValueError(f"partial k-blocks {kb_begin}..{kb_end} must satisfy 0 <= begin < end <= {n_kb}")
    k0, k1 = kb_begin * block_k, min(a.shape[1], kb_end * block_k)
    if kw.get("scale_a") is not None or kw.get("scale_b") is not None:
        MainloopParams(a, b, block_m, block_n, block_k, **{f: kw[f] for f in _PARAM_KEYS if f in kw})  # validates
        gm, gn, gk = kw["block_scale_group"]
        if gk < block_k:  # several groups per k-block: the slice starts on a group boundary
            cols, group = torch.arange(k0 // gk, C.cdiv(k1, gk)), (gm, gn, gk)
        else:
            cols, group = torch.arange(kb_begin, kb_end) * block_k // gk, (gm, gn, block_k)
        kw = dict(kw, block_scale_group=group, scale_a=kw["scale_a"][:, cols.to(kw["scale_a"].device)],
                  scale_b=kw["scale_b"][:, cols.to(kw["scale_b"].device)])
    return a[:, k0:k1], b[k0:k1], kw


_PARAM_KEYS = ("acc", "promotion_interval", "scale_a", "scale_b", "block_scale_group", "oob_fill")


def partial_trajectory(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                       kb_begin: int, kb_end: int, **kw):
    """The accumulator of a partial that sums k-blocks kb_begin..kb_end-1 from zero, after each of
    them: [T, kb_end - kb_begin, BM, BN] (mma_trajectory of the operands' k-slice, and of the block
    scales' columns those k-blocks apply; same keywords)."""
    a_s, b_s, kw = _k_slice(a, b, block_m, block_n, block_k, kb_begin, kb_end, kw)
    return mma_trajectory(a_s, b_s, tiles, block_m, block_n, block_k, **kw)


def partial_trajectory_host(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                            kb_begin: int, kb_end: int, **kw):
    """Host spec of `partial_trajectory` (float64 CPU)."""
    a_s, b_s, kw = _k_slice(a, b, block_m, block_n, block_k, kb_begin, kb_end, kw)
    return mma_trajectory_host(a_s, b_s, tiles, block_m, block_n, block_k, **kw)

"""The MMA mainloop in Triton: the jit helpers every accumulating kernel is built from.

Data path: for output tile (m0, n0), each k-block's operand boxes are read with the descriptor's
out-of-bounds fill (`descriptor._box_bits`), multiplied and added into the accumulator in the
declared precision (`_mma_kblock`; the semantics, and why each add is written as it is, are in
`kernels_ref.mma`'s docstring); `_mainloop` runs every k-block and can store the accumulator after
each. The kernels of `kernels_ref.mma`, `kernels_ref.mma_stats` and `kernels_ref.gemm` call these
helpers, so the full GEMM accumulates exactly as the MMA stage does; their arguments are the two
tuples `kernels_ref.mma_params` builds (`ml`: MainloopArgs, `MC`: MmaConsts).

Constraints: jit code only (no launcher, no host spec: the stage's are in `kernels_ref.mma`).
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import triton
import triton.language as tl

from kernels_ref._codec import (_abs_operand, _decode_f32, _dot, _dot_operand, _encode, _round_to, _to_storage,
                                _truncate_mantissa, _unsigned)
from kernels_ref.descriptor import _box_bits

@triton.jit
def _acc_load(ptr, mask, ACC: tl.constexpr):
    """Accumulator values from storage bits: fp32 / fp16 as fp32 values, int32 as int32."""
    if ACC == 0:
        return tl.load(ptr, mask=mask, other=0).to(tl.float32, bitcast=True)
    elif ACC == 1:
        return _decode_f32(_unsigned(tl.load(ptr, mask=mask, other=0), 2), 1)
    else:
        return tl.load(ptr, mask=mask, other=0)


@triton.jit
def _acc_store_bits(acc, ACC: tl.constexpr):
    """Accumulator values -> storage integers of the accumulator type (exact)."""
    if ACC == 0:
        return acc.to(tl.int32, bitcast=True)
    elif ACC == 1:
        return _to_storage(_encode(acc, 1, False), 2)
    else:
        return acc


@triton.jit
def _scale_rows(sa, sb, m0, n0, M, N, MC):
    """Where the tile's block scales lie, read once before the k-loop (sa, sb: Operand of the scale
    tensors): (A's pointers of group column 0 per tile row [BMP], their mask, the group stride, and
    the same of B per tile column [BNP]); `_at_group` moves them to a k-block."""
    sa_ptr, sa_r, sa_c = sa
    sb_ptr, sb_r, sb_c = sb
    rm = m0 + tl.arange(0, MC.BMP)
    rn = n0 + tl.arange(0, MC.BNP)
    return (sa_ptr + (rm // MC.GM) * sa_r, rm < M, sa_c, sb_ptr + (rn // MC.GN) * sb_r, rn < N, sb_c)


@triton.jit
def _at_group(rows, kc):
    """The scale rows (`_scale_rows`) at group column kc."""
    pa, ma, ca, pb, mb, cb = rows
    return (pa + kc * ca, ma, ca, pb + kc * cb, mb, cb)


@triton.jit
def _group_scale(sc, j, k_first, K, MC):
    """fp32(sa * sb) over the tile, [BMP, BNP], for scale group j of the k-block (sc: `_at_group`'s
    tuple at the k-block's first group; rows past the operand read 0). A group whose first k,
    `k_first`, is at or past a ragged K is not in the scale tensors and reads 0 (its products are
    the out-of-bounds fill's)."""
    pa, ma, ca, pb, mb, cb = sc
    live_a = (tl.arange(0, MC.BMP) * 0 + k_first) < K  # elementwise: a scalar mask is not taken everywhere
    live_b = (tl.arange(0, MC.BNP) * 0 + k_first) < K
    sa = _decode_f32(_unsigned(tl.load(pa + j * ca, mask=ma & live_a, other=0), MC.SA_W), MC.SA_DT)
    sb = _decode_f32(_unsigned(tl.load(pb + j * cb, mask=mb & live_b, other=0), MC.SB_W), MC.SB_DT)
    return sa[:, None] * sb[None, :]


@triton.jit
def _add_rn(x, y, INTERP: tl.constexpr):
    """fp32 x + y rounded to nearest as an instruction of its own: on the GPU the compiler would
    otherwise fold `acc + dot` into the tensor core's accumulator, which truncates."""
    if INTERP:
        return x + y
    else:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [x, y], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _sum_in_k_order(p, KP: tl.constexpr):
    """((0 + p[:, 0]) + p[:, 1]) + ... in fp32 over the middle axis of p [R, KP, C], under the
    interpreter only. The selection adds +0s, which also turns a -0 sum into the loop's +0."""
    run = tl.cumsum(p, axis=1)
    last = tl.arange(0, KP)[None, :, None] == KP - 1
    return tl.sum(tl.where(last, run, 0.0), axis=1)


@triton.jit
def _a_bits(a, m0, k0, M, K, KS: tl.constexpr, KSP: tl.constexpr, MC):
    """Bits of A's [BM, KS] box at (m0, k0) (a: Operand), with the out-of-bounds fill."""
    a_ptr, sa_m, sa_k = a
    return _box_bits(a_ptr, sa_m, sa_k, m0, k0, M, K, MC.BM, KS, MC.BMP, KSP, MC.A_W, MC.FILL_NAN, MC.A_NAN)


@triton.jit
def _b_bits(b, k0, n0, K, N, KS: tl.constexpr, KSP: tl.constexpr, MC):
    """Bits of B's [KS, BN] box at (k0, n0) (b: Operand), with the out-of-bounds fill."""
    b_ptr, sb_k, sb_n = b
    return _box_bits(b_ptr, sb_k, sb_n, k0, n0, K, N, KS, MC.BN, KSP, MC.BNP, MC.B_W, MC.FILL_NAN, MC.B_NAN)


@triton.jit
def _mma_kblock(acc, s_acc, sc, a, b, m0, n0, k0, M, N, K, MC, WITH_ABS: tl.constexpr):
    """One k-block update of the accumulator (kernels_ref.mma docstring: semantics).

    The k-block is NCHUNK * NSTEP sub-blocks of KS k-elements, each loaded with the descriptor's
    box helper from a and b (Operand tuples); when SCALED, `sc` locates the k-block's block scales
    (`_group_scale`): chunk c, inside scale group c * NSTEP * KS / (BK / SG), is promoted with that
    group's scale tile. MC: MmaConsts."""
    F32: tl.constexpr = MC.INTERP or (MC.A_DT == 0)
    if MC.SCALED:
        if MC.SG == 1:
            scale0 = _group_scale(sc, 0, k0, K, MC)
    for c in tl.static_range(MC.NCHUNK):
        if MC.SCALED:
            if MC.SG == 1:
                scale = scale0
            else:
                g = (c * MC.NSTEP * MC.KS) // (MC.BK // MC.SG)
                scale = _group_scale(sc, g, k0 + g * (MC.BK // MC.SG), K, MC)
        if MC.ACC == 2:
            q = tl.zeros([MC.BMP, MC.BNP], tl.int32)
        else:
            q = tl.zeros([MC.BMP, MC.BNP], tl.float32)
        for j in tl.static_range(MC.NSTEP):
            kk = k0 + (c * MC.NSTEP + j) * MC.KS
            if MC.ACC == 1 and MC.INTERP == 1:
                # the same fp32 sums in the same order, a step at a time: the interpreter's cumsum
                # adds left to right (numpy), so its last element is the loop's sum below
                a_k = _decode_f32(_a_bits(a, m0, kk, M, K, MC.KS, MC.KSP, MC), MC.A_DT)
                b_k = _decode_f32(_b_bits(b, kk, n0, K, N, MC.KS, MC.KSP, MC), MC.B_DT)
                s = _sum_in_k_order(a_k[:, :, None] * b_k[None, :, :], MC.KSP)
                if WITH_ABS:
                    sabs = _sum_in_k_order(tl.abs(a_k)[:, :, None] * tl.abs(b_k)[None, :, :], MC.KSP)
            elif MC.ACC == 1:
                # fp16 accumulation: each mma_k-deep step is summed in fp32 one k at a time (outer
                # products on the CUDA cores). A 16-deep tl.dot gave wrong sums on sm_90 (triton 3.6).
                s = tl.zeros([MC.BMP, MC.BNP], tl.float32)
                sabs = tl.zeros([MC.BMP, MC.BNP], tl.float32)
                for kq in tl.static_range(MC.KS):
                    a1 = _decode_f32(_a_bits(a, m0, kk + kq, M, K, 1, 1, MC), MC.A_DT)
                    b1 = _decode_f32(_b_bits(b, kk + kq, n0, K, N, 1, 1, MC), MC.B_DT)
                    s = s + a1 * b1
                    if WITH_ABS:
                        sabs = sabs + tl.abs(a1) * tl.abs(b1)
            else:
                a_bits = _a_bits(a, m0, kk, M, K, MC.KS, MC.KSP, MC)
                b_bits = _b_bits(b, kk, n0, K, N, MC.KS, MC.KSP, MC)
                s = _dot(_dot_operand(a_bits, MC.A_DT, MC.INTERP), _dot_operand(b_bits, MC.B_DT, MC.INTERP), F32)
                if WITH_ABS:
                    sabs = _dot(_abs_operand(a_bits, MC.A_DT, MC.INTERP), _abs_operand(b_bits, MC.B_DT, MC.INTERP),
                                F32)
            if WITH_ABS:
                if MC.SCALED:
                    sabs = sabs * tl.abs(scale)
                s_acc = s_acc + sabs
            if MC.PROMO:
                q = _truncate_mantissa(q + s, 10)  # keep 13 explicit mantissa bits
            elif MC.ACC == 1:
                acc = _round_to(acc + s, 1)
            else:
                q = s
        if MC.ACC != 1:
            if MC.SCALED:
                acc = acc + q * scale
            elif MC.ACC == 0:
                acc = _add_rn(acc, q, MC.INTERP)
            else:
                acc = acc + q
    return acc, s_acc


@triton.jit
def _loop_count(n_kb, MC):
    """The k-block count: the runtime argument when compiled; under the interpreter the same
    number as a constexpr (some interpreter versions cannot take range() of a runtime scalar)."""
    if MC.INTERP:
        return MC.N_KB_I
    else:
        return n_kb


@triton.jit
def _zero_acc(MC):
    """A zero accumulator tile [BMP, BNP] of the accumulator's type (int32 or fp32)."""
    if MC.ACC == 2:
        return tl.zeros([MC.BMP, MC.BNP], tl.int32)
    else:
        return tl.zeros([MC.BMP, MC.BNP], tl.float32)


@triton.jit
def _tile_scales(sa, sb, m0, n0, M, N, MC):
    """The tile's scale rows (`_scale_rows`) when SCALED, else 0: read before the k-loop."""
    if MC.SCALED:
        return _scale_rows(sa, sb, m0, n0, M, N, MC)
    else:
        return 0


@triton.jit
def _kblock_scales(rows, k0, MC):
    """The k-block's block scales for `_mma_kblock` (its first group's column) when SCALED, else 0."""
    if MC.SCALED:
        return _at_group(rows, k0 // MC.GK)
    else:
        return 0


@triton.jit
def _mainloop(ml, m0, n0, tr, ts, MC, WITH_ABS: tl.constexpr, TRACE: tl.constexpr):
    """All k-blocks of output tile (m0, n0) (ml: MainloopArgs, MC: MmaConsts): the accumulator
    and S; with TRACE also stores the accumulator (and S when WITH_ABS) after every k-block at
    tr (and ts), each (ptr, stride_kb, stride_r, stride_c)."""
    # A tuple's fields are read before the loop: inside it triton 3.6 loses a field's value that
    # was specialised to a constant (a stride of 1).
    a, b, M, N, K, n_kb, sa, sb = ml
    tr_ptr, tr_kb, tr_r, tr_c = tr
    ts_ptr, ts_kb, ts_r, ts_c = ts
    acc = _zero_acc(MC)
    s_acc = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    i = tl.arange(0, MC.BMP)[:, None]
    j = tl.arange(0, MC.BNP)[None, :]
    in_tile = (i < MC.BM) & (j < MC.BN)
    rows = _tile_scales(sa, sb, m0, n0, M, N, MC)
    for kb in range(0, _loop_count(n_kb, MC)):
        k0 = kb * MC.BK
        sc = _kblock_scales(rows, k0, MC)
        acc, s_acc = _mma_kblock(acc, s_acc, sc, a, b, m0, n0, k0, M, N, K, MC, WITH_ABS)
        if TRACE:
            tl.store(tr_ptr + kb * tr_kb + i * tr_r + j * tr_c, _acc_store_bits(acc, MC.ACC), mask=in_tile)
            if WITH_ABS:
                tl.store(ts_ptr + kb * ts_kb + i * ts_r + j * ts_c, s_acc, mask=in_tile)
    return acc, s_acc


@triton.jit
def _tile_mask(ml, m0, n0, MC):
    """(rows [BMP, 1], cols [1, BNP], mask): the tile's elements inside C [M, N] and the tile."""
    rm = m0 + tl.arange(0, MC.BMP)[:, None]
    rn = n0 + tl.arange(0, MC.BNP)[None, :]
    mask = (rm < ml.M) & (rn < ml.N) & (tl.arange(0, MC.BMP)[:, None] < MC.BM) & \
        (tl.arange(0, MC.BNP)[None, :] < MC.BN)
    return rm, rn, mask

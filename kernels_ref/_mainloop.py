"""The MMA mainloop in Triton: the jit helpers every accumulating kernel is built from.

Data path: for output tile (m0, n0), each k-block's operand boxes are read with the descriptor's
out-of-bounds fill (`descriptor._box_bits`), multiplied and added into the accumulator in the
declared precision (`_mma_kblock`; the semantics, and why each add is written as it is, are in
`kernels_ref.mma`'s docstring); `_mainloop` runs every k-block and can store the accumulator after
each. The kernels of `kernels_ref.mma`, `kernels_ref.mma_stats` and `kernels_ref.gemm` call these
helpers, so the full GEMM accumulates exactly as the MMA stage does; their arguments are built by
`kernels_ref.mma_params`.

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
def _block_scale_tile(sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c, m0, n0, k0, M, N,
                      GM: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr, BMP: tl.constexpr, BNP: tl.constexpr,
                      SA_DT: tl.constexpr, SA_W: tl.constexpr, SB_DT: tl.constexpr, SB_W: tl.constexpr):
    """fp32(sa[m//GM, k0//GK] * sb[n//GN, k0//GK]) over the tile, [BMP, BNP]."""
    rm = m0 + tl.arange(0, BMP)
    rn = n0 + tl.arange(0, BNP)
    kc = k0 // GK
    sa = _decode_f32(_unsigned(tl.load(sca_ptr + (rm // GM) * sca_r + kc * sca_c, mask=rm < M, other=0), SA_W), SA_DT)
    sb = _decode_f32(_unsigned(tl.load(scb_ptr + (rn // GN) * scb_r + kc * scb_c, mask=rn < N, other=0), SB_W), SB_DT)
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
def _mma_kblock(acc, s_acc, scale, a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, k0, M, N, K,
                A_DT: tl.constexpr, A_W: tl.constexpr, A_NAN: tl.constexpr,
                B_DT: tl.constexpr, B_W: tl.constexpr, B_NAN: tl.constexpr, FILL_NAN: tl.constexpr,
                ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BMP: tl.constexpr, BNP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr,
                NCHUNK: tl.constexpr, NSTEP: tl.constexpr, PROMO: tl.constexpr,
                SCALED: tl.constexpr, WITH_ABS: tl.constexpr, INTERP: tl.constexpr):
    """One k-block update of the accumulator (kernels_ref.mma docstring: semantics).

    The k-block is NCHUNK * NSTEP sub-blocks of KS k-elements, each loaded with the descriptor's
    box helper; `scale` is the [BMP, BNP] block-scale tile when SCALED."""
    F32: tl.constexpr = INTERP or (A_DT == 0)
    for c in tl.static_range(NCHUNK):
        if ACC == 2:
            q = tl.zeros([BMP, BNP], tl.int32)
        else:
            q = tl.zeros([BMP, BNP], tl.float32)
        for j in tl.static_range(NSTEP):
            kk = k0 + (c * NSTEP + j) * KS
            if ACC == 1 and INTERP == 1:
                # the same fp32 sums in the same order, a step at a time: the interpreter's cumsum
                # adds left to right (numpy), so its last element is the loop's sum below
                a_bits = _box_bits(a_ptr, sa_m, sa_k, m0, kk, M, K, BM, KS, BMP, KSP, A_W, FILL_NAN, A_NAN)
                b_bits = _box_bits(b_ptr, sb_k, sb_n, kk, n0, K, N, KS, BN, KSP, BNP, B_W, FILL_NAN, B_NAN)
                a_k = _decode_f32(a_bits, A_DT)
                b_k = _decode_f32(b_bits, B_DT)
                s = _sum_in_k_order(a_k[:, :, None] * b_k[None, :, :], KSP)
                if WITH_ABS:
                    sabs = _sum_in_k_order(tl.abs(a_k)[:, :, None] * tl.abs(b_k)[None, :, :], KSP)
            elif ACC == 1:
                # fp16 accumulation: each mma_k-deep step is summed in fp32 one k at a time (outer
                # products on the CUDA cores). A 16-deep tl.dot gave wrong sums on sm_90 (triton 3.6).
                s = tl.zeros([BMP, BNP], tl.float32)
                sabs = tl.zeros([BMP, BNP], tl.float32)
                for kq in tl.static_range(KS):
                    a1 = _decode_f32(_box_bits(a_ptr, sa_m, sa_k, m0, kk + kq, M, K, BM, 1, BMP, 1, A_W, FILL_NAN,
                                               A_NAN), A_DT)
                    b1 = _decode_f32(_box_bits(b_ptr, sb_k, sb_n, kk + kq, n0, K, N, 1, BN, 1, BNP, B_W, FILL_NAN,
                                               B_NAN), B_DT)
                    s = s + a1 * b1
                    if WITH_ABS:
                        sabs = sabs + tl.abs(a1) * tl.abs(b1)
            else:
                a_bits = _box_bits(a_ptr, sa_m, sa_k, m0, kk, M, K, BM, KS, BMP, KSP, A_W, FILL_NAN, A_NAN)
                b_bits = _box_bits(b_ptr, sb_k, sb_n, kk, n0, K, N, KS, BN, KSP, BNP, B_W, FILL_NAN, B_NAN)
                s = _dot(_dot_operand(a_bits, A_DT, INTERP), _dot_operand(b_bits, B_DT, INTERP), F32)
                if WITH_ABS:
                    sabs = _dot(_abs_operand(a_bits, A_DT, INTERP), _abs_operand(b_bits, B_DT, INTERP), F32)
            if WITH_ABS:
                if SCALED:
                    sabs = sabs * tl.abs(scale)
                s_acc = s_acc + sabs
            if PROMO:
                q = _truncate_mantissa(q + s, 10)  # keep 13 explicit mantissa bits
            elif ACC == 1:
                acc = _round_to(acc + s, 1)
            else:
                q = s
        if ACC != 1:
            if SCALED:
                acc = acc + q * scale
            elif ACC == 0:
                acc = _add_rn(acc, q, INTERP)
            else:
                acc = acc + q
    return acc, s_acc


@triton.jit
def _loop_count(n_kb, INTERP: tl.constexpr, N_KB_I: tl.constexpr):
    """The k-block count: the runtime argument when compiled; under the interpreter the same
    number as a constexpr (some interpreter versions cannot take range() of a runtime scalar)."""
    if INTERP:
        return N_KB_I
    else:
        return n_kb


@triton.jit
def _mainloop(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, M, N, K, n_kb,
              sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c,
              tr_ptr, tr_kb, tr_r, tr_c, ts_ptr, ts_kb, ts_r, ts_c,
              A_DT: tl.constexpr, A_W: tl.constexpr, A_NAN: tl.constexpr,
              B_DT: tl.constexpr, B_W: tl.constexpr, B_NAN: tl.constexpr, FILL_NAN: tl.constexpr,
              ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              BMP: tl.constexpr, BNP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr,
              NCHUNK: tl.constexpr, NSTEP: tl.constexpr, PROMO: tl.constexpr,
              SCALED: tl.constexpr, GM: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr,
              SA_DT: tl.constexpr, SA_W: tl.constexpr, SB_DT: tl.constexpr, SB_W: tl.constexpr,
              WITH_ABS: tl.constexpr, TRACE: tl.constexpr, INTERP: tl.constexpr):
    """All k-blocks of output tile (m0, n0): the accumulator and S; with TRACE also stores the
    accumulator (and S when WITH_ABS) after every k-block."""
    if ACC == 2:
        acc = tl.zeros([BMP, BNP], tl.int32)
    else:
        acc = tl.zeros([BMP, BNP], tl.float32)
    s_acc = tl.zeros([BMP, BNP], tl.float32)
    i = tl.arange(0, BMP)[:, None]
    j = tl.arange(0, BNP)[None, :]
    in_tile = (i < BM) & (j < BN)
    for kb in range(0, n_kb):
        k0 = kb * BK
        if SCALED:
            scale = _block_scale_tile(sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c, m0, n0, k0, M, N,
                                      GM, GN, GK, BMP, BNP, SA_DT, SA_W, SB_DT, SB_W)
        else:
            scale = 1.0
        acc, s_acc = _mma_kblock(acc, s_acc, scale, a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, k0, M, N, K,
                                 A_DT, A_W, A_NAN, B_DT, B_W, B_NAN, FILL_NAN, ACC, BM, BN, BMP, BNP, KS, KSP,
                                 NCHUNK, NSTEP, PROMO, SCALED, WITH_ABS, INTERP)
        if TRACE:
            tl.store(tr_ptr + kb * tr_kb + i * tr_r + j * tr_c, _acc_store_bits(acc, ACC), mask=in_tile)
            if WITH_ABS:
                tl.store(ts_ptr + kb * ts_kb + i * ts_r + j * ts_c, s_acc, mask=in_tile)
    return acc, s_acc

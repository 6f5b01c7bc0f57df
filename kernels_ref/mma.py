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
               block_scale_group (gm, gn, gk), gk a multiple of block_k. For k-block kb,
               s = fp32(sa[m//gm, kb*BK//gk] * sb[n//gn, kb*BK//gk]) and the update is
               acc = fp32(acc + fp32(p * s)); with promotion, each chunk's q is scaled instead of p.
               (`mma_step` takes the already gathered per-row / per-column vectors.)
  with_abs_sum: S accumulates fp32(|A_kb| @ |B_kb|) (times |s|) per dot, in fp32.
  with_stats (mma_accumulate): the statistics the accumulation bounds read, per element
               (oracle.judging.tolerance): with X_j the accumulator after k-block j (X_-1 = 0) and s_j
               the block's sum |a||b|, m_j = max(X_(j-1) - min(0, X_0..X_(j-1)),
               max(0, X_0..X_(j-1)) - X_(j-1)) + s_j (the largest |running partial| any restart at
               a k-block boundary could hold, plus the block), l = sum_j m_j, v = sum_j m_j^2;
               q = sum_k (a_mk b_kn)^2 (fp32 operands only, else 0); with stats_chunk c k
               elements (a multiple of block_k), the partials P_i = X(end of chunk i) - X(end of
               chunk i-1) give pabs = sum_i |P_i| and prun = sum_i |X(end of chunk i)| (else 0).
               Computed in fp32 from the kernel's own accumulator; `trajectory_stats` computes the
               same from a trajectory, and the host spec is that applied to the host trajectory.

Constraints: tile extents need not be powers of two (blocks are padded with zeros inside the
kernel). On the GPU fp32 dots use the ieee path, fp16/fp8 operands are fed to the tensor cores as
fp16 (exact) so accumulation is proper fp32, and fp-contraction is off; each k-block's dot starts
from zero and is added to the accumulator by an fp32 add that rounds to nearest (an inline
`add.rn.f32`, which the compiler cannot fold into the tensor core's truncating accumulator), so
the reference's own error grows with each block's sum |a||b|, not with the running sum. Under
the interpreter every float dot runs on fp32 values. Host specs
return CPU float64 tensors holding values exactly representable in the accumulator type.

One job: the MMA stage, in the shape every stage module has: its Triton references behind the
public launchers (mma_step, mma_trajectory, mma_accumulate, partial_trajectory), their float64
host specifications (the *_host functions), check_supported, and the accumulator statistics the
bounds read (MmaStats, trajectory_stats). Its length is the accumulator semantics above, each
with its kernel path and its host emulation side by side; the jit mainloop at the top is the one
kernels_ref.gemm reuses, so the full GEMM accumulates exactly as this stage does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import numpy as np
import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._codec import (_abs_operand, _decode_f32, _dot, _dot_operand, _encode, _round_to, _to_storage,
                                _truncate_mantissa, _unsigned)
from kernels_ref.descriptor import _box_bits
from kernels_ref.dtypes import DTYPES, FP8

ACCS = ("fp32", "fp16", "int32")
_ACC_CODE = {"fp32": 0, "fp16": 1, "int32": 2}
_ACC_TORCH = {"fp32": torch.float32, "fp16": torch.float16, "int32": torch.int32}
PROMOTION_MANTISSA_BITS = 13


# ----------------------------------------------------------------------------------------------
# jit helpers (shared with gemm)
# ----------------------------------------------------------------------------------------------


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
    """One k-block update of the accumulator (module docstring: semantics).

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


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _mma_step_kernel(prev_ptr, sp_t, sp_r, sp_c, a_ptr, sa_t, sa_m, sa_k, b_ptr, sb_t, sb_k, sb_n,
                     sca_ptr, sca_t, sca_m, scb_ptr, scb_t, scb_n, out_ptr, so_t, so_r, so_c, abs_ptr, sabs_t,
                     A_DT: tl.constexpr, A_W: tl.constexpr, B_DT: tl.constexpr, B_W: tl.constexpr,
                     ACC: tl.constexpr, HAS_PREV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BMP: tl.constexpr, BNP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr,
                     NCHUNK: tl.constexpr, NSTEP: tl.constexpr, PROMO: tl.constexpr,
                     SCALED: tl.constexpr, SA_DT: tl.constexpr, SA_W: tl.constexpr,
                     SB_DT: tl.constexpr, SB_W: tl.constexpr, WITH_ABS: tl.constexpr, INTERP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BMP)[:, None]
    j = tl.arange(0, BNP)[None, :]
    in_tile = (i < BM) & (j < BN)
    if HAS_PREV:
        acc = _acc_load(prev_ptr + t * sp_t + i * sp_r + j * sp_c, in_tile, ACC)
    elif ACC == 2:
        acc = tl.zeros([BMP, BNP], tl.int32)
    else:
        acc = tl.zeros([BMP, BNP], tl.float32)
    if SCALED:
        ri = tl.arange(0, BMP)
        cj = tl.arange(0, BNP)
        sa = _decode_f32(_unsigned(tl.load(sca_ptr + t * sca_t + ri * sca_m, mask=ri < BM, other=0), SA_W), SA_DT)
        sb = _decode_f32(_unsigned(tl.load(scb_ptr + t * scb_t + cj * scb_n, mask=cj < BN, other=0), SB_W), SB_DT)
        scale = sa[:, None] * sb[None, :]
    else:
        scale = 1.0
    s_acc = tl.zeros([BMP, BNP], tl.float32)
    acc, s_acc = _mma_kblock(acc, s_acc, scale, a_ptr + t * sa_t, sa_m, sa_k, b_ptr + t * sb_t, sb_k, sb_n,
                             0, 0, 0, BM, BN, KS * NSTEP * NCHUNK,
                             A_DT, A_W, 0, B_DT, B_W, 0, False, ACC, BM, BN, BMP, BNP, KS, KSP,
                             NCHUNK, NSTEP, PROMO, SCALED, WITH_ABS, INTERP)
    tl.store(out_ptr + t * so_t + i * so_r + j * so_c, _acc_store_bits(acc, ACC), mask=in_tile)
    if WITH_ABS:
        tl.store(abs_ptr + t * sabs_t + i * BN + j, s_acc, mask=in_tile)


@triton.jit
def _mma_tiles_kernel(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, M, N, K, n_kb, tiles_ptr,
                      sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c,
                      tr_ptr, tr_t, tr_kb, tr_r, tr_c, ts_ptr, ts_t, ts_kb, ts_r, ts_c,
                      A_DT: tl.constexpr, A_W: tl.constexpr, A_NAN: tl.constexpr,
                      B_DT: tl.constexpr, B_W: tl.constexpr, B_NAN: tl.constexpr, FILL_NAN: tl.constexpr,
                      ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      BMP: tl.constexpr, BNP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr,
                      NCHUNK: tl.constexpr, NSTEP: tl.constexpr, PROMO: tl.constexpr,
                      SCALED: tl.constexpr, GM: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr,
                      SA_DT: tl.constexpr, SA_W: tl.constexpr, SB_DT: tl.constexpr, SB_W: tl.constexpr,
                      WITH_ABS: tl.constexpr, INTERP: tl.constexpr, N_KB_I: tl.constexpr):
    t = tl.program_id(0)
    m0 = tl.load(tiles_ptr + 2 * t) * BM
    n0 = tl.load(tiles_ptr + 2 * t + 1) * BN
    t64 = t.to(tl.int64)
    _mainloop(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, M, N, K,
              _loop_count(n_kb, INTERP, N_KB_I),
              sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c,
              tr_ptr + t64 * tr_t, tr_kb, tr_r, tr_c, ts_ptr + t64 * ts_t, ts_kb, ts_r, ts_c,
              A_DT, A_W, A_NAN, B_DT, B_W, B_NAN, FILL_NAN, ACC, BM, BN, BK, BMP, BNP, KS, KSP,
              NCHUNK, NSTEP, PROMO, SCALED, GM, GN, GK, SA_DT, SA_W, SB_DT, SB_W, WITH_ABS, True, INTERP)


@triton.jit
def _mma_accumulate_kernel(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, M, N, K, n_kb,
                           sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c, out_ptr, so_r, so_c, abs_ptr,
                           A_DT: tl.constexpr, A_W: tl.constexpr, A_NAN: tl.constexpr,
                           B_DT: tl.constexpr, B_W: tl.constexpr, B_NAN: tl.constexpr, FILL_NAN: tl.constexpr,
                           ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                           BMP: tl.constexpr, BNP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr,
                           NCHUNK: tl.constexpr, NSTEP: tl.constexpr, PROMO: tl.constexpr,
                           SCALED: tl.constexpr, GM: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr,
                           SA_DT: tl.constexpr, SA_W: tl.constexpr, SB_DT: tl.constexpr, SB_W: tl.constexpr,
                           WITH_ABS: tl.constexpr, INTERP: tl.constexpr, N_KB_I: tl.constexpr):
    m0 = tl.program_id(0) * BM
    n0 = tl.program_id(1) * BN
    acc, s_acc = _mainloop(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, M, N, K,
                           _loop_count(n_kb, INTERP, N_KB_I),
                           sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c, out_ptr, 0, 0, 0, abs_ptr, 0, 0, 0,
                           A_DT, A_W, A_NAN, B_DT, B_W, B_NAN, FILL_NAN, ACC, BM, BN, BK, BMP, BNP, KS, KSP,
                           NCHUNK, NSTEP, PROMO, SCALED, GM, GN, GK, SA_DT, SA_W, SB_DT, SB_W, WITH_ABS, False,
                           INTERP)
    rm = m0 + tl.arange(0, BMP)[:, None]
    rn = n0 + tl.arange(0, BNP)[None, :]
    mask = (rm < M) & (rn < N) & (tl.arange(0, BMP)[:, None] < BM) & (tl.arange(0, BNP)[None, :] < BN)
    tl.store(out_ptr + rm * so_r + rn * so_c, _acc_store_bits(acc, ACC), mask=mask)
    if WITH_ABS:
        tl.store(abs_ptr + rm * N + rn, s_acc, mask=mask)


@triton.jit
def _sq_kblock(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, k0, M, N, K,
               A_W: tl.constexpr, B_W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BMP: tl.constexpr, BNP: tl.constexpr, BK: tl.constexpr, BKP: tl.constexpr):
    """sum over the k-block of (a b)^2 for fp32 operands (ieee dot of the squares)."""
    a = _decode_f32(_box_bits(a_ptr, sa_m, sa_k, m0, k0, M, K, BM, BK, BMP, BKP, A_W, False, 0), 0)
    b = _decode_f32(_box_bits(b_ptr, sb_k, sb_n, k0, n0, K, N, BK, BN, BKP, BNP, B_W, False, 0), 0)
    return _dot(a * a, b * b, True)


@triton.jit
def _mma_stats_kernel(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, M, N, K, n_kb,
                      sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c, out_ptr, so_r, so_c, abs_ptr, st_ptr, st_s,
                      A_DT: tl.constexpr, A_W: tl.constexpr, A_NAN: tl.constexpr,
                      B_DT: tl.constexpr, B_W: tl.constexpr, B_NAN: tl.constexpr, FILL_NAN: tl.constexpr,
                      ACC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      BMP: tl.constexpr, BNP: tl.constexpr, KS: tl.constexpr, KSP: tl.constexpr,
                      NCHUNK: tl.constexpr, NSTEP: tl.constexpr, PROMO: tl.constexpr,
                      SCALED: tl.constexpr, GM: tl.constexpr, GN: tl.constexpr, GK: tl.constexpr,
                      SA_DT: tl.constexpr, SA_W: tl.constexpr, SB_DT: tl.constexpr, SB_W: tl.constexpr,
                      CHUNK_KB: tl.constexpr, WITH_Q: tl.constexpr, BKP: tl.constexpr,
                      INTERP: tl.constexpr, N_KB_I: tl.constexpr):
    """mma_accumulate with S and the bound statistics (module docstring: with_stats)."""
    m0 = tl.program_id(0) * BM
    n0 = tl.program_id(1) * BN
    acc = tl.zeros([BMP, BNP], tl.float32)
    s_acc = tl.zeros([BMP, BNP], tl.float32)
    l_st = tl.zeros([BMP, BNP], tl.float32)
    v_st = tl.zeros([BMP, BNP], tl.float32)
    q_st = tl.zeros([BMP, BNP], tl.float32)
    pabs = tl.zeros([BMP, BNP], tl.float32)
    prun = tl.zeros([BMP, BNP], tl.float32)
    lo = tl.zeros([BMP, BNP], tl.float32)
    hi = tl.zeros([BMP, BNP], tl.float32)
    mark = tl.zeros([BMP, BNP], tl.float32)
    n_loop = _loop_count(n_kb, INTERP, N_KB_I)
    for kb in range(0, n_loop):
        k0 = kb * BK
        if SCALED:
            scale = _block_scale_tile(sca_ptr, sca_r, sca_c, scb_ptr, scb_r, scb_c, m0, n0, k0, M, N,
                                      GM, GN, GK, BMP, BNP, SA_DT, SA_W, SB_DT, SB_W)
        else:
            scale = 1.0
        x = acc
        s_before = s_acc
        acc, s_acc = _mma_kblock(acc, s_acc, scale, a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, k0, M, N, K,
                                 A_DT, A_W, A_NAN, B_DT, B_W, B_NAN, FILL_NAN, ACC, BM, BN, BMP, BNP, KS, KSP,
                                 NCHUNK, NSTEP, PROMO, SCALED, True, INTERP)
        m = tl.maximum(x - lo, hi - x) + (s_acc - s_before)
        l_st = l_st + m
        v_st = v_st + m * m
        lo = tl.minimum(lo, acc)
        hi = tl.maximum(hi, acc)
        if WITH_Q:
            q_st = q_st + _sq_kblock(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, m0, n0, k0, M, N, K, A_W, B_W,
                                     BM, BN, BMP, BNP, BK, BKP)
        if CHUNK_KB > 0:
            edge = ((kb + 1) % CHUNK_KB == 0) | (kb + 1 == n_kb)
            pabs = tl.where(edge, pabs + tl.abs(acc - mark), pabs)
            prun = tl.where(edge, prun + tl.abs(acc), prun)
            mark = tl.where(edge, acc, mark)
    rm = m0 + tl.arange(0, BMP)[:, None]
    rn = n0 + tl.arange(0, BNP)[None, :]
    mask = (rm < M) & (rn < N) & (tl.arange(0, BMP)[:, None] < BM) & (tl.arange(0, BNP)[None, :] < BN)
    tl.store(out_ptr + rm * so_r + rn * so_c, _acc_store_bits(acc, ACC), mask=mask)
    tl.store(abs_ptr + rm * N + rn, s_acc, mask=mask)
    off = rm * N + rn
    tl.store(st_ptr + off, l_st, mask=mask)
    tl.store(st_ptr + st_s + off, v_st, mask=mask)
    tl.store(st_ptr + 2 * st_s + off, q_st, mask=mask)
    tl.store(st_ptr + 3 * st_s + off, pabs, mask=mask)
    tl.store(st_ptr + 4 * st_s + off, prun, mask=mask)


# ----------------------------------------------------------------------------------------------
# configuration and checks
# ----------------------------------------------------------------------------------------------


def mma_k_of(a_dtype: str, b_dtype: str) -> int:
    """k depth of one MMA instruction for this operand pair (the larger of the two)."""
    return max(DTYPES[a_dtype].mma_k, DTYPES[b_dtype].mma_k)


def check_supported(a_dtype: str, b_dtype: str, acc: str = "fp32", block_m: int = 128, block_n: int = 128,
                    block_k: int = 64, promotion_interval: Optional[int] = None,
                    block_scale_group: Optional[Sequence[int]] = None, scaled: bool = False) -> list[str]:
    """Reasons this accumulation cannot be modelled (empty list: supported).

    `scaled` says block scales are used; `block_scale_group` is checked when given."""
    reasons = []
    for nm, d in (("a_dtype", a_dtype), ("b_dtype", b_dtype)):
        if d not in DTYPES:
            reasons.append(f"{nm}={d!r} is unknown; allowed: {', '.join(DTYPES)}")
    if acc not in ACCS:
        reasons.append(f"acc={acc!r} is not allowed; allowed: {', '.join(ACCS)}")
    for nm, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            reasons.append(f"{nm}={v!r} must be a positive int")
    if reasons:
        return reasons
    pair = (a_dtype, b_dtype)
    fp8 = all(d in FP8 for d in pair)
    if acc == "fp32":
        if not (fp8 or (a_dtype == b_dtype and a_dtype in ("fp32", "fp16", "bf16"))):
            reasons.append(f"acc='fp32' takes operands fp32, fp16, bf16 (both the same) or e4m3/e5m2 (mixable); "
                           f"got a_dtype={a_dtype!r}, b_dtype={b_dtype!r}")
    elif acc == "fp16":
        if not (fp8 or pair == ("fp16", "fp16")):
            reasons.append(f"acc='fp16' takes operands fp16 (both) or e4m3/e5m2; got a_dtype={a_dtype!r}, "
                           f"b_dtype={b_dtype!r}")
        elif block_k % mma_k_of(a_dtype, b_dtype):
            reasons.append(f"acc='fp16' rounds after every MMA step of {mma_k_of(a_dtype, b_dtype)} k-elements: "
                           f"block_k={block_k} must be a multiple of it")
    else:
        if pair != ("int8", "int8"):
            reasons.append(f"acc='int32' takes int8 operands; got a_dtype={a_dtype!r}, b_dtype={b_dtype!r}")
    if promotion_interval is not None:
        p = promotion_interval
        if not fp8 or acc != "fp32":
            reasons.append(f"promotion_interval={p!r} models fp8 tensor-core accumulation: it needs e4m3/e5m2 "
                           f"operands and acc='fp32'")
        elif isinstance(p, bool) or not isinstance(p, int) or p <= 0 or p % 32 or block_k % p:
            reasons.append(f"promotion_interval={p!r} must be a positive multiple of 32 that divides "
                           f"block_k={block_k}")
    if scaled and acc != "fp32":
        reasons.append(f"block scales need acc='fp32', got acc={acc!r}")
    if block_scale_group is not None:
        g = tuple(block_scale_group) if isinstance(block_scale_group, (tuple, list)) else block_scale_group
        if not isinstance(g, tuple) or len(g) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                                                           for v in g):
            reasons.append(f"block_scale_group={block_scale_group!r} must be three positive ints (gm, gn, gk)")
        elif g[2] % block_k:
            reasons.append(f"block_scale_group gk={g[2]} must be a multiple of block_k={block_k} "
                           f"(one scale per k-block)")
    return reasons


# Under the interpreter the fp16 accumulator's MMA steps are summed by one scan per step (mode 1);
# True here runs the compiled path's k-at-a-time loop instead (mode 2), for the test that holds the
# two to the same bits.
INTERPRET_FP16_STEPS_AS_LOOP = False


def _interp_mode() -> int:
    """The kernels' INTERP: 0 compiled, 1 interpreted, 2 interpreted with the fp16 steps' loop."""
    if not C.interpreting():
        return 0
    return 2 if INTERPRET_FP16_STEPS_AS_LOOP else 1


class _Cfg:
    """Constexpr bundle for one accumulation configuration."""

    def __init__(self, a_dtype, b_dtype, acc, block_m, block_n, block_k, promotion_interval):
        self.a_dtype, self.b_dtype, self.acc = a_dtype, b_dtype, acc
        mk = mma_k_of(a_dtype, b_dtype)
        if promotion_interval is not None:
            ks, nstep, nchunk = mk, promotion_interval // mk, block_k // promotion_interval
        elif acc == "fp16":
            ks, nstep, nchunk = mk, 1, block_k // mk
        else:
            ks, nstep, nchunk = block_k, 1, 1
        kmin = C.dot_k_min((a_dtype, b_dtype))
        self.meta = dict(
            A_DT=C.CODES[a_dtype], A_W=DTYPES[a_dtype].itemsize, B_DT=C.CODES[b_dtype], B_W=DTYPES[b_dtype].itemsize,
            ACC=_ACC_CODE[acc], BM=block_m, BN=block_n, BMP=C.pad_dim(block_m), BNP=C.pad_dim(block_n),
            KS=ks, KSP=C.pad_dim(ks, kmin), NCHUNK=nchunk, NSTEP=nstep, PROMO=promotion_interval is not None,
            INTERP=_interp_mode())
        big = self.meta["BMP"] * self.meta["BNP"] >= 128 * 128
        self.num_warps = 8 if big else 4

    def fill(self, oob_fill):
        return dict(A_NAN=C.NAN_BITS.get(self.a_dtype, 0), B_NAN=C.NAN_BITS.get(self.b_dtype, 0),
                    FILL_NAN=oob_fill == "nan")


def _validate_mm(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b, block_scale_group,
                 oob_fill):
    C.require_tensor("a", a, 2)
    C.require_tensor("b", b, 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a must be [M, K] and b [K, N]")
    ad, bd = C.dtype_name("a", a), C.dtype_name("b", b)
    C.require_choice("oob_fill", oob_fill, C.OOB_FILLS)
    if (scale_a is None) != (scale_b is None):
        raise ValueError("scale_a and scale_b must be given together (block-scaled) or both be None")
    scaled = scale_a is not None
    if scaled and block_scale_group is None:
        raise ValueError("block_scale_group=(gm, gn, gk) is required with scale_a/scale_b")
    if not scaled and block_scale_group is not None:
        raise ValueError(f"block_scale_group={block_scale_group!r} given without scale_a/scale_b")
    reasons = check_supported(ad, bd, acc, block_m, block_n, block_k, promotion_interval, block_scale_group, scaled)
    if oob_fill == "nan" and not (DTYPES[ad].is_float and DTYPES[bd].is_float):
        reasons.append("oob_fill='nan' needs floating-point operands")
    if reasons:
        raise C.reasons_error(reasons)
    M, K = a.shape
    N = b.shape[1]
    if scaled:
        gm, gn, gk = block_scale_group
        for nm, s, rows in (("scale_a", scale_a, C.cdiv(M, gm)), ("scale_b", scale_b, C.cdiv(N, gn))):
            C.require_tensor(nm, s, 2)
            C.dtype_name(nm, s, C.FLOAT_NAMES[:3])
            if tuple(s.shape) != (rows, C.cdiv(K, gk)):
                raise ValueError(f"{nm} has shape {tuple(s.shape)}; with block_scale_group={tuple(block_scale_group)} "
                                 f"and M={M}, N={N}, K={K} it must be {(rows, C.cdiv(K, gk))}")
    return ad, bd


def _scale_args(scale_a, scale_b, block_scale_group, dummy):
    if scale_a is None:
        return (dummy, 0, 0, dummy, 0, 0), dict(SCALED=False, GM=1, GN=1, GK=1, SA_DT=0, SA_W=4, SB_DT=0, SB_W=4)
    sa, sb = C.bits_view(scale_a), C.bits_view(scale_b)
    gm, gn, gk = block_scale_group
    meta = dict(SCALED=True, GM=gm, GN=gn, GK=gk, SA_DT=C.CODES[C.name_of(scale_a.dtype)], SA_W=scale_a.element_size(),
                SB_DT=C.CODES[C.name_of(scale_b.dtype)], SB_W=scale_b.element_size())
    return (sa, sa.stride(0), sa.stride(1), sb, sb.stride(0), sb.stride(1)), meta


# ----------------------------------------------------------------------------------------------
# public launchers
# ----------------------------------------------------------------------------------------------


def mma_step(acc_prev: Optional[torch.Tensor], a_tile: torch.Tensor, b_tile: torch.Tensor, acc: str = "fp32",
             promotion_interval: Optional[int] = None, scale_a: Optional[torch.Tensor] = None,
             scale_b: Optional[torch.Tensor] = None, with_abs_sum: bool = False):
    """One k-block update acc_prev + a_tile @ b_tile in the accumulator precision (teacher forcing).

    a_tile [..., BM, BK], b_tile [..., BK, BN], acc_prev [..., BM, BN] in the accumulator dtype
    (fp32, fp16 or int32 tensor) or None for a zero accumulator. scale_a [..., BM] and scale_b
    [..., BN] are this k-block's block scales per tile row / column. Returns the new accumulator
    (and S of this k-block, fp32, when with_abs_sum)."""
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
    reasons = check_supported(ad, bd, acc, BM, BN, BK, promotion_interval, None, scaled)
    if reasons:
        raise C.reasons_error(reasons)
    if acc_prev is not None:
        C.require_tensor("acc_prev", acc_prev)
        if tuple(acc_prev.shape) != lead + (BM, BN):
            raise ValueError(f"acc_prev has shape {tuple(acc_prev.shape)}; expected {lead + (BM, BN)}")
        if acc_prev.dtype != _ACC_TORCH[acc]:
            raise ValueError(f"acc_prev has dtype {acc_prev.dtype}; acc={acc!r} needs {_ACC_TORCH[acc]}")
    if scaled:
        for nm, s, n in (("scale_a", scale_a, BM), ("scale_b", scale_b, BN)):
            C.require_tensor(nm, s)
            C.dtype_name(nm, s, C.FLOAT_NAMES[:3])
            if tuple(s.shape) != lead + (n,):
                raise ValueError(f"{nm} has shape {tuple(s.shape)}; expected {lead + (n,)}")
    dev = C.check_device(("a_tile", a_tile), ("b_tile", b_tile), ("acc_prev", acc_prev), ("scale_a", scale_a),
                         ("scale_b", scale_b))
    T = 1
    for d in lead:
        T *= d
    a3 = C.bits_view(a_tile.reshape(T, BM, BK))
    b3 = C.bits_view(b_tile.reshape(T, BK, BN))
    out = torch.empty((T, BM, BN), dtype=_ACC_TORCH[acc], device=dev)
    ob = C.bits_view(out)
    absum = torch.empty((T, BM, BN), dtype=torch.float32, device=dev) if with_abs_sum else out
    prev = C.bits_view(acc_prev.reshape(T, BM, BN)) if acc_prev is not None else ob
    if scaled:
        sa = C.bits_view(scale_a.reshape(T, BM))
        sb = C.bits_view(scale_b.reshape(T, BN))
        smeta = dict(SA_DT=C.CODES[C.name_of(scale_a.dtype)], SA_W=scale_a.element_size(),
                     SB_DT=C.CODES[C.name_of(scale_b.dtype)], SB_W=scale_b.element_size())
    else:
        sa = sb = ob
        smeta = dict(SA_DT=0, SA_W=4, SB_DT=0, SB_W=4)
    cfg = _Cfg(ad, bd, acc, BM, BN, BK, promotion_interval)
    _mma_step_kernel[(T,)](
        prev, prev.stride(0), prev.stride(1), prev.stride(2), a3, a3.stride(0), a3.stride(1), a3.stride(2),
        b3, b3.stride(0), b3.stride(1), b3.stride(2), sa, sa.stride(0), sa.stride(-1), sb, sb.stride(0), sb.stride(-1),
        ob, ob.stride(0), ob.stride(1), ob.stride(2), absum, absum.stride(0),
        HAS_PREV=acc_prev is not None, SCALED=scaled, WITH_ABS=with_abs_sum, **cfg.meta, **smeta,
        **C.launch_options(dev, cfg.num_warps))
    out = out.reshape(lead + (BM, BN))
    if with_abs_sum:
        return out, absum.reshape(lead + (BM, BN))
    return out


def mma_trajectory(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                   acc: str = "fp32", promotion_interval: Optional[int] = None,
                   scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                   block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero",
                   with_abs_sum: bool = False):
    """Accumulator after every k-block for the chosen output tiles: [T, n_kblocks, BM, BN].

    `tiles` is a list of (tm, tn). Rows/columns of a ragged tile past M/N hold what the
    accumulator holds there (products of the out-of-bounds fill). With with_abs_sum also
    returns S after every k-block (fp32, same shape)."""
    ad, bd = _validate_mm(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                          block_scale_group, oob_fill)
    dev = C.check_device(("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b))
    M, K = a.shape
    N = b.shape[1]
    tiles_t = C.as_index_tensor("tiles", tiles, torch.device("cpu"))
    n_tm, n_tn = C.cdiv(M, block_m), C.cdiv(N, block_n)
    if tiles_t[:, 0].min() < 0 or tiles_t[:, 0].max() >= n_tm or tiles_t[:, 1].min() < 0 or tiles_t[:, 1].max() >= n_tn:
        raise ValueError(f"tiles {tiles_t.tolist() if tiles_t.shape[0] <= 8 else '(list)'} out of range; allowed: "
                         f"tm in 0..{n_tm - 1}, tn in 0..{n_tn - 1}")
    n_kb = C.cdiv(K, block_k)
    T = tiles_t.shape[0]
    out = torch.empty((T, n_kb, block_m, block_n), dtype=_ACC_TORCH[acc], device=dev)
    ob = C.bits_view(out)
    ts = torch.empty((T, n_kb, block_m, block_n), dtype=torch.float32, device=dev) if with_abs_sum else out
    cfg = _Cfg(ad, bd, acc, block_m, block_n, block_k, promotion_interval)
    ab, bb = C.bits_view(a), C.bits_view(b)
    sargs, smeta = _scale_args(scale_a, scale_b, block_scale_group, ab)
    _mma_tiles_kernel[(T,)](
        ab, ab.stride(0), ab.stride(1), bb, bb.stride(0), bb.stride(1), M, N, K, n_kb, tiles_t.to(dev), *sargs,
        ob, ob.stride(0), ob.stride(1), ob.stride(2), ob.stride(3), ts, ts.stride(0), ts.stride(1), ts.stride(2),
        ts.stride(3), BK=block_k, WITH_ABS=with_abs_sum, N_KB_I=n_kb if C.interpreting() else 0, **cfg.meta,
        **cfg.fill(oob_fill), **smeta, **C.launch_options(dev, cfg.num_warps))
    return (out, ts) if with_abs_sum else out


@dataclass(frozen=True)
class MmaStats:
    """The bound statistics of an accumulation (module docstring: with_stats), each [..., R, C]."""

    l: torch.Tensor
    v: torch.Tensor
    q: Optional[torch.Tensor]  # None: not computed (a trajectory given none)
    pabs: torch.Tensor
    prun: torch.Tensor

    def _map(self, fn) -> "MmaStats":
        return MmaStats(*(None if getattr(self, f) is None else fn(getattr(self, f))
                          for f in ("l", "v", "q", "pabs", "prun")))

    def at(self, *index) -> "MmaStats":
        return self._map(lambda t: t[index])

    def to(self, device) -> "MmaStats":
        return self._map(lambda t: t.to(device))


def _check_stats_chunk(stats_chunk: Optional[int], block_k: int) -> int:
    """k-blocks per split-K partial (0: none)."""
    if stats_chunk is None:
        return 0
    if isinstance(stats_chunk, bool) or not isinstance(stats_chunk, int) or stats_chunk <= 0 or stats_chunk % block_k:
        raise ValueError(f"stats_chunk={stats_chunk!r} must be a positive multiple of block_k={block_k}")
    return stats_chunk // block_k


def trajectory_stats(traj: torch.Tensor, s_traj: torch.Tensor, stats_chunk: Optional[int] = None,
                     block_k: int = 1, q: Optional[torch.Tensor] = None) -> MmaStats:
    """The statistics after every k-block of a trajectory (traj, s_traj: [..., n_kb, R, C], the
    accumulator and S after each k-block), on the trajectory's device, one k-block at a time
    (float64 running values, float32 results); q, if given, is put in as is (else None). Each field is
    [..., n_kb, R, C]: field[..., j, :, :] describes the span of k-blocks 0..j (pabs / prun: as if
    the span ended at j, its last partial still open)."""
    kd = traj.dim() - 3
    n_kb = traj.shape[kd]
    c = _check_stats_chunk(stats_chunk, block_k)
    shape = tuple(traj.shape)
    if not c and n_kb:
        return _trajectory_stats_scan(traj, s_traj, kd, q)
    out = {f: torch.zeros(shape, dtype=torch.float32, device=traj.device) for f in ("l", "v", "pabs", "prun")}
    one = traj.select(kd, 0).double() if n_kb else torch.zeros((), dtype=torch.float64, device=traj.device)
    x = torch.zeros_like(one)
    lo, hi, l, v = x.clone(), x.clone(), x.clone(), x.clone()
    s_prev = torch.zeros_like(one)
    closed_abs, closed_run, mark = x.clone(), x.clone(), x.clone()
    for j in range(n_kb):
        s_j = s_traj.select(kd, j).double()
        m = torch.maximum(x - lo, hi - x) + (s_j - s_prev)
        l = l + m
        v = v + m * m
        x = traj.select(kd, j).double()
        lo = torch.minimum(lo, x)
        hi = torch.maximum(hi, x)
        s_prev = s_j
        out["l"].select(kd, j).copy_(l)
        out["v"].select(kd, j).copy_(v)
        if c:
            out["pabs"].select(kd, j).copy_(closed_abs + (x - mark).abs())
            out["prun"].select(kd, j).copy_(closed_run + x.abs())
            if (j + 1) % c == 0:
                closed_abs = closed_abs + (x - mark).abs()
                closed_run = closed_run + x.abs()
                mark = x
    qq = None if q is None else q.to(torch.float32).expand(shape)
    return MmaStats(out["l"], out["v"], qq, out["pabs"], out["prun"])


def _trajectory_stats_scan(traj, s_traj, kd: int, q):
    """trajectory_stats without split-K partials, every k-block at once: the running minimum and
    maximum are scans, l and v running sums (a scan along a dimension that is not the last one adds
    in k-block order, as the loop does)."""
    x = traj.double()
    zero = torch.zeros_like(x.narrow(kd, 0, 1))
    lo = torch.cummin(torch.cat([zero, x], kd), kd).values.narrow(kd, 0, x.shape[kd])  # before each k-block
    hi = torch.cummax(torch.cat([zero, x], kd), kd).values.narrow(kd, 0, x.shape[kd])
    prev = torch.cat([zero, x.narrow(kd, 0, x.shape[kd] - 1)], kd)
    s = s_traj.double()
    s_prev = torch.cat([zero, s.narrow(kd, 0, s.shape[kd] - 1)], kd)
    m = torch.maximum(prev - lo, hi - prev) + (s - s_prev)
    l = torch.cumsum(m, kd).float()
    v = torch.cumsum(m * m, kd).float()
    qq = None if q is None else q.to(torch.float32).expand(tuple(traj.shape))
    return MmaStats(l, v, qq, torch.zeros_like(l), torch.zeros_like(l))


def mma_accumulate(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int, block_k: int, acc: str = "fp32",
                   promotion_interval: Optional[int] = None, scale_a: Optional[torch.Tensor] = None,
                   scale_b: Optional[torch.Tensor] = None, block_scale_group: Optional[Sequence[int]] = None,
                   with_abs_sum: bool = False, oob_fill: str = "zero", with_stats: bool = False,
                   stats_chunk: Optional[int] = None):
    """The whole accumulator [M, N] (fp32 / fp16 / int32 tensor per acc); with with_abs_sum also
    S[M, N] = sum_k |a_mk| |b_kn| (times |scales|) in fp32, from the same kernel. with_stats returns
    (acc, S, MmaStats) (module docstring; float accumulators only; stats_chunk: split-K partials)."""
    ad, bd = _validate_mm(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                          block_scale_group, oob_fill)
    dev = C.check_device(("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b))
    M, K = a.shape
    N = b.shape[1]
    if with_stats:
        return _accumulate_stats(a, b, ad, bd, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                                 block_scale_group, oob_fill, stats_chunk, dev)
    out = torch.empty((M, N), dtype=_ACC_TORCH[acc], device=dev)
    ob = C.bits_view(out)
    s = torch.empty((M, N), dtype=torch.float32, device=dev) if with_abs_sum else out
    cfg = _Cfg(ad, bd, acc, block_m, block_n, block_k, promotion_interval)
    ab, bb = C.bits_view(a), C.bits_view(b)
    sargs, smeta = _scale_args(scale_a, scale_b, block_scale_group, ab)
    if M and N:
        _mma_accumulate_kernel[(C.cdiv(M, block_m), C.cdiv(N, block_n))](
            ab, ab.stride(0), ab.stride(1), bb, bb.stride(0), bb.stride(1), M, N, K, C.cdiv(K, block_k), *sargs,
            ob, ob.stride(0), ob.stride(1), s, BK=block_k, WITH_ABS=with_abs_sum,
            N_KB_I=C.cdiv(K, block_k) if C.interpreting() else 0, **cfg.meta, **cfg.fill(oob_fill),
            **smeta, **C.launch_options(dev, cfg.num_warps))
    return (out, s) if with_abs_sum else out


# The statistics kernel's launch tile on the GPU. Each element's arithmetic depends on the k-blocks
# only, not on the output tile, so any launch tile gives the same bits; ten [BM, BN] fp32 tiles
# live in registers, and at 128 x 128 they spill (H200, 4096^3 bf16: 16.5 ms at 128 x 128, 2.1 ms
# at 64 x 32, every output bit the same). The interpreter keeps the problem's tile: it pays per step.
STATS_LAUNCH_TILE = (64, 32)


def _accumulate_stats(a, b, ad, bd, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                      block_scale_group, oob_fill, stats_chunk, dev, launch_tile=None):
    if launch_tile is None and not C.interpreting():
        launch_tile = STATS_LAUNCH_TILE
    if launch_tile is not None:
        block_m, block_n = launch_tile
    if acc == "int32":
        raise ValueError("with_stats describes float accumulation; acc='int32' is exact and needs no statistics")
    chunk_kb = _check_stats_chunk(stats_chunk, block_k)
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), dtype=_ACC_TORCH[acc], device=dev)
    ob = C.bits_view(out)
    s = torch.empty((M, N), dtype=torch.float32, device=dev)
    st = torch.zeros((5, M, N), dtype=torch.float32, device=dev)
    cfg = _Cfg(ad, bd, acc, block_m, block_n, block_k, promotion_interval)
    ab, bb = C.bits_view(a), C.bits_view(b)
    sargs, smeta = _scale_args(scale_a, scale_b, block_scale_group, ab)
    if M and N:
        n_kb = C.cdiv(K, block_k)
        _mma_stats_kernel[(C.cdiv(M, block_m), C.cdiv(N, block_n))](
            ab, ab.stride(0), ab.stride(1), bb, bb.stride(0), bb.stride(1), M, N, K, n_kb, *sargs,
            ob, ob.stride(0), ob.stride(1), s, st, M * N, BK=block_k, CHUNK_KB=chunk_kb,
            WITH_Q=ad == "fp32" and bd == "fp32", BKP=C.pad_dim(block_k), N_KB_I=n_kb if C.interpreting() else 0,
            **cfg.meta, **cfg.fill(oob_fill), **smeta, **C.launch_options(dev, cfg.num_warps))
    return out, s, MmaStats(st[0], st[1], st[2], st[3], st[4])


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
    """One k-block on float64 operands a [..., R, BK], b [..., BK, Cn] (module docstring)."""
    bk = a.shape[-1]
    if with_abs:
        sabs = torch.abs(a) @ torch.abs(b)
        s_acc = s_acc + (sabs * torch.abs(scale) if scale is not None else sabs)
    if acc_kind == "int32":
        return _wrap_i32(acc + a @ b), s_acc
    if acc_kind == "fp16":
        for k0 in range(0, bk, mma_k):
            s = C.f32(a[..., k0:k0 + mma_k] @ b[..., k0:k0 + mma_k, :])
            acc = _f16(C.f32(acc + s))
        return acc, s_acc
    if promotion_interval is None:
        parts = [C.f32(a @ b)]
    else:
        parts = []
        for c0 in range(0, bk, promotion_interval):
            q = torch.zeros_like(acc)
            for k0 in range(c0, c0 + promotion_interval, mma_k):
                s = C.f32(a[..., k0:k0 + mma_k] @ b[..., k0:k0 + mma_k, :])
                q = truncate_mantissa_host(C.f32(q + s))
            parts.append(q)
    for p in parts:
        acc = C.f32(acc + (C.f32(p * scale) if scale is not None else p))
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
    reasons = check_supported(ad, bd, acc, BM, BN, BK, promotion_interval, None, scaled)
    if reasons:
        raise C.reasons_error(reasons)
    a = a_tile.detach().cpu().to(torch.float64)
    b = b_tile.detach().cpu().to(torch.float64)
    lead = tuple(a.shape[:-2])
    prev = torch.zeros(lead + (BM, BN), dtype=torch.float64) if acc_prev is None else \
        acc_prev.detach().cpu().to(torch.float64)
    scale = None
    if scaled:
        scale = C.f32(scale_a.detach().cpu().double()[..., :, None] * scale_b.detach().cpu().double()[..., None, :])
    out, s = _kblock_host(prev, torch.zeros_like(prev), a, b, acc, mma_k_of(ad, bd), promotion_interval, scale,
                          with_abs_sum)
    return (out, s) if with_abs_sum else out


def _scale_tile_host(scale_a, scale_b, group, kb, block_k, rows: torch.Tensor, cols: torch.Tensor, M: int, N: int):
    """fp32(sa * sb) for the k-block; rows past M and columns past N get scale 0 (as the kernel)."""
    gm, gn, gk = group
    kc = kb * block_k // gk
    sa = scale_a.detach().cpu().double()
    sb = scale_b.detach().cpu().double()
    ra = torch.where(rows < M, sa[torch.clamp(rows // gm, max=sa.shape[0] - 1), kc], 0.0)
    cb = torch.where(cols < N, sb[torch.clamp(cols // gn, max=sb.shape[0] - 1), kc], 0.0)
    return C.f32(ra[..., :, None] * cb[..., None, :])


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
    _validate_mm(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b, block_scale_group,
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
    ad, bd = _validate_mm(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                          block_scale_group, oob_fill)
    M, N = a.shape[0], b.shape[1]
    row_idx = torch.arange(M)[None, :]
    col_idx = torch.arange(N)[None, :]
    if with_stats:
        if acc == "int32":
            raise ValueError("with_stats describes float accumulation; acc='int32' is exact and needs no statistics")
        _check_stats_chunk(stats_chunk, block_k)
        traj, straj = _trajectory_host(a, b, row_idx, col_idx, block_k, acc, promotion_interval, scale_a, scale_b,
                                       block_scale_group, oob_fill, True)
        if traj.shape[1] == 0:
            z = torch.zeros((M, N), dtype=torch.float64)
            return z, z.clone(), MmaStats(z, z.clone(), z.clone(), z.clone(), z.clone())
        q = torch.zeros((M, N), dtype=torch.float64)  # as the kernel: 0 unless both operands are fp32
        if ad == "fp32" and bd == "fp32":
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


@dataclass(frozen=True)
class SampleProducts:
    """The device half of `mma_sample_host`: every accumulation step's products of the sampled
    elements, rounded as the accumulator receives them, for `mma_sample_finish` on the CPU.
    p [T, steps, R, C] (int32: already summed and wrapped, [T, R, C]); s the float64 sum |a||b|
    (times |scales|) [T, R, C]; scale the fp32 block scales per k-block [T, n_kb, R, C] or None."""

    p: torch.Tensor
    s: torch.Tensor
    scale: Optional[torch.Tensor]
    acc: str
    promotion_interval: Optional[int]
    mma_k: int
    block_k: int

    def tensors(self) -> list[torch.Tensor]:
        return [self.p, self.s] + ([self.scale] if self.scale is not None else [])

    def with_tensors(self, tensors: Sequence[torch.Tensor]) -> "SampleProducts":
        """The same products held by `tensors` (as `tensors()` lists them: moved to the host, say)."""
        return SampleProducts(tensors[0], tensors[1], tensors[2] if self.scale is not None else None, self.acc,
                              self.promotion_interval, self.mma_k, self.block_k)


def mma_sample_products(a: torch.Tensor, b: torch.Tensor, rows, cols, block_m: int, block_n: int, block_k: int,
                        acc: str = "fp32", promotion_interval: Optional[int] = None,
                        scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                        block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero") -> SampleProducts:
    """`mma_sample_host`'s products on the operands' device (batched float64 torch matmuls), with
    no host round trip: `mma_sample_finish` of them, on the CPU, is the host spec."""
    ad, bd = _validate_mm(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                          block_scale_group, oob_fill)
    dev = a.device
    rows = torch.as_tensor(rows, dtype=torch.int64).to(dev)
    cols = torch.as_tensor(cols, dtype=torch.int64).to(dev)
    M, K = a.shape
    N = b.shape[1]
    T, R = rows.shape
    Cn = cols.shape[1]
    n_kb = C.cdiv(K, block_k)
    kp = n_kb * block_k
    mk = mma_k_of(ad, bd)
    fill = float("nan") if oob_fill == "nan" else 0.0
    A = torch.full((T, R, kp), fill, dtype=torch.float64, device=dev)
    A[:, :, :K] = torch.where((rows < M)[..., None], a.detach().to(dev)[rows.clamp(max=M - 1)].double(), fill)
    B = torch.full((T, kp, Cn), fill, dtype=torch.float64, device=dev)
    B[:, :K, :] = torch.where((cols < N)[:, None, :], b.detach().to(dev)[:, cols.clamp(max=N - 1)].permute(1, 0, 2)
                              .double(), fill)
    step = kp if acc == "int32" else (mk if acc == "fp16" or promotion_interval is not None else block_k)
    n_steps = kp // step

    def per_step(x, y, k):  # [T, R, kp] x [T, kp, C] -> [T, kp // k, R, C], one product per k-slice
        n = kp // k
        return torch.matmul(x.view(T, R, n, k).transpose(1, 2), y.view(T, n, k, Cn))

    scale = None
    if scale_a is not None:  # fp32(sa * sb) per k-block, 0 past M / N: [T, n_kb, R, C]
        gm, gn, gk = block_scale_group
        kc = torch.arange(n_kb, device=dev) * block_k // gk
        sa, sb = scale_a.detach().to(dev).double(), scale_b.detach().to(dev).double()
        ra = torch.where((rows < M)[..., None], sa[(rows // gm).clamp(max=sa.shape[0] - 1)][..., kc], 0.0)
        cb = torch.where((cols < N)[..., None], sb[(cols // gn).clamp(max=sb.shape[0] - 1)][..., kc], 0.0)
        scale = C.f32(ra.transpose(1, 2)[..., :, None] * cb.transpose(1, 2)[..., None, :])
    sabs = per_step(A.abs(), B.abs(), block_k) if n_kb else A.new_zeros((T, 0, R, Cn))
    s = (sabs * scale.abs() if scale is not None else sabs).sum(1)
    p = per_step(A, B, step) if n_steps else A.new_zeros((T, 0, R, Cn))
    p = _wrap_i32(p.sum(1)) if acc == "int32" else C.f32(p)
    return SampleProducts(p, s, scale, acc, promotion_interval, mk, block_k)


def mma_sample_finish(products: SampleProducts):
    """The roundings the accumulator makes, in order, on the products of `mma_sample_products`
    (CPU tensors): fp32 sums by numpy's sequential accumulate in float32 (each addition rounded to
    nearest, as acc = fp32(acc + p)), the fp16 and promotion chains step by step on [T, R, C].
    Returns CPU float64 (acc, S) [T, R, C]."""
    p, s, scale = products.p, products.s, products.scale
    if products.acc == "int32":
        return p, s
    T, n_steps, R, Cn = p.shape
    if products.acc == "fp16":
        out = np.zeros((T, R, Cn), dtype=np.float16)
        for j in range(n_steps):  # acc = fp16(fp32(acc + s)) after every MMA step
            out = (out.astype(np.float32) + p[:, j].float().numpy()).astype(np.float16)
        return torch.from_numpy(out.astype(np.float64)), s
    if products.promotion_interval is not None:  # q = trunc13(fp32(q + s)) inside each chunk, from zero
        per = products.promotion_interval // products.mma_k
        steps = p.view(T, n_steps // per, per, R, Cn)
        q = torch.zeros_like(steps[:, :, 0])
        for j in range(per):
            q = truncate_mantissa_host(C.f32(q + steps[:, :, j]))
        p = q
        if scale is not None:
            scale = scale.repeat_interleave(products.block_k // products.promotion_interval, dim=1)
    if scale is not None:
        p = C.f32(p * scale)
    if p.shape[1] == 0:
        return torch.zeros((T, R, Cn), dtype=torch.float64), s
    summed = np.add.accumulate(p.float().numpy(), axis=1, dtype=np.float32)[:, -1]  # sequential, rounded each step
    return torch.from_numpy(summed.astype(np.float64)) + 0.0, s


def mma_sample_host(a: torch.Tensor, b: torch.Tensor, rows, cols, block_m: int, block_n: int, block_k: int,
                    acc: str = "fp32", promotion_interval: Optional[int] = None,
                    scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                    block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero"):
    """Host spec of the accumulator after the last k-block at the elements rows[t] x cols[t] of
    each sample t (global indices [T, R] and [T, C]; past M / N the out-of-bounds fill), and S.

    The same semantics as `mma_trajectory_host`, vectorised over k-blocks: every k-block's (or MMA
    step's) product is one batched float64 matmul on the operands' device (torch, not Triton,
    `mma_sample_products`), then the roundings the accumulator makes, in order, on the CPU
    (`mma_sample_finish`). Returns CPU float64 (acc, S) [T, R, C]."""
    sp = mma_sample_products(a, b, rows, cols, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                             block_scale_group, oob_fill)
    parts = sp.tensors()
    host = torch.cat([x.reshape(-1) for x in parts]).cpu().split([x.numel() for x in parts])  # one copy
    return mma_sample_finish(sp.with_tensors([h.view(x.shape) for h, x in zip(host, parts)]))


# ----------------------------------------------------------------------------------------------
# partials (split-K, stream-K)
# ----------------------------------------------------------------------------------------------


def _k_slice(a: torch.Tensor, b: torch.Tensor, block_k: int, kb_begin: int, kb_end: int, scales) -> tuple:
    n_kb = C.cdiv(a.shape[1], block_k)
    if not (isinstance(kb_begin, int) and isinstance(kb_end, int) and 0 <= kb_begin < kb_end <= n_kb):
        raise ValueError(f"partial k-blocks {kb_begin}..{kb_end} must satisfy 0 <= begin < end <= {n_kb}")
    if any(s is not None for s in scales):
        raise ValueError("a partial with block scales is not modelled: pass no scale_a / scale_b")
    k0, k1 = kb_begin * block_k, min(a.shape[1], kb_end * block_k)
    return a[:, k0:k1], b[k0:k1]


def partial_trajectory(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                       kb_begin: int, kb_end: int, **kw):
    """The accumulator of a partial that sums k-blocks kb_begin..kb_end-1 from zero, after each of
    them: [T, kb_end - kb_begin, BM, BN] (mma_trajectory of the operands' k-slice; same keywords)."""
    a_s, b_s = _k_slice(a, b, block_k, kb_begin, kb_end, (kw.get("scale_a"), kw.get("scale_b")))
    return mma_trajectory(a_s, b_s, tiles, block_m, block_n, block_k, **kw)


def partial_trajectory_host(a: torch.Tensor, b: torch.Tensor, tiles, block_m: int, block_n: int, block_k: int,
                            kb_begin: int, kb_end: int, **kw):
    """Host spec of `partial_trajectory` (float64 CPU)."""
    a_s, b_s = _k_slice(a, b, block_k, kb_begin, kb_end, (kw.get("scale_a"), kw.get("scale_b")))
    return mma_trajectory_host(a_s, b_s, tiles, block_m, block_n, block_k, **kw)

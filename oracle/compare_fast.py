"""One-pass per-tile comparison: the same `Comparison` as `oracle.compare.compare_reference`, from a
single read of the data, with extra memory O(number of tiles).

Data path:
  1. fast pass   `_fast_kernel`: one Triton program per strip (`rows_per_program` rows of one tile)
                 reads received, expected, and the bound and the mask when given, once, computes in
                 float32 and writes one row of partial statistics (counts, maxima, sums). The
                 per-element bound is a tensor, or `atol + rtol * |expected|` computed inline (no
                 bound tensor is read; `inline_bound` gives the same tensor), or none (bit-exact: bit
                 patterns compared, NaN matches NaN, -0 differs from +0).
  2. float64     a program keeps its float32 row only when the pass vouches for it: every element
     pass        within its bound, every difference r - e exact in float32, everything finite. It
                 marks its strip otherwise, and `_general_kernel` (a few persistent programs that
                 scan the marks) redoes the marked strips in float64, element by element the way the
                 reference computes, and locates each strip's first bad element.
  3. fold        a few torch operations fold the rows of each tile into one, in float64.
  4. details     only failing tiles (up to `max_detail_tiles`) get a second look: their first bad
                 elements, in bounded chunks of rows from the first bad one.
So counts, max_abs_err, NaN/Inf counts, `trivial` and the first bad elements are identical to the
reference; sums (rel_l2, cosine, amplification) differ only by summation order; max_ratio and
max_rel_err of tiles the fast pass vouches for are float32 quotients (within 2^-21 relative on the
GPU, correctly rounded float32 under the interpreter).

Exact differences: a value of a type with P significant bits is a multiple of its ulp > |x| 2^-P, so
r - e is a float32 number when |r - e| <= 2^(23-P) min(|r|, |e|) (P = 24 for float32: TwoSum checks
those instead). Such a check runs per element for bound tensors. With rtol/atol it does not: an
inexact difference within the bound needs min(|r|, |e|) tiny, so |r - e| <= t0 ~ atol / (1 - rtol);
the largest difference of a strip that exceeds t0 is therefore exact, and a strip whose largest
difference does not goes to the float64 pass. The float64 pass also takes what float32 would get
wrong: sums of squares that overflow or underflow, nonzero differences under bounds below 2^-100,
maxima of quotients below 2^-26 (the GPU's fast division flushes differences below 2^-126).

Constraints: 2-D tensors of one shape; dtypes float32, float16, bfloat16, every 1-byte float8,
float64, bool and integers (float64 and 32/64-bit integers take the float64 pass only); a bound
tensor of a float dtype and a bool mask, each broadcastable to the shape.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Optional

import torch

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on

import triton
import triton.language as tl
from triton.language.extra import libdevice

from oracle.compare import FIRST_BAD, BadElement, Comparison, Status, TileMetrics, combine

# Element kinds: how a kernel turns the raw bits it loads into a value.
K_F32, K_F16, K_BF16, K_LUT, K_INT, K_F64, K_WIDE_INT = 0, 1, 2, 3, 4, 5, 6
# Bound modes.
B_EXACT, B_INLINE, B_TENSOR = 0, 1, 2
# How the fast pass proves that r - e is exact in float32: always exact (0), by the magnitudes
# (1: |r - e| <= 2^(23-P) min(|r|, |e|) for types of at most P significant bits), by TwoSum (2).
SUB_ALWAYS, SUB_SCALED, SUB_TWOSUM = 0, 1, 2

# Columns of a row of partial statistics.
(S_COMPARED, S_BAD, S_NAN_R, S_NAN_E, S_INF_R, S_INF_E, S_INFO, S_MAX_ABS, S_MAX_REL, S_MAX_RATIO,
 S_RATIO_NAN, S_D2, S_E2, S_R2, S_DOT, S_SUM_R, S_SUM_E, S_FIRST_BAD, S_GENERAL) = range(19)
NSTAT = 19
_NO_BAD = 2.0 ** 62  # "no bad element" in S_FIRST_BAD; larger than any linear index
_DETAIL_CHUNK = 1 << 18  # elements per chunk of the second look at a failing tile
MAX_PROGRAMS_PER_TILE = 2048  # bounds the partial rows of a big tile (enough programs to fill a GPU)
# The GPU's fma chains and single combined reduction are slow under the interpreter (nested calls,
# a tuple reduced element by element); tests switch them on there to check their arithmetic.
_FUSED_IN_INTERPRETER = False

_B_MIN = 2.0 ** -100  # bounds below this only pass exact zeros on the fast pass (quotients stay exact)


@dataclass(frozen=True)
class FastConfig:
    """Launch shape of the fast pass: `rows_per_program` rows of one tile (and up to 256 of its
    columns) per program, `block_m` rows per loop step (up to 128 columns a step)."""
    rows_per_program: int = 128
    block_m: int = 16
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        for name in ("rows_per_program", "block_m", "num_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0 or v & (v - 1):
                raise ValueError(f"FastConfig.{name} = {v!r}: expected a positive power of two")
        if self.block_m > self.rows_per_program:
            raise ValueError(f"FastConfig.block_m = {self.block_m} exceeds rows_per_program = "
                             f"{self.rows_per_program}: expected block_m <= rows_per_program")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 4:
            raise ValueError(f"FastConfig.num_stages = {self.num_stages!r}: expected 1..4")


DEFAULT_CONFIG = FastConfig(128, 16, 4)
# Candidates the benchmark tries (the fastest is chosen in the run that measures it).
CANDIDATE_CONFIGS = (
    FastConfig(128, 8, 4), FastConfig(128, 16, 4), FastConfig(64, 16, 4), FastConfig(64, 8, 4),
    FastConfig(128, 32, 4), FastConfig(128, 8, 2), FastConfig(32, 32, 4), FastConfig(64, 32, 8),
    FastConfig(128, 32, 8), FastConfig(64, 64, 8), FastConfig(128, 16, 4, 3), FastConfig(32, 16, 2),
    FastConfig(128, 64, 16),
)


# ----------------------------------------------------------------------------------------------
# dtypes


@dataclass(frozen=True)
class _Kind:
    kind: int
    view: torch.dtype  # the integer dtype the kernel loads the raw bits as
    bits: int  # significant bits P: |x| * 2^-P < ulp(x) for every value x of the dtype
    quantum: float  # every value is a multiple of this
    max: float  # largest magnitude


def _kind(dt: torch.dtype) -> Optional[_Kind]:
    if dt == torch.float32:
        return _Kind(K_F32, torch.int32, 24, 2.0 ** -149, float(torch.finfo(dt).max))
    if dt == torch.float16:
        return _Kind(K_F16, torch.uint16, 11, 2.0 ** -24, 65504.0)
    if dt == torch.bfloat16:
        return _Kind(K_BF16, torch.uint16, 8, 2.0 ** -133, float(torch.finfo(dt).max))
    if dt == torch.float64:
        return _Kind(K_F64, torch.int64, 53, 0.0, math.inf)
    if dt.is_floating_point and dt.itemsize == 1 and not dt.is_complex:
        fi = torch.finfo(dt)
        p = 1 - int(round(math.log2(fi.eps)))
        return _Kind(K_LUT, torch.uint8, p, fi.tiny * fi.eps, float(fi.max))
    if dt == torch.bool:
        return _Kind(K_INT, torch.uint8, 1, 1.0, 1.0)
    if dt in (torch.int8, torch.uint8):
        return _Kind(K_INT, dt, 8, 1.0, 255.0)
    if dt == torch.int16:
        return _Kind(K_INT, dt, 16, 1.0, 32768.0)
    if dt in (torch.int32, torch.int64):
        return _Kind(K_WIDE_INT, dt, 64, 1.0, math.inf)
    return None


def check_supported(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
                    mask: Optional[torch.Tensor] = None, rtol: Optional[float] = None,
                    atol: Optional[float] = None) -> list[str]:
    """Reasons why compare_fast cannot take these inputs (empty: it can)."""
    reasons = []
    if received.shape != expected.shape:
        reasons.append(f"received shape {tuple(received.shape)} != expected shape {tuple(expected.shape)}")
    if received.dim() != 2:
        reasons.append(f"compare takes 2-D tensors, got {received.dim()}-D")
    for name, t in (("received", received), ("expected", expected)):
        if _kind(t.dtype) is None:
            reasons.append(f"{name} dtype {t.dtype} is not supported (float, bool or integer expected)")
    if bound is not None:
        if not bound.dtype.is_floating_point or _kind(bound.dtype) is None:
            reasons.append(f"bound dtype {bound.dtype} is not supported (a float dtype expected)")
        if rtol is not None or atol is not None:
            reasons.append("give either a bound tensor or rtol/atol, not both")
    if (rtol is None) != (atol is None):
        reasons.append("rtol and atol go together (give both or neither)")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            reasons.append(f"{name} = {v!r}: expected a finite number >= 0")
    if mask is not None and mask.dtype != torch.bool:
        reasons.append(f"mask dtype {mask.dtype} is not supported (bool expected)")
    if received.device.type not in ("cuda", "cpu"):
        reasons.append(f"device {received.device} is not supported (cuda, or cpu under TRITON_INTERPRET=1)")
    elif received.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        reasons.append("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
    return reasons


def inline_bound(expected: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """The bound tensor that rtol/atol stand for: atol + rtol * |expected|, evaluated in float32
    (expected rounded to float32, a product and a sum, each rounded once), exactly as the kernel
    computes it inline."""
    e = expected.to(torch.float32).abs()
    r = torch.tensor(float(rtol), dtype=torch.float32, device=e.device)
    a = torch.tensor(float(atol), dtype=torch.float32, device=e.device)
    return e.mul(r).add(a)


# ----------------------------------------------------------------------------------------------
# the statistics kernel


@triton.jit
def _decode32(bits, lut_ptr, KIND: tl.constexpr):
    """Raw bits -> float32 value (kinds whose values float32 holds exactly)."""
    if KIND == 0:  # K_F32
        v = bits.to(tl.float32, bitcast=True)
    elif KIND == 1:  # K_F16
        v = bits.to(tl.float16, bitcast=True).to(tl.float32)
    elif KIND == 2:  # K_BF16: the bf16 bits are the upper half of the float32 bits
        v = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif KIND == 3:  # K_LUT: 1-byte floats through a 256-entry table
        v = tl.load(lut_ptr + bits.to(tl.int32))
    elif KIND == 5:  # K_F64 (a bound tensor on the fast pass)
        v = bits.to(tl.float64, bitcast=True).to(tl.float32)
    else:  # K_INT, K_WIDE_INT
        v = bits.to(tl.float32)
    return v


@triton.jit
def _decode64(bits, lut_ptr, KIND: tl.constexpr):
    """Raw bits -> float64 value, as torch's .to(torch.float64) gives it."""
    if KIND == 5:  # K_F64
        v = bits.to(tl.float64, bitcast=True)
    elif KIND == 4:
        v = bits.to(tl.float64)
    elif KIND == 6:
        v = bits.to(tl.float64)
    else:
        v = _decode32(bits, lut_ptr, KIND).to(tl.float64)
    return v


@triton.jit
def _div(x, y, APPROX: tl.constexpr):
    """x / y: the approximate division on the GPU (2 ulp, divisors within [2^-126, 2^126])."""
    if APPROX:
        q = libdevice.fast_dividef(x, y)
    else:
        q = x / y
    return q


@triton.jit
def _bound32(e_abs, rtol, atol, RN: tl.constexpr):
    """atol + rtol * |e| in float32, a product and a sum each rounded once (never fused)."""
    if RN:
        b = libdevice.add_rn(libdevice.mul_rn(e_abs, rtol), atol)
    else:
        b = e_abs * rtol + atol
    return b


@triton.jit
def _load_pairs(ptr, rows64, s_h, col, BM: tl.constexpr, BN: tl.constexpr):
    """BN bf16 values per row read as BN // 2 int32 words -> [BM, BN] int32 with each value's bits
    in the upper half (the float32 bits of the value), in column order."""
    x = tl.load(ptr + rows64[:, None] * s_h + (col // 2 + tl.arange(0, BN // 2))[None, :])
    return tl.reshape(tl.join(x << 16, x & -65536), (BM, BN))


@triton.jit
def _chain2(x, y, acc):
    x0, x1 = tl.split(x)
    y0, y1 = tl.split(y)
    return tl.fma(x1, y1, tl.fma(x0, y0, acc))


@triton.jit
def _chain4(x, y, acc):
    x0, x1 = tl.split(x)
    y0, y1 = tl.split(y)
    return _chain2(x1, y1, _chain2(x0, y0, acc))


@triton.jit
def _chain8(x, y, acc):
    x0, x1 = tl.split(x)
    y0, y1 = tl.split(y)
    return _chain4(x1, y1, _chain4(x0, y0, acc))


@triton.jit
def _fdot(x, y, acc, BM: tl.constexpr, BN: tl.constexpr, VEC: tl.constexpr):
    """acc [BM, BN // VEC] + the sum of x * y over each thread's VEC columns, as one chain of fmas."""
    if VEC == 1:
        out = tl.fma(tl.reshape(x, (BM, BN)), tl.reshape(y, (BM, BN)), acc)
    elif VEC == 2:
        out = _chain2(tl.reshape(x, (BM, BN // 2, 2)), tl.reshape(y, (BM, BN // 2, 2)), acc)
    elif VEC == 4:
        out = _chain4(tl.reshape(x, (BM, BN // 4, 2, 2)), tl.reshape(y, (BM, BN // 4, 2, 2)), acc)
    elif VEC == 8:
        out = _chain8(tl.reshape(x, (BM, BN // 8, 2, 2, 2)), tl.reshape(y, (BM, BN // 8, 2, 2, 2)), acc)
    else:
        out = acc + tl.sum(tl.reshape(x * y, (BM, BN // VEC, VEC)), axis=2)
    return out


@triton.jit
def _combine_stats(x0, x1, x2, x3, x4, x5, x6, x7, x8, y0, y1, y2, y3, y4, y5, y6, y7, y8):
    """Three maxima and six sums, reduced together (one pass through shared memory)."""
    return (tl.maximum(x0, y0), tl.maximum(x1, y1), tl.maximum(x2, y2), x3 + y3, x4 + y4, x5 + y5, x6 + y6,
            x7 + y7, x8 + y8)


@triton.jit
def _store_row(out_ptr, pid, compared, bad, nan_r, nan_e, inf_r, inf_e, info, max_abs, max_rel, max_ratio,
               ratio_nan, d2, e2, r2, dot, sum_r, sum_e, first_bad, general):
    base = out_ptr + tl.cast(pid, tl.int64) * 19
    tl.store(base + 0, tl.cast(compared, tl.float64))
    tl.store(base + 1, tl.cast(bad, tl.float64))
    tl.store(base + 2, tl.cast(nan_r, tl.float64))
    tl.store(base + 3, tl.cast(nan_e, tl.float64))
    tl.store(base + 4, tl.cast(inf_r, tl.float64))
    tl.store(base + 5, tl.cast(inf_e, tl.float64))
    tl.store(base + 6, tl.cast(info, tl.float64))
    tl.store(base + 7, tl.cast(max_abs, tl.float64))
    tl.store(base + 8, tl.cast(max_rel, tl.float64))
    tl.store(base + 9, tl.cast(max_ratio, tl.float64))
    tl.store(base + 10, tl.cast(ratio_nan, tl.float64))
    tl.store(base + 11, tl.cast(d2, tl.float64))
    tl.store(base + 12, tl.cast(e2, tl.float64))
    tl.store(base + 13, tl.cast(r2, tl.float64))
    tl.store(base + 14, tl.cast(dot, tl.float64))
    tl.store(base + 15, tl.cast(sum_r, tl.float64))
    tl.store(base + 16, tl.cast(sum_e, tl.float64))
    tl.store(base + 17, tl.cast(first_bad, tl.float64))
    tl.store(base + 18, tl.cast(general, tl.float64))


@triton.jit
def _fast_pass(out_ptr, pid, r_ptr, e_ptr, b_ptr, m_ptr, lut_r_ptr, lut_e_ptr, rp_ptr, ep_ptr,
               ti, tj, k, G, NS, NSUB_N, H, W, TH, TW, PM, PN,
               s_rh, s_rw, s_eh, s_ew, s_bh, s_bw, s_mh, s_mw, s_rph, s_eph, rtol, atol, t0,
               R_KIND: tl.constexpr, E_KIND: tl.constexpr, B_KIND: tl.constexpr, B_MODE: tl.constexpr,
               HAS_MASK: tl.constexpr, EVEN: tl.constexpr, SUB_MODE: tl.constexpr, SUB_K: tl.constexpr,
               CHECK_SUB: tl.constexpr, ON_GPU: tl.constexpr, PAIRS: tl.constexpr, FUSED: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, VEC: tl.constexpr):
    """The float32 pass over the strips k, k + G, ... of tile (ti, tj). Stores its row and returns
    True when the pass vouches for it (see the module docstring); returns False (storing nothing)
    otherwise."""
    FS: tl.constexpr = (BM, BN // VEC, VEC)  # each thread's VEC columns on the last axis
    ar_m = tl.arange(0, BM)
    ar_n = tl.arange(0, BN)
    z = tl.zeros([BM, BN // VEC], tl.float32)
    a_flag = z - float("inf")  # max of |r - e| - (the largest |r - e| proven ok): must end < 0 (or <= 0)
    a_abs = z
    a_rel = z
    a_ratio = z
    a_d2 = z
    a_e2 = z
    a_r2 = z
    a_dot = z
    a_sr = z
    a_se = z
    a_sb = z
    a_keep = tl.zeros([BM, BN // VEC], tl.int32)
    a_x = tl.zeros([BM, BN // VEC], tl.int32)
    n_in = k * 0
    for st in range(k, NS, G):
        row0, col0, row_end, col_end = _strip(st, ti, tj, H, W, TH, TW, PM, PN, NSUB_N)
        n_in += tl.maximum(row_end - row0, 0) * tl.maximum(col_end - col0, 0)
        for rr in range(0, PM, BM):
            rows64 = (row0 + rr + ar_m).to(tl.int64)
            for cc in range(0, PN, BN):
                cols = col0 + cc + ar_n
                o_r = rows64[:, None] * s_rh + cols[None, :] * s_rw
                o_e = rows64[:, None] * s_eh + cols[None, :] * s_ew
                if PAIRS:
                    keep = None
                    br = _load_pairs(rp_ptr, rows64, s_rph, col0 + cc, BM, BN)
                    be = _load_pairs(ep_ptr, rows64, s_eph, col0 + cc, BM, BN)
                elif EVEN:
                    if HAS_MASK:
                        keep = tl.load(m_ptr + rows64[:, None] * s_mh + cols[None, :] * s_mw) != 0
                        br = tl.load(r_ptr + o_r, mask=keep, other=0)
                        be = tl.load(e_ptr + o_e, mask=keep, other=0)
                    else:
                        keep = None
                        br = tl.load(r_ptr + o_r)
                        be = tl.load(e_ptr + o_e)
                else:
                    keep = (rows64 < row_end)[:, None] & (cols < col_end)[None, :]
                    if HAS_MASK:
                        keep = keep & (tl.load(m_ptr + rows64[:, None] * s_mh + cols[None, :] * s_mw,
                                               mask=keep, other=0) != 0)
                    br = tl.load(r_ptr + o_r, mask=keep, other=0)
                    be = tl.load(e_ptr + o_e, mask=keep, other=0)
                if HAS_MASK or not EVEN:
                    a_keep += tl.sum(tl.reshape(keep.to(tl.int32), FS), axis=2)
                if PAIRS:
                    r = br.to(tl.float32, bitcast=True)
                    e = be.to(tl.float32, bitcast=True)
                else:
                    r = _decode32(br, lut_r_ptr, R_KIND)
                    e = _decode32(be, lut_e_ptr, E_KIND)
                ae = tl.abs(e)
                if B_MODE == 0:
                    a_x = a_x | tl.max(tl.reshape((br != be).to(tl.int32), FS), axis=2)
                    if FUSED:
                        a_e2 = _fdot(e, e, a_e2, BM, BN, VEC)
                    else:
                        a_e2 += tl.sum(tl.reshape(e * e, FS), axis=2)
                    a_se += tl.sum(tl.reshape(ae, FS), axis=2)
                else:
                    d = r - e
                    ad = tl.abs(d)
                    if B_MODE == 1:
                        b = _bound32(ae, rtol, atol, ON_GPU)
                    else:
                        o_b = rows64[:, None] * s_bh + cols[None, :] * s_bw
                        if EVEN and not HAS_MASK:
                            bb = tl.load(b_ptr + o_b)
                        else:
                            bb = tl.load(b_ptr + o_b, mask=keep, other=0)
                        if B_KIND == 5:
                            b64 = bb.to(tl.float64, bitcast=True)
                            b = b64.to(tl.float32)
                        else:
                            b = _decode32(bb, lut_e_ptr, B_KIND)
                        a_sb += tl.sum(tl.reshape(b, FS), axis=2)
                    t = b
                    if CHECK_SUB:
                        if SUB_MODE == 1:
                            t = tl.minimum(b, tl.minimum(tl.abs(r), ae) * SUB_K)
                        elif SUB_MODE == 2:
                            bv = d - r
                            lo = (r - (d - bv)) + (-e - bv)
                            a_x = a_x | tl.max(tl.reshape((lo != 0.0).to(tl.int32), FS), axis=2)
                        # a nonzero difference needs a bound >= 2^-100 (see the quotients below)
                        t = tl.where(b >= 7.888609052210118e-31, t, 0.0)
                    if B_KIND == 5:
                        # a float64 bound: the float32 copy above serves the quotient; judge in float64
                        if CHECK_SUB and SUB_MODE == 1:
                            t64 = tl.minimum(b64, (tl.minimum(tl.abs(r), ae) * SUB_K).to(tl.float64))
                        else:
                            t64 = b64
                        t64 = tl.where(b >= 7.888609052210118e-31, t64, 0.0)
                        a_x = a_x | tl.max(tl.reshape((ad.to(tl.float64) > t64).to(tl.int32), FS), axis=2)
                    elif CHECK_SUB:
                        a_flag = tl.maximum(a_flag, tl.max(tl.reshape(ad - t, FS), axis=2))
                    if B_MODE == 1 and not CHECK_SUB:
                        ratio = _div(ad, b, ON_GPU)
                    else:
                        ratio = tl.where(ad > 0.0, _div(ad, b, ON_GPU), 0.0)
                    a_abs = tl.maximum(a_abs, tl.max(tl.reshape(ad, FS), axis=2))
                    a_ratio = tl.maximum(a_ratio, tl.max(tl.reshape(ratio, FS), axis=2))
                    # |e| > TRIVIAL: in float32, |e| >= the float32 number just above 1e-30
                    rel = tl.where(ae >= 1.0000000031710769e-30, _div(ad, ae, ON_GPU), 0.0)
                    a_rel = tl.maximum(a_rel, tl.max(tl.reshape(rel, FS), axis=2))
                    if FUSED:
                        a_d2 = _fdot(d, d, a_d2, BM, BN, VEC)
                        a_e2 = _fdot(e, e, a_e2, BM, BN, VEC)
                        a_r2 = _fdot(r, r, a_r2, BM, BN, VEC)
                        a_dot = _fdot(r, e, a_dot, BM, BN, VEC)
                    else:
                        a_d2 += tl.sum(tl.reshape(d * d, FS), axis=2)
                        a_e2 += tl.sum(tl.reshape(e * e, FS), axis=2)
                        a_r2 += tl.sum(tl.reshape(r * r, FS), axis=2)
                        a_dot += tl.sum(tl.reshape(r * e, FS), axis=2)
                    a_sr += tl.sum(tl.reshape(tl.abs(r), FS), axis=2)
                    a_se += tl.sum(tl.reshape(ae, FS), axis=2)
    if HAS_MASK or not EVEN:
        n_keep = tl.sum(a_keep)
    else:
        n_keep = n_in
    no_x = tl.max(a_x) == 0
    inf = float("inf")
    if B_MODE == 0:
        s_e2 = tl.sum(a_e2)
        s_se = tl.sum(a_se)
        m_abs = 0.0
        m_rel = 0.0
        m_ratio = 0.0
        s_d2 = 0.0
        s_r2 = s_e2
        s_dot = s_e2
        s_sr = s_se
        ok = no_x
    else:
        if FUSED:  # one reduction for all nine (the interpreter reduces tuples element by element: slow)
            n_acc: tl.constexpr = BM * (BN // VEC)
            m_abs, m_rel, m_ratio, s_d2, s_e2, s_r2, s_dot, s_sr, s_se = tl.reduce(
                (tl.reshape(a_abs, (n_acc,), can_reorder=True), tl.reshape(a_rel, (n_acc,), can_reorder=True),
                 tl.reshape(a_ratio, (n_acc,), can_reorder=True), tl.reshape(a_d2, (n_acc,), can_reorder=True),
                 tl.reshape(a_e2, (n_acc,), can_reorder=True), tl.reshape(a_r2, (n_acc,), can_reorder=True),
                 tl.reshape(a_dot, (n_acc,), can_reorder=True), tl.reshape(a_sr, (n_acc,), can_reorder=True),
                 tl.reshape(a_se, (n_acc,), can_reorder=True)), 0, _combine_stats)
        else:
            m_abs = tl.max(a_abs)
            m_rel = tl.max(a_rel)
            m_ratio = tl.max(a_ratio)
            s_d2 = tl.sum(a_d2)
            s_e2 = tl.sum(a_e2)
            s_r2 = tl.sum(a_r2)
            s_dot = tl.sum(a_dot)
            s_sr = tl.sum(a_sr)
            s_se = tl.sum(a_se)
        if CHECK_SUB:
            ok = (tl.max(a_flag) <= 0.0) & no_x
        else:
            # every |r - e| < b (the quotients, 2 ulp at worst, stay below 1 - 2^-20), and the
            # largest |r - e| is too large for an inexact difference (t0)
            ok = (m_ratio < 0.99999904632568359375) & ((m_abs == 0.0) | (m_abs > t0))
        ok = ok & (m_rel < inf) & (m_ratio < inf) & (tl.abs(s_d2) < inf) & (tl.abs(s_r2) < inf)
        ok = ok & (tl.abs(s_dot) < inf) & (tl.abs(s_sr) < inf)
        # The GPU's quotients flush differences below 2^-126 to 0; such a difference has a quotient
        # below 2^-26 (bounds >= 2^-100, |e| > 1e-30), so the maxima stand when they reach 2^-26.
        ok = ok & ((m_abs == 0.0) | ((m_ratio >= 1.4901161193847656e-08) & (m_rel >= 1.4901161193847656e-08)))
        # squares that underflow float32: only when the sums are this small
        tiny = n_keep.to(tl.float32) * 7.888609052210118e-31
        ok = ok & ((s_d2 >= tiny) | (m_abs == 0.0)) & ((s_r2 >= tiny) | (s_sr == 0.0))
        if B_MODE == 1:
            ok = ok & (atol + rtol * s_se <= 8.507059173023462e37)
        else:
            ok = ok & (tl.sum(a_sb) <= 8.507059173023462e37)
    ok = ok & (tl.abs(s_e2) < inf) & (s_se <= 8.507059173023462e37)
    ok = ok & (s_e2 >= n_keep.to(tl.float32) * 7.888609052210118e-31)
    # at least one |e| > TRIVIAL, proven by the sum; otherwise the float64 pass counts them
    informative = s_se > 2.0 * n_keep.to(tl.float32) * 1e-30
    accepted = ok & (informative | (n_keep == 0))
    if accepted:
        _store_row(out_ptr, pid, n_keep, 0, 0, 0, 0, 0, informative.to(tl.int32), m_abs, m_rel, m_ratio,
                   0, s_d2, s_e2, s_r2, s_dot, s_sr, s_se, 4611686018427387904, 0)
    return accepted


@triton.jit
def _general_pass(out_ptr, pid, r_ptr, e_ptr, b_ptr, m_ptr, lut_r_ptr, lut_e_ptr,
                  ti, tj, k, G, NS, NSUB_N, H, W, TH, TW, PM, PN,
                  s_rh, s_rw, s_eh, s_ew, s_bh, s_bw, s_mh, s_mw, rtol, atol,
                  R_KIND: tl.constexpr, E_KIND: tl.constexpr, B_KIND: tl.constexpr, B_MODE: tl.constexpr,
                  HAS_MASK: tl.constexpr, EVEN: tl.constexpr, ON_GPU: tl.constexpr, GBM: tl.constexpr,
                  BN: tl.constexpr, GVEC: tl.constexpr):
    """The float64 pass over the strips k, k + G, ... of tile (ti, tj), element by element as the
    reference computes it. Each thread folds its GVEC columns into its accumulators every step."""
    FS: tl.constexpr = (GBM, BN // GVEC, GVEC)  # each thread's GVEC columns on the last axis
    ar_m = tl.arange(0, GBM)
    ar_n = tl.arange(0, BN)
    z = tl.zeros([GBM, BN // GVEC], tl.float64)
    zi = tl.zeros([GBM, BN // GVEC], tl.int32)
    c_keep = zi
    c_bad = zi
    c_nan_r = zi
    c_nan_e = zi
    c_inf_r = zi
    c_inf_e = zi
    c_info = zi
    c_rnan = zi
    g_abs = z
    g_rel = z
    g_ratio = z
    g_d2 = z
    g_e2 = z
    g_r2 = z
    g_dot = z
    g_sr = z
    g_se = z
    g_first = tl.full([GBM, BN // GVEC], 4611686018427387904, tl.int64)
    for st in range(k, NS, G):
        row0, col0, row_end, col_end = _strip(st, ti, tj, H, W, TH, TW, PM, PN, NSUB_N)
        for rr in range(0, PM, GBM):
            rows64 = (row0 + rr + ar_m).to(tl.int64)
            for cc in range(0, PN, BN):
                cols = col0 + cc + ar_n
                o_r = rows64[:, None] * s_rh + cols[None, :] * s_rw
                o_e = rows64[:, None] * s_eh + cols[None, :] * s_ew
                o_b = rows64[:, None] * s_bh + cols[None, :] * s_bw
                if EVEN and not HAS_MASK:
                    keep = tl.full([GBM, BN], 1, tl.int1)
                    br = tl.load(r_ptr + o_r)
                    be = tl.load(e_ptr + o_e)
                    if B_MODE == 2:
                        bb = tl.load(b_ptr + o_b)
                else:
                    keep = (rows64 < row_end)[:, None] & (cols < col_end)[None, :]
                    if HAS_MASK:
                        keep = keep & (tl.load(m_ptr + rows64[:, None] * s_mh + cols[None, :] * s_mw,
                                               mask=keep, other=0) != 0)
                    br = tl.load(r_ptr + o_r, mask=keep, other=0)
                    be = tl.load(e_ptr + o_e, mask=keep, other=0)
                    if B_MODE == 2:
                        bb = tl.load(b_ptr + o_b, mask=keep, other=0)
                r = _decode64(br, lut_r_ptr, R_KIND)
                e = _decode64(be, lut_e_ptr, E_KIND)
                rn = r != r
                en = e != e
                ri = tl.abs(r) == float("inf")
                ei = tl.abs(e) == float("inf")
                fin = ~(rn | ri | en | ei)
                err = tl.abs(r - e)
                if B_MODE == 0:
                    ok = (br == be) | (rn & en)
                    ratio = tl.where(ok, 0.0, float("inf")).to(tl.float64)
                else:
                    if B_MODE == 1:
                        b = _bound32(tl.abs(_decode32(be, lut_e_ptr, E_KIND)), rtol, atol, ON_GPU).to(tl.float64)
                    else:
                        b = _decode64(bb, lut_e_ptr, B_KIND)
                    same = (rn & en) | (ri & ei & (r == e))
                    ok = same | (fin & (err <= b))
                    bc = tl.where(b < 1e-300, 1e-300, b)
                    ratio = tl.where(fin, err / bc, float("inf"))
                    ratio = tl.where(fin & (err == 0.0), 0.0, ratio)
                    ratio = tl.where(same, 0.0, ratio)
                bad = (~ok) & keep
                fk = fin & keep
                ratio = tl.where(keep, ratio, 0.0)
                rnan = ratio != ratio
                ae = tl.abs(e)
                big = ae > 1e-30
                rf = tl.where(fk, r, 0.0)
                ef = tl.where(fk, e, 0.0)
                df = rf - ef
                c_keep += tl.sum(tl.reshape(keep.to(tl.int32), FS), axis=2)
                c_bad += tl.sum(tl.reshape(bad.to(tl.int32), FS), axis=2)
                c_nan_r += tl.sum(tl.reshape((rn & keep).to(tl.int32), FS), axis=2)
                c_nan_e += tl.sum(tl.reshape((en & keep).to(tl.int32), FS), axis=2)
                c_inf_r += tl.sum(tl.reshape((ri & keep).to(tl.int32), FS), axis=2)
                c_inf_e += tl.sum(tl.reshape((ei & keep).to(tl.int32), FS), axis=2)
                c_info += tl.sum(tl.reshape((big & keep).to(tl.int32), FS), axis=2)
                c_rnan += tl.sum(tl.reshape(rnan.to(tl.int32), FS), axis=2)
                g_abs = tl.maximum(g_abs, tl.max(tl.reshape(tl.where(fk, err, 0.0), FS), axis=2))
                rel = tl.where(fk & big, err / tl.where(big, ae, 1.0), 0.0)
                g_rel = tl.maximum(g_rel, tl.max(tl.reshape(rel, FS), axis=2))
                g_ratio = tl.maximum(g_ratio, tl.max(tl.reshape(tl.where(rnan, 0.0, ratio), FS), axis=2))
                g_d2 += tl.sum(tl.reshape(df * df, FS), axis=2)
                g_e2 += tl.sum(tl.reshape(ef * ef, FS), axis=2)
                g_r2 += tl.sum(tl.reshape(rf * rf, FS), axis=2)
                g_dot += tl.sum(tl.reshape(rf * ef, FS), axis=2)
                g_sr += tl.sum(tl.reshape(tl.abs(rf), FS), axis=2)
                g_se += tl.sum(tl.reshape(tl.abs(ef), FS), axis=2)
                lin = rows64[:, None] * W + cols[None, :]
                lin = tl.where(bad, lin, 4611686018427387904)
                g_first = tl.minimum(g_first, tl.min(tl.reshape(lin, FS), axis=2))
    _store_row(out_ptr, pid, tl.sum(c_keep), tl.sum(c_bad), tl.sum(c_nan_r), tl.sum(c_nan_e),
               tl.sum(c_inf_r), tl.sum(c_inf_e), tl.sum(c_info), tl.max(g_abs), tl.max(g_rel),
               tl.max(g_ratio), tl.sum(c_rnan), tl.sum(g_d2), tl.sum(g_e2), tl.sum(g_r2), tl.sum(g_dot),
               tl.sum(g_sr), tl.sum(g_se), tl.min(g_first), 1)


@triton.jit
def _program_tile(pid, G, TILES_W):
    """Program -> (tile row, tile column, k): the k-th of the G programs of its tile."""
    t = pid // G
    k = pid - t * G
    ti = t // TILES_W
    return ti, t - ti * TILES_W, k


@triton.jit
def _strip(st, ti, tj, H, W, TH, TW, PM, PN, NSUB_N):
    """Strip st of tile (ti, tj): its rows [row0, row_end) and columns [col0, col_end)."""
    si = st // NSUB_N
    row0 = ti * TH + si * PM
    col0 = tj * TW + (st - si * NSUB_N) * PN
    row_end = tl.minimum(tl.minimum(row0 + PM, ti * TH + TH), H)
    col_end = tl.minimum(tl.minimum(col0 + PN, tj * TW + TW), W)
    return row0, col0, row_end, col_end


@triton.jit
def _fast_kernel(
    out_ptr, r_ptr, e_ptr, b_ptr, m_ptr, lut_r_ptr, lut_e_ptr, rp_ptr, ep_ptr,
    H, W, TH, TW, PM, PN, NSUB_N, NS, G, TILES_W,
    s_rh, s_rw, s_eh, s_ew, s_bh, s_bw, s_mh, s_mw, s_rph, s_eph,
    rtol, atol, t0,
    R_KIND: tl.constexpr, E_KIND: tl.constexpr, B_KIND: tl.constexpr, B_MODE: tl.constexpr,
    HAS_MASK: tl.constexpr, EVEN: tl.constexpr, SUB_MODE: tl.constexpr, SUB_K: tl.constexpr,
    CHECK_SUB: tl.constexpr, ON_GPU: tl.constexpr, PAIRS: tl.constexpr, FUSED: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, VEC: tl.constexpr,
):
    """The float32 pass, one program per (tile, k); a program it cannot vouch for is marked (-1 in
    the last column of its row) for _general_kernel."""
    pid = tl.program_id(0)
    ti, tj, k = _program_tile(pid, G, TILES_W)
    accepted = _fast_pass(out_ptr, pid, r_ptr, e_ptr, b_ptr, m_ptr, lut_r_ptr, lut_e_ptr, rp_ptr, ep_ptr,
                          ti, tj, k, G, NS, NSUB_N, H, W, TH, TW, PM, PN,
                          s_rh, s_rw, s_eh, s_ew, s_bh, s_bw, s_mh, s_mw, s_rph, s_eph, rtol, atol, t0,
                          R_KIND, E_KIND, B_KIND, B_MODE, HAS_MASK, EVEN, SUB_MODE, SUB_K, CHECK_SUB,
                          ON_GPU, PAIRS, FUSED, BM, BN, VEC)
    if accepted == 0:
        tl.store(out_ptr + tl.cast(pid, tl.int64) * 19 + 18, -1.0)


@triton.jit
def _general_kernel(
    out_ptr, r_ptr, e_ptr, b_ptr, m_ptr, lut_r_ptr, lut_e_ptr,
    H, W, TH, TW, PM, PN, NSUB_N, NS, G, TILES_W, NP,
    s_rh, s_rw, s_eh, s_ew, s_bh, s_bw, s_mh, s_mw,
    rtol, atol,
    R_KIND: tl.constexpr, E_KIND: tl.constexpr, B_KIND: tl.constexpr, B_MODE: tl.constexpr,
    HAS_MASK: tl.constexpr, EVEN: tl.constexpr, ON_GPU: tl.constexpr, GBM: tl.constexpr, BN: tl.constexpr,
    GVEC: tl.constexpr, CH: tl.constexpr,
):
    """A few persistent programs scan the marks and run the float64 pass for the marked programs
    (a kernel of its own, so that its registers do not weigh on the fast pass)."""
    g = tl.program_id(0)
    n_g = tl.num_programs(0)
    for base in range(g * CH, NP, n_g * CH):
        idx = base + tl.arange(0, CH)
        marks = tl.load(out_ptr + idx.to(tl.int64) * 19 + 18, mask=idx < NP, other=0.0)
        if tl.min(marks) < 0.0:
            for q in range(base, tl.minimum(base + CH, NP)):
                if tl.load(out_ptr + tl.cast(q, tl.int64) * 19 + 18) < 0.0:
                    ti, tj, k = _program_tile(q, G, TILES_W)
                    _general_pass(out_ptr, q, r_ptr, e_ptr, b_ptr, m_ptr, lut_r_ptr, lut_e_ptr,
                                  ti, tj, k, G, NS, NSUB_N, H, W, TH, TW, PM, PN,
                                  s_rh, s_rw, s_eh, s_ew, s_bh, s_bw, s_mh, s_mw, rtol, atol,
                                  R_KIND, E_KIND, B_KIND, B_MODE, HAS_MASK, EVEN, ON_GPU, GBM, BN, GVEC)


# ----------------------------------------------------------------------------------------------
# host side


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class TileStats:
    """Per-tile statistics from the one pass, folded in float64: `rows` is [tiles_h, tiles_w, NSTAT]
    on the tensors' device (columns S_*), before any host work."""
    rows: torch.Tensor
    shape: tuple[int, int]
    tile_shape: tuple[int, int]
    programs: int


@dataclass(frozen=True)
class _Plan:
    th: int
    tw: int
    tiles_h: int
    tiles_w: int
    pm: int
    pn: int
    bm: int
    bn: int
    nsub_m: int
    nsub_n: int
    even: bool

    @property
    def strips(self) -> int:  # per tile
        return self.nsub_m * self.nsub_n

    @property
    def per_tile(self) -> int:  # programs per tile: each takes strips k, k + per_tile, ...
        return min(self.strips, MAX_PROGRAMS_PER_TILE)

    @property
    def programs(self) -> int:
        return self.tiles_h * self.tiles_w * self.per_tile


def _plan(h: int, w: int, tile_shape, cfg: FastConfig, bytes_per_element: int = 4) -> _Plan:
    th, tw = tile_shape or (h, w)
    th, tw = max(int(th), 1), max(int(tw), 1)
    tiles_h, tiles_w = -(-h // th), -(-w // tw)
    pn = tw if tw <= 256 else 256
    bn = min(_next_pow2(pn), 128)
    widen = max(1, 128 // bn)  # narrow tiles: more rows per step and per program
    pm = min(th, cfg.rows_per_program * widen)
    # block_m is sized for two 2-byte operands; wider data (a bound tensor, float32) takes fewer rows
    narrow = 1 << max(0, (max(4, bytes_per_element) // 4).bit_length() - 1)
    bm = min(max(1, cfg.block_m * widen // narrow), _next_pow2(pm))
    nsub_m, nsub_n = -(-th // pm), -(-tw // pn)
    even = h % th == 0 and w % tw == 0 and th % pm == 0 and tw % pn == 0 and pm % bm == 0 and pn % bn == 0
    return _Plan(th, tw, tiles_h, tiles_w, pm, pn, bm, bn, nsub_m, nsub_n, even)


def _lut(dt: torch.dtype, device) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8).view(dt).to(torch.float32)


def _sub_mode(kr: _Kind, ke: _Kind) -> tuple[int, float]:
    if kr.quantum > 0 and ke.quantum > 0 and (kr.max + ke.max) / min(kr.quantum, ke.quantum) < 2.0 ** 24:
        return SUB_ALWAYS, 1.0
    p = max(kr.bits, ke.bits)
    if p < 24:
        return SUB_SCALED, 2.0 ** (23 - p)
    return SUB_TWOSUM, 1.0


def _validate(received, expected, bound, rtol, atol, mask):
    if received.shape != expected.shape:
        raise ValueError(f"received shape {tuple(received.shape)} != expected shape {tuple(expected.shape)}")
    if received.dim() != 2:
        raise ValueError(f"compare takes 2-D tensors, got {received.dim()}-D")
    exact = bound is None and rtol is None and atol is None
    if exact and received.dtype != expected.dtype:
        raise ValueError(f"bit-exact compare needs one dtype, got {received.dtype} and {expected.dtype}")
    reasons = check_supported(received, expected, bound=bound, mask=mask, rtol=rtol, atol=atol)
    if reasons:
        raise ValueError("compare_fast cannot take these inputs: " + "; ".join(reasons))
    return exact


def tile_stats(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
               rtol: Optional[float] = None, atol: Optional[float] = None, mask: Optional[torch.Tensor] = None,
               tile_shape: Optional[tuple[int, int]] = None, config: Optional[FastConfig] = None,
               fast_pass: bool = True) -> TileStats:
    """The one pass and the fold: per-tile statistics on the device, no host synchronisation.
    `fast_pass=False` makes every program take the float64 pass (a cross-check of the fast one)."""
    exact = _validate(received, expected, bound, rtol, atol, mask)
    cfg = config or DEFAULT_CONFIG
    dev = received.device
    h, w = received.shape
    nbytes = received.element_size() + expected.element_size() + (mask is not None)
    nbytes += bound.element_size() if bound is not None else 0
    plan = _plan(h, w, tile_shape, cfg, nbytes)
    if config is None and _interpreting():  # the interpreter pays per step, not per register
        plan = replace(plan, bm=_next_pow2(plan.pm), even=plan.even and plan.pm == _next_pow2(plan.pm))
    if h == 0 or w == 0:
        return TileStats(torch.zeros(plan.tiles_h, plan.tiles_w, NSTAT, dtype=torch.float64, device=dev),
                         (h, w), (plan.th, plan.tw), 0)
    if plan.programs >= 2 ** 31:
        raise ValueError(f"{plan.programs} programs for shape {(h, w)} and tiles {(plan.th, plan.tw)}: "
                         "expected fewer than 2^31 (use larger tiles)")
    expected = expected.to(dev)
    kr, ke = _kind(received.dtype), _kind(expected.dtype)
    rv, ev = received.view(kr.view), expected.view(ke.view)
    out = torch.empty(plan.programs, NSTAT, dtype=torch.float64, device=dev)
    lut_r = _lut(received.dtype, dev) if kr.kind == K_LUT else out
    lut_e = _lut(expected.dtype, dev) if ke.kind == K_LUT else out
    if exact:
        b_mode, kb, bv = B_EXACT, K_F32, out
        s_bh = s_bw = 0
    elif bound is None:
        b_mode, kb, bv = B_INLINE, K_F32, out
        s_bh = s_bw = 0
    else:
        b = bound.to(dev).expand(h, w)
        k = _kind(b.dtype)
        b_mode, kb, bv = B_TENSOR, k.kind, b.view(k.view)
        s_bh, s_bw = bv.stride()
    if mask is not None:
        mv = mask.to(dev).expand(h, w).view(torch.uint8)
        s_mh, s_mw = mv.stride()
    else:
        mv, s_mh, s_mw = out, 0, 0
    sub_mode, sub_k = _sub_mode(kr, ke)
    fast = fast_pass and kr.kind not in (K_F64, K_WIDE_INT) and ke.kind not in (K_F64, K_WIDE_INT)
    rt = float(rtol) if rtol is not None else 0.0
    at = float(atol) if atol is not None else 0.0
    check_sub, t0 = True, 0.0
    if b_mode == B_INLINE and sub_mode != SUB_ALWAYS and at >= _B_MIN:
        # An inexact float32 difference |r - e| within atol + rtol |e| is at most t0 (module notes),
        # so when the largest difference exceeds t0 it is exact, and no per-element check is needed.
        k = 2.0 ** (24 - max(kr.bits, ke.bits))
        c = k / (k + 1) * (1 - 2.0 ** -20)
        if rt < c * 0.5:
            check_sub, t0 = False, at * c / (c - rt) * (1 + 2.0 ** -18)
    on_gpu = not _interpreting()
    vec = max(1, min(plan.bn, 16 // max(received.element_size(), expected.element_size())))
    # bf16 pairs read as int32 words: one integer op per value to widen it
    pairs = (kr.kind == ke.kind == K_BF16 and plan.even and mask is None and plan.tw % 2 == 0
             and plan.pn % 2 == 0 and plan.bn >= 2 and w % 2 == 0)
    rp, ep = rv, ev
    if pairs:
        try:
            rp, ep = received.view(torch.int32), expected.view(torch.int32)
        except RuntimeError:  # not viewable as pairs (odd strides or offsets)
            pairs, rp, ep = False, rv, ev
    # the float64 pass: one vector of at most 8 elements per thread and step (its registers); the
    # interpreter takes big steps
    gvec = max(1, min(4 if K_LUT in (kr.kind, ke.kind) else 8, vec))
    gbm = max(1, min(_next_pow2(plan.pm), (32 * gvec * cfg.num_warps if on_gpu else 4096) // plan.bn))
    geo = (h, w, plan.th, plan.tw, plan.pm, plan.pn, plan.nsub_n, plan.strips, plan.per_tile, plan.tiles_w)
    strides = (rv.stride(0), rv.stride(1), ev.stride(0), ev.stride(1), s_bh, s_bw, s_mh, s_mw)
    kinds = dict(R_KIND=kr.kind, E_KIND=ke.kind, B_KIND=kb, B_MODE=b_mode, HAS_MASK=mask is not None,
                 ON_GPU=on_gpu, BN=plan.bn, num_warps=cfg.num_warps)
    if fast:
        _fast_kernel[(plan.programs,)](
            out, rv, ev, bv, mv, lut_r, lut_e, rp, ep, *geo, *strides, rp.stride(0), ep.stride(0), rt, at, t0,
            EVEN=plan.even, SUB_MODE=sub_mode, SUB_K=sub_k, CHECK_SUB=check_sub, PAIRS=pairs,
            FUSED=on_gpu or _FUSED_IN_INTERPRETER, BM=plan.bm, VEC=vec, num_stages=cfg.num_stages, **kinds)
    else:
        out[:, S_GENERAL] = -1.0
    # chunks of 16 marks: when every program is marked, the float64 pass still spreads over the GPU
    ch = 16
    most = 8 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
    _general_kernel[(max(1, min(-(-plan.programs // ch), most)),)](
        out, rv, ev, bv, mv, lut_r, lut_e, *geo, plan.programs, *strides, rt, at, EVEN=plan.even and gbm <= plan.pm
        and plan.pm % gbm == 0, GBM=gbm, GVEC=gvec, CH=ch, **kinds)
    return TileStats(_fold(out, plan), (h, w), (plan.th, plan.tw), plan.programs)


def _fold(out: torch.Tensor, plan: _Plan) -> torch.Tensor:
    parts = out.view(plan.tiles_h, plan.tiles_w, plan.per_tile, NSTAT)
    if plan.per_tile == 1:
        return parts[:, :, 0]
    folded = parts.sum(2)
    folded[..., S_MAX_ABS:S_MAX_RATIO + 1] = parts[..., S_MAX_ABS:S_MAX_RATIO + 1].amax(2)
    folded[..., S_FIRST_BAD] = parts[..., S_FIRST_BAD].amin(2)
    return folded


def compare_fast(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
                 rtol: Optional[float] = None, atol: Optional[float] = None, mask: Optional[torch.Tensor] = None,
                 tile_shape: Optional[tuple[int, int]] = None, origin: tuple[int, int] = (0, 0),
                 tile_index: Optional[tuple[int, int]] = None, k_block: Optional[int] = None,
                 max_detail_tiles: int = 64, config: Optional[FastConfig] = None,
                 fast_pass: bool = True) -> Comparison:
    """`oracle.compare.compare_reference` in one pass. The bound is `bound` (a tensor), or
    `atol + rtol * |expected|` computed inline (see `inline_bound`), or none (bit-exact)."""
    stats = tile_stats(received, expected, bound=bound, rtol=rtol, atol=atol, mask=mask, tile_shape=tile_shape,
                       config=config, fast_pass=fast_pass)
    exact = bound is None and rtol is None
    h, w = stats.shape
    th, tw = stats.tile_shape
    ints, floats = _tile_fields(stats.rows.cpu())
    base_ti = tile_index if (tile_shape is None and tile_index is not None) else (origin[0] // th, origin[1] // tw)
    out = []
    budget = max_detail_tiles
    for i, (irow, frow) in enumerate(zip(ints, floats)):
        in_h = min(th, h - i * th)
        for j, ((cmp_, nbad, nr, ne, ir, ie, info, first_lin), (mabs, mrel, mratio, rel_l2, cosine, ampl)) in \
                enumerate(zip(irow, frow)):
            if cmp_ == 0:
                continue
            first = ()
            if nbad and budget > 0:
                budget -= 1
                first = _first_bad(received, expected, bound, rtol, atol, mask, exact, first_lin,
                                   (i * th, min(h, i * th + th)), (j * tw, min(w, j * tw + tw)), origin)
            out.append(TileMetrics(
                tile=(base_ti[0] + i, base_ti[1] + j), k_block=k_block, compared=cmp_,
                excluded=in_h * min(tw, w - j * tw) - cmp_, mismatches=nbad, max_abs_err=mabs, max_rel_err=mrel,
                max_ratio=mratio, rel_l2=rel_l2, cosine=cosine, amplification=ampl, nan_received=nr,
                nan_expected=ne, inf_received=ir, inf_expected=ie, trivial=info == 0, exact=exact, first_bad=first))
    return combine([Comparison(Status.MATCH, tuple(out))]) if out else Comparison(Status.NOT_RUN)


def _tile_fields(rows: torch.Tensor) -> tuple[list, list]:
    """Folded rows [tiles_h, tiles_w, NSTAT] (CPU, float64) -> per tile the integer fields
    (compared, mismatches, NaN/Inf counts, informative, first bad index) and the float fields
    (max_abs_err, max_rel_err, max_ratio, rel_l2, cosine, amplification), the latter by the
    reference's formulas (IEEE division and square root, like `math`)."""
    c = rows.unbind(-1)
    dsq, esq, rsq, dot, sr, se = c[S_D2], c[S_E2], c[S_R2], c[S_DOT], c[S_SUM_R], c[S_SUM_E]
    inf, nan = torch.tensor(math.inf, dtype=torch.float64), torch.tensor(math.nan, dtype=torch.float64)
    one, zero = torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    rel_l2 = torch.where(esq > 0, torch.sqrt(dsq / esq), torch.where(dsq == 0, zero, inf))
    cosine = torch.where((esq > 0) & (rsq > 0), dot / torch.sqrt(esq * rsq), torch.where(esq == rsq, one, zero))
    ampl = torch.where(se > 0, sr / se, torch.where(sr == 0, one, inf))
    ratio = torch.where(c[S_RATIO_NAN] > 0, nan, c[S_MAX_RATIO])
    floats = torch.stack([c[S_MAX_ABS], c[S_MAX_REL], ratio, rel_l2, cosine, ampl], -1).tolist()
    ints = torch.stack([c[S_COMPARED], c[S_BAD], c[S_NAN_R], c[S_NAN_E], c[S_INF_R], c[S_INF_E], c[S_INFO],
                        c[S_FIRST_BAD]], -1).to(torch.int64).tolist()
    return ints, floats


def _first_bad(received, expected, bound, rtol, atol, mask, exact, first_lin, row_span, col_span,
               origin) -> tuple[BadElement, ...]:
    """The first FIRST_BAD bad elements of one tile in row-major order, from the row of the first
    one (which the kernel located), a bounded chunk of rows at a time."""
    from oracle.compare import _exact_equal

    dev = received.device
    r_lo, r_hi = row_span
    c_lo, c_hi = col_span
    h, w = received.shape
    start = max(r_lo, first_lin // w) if first_lin < _NO_BAD else r_lo
    step = max(1, _DETAIL_CHUNK // max(1, c_hi - c_lo))
    res: list[BadElement] = []
    for a in range(start, r_hi, step):
        z = min(r_hi, a + step)
        rs = received[a:z, c_lo:c_hi]
        es = expected[a:z, c_lo:c_hi].to(dev)
        r, e = rs.to(torch.float64), es.to(torch.float64)
        if exact:
            ok = _exact_equal(rs, es)
            b = torch.zeros_like(r)
        else:
            if bound is None:
                b = inline_bound(es, rtol, atol).to(torch.float64)
            else:
                b = bound.to(dev).expand(h, w)[a:z, c_lo:c_hi].to(torch.float64)
            err = (r - e).abs()
            r_nan, e_nan, r_inf, e_inf = torch.isnan(r), torch.isnan(e), torch.isinf(r), torch.isinf(e)
            same_inf = r_inf & e_inf & (torch.sign(r) == torch.sign(e))
            ok = (r_nan & e_nan) | same_inf | (torch.isfinite(r) & torch.isfinite(e) & (err <= b))
        bad = ~ok
        if mask is not None:
            bad &= mask.to(dev).expand(h, w)[a:z, c_lo:c_hi]
        for ii, jj in bad.nonzero()[:FIRST_BAD - len(res)].cpu().tolist():
            res.append(BadElement(origin[0] + a + ii, origin[1] + c_lo + jj, float(r[ii, jj]), float(e[ii, jj]),
                                  float(b[ii, jj])))
        if len(res) >= FIRST_BAD:
            break
    return tuple(res)

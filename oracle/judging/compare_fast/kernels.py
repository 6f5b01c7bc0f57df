"""The device code of the one pass (see the package docstring for the data path): the float32 fast
pass and the float64 pass over the strips of a tile, each writing one row of partial statistics
(columns as in oracle.judging.compare_fast.stats, the codes as in oracle.judging.compare_fast.kinds), and their
two kernels: `_fast_kernel` (one program per strip group) and `_general_kernel` (a few persistent
programs that redo the marked rows in float64).
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on

import triton
import triton.language as tl
from triton.language.extra import libdevice


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
def _load_kept(r_at, e_at, m_ptr, rows64, cols, row_end, col_end, s_mh, s_mw, HAS_MASK: tl.constexpr):
    """The positions of a block to keep (inside the strip, and nonzero in the mask when there is
    one) and the received and expected bits at `r_at` and `e_at` there (0 elsewhere)."""
    keep = (rows64 < row_end)[:, None] & (cols < col_end)[None, :]
    if HAS_MASK:
        keep = keep & (tl.load(m_ptr + _offsets(rows64, cols, s_mh, s_mw), mask=keep, other=0) != 0)
    return keep, tl.load(r_at, mask=keep, other=0), tl.load(e_at, mask=keep, other=0)


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
                o_r = _offsets(rows64, cols, s_rh, s_rw)
                o_e = _offsets(rows64, cols, s_eh, s_ew)
                if PAIRS:
                    keep = None
                    br = _load_pairs(rp_ptr, rows64, s_rph, col0 + cc, BM, BN)
                    be = _load_pairs(ep_ptr, rows64, s_eph, col0 + cc, BM, BN)
                elif EVEN:
                    if HAS_MASK:
                        keep = tl.load(m_ptr + _offsets(rows64, cols, s_mh, s_mw)) != 0
                        br = tl.load(r_ptr + o_r, mask=keep, other=0)
                        be = tl.load(e_ptr + o_e, mask=keep, other=0)
                    else:
                        keep = None
                        br = tl.load(r_ptr + o_r)
                        be = tl.load(e_ptr + o_e)
                else:
                    keep, br, be = _load_kept(r_ptr + o_r, e_ptr + o_e, m_ptr, rows64, cols, row_end, col_end,
                                              s_mh, s_mw, HAS_MASK)
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
                        o_b = _offsets(rows64, cols, s_bh, s_bw)
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
                o_r = _offsets(rows64, cols, s_rh, s_rw)
                o_e = _offsets(rows64, cols, s_eh, s_ew)
                o_b = _offsets(rows64, cols, s_bh, s_bw)
                if EVEN and not HAS_MASK:
                    keep = tl.full([GBM, BN], 1, tl.int1)
                    br = tl.load(r_ptr + o_r)
                    be = tl.load(e_ptr + o_e)
                    if B_MODE == 2:
                        bb = tl.load(b_ptr + o_b)
                else:
                    keep, br, be = _load_kept(r_ptr + o_r, e_ptr + o_e, m_ptr, rows64, cols, row_end, col_end,
                                              s_mh, s_mw, HAS_MASK)
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
def _offsets(rows64, cols, s_h, s_w):
    """Element offsets of a [rows, cols] block of a strided 2-D tensor (rows already int64)."""
    return rows64[:, None] * s_h + cols[None, :] * s_w


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

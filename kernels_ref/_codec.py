"""Bit-level element codecs shared by every reference kernel.

Data path: raw integer bits (loaded through a same-width integer view) -> int32 holding the
unsigned bit pattern -> fp32 value (decode); fp32 value -> int32 bit pattern of the target
format, rounded to nearest even (encode) -> storage-width integer.

Constraints: everything here is integer arithmetic plus bitcasts, never a Triton float
conversion whose rounding or special-value handling differs between the interpreter and the GPU
(the interpreter decodes fp8 NaN/Inf wrongly and rounds fp32->bf16 toward zero by default; the
GPU converts fp32->fp8 with saturation; a float -> int conversion of NaN or of an out-of-range
value is undefined in numpy and saturating in PTX). Every encode is therefore explicit about its
special values: NaN becomes the format's positive quiet NaN (`_common.NAN_BITS`), or 0 for an
integer; out-of-range values follow the format's rule (infinity, e4m3fn NaN, or the integer
range's end, as PTX's cvt.rni clamps). Type codes are those of `_common.CODES`:
0 fp32, 1 fp16, 2 bf16, 3 e4m3, 4 e5m2, 5 int8, 6 int32.
"""

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import triton
import triton.language as tl


@triton.jit
def _unsigned(raw, WIDTH: tl.constexpr):
    """Loaded storage integer (int8/int16/int32) -> int32 holding the unsigned bit pattern."""
    if WIDTH == 1:
        return raw.to(tl.int32) & 0xFF
    elif WIDTH == 2:
        return raw.to(tl.int32) & 0xFFFF
    else:
        return raw.to(tl.int32)


@triton.jit
def _to_storage(bits, WIDTH: tl.constexpr):
    """int32 unsigned bit pattern -> signed integer of the storage width (exact, no wrap needed)."""
    if WIDTH == 1:
        return tl.where(bits >= 128, bits - 256, bits).to(tl.int8)
    elif WIDTH == 2:
        return tl.where(bits >= 32768, bits - 65536, bits).to(tl.int16)
    else:
        return bits


@triton.jit
def _nan_f32(x):
    return tl.full(x.shape, 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _decode_f32(bits, DT: tl.constexpr):
    """Unsigned bit pattern of a DT element -> its fp32 value (exact except int32 > 2**24)."""
    if DT == 0:
        return bits.to(tl.float32, bitcast=True)
    elif DT == 1:
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    elif DT == 2:
        return (bits << 16).to(tl.float32, bitcast=True)
    elif DT == 3:
        # e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf; S.1111.111 is NaN.
        e = (bits >> 3) & 0xF
        m = bits & 0x7
        normal = ((e + 120) << 23) | (m << 20)
        sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)
        mag = tl.where(e > 0, normal, sub)
        mag = tl.where((bits & 0x7F) == 0x7F, 0x7FC00000, mag)
        # The sign goes in as a bit: negating a float turns -0 into +0 under some interpreters.
        return (mag | ((bits & 0x80) << 24)).to(tl.float32, bitcast=True)
    elif DT == 4:
        # e5m2 is the upper byte of an fp16.
        return ((bits & 0xFF) << 8).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    elif DT == 5:
        return tl.where(bits >= 128, bits - 256, bits).to(tl.float32)
    else:
        return bits.to(tl.float32)


@triton.jit
def _encode_small(x, EB: tl.constexpr, MB: tl.constexpr, BIAS: tl.constexpr, FN: tl.constexpr):
    """fp32 -> bit pattern of a float with EB exponent and MB mantissa bits, RNE, with subnormals.
    FN (e4m3fn style): no infinity, the all-ones pattern is NaN and overflow gives NaN;
    otherwise overflow gives infinity. NaN becomes the positive quiet NaN."""
    u = x.to(tl.int32, bitcast=True)
    neg = u < 0
    a = u & 0x7FFFFFFF
    big_e = a >> 23
    SH: tl.constexpr = 23 - MB
    # Normal result: re-bias the exponent and round the mantissa in place (carries ripple up).
    v = a - ((127 - BIAS) << 23)
    r_norm = (v + ((1 << (SH - 1)) - 1) + ((v >> SH) & 1)) >> SH
    # Subnormal result: shift the full significand down to units of the smallest subnormal.
    sig = tl.where(big_e > 0, (a & 0x7FFFFF) | 0x800000, a)
    s2 = 151 - BIAS - MB - tl.maximum(big_e, 1)
    s2 = tl.minimum(tl.maximum(s2, 1), 26)
    r_sub = (sig + (1 << (s2 - 1)) - 1 + ((sig >> s2) & 1)) >> s2
    r = tl.where(big_e >= 128 - BIAS, r_norm, r_sub)
    ONES: tl.constexpr = (1 << (EB + MB)) - 1
    if FN:
        r = tl.where(r >= ONES, ONES, r)
        nan_bits: tl.constexpr = ONES
    else:
        INF: tl.constexpr = ((1 << EB) - 1) << MB
        r = tl.where(r >= INF, INF, r)
        nan_bits: tl.constexpr = INF | (1 << (MB - 1))
    r = r | (neg.to(tl.int32) << (EB + MB))
    if FN:
        r = tl.where((r & ONES) == ONES, nan_bits, r)
    return tl.where(a > 0x7F800000, nan_bits, r)


@triton.jit
def _encode(x, FMT: tl.constexpr, SAT: tl.constexpr):
    """fp32 value -> unsigned bit pattern (int32) of format FMT (0 fp32, 1 fp16, 2 bf16, 3 e4m3,
    4 e5m2), round to nearest even. SAT clamps to +-max finite first (NaN stays NaN). Every NaN
    becomes the format's positive quiet NaN (fp32 included)."""
    if SAT:
        if FMT == 0:
            MAXF: tl.constexpr = 3.4028234663852886e38
        elif FMT == 1:
            MAXF: tl.constexpr = 65504.0
        elif FMT == 2:
            MAXF: tl.constexpr = 3.3895313892515355e38
        elif FMT == 3:
            MAXF: tl.constexpr = 448.0
        else:
            MAXF: tl.constexpr = 57344.0
        x = tl.where(x > MAXF, MAXF, x)
        x = tl.where(x < -MAXF, -MAXF, x)
    if FMT == 0:
        u = x.to(tl.int32, bitcast=True)
        return tl.where((u & 0x7FFFFFFF) > 0x7F800000, 0x7FC00000, u)
    elif FMT == 1:
        return _encode_small(x, 5, 10, 15, False)
    elif FMT == 2:
        return _encode_small(x, 8, 7, 127, False)
    elif FMT == 3:
        return _encode_small(x, 4, 3, 7, True)
    else:
        return _encode_small(x, 5, 2, 15, False)


@triton.jit
def _encode_int(x, LO: tl.constexpr, HI: tl.constexpr):
    """fp32 value -> int32 holding the integer in [LO, HI] nearest to it, ties to even; values past
    the range and +-inf give LO / HI, NaN gives 0 (what PTX cvt.rni.s32.f32 and
    cvt.rni.sat.s8.f32, i.e. __float2int_rn, do). Integer arithmetic on the fp32 bit pattern only,
    so the interpreter (whose float -> int conversion is numpy's, undefined out of range) and the
    GPU agree bit for bit."""
    u = x.to(tl.int32, bitcast=True)
    neg = u < 0
    a = u & 0x7FFFFFFF
    e = (a >> 23) - 127  # unbiased exponent; zeros and subnormals give -127 (and round to 0)
    sig = (a & 0x7FFFFF) | 0x800000  # 24-bit significand: |x| = sig * 2^(e - 23)
    # |x| < 2^23: shift the fraction out, rounding to nearest even (shift clamped: >= 25 gives 0).
    s = tl.minimum(tl.maximum(23 - e, 1), 25)
    q = sig >> s
    rem = sig & ((1 << s) - 1)
    half = 1 << (s - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    small = q + up.to(tl.int32)
    # 2^23 <= |x| < 2^31: already an integer (at most sig << 7 < 2^31).
    big = sig << tl.minimum(tl.maximum(e - 23, 0), 7)
    mag = tl.where(e <= 22, small, big)
    v = tl.where(neg, -mag, mag)
    v = tl.where(e >= 31, tl.where(neg, -2147483648, 2147483647), v)  # |x| >= 2^31, inf (and NaN)
    v = tl.minimum(tl.maximum(v, LO), HI)
    return tl.where(a > 0x7F800000, 0, v)


@triton.jit
def _round_to(x, FMT: tl.constexpr):
    """fp32 value rounded (RNE) to format FMT, returned as fp32."""
    return _decode_f32(_encode(x, FMT, False), FMT)


@triton.jit
def _truncate_mantissa(x, DROP: tl.constexpr):
    """Round toward zero to 23 - DROP explicit mantissa bits, on the fp32 bit pattern.
    Infinities and NaNs pass unchanged."""
    u = x.to(tl.int32, bitcast=True)
    special = (u & 0x7F800000) == 0x7F800000
    return tl.where(special, u, u & (-(1 << DROP))).to(tl.float32, bitcast=True)


@triton.jit
def _dot_operand(bits, DT: tl.constexpr, INTERP: tl.constexpr):
    """Unsigned bit patterns -> the values tl.dot consumes, exactly.
    Interpreter: fp32 for every float type (its bf16/fp8 dot is wrong). GPU: fp32 stays fp32
    (ieee dot), bf16 stays bf16, fp16/e4m3/e5m2 become fp16 (exact), int8 stays int8."""
    if DT == 5:
        return tl.where(bits >= 128, bits - 256, bits).to(tl.int8)
    elif INTERP or DT == 0:
        return _decode_f32(bits, DT)
    elif DT == 2:
        return _decode_f32(bits, DT).to(tl.bfloat16)
    else:
        return _decode_f32(bits, DT).to(tl.float16)


@triton.jit
def _abs_operand(bits, DT: tl.constexpr, INTERP: tl.constexpr):
    """|value| in the type tl.dot consumes (int8 goes through fp16 so |-128| is representable)."""
    if INTERP or DT == 0:
        return tl.abs(_decode_f32(bits, DT))
    elif DT == 2:
        return tl.abs(_decode_f32(bits, DT)).to(tl.bfloat16)
    else:
        return tl.abs(_decode_f32(bits, DT)).to(tl.float16)


@triton.jit
def _dot(a, b, F32: tl.constexpr):
    """Tile product in fp32 (int32 for int8 operands); fp32 operands use the ieee path."""
    if F32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)

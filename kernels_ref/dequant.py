"""Dequant stage: a quantised operand's stored tile -> the tile the MMA reads.

Data path: stored bytes (a packed 4-bit operand, uint8 [K / 2, N]: for "k_pairs_low_first" and
"k_pairs_high_first" byte (r, n) holds k = 2r and 2r + 1 of column n, the even k in the low / high
nibble; for "k8_interleaved" bytes 4w .. 4w + 3 of column n are the little-endian 32-bit word w,
whose nibble i (i = 0 the least significant) holds k = 8w + K8_ORDER[i]; int8 / e4m3 / e5m2: one
value per byte) -> the code of each (k, n) -> its value q (an integer, or
an e2m1 / fp8 value) -> w = (q - z) * s with the scale s (and zero point z) of group
(k0 + k) // group_size of column n0 + n -> w in the MMA's operand dtype (fp16 or bf16). With
zeros "float_offset" z is a float added after the scale instead: w = (q - c) * s + z, c the centre of
an unsigned B's range (8 for uint4, as torch's tinygemm int4 kernel reads its nibbles) and 0 for a
signed one (int4, int8).

Arithmetic (`precision`):
- "fp32": t = fp32(q - z), w = fp32(t * s), then one rounding (RNE) to the operand dtype. With no
  or integer zero points t is exact, so w is the operand-dtype rounding of fp32(q * s).
- "operand": z and s rounded to the operand dtype first, then t = op(fp32(q - z)) and
  w = op(fp32(t * s)): each step rounded to the operand dtype as fp16 / bf16 arithmetic does
  (through fp32, so a rare double rounding is the reference's too). A kernel that computes in
  another order (an fma with z * s taken first) is held to oracle.judging.tolerance's bound.
  float_offset: "fp32" is w = fp32(fp32((q - c) * s) + z), then one rounding; "operand" rounds z
  and s to the operand dtype, then p = op(fp32((q - c) * s)) and w = op(fp32(p + z)) (an fma in
  the operand dtype is held to the bound).

Constraints: the stored codes, scales and zero points are read as raw bits and decoded with
integer arithmetic (kernels_ref._codec), so the Triton kernel and the float64 host spec agree bit
for bit. Scales are [G, N] (G = K / group_size), zero points the same shape: integer zero points
one per byte (int8 for int4 / int8 operands, uint8 for uint4), float ones (and float offsets) in
the scales' dtype.
e8m0 scales are raw bytes (2^(byte - 127); 255 is NaN). Columns past N dequantise to 0.
An operand quantised along the other axis (an A [M, K] stored [M, K / 2], scales [M, K / group])
is passed transposed (strided views: stored [K / 2, M], scales [G, M]); its "columns" are then rows.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._codec import _decode_f32, _encode, _round_to, _to_storage
from kernels_ref._reasons import refuse
from kernels_ref.scales import decode
from kernels_ref.dtypes import ALL_TYPES, PACKED, QUANT_B, SCALE_TYPES

PACKINGS = ("k_pairs_low_first", "k_pairs_high_first", "k8_interleaved")
# k8_interleaved: nibble i of a 32-bit word holds element K8_ORDER[i] of its 8 k (the order a
# LOP3 / PRMT converter turns into pairs); K8_NIBBLE_OF[e] is the nibble of element e
K8_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
K8_NIBBLE_OF = tuple(K8_ORDER.index(e) for e in range(8))
ZEROS = ("none", "int", "float", "float_offset")
PRECISIONS = ("fp32", "operand")
OUT_TYPES = ("fp16", "bf16")
# constexpr codes of the kernel
_QT = {"int4": 0, "uint4": 1, "fp4_e2m1": 2, "int8": 3, "e4m3": 4, "e5m2": 5}
_ST = {"fp32": 0, "fp16": 1, "bf16": 2, "e4m3": 3, "e8m0": 7}
_FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class DequantConfig:
    """How one quantised operand is stored and dequantised (oracle.problem.spec's b_* fields)."""

    dtype: str  # int4 | uint4 | fp4_e2m1 | int8 | e4m3 | e5m2
    scale_dtype: str  # fp16 | bf16 | fp32 | e4m3 | e8m0
    out_dtype: str  # fp16 | bf16: the MMA's operand dtype
    group_size: int  # k elements per scale
    packing: Optional[str] = None  # a packed 4-bit dtype: PACKINGS
    zeros: str = "none"  # none | int | float | float_offset
    precision: str = "fp32"

    def __post_init__(self) -> None:
        refuse(check_supported(self))

    @property
    def packed(self) -> bool:
        return self.dtype in PACKED

    @property
    def centre(self) -> float:
        """c of the float_offset form w = (q - c) * s + z (0 for the other forms)."""
        return offset_centre(self.dtype) if self.zeros == "float_offset" else 0.0

    def zero_torch(self) -> Optional[torch.dtype]:
        """The torch dtype zero points are stored in (None: no zero points)."""
        if self.zeros == "none":
            return None
        if self.zeros in ("float", "float_offset"):
            return ALL_TYPES[self.scale_dtype].torch
        return torch.uint8 if self.dtype == "uint4" else torch.int8


def offset_centre(dtype: str) -> float:
    """The centre of an unsigned B's range (uint4: 8), 0 for a signed one: the c of w = (q - c) * s + z."""
    return 8.0 if dtype == "uint4" else 0.0


def check_supported(cfg: DequantConfig) -> list[str]:
    """Reasons `cfg` cannot be modelled (empty: it can)."""
    out = []
    if cfg.dtype not in QUANT_B:
        out.append(f"dtype {cfg.dtype!r} is not a quantised type; allowed: {', '.join(QUANT_B)}")
    if cfg.scale_dtype not in SCALE_TYPES:
        out.append(f"scale_dtype {cfg.scale_dtype!r}; allowed: {', '.join(SCALE_TYPES)}")
    if cfg.out_dtype not in OUT_TYPES:
        out.append(f"out_dtype {cfg.out_dtype!r}; the MMA operand is one of {', '.join(OUT_TYPES)}")
    if cfg.dtype in PACKED and cfg.packing not in PACKINGS:
        out.append(f"packing {cfg.packing!r} for a packed {cfg.dtype}; allowed: {', '.join(PACKINGS)}")
    if cfg.dtype not in PACKED and cfg.packing is not None:
        out.append(f"packing {cfg.packing!r} for {cfg.dtype}, which is not packed")
    if isinstance(cfg.group_size, bool) or not isinstance(cfg.group_size, int) or cfg.group_size <= 0 or \
            (cfg.dtype in PACKED and cfg.group_size % 2):
        out.append(f"group_size {cfg.group_size!r} must be a positive int (even for a packed type)")
    elif cfg.dtype in PACKED and cfg.packing == "k8_interleaved" and cfg.group_size % 8:
        out.append(f"group_size {cfg.group_size!r} must be a multiple of 8 for k8_interleaved (8 k a word)")
    if cfg.zeros not in ZEROS:
        out.append(f"zeros {cfg.zeros!r}; allowed: {', '.join(ZEROS)}")
    elif cfg.zeros in ("float", "float_offset") and cfg.scale_dtype not in ("fp16", "bf16", "fp32"):
        out.append(f"{cfg.zeros} zero points are held in the scales' dtype, which must be fp16, bf16 or fp32, "
                   f"not {cfg.scale_dtype}")
    elif cfg.zeros in ("int", "float_offset") and cfg.dtype not in ("int4", "uint4", "int8"):
        out.append(f"{cfg.zeros} zero points need an integer dtype (int4, uint4, int8), not {cfg.dtype}")
    if cfg.precision not in PRECISIONS:
        out.append(f"precision {cfg.precision!r}; allowed: {', '.join(PRECISIONS)}")
    return out


# -- codec (host) ------------------------------------------------------------------------------
def k_per_unit(packing: Optional[str]) -> int:
    """k elements of one column that a packing's unit (byte pair or word) holds; tiles start on one."""
    return 8 if packing == "k8_interleaved" else 2 if packing is not None else 1


def nibble_of(k: int, packing: str) -> tuple[int, int]:
    """(byte row, 0 low / 1 high nibble) holding element k of a column under a 4-bit packing."""
    if packing == "k8_interleaved":
        i = K8_NIBBLE_OF[k % 8]
        return 4 * (k // 8) + i // 2, i % 2
    return k // 2, (k % 2) ^ (packing == "k_pairs_high_first")


def k_of_nibble(row: int, high: int, packing: str) -> int:
    """The element k that nibble `high` of byte `row` holds under a 4-bit packing (nibble_of inverted)."""
    if packing == "k8_interleaved":
        return 8 * (row // 4) + K8_ORDER[2 * (row % 4) + high]
    return 2 * row + (high ^ (packing == "k_pairs_high_first"))


def unpack_host(stored: torch.Tensor, cfg: DequantConfig) -> torch.Tensor:
    """Codes [K, N] (int64, 0..255) of a stored [K / per_byte, N] operand."""
    raw = stored.contiguous().view(torch.uint8).to(torch.int64) if stored.element_size() == 1 else None
    if raw is None:
        raise ValueError(f"stored {cfg.dtype} values must be 1-byte elements, got {stored.dtype}")
    if not cfg.packed:
        return raw
    lo, hi = raw & 0xF, raw >> 4
    if cfg.packing == "k8_interleaved":
        if raw.shape[0] % 4:
            raise ValueError(f"a k8_interleaved {cfg.dtype} operand is held in 4-byte words along K: {raw.shape[0]} "
                             f"stored rows is not a multiple of 4")
        nib = torch.stack([lo, hi], dim=1).reshape(raw.shape[0] // 4, 8, *raw.shape[1:])  # nibble i of each word
        return nib[:, list(K8_NIBBLE_OF)].reshape(2 * raw.shape[0], *raw.shape[1:])
    first, second = (lo, hi) if cfg.packing == "k_pairs_low_first" else (hi, lo)
    return torch.stack([first, second], dim=1).reshape(2 * raw.shape[0], *raw.shape[1:])


def pack_host(codes: torch.Tensor, cfg: DequantConfig) -> torch.Tensor:
    """Inverse of unpack_host: codes [K, N] (0..15 for a packed type) -> the stored tensor."""
    c = codes.to(torch.int64)
    if not cfg.packed:
        return c.to(torch.uint8).view(ALL_TYPES[cfg.dtype].torch) if cfg.dtype != "uint4" else c.to(torch.uint8)
    if cfg.packing == "k8_interleaved":
        if c.shape[0] % 8:
            raise ValueError(f"a k8_interleaved {cfg.dtype} operand needs K a multiple of 8, got {c.shape[0]}")
        nib = c.reshape(c.shape[0] // 8, 8, *c.shape[1:])[:, list(K8_ORDER)] & 0xF  # nibble i of each word
        lo, hi = nib[:, 0::2], nib[:, 1::2]  # byte j of a word: nibbles 2j (low) and 2j + 1 (high)
        return (lo | (hi << 4)).reshape(c.shape[0] // 2, *c.shape[1:]).to(torch.uint8)
    if c.shape[0] % 2:
        raise ValueError(f"a packed {cfg.dtype} operand needs an even K, got {c.shape[0]}")
    even, odd = c[0::2] & 0xF, c[1::2] & 0xF
    lo, hi = (even, odd) if cfg.packing == "k_pairs_low_first" else (odd, even)
    return (lo | (hi << 4)).to(torch.uint8)


def values_of_codes(codes: torch.Tensor, dtype: str) -> torch.Tensor:
    """float64 values q of codes (int64) of a quantised dtype."""
    c = codes.to(torch.int64)
    if dtype == "int4":
        return torch.where(c >= 8, c - 16, c).double()
    if dtype == "uint4":
        return c.double()
    if dtype == "fp4_e2m1":
        mag = torch.tensor(_FP4, dtype=torch.float64)[c & 7]
        return torch.where(c & 8 != 0, -mag, mag)
    if dtype == "int8":
        return torch.where(c >= 128, c - 256, c).double()
    return c.to(torch.uint8).view(ALL_TYPES[dtype].torch).double()


def codes_of_values(values: torch.Tensor, dtype: str) -> torch.Tensor:
    """The codes (int64) of float values exactly representable in a quantised dtype (ValueError if not)."""
    v = values.double()
    if dtype in ("int4", "uint4", "int8"):
        d = ALL_TYPES[dtype]
        if not bool(((v == v.round()) & (v >= d.lowest) & (v <= d.max_finite)).all()):
            raise ValueError(f"values outside the {dtype} integers {d.lowest:g}..{d.max_finite:g}")
        c = v.to(torch.int64)
        return c & (0xF if dtype != "int8" else 0xFF)
    if dtype == "fp4_e2m1":
        table = torch.tensor(_FP4, dtype=torch.float64)
        hit = (v.abs()[..., None] == table).to(torch.int64)
        if not bool((hit.sum(-1) == 1).all()):
            raise ValueError("values outside e2m1 (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives)")
        return hit.argmax(-1) | torch.where(torch.signbit(v), 8, 0)
    t = v.to(ALL_TYPES[dtype].torch)
    if not bool((t.double() == v).all()):
        raise ValueError(f"values not exactly representable in {dtype}")
    return t.view(torch.uint8).to(torch.int64)


def scale_values_host(scales: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """float64 values of stored scales (e8m0: raw bytes, 2^(b - 127), 255 NaN)."""
    if scale_dtype == "e8m0":
        return decode(scales.contiguous().view(torch.uint8), "e8m0")
    return scales.double()


def _check_tile_start(cfg: DequantConfig, k0: int) -> None:
    unit = k_per_unit(cfg.packing)
    if k0 % unit:
        raise ValueError(f"k0 = {k0}: a {cfg.packing} tile starts on a unit of {unit} k (a multiple of {unit})")


# -- host specification --------------------------------------------------------------------------
def _round(x: torch.Tensor, dtype: str) -> torch.Tensor:
    return x.to(ALL_TYPES[dtype].torch).double()


def dequant_host(stored: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], cfg: DequantConfig,
                 k0: int = 0, n0: int = 0) -> torch.Tensor:
    """The dequantised tile [TK, TN] in cfg.out_dtype, in float64 on the CPU: `stored` is the stored
    tile (packed [TK/2, TN] or [TK, TN]) whose first element is (k0, n0) of the operand; `scales`
    and `zeros` are the operand's whole [G, N]. A k8_interleaved tile starts on a word (k0 % 8 == 0)."""
    refuse(check_supported(cfg))
    _check_tile_start(cfg, k0)
    q = values_of_codes(unpack_host(stored.cpu(), cfg), cfg.dtype)
    tk, tn = q.shape
    n_cols = scales.shape[1]
    g = ((k0 + torch.arange(tk)) // cfg.group_size).clamp(max=scales.shape[0] - 1)
    col = n0 + torch.arange(tn)
    inside = col < n_cols
    colc = col.clamp(max=n_cols - 1)
    s = scale_values_host(scales.cpu(), cfg.scale_dtype)[g[:, None], colc[None, :]]
    z = torch.zeros_like(s)
    if cfg.zeros != "none":
        z = zeros.cpu().double()[g[:, None], colc[None, :]]
    w = dequant_values(q, z, s, cfg)
    out = torch.where(inside[None, :], w, 0.0)
    return out.to(ALL_TYPES[cfg.out_dtype].torch)


def dequant_values(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, cfg: DequantConfig) -> torch.Tensor:
    """w of values q, zero points z and scales s (float64, one each per element) as cfg's arithmetic
    computes it (module docstring), before the final rounding to cfg.out_dtype; float64."""
    if cfg.zeros == "float_offset":
        t = q - cfg.centre  # exact
        if cfg.precision == "fp32":
            return C.f32(C.f32(t * s) + z)
        return C.f32(_round(C.f32(t * _round(s, cfg.out_dtype)), cfg.out_dtype) + _round(z, cfg.out_dtype))
    if cfg.precision == "fp32":
        return C.f32(C.f32(q - z) * s)
    zo, so = _round(z, cfg.out_dtype), _round(s, cfg.out_dtype)
    t = _round(C.f32(q - zo), cfg.out_dtype)
    return C.f32(t * so)


def dequant_operand_host(stored: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                         cfg: DequantConfig) -> torch.Tensor:
    """The whole operand [K, N] dequantised (host spec)."""
    return dequant_host(stored, scales, zeros, cfg)


# -- Triton ------------------------------------------------------------------------------------
@triton.jit
def _decode_q(code, QT: tl.constexpr):
    """Code (int32, 0..255) of a quantised type -> its value in fp32 (exact)."""
    if QT == 0:
        return tl.where(code >= 8, code - 16, code).to(tl.float32)
    elif QT == 1:
        return code.to(tl.float32)
    elif QT == 2:
        e = (code >> 1) & 3
        m = (code & 1).to(tl.float32)
        mag = tl.where(e == 0, m * 0.5, (1.0 + m * 0.5) * tl.where(e == 1, 1.0, tl.where(e == 2, 2.0, 4.0)))
        # the sign by a multiply: compiled, a negation is 0 - x, which turns -0 (code 8) into +0
        return mag * tl.where((code & 8) != 0, -1.0, 1.0)
    elif QT == 3:
        return tl.where(code >= 128, code - 256, code).to(tl.float32)
    elif QT == 4:
        return _decode_f32(code, 3)
    else:
        return _decode_f32(code, 4)


@triton.jit
def _decode_scale(bits, ST: tl.constexpr):
    if ST == 7:  # e8m0: 2^(b - 127); b = 0 is the fp32 subnormal 2^-127; 255 NaN
        f = tl.where(bits == 0, 0x400000, bits << 23)
        f = tl.where(bits == 255, 0x7FC00000, f)
        return f.to(tl.float32, bitcast=True)
    else:
        return _decode_f32(bits, ST)


@triton.jit
def _dequant_kernel(q_ptr, sq_r, sq_c, s_ptr, ss_g, ss_c, z_ptr, sz_g, sz_c, out_ptr, so_r, so_c,
                    TK, TN, k0, n0, N, G, GROUP,
                    BLK_K: tl.constexpr, BLK_N: tl.constexpr, QT: tl.constexpr, PACK: tl.constexpr,
                    ST: tl.constexpr, SW: tl.constexpr, ZK: tl.constexpr, ZSIGNED: tl.constexpr,
                    OUT: tl.constexpr, PREC: tl.constexpr, CENTRE: tl.constexpr):
    pk = tl.program_id(0)
    pn = tl.program_id(1)
    k = pk * BLK_K + tl.arange(0, BLK_K)[:, None]
    n = pn * BLK_N + tl.arange(0, BLK_N)[None, :]
    inb = (k < TK) & (n < TN)
    if PACK == 0:
        code = tl.load(q_ptr + k * sq_r + n * sq_c, mask=inb, other=0).to(tl.int32) & 0xFF
    else:
        if PACK == 3:  # k8_interleaved: element e of word k // 8 sits in nibble (e % 2) * 4 + e // 2
            e = k % 8
            nib = (e % 2) * 4 + e // 2
            row = (k // 8) * 4 + nib // 2
            high = (nib % 2) == 1
        elif PACK == 1:
            row = k // 2
            high = (k % 2) == 1
        else:
            row = k // 2
            high = (k % 2) == 0
        byte = tl.load(q_ptr + row * sq_r + n * sq_c, mask=inb, other=0).to(tl.int32) & 0xFF
        code = tl.where(high, byte >> 4, byte & 0xF)
    q = _decode_q(code, QT)
    col = n0 + n
    ok = inb & (col < N)
    g = tl.minimum((k0 + k) // GROUP, G - 1)
    sraw = tl.load(s_ptr + g * ss_g + col * ss_c, mask=ok, other=0).to(tl.int32)
    if SW == 1:
        sbits = sraw & 0xFF
    elif SW == 2:
        sbits = sraw & 0xFFFF
    else:
        sbits = sraw
    s = _decode_scale(sbits, ST)
    z = tl.zeros([BLK_K, BLK_N], tl.float32)
    if ZK == 1:
        zraw = tl.load(z_ptr + g * sz_g + col * sz_c, mask=ok, other=0).to(tl.int32)
        if ZSIGNED:
            z = zraw.to(tl.float32)
        else:
            z = (zraw & 0xFF).to(tl.float32)
    elif ZK >= 2:
        zraw = tl.load(z_ptr + g * sz_g + col * sz_c, mask=ok, other=0).to(tl.int32)
        if SW == 2:
            z = _decode_f32(zraw & 0xFFFF, ST)
        else:
            z = _decode_f32(zraw, ST)
    if ZK == 3:
        t = q - CENTRE
        if PREC == 0:
            w = t * s + z  # two fp32 roundings: fp-contraction is off (launch_options)
        else:
            w = _round_to(t * _round_to(s, OUT), OUT) + _round_to(z, OUT)
    elif PREC == 0:
        t = q - z
        w = t * s
    else:
        t = _round_to(q - _round_to(z, OUT), OUT)
        w = t * _round_to(s, OUT)
    w = tl.where(ok, w, 0.0)
    tl.store(out_ptr + k * so_r + n * so_c, _to_storage(_encode(w, OUT, False), 2), mask=inb)


def dequant(stored: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], cfg: DequantConfig,
            k0: int = 0, n0: int = 0) -> torch.Tensor:
    """Triton: the dequantised tile [TK, TN] in cfg.out_dtype on the inputs' device (see dequant_host)."""
    reasons = check_supported(cfg)
    if reasons:
        raise C.reasons_error(reasons)
    C.require_tensor("stored", stored, 2)
    C.require_tensor("scales", scales, 2)
    if cfg.zeros != "none":
        C.require_tensor("zeros", zeros, 2)
        if tuple(zeros.shape) != tuple(scales.shape):
            raise ValueError(f"zeros have shape {tuple(zeros.shape)}, the scales {tuple(scales.shape)}")
    dev = C.check_device(("stored", stored), ("scales", scales), ("zeros", zeros))
    _check_tile_start(cfg, k0)
    per = 2 if cfg.packed else 1
    tk, tn = stored.shape[0] * per, stored.shape[1]
    if tk % k_per_unit(cfg.packing):
        raise ValueError(f"stored has {stored.shape[0]} rows: a {cfg.packing} tile holds whole units of "
                         f"{k_per_unit(cfg.packing)} k ({k_per_unit(cfg.packing) // per} rows)")
    out = torch.empty(tk, tn, dtype=ALL_TYPES[cfg.out_dtype].torch, device=dev)
    if tk == 0 or tn == 0:
        return out
    qv = stored.view(torch.int8) if stored.dtype != torch.int8 else stored
    sv = C.bits_view(scales)
    zv = C.bits_view(zeros) if cfg.zeros != "none" else sv
    ov = C.bits_view(out)
    blk_k, blk_n = min(64, C.pad_dim(tk)), min(64, C.pad_dim(tn))
    grid = (C.cdiv(tk, blk_k), C.cdiv(tn, blk_n))
    _dequant_kernel[grid](qv, qv.stride(0), qv.stride(1), sv, sv.stride(0), sv.stride(1), zv, zv.stride(0),
                          zv.stride(1), ov, ov.stride(0), ov.stride(1), tk, tn, k0, n0, scales.shape[1],
                          scales.shape[0], cfg.group_size, BLK_K=blk_k, BLK_N=blk_n, QT=_QT[cfg.dtype],
                          PACK=0 if not cfg.packed else PACKINGS.index(cfg.packing) + 1,
                          ST=_ST[cfg.scale_dtype], SW=scales.element_size(), ZK=ZEROS.index(cfg.zeros),
                          ZSIGNED=cfg.zero_torch() == torch.int8, OUT=C.CODES[cfg.out_dtype],
                          PREC=PRECISIONS.index(cfg.precision), CENTRE=cfg.centre, **C.launch_options(dev))
    return out


def dequant_operand(stored: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                    cfg: DequantConfig) -> torch.Tensor:
    """Triton: the whole operand [K, N] dequantised."""
    return dequant(stored, scales, zeros, cfg)

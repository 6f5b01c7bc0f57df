"""P stage: the probabilities as the second MMA reads them, in its operand type.

Data path: masked scores x [BQ, BKV] fp32 and the block's row max m_new -> p = exp(x - m_use) fp32
(m_use = m_new, 0 where m_new = -inf, as softmax_state) -> P = round(p * p_scale) to the operand
type of V (bf16 / fp16 round to nearest even; e4m3 round to nearest even, saturating to 448).
p_scale is 1 for 16-bit types; an fp8 kernel may scale P up before the cast (FA3 keeps 1) and
divides it back out in normalize.

Constraints: p_dtype one of bf16, fp16, e4m3. The host spec rounds float64 exp through torch's
conversion; the two differ by exp's fp32 rounding, at most one step of P's type (the p bound).
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._codec import _decode_f32, _encode, _to_storage
from kernels_ref.attention._tile import pad, tiles_reasons
from kernels_ref.attention.geometry import P_DTYPES
from kernels_ref.dtypes import DTYPES


@triton.jit
def _p_bits(p, p_scale, FMT: tl.constexpr):
    """Bit pattern (int32) of p * p_scale in format FMT (e4m3 saturates)."""
    return _encode(p * p_scale, FMT, FMT == 3)


@triton.jit
def _p_operand(p, p_scale, FMT: tl.constexpr):
    """The value the second MMA reads for fp32 probabilities p: round(p * p_scale), as fp32."""
    return _decode_f32(_p_bits(p, p_scale, FMT), FMT)


@triton.jit
def _p_kernel(x_ptr, m_ptr, o_ptr, BQ, BKV, p_scale, BQP: tl.constexpr, BKVP: tl.constexpr, FMT: tl.constexpr,
              W: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BQP)
    c = tl.arange(0, BKVP)
    ok = (r[:, None] < BQ) & (c[None, :] < BKV)
    x = tl.load(x_ptr + u * BQ * BKV + r[:, None] * BKV + c[None, :], mask=ok, other=float("-inf"))
    m = tl.load(m_ptr + u * BQ + r, mask=r < BQ, other=0.0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(x - m_use[:, None])
    tl.store(o_ptr + u * BQ * BKV + r[:, None] * BKV + c[None, :], _to_storage(_p_bits(p, p_scale, FMT), W), mask=ok)


def check_supported(x, m_new, p_dtype: str, p_scale: float = 1.0) -> list[str]:
    reasons = tiles_reasons((("x", x),), ("fp32",)) + tiles_reasons((("m_new", m_new),), ("fp32",), 2)
    if p_dtype not in P_DTYPES:
        reasons.append(f"p_dtype={p_dtype!r}; allowed: {', '.join(P_DTYPES)}")
    if not (isinstance(p_scale, (int, float)) and 0 < p_scale < float("inf")):
        reasons.append(f"p_scale={p_scale!r} must be a positive, finite number")
    elif p_dtype != "e4m3" and p_scale != 1.0:
        reasons.append(f"p_scale={p_scale!r}: only an e4m3 P is scaled")
    return reasons


def p_tile(x: torch.Tensor, m_new: torch.Tensor, p_dtype: str, p_scale: float = 1.0) -> torch.Tensor:
    """P [U, BQ, BKV] in p_dtype from masked scores x [U, BQ, BKV] and row maxima m_new [U, BQ]."""
    reasons = check_supported(x, m_new, p_dtype, p_scale)
    if reasons:
        raise C.reasons_error(reasons)
    dev = C.check_device(("x", x), ("m_new", m_new))
    x, m_new = x.contiguous(), m_new.contiguous()
    u, bq, bkv = x.shape
    out = torch.empty((u, bq, bkv), dtype=DTYPES[p_dtype].torch, device=dev)
    if u:
        _p_kernel[(u,)](x, m_new, C.bits_view(out), bq, bkv, float(p_scale), BQP=pad(bq), BKVP=pad(bkv),
                        FMT=C.CODES[p_dtype], W=out.element_size(), **C.launch_options(dev))
    return out


def p_tile_host(x: torch.Tensor, m_new: torch.Tensor, p_dtype: str, p_scale: float = 1.0) -> torch.Tensor:
    """Host spec: round(exp(x - m_use) * p_scale) of float64 values, in p_dtype."""
    reasons = check_supported(x, m_new, p_dtype, p_scale)
    if reasons:
        raise C.reasons_error(reasons)
    x, m = x.detach().cpu().double(), m_new.detach().cpu().double()
    m_use = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    p = torch.exp(x - m_use[..., None]) * p_scale
    if p_dtype == "e4m3":
        p = p.clamp(max=448.0)
    return p.to(DTYPES[p_dtype].torch)

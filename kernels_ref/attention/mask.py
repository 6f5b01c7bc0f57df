"""Mask stage: the scores the softmax reads: scaled, soft-capped, and -inf where masked.

Data path: S [BQ, BKV] fp32 of one unit and KV block, the block's first query row i0 and key j0
within its sequence, the sequence's lengths (lq, lk) -> x = S * softmax_scale -> softcap > 0:
x = softcap * tanh(x / softcap) -> -inf where query i may not see key j (geometry.allowed_host:
length, causal top-left / bottom-right, sliding window).

Constraints: tanh is computed as 1 - 2 / (exp(2x) + 1) in fp32 (Triton has no tanh the interpreter
runs): within a few fp32 ulps of 1 in absolute terms, which attention_tolerance's mask bound
carries. The host spec is float64 (torch.tanh) with the same boolean mask.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref.attention._tile import pad, tiles_reasons
from kernels_ref.attention.geometry import AttnParams, allowed_host

CAUSAL_CODES = {"none": 0, "top_left": 1, "bottom_right": 2}


@triton.jit
def _keep(i, j, lq, lk, left, right, CAUSAL: tl.constexpr):
    """[len(i), len(j)] booleans: query i (column vector) may see key j (row vector)."""
    if CAUSAL == 1:
        off = lk * 0
    else:
        off = lk - lq
    ok = (j < lk) & (i < lq) & (j >= 0)
    if CAUSAL != 0:
        ok = ok & (j <= i + off)
    ok = ok & ((left < 0) | (j >= i + off - left))
    ok = ok & ((right < 0) | (j <= i + off + right))
    return ok


@triton.jit
def _mask_tile(s, keep, scale, softcap, SOFTCAP: tl.constexpr):
    """scale, soft-cap and mask fp32 scores s with the boolean tile keep."""
    x = s * scale
    if SOFTCAP:
        e = tl.exp(2.0 * (x / softcap))
        x = softcap * (1.0 - 2.0 / (e + 1.0))
    return tl.where(keep, x, float("-inf"))


@triton.jit
def _mask_kernel(s_ptr, o_ptr, co_ptr, BQ, BKV, scale, softcap, left, right, BQP: tl.constexpr,
                 BKVP: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    i0 = tl.load(co_ptr + 4 * u)
    j0 = tl.load(co_ptr + 4 * u + 1)
    lq = tl.load(co_ptr + 4 * u + 2)
    lk = tl.load(co_ptr + 4 * u + 3)
    r = tl.arange(0, BQP)[:, None]
    c = tl.arange(0, BKVP)[None, :]
    ok = (r < BQ) & (c < BKV)
    s = tl.load(s_ptr + u * BQ * BKV + r * BKV + c, mask=ok, other=0.0)
    keep = _keep(i0 + r, j0 + c, lq, lk, left, right, CAUSAL)
    tl.store(o_ptr + u * BQ * BKV + r * BKV + c, _mask_tile(s, keep, scale, softcap, SOFTCAP), mask=ok)


def check_supported(s, coords, params) -> list[str]:
    reasons = tiles_reasons((("s", s),), ("fp32",))
    if not isinstance(params, AttnParams):
        reasons.append(f"params must be an AttnParams, got {type(params).__name__}")
    if not isinstance(coords, torch.Tensor) or coords.dim() != 2 or coords.shape[1] != 4:
        reasons.append("coords must be [units, 4] integers: (first query row, first key, lq, lk) of each tile")
    elif not reasons and coords.shape[0] != s.shape[0]:
        reasons.append(f"coords has {coords.shape[0]} rows for {s.shape[0]} tiles")
    return reasons


def mask(s: torch.Tensor, coords: torch.Tensor, params: AttnParams) -> torch.Tensor:
    """Masked scores [U, BQ, BKV] fp32 of S [U, BQ, BKV] fp32; coords [U, 4] = (i0, j0, lq, lk)."""
    reasons = check_supported(s, coords, params)
    if reasons:
        raise C.reasons_error(reasons)
    dev = C.check_device(("s", s))
    s = s.contiguous()
    u, bq, bkv = s.shape
    out = torch.empty_like(s)
    co = coords.to(dev, torch.int32).contiguous()
    if u:
        _mask_kernel[(u,)](s, out, co, bq, bkv, float(params.scale), float(params.softcap or 1.0),
                           params.window[0], params.window[1], BQP=pad(bq), BKVP=pad(bkv),
                           CAUSAL=CAUSAL_CODES[params.causal], SOFTCAP=params.softcap > 0, **C.launch_options(dev))
    return out


def mask_host(s: torch.Tensor, coords: torch.Tensor, params: AttnParams) -> torch.Tensor:
    """Host spec: float64 scale, softcap * tanh(x / softcap), and -inf where masked."""
    reasons = check_supported(s, coords, params)
    if reasons:
        raise C.reasons_error(reasons)
    x = s.detach().cpu().double() * params.scale
    if params.softcap > 0:
        x = params.softcap * torch.tanh(x / params.softcap)
    out = torch.empty_like(x)
    _, bq, bkv = x.shape
    for u, (i0, j0, lq, lk) in enumerate(coords.cpu().tolist()):
        keep = allowed_host(torch.arange(i0, i0 + bq), torch.arange(j0, j0 + bkv), lq, lk, params)
        out[u] = torch.where(keep, x[u], torch.tensor(float("-inf"), dtype=torch.float64))
    return out

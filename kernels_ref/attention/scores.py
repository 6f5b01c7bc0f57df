"""Scores stage: S = Q K^T for one KV block, the first MMA of attention.

Data path: q tile [BQ, D] and k tile [BKV, D] (bf16 / fp16 / e4m3 bits, decoded exactly to fp32)
-> fp32 dot over head_dim -> times descale_q * descale_k (e4m3 inputs; 1 otherwise) -> S [BQ, BKV]
fp32, unscaled (softmax_scale is the mask stage's). With `with_abs`, sum_d |q_id| |k_jd| beside it:
the statistic the rounding bound of S reads (oracle.judging.attention_tolerance).

Constraints: q and k of one type; any BQ, BKV, D (padded to powers of two >= 16 in-kernel). The
host spec is the float64 product of the same decoded values.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref.attention._tile import _dot32, _load_f32, code, dtype_of, pad

DTYPES = ("bf16", "fp16", "e4m3")


@triton.jit
def _scores_tile(q, k, descale, INTERP: tl.constexpr):
    """S = q @ k^T * descale of fp32 tiles q [BQP, DP], k [BKVP, DP]."""
    return _dot32(q, tl.trans(k), INTERP) * descale


@triton.jit
def _scores_kernel(q_ptr, sq_u, sq_r, sq_c, k_ptr, sk_u, sk_r, sk_c, s_ptr, a_ptr, BQ, BKV, D, descale,
                   DT: tl.constexpr, W: tl.constexpr, BQP: tl.constexpr, BKVP: tl.constexpr, DP: tl.constexpr,
                   WITH_ABS: tl.constexpr, INTERP: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    q = _load_f32(q_ptr + u * sq_u, sq_r, sq_c, BQ, D, BQP, DP, DT, W)
    k = _load_f32(k_ptr + u * sk_u, sk_r, sk_c, BKV, D, BKVP, DP, DT, W)
    r = tl.arange(0, BQP)[:, None]
    c = tl.arange(0, BKVP)[None, :]
    ok = (r < BQ) & (c < BKV)
    tl.store(s_ptr + u * BQ * BKV + r * BKV + c, _scores_tile(q, k, descale, INTERP), mask=ok)
    if WITH_ABS:
        tl.store(a_ptr + u * BQ * BKV + r * BKV + c, _dot32(tl.abs(q), tl.trans(tl.abs(k)), INTERP), mask=ok)


def check_supported(q, k) -> list[str]:
    reasons = []
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            reasons.append(f"{name} must be a 3-D tensor of tiles [units, rows, head_dim]")
        elif dtype_of(x) not in DTYPES:
            reasons.append(f"{name} has dtype {x.dtype}; allowed: {', '.join(DTYPES)}")
    if not reasons:
        if q.dtype != k.dtype:
            reasons.append(f"q is {q.dtype} but k is {k.dtype}: one operand type")
        if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            reasons.append(f"q {list(q.shape)} and k {list(k.shape)} need the same units and head_dim")
    return reasons


def scores(q: torch.Tensor, k: torch.Tensor, descale: float = 1.0, with_abs: bool = False):
    """S [U, BQ, BKV] fp32 of q [U, BQ, D] and k [U, BKV, D]; with_abs also sum_d |q| |k|."""
    reasons = check_supported(q, k)
    if reasons:
        raise C.reasons_error(reasons)
    dev = C.check_device(("q", q), ("k", k))
    u, bq, d = q.shape
    bkv = k.shape[1]
    s = torch.empty((u, bq, bkv), dtype=torch.float32, device=dev)
    a = torch.empty_like(s) if with_abs else s
    qb, kb = C.bits_view(q), C.bits_view(k)
    name = C.name_of(q.dtype)
    if u:
        _scores_kernel[(u,)](qb, *qb.stride(), kb, *kb.stride(), s, a, bq, bkv, d, float(descale),
                             DT=code(name), W=q.element_size(), BQP=pad(bq), BKVP=pad(bkv), DP=pad(d),
                             WITH_ABS=with_abs, INTERP=C.interpreting(), **C.launch_options(dev))
    return (s, a) if with_abs else s


def scores_host(q: torch.Tensor, k: torch.Tensor, descale: float = 1.0) -> torch.Tensor:
    """Host spec: float64 q @ k^T * descale (exact products of the decoded operands)."""
    reasons = check_supported(q, k)
    if reasons:
        raise C.reasons_error(reasons)
    return torch.einsum("urd,ucd->urc", q.detach().cpu().double(), k.detach().cpu().double()) * float(descale)

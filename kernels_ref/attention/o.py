"""O stage: the output accumulator after one KV block, rescaled by the online softmax.

Data path: acc [BQ, Dv] fp32 before the block, alpha [BQ] (softmax_state's rescale), P [BQ, BKV] in
its operand type and the V tile [BKV, Dv] (decoded exactly to fp32) -> acc' = alpha * acc + P @ V,
an fp32 dot over the block's keys. Scale factors (descale_v / p_scale) wait for normalize, as
FlashAttention-3 applies them in its epilogue.

Constraints: P and V of one type (bf16, fp16 or e4m3). The host spec is float64.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref.attention._tile import _dot32, _load_f32, code, pad, tiles_reasons
from kernels_ref.attention.geometry import P_DTYPES


@triton.jit
def _o_step(acc, alpha, p, v, INTERP: tl.constexpr):
    """alpha * acc + p @ v, fp32 tiles."""
    return acc * alpha[:, None] + _dot32(p, v, INTERP)


@triton.jit
def _o_kernel(acc_ptr, a_ptr, p_ptr, sp_u, sp_r, sp_c, v_ptr, sv_u, sv_r, sv_c, out_ptr, BQ, BKV, DV,
              BQP: tl.constexpr, BKVP: tl.constexpr, DVP: tl.constexpr, DT: tl.constexpr, W: tl.constexpr,
              INTERP: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BQP)
    c = tl.arange(0, DVP)
    ok = (r[:, None] < BQ) & (c[None, :] < DV)
    acc = tl.load(acc_ptr + u * BQ * DV + r[:, None] * DV + c[None, :], mask=ok, other=0.0)
    alpha = tl.load(a_ptr + u * BQ + r, mask=r < BQ, other=0.0)
    p = _load_f32(p_ptr + u * sp_u, sp_r, sp_c, BQ, BKV, BQP, BKVP, DT, W)
    v = _load_f32(v_ptr + u * sv_u, sv_r, sv_c, BKV, DV, BKVP, DVP, DT, W)
    tl.store(out_ptr + u * BQ * DV + r[:, None] * DV + c[None, :], _o_step(acc, alpha, p, v, INTERP), mask=ok)


def check_supported(acc, alpha, p, v) -> list[str]:
    reasons = tiles_reasons((("acc", acc),), ("fp32",)) + tiles_reasons((("alpha", alpha),), ("fp32",), 2)
    reasons += tiles_reasons((("p", p), ("v", v)), P_DTYPES)
    if reasons:
        return reasons
    if p.dtype != v.dtype:
        reasons.append(f"p is {p.dtype} but v is {v.dtype}: the second MMA reads one operand type")
    u, bq, dv = acc.shape
    if tuple(alpha.shape) != (u, bq) or tuple(p.shape[:2]) != (u, bq) or tuple(v.shape) != (u, p.shape[2], dv):
        reasons.append(f"shapes do not fit: acc {list(acc.shape)}, alpha {list(alpha.shape)}, p {list(p.shape)}, "
                       f"v {list(v.shape)} (acc [U, BQ, Dv], alpha [U, BQ], p [U, BQ, BKV], v [U, BKV, Dv])")
    return reasons


def o_step(acc: torch.Tensor, alpha: torch.Tensor, p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """alpha * acc + P @ V for stacked tiles, fp32 [U, BQ, Dv]."""
    reasons = check_supported(acc, alpha, p, v)
    if reasons:
        raise C.reasons_error(reasons)
    dev = C.check_device(("acc", acc), ("alpha", alpha), ("p", p), ("v", v))
    acc, alpha = acc.contiguous(), alpha.contiguous()
    u, bq, dv = acc.shape
    bkv = p.shape[2]
    out = torch.empty_like(acc)
    pb, vb = C.bits_view(p), C.bits_view(v)
    if u:
        _o_kernel[(u,)](acc, alpha, pb, *pb.stride(), vb, *vb.stride(), out, bq, bkv, dv, BQP=pad(bq),
                        BKVP=pad(bkv), DVP=pad(dv), DT=code(C.name_of(p.dtype)), W=p.element_size(),
                        INTERP=C.interpreting(), **C.launch_options(dev))
    return out


def o_step_host(acc, alpha, p, v) -> torch.Tensor:
    """Host spec (float64) of `o_step`."""
    reasons = check_supported(acc, alpha, p, v)
    if reasons:
        raise C.reasons_error(reasons)
    acc, alpha, p, v = (t.detach().cpu().double() for t in (acc, alpha, p, v))
    return acc * alpha[..., None] + torch.einsum("urc,ucd->urd", p, v)

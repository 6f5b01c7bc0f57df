"""Combine stage: split-KV partials merged by their LSE, the reduce of attention.

Data path: S partials of one row, each a normalised O_s [Dv] fp32 and its LSE_s (over the keys of
its split; -inf for a split that saw none) -> M = max_s LSE_s -> w_s = exp(LSE_s - M) -> LSE =
M + log(sum_s w_s) -> O = sum_s (w_s / sum w) O_s. A row no split saw (M = -inf) gets O = 0 and
LSE = -inf. Partials are merged in split order. The host spec is float64.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref.attention._tile import pad, tiles_reasons


@triton.jit
def _combine_rows(o_ptr, lse_ptr, s_o, s_l, rows, R, DV, S: tl.constexpr, RP: tl.constexpr, DVP: tl.constexpr):
    """(O [RP, DVP], LSE [RP]) of rows `rows` merged over S partials (partial s at o_ptr + s * s_o)."""
    c = tl.arange(0, DVP)
    ok_r = rows < R
    ok = ok_r[:, None] & (c[None, :] < DV)
    mx = tl.full([RP], float("-inf"), tl.float32)
    for s in tl.static_range(S):
        mx = tl.maximum(mx, tl.load(lse_ptr + s * s_l + rows, mask=ok_r, other=float("-inf")))
    m_use = tl.where(mx == float("-inf"), 0.0, mx)
    sw = tl.zeros([RP], tl.float32)
    acc = tl.zeros([RP, DVP], tl.float32)
    for s in tl.static_range(S):
        w = tl.exp(tl.load(lse_ptr + s * s_l + rows, mask=ok_r, other=float("-inf")) - m_use)
        sw = sw + w
        acc = acc + w[:, None] * tl.load(o_ptr + s * s_o + rows[:, None] * DV + c[None, :], mask=ok, other=0.0)
    seen = sw != 0.0  # no partial saw a key; a NaN partial stays NaN
    o = acc * tl.where(seen, 1.0 / tl.where(seen, sw, 1.0), 0.0)[:, None]
    lse = tl.where(seen, m_use + tl.log(tl.where(seen, sw, 1.0)), float("-inf"))
    return o, lse


@triton.jit(do_not_specialize=("R", "DV"))
def _combine_kernel(o_ptr, lse_ptr, out_ptr, lse_out_ptr, R, DV, S: tl.constexpr, RP: tl.constexpr,
                    DVP: tl.constexpr):
    rows = tl.program_id(0) * RP + tl.arange(0, RP)
    o, lse = _combine_rows(o_ptr, lse_ptr, R * DV, R, rows, R, DV, S, RP, DVP)
    c = tl.arange(0, DVP)
    tl.store(out_ptr + rows[:, None] * DV + c[None, :], o, mask=(rows[:, None] < R) & (c[None, :] < DV))
    tl.store(lse_out_ptr + rows, lse, mask=rows < R)


def check_supported(o_parts, lse_parts) -> list[str]:
    reasons = tiles_reasons((("o_parts", o_parts),), ("fp32",)) + tiles_reasons((("lse_parts", lse_parts),),
                                                                                 ("fp32",), 2)
    if not reasons and tuple(lse_parts.shape) != tuple(o_parts.shape[:2]):
        reasons.append(f"lse_parts {list(lse_parts.shape)} must be [splits, rows] of o_parts {list(o_parts.shape)}")
    if not reasons and o_parts.shape[0] < 1:
        reasons.append("there must be at least one partial")
    return reasons


def combine(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """(O [R, Dv] fp32, LSE [R] fp32) of partials o_parts [S, R, Dv] and lse_parts [S, R]."""
    reasons = check_supported(o_parts, lse_parts)
    if reasons:
        raise C.reasons_error(reasons)
    dev = C.check_device(("o_parts", o_parts), ("lse_parts", lse_parts))
    o_parts, lse_parts = o_parts.contiguous(), lse_parts.contiguous()
    s, r, dv = o_parts.shape
    out = torch.empty((r, dv), dtype=torch.float32, device=dev)
    lse = torch.empty((r,), dtype=torch.float32, device=dev)
    rp = 16
    if r:
        _combine_kernel[(triton.cdiv(r, rp),)](o_parts, lse_parts, out, lse, r, dv, S=s, RP=rp, DVP=pad(dv),
                                               **C.launch_options(dev))
    return out, lse


def combine_host(o_parts, lse_parts):
    """Host spec (float64) of `combine`."""
    reasons = check_supported(o_parts, lse_parts)
    if reasons:
        raise C.reasons_error(reasons)
    o, lse = o_parts.detach().cpu().double(), lse_parts.detach().cpu().double()
    mx = lse.amax(dim=0)
    m_use = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
    w = torch.exp(lse - m_use)
    sw = w.sum(dim=0)
    seen = sw != 0
    safe = torch.where(seen, sw, torch.ones_like(sw))
    out = torch.where(seen[:, None], (w[..., None] * o).sum(dim=0) / safe[:, None], torch.zeros_like(o[0]))
    return out, torch.where(seen, m_use + torch.log(safe), torch.full_like(mx, float("-inf")))

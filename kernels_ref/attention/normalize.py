"""Normalize stage: the finished O and LSE of one unit.

Data path: acc [BQ, Dv] fp32, the final row max m and row sum l, and `factor` (descale_v / p_scale:
1 for 16-bit types) -> O = acc * (factor / l) fp32, LSE = m + log(l) (natural log, the unscaled
units of the masked scores). A fully masked row (l = 0: it saw no key) gets O = 0 and LSE = -inf,
as FlashAttention defines it (FlashAttention-2's non-split kernels write +inf there:
oracle.problem.attention's `empty_lse`). The host spec is float64.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref.attention._tile import _unit_rows, pad, row_state_inputs, row_state_reasons


@triton.jit
def _normalize_tile(acc, m, l, factor):
    """(O [BQP, DVP], LSE [BQP]) of an accumulator; rows with l = 0 give 0 and -inf (a NaN l stays NaN)."""
    seen = l != 0.0
    inv = tl.where(seen, factor / tl.where(seen, l, 1.0), 0.0)
    o = tl.where(seen[:, None], acc * inv[:, None], 0.0)  # 0 even where 0 * an infinite V made the accumulator NaN
    lse = tl.where(seen, m + tl.log(tl.where(seen, l, 1.0)), float("-inf"))
    return o, lse


@triton.jit
def _normalize_kernel(acc_ptr, m_ptr, l_ptr, o_ptr, lse_ptr, BQ, DV, factor, BQP: tl.constexpr, DVP: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    acc, m, l, r, c, ok = _unit_rows(acc_ptr, m_ptr, l_ptr, u, BQ, DV, 0.0, BQP, DVP)
    o, lse = _normalize_tile(acc, m, l, factor)
    tl.store(o_ptr + u * BQ * DV + r[:, None] * DV + c[None, :], o, mask=ok)
    tl.store(lse_ptr + u * BQ + r, lse, mask=r < BQ)


def check_supported(acc, m, l) -> list[str]:
    return row_state_reasons("acc", acc, m, l)


def normalize(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, factor: float = 1.0):
    """(O [U, BQ, Dv] fp32, LSE [U, BQ] fp32)."""
    dev, acc, m, l = row_state_inputs("acc", acc, m, l)
    u, bq, dv = acc.shape
    o, lse = torch.empty_like(acc), torch.empty_like(m)
    if u:
        _normalize_kernel[(u,)](acc, m, l, o, lse, bq, dv, float(factor), BQP=pad(bq), DVP=pad(dv),
                                **C.launch_options(dev))
    return o, lse


def normalize_host(acc, m, l, factor: float = 1.0):
    """Host spec (float64) of `normalize`."""
    reasons = check_supported(acc, m, l)
    if reasons:
        raise C.reasons_error(reasons)
    acc, m, l = (t.detach().cpu().double() for t in (acc, m, l))
    seen = l != 0  # a row that saw no key; a NaN l (a NaN score) stays NaN, as in the kernel
    safe = torch.where(seen, l, torch.ones_like(l))
    o = torch.where(seen[..., None], acc * (factor / safe)[..., None], torch.zeros_like(acc))
    lse = torch.where(seen, m + torch.log(safe), torch.full_like(m, float("-inf")))
    return o, lse

"""Reduce stage: a split tile's partial accumulators summed into the one the epilogue reads.

Data path: partials [P, R, C] fp32 (in k order: partial 0 first) -> r = fp32(...fp32(fp32(p0 + p1)
+ p2)... + p_{P-1}), one rounding per addition, in partial order (a serial split-K fix-up, or a
reduction kernel that walks the workspace in order). Optionally S = sum_p |p_p| beside it, for the
comparator's bound of a reduction done in another order.

Constraints: fp32 partials; P >= 1; any R, C. The host spec emulates the same additions in float64
rounded to fp32 after each one.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C


@triton.jit
def _reduce_kernel(x_ptr, s_p, out_ptr, abs_ptr, n, P: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x_ptr + offs, mask=mask, other=0.0)
    s = tl.abs(acc)
    for p in tl.static_range(1, P):
        v = tl.load(x_ptr + p * s_p + offs, mask=mask, other=0.0)
        acc = acc + v
        s = s + tl.abs(v)
    tl.store(out_ptr + offs, acc, mask=mask)
    tl.store(abs_ptr + offs, s, mask=mask)


def check_supported(partials: torch.Tensor) -> list[str]:
    reasons = []
    if not isinstance(partials, torch.Tensor) or partials.dim() != 3:
        reasons.append("partials must be a 3-D tensor [P, rows, cols]")
    elif partials.dtype != torch.float32:
        reasons.append(f"partials must be float32, got {partials.dtype}")
    elif partials.shape[0] < 1:
        reasons.append("there must be at least one partial")
    return reasons


def reduce_partials(partials: torch.Tensor, with_abs_sum: bool = False):
    """The partials summed in order, fp32 [R, C]; with_abs_sum also returns sum |p| (fp32)."""
    reasons = check_supported(partials)
    if reasons:
        raise C.reasons_error(reasons)
    x = partials.contiguous()
    p, r, c = x.shape
    out = torch.empty((r, c), dtype=torch.float32, device=x.device)
    absum = torch.empty_like(out)
    n = r * c
    block = 1024
    _reduce_kernel[(max(1, triton.cdiv(n, block)),)](x, r * c, out, absum, n, P=p, BLOCK=block,
                                                     **C.launch_options(x.device))
    return (out, absum) if with_abs_sum else out


def reduce_partials_host(partials: torch.Tensor) -> torch.Tensor:
    """Host spec of `reduce_partials` (float64 CPU holding fp32 values)."""
    reasons = check_supported(partials)
    if reasons:
        raise C.reasons_error(reasons)
    x = partials.detach().cpu().double()
    acc = x[0].float().double()
    for p in range(1, x.shape[0]):
        acc = (acc + x[p]).float().double()
    return acc

"""Softmax-state stage: the online softmax after one KV block, as FlashAttention-2 keeps it.

Data path: masked scores x [BQ, BKV] fp32, the running row max m and row sum l before the block
-> m_new = max(m, max_j x_j) -> m_use = m_new, or 0 where m_new = -inf (a row that has seen no
key yet: exp(-inf - 0) = 0 keeps it empty, never NaN) -> alpha = exp(m - m_use) (the rescale of
everything accumulated so far) -> p = exp(x - m_use) in fp32 -> l_new = alpha * l + sum_j p.
The sum reads P in fp32, before P is rounded to the second MMA's operand type (FA2's row_sum).

Base 2: FlashAttention computes exp2(x * log2(e) - m * log2(e)) (ex2.approx.f32), with the scale
folded into log2(e); mathematically the same numbers, rounded differently: the bound model
(oracle.judging.attention_tolerance) carries ex2's error and the extra multiply. This reference
uses tl.exp in fp32. The host spec is float64.
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
def _softmax_step(x, m, l):
    """(m_new, alpha, p fp32, l_new) after a block of masked scores x [BQP, BKVP]."""
    m_new = tl.maximum(m, tl.max(x, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_use)
    p = tl.exp(x - m_use[:, None])
    l_new = alpha * l + tl.sum(p, axis=1)
    return m_new, alpha, p, l_new


@triton.jit
def _softmax_kernel(x_ptr, m_ptr, l_ptr, mo_ptr, a_ptr, lo_ptr, BQ, BKV, BQP: tl.constexpr, BKVP: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    x, m, l, r, _c, _ok = _unit_rows(x_ptr, m_ptr, l_ptr, u, BQ, BKV, float("-inf"), BQP, BKVP)
    m_new, alpha, p, l_new = _softmax_step(x, m, l)
    tl.store(mo_ptr + u * BQ + r, m_new, mask=r < BQ)
    tl.store(a_ptr + u * BQ + r, alpha, mask=r < BQ)
    tl.store(lo_ptr + u * BQ + r, l_new, mask=r < BQ)


def check_supported(x, m, l) -> list[str]:
    return row_state_reasons("x", x, m, l)


def softmax_state(x: torch.Tensor, m: torch.Tensor, l: torch.Tensor):
    """(m_new, alpha, l_new), each [U, BQ] fp32, after masked scores x [U, BQ, BKV] fp32."""
    dev, x, m, l = row_state_inputs("x", x, m, l)
    u, bq, bkv = x.shape
    m_new, alpha, l_new = torch.empty_like(m), torch.empty_like(m), torch.empty_like(l)
    if u:
        _softmax_kernel[(u,)](x, m, l, m_new, alpha, l_new, bq, bkv, BQP=pad(bq), BKVP=pad(bkv),
                              **C.launch_options(dev))
    return m_new, alpha, l_new


def softmax_state_host(x: torch.Tensor, m: torch.Tensor, l: torch.Tensor):
    """Host spec (float64) of `softmax_state`."""
    reasons = check_supported(x, m, l)
    if reasons:
        raise C.reasons_error(reasons)
    return step_host(x, m, l)


def step_host(x: torch.Tensor, m: torch.Tensor, l: torch.Tensor):
    """(m_new, alpha, l_new) in float64 of any float x [.., BKV], m and l [..]."""
    x, m, l = (t.detach().cpu().double() for t in (x, m, l))
    m_new = torch.maximum(m, x.amax(dim=-1))
    m_use = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_use)
    return m_new, alpha, alpha * l + torch.exp(x - m_use[..., None]).sum(dim=-1)


def trajectory_host(blocks) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(m, l) after every block of a list of masked-score tiles [U, BQ, BKV_b], float64."""
    u, bq = blocks[0].shape[:2]
    m = torch.full((u, bq), float("-inf"), dtype=torch.float64)
    l = torch.zeros((u, bq), dtype=torch.float64)
    out = []
    for x in blocks:
        m, _, l = step_host(x, m, l)
        out.append((m, l))
    return out

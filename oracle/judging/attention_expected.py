"""The expected O and LSE of an attention problem and their per-element bounds, in the layouts the
kernel writes them: what `store` compares a run with, for a judge that runs without Python (the
standalone reproducer's expected_o.bin / bound_o.bin / expected_lse.bin / bound_lse.bin).

Data path: the inputs (q, k, v and the layout's offsets and page table) -> the reference forward
(kernels_ref.attention.forward.attention_forward, with its statistics, on the reference device,
as oracle.judging.attention_analysis judges `store`) -> the bounds of
oracle.judging.attention_tolerance.output_bound per element -> back from the reference's rows
(batch, head, query) to FlashAttention's layouts: O like q with head_dim_v, LSE [batch, heads_q,
seqlen_q] (varlen: O [total_q, heads_q, head_dim_v], LSE [heads_q, total_q]).

Constraints: a fully masked row expects O = 0 and the LSE the problem declares (empty_lse: -inf, or
+inf for FlashAttention-2's non-split kernels). The reference is cross-checked against the float64
specification (attention_forward_host) on a few (batch, head) pairs, as the analysis does; what it
finds is returned, never hidden (a caller refuses a reference that disagrees with its specification).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernels_ref.attention.forward import attention_forward
from kernels_ref.attention.geometry import layout
from oracle.judging.attention_analysis import cross_check, params_of, rows_of
from oracle.judging.attention_stages import sequence_args
from oracle.judging.attention_tolerance import output_bound


@dataclass(frozen=True)
class AttentionExpected:
    """The reference O (fp32, O's layout) and LSE (fp32, LSE's layout, the problem's empty_lse in a
    fully masked row), each with its float64 per-element bound, and what the cross-check found."""

    o: torch.Tensor
    o_bound: torch.Tensor
    lse: torch.Tensor
    lse_bound: torch.Tensor
    cross_check: tuple[str, ...]  # disagreements of the reference with the float64 specification

    def __post_init__(self) -> None:
        for name, value, bound in (("o", self.o, self.o_bound), ("lse", self.lse, self.lse_bound)):
            if tuple(value.shape) != tuple(bound.shape):
                raise ValueError(f"{name}_bound has shape {list(bound.shape)}, {name} {list(value.shape)}")
            if bound.dtype != torch.float64 or value.dtype != torch.float32:
                raise ValueError(f"{name} must be fp32 and its bound fp64, got {value.dtype} and {bound.dtype}")


def _layout_of(rows: torch.Tensor, lay, varlen: bool, lse: bool) -> torch.Tensor:
    """[batch, heads_q, max_q, C] rows -> O's layout (lse=False) or LSE's (lse=True, C = 1)."""
    lengths = [int(n) for n in lay.lq.tolist()]
    if lse:
        x = rows[..., 0]
        if not varlen:
            return x[:, :, :lengths[0] if lengths else 0].contiguous()
        return torch.cat([x[b, :, :n] for b, n in enumerate(lengths)], dim=1).contiguous()
    if not varlen:
        return rows[:, :, :lengths[0] if lengths else 0].permute(0, 2, 1, 3).contiguous()
    return torch.cat([rows[b, :, :n].permute(1, 0, 2) for b, n in enumerate(lengths)], dim=0).contiguous()


def expected_attention(spec, ops, device: Optional[torch.device] = None) -> AttentionExpected:
    """The expected O and LSE of `spec` on `ops` (anything with q, k, v, cu_seqlens_q, cu_seqlens_k,
    page_table: oracle.run.attention_inputs.AttentionOperands, an AttentionRecording) with their
    bounds (module docstring), on `device` (default: the reference device)."""
    from oracle.judging.differential.analysis import reference_device

    dev = device or reference_device()
    q, k, v = (t.detach().to(dev) for t in (ops.q, ops.k, ops.v))
    o_ref, lse_ref, stats = attention_forward(q, k, v, params_of(spec), **sequence_args(spec, ops, dev),
                                              with_stats=True)
    cross = tuple(cross_check(spec, ops, o_ref, lse_ref, stats, dev))
    lay = layout(ops.q, ops.k, **sequence_args(spec, ops))
    v_abs = float(ops.v.detach().float().abs().amax()) if ops.v.numel() else 0.0
    b, hq, maxq = stats.rows_shape
    e_o = rows_of(o_ref.cpu(), spec, lay, spec.varlen_q)
    e_l = rows_of(lse_ref.cpu(), spec, lay, spec.varlen_q, True)
    b_o, b_l = output_bound(spec, _cpu(stats), e_o.reshape(-1, spec.head_dim_v), e_l.reshape(-1), v_abs)
    if spec.empty_lse == "+inf":
        lse_ref = torch.where(lse_ref == float("-inf"), torch.full_like(lse_ref, float("inf")), lse_ref)
    o_bound = _layout_of(b_o.reshape(b, hq, maxq, -1), lay, spec.varlen_q, False)
    lse_bound = _layout_of(b_l.reshape(b, hq, maxq, 1), lay, spec.varlen_q, True)
    return AttentionExpected(o_ref.float().cpu().contiguous(), o_bound.double(), lse_ref.float().cpu().contiguous(),
                             lse_bound.double(), cross)


def _cpu(stats):
    """The reference's statistics on the CPU (the bound is computed there, beside the layouts)."""
    from dataclasses import replace

    return replace(stats, qk_abs=stats.qk_abs.cpu(), s_abs=stats.s_abs.cpu(), keys=stats.keys.cpu(),
                   av=stats.av.cpu())

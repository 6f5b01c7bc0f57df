"""The attention problem and output-only recording a check of these tensors describes.

Tensors are in FlashAttention's layout (the one flash_attn_func / flash_attn_varlen_func /
flash_attn_with_kvcache take; torch's scaled_dot_product_attention takes [batch, heads, seqlen, dim],
so transpose(1, 2) its tensors first): q [batch, seqlen_q, heads_q, head_dim], k / v [batch,
seqlen_k, heads_kv, dim], o like q with head_dim_v, lse [batch, heads_q, seqlen_q] fp32. With
cu_seqlens_q, q and o are [total_q, heads, dim] and lse [heads_q, total_q] (cu_seqlens_k: k and v
[total_k, heads_kv, dim]). With a page_table [batch, max_pages], k and v are a paged cache
[num_pages, page_size, heads_kv, dim]; cu_seqlens_k then gives each sequence's key count (else
every page is full). `causal` True is FlashAttention's causal (bottom-right aligned: query i sees
keys j <= i + seqlen_k - seqlen_q), the strings "top_left" (torch SDPA's is_causal) and
"bottom_right" name the alignment, False / "none" no causal mask.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from kernels_ref.dtypes import name_of
from oracle.problem.attention import AttentionSpec
from oracle.problem.spec import SpecError
from oracle.run.attention_recording import AttentionRecording
from oracle.run.inputs import Provenance


def _tensor(name: str, t: Any, dims: Optional[int] = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise SpecError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout is not torch.strided or t.device.type == "meta":
        raise SpecError(f"{name} must be a dense tensor with values (got a {t.layout} tensor on {t.device})")
    if dims is not None and t.dim() != dims:
        raise SpecError(f"{name} must be {dims}-D here, got shape {list(t.shape)} (module docstring: the layouts)")
    return t


def _dtype(name: str, t: torch.Tensor) -> str:
    try:
        return name_of(t.dtype)
    except ValueError:
        raise SpecError(f"{name} has dtype {t.dtype}, which the oracle has no name for") from None


def _lengths(name: str, cu: torch.Tensor) -> tuple[int, ...]:
    _tensor(name, cu, 1)
    c = cu.detach().cpu().to(torch.int64)
    if c.numel() < 2 or int(c[0]) != 0 or bool((c[1:] < c[:-1]).any()):
        raise SpecError(f"{name} = {c.tolist()[:8]} must be [batch + 1] non-decreasing offsets starting at 0")
    return tuple((c[1:] - c[:-1]).tolist())


def _causal(causal: Any) -> str:
    if causal is True:
        return "bottom_right"
    if causal is False or causal is None:
        return "none"
    if isinstance(causal, str):
        return causal
    raise SpecError(f"causal={causal!r} is not allowed: True (FlashAttention's bottom-right), False, 'none', "
                    f"'top_left' or 'bottom_right'")


def _scalar(name: str, v: Any) -> Optional[float]:
    if v is None or isinstance(v, (int, float)):
        return v
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach().float().cpu())
    raise SpecError(f"{name} must be a number (or a one-element tensor): per-head descales are not modelled, got "
                    f"{type(v).__name__}{list(v.shape) if isinstance(v, torch.Tensor) else ''}")


def attention_problem_of(q, k, v, o, lse=None, *, causal: Any = False, window=None, softmax_scale=None,
                         softcap: float = 0.0, cu_seqlens_q=None, cu_seqlens_k=None, page_table=None,
                         **fields) -> AttentionSpec:
    """The AttentionSpec these tensors describe; `fields` add or override AttentionSpec fields
    (block_q, block_kv, splits, descale_q / _k / _v, p_scale, empty_lse, ...)."""
    varlen_q, paged, varlen_k = cu_seqlens_q is not None, page_table is not None, cu_seqlens_k is not None
    _tensor("q", q, 3 if varlen_q else 4)
    _tensor("o", o, 3 if varlen_q else 4)
    _tensor("k", k, 3 if varlen_k and not paged else 4)
    _tensor("v", v, k.dim())
    kw: dict[str, Any] = {}
    if varlen_q:
        lq = _lengths("cu_seqlens_q", cu_seqlens_q)
        batch, seqlen_q = len(lq), max(lq)
        if sum(lq) != q.shape[0]:
            raise SpecError(f"cu_seqlens_q ends at {sum(lq)} but q holds {q.shape[0]} tokens")
        kw["seqlens_q"] = lq
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
    heads_q, head_dim = q.shape[-2], q.shape[-1]
    heads_kv = k.shape[-2]
    if paged:
        _tensor("page_table", page_table, 2)
        if page_table.shape[0] != batch:
            raise SpecError(f"page_table has {page_table.shape[0]} rows for {batch} sequences")
        kw.update(page_size=k.shape[1], num_pages=k.shape[0], max_pages=page_table.shape[1])
        lk = _lengths("cu_seqlens_k", cu_seqlens_k) if varlen_k else (k.shape[1] * page_table.shape[1],) * batch
        kw["seqlens_k"] = lk if varlen_k else None
        seqlen_k = max(lk)
    elif varlen_k:
        lk = _lengths("cu_seqlens_k", cu_seqlens_k)
        if sum(lk) != k.shape[0]:
            raise SpecError(f"cu_seqlens_k ends at {sum(lk)} but k holds {k.shape[0]} tokens")
        kw["seqlens_k"], seqlen_k = lk, max(lk)
    else:
        if k.shape[0] != batch:
            raise SpecError(f"k has batch {k.shape[0]}, q has {batch}")
        seqlen_k = k.shape[1]
    if len(lk if (paged or varlen_k) else (seqlen_k,) * batch) != batch:
        raise SpecError(f"cu_seqlens_k names {len(lk)} sequences, q has {batch}")
    if window is not None and tuple(window) == (-1, -1):
        window = None
    kw.update(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
              head_dim=head_dim, head_dim_v=v.shape[-1], causal=_causal(causal),
              window=None if window is None else tuple(window), softmax_scale=softmax_scale, softcap=softcap,
              q_dtype=_dtype("q", q), k_dtype=_dtype("k", k), v_dtype=_dtype("v", v), o_dtype=_dtype("o", o),
              lse=lse is not None)
    for f in ("descale_q", "descale_k", "descale_v", "p_scale"):
        if f in fields:
            fields[f] = _scalar(f, fields[f])
    kw.update(fields)
    try:
        return AttentionSpec(**kw)
    except TypeError as e:
        raise SpecError(f"check_attention: {e}") from None


def attention_recording_of(q, k, v, o, lse=None, *, kernel: str = "check_attention", cu_seqlens_q=None,
                           cu_seqlens_k=None, page_table=None, provenance: Optional[Provenance] = None,
                           **fields) -> AttentionRecording:
    """An output-only attention recording of O (and LSE) for the differential (no taps).
    `provenance`: how q, k, v were made (oracle.run.attention_inputs' operands carry it); by
    default "captured" (not controlled)."""
    spec = attention_problem_of(q, k, v, o, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                page_table=page_table, **fields)
    if lse is not None:
        _tensor("lse", lse)
    det = (lambda t: None if t is None else t.detach())
    rec = AttentionRecording(spec=spec, q=q.detach(), k=k.detach(), v=v.detach(), output=o.detach(),
                             provenance=provenance or Provenance("captured"), lse=det(lse), cu_seqlens_q=det(cu_seqlens_q),
                             cu_seqlens_k=det(cu_seqlens_k), page_table=det(page_table), kernel=kernel)
    rec.validate()
    return rec

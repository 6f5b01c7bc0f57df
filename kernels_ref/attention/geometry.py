"""Where every query and key of an attention problem lives, and which keys a query may see.

Data path (host only, no kernels): the parameters of one attention forward (`AttnParams`, the one
params object the stage launchers and the fused forward share), the per-sequence lengths and token
offsets of dense, variable-length (cu_seqlens) and paged (page table) layouts, the GQA head map
h_kv = h_q // (heads_q // heads_kv), and the mask as a float64-free boolean rule (`allowed_host`).

Layouts are FlashAttention's: dense q [batch, seqlen_q, heads_q, head_dim], k / v [batch, seqlen_k,
heads_kv, dim]; variable length q [total_q, heads_q, head_dim] with cu_seqlens_q [batch + 1] (k
likewise); paged k / v [num_pages, page_size, heads_kv, dim] with a page table [batch, max_pages]
(int32) and each sequence's key count. LSE is [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]).

Mask of query i, key j of one sequence (lq, lk); off = lk - lq, or 0 for causal "top_left":
j < lk, and causal: j <= i + off, and window (left, right) (-1 unbounded): i + off - left <= j <=
i + off + right. Rows i >= lq are padding and see nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from kernels_ref._reasons import refuse

CAUSAL = ("none", "top_left", "bottom_right")
P_DTYPES = ("bf16", "fp16", "e4m3")


@dataclass(frozen=True)
class AttnParams:
    """Everything but the tensors: scale and softcap of the scores, the mask, the tile (block_q
    query rows, block_kv keys), P's operand type and scale, the fp8 descales, split-KV count."""

    scale: float
    softcap: float = 0.0
    causal: str = "none"
    window: tuple[int, int] = (-1, -1)
    block_q: int = 64
    block_kv: int = 64
    p_dtype: str = "bf16"
    p_scale: float = 1.0
    descale_q: float = 1.0
    descale_k: float = 1.0
    descale_v: float = 1.0
    splits: int = 1

    def __post_init__(self) -> None:
        refuse(self.reasons())

    def reasons(self) -> list[str]:
        out = []
        for f in ("scale", "p_scale", "descale_q", "descale_k", "descale_v"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                out.append(f"{f}={v!r} must be a positive, finite number")
        if not (isinstance(self.softcap, (int, float)) and math.isfinite(self.softcap) and self.softcap >= 0):
            out.append(f"softcap={self.softcap!r} must be 0 or a positive, finite number")
        if self.causal not in CAUSAL:
            out.append(f"causal={self.causal!r}; allowed: {', '.join(CAUSAL)}")
        if len(self.window) != 2 or any(not isinstance(w, int) or w < -1 for w in self.window):
            out.append(f"window={self.window!r} must be (left, right), integers >= -1")
        for f in ("block_q", "block_kv", "splits"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                out.append(f"{f}={v!r} must be a positive integer")
        if self.p_dtype not in P_DTYPES:
            out.append(f"p_dtype={self.p_dtype!r}; allowed: {', '.join(P_DTYPES)}")
        return out

    @property
    def top_left(self) -> bool:
        return self.causal == "top_left"


@dataclass(frozen=True)
class Layout:
    """Per sequence: query / key counts and the token row where each starts in the [tokens, heads,
    dim] views of q and k (paged: keys are found through the page table instead)."""

    lq: torch.Tensor  # [batch] int32
    lk: torch.Tensor
    q_start: torch.Tensor
    k_start: torch.Tensor
    max_q: int
    max_k: int


def _lengths(cu: torch.Tensor, name: str) -> torch.Tensor:
    cu = cu.detach().to("cpu", torch.int64).reshape(-1)
    if cu.numel() < 2 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"{name} must be [batch + 1] non-decreasing offsets starting at 0, got {cu.tolist()[:8]}")
    return cu


def layout(q: torch.Tensor, k: torch.Tensor, *, cu_seqlens_q=None, cu_seqlens_k=None, page_table=None,
           seqlens_k=None) -> Layout:
    """Lengths and start rows of every sequence, from the tensors' shapes and offsets."""
    if cu_seqlens_q is not None:
        cq = _lengths(cu_seqlens_q, "cu_seqlens_q")
        batch = cq.numel() - 1
        lq, q_start = (cq[1:] - cq[:-1]), cq[:-1]
    else:
        batch, sq = q.shape[0], q.shape[1]
        lq, q_start = torch.full((batch,), sq), torch.arange(batch) * sq
    if page_table is not None:
        max_k = page_table.shape[1] * k.shape[1]
        if seqlens_k is not None:
            lk = seqlens_k.detach().to("cpu", torch.int64).reshape(-1)
        elif cu_seqlens_k is not None:
            ck = _lengths(cu_seqlens_k, "cu_seqlens_k")
            lk = ck[1:] - ck[:-1]
        else:
            lk = torch.full((batch,), max_k)
        k_start = torch.zeros(batch, dtype=torch.int64)
    elif cu_seqlens_k is not None:
        ck = _lengths(cu_seqlens_k, "cu_seqlens_k")
        lk, k_start = ck[1:] - ck[:-1], ck[:-1]
    else:
        sk = k.shape[1]
        lk, k_start = torch.full((batch,), sk), torch.arange(batch) * sk
    if lk.numel() != batch:
        raise ValueError(f"{lk.numel()} key lengths for {batch} query sequences")
    i32 = (lambda t: t.to(torch.int32))
    return Layout(i32(lq), i32(lk), i32(q_start), i32(k_start), int(lq.max()) if batch else 0,
                  int(lk.max()) if batch else 0)


def token_view(x: torch.Tensor, varlen: bool, paged: bool = False) -> torch.Tensor:
    """[tokens, heads, dim]: a dense [B, L, H, D] tensor with its batch and length merged, a
    variable-length one as it is, a paged cache's [pages, page_size, H, D] with its pages merged."""
    if varlen and not paged:
        return x
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])


def kv_head(h_q: int, heads_q: int, heads_kv: int) -> int:
    """The KV head a query head reads (GQA / MQA: consecutive query heads share one)."""
    return h_q // (heads_q // heads_kv)


def allowed_host(i: torch.Tensor, j: torch.Tensor, lq: int, lk: int, p: AttnParams) -> torch.Tensor:
    """Boolean [len(i), len(j)]: may query i see key j (the module docstring's rule)."""
    i = i.reshape(-1, 1).to(torch.int64)
    j = j.reshape(1, -1).to(torch.int64)
    off = 0 if p.top_left else lk - lq
    ok = (j < lk) & (i < lq) & (j >= 0)
    if p.causal != "none":
        ok &= j <= i + off
    left, right = p.window
    if left >= 0:
        ok &= j >= i + off - left
    if right >= 0:
        ok &= j <= i + off + right
    return ok


def key_rows(b: int, lay: Layout, page_table: Optional[torch.Tensor], page_size: int) -> torch.Tensor:
    """Token rows (in token_view(k)) of sequence b's keys 0..lk-1, through the page table if any."""
    n = int(lay.lk[b])
    j = torch.arange(n)
    if page_table is None:
        return int(lay.k_start[b]) + j
    pages = page_table[b].detach().cpu().to(torch.int64)
    return pages[j // page_size] * page_size + j % page_size

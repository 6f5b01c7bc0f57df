"""A recorded attention run: the problem, Q, K, V (and the layout's offsets and page table), the
kernel's O and LSE. Output only for now: the trace protocol has no attention taps yet, so every
stage inside the kernel is unobserved and `store` is what is judged.

Shapes are FlashAttention's (kernels_ref.attention.geometry): dense q [batch, seqlen_q, heads_q,
head_dim], k / v [batch, seqlen_k, heads_kv, dim], o like q with head_dim_v, lse [batch, heads_q,
seqlen_q] fp32; varlen q / o [total_q, heads, dim] with cu_seqlens_q [batch + 1] and lse [heads_q,
total_q] (k / v likewise with cu_seqlens_k); paged k / v [num_pages, page_size, heads_kv, dim] with
page_table [batch, max_pages] int32 (key counts from cu_seqlens_k, else every page full).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch

from kernels_ref.dtypes import DTYPES
from oracle.problem.attention import AttentionSpec
from oracle.run.inputs import Provenance
from oracle.run.recording import RecordingError


@dataclass(frozen=True)
class AttentionRecording:
    spec: AttentionSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    output: Optional[torch.Tensor]  # O; None when the kernel never finished
    provenance: Provenance
    lse: Optional[torch.Tensor] = None
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None
    page_table: Optional[torch.Tensor] = None
    kernel: str = "unknown"
    kernel_error: Optional[str] = None
    synthetic: bool = False
    confounds: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    environment: Mapping[str, Any] = field(default_factory=dict)
    # what a GEMM recording also carries, empty here: no trace, no taps, nothing serialised
    trace = None
    taps: tuple = ()
    serialised: tuple = ()
    command: tuple = ()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape each tensor must have for the spec."""
        s = self.spec
        tq = sum(s.lengths_q)
        q = (tq, s.heads_q, s.head_dim) if s.varlen_q else (s.batch, s.seqlen_q, s.heads_q, s.head_dim)
        o = q[:-1] + (s.head_dim_v,)
        if s.paged:
            k = (s.num_pages, s.page_size, s.heads_kv)
        elif s.varlen_k:
            k = (sum(s.lengths_k), s.heads_kv)
        else:
            k = (s.batch, s.seqlen_k, s.heads_kv)
        lse = (s.heads_q, tq) if s.varlen_q else (s.batch, s.heads_q, s.seqlen_q)
        return {"q": q, "k": k + (s.head_dim,), "v": k + (s.head_dim_v,), "o": o, "lse": lse}

    def validate(self) -> None:
        """Raise RecordingError naming the tensor that does not fit the problem."""
        s, want = self.spec, self.shapes()
        for name, t, dt in (("q", self.q, s.q_dtype), ("k", self.k, s.k_dtype), ("v", self.v, s.v_dtype),
                            ("o", self.output, s.o_dtype), ("lse", self.lse, "fp32")):
            if t is None:
                continue
            if tuple(t.shape) != want[name]:
                raise RecordingError(f"{name} has shape {list(t.shape)}, {s.describe()} needs {list(want[name])}")
            if t.dtype != DTYPES[dt].torch:
                raise RecordingError(f"{name} has dtype {t.dtype}, the problem's is {dt} ({DTYPES[dt].torch})")
        if self.output is None and self.kernel_error is None:
            raise RecordingError("the recording has no output O and no kernel error")
        if s.lse and self.output is not None and self.lse is None:
            raise RecordingError("the problem says the kernel writes LSE (lse = true) but no LSE was given")
        for name, cu, lengths, on in (("cu_seqlens_q", self.cu_seqlens_q, s.lengths_q, s.varlen_q),
                                      ("cu_seqlens_k", self.cu_seqlens_k, s.lengths_k, s.varlen_k)):
            if on and cu is None:
                raise RecordingError(f"{name} is missing: the problem has variable lengths")
            if cu is not None:
                got = cu.detach().cpu().to(torch.int64)
                if got.dim() != 1 or got.numel() != s.batch + 1 or int(got[0]) != 0 or \
                        tuple((got[1:] - got[:-1]).tolist()) != tuple(lengths):
                    raise RecordingError(f"{name} = {got.tolist()[:8]} does not hold the lengths {list(lengths)[:8]}")
        if s.paged:
            pt = self.page_table
            if pt is None or tuple(pt.shape) != (s.batch, s.max_pages) or pt.dtype not in (torch.int32, torch.int64):
                raise RecordingError(f"page_table must be [{s.batch}, {s.max_pages}] int32 for a paged cache, got "
                                     f"{None if pt is None else (pt.dtype, list(pt.shape))}")
            used = [pt[b, :-(-n // s.page_size)] for b, n in enumerate(s.lengths_k)]
            flat = torch.cat(used) if used else pt.new_zeros(0)
            if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= s.num_pages):
                raise RecordingError(f"page_table names pages outside 0..{s.num_pages - 1}")
        elif self.page_table is not None:
            raise RecordingError("a page_table was given but the problem has no paged KV cache (page_size)")

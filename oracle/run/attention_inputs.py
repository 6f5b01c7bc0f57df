"""Controlled inputs of an attention problem: each ladder makes a bug point at itself.

`make_attention_operands(spec, ladder, seed)` returns q, k, v (and cu_seqlens, a page table) in
the problem's layout (FlashAttention's: oracle.run.attention_recording). Every value is exact in
the operand type. A paged cache's pages are dealt to the sequences in a seeded random order, so a
page-table bug reads another sequence's keys. What a correct output is, per ladder:

- ones: Q = K = V = 1. Every seen key scores the same, so O = 1 in every row that sees a key and
  LSE = x + log(n_i) (x = the masked score of q.k = head_dim, n_i = the keys row i sees); a fully
  masked row has O = 0, LSE = -inf.
- one_hot: K_j = e_(j mod head_dim), Q_i = c e_(t_i mod head_dim), with t_i a seeded random key row i
  may see and c large enough (c scale >= 64) that every other key's weight underflows to nothing:
  row i attends to the keys it may see with j = t_i (mod head_dim) equally: exactly key t_i when
  seqlen_k <= head_dim, and then O_i = V_(t_i). V_jd = (j mod 128) + (d mod 2) / 2, so O's value
  names the key it came from.
- index: Q = 0 (every seen key weighs 1 / n_i), V_jd = 1 if j = d (mod head_dim_v) else 0: O_id * n_i
  counts the seen keys j = d (mod head_dim_v), so with seqlen_k <= head_dim_v row i of O is the
  indicator of the keys it saw, divided by n_i: a mask off by one changes a column.
- large_logits: Q and K seeded normal times 16: scores of several hundred, whose exp overflows fp32
  in a softmax that does not subtract the row max: a correct O is finite (a weighted mean of V rows,
  within the V range), a kernel without the max shows Inf / NaN.
- masked_row: seeded normal values on a problem that has a fully masked row (bottom-right causal
  with seqlen_q > seqlen_k, a window, an empty key sequence): those rows must be O = 0 and
  LSE = -inf; a kernel that divides by l = 0 writes NaN there. Refused (InputError) for a problem
  without such a row.
- random[:seed]: seeded normal values (e4m3: clipped to its range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from kernels_ref.attention.geometry import AttnParams, allowed_host
from kernels_ref.dtypes import DTYPES
from oracle.problem.attention import AttentionSpec
from oracle.run.inputs import ATTENTION_LADDER as LADDER
from oracle.run.inputs import InputError, Provenance
FP8_MAX = 448.0


@dataclass(frozen=True)
class AttentionOperands:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    provenance: Provenance
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None
    page_table: Optional[torch.Tensor] = None


def _params(spec: AttentionSpec) -> AttnParams:
    return AttnParams(scale=spec.softmax_scale, causal=spec.causal, window=spec.window or (-1, -1))


def allowed(spec: AttentionSpec, b: int) -> torch.Tensor:
    """[lq, lk] booleans of sequence b: may query i see key j."""
    lq, lk = spec.lengths_q[b], spec.lengths_k[b]
    return allowed_host(torch.arange(lq), torch.arange(lk), lq, lk, _params(spec))


def fully_masked_rows(spec: AttentionSpec) -> list[tuple[int, int]]:
    """(sequence, query) of every row that sees no key."""
    out = []
    for b in range(spec.batch):
        seen = allowed(spec, b).any(dim=1)
        out.extend((b, int(i)) for i in (~seen).nonzero().flatten())
    return out


def _cast(x: torch.Tensor, dtype: str) -> torch.Tensor:
    if dtype == "e4m3":
        x = x.clamp(-FP8_MAX, FP8_MAX)
    return x.to(DTYPES[dtype].torch)


def _logical(spec: AttentionSpec, ladder: str, g: torch.Generator):
    """Per sequence b: q [lq, Hq, D], k [lk, Hkv, D], v [lk, Hkv, Dv] in float32."""
    hq, hk, d, dv = spec.heads_q, spec.heads_kv, spec.head_dim, spec.head_dim_v
    out = []
    for b in range(spec.batch):
        lq, lk = spec.lengths_q[b], spec.lengths_k[b]
        rnd = (lambda *shape, s=1.0: torch.randn(*shape, generator=g) * s)
        if ladder == "ones":
            q, k, v = torch.ones(lq, hq, d), torch.ones(lk, hk, d), torch.ones(lk, hk, dv)
        elif ladder == "one_hot":
            seen = allowed(spec, b)
            dq, dk = spec.descale_q or 1.0, spec.descale_k or 1.0
            c = 2.0 ** math.ceil(math.log2(64.0 / (spec.softmax_scale * dq * dk)))
            if spec.fp8:
                c = min(c, 256.0)
            q = torch.zeros(lq, hq, d)
            for i in range(lq):
                keys = seen[i].nonzero().flatten()
                if keys.numel():
                    t = int(keys[torch.randint(keys.numel(), (1,), generator=g)])
                    q[i, :, t % d] = c
            j = torch.arange(lk)
            k = torch.zeros(lk, hk, d)
            k[j, :, j % d] = 1.0
            col = torch.arange(dv)
            v = ((j % 128).float()[:, None] + (col % 2).float()[None, :] / 2)[:, None, :].expand(lk, hk, dv).clone()
        elif ladder == "index":
            q = torch.zeros(lq, hq, d)
            k = rnd(lk, hk, d)
            j, col = torch.arange(lk), torch.arange(dv)
            v = ((j[:, None] % dv) == col[None, :]).float()[:, None, :].expand(lk, hk, dv).clone()
        elif ladder == "large_logits":
            q, k, v = rnd(lq, hq, d, s=16.0), rnd(lk, hk, d, s=16.0), rnd(lk, hk, dv)
        else:  # random, masked_row
            q, k, v = rnd(lq, hq, d), rnd(lk, hk, d), rnd(lk, hk, dv)
        out.append((q, k, v))
    return out


def make_attention_operands(spec: AttentionSpec, ladder: str = "random", seed: int = 0) -> AttentionOperands:
    """Q, K, V (and offsets, page table) of `ladder` for `spec` (module docstring)."""
    if ladder not in LADDER:
        raise InputError(f"attention inputs {ladder!r} is not a ladder: one of {', '.join(LADDER)}")
    if ladder == "masked_row" and not fully_masked_rows(spec):
        raise InputError(f"masked_row needs a problem with a fully masked row; {spec.describe()} has none (use "
                         f"causal bottom_right with seqlen_q > seqlen_k, a window, or an empty key sequence)")
    g = torch.Generator().manual_seed(seed)
    seqs = _logical(spec, ladder, g)
    lq, lk = spec.lengths_q, spec.lengths_k
    cu = (lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0).tolist()), dtype=torch.int32))
    if spec.varlen_q:
        q = torch.cat([s[0] for s in seqs])
    else:
        q = torch.stack([s[0] for s in seqs])
    page_table = None
    if spec.paged:
        ps = spec.page_size
        need = [-(-n // ps) for n in lk]
        if sum(need) > spec.num_pages:
            raise InputError(f"the sequences need {sum(need)} pages of {ps} keys; the cache has num_pages = "
                             f"{spec.num_pages}")
        order = torch.randperm(spec.num_pages, generator=g)
        k = torch.zeros(spec.num_pages, ps, spec.heads_kv, spec.head_dim)
        v = torch.zeros(spec.num_pages, ps, spec.heads_kv, spec.head_dim_v)
        page_table = torch.zeros(spec.batch, spec.max_pages, dtype=torch.int32)
        used = 0
        for b, (_, kb, vb) in enumerate(seqs):
            pages = order[used:used + need[b]]
            used += need[b]
            page_table[b, :need[b]] = pages.to(torch.int32)
            for j in range(lk[b]):
                k[pages[j // ps], j % ps] = kb[j]
                v[pages[j // ps], j % ps] = vb[j]
    elif spec.varlen_k:
        k, v = torch.cat([s[1] for s in seqs]), torch.cat([s[2] for s in seqs])
    else:
        k, v = torch.stack([s[1] for s in seqs]), torch.stack([s[2] for s in seqs])
    return AttentionOperands(_cast(q, spec.q_dtype), _cast(k, spec.k_dtype), _cast(v, spec.v_dtype),
                             Provenance(ladder, None if ladder == "ones" else seed),
                             cu(lq) if spec.varlen_q else None,
                             cu(lk) if spec.varlen_k else None, page_table)

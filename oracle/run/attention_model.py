"""A Python model of a FlashAttention-2-style forward kernel that taps every attention stage.

Data path, per (query block, split), vectorised over batch and heads: load_q (the Q tile, zero
past seqlen_q) -> for each KV block of the split: load_k / load_v (K and V tiles through the GQA
head map and, for a paged cache, the page table; zero past seqlen_k) -> s = Q K^T in fp32 ->
mask (scaled by softmax_scale, soft-capped, -inf where masked) -> softmax_state (the running max
m, the rescale factor exp(m_old - m_new), the row sum l, summed from the fp32 probabilities) -> p
(exp2 of the scores with log2(e) folded into the scale, rounded to V's dtype) -> o (the
accumulator rescaled, plus P V in fp32) -> normalize (O / l and LSE = m + log l; a row with l = 0
gives O = 0 and LSE +inf, -inf for a split's partial, as FA2 does) -> combine (split-KV only: the
partials merged by their LSE) -> O in q's dtype and the LSE, fp32 [batch, heads, seqlen_q].

Every stage of every site the selection records is written through harness.trace_format's
TraceWriter, as a kernel writes its sink (format version 3, the Site mapping of
docs/trace-format.md: tile = (query block, query head), k_block = KV block, partial = split,
group = batch), and read back with parse_trace.

Planted defects (`Injection`) change what the kernel computes at one stage (INJECTION_STAGE), each
modelled on a real bug. Constraints: numpy / torch only, on the CPU; q, k, v fp32, fp16 or bf16;
head dims and block sizes up to 65534.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from harness.errors import BadInput
from harness.taps import ATTENTION_TAP_STAGES
from harness.trace_format import (
    BLOCK_BODY, HEADER_BYTES, RECORD_HEAD_BYTES, TraceResult, TraceSelection, TraceWriter, parse_trace)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
CAUSAL_MODES = ("none", "top_left", "bottom_right")
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class AttentionModelError(BadInput, ValueError):
    """Arguments the attention model cannot run."""


class Injection(enum.Enum):
    """A planted defect: what a broken kernel computes differently, named for the bug."""

    KV_TAIL_NOT_ZEROED = "kv_tail_not_zeroed"  # K/V rows past seqlen_k hold garbage (NaN), not 0
    CAUSAL_OFF_BY_ONE = "causal_off_by_one"  # the causal bound lets each row see one key too many
    MAX_NOT_UPDATED = "max_not_updated_before_rescale"  # the rescale reads the old max: factor 1
    L_BEFORE_RESCALE = "l_summed_before_rescale"  # l = (l + rowsum) * rescale
    P_WRONG_TYPE = "p_wrong_type"  # P rounded to fp16 beside a bf16 V (bf16 beside fp16)
    P_NOT_ROUNDED = "p_not_rounded"  # P kept in fp32 for the second MMA
    V_K_LAYOUT = "v_read_with_k_layout"  # V's tile read with K's (transposed) layout
    MERGE_WITHOUT_MAX = "split_merge_without_max"  # the splits merged by l alone, their maxima dropped
    EMPTY_ROW_NAN = "empty_row_divided_by_zero"  # a fully masked row normalised as O / 0
    GQA_HEAD_MODULO = "gqa_head_modulo"  # KV head h % heads_kv instead of h // (heads_q / heads_kv)
    PAGE_TABLE_OFF_BY_ONE = "page_table_off_by_one"  # the page table read one entry too far


# the stage whose tap each defect changes first (its later stages and the output follow)
INJECTION_STAGE: dict[Injection, str] = {
    Injection.KV_TAIL_NOT_ZEROED: "load_k",
    Injection.CAUSAL_OFF_BY_ONE: "mask",
    Injection.MAX_NOT_UPDATED: "softmax_state",
    Injection.L_BEFORE_RESCALE: "softmax_state",
    Injection.P_WRONG_TYPE: "p",
    Injection.P_NOT_ROUNDED: "p",
    Injection.V_K_LAYOUT: "load_v",
    Injection.MERGE_WITHOUT_MAX: "combine",
    Injection.EMPTY_ROW_NAN: "normalize",
    Injection.GQA_HEAD_MODULO: "load_k",
    Injection.PAGE_TABLE_OFF_BY_ONE: "load_k",
}


@dataclass(frozen=True)
class PagedKV:
    """A paged KV cache: page_table[b, i] is the physical page of keys i*page_size .. of batch b."""

    k_cache: torch.Tensor  # [pages, page_size, heads_kv, head_dim]
    v_cache: torch.Tensor  # [pages, page_size, heads_kv, head_dim_v]
    page_table: torch.Tensor  # [batch, pages per sequence], int
    seqlen_k: int

    def __post_init__(self) -> None:
        if self.k_cache.dim() != 4 or self.v_cache.dim() != 4 or self.k_cache.shape[:3] != self.v_cache.shape[:3]:
            raise AttentionModelError(f"paged k_cache {tuple(self.k_cache.shape)} and v_cache "
                                      f"{tuple(self.v_cache.shape)} must be [pages, page_size, heads_kv, dim] alike")
        if self.page_table.dim() != 2 or self.page_table.dtype not in (torch.int32, torch.int64):
            raise AttentionModelError(f"page_table must be a 2-D int tensor, got {self.page_table.dtype} "
                                      f"{tuple(self.page_table.shape)}")
        if not 0 < self.seqlen_k <= self.page_table.shape[1] * self.page_size:
            raise AttentionModelError(f"seqlen_k {self.seqlen_k} must be in 1..{self.page_table.shape[1]} pages x "
                                      f"{self.page_size}")
        if self.page_table.numel() and not (0 <= int(self.page_table.min()) and
                                            int(self.page_table.max()) < self.k_cache.shape[0]):
            raise AttentionModelError(f"page_table entries must be pages 0..{self.k_cache.shape[0] - 1}")

    @property
    def page_size(self) -> int:
        return int(self.k_cache.shape[1])


def to_paged(k: torch.Tensor, v: torch.Tensor, page_size: int, *, seed: int = 0) -> PagedKV:
    """k, v [batch, seqlen_k, heads_kv, dim] laid into a paged cache whose pages are shuffled."""
    b, sk = k.shape[:2]
    n = -(-sk // page_size)
    pad = n * page_size - sk
    kp = torch.cat([k, k.new_zeros(b, pad, *k.shape[2:])], 1).reshape(b * n, page_size, *k.shape[2:])
    vp = torch.cat([v, v.new_zeros(b, pad, *v.shape[2:])], 1).reshape(b * n, page_size, *v.shape[2:])
    perm = torch.randperm(b * n, generator=torch.Generator().manual_seed(seed))
    k_cache, v_cache = torch.empty_like(kp), torch.empty_like(vp)
    k_cache[perm], v_cache[perm] = kp, vp  # logical page j of the flat list lives at perm[j]
    return PagedKV(k_cache, v_cache, perm.reshape(b, n).to(torch.int32), sk)


@dataclass(frozen=True)
class AttentionModelRun:
    """What the model computed and traced."""

    out: torch.Tensor  # [batch, seqlen_q, heads, head_dim_v], q's dtype
    lse: torch.Tensor  # [batch, heads, seqlen_q], fp32 (natural log)
    sink: bytes  # the trace sink as the kernel left it
    trace: TraceResult  # parse_trace of it
    block_q: int
    block_kv: int
    head_dim: int
    head_dim_v: int
    splits: int
    injection: Optional[Injection]


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise AttentionModelError(message)


def _record_bytes(rows: int, cols: int, itemsize: int) -> int:
    n = RECORD_HEAD_BYTES + BLOCK_BODY.size + rows * cols * itemsize
    return (n + 7) // 8 * 8


def run_attention_model(q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], *,
                        causal: str = "none", softmax_scale: Optional[float] = None, softcap: float = 0.0,
                        block_q: int = 64, block_kv: int = 64, splits: int = 1, paged: Optional[PagedKV] = None,
                        sites: Optional[Sequence[tuple[int, int]]] = None,
                        kv_blocks: Optional[Sequence[int]] = None, stages: Sequence[str] = ATTENTION_TAP_STAGES,
                        injection: Optional[Injection] = None, capacity: Optional[int] = None) -> AttentionModelRun:
    """Run the model. q [batch, seqlen_q, heads, D]; k, v [batch, seqlen_k, heads_kv, D / DV] (or
    None with `paged`); heads_kv divides heads. `sites`: (query block, head) selectors of the sink
    (-1: any; None: every site), `kv_blocks` and `stages` the rest of the selection. `capacity`:
    the sink's bytes (default: exactly what the taps need; a smaller one drops records as the
    device does)."""
    _check(causal in CAUSAL_MODES, f"causal {causal!r} must be one of {', '.join(CAUSAL_MODES)}")
    _check(injection is None or isinstance(injection, Injection), f"injection {injection!r} must be an Injection")
    _check(q.dim() == 4 and q.dtype in _DTYPES, f"q must be [batch, seqlen_q, heads, head_dim] fp32/fp16/bf16, got "
           f"{q.dtype} {tuple(q.shape)}")
    if paged is None:
        _check(k is not None and v is not None and k.dim() == 4 and v.dim() == 4 and k.shape[:3] == v.shape[:3],
               "k and v must be [batch, seqlen_k, heads_kv, dim] alike (or pass paged=)")
        kd, vd, seqlen_k, heads_kv = k.dtype, v.dtype, int(k.shape[1]), int(k.shape[2])
        _check(k.shape[0] == q.shape[0], f"k has batch {k.shape[0]}, q {q.shape[0]}")
    else:
        _check(k is None and v is None, "pass either k and v or paged, not both")
        kd, vd, seqlen_k, heads_kv = paged.k_cache.dtype, paged.v_cache.dtype, paged.seqlen_k, paged.k_cache.shape[2]
        _check(paged.page_table.shape[0] == q.shape[0], f"page_table has {paged.page_table.shape[0]} rows for batch "
               f"{q.shape[0]}")
    _check(kd == q.dtype and vd == q.dtype, f"q, k and v must share a dtype, got {q.dtype}, {kd}, {vd}")
    batch, seqlen_q, heads, head_dim = (int(x) for x in q.shape)
    head_dim_v = int((v if paged is None else paged.v_cache).shape[3])
    _check(heads % heads_kv == 0, f"heads_kv {heads_kv} must divide heads {heads}")
    for name, val in (("block_q", block_q), ("block_kv", block_kv), ("splits", splits)):
        _check(isinstance(val, int) and not isinstance(val, bool) and 1 <= val < 65535,
               f"{name} {val!r} must be an int in 1..65534")
    _check(head_dim < 65535 and head_dim_v < 65534, f"head dims {head_dim}, {head_dim_v} must be below 65534")
    _check(softcap >= 0 and math.isfinite(softcap), f"softcap {softcap!r} must be >= 0 (0: none)")
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    _check(math.isfinite(scale) and scale > 0, f"softmax_scale {softmax_scale!r} must be a positive number")
    _check(injection is not Injection.PAGE_TABLE_OFF_BY_ONE or paged is not None,
           "the page_table_off_by_one injection needs a paged KV cache (paged=)")
    _check(injection is not Injection.MERGE_WITHOUT_MAX or splits > 1, "split_merge_without_max needs splits > 1")
    _check(injection not in (Injection.P_WRONG_TYPE, Injection.P_NOT_ROUNDED) or vd != torch.float32,
           f"{injection and injection.value} needs an fp16 or bf16 V (an fp32 V takes P unrounded)")
    selection = TraceSelection(tiles=None if sites is None else tuple(tuple(s) for s in sites),
                               k_blocks=None if kv_blocks is None else tuple(kv_blocks), stages=tuple(stages))
    inj = injection
    group = heads // heads_kv
    hmap = torch.arange(heads) % heads_kv if inj is Injection.GQA_HEAD_MODULO else torch.arange(heads) // group
    p_dtype = {Injection.P_NOT_ROUNDED: torch.float32,
               Injection.P_WRONG_TYPE: torch.float16 if vd == torch.bfloat16 else torch.bfloat16}.get(inj, vd)
    n_kv = -(-seqlen_k // block_kv)
    per_split = -(-n_kv // splits)
    taps: list[tuple] = []  # (stage, q_block, kv_block, split, values [B, H, r, c])

    def tap(stage, qb, kb, split, values):
        if stage in selection.stages:
            taps.append((stage, qb, kb, split, values))

    def kv_tile(kb: int, which: str) -> torch.Tensor:
        """K or V of KV block kb, [B, H, block_kv, dim], as the kernel reads it."""
        idx = kb * block_kv + torch.arange(block_kv)
        valid = idx < seqlen_k
        safe = idx.clamp(max=seqlen_k - 1)
        if paged is None:
            src = (k if which == "k" else v)[:, safe]  # [B, bkv, Hkv, d]
        else:
            pages = safe // paged.page_size
            if inj is Injection.PAGE_TABLE_OFF_BY_ONE:
                pages = (pages + 1).clamp(max=paged.page_table.shape[1] - 1)
            phys = paged.page_table.long()[:, pages]  # [B, bkv]
            src = (paged.k_cache if which == "k" else paged.v_cache)[phys, safe % paged.page_size]
        t = src[:, :, hmap].permute(0, 2, 1, 3).clone()  # [B, H, bkv, d]
        fill = float("nan") if inj is Injection.KV_TAIL_NOT_ZEROED else 0.0
        t[:, :, ~valid] = fill
        if which == "v" and inj is Injection.V_K_LAYOUT:  # the row-major tile read column-major
            t = t.reshape(batch, heads, -1).reshape(batch, heads, t.shape[3], block_kv).transpose(2, 3)
        return t

    def allowed(qb: int) -> torch.Tensor:
        """[block_q, seqlen_k rounded up to blocks]: may query row i see key j?"""
        i = (qb * block_q + torch.arange(block_q))[:, None]
        j = torch.arange(n_kv * block_kv)[None, :]
        ok = j < seqlen_k
        if causal != "none":
            bound = i + (seqlen_k - seqlen_q if causal == "bottom_right" else 0)
            if inj is Injection.CAUSAL_OFF_BY_ONE:
                bound = bound + 1
            ok = ok & (j <= bound)
        return ok

    outs, lses = [], []
    n_q = -(-seqlen_q // block_q)
    for qb in range(n_q):
        rows = qb * block_q + torch.arange(block_q)
        qt = q[:, rows.clamp(max=seqlen_q - 1)].permute(0, 2, 1, 3).clone()  # [B, H, bq, D]
        qt[:, :, rows >= seqlen_q] = 0
        ok = allowed(qb)
        live = ok.any(0).nonzero()
        n_block_max = 0 if live.numel() == 0 else int(live.max()) // block_kv + 1  # blocks past it are skipped
        parts = []  # per split: O / l, LSE, m (scaled by log2 e), l
        for sp in range(splits):
            split = sp if splits > 1 else None
            tap("load_q", qb, None, split, qt)
            m_x = torch.full((batch, heads, block_q), -math.inf)  # running max of the exp2 argument
            m_t = torch.full((batch, heads, block_q), -math.inf)  # of the mask stage's values
            l = torch.zeros(batch, heads, block_q)
            acc = torch.zeros(batch, heads, block_q, head_dim_v)
            blocks = range(sp * per_split, min((sp + 1) * per_split, n_block_max))
            for n, kb in enumerate(blocks):
                kt, vt = kv_tile(kb, "k"), kv_tile(kb, "v")
                tap("load_k", qb, kb, split, kt)
                tap("load_v", qb, kb, split, vt)
                s = qt.float() @ kt.float().transpose(-1, -2)
                tap("s", qb, kb, split, s)
                if softcap > 0:
                    t = softcap * torch.tanh(s * (scale / softcap))
                    x = t * LOG2E
                else:
                    t = s * scale
                    x = s * (scale * LOG2E)  # log2(e) folded into the scale, as exp2 wants it
                bok = ok[:, kb * block_kv:(kb + 1) * block_kv]
                t = t.masked_fill(~bok, -math.inf)
                x = x.masked_fill(~bok, -math.inf)
                tap("mask", qb, kb, split, t)
                m_new = torch.maximum(m_x, x.amax(-1))
                m_safe = torch.where(m_new == -math.inf, torch.zeros(()), m_new)
                m_t = torch.maximum(m_t, t.amax(-1))
                if n == 0:
                    rescale = torch.ones_like(m_x)
                elif inj is Injection.MAX_NOT_UPDATED:  # the factor from the max before its update
                    rescale = torch.exp2(m_x - torch.where(m_x == -math.inf, torch.zeros(()), m_x))
                else:
                    rescale = torch.exp2(m_x - m_safe)
                p32 = torch.exp2(x - m_safe[..., None])
                rowsum = p32.sum(-1)
                l = (l + rowsum) * rescale if inj is Injection.L_BEFORE_RESCALE else l * rescale + rowsum
                m_x = m_new
                tap("softmax_state", qb, kb, split, torch.stack([m_t, rescale, l], -1))
                p = p32.to(p_dtype)
                tap("p", qb, kb, split, p)
                acc = acc * rescale[..., None] + p.float() @ vt.float()
                tap("o", qb, kb, split, acc)
            empty = (l == 0) | torch.isnan(l)
            if inj is Injection.EMPTY_ROW_NAN:
                o_n = acc / l[..., None]
            else:
                o_n = torch.where(empty[..., None], torch.zeros(()), acc / torch.where(empty, torch.ones(()), l)[..., None])
            lse = torch.where(empty, torch.full((), -math.inf if splits > 1 else math.inf),
                              m_x * LN2 + torch.log(torch.where(empty, torch.ones(()), l)))
            tap("normalize", qb, None, split, torch.cat([o_n, lse[..., None]], -1))
            parts.append((o_n, lse, m_x, l))
        if splits == 1:
            o_fin, lse_fin = parts[0][0], parts[0][1]
        else:
            o_s = torch.stack([p[0] for p in parts])  # [S, B, H, bq, DV]
            lse_s = torch.stack([p[1] for p in parts])
            if inj is Injection.MERGE_WITHOUT_MAX:  # each split weighted by its l alone
                l_s = torch.stack([p[3] for p in parts])
                total = l_s.sum(0)
                o_fin = (l_s[..., None] * o_s).sum(0) / total[..., None]
                lse_fin = torch.log(total)
            else:
                top = lse_s.amax(0)
                top = torch.where(top == -math.inf, torch.zeros(()), top)
                total = torch.exp(lse_s - top).sum(0)
                bad = (total == 0) | torch.isnan(total)
                lse_fin = torch.where(bad, torch.full((), math.inf), torch.log(total) + top)
                w = torch.exp(lse_s - lse_fin)  # 0 where the row is empty (lse +inf)
                o_fin = (w[..., None] * o_s).sum(0)
            tap("combine", qb, None, None, torch.cat([o_fin, lse_fin[..., None]], -1))
        keep = rows < seqlen_q
        outs.append(o_fin[:, :, keep])
        lses.append(lse_fin[:, :, keep])
    out = torch.cat(outs, 2).permute(0, 2, 1, 3).to(q.dtype).contiguous()
    lse_all = torch.cat(lses, 2).contiguous()

    records = []  # (stage, tile, kb, split, batch, values [r, c])
    for stage, qb, kb, split, values in taps:
        for b in range(batch):
            for h in range(heads):
                if selection.records(stage, (qb, h), kb):
                    records.append((stage, (qb, h), kb, split, b, values[b, h]))
    need = HEADER_BYTES + 8 + sum(_record_bytes(*val.shape, val.element_size()) for *_, val in records)
    writer = TraceWriter(need if capacity is None else capacity, tiles=selection.tiles, k_blocks=selection.k_blocks,
                         stages=selection.stages)
    for stage, tile, kb, split, b, val in records:
        writer.block(stage, tile, val.contiguous(), shape=tuple(val.shape), k_block=kb, partial=split, group=b,
                     dtype=_DTYPES[val.dtype])
    sink = writer.to_bytes()
    trace = parse_trace(sink, block_m=block_q, block_n=block_kv, block_k=head_dim, head_dim_v=head_dim_v)
    return AttentionModelRun(out=out, lse=lse_all, sink=sink, trace=trace, block_q=block_q, block_kv=block_kv,
                             head_dim=head_dim, head_dim_v=head_dim_v, splits=splits, injection=inj)

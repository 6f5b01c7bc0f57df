"""The attention problem: a validated, frozen description of one attention forward pass.

O = softmax(mask(softcap(scale * Q K^T))) V per (batch, query head), and LSE = log sum exp of the
masked scores per query row, as FlashAttention computes them block by block:
  load_q / load_k / load_v -> s (Q K^T per KV block) -> mask -> softmax_state (running max m,
  rescale exp(m_old - m_new), row sum l) -> p (P as the second MMA reads it) -> o (the rescaled
  accumulator) -> normalize (O / l, LSE = m + log l) -> combine (split-KV partials) -> store.
A KV block (`block_kv` keys) plays the part a k-block plays in a GEMM, a unit (batch, query head,
query block of `block_q` rows) the part of a tile, a split (`splits`) the part of a partial.

Heads: heads_q % heads_kv == 0 (MHA, GQA, MQA); query head h reads KV head h // (heads_q // heads_kv).
Masks, for query i and key j of one sequence of lengths (Lq, Lk); `off` = Lk - Lq except for
causal "top_left" (off = 0):
  causal (top_left | bottom_right):  j <= i + off    (bottom_right as FlashAttention >= 2.1 and
                                                       FlashInfer align it when Lq != Lk)
  window (left, right), -1 unbounded: i + off - left <= j <= i + off + right (aligned as causal
                                       is; with causal "none" bottom-right, as FlashAttention does)
  j < Lk always. A row with no key left is fully masked: O = 0 and LSE = -inf (`empty_lse` "+inf"
  for FlashAttention-2's non-split kernels, which write +inf there).
Lengths: a dense problem has every sequence seqlen_q x seqlen_k; a variable-length one
(`seqlens_q` / `seqlens_k`, from cu_seqlens) records each sequence's length and the maxima. A paged
KV cache (`page_size`, `num_pages`, `max_pages`) holds K and V as [num_pages, page_size, heads_kv,
dim] reached through a page table [batch, max_pages]; each sequence's key count is seqlens_k, else
seqlen_k (at most max_pages * page_size).
Types: q, k, v in bf16 / fp16 (all one type) or e4m3 (all three, with descale_q/k/v applied to S
and O, and P quantised as e4m3(P * p_scale), divided back by p_scale); o in bf16 / fp16 / fp32.
Every invalid field raises SpecError (oracle.problem.spec) naming the field, the value and what
is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from oracle.problem.spec import _built, _finite, _known_fields, _positive_int, _require, check_traced_groups, check_traced_range

CAUSAL = ("none", "top_left", "bottom_right")
QKV_DTYPES = ("bf16", "fp16", "e4m3")
O_DTYPES = ("bf16", "fp16", "fp32")
EMPTY_LSE = ("-inf", "+inf")
MAX_DIM = 2**31 - 1
MAX_HEAD_DIM = 512
MAX_BLOCK = 1024


def _lengths(field: str, v: Any, most: int) -> Optional[tuple[int, ...]]:
    if v is None:
        return None
    ok = isinstance(v, (tuple, list)) and len(v) > 0 and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= most for x in v)
    _require(ok, field, v, f"a non-empty list of per-sequence lengths, each an integer from 0 to {most}")
    return tuple(v)


def _opt_positive(field: str, v: Any) -> None:
    if v is not None:
        _require(_finite(v) and v > 0, field, v, "a positive, finite number or None")


# What a live attention case's [launch] args may name (oracle.run.attention_live): the operand
# buffers, the outputs among them, the sizes (i32) and the floats (f32).
OPERANDS = ("q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_k", "page_table")
OUTPUTS = ("o", "lse")
LAUNCH_SIZES = ("batch", "heads_q", "heads_kv", "group", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v",
                "block_q", "block_kv", "q_blocks", "kv_blocks", "units", "splits", "page_size", "num_pages",
                "max_pages", "total_q", "total_k", "causal", "num_sms")
CAUSAL_CODES = {"none": 0, "top_left": 1, "bottom_right": 2}  # the `causal` size a launch passes
LAUNCH_FLOATS = ("softmax_scale", "softcap", "descale_q", "descale_k", "descale_v", "p_scale")


def is_attention(spec) -> bool:
    return getattr(spec, "kind", "gemm") == "attention"



@dataclass(frozen=True)
class AttentionSpec:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int  # the longest query sequence (every one, for a dense problem)
    seqlen_k: int  # the longest key sequence
    head_dim: int
    head_dim_v: Optional[int] = None  # None: head_dim
    causal: str = "none"
    window: Optional[tuple[int, int]] = None  # (left, right), -1 unbounded; None: no window
    seqlens_q: Optional[tuple[int, ...]] = None  # variable lengths (from cu_seqlens_q); None: dense
    seqlens_k: Optional[tuple[int, ...]] = None
    softmax_scale: Optional[float] = None  # None: 1 / sqrt(head_dim)
    softcap: float = 0.0  # 0: none; s -> softcap * tanh(s / softcap)
    q_dtype: str = "bf16"
    k_dtype: str = "bf16"
    v_dtype: str = "bf16"
    o_dtype: str = "bf16"
    descale_q: Optional[float] = None  # e4m3 inputs: the factors that undo their quantisation
    descale_k: Optional[float] = None
    descale_v: Optional[float] = None
    p_scale: Optional[float] = None  # e4m3: P is stored as e4m3(P * p_scale)
    block_q: int = 64
    block_kv: int = 64
    splits: int = 1  # split-KV: each unit's KV blocks dealt to this many partials, merged by LSE
    page_size: Optional[int] = None  # a paged KV cache: keys per page
    num_pages: Optional[int] = None  # pages in the K / V cache
    max_pages: Optional[int] = None  # columns of the page table
    lse: bool = True  # the kernel writes LSE [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q])
    empty_lse: str = "-inf"  # the LSE of a fully masked row

    kind = "attention"

    def __post_init__(self) -> None:
        for f in ("batch", "heads_q", "heads_kv"):
            _positive_int(f, getattr(self, f), MAX_DIM)
        for f in ("seqlen_q", "seqlen_k"):
            v = getattr(self, f)
            _require(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM, f, v,
                     f"must be an integer from 0 to {MAX_DIM}")
        _positive_int("head_dim", self.head_dim, MAX_HEAD_DIM)
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)
        _positive_int("head_dim_v", self.head_dim_v, MAX_HEAD_DIM)
        _require(self.heads_q % self.heads_kv == 0, "heads_kv", self.heads_kv,
                 f"must divide heads_q = {self.heads_q} (MHA: equal, GQA: a divisor, MQA: 1)")
        _require(self.causal in CAUSAL, "causal", self.causal, f"one of {', '.join(CAUSAL)}")
        if self.window is not None:
            w = self.window
            ok = isinstance(w, (tuple, list)) and len(w) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= -1 for x in w)
            _require(ok, "window", w, "(left, right), two integers >= -1 (-1: unbounded), or None")
            object.__setattr__(self, "window", tuple(w))
        for f, most in (("seqlens_q", self.seqlen_q), ("seqlens_k", self.seqlen_k)):
            v = _lengths(f, getattr(self, f), most)
            object.__setattr__(self, f, v)
            if v is not None:
                _require(len(v) == self.batch, f, v, f"one length per sequence: batch = {self.batch}")
                _require(max(v) == most, f, v, f"its longest sequence is {'seqlen_q' if f == 'seqlens_q' else 'seqlen_k'}"
                         f" = {most}")
        if self.softmax_scale is None:
            object.__setattr__(self, "softmax_scale", 1.0 / math.sqrt(self.head_dim))
        _require(_finite(self.softmax_scale) and self.softmax_scale > 0, "softmax_scale", self.softmax_scale,
                 "a positive, finite number (None: 1 / sqrt(head_dim))")
        _require(_finite(self.softcap) and self.softcap >= 0, "softcap", self.softcap,
                 "0 (none) or a positive, finite number")
        for f in ("q_dtype", "k_dtype", "v_dtype"):
            _require(getattr(self, f) in QKV_DTYPES, f, getattr(self, f), f"one of {', '.join(QKV_DTYPES)}")
        _require(self.o_dtype in O_DTYPES, "o_dtype", self.o_dtype, f"one of {', '.join(O_DTYPES)}")
        fp8 = [f for f in ("q_dtype", "k_dtype", "v_dtype") if getattr(self, f) == "e4m3"]
        if fp8 and len(fp8) != 3:
            f = next(f for f in ("q_dtype", "k_dtype", "v_dtype") if f not in fp8)
            _require(False, f, getattr(self, f), "e4m3, as q, k and v are all e4m3 or none of them is")
        if not fp8:
            _require(self.k_dtype == self.q_dtype, "k_dtype", self.k_dtype, f"q_dtype ({self.q_dtype}): one 16-bit type")
            _require(self.v_dtype == self.q_dtype, "v_dtype", self.v_dtype, f"q_dtype ({self.q_dtype}): one 16-bit type")
        for f in ("descale_q", "descale_k", "descale_v", "p_scale"):
            _opt_positive(f, getattr(self, f))
            if not fp8:
                _require(getattr(self, f) is None, f, getattr(self, f), "None: descales and p_scale go with e4m3 q/k/v")
        _positive_int("block_q", self.block_q, MAX_BLOCK)
        _positive_int("block_kv", self.block_kv, MAX_BLOCK)
        _positive_int("splits", self.splits, 1 << 16)
        paged = [f for f in ("page_size", "num_pages", "max_pages") if getattr(self, f) is not None]
        if paged:
            for f in ("page_size", "num_pages", "max_pages"):
                _require(getattr(self, f) is not None, f, None, f"a positive integer: a paged KV cache names "
                         f"page_size, num_pages and max_pages")
                _positive_int(f, getattr(self, f), MAX_DIM)
            _require(self.seqlen_k <= self.page_size * self.max_pages, "seqlen_k", self.seqlen_k,
                     f"at most max_pages * page_size = {self.page_size * self.max_pages} keys fit a sequence's pages")
        _require(isinstance(self.lse, bool), "lse", self.lse, "true or false")
        _require(self.empty_lse in EMPTY_LSE, "empty_lse", self.empty_lse, f"one of {', '.join(EMPTY_LSE)}")

    # -- derived -------------------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads_q // self.heads_kv

    @property
    def fp8(self) -> bool:
        return self.q_dtype == "e4m3"

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    @property
    def varlen_q(self) -> bool:
        return self.seqlens_q is not None

    @property
    def varlen_k(self) -> bool:
        return self.seqlens_k is not None

    @property
    def lengths_q(self) -> tuple[int, ...]:
        return self.seqlens_q if self.seqlens_q is not None else (self.seqlen_q,) * self.batch

    @property
    def lengths_k(self) -> tuple[int, ...]:
        return self.seqlens_k if self.seqlens_k is not None else (self.seqlen_k,) * self.batch

    @property
    def q_blocks(self) -> int:
        return -(-self.seqlen_q // self.block_q)

    @property
    def kv_blocks(self) -> int:
        return -(-self.seqlen_k // self.block_kv)

    @property
    def units(self) -> int:
        """(batch, query head, query block) units: the attention's tiles."""
        return self.batch * self.heads_q * self.q_blocks

    def unit_of(self, tile: tuple[int, int]) -> tuple[int, int, int]:
        """(batch, query head, query block) of a unit named (batch * heads_q + head, query block)."""
        return tile[0] // self.heads_q, tile[0] % self.heads_q, tile[1]

    def describe(self) -> str:
        heads = f"{self.heads_q}h" if self.heads_q == self.heads_kv else f"{self.heads_q}/{self.heads_kv}h"
        dims = f"d{self.head_dim}" + (f"/{self.head_dim_v}" if self.head_dim_v != self.head_dim else "")
        extra = []
        if self.causal != "none":
            extra.append(f"causal {self.causal}")
        if self.window is not None:
            extra.append(f"window {self.window}")
        if self.softcap:
            extra.append(f"softcap {self.softcap:g}")
        if self.varlen_q or self.varlen_k:
            extra.append("varlen")
        if self.paged:
            extra.append(f"paged {self.page_size}")
        if self.splits > 1:
            extra.append(f"{self.splits} splits")
        types = self.q_dtype if self.q_dtype == self.k_dtype == self.v_dtype else \
            f"{self.q_dtype}/{self.k_dtype}/{self.v_dtype}"
        return (f"attention b{self.batch} {heads} q{self.seqlen_q} k{self.seqlen_k} {dims} {types}->{self.o_dtype} "
                f"(scale {self.softmax_scale:.4g}{', ' + ', '.join(extra) if extra else ''}, "
                f"blocks {self.block_q}x{self.block_kv})")

    def to_json(self) -> dict:
        from dataclasses import fields

        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for f in ("window", "seqlens_q", "seqlens_k"):
            if d[f] is not None:
                d[f] = list(d[f])
        d["kind"] = self.kind
        return d

    @classmethod
    def from_json(cls, d: Any) -> "AttentionSpec":
        if isinstance(d, Mapping):
            d = dict(d)
            kind = d.pop("kind", "attention")
            _require(kind == "attention", "kind", kind, "'attention'")
        return _built(cls, _known_fields(cls, d, "attention"), "attention problem")


def tap_stages(spec: AttentionSpec) -> tuple[str, ...]:
    """The stages an attention kernel of this problem can tap (combine only when split)."""
    from harness.taps import attention_pipeline  # torch: imported only when a selection is checked

    return attention_pipeline(split=spec.splits > 1)[:-1]


def check_selection(spec: AttentionSpec, plan) -> None:
    """A [trace] selection against the problem: query blocks, query heads and KV blocks in range,
    stages of attention's chain. `plan` is the case's TracePlan; raises ValueError naming the field."""
    check_traced_range(plan, (spec.q_blocks, spec.heads_q), spec.kv_blocks,
                       f"the problem's {spec.q_blocks} query block(s) x {spec.heads_q} query head(s) (an attention "
                       f"tile is (query block, query head))", f"is past the problem's {spec.kv_blocks} KV block(s)")
    check_traced_groups(plan, spec.batch, "batch entries")
    allowed = tap_stages(spec)
    for stage in plan.stages or ():
        if stage not in allowed:
            raise ValueError(f"trace stage {stage!r} is not a stage of this attention problem; its stages: "
                             f"{', '.join(allowed)}")

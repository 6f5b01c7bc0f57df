"""The accumulation bound: per-element |kernel - reference| for an accumulator after a span of
products, from the accumulation models (oracle.judging.accumulation_models) and the span's
statistics (oracle.judging.bound_stats).

The accumulation bound (`mma_bound`) follows what the engine's datapath does to the partial sums,
not sqrt(K) * S. An engine accumulates in steps of g products; a step aligns its terms (the g
products and the running accumulator) to the largest, keeping f fraction bits, sums them and cuts
the sum to a fraction bits (kernels_ref.emulate states it exactly). A step's error is therefore at
most c * m_t with c = (g + 1) 2^-f + 2^-a and m_t = |running accumulator| + the step's sum |a||b|.
Over a k-block j every step has m_t <= m_j = max_c |X_(j-1) - X_c| + s_j, where X are the
accumulator values at k-block boundaries (X_c over every earlier boundary and 0, so a partial
restarted at any boundary, as split-K and stream-K do, is covered) and s_j the block's sum |a||b|.
The reference accumulates two statistics per element, L = sum_j m_j and V = sum_j m_j^2
(kernels_ref.mma_stats, `with_stats`), and the bound is
    det * n_steps * L  +  LAMBDA * sqrt(rnd^2 * n_steps * V)
with the truncating parts of c in `det` (a truncation errs in one direction, so those errors add
up: the bias of a truncating tensor core at large K) and the rounding parts in `rnd` (errors of
rounding to nearest behave like a random walk: Higham and Mary's probabilistic bound, by
Azuma-Hoeffding; LAMBDA = 8 puts the chance of one correct element exceeding it at 2 exp(-32)).
Promotion every P (fp8) restarts the narrow chain from 0, so its terms scale with S instead of L.
Block scales enter through S (sum |a||b| times |scales|); scale groups narrower than the k-block add
the scaling and the add of every group into the fp32 accumulator (`_scale_groups_bound`).
Reduced-precision split-K adds the rounding of every partial and of every partial sum
(statistics pabs = sum_i |partial_i|, prun = sum_i |partial sum after partial i|). TF32 adds the
operand rounding, the hi/lo three-pass schemes the dropped lo*lo term (`_operand_bound`: random
for rounding to nearest, a bias following |D| plus a random part for truncation). The reference's
own accumulation error (REF_CHAIN, a conservative fp32 chain) is added, as the factor 2 did before.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import torch

from kernels_ref._common import device_tensor
from kernels_ref.dtypes import DTYPES
from kernels_ref.scales import groups_per_k_block
from oracle.judging import bound_pass
from oracle.judging.accumulation_models import (REF_CHAIN, REF_FP16, REF_PROMOTED, STATS_MARGIN, AccModel, Chain,
                                                acc_model, resolved_model)
from oracle.judging.bound_stats import SpanStats, Stats
from oracle.judging.hardware_numerics import hw

LAMBDA = 8.0


@dataclass(frozen=True)
class Linear:
    """a L + b sqrt(max(V, 0)) + c S over the span's statistics (STATS_MARGIN already in them). A
    coefficient is a float, a per-unit tensor [U, 1, ...] (oracle.judging.accumulation_bound._per_unit)
    or None where the formula has no such term (a term with a zero coefficient still multiplies its
    statistic, so an infinite one gives NaN as it would written out)."""

    a: Any = None
    b: Any = None
    c: Any = None

    def __add__(self, other: "Linear") -> "Linear":
        def add(x, y):
            return x if y is None else y if x is None else x + y
        return Linear(add(self.a, other.a), add(self.b, other.b), add(self.c, other.c))

    def times(self, k) -> "Linear":
        return Linear(*(None if x is None else x * k for x in (self.a, self.b, self.c)))

    def of(self, l: torch.Tensor, r: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Its value (l = L, r = sqrt(max(V, 0)), s = S), the terms added in the order a, b, c."""
        out = None
        for k, x in ((self.a, l), (self.b, r), (self.c, s)):
            if k is not None:
                out = k * x if out is None else out + k * x
        return torch.zeros_like(s) if out is None else out

    def scalar(self) -> bool:
        return all(x is None or isinstance(x, float) for x in (self.a, self.b, self.c))


@dataclass(frozen=True)
class Cover:
    """e (S + min(k sqrt(max(V, 0)), L)): a sum of partials' magnitudes, each within sqrt(V) and all
    within L (`_reduction_terms`)."""

    e: float
    k: Any  # float or per-unit tensor

    def of(self, l: torch.Tensor, r: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return self.e * (s + torch.minimum(self.k * r, l))


@dataclass(frozen=True)
class BoundForm:
    """The accumulation bound as the statistics enter it:
        max over the engine's members (Linear, + its operand rounding) + reference (Linear)
        + max over the reduction's terms (Cover, or a tensor) + scale groups (Linear),
    evaluated by `evaluate` (torch, the definition) or, all of it linear and every coefficient a
    float, in one pass over the statistics (oracle.judging.bound_pass)."""

    members: tuple  # ((Linear, AccModel or None: the member whose operand rounding adds), ...)
    reference: Linear
    reduction: tuple  # (Cover or a tensor, ...): their maximum; () none
    groups: Optional[Linear]

    def fused(self) -> bool:
        """Whether one pass can evaluate it: no operand rounding, no tensor term, float coefficients."""
        lin = [m for m, _ in self.members] + [self.reference] + ([self.groups] if self.groups else [])
        return (all(model is None for _, model in self.members) and all(lin_.scalar() for lin_ in lin)
                and all(isinstance(t, Cover) and isinstance(t.k, float) for t in self.reduction))

    def evaluate(self, st: Stats, s: torch.Tensor, x_abs) -> torch.Tensor:
        r = torch.sqrt(torch.clamp(st.v, min=0))
        ref = self.reference.of(st.l, r, s)
        engine = None
        for lin, model in self.members:
            part = lin.of(st.l, r, s)
            if model is not None:
                part = part + _operand_bound(model, st, s, x_abs() if callable(x_abs) else x_abs, ref)
            engine = part if engine is None else torch.maximum(engine, part)
        bound = engine + ref
        red = None
        for t in self.reduction:
            x = t.of(st.l, r, s) if isinstance(t, Cover) else t
            red = x if red is None else torch.maximum(red, x)
        if red is not None:
            bound = bound + red
        if self.groups is not None:
            bound = bound + self.groups.of(st.l, r, s)
        return bound


def _chain_linear(chain: Chain, bk: int, passes: int, promotion: Optional[int], n, like: torch.Tensor) -> Linear:
    g, det, rnd2, _ = chain.step_constants()
    if promotion:
        steps = passes * promotion / g  # per promotion chunk, each step's m_t <= the chunk's sum |a||b|
        narrow = Linear(b=LAMBDA * math.sqrt(rnd2 * steps), c=det * steps * STATS_MARGIN)
        master = Linear(b=LAMBDA * math.sqrt(bk / promotion) * 2.0 ** -24 * STATS_MARGIN)
        return narrow.times(chain.growth(steps)) + master
    steps = passes * math.ceil(bk / g)
    x = Linear(a=det * steps, b=LAMBDA * math.sqrt(rnd2 * steps))
    return x.times(_per_unit(n, lambda k: chain.growth(passes * math.ceil(max(k, 1) / g)), like))


def _operand_bound(model: AccModel, st: Stats, s: torch.Tensor, x_abs: Optional[torch.Tensor],
                   ref: torch.Tensor) -> torch.Tensor:
    """Operand rounding: each product k errs by d_k |a_k b_k|, |d_k| <= c. Deterministically the sum
    errs by at most c S. Rounding to nearest: d_k of mean zero, independent of the data (Higham and
    Mary's model): LAMBDA c sqrt(q) (Azuma-Hoeffding), q = sum (ab)^2. Truncation: d_k in [0, c]
    with the sign of a_k b_k, so the mean mu of d_k biases the sum by mu |X| <= c |X| (X the exact
    sum, within the reference's own bound of |x_abs|), and d_k - mu is a random walk bounded as
    above. The smaller of the deterministic and the probabilistic bound is taken."""
    bits = int(hw(f"{model.operand}.operand_bits").value)
    trunc = bool(hw(f"{model.operand}.operand_trunc").value)
    u = 2.0 ** -bits if trunc else 2.0 ** -(bits + 1)
    c = 4 * u * u if model.passes == 3 else 2 * u + u * u  # three passes: the dropped lo*lo, the lo parts' rounding
    det = c * STATS_MARGIN * s
    if st.q is None:
        return det
    walk = LAMBDA * c * torch.sqrt(st.q.double() * STATS_MARGIN)
    if not trunc:
        return torch.minimum(det, walk)
    if x_abs is None:
        return det
    return torch.minimum(det, c * STATS_MARGIN * (x_abs.double() + ref) + walk)


def _engine_members(spec, model: AccModel, n, like) -> list:
    """(Linear, the model if its operand rounding adds to it) for each model the engine may follow."""
    if model.union:
        names = ("fp16",) if spec.acc_dtype == "fp16" else model.union
        names = [m for m in names if not (acc_model(m, spec.mma_dtype).promoted and not spec.promotion_interval)]
        return [member for m in names for member in _engine_members(spec, acc_model(m, spec.mma_dtype), n, like)]
    if model.chain is None:  # exact
        return [(Linear(), None)]
    promo = spec.promotion_interval if model.promoted else None
    return [(_chain_linear(model.chain, spec.tile.bk, model.passes, promo, n, like), model if model.operand else None)]


def _reference_linear(spec, n, like) -> Linear:
    """The reference's own accumulation error (kernels_ref.mma semantics)."""
    if spec.acc_dtype == "int32":
        return Linear()
    if spec.promotion_interval:
        return _chain_linear(REF_PROMOTED, spec.tile.bk, 1, spec.promotion_interval, n, like)
    if spec.acc_dtype == "fp16":
        return _chain_linear(REF_FP16, spec.tile.bk, 1, None, n, like)
    return _chain_linear(REF_CHAIN, spec.tile.bk, 1, spec.tile.bk, n, like)  # each block's dot, then an RN add


def _reduction_terms(spec, model: AccModel, st: Stats, n, like) -> tuple:
    """Split-K partials P_i (their ends at k-block boundaries) rounded, and each partial sum X_i
    rounded: u (sum |P_i| + sum |X_i|), with sum |P_i| <= S and, as every |X_j| <= m_j,
    sum |X_i| at most both parts * sqrt(V) and L (a Cover; with the partials' own statistics,
    u (pabs + prun))."""
    def cover(e: float, parts) -> Cover:  # parts(n): the partials of a span of n products
        return Cover(e, _per_unit(n, parts, like))

    out = []
    red = spec.reduction
    if red == "fp32":
        out.append(cover(2.0 ** -24 * STATS_MARGIN, lambda k: max(1, math.ceil(k / spec.tile.bk))))
    elif red in ("bf16", "fp16"):
        u = DTYPES[red].unit_roundoff
        if st.pabs is None or st.prun is None:
            out.append(cover(u * STATS_MARGIN, lambda k: math.ceil(k / spec.reduction_chunk)))
        else:
            out.append(u * STATS_MARGIN * (st.pabs.double() + st.prun.double()))
    if model.name == "any" and spec.mma_dtype in ("bf16", "fp16"):
        u = DTYPES[spec.out_dtype].unit_roundoff if spec.out_dtype in ("bf16", "fp16") else 2.0 ** -24
        out.append(cover(u * STATS_MARGIN, lambda k: math.ceil(k / hw("splitk.chunk_min").value)))
    return tuple(out)


def _scale_groups_linear(spec) -> Optional[Linear]:
    """Scale groups narrower than the k-block (block scales, G = tile.bk / gk groups per k-block):
    each group's product is scaled and added into the fp32 accumulator on its own, by the kernel and
    by the reference alike (kernels_ref.mma), so a k-block makes 2G roundings to nearest where the
    chains above count one add. Each is at most 2^-24 of m_j (a group's scaled product is at most
    the block's scaled sum s_j, and the running sum inside the block stays within
    |X_(j-1)| + s_j <= m_j): a random walk of 2G steps per k-block on each side,
    2 LAMBDA 2^-24 sqrt(2 G V). None with one group per k-block."""
    g = groups_per_k_block(spec.scale_a.block[1], spec.tile.bk) if spec.block_scaled else 1
    if g <= 1:
        return None
    return Linear(b=2 * LAMBDA * 2.0 ** -24 * STATS_MARGIN * math.sqrt(2 * g))


def _per_unit(n, fn, like: torch.Tensor):
    """fn(n) for a span of n products; for n a sequence (one span per unit along like's first
    dim), fn of each as a float64 [U, 1, ...] tensor on like's device, or the one value they share."""
    if not isinstance(n, (list, tuple)):
        return float(fn(n))
    vals = [fn(k) for k in n]
    if all(v == vals[0] for v in vals):
        return float(vals[0])
    return device_tensor(vals, like.device, torch.float64).reshape((-1,) + (1,) * (like.dim() - 1))


def bound_form(spec, st: Stats, n, like: torch.Tensor) -> BoundForm:
    """The accumulation bound of a span of `n` products (a sequence: one per unit) as a BoundForm."""
    model = resolved_model(spec)
    return BoundForm(tuple(_engine_members(spec, model, n, like)), _reference_linear(spec, n, like),
                     _reduction_terms(spec, model, st, n, like), _scale_groups_linear(spec))


def mma_bound(spec, x0_abs: torch.Tensor, s: torch.Tensor, n, stats=None, x_abs=None,
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Bound on |kernel - reference| for an accumulator after a span of `n` products (a sequence:
    each unit's span, the units along the tensors' first dim).

    x0_abs: |accumulator| at the start of the span (exactly known: a tap, or 0); s: sum of |a||b|
    (scaled) over the span; stats: the span's L, V (Stats, kernels_ref.mma_stats.MmaStats or SpanStats);
    without them the bound uses what |x0| and S alone guarantee (looser). x_abs: |the reference's
    sum over the span|, or a callable that makes it (a SpanStats carries its own): truncated operands'
    bias follows it; without it that term falls back to S. Statistics of the whole output on a GPU,
    with a bound linear in them, are read in one pass (oracle.judging.bound_pass). The bound is of
    `dtype` (default: s's float type, float64 for an integer s)."""
    model = resolved_model(spec)
    dtype = dtype or (s.dtype if s.is_floating_point() else torch.float64)
    if model.chain is None and not model.union:
        return torch.zeros_like(s, dtype=torch.float64)
    if stats is None:
        st = Stats.crude(x0_abs, s.double(), _per_unit(n, lambda k: max(1, math.ceil(k / spec.tile.bk)), s))
    elif isinstance(stats, SpanStats):
        st = stats.stats()
        x_abs = stats.span_sum_abs() if x_abs is None else x_abs
    elif isinstance(stats, Stats):
        st = stats
    else:
        st = Stats.of(stats)
    form = bound_form(spec, st, n, s)
    if form.fused() and bound_pass.applies(st.l, st.v, s):  # S as it is: the pass reads it in float64
        try:
            return bound_pass.evaluate(form, st.l, st.v, s).to(dtype)
        except bound_pass.PassUnavailable as e:  # the definition below gives the same values
            warnings.warn(f"the accumulation bound's one pass could not be built ({e}); its torch definition "
                          f"is used instead", RuntimeWarning, stacklevel=2)
    st = Stats(st.l.double() * STATS_MARGIN, st.v.double() * STATS_MARGIN ** 2,
               None if st.q is None else st.q.double(), st.pabs, st.prun)
    return form.evaluate(st, s.double(), x_abs).to(dtype)


def describe(spec) -> str:
    """The accumulation model a spec is judged with, its constants and where they came from, and
    what it can and cannot catch (the report prints it)."""
    model = resolved_model(spec)
    names = model.union or (model.name,)
    keys = []
    for n in names:
        keys += list(acc_model(n, spec.mma_dtype).keys())
    if model.name == "any" and spec.mma_dtype in ("bf16", "fp16"):
        keys.append("splitk.chunk_min")
    keys = list(dict.fromkeys(keys))
    consts = "; ".join(f"{k} = {hw(k).describe()}" for k in keys) or "none (exact)"
    red = f", split-K partials reduced in {spec.reduction}" + \
        (f" every {spec.reduction_chunk} k" if spec.reduction_chunk else "") if spec.reduction != "none" else ""
    unmeasured = [k for k in keys if not hw(k).measured and not hw(k).stand_in]
    stand_ins = [k for k in keys if hw(k).stand_in]
    warn = f" UNMEASURED constants: {', '.join(unmeasured)}." if unmeasured else ""
    if stand_ins:
        warn += f" Datapath not identified, conservative stand-ins: {', '.join(stand_ins)}."
    chains = [acc_model(m, spec.mma_dtype) for m in names]
    worst = max((c.chain.growth(c.passes * math.ceil(spec.k / c.chain.values()[0])) for c in chains
                 if c.chain is not None and not c.promoted), default=1.0)
    if worst > 2:
        warn += (f" At K = {spec.k} the accumulator's own drift can reach the size of the sum (growth factor "
                 f"{worst:.3g}): the bound is loose to the point of catching only gross errors.")
    return (f"accumulation model {model.name} ({model.doc}){red}; constants: {consts}. Catches: {model.catches}."
            f"{warn}")

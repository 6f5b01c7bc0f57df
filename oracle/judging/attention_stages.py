"""The stages of an attention recording, each judged teacher-forced and chained.

Data path: the kernel's taps (oracle.run.attention_recording) indexed by site (batch, head,
query block, KV block, split) -> the reference chain (kernels_ref.attention's stages on Q, K, V
from global memory, block after block of every split, for the traced units only) with a bound
propagated beside every value -> per stage, for every tapped site:
  teacher-forced: the reference stage fed with the kernel's own taps of the stage before it
    (load_*: the operand in global memory; s: load_q and load_k; mask: s; softmax_state: mask and
    the previous KV block's softmax_state; p: mask and softmax_state's m; o: p, the previous o,
    softmax_state's rescale and load_v; normalize: the split's last o and softmax_state; combine:
    every split's normalize; store: combine, or normalize when not split);
  chained: the reference chain's own value at that site;
compared with oracle.judging.compare.compare_units (unit = (batch * heads_q + head, query block),
k_block = KV block, partial = split). A missing upstream tap is stood in for by the chain's value
(Feed.STAND_IN, the site named). Both sides of a teacher-forced comparison err from the exact value
by the stage's bound in oracle.judging.attention_tolerance, so the bound is twice it (SIDES), times
STATS_MARGIN; a chained bound adds the upstream bounds carried through the stage.

Element spaces: load_q and the per-row stages (query row, column): softmax_state's columns are
m, rescale, l; o's the head dims; normalize's and combine's the head dims then LSE (column DV);
load_k / load_v (key, dim); s, mask, p (query row, key). Rows past a sequence's query length are
padding (never compared); K and V rows past its key count must hold zero (a tail a kernel leaves
unzeroed poisons P V even where the mask hides it). The rescale of a split's first KV block
multiplies an empty accumulator: not compared. A P that is not a value of its operand type (V's)
fails where it is not, whatever its distance (bound 0 there).
Constraints: the problem's split rule is FlashAttention's (split s takes KV blocks s * per ..
(s + 1) * per - 1, per = ceil(blocks / splits)); a tap outside its split's blocks is not chained
and is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from kernels_ref._common import device_tensor
from kernels_ref.attention.combine import combine as ref_combine
from kernels_ref.attention.geometry import AttnParams, allowed_host, key_rows, layout, token_view
from kernels_ref.attention.mask import mask as ref_mask
from kernels_ref.attention.normalize import normalize as ref_normalize
from kernels_ref.attention.o import o_step
from kernels_ref.attention.p import p_tile
from kernels_ref.attention.scores import scores as ref_scores
from kernels_ref.attention.softmax_state import softmax_state as ref_softmax_state
from kernels_ref.dtypes import DTYPES
from oracle.judging.attention_tolerance import E_EXP, STATS_MARGIN, U, lookup, sub_step, u_of
from oracle.judging.compare import NOT_RUN, Comparison, combine, compare_units
from oracle.judging.differential.context import StageResult
from oracle.judging.differential.judge import with_unit_maps
from oracle.judging.evidence import PADDING, UNRECORDED, Evidence, Feed
from oracle.run.confounds import Confound, ConfoundKind

SIDES = 2  # kernel and reference each err from the exact value by a stage's bound
Key = tuple  # (batch, head, query block, KV block or None, split or None)


def params_of(spec) -> AttnParams:
    """The reference's parameters for a problem."""
    return AttnParams(scale=spec.softmax_scale, softcap=spec.softcap, causal=spec.causal,
                      window=spec.window or (-1, -1), block_q=spec.block_q, block_kv=spec.block_kv,
                      p_dtype=spec.v_dtype, p_scale=spec.p_scale or 1.0, descale_q=spec.descale_q or 1.0,
                      descale_k=spec.descale_k or 1.0, descale_v=spec.descale_v or 1.0, splits=spec.splits)


def _fin(x: torch.Tensor) -> torch.Tensor:
    """|x| with non-finite values as 0, float64."""
    return x.double().abs().nan_to_num(0.0, 0.0, 0.0).masked_fill(~torch.isfinite(x), 0.0)


def _stack(ts: list[torch.Tensor]) -> torch.Tensor:
    """The sites' tensors stacked; in fp32 where they differ in type (P may be tapped in more than one
    type: fp32 holds each 16- and 8-bit value exactly)."""
    return torch.stack(ts) if len({t.dtype for t in ts}) == 1 else torch.stack([t.float() for t in ts])


@dataclass(frozen=True)
class _Unit:
    """One comparison of a stage: where it lies, what it compares and what fed it."""

    key: Key
    received: torch.Tensor  # [R, C]
    expected: torch.Tensor  # [R, C]
    bound: Optional[torch.Tensor]  # None: bit-exact
    keep: torch.Tensor  # [R, C] bool
    origin: tuple[int, int]
    feeds: tuple[Feed, ...]
    stand_ins: tuple = ()
    padding: int = 0
    unrecorded: int = 0


def sequence_args(spec, holder, dev: Optional[torch.device] = None) -> dict:
    """The layout keywords of kernels_ref.attention (cu_seqlens_q / _k, page_table, seqlens_k) for the
    inputs `holder` holds (a recording or operands), moved to `dev` if given. A paged cache's key
    counts are the problem's (spec.lengths_k), never its pages' capacity."""
    out = {name: None if (t := getattr(holder, name)) is None else (t.to(dev) if dev is not None else t)
           for name in ("cu_seqlens_q", "cu_seqlens_k", "page_table")}
    if spec.paged and holder.cu_seqlens_k is None:
        out["seqlens_k"] = torch.tensor(spec.lengths_k, dtype=torch.int32)
    return out


class Geometry:
    """Where every query and key of the recording lives, the split rule and the operand tiles."""

    def __init__(self, rec, dev: torch.device):
        s = rec.spec
        self.spec, self.dev, self.params = s, dev, params_of(s)
        self.lay = layout(rec.q, rec.k, **sequence_args(s, rec))
        self.lq, self.lk = [int(x) for x in self.lay.lq], [int(x) for x in self.lay.lk]
        self.bq, self.bkv, self.splits = s.block_q, s.block_kv, s.splits
        self.q_tok = token_view(rec.q.detach(), s.varlen_q).to(dev)
        self.k_tok = token_view(rec.k.detach(), s.varlen_k, s.paged).to(dev)
        self.v_tok = token_view(rec.v.detach(), s.varlen_k, s.paged).to(dev)
        width = max([1] + self.lk)
        tab = torch.zeros((s.batch, width), dtype=torch.int64)
        for b in range(s.batch):
            rows = key_rows(b, self.lay, rec.page_table, s.page_size or 1)
            tab[b, :rows.numel()] = rows
        self.key_tab = tab.to(dev)

    def tile(self, key: Key) -> tuple[int, int]:
        return (key[0] * self.spec.heads_q + key[1], key[2])

    def partial(self, key: Key) -> Optional[int]:
        return key[4] if self.splits > 1 else None

    def blocks(self, b: int, sp: int) -> range:
        n = -(-self.lk[b] // self.bkv)
        per = -(-n // self.splits) if n else 0
        return range(sp * per, min((sp + 1) * per, n))

    def live(self, b: int, qb: int, kb: int) -> bool:
        """Does any query row of the block see a key of KV block kb?"""
        i = torch.arange(qb * self.bq, (qb + 1) * self.bq)
        j = torch.arange(kb * self.bkv, (kb + 1) * self.bkv)
        return bool(allowed_host(i, j, self.lq[b], self.lk[b], self.params).any())

    def rows_ok(self, b: int, qb: int) -> torch.Tensor:
        """[BQ] bool: rows of the query block inside the sequence."""
        return (qb * self.bq + torch.arange(self.bq, device=self.dev)) < self.lq[b]

    def q_tiles(self, keys) -> torch.Tensor:
        """[U, BQ, D] Q tiles in q's type, zero past the sequence."""
        b = device_tensor([k[0] for k in keys], self.dev)
        h = device_tensor([k[1] for k in keys], self.dev)
        i = device_tensor([k[2] * self.bq for k in keys], self.dev)[:, None] + \
            torch.arange(self.bq, device=self.dev)[None, :]
        lq = device_tensor(self.lq, self.dev)[b]
        ok = i < lq[:, None]
        tok = (self.lay.q_start.to(self.dev).long()[b][:, None] + i).clamp(0, max(self.q_tok.shape[0] - 1, 0))
        t = self.q_tok[tok, h[:, None]].clone()
        t[~ok] = 0
        return t

    def kv_tiles(self, which: str, keys) -> torch.Tensor:
        """[U, BKV, dim] K or V tiles (through the GQA head map and the page table), zero past the keys."""
        src = self.k_tok if which == "k" else self.v_tok
        b = device_tensor([k[0] for k in keys], self.dev)
        hk = device_tensor([k[1] // self.spec.group for k in keys], self.dev)
        j = device_tensor([k[3] * self.bkv for k in keys], self.dev)[:, None] + \
            torch.arange(self.bkv, device=self.dev)[None, :]
        ok = j < device_tensor(self.lk, self.dev)[b][:, None]
        tok = self.key_tab[b[:, None], j.clamp(max=self.key_tab.shape[1] - 1)]
        t = src[tok, hk[:, None]].clone()
        t[~ok] = 0
        return t


class Chain:
    """The reference pipeline on global memory for the traced units, every value with its bound."""

    def __init__(self, geo: Geometry, units):
        self.geo = geo
        self.val: dict[tuple, torch.Tensor] = {}
        self.bnd: dict[tuple, torch.Tensor] = {}
        if units:
            self._run(sorted(units))

    def get(self, stage: str, key: Key):
        return self.val.get((stage,) + key), self.bnd.get((stage,) + key)

    def _put(self, stage, keys, vals, bnds) -> None:
        for i, k in enumerate(keys):
            self.val[(stage,) + k] = vals[i]
            self.bnd[(stage,) + k] = bnds[i]

    def _run(self, units) -> None:
        g, s = self.geo, self.geo.spec
        dev, bq, dv, M = g.dev, g.bq, s.head_dim_v, STATS_MARGIN
        pd, ps = s.v_dtype, s.p_scale or 1.0
        n = len(units)
        norm_o, norm_l, norm_bo, norm_bl = [], [], [], []
        for sp in range(g.splits):
            m = torch.full((n, bq), -math.inf, device=dev)
            l = torch.zeros((n, bq), device=dev)
            acc = torch.zeros((n, bq, dv), device=dev)
            bm = torch.zeros((n, bq), dtype=torch.float64, device=dev)
            bl, xa = torch.zeros_like(bm), torch.zeros_like(bm)
            bacc = torch.zeros((n, bq, dv), dtype=torch.float64, device=dev)
            steps = max(len(g.blocks(b, sp)) for b, _, _ in units)
            for t in range(steps):
                act = [i for i, (b, _, _) in enumerate(units) if t < len(g.blocks(b, sp))]
                if not act:
                    continue
                keys = [units[i] + (g.blocks(units[i][0], sp)[t], sp) for i in act]
                ia = device_tensor(act, dev)
                st = self._step(keys, m[ia], l[ia], acc[ia], bm[ia], bl[ia], xa[ia], bacc[ia])
                m[ia], l[ia], acc[ia], bm[ia], bl[ia], xa[ia], bacc[ia] = st
            o, lse = ref_normalize(acc, m, l, (s.descale_v or 1.0) / ps)
            lf, of = l.double(), _fin(o)
            seen = lf > 0
            safe = torch.where(seen, lf, torch.ones_like(lf))
            bo = torch.where(seen[..., None], (bacc + of * (bl / safe)[..., None]) / safe[..., None]
                             + SIDES * lookup("normalize.o", pd).bound(of), torch.zeros_like(bacc)) * M
            blse = torch.where(seen, bm + bl / safe + SIDES * lookup("normalize.lse", pd).bound(_fin(lse), _fin(m)),
                               torch.zeros_like(bm)) * M
            keys = [u + (None, sp) for u in units]
            self._put("normalize", keys, torch.cat([o, lse[..., None]], -1),
                      torch.cat([bo, blse[..., None]], -1))
            norm_o.append(o), norm_l.append(lse), norm_bo.append(bo), norm_bl.append(blse)
        if g.splits > 1:
            op, lp = torch.stack(norm_o), torch.stack(norm_l)  # [S, n, bq, dv], [S, n, bq]
            oc, lc = ref_combine(op.reshape(g.splits, n * bq, dv), lp.reshape(g.splits, n * bq))
            oc, lc = oc.reshape(n, bq, dv), lc.reshape(n, bq)
            a = _fin(op).amax(0)
            top = torch.stack(norm_bl).amax(0)
            dl = (_fin(lp) + _fin(lc)[None]).amax(0)
            bo = (torch.stack(norm_bo).amax(0) + a * 2 * top[..., None]
                  + SIDES * lookup("combine", pd).bound(a, _fin(lc)[..., None], g.splits)) * M
            bl_c = (top + SIDES * lookup("combine.lse", pd).bound(_fin(lc), dl, g.splits)) * M
            self._put("combine", [u + (None, None) for u in units], torch.cat([oc, lc[..., None]], -1),
                      torch.cat([bo, bl_c[..., None]], -1))

    def _step(self, keys, m, l, acc, bm, bl, xa, bacc):
        """One KV block of every unit in `keys`: the chain's values and bounds after it."""
        g, s = self.geo, self.geo.spec
        M, pd, ps, bkv = STATS_MARGIN, s.v_dtype, s.p_scale or 1.0, g.bkv
        qt, kt, vt = g.q_tiles(keys), g.kv_tiles("k", keys), g.kv_tiles("v", keys)
        descale = (s.descale_q or 1.0) * (s.descale_k or 1.0)
        sc, qk = ref_scores(qt, kt, descale, with_abs=True)
        b_s = SIDES * lookup("s", s.q_dtype).bound(qk.double() * descale * M, s.head_dim)
        coords = device_tensor([(k[2] * g.bq, k[3] * bkv, g.lq[k[0]], g.lk[k[0]]) for k in keys], g.dev)
        x = ref_mask(sc, coords, g.params)
        fin = torch.isfinite(x)
        b_x = torch.where(fin, s.softmax_scale * b_s + SIDES * lookup("mask", pd).bound(_fin(x) * M, s.softcap),
                          torch.zeros_like(b_s))
        m_new, alpha, l_new = ref_softmax_state(x, m, l)
        p = p_tile(x, m_new, pd, ps)
        acc_new = o_step(acc, alpha, p, vt)
        bm_new = torch.maximum(bm, b_x.amax(-1))
        xa_new = torch.maximum(torch.maximum(xa, _fin(x).amax(-1)), _fin(m_new))
        a64, p64, v_abs = alpha.double(), p.double() / ps, _fin(vt)
        r_a = SIDES * (E_EXP.value + 2 * U * 2 * xa_new) + bm + bm_new
        b_a = a64 * r_a
        r_p = SIDES * (E_EXP.value + 2 * U * (_fin(x) + _fin(m_new)[..., None]) + u_of(pd)) + b_x + bm_new[..., None]
        b_p = p64 * r_p + sub_step(pd) / ps
        b_l = (a64 * bl + l.double() * b_a + b_p.sum(-1) + SIDES * (bkv + 1) * 2 * U * l_new.double()) * M
        pv = torch.einsum("urc,ucd->urd", p64.abs(), v_abs)
        b_acc = (a64[..., None] * bacc + _fin(acc) * b_a[..., None] + torch.einsum("urc,ucd->urd", b_p, v_abs)
                 + SIDES * lookup("o", pd).bound(a64[..., None] * _fin(acc), pv, bkv)) * M
        state = torch.stack([m_new, alpha, l_new], -1)
        b_state = torch.stack([bm_new, b_a * M, b_l], -1)
        self._put("s", keys, sc, b_s)
        self._put("mask", keys, x, b_x)
        self._put("softmax_state", keys, state, b_state)
        self._put("p", keys, p, b_p * ps * M)
        self._put("o", keys, acc_new, b_acc)
        return m_new, l_new, acc_new, bm_new, b_l, xa_new, b_acc


class StageJudge:
    """Every stage of one attention recording (module docstring)."""

    def __init__(self, rec, dev: torch.device):
        self.rec, self.dev = rec, dev
        self.spec = rec.spec
        self.geo = Geometry(rec, dev)
        self.taps: dict[tuple, object] = {}
        for t in rec.taps:
            sp = None if t.stage == "combine" else (t.partial or 0)
            self.taps[(t.stage, t.group, t.tile[1], t.tile[0], t.k_block, sp)] = t
        self.units = sorted({(k[1], k[2], k[3]) for k in self.taps})
        self.chain = Chain(self.geo, self.units)
        self.notes: list[str] = []
        self.confounds: list[Confound] = []
        self._check_splits()

    # -- plumbing ------------------------------------------------------------------------------
    def sites(self, stage: str) -> list[Key]:
        return sorted(k[1:] for k in self.taps if k[0] == stage)

    def tap(self, stage: str, key: Key):
        t = self.taps.get((stage,) + tuple(key))
        return None if t is None else t.values.to(self.dev)

    def traced_tiles(self) -> set:
        return {self.geo.tile(u + (None, None)) for u in self.units}

    def _check_splits(self) -> None:
        g = self.geo
        odd = [k for k in self.taps if k[4] is not None and k[4] not in g.blocks(k[1], k[5])]
        if odd:
            st, b, h, qb, kb, sp = odd[0]
            self.confounds.append(Confound.of(ConfoundKind.OUTSIDE_SPLIT, st, count=len(odd),
                                              first=f"{st} batch {b} head {h} query block {qb} KV block {kb} split {sp}",
                                              blocks=str(list(g.blocks(b, sp)))))

    def _input(self, stage: str, key: Key, stand_ins: list, which: Optional[slice] = None):
        """The kernel's tap of `stage` at `key`, else the chain's value (a stand-in, named)."""
        v = self.tap(stage, key)
        if v is None:
            v, _ = self.chain.get(stage, key)
            if v is None:
                return None
            stand_ins.append((stage, self.geo.tile(key), key[3]))
        return v if which is None else v[..., which]

    def _keep(self, key: Key, cols: int) -> tuple[torch.Tensor, int]:
        ok = self.geo.rows_ok(key[0], key[2])[:, None].expand(self.geo.bq, cols)
        return ok.clone(), int((~ok).sum())

    def _origin(self, stage: str, key: Key) -> tuple[int, int]:
        if stage in ("load_k", "load_v"):
            return (key[3] * self.geo.bkv, 0)
        if stage in ("s", "mask", "p"):
            return (key[2] * self.geo.bq, key[3] * self.geo.bkv)
        return (key[2] * self.geo.bq, 0)

    def _unit(self, stage, key, received, expected, bound, feeds, stand_ins=(), keep=None, padding=0) -> _Unit:
        if keep is None:
            keep, padding = self._keep(key, received.shape[-1])
        t = self.taps.get((stage,) + tuple(key))
        unrec = 0
        if t is not None and t.mask is not None:
            m = t.mask.to(self.dev)
            unrec = int((keep & ~m).sum())
            keep = keep & m
        if stand_ins:
            feeds = tuple(dict.fromkeys(feeds + (Feed.STAND_IN,)))
        return _Unit(key, received, expected, bound, keep, self._origin(stage, key), feeds, tuple(stand_ins),
                     padding, unrec)

    def judge(self, units: list[_Unit], *notes: str) -> Comparison:
        if not units:
            return NOT_RUN
        exact = units[0].bound is None
        r = torch.stack([u.received if exact else u.received.double() for u in units])
        e = torch.stack([u.expected if exact else u.expected.double() for u in units])
        b = None if exact else torch.stack([u.bound.double() for u in units])
        keep = torch.stack([u.keep for u in units])
        parts = compare_units(r, e, origins=[u.origin for u in units], tiles=[self.geo.tile(u.key) for u in units],
                              k_blocks=[u.key[3] for u in units], bound=b, mask=keep)
        parts = with_unit_maps(parts, r, e, b, keep)
        out = []
        for u, part in zip(units, parts):
            masked = tuple((r_, n) for r_, n in ((PADDING, u.padding), (UNRECORDED, u.unrecorded)) if n)
            ev = Evidence(u.feeds, masked, u.stand_ins)
            out.append(part.of_partial(self.geo.partial(u.key)).labelled(ev))
        return combine(out, *notes)

    def chained(self, stage: str, keep_fn=None) -> Comparison:
        """The kernel's taps of `stage` against the chain's values at their sites."""
        units = []
        for key in self.sites(stage):
            e, b = self.chain.get(stage, key)
            if e is None:
                continue
            r = self.tap(stage, key)
            keep, pad = keep_fn(key) if keep_fn else (None, 0)
            units.append(self._unit(stage, key, r, e, b, (Feed.REFERENCE,), keep=keep, padding=pad))
        return self.judge(units)

    # -- the stages ----------------------------------------------------------------------------
    def loads(self, stage: str) -> StageResult:
        keys = self.sites(stage)
        units = []
        if keys:
            exp = self.geo.q_tiles(keys) if stage == "load_q" else self.geo.kv_tiles(stage[-1], keys)
            for key, e in zip(keys, exp):
                keep = pad = None
                if stage != "load_q":  # every K / V row is compared: a tail past the keys must be zero
                    keep, pad = torch.ones(e.shape, dtype=torch.bool, device=self.dev), 0
                units.append(self._unit(stage, key, self.tap(stage, key), e, None, (Feed.GLOBAL,), keep=keep,
                                        padding=pad or 0))
        c = self.judge(units)
        return StageResult(stage, c, c)

    def s(self) -> StageResult:
        keys = self.sites("s")
        units = []
        if keys:
            ins = []
            for key in keys:
                st: list = []
                q = self.tap("load_q", key[:3] + (None, key[4]))
                if q is None:
                    q = self.geo.q_tiles([key])[0]
                    st.append(("load_q", self.geo.tile(key), None))
                k = self.tap("load_k", key)
                if k is None:
                    k = self.geo.kv_tiles("k", [key])[0]
                    st.append(("load_k", self.geo.tile(key), key[3]))
                ins.append((q, k, st))
            descale = (self.spec.descale_q or 1.0) * (self.spec.descale_k or 1.0)
            e, qk = ref_scores(torch.stack([i[0] for i in ins]), torch.stack([i[1] for i in ins]), descale,
                               with_abs=True)
            bound = SIDES * lookup("s", self.spec.q_dtype).bound(qk.double() * descale * STATS_MARGIN,
                                                                  self.spec.head_dim)
            units = [self._unit("s", key, self.tap("s", key), e[i], bound[i], (Feed.KERNEL,), ins[i][2])
                     for i, key in enumerate(keys)]
        return StageResult("s", self.judge(units), self.chained("s"))

    def mask(self) -> StageResult:
        keys = self.sites("mask")
        units = []
        if keys:
            st = [[] for _ in keys]
            s_in = [self._input("s", key, st[i]) for i, key in enumerate(keys)]
            ok = [i for i, x in enumerate(s_in) if x is not None]
            g = self.geo
            coords = device_tensor([(keys[i][2] * g.bq, keys[i][3] * g.bkv, g.lq[keys[i][0]], g.lk[keys[i][0]])
                                    for i in ok], self.dev).reshape(-1, 4)
            if ok:
                e = ref_mask(torch.stack([s_in[i] for i in ok]), coords, g.params)
                b = SIDES * lookup("mask", self.spec.v_dtype).bound(_fin(e) * STATS_MARGIN, self.spec.softcap)
                units = [self._unit("mask", keys[i], self.tap("mask", keys[i]), e[n], b[n], (Feed.KERNEL,), st[i])
                         for n, i in enumerate(ok)]
        return StageResult("mask", self.judge(units), self.chained("mask"))

    def _prev(self, key: Key) -> Optional[Key]:
        blocks = self.geo.blocks(key[0], key[4])
        return key[:3] + (key[3] - 1, key[4]) if key[3] - 1 in blocks else None

    def _state_keep(self, key: Key) -> tuple[torch.Tensor, int]:
        keep, pad = self._keep(key, 3)
        if self._prev(key) is None:  # the first block's rescale multiplies an empty accumulator
            pad += int(keep[:, 1].sum())
            keep[:, 1] = False
        return keep, pad

    def softmax_state(self) -> StageResult:
        keys = self.sites("softmax_state")
        units = []
        rows = []
        for key in keys:
            st: list = []
            x = self._input("mask", key, st)
            prev = self._prev(key)
            if prev is None:
                m0 = torch.full((self.geo.bq,), -math.inf, device=self.dev)
                l0 = torch.zeros((self.geo.bq,), device=self.dev)
            else:
                ps = self._input("softmax_state", prev, st)
                m0, l0 = (None, None) if ps is None else (ps[:, 0], ps[:, 2])
            if x is not None and m0 is not None:
                rows.append((key, x, m0, l0, st))
        if rows:
            x, m0, l0 = (torch.stack([r[i] for r in rows]) for i in (1, 2, 3))
            m, a, l = ref_softmax_state(x.float(), m0.float().contiguous(), l0.float().contiguous())
            xa = torch.maximum(torch.maximum(_fin(x).amax(-1), _fin(m0)), _fin(m)) * STATS_MARGIN
            pd = self.spec.v_dtype
            b_a = SIDES * lookup("softmax_state.alpha", pd).bound(a.double(), 2 * xa)
            b_l = SIDES * lookup("softmax_state.l", pd).bound(l.double(), 2 * xa, self.geo.bkv, 1) + \
                l0.double() * b_a
            b_m = lookup("softmax_state.m", pd).bound(m.double())
            e = torch.stack([m, a, l], -1)
            b = torch.stack([b_m, b_a, b_l], -1) * STATS_MARGIN
            for n, (key, *_, st) in enumerate(rows):
                keep, pad = self._state_keep(key)
                units.append(self._unit("softmax_state", key, self.tap("softmax_state", key), e[n], b[n],
                                        (Feed.KERNEL,), st, keep=keep, padding=pad))
        return StageResult("softmax_state", self.judge(units), self.chained("softmax_state", self._state_keep))

    def p(self) -> StageResult:
        keys = self.sites("p")
        pd, ps = self.spec.v_dtype, self.spec.p_scale or 1.0
        ptype = DTYPES[pd].torch
        rows, units, notes = [], [], []
        for key in keys:
            st: list = []
            x = self._input("mask", key, st)
            m = self._input("softmax_state", key, st, 0)
            if x is not None and m is not None:
                rows.append((key, x, m, st))
        if rows:
            x, m = torch.stack([r[1] for r in rows]).float(), torch.stack([r[2] for r in rows]).float()
            e = p_tile(x, m.contiguous(), pd, ps)
            xm = (_fin(x) + _fin(m)[..., None]) * STATS_MARGIN
            b = SIDES * ps * lookup("p", pd).bound(e.double() / ps, xm, ps) * STATS_MARGIN
            off_type = 0
            for n, (key, *_, st) in enumerate(rows):
                r = self.tap("p", key)
                r64 = r.double()
                own = r.to(ptype).double()
                not_type = (r64 != own) & ~torch.isnan(r64)
                off_type += int(not_type.sum())
                bound = b[n].masked_fill(not_type, 0.0)
                units.append(self._unit("p", key, r64, e[n].double(), bound, (Feed.KERNEL,), st))
            kinds = sorted({str(self.taps[("p",) + k].values.dtype) for k in keys})
            if off_type:
                notes.append(f"p: {off_type} element(s) of P are not values of {pd} (V's type, the one the second MMA "
                             f"reads; the taps hold {', '.join(kinds)}): P was rounded to another type or not at all")
        return StageResult("p", self.judge(units, *notes), self.chained("p"))

    def o(self) -> StageResult:
        keys = self.sites("o")
        s, rows, notes = self.spec, [], []
        for key in keys:
            st: list = []
            p = self._input("p", key, st)
            a = self._input("softmax_state", key, st, 1)
            prev = self._prev(key)
            acc = torch.zeros((self.geo.bq, s.head_dim_v), device=self.dev) if prev is None else \
                self._input("o", prev, st)
            v = self.tap("load_v", key)
            if v is None:
                v = self.geo.kv_tiles("v", [key])[0]
                st.append(("load_v", self.geo.tile(key), key[3]))
            if p is not None and a is not None and acc is not None:
                rows.append((key, p, a, acc, v, st))
        units = []
        if rows:
            p_types = ", ".join(sorted({str(r[1].dtype) for r in rows}))
            p, a, acc, v = (_stack([r[i] for r in rows]) for i in (1, 2, 3, 4))
            if p.dtype == v.dtype:
                e = o_step(acc.float().contiguous(), a.float().contiguous(), p, v)
            else:  # the reference takes P in V's type: the float64 specification takes the kernel's P as it is
                e = acc.double() * a.double()[..., None] + p.double() @ v.double()
                notes.append(f"o: fed the kernel's P in {p_types} beside V in {v.dtype}: computed by the float64 "
                             f"specification (kernels_ref.attention.o's reference takes one operand type)")
            pv = torch.einsum("urc,ucd->urd", _fin(p), _fin(v))
            b = SIDES * lookup("o", s.v_dtype).bound(_fin(a)[..., None] * _fin(acc) * STATS_MARGIN,
                                                      pv * STATS_MARGIN, self.geo.bkv)
            units = [self._unit("o", r[0], self.tap("o", r[0]), e[n], b[n], (Feed.KERNEL,), r[5])
                     for n, r in enumerate(rows)]
        return StageResult("o", self.judge(units, *notes), self.chained("o"))

    def _last_block(self, key: Key) -> Optional[int]:
        """The split's last KV block that any row of the query block sees (None: it sees none)."""
        live = [kb for kb in self.geo.blocks(key[0], key[4]) if self.geo.live(key[0], key[2], kb)]
        return live[-1] if live else None

    def _empty_lse(self, split_partial: bool) -> float:
        return -math.inf if split_partial or self.spec.empty_lse == "-inf" else math.inf

    def normalize(self) -> StageResult:
        keys = self.sites("normalize")
        s, g, rows = self.spec, self.geo, []
        for key in keys:
            st: list = []
            last = self._last_block(key)
            if last is None:  # a split no row of the block sees anything in: it ends as it began, empty
                acc = torch.zeros((g.bq, s.head_dim_v), device=self.dev)
                m, l = torch.full((g.bq,), -math.inf, device=self.dev), torch.zeros((g.bq,), device=self.dev)
            else:
                tapped = [k[4] for k in self.taps if k[0] == "o" and k[1:4] == key[:3] and k[5] == key[4]]
                kb = max(tapped) if tapped and max(tapped) >= last else last
                at = key[:3] + (kb, key[4])
                acc, state = self._input("o", at, st), self._input("softmax_state", at, st)
                if acc is None or state is None:
                    continue
                m, l = state[:, 0], state[:, 2]
            rows.append((key, acc, m, l, st))
        units = []
        if rows:
            acc, m, l = (torch.stack([r[i] for r in rows]).float().contiguous() for i in (1, 2, 3))
            o, lse = ref_normalize(acc, m, l, (s.descale_v or 1.0) / (s.p_scale or 1.0))
            lse = lse.masked_fill(lse == -math.inf, self._empty_lse(g.splits > 1))
            pd = s.v_dtype
            b_o = SIDES * lookup("normalize.o", pd).bound(_fin(o))
            b_l = SIDES * lookup("normalize.lse", pd).bound(_fin(lse), _fin(m))
            e = torch.cat([o, lse[..., None]], -1)
            b = torch.cat([b_o, b_l[..., None]], -1) * STATS_MARGIN
            units = [self._unit("normalize", r[0], self.tap("normalize", r[0]), e[n], b[n], (Feed.KERNEL,), r[4])
                     for n, r in enumerate(rows)]
        return StageResult("normalize", self.judge(units), self._chained_lse("normalize", g.splits > 1))

    def _chained_lse(self, stage: str, split_partial: bool) -> Comparison:
        """chained(), with the LSE of an empty row in the convention the stage writes it."""
        fill = self._empty_lse(split_partial)
        if fill == -math.inf:
            return self.chained(stage)
        for k in list(self.chain.val):
            if k[0] == stage:
                v = self.chain.val[k].clone()
                v[:, -1] = v[:, -1].masked_fill(v[:, -1] == -math.inf, fill)
                self.chain.val[k] = v
        return self.chained(stage)

    def combine(self) -> StageResult:
        keys = self.sites("combine")
        s, g, rows = self.spec, self.geo, []
        for key in keys:
            st: list = []
            parts = [self._input("normalize", key[:3] + (None, sp), st) for sp in range(g.splits)]
            if all(p is not None for p in parts):
                rows.append((key, torch.stack(parts), st))
        units = []
        if rows:
            parts = torch.stack([r[1] for r in rows], 1).float()  # [S, n, bq, dv + 1]
            n, dv = len(rows), s.head_dim_v
            o_p, l_p = parts[..., :dv], parts[..., dv]
            o, lse = ref_combine(o_p.reshape(g.splits, n * g.bq, dv).contiguous(),
                                 l_p.reshape(g.splits, n * g.bq).contiguous())
            o, lse = o.reshape(n, g.bq, dv), lse.reshape(n, g.bq)
            lse = lse.masked_fill(lse == -math.inf, self._empty_lse(False))
            pd = s.v_dtype
            a = _fin(o_p).amax(0) * STATS_MARGIN
            dl = (_fin(l_p) + _fin(lse)[None]).amax(0)
            b_o = SIDES * lookup("combine", pd).bound(a, _fin(lse)[..., None], g.splits) + 4 * U * a
            b_l = SIDES * lookup("combine.lse", pd).bound(_fin(lse), dl, g.splits)
            e = torch.cat([o, lse[..., None]], -1)
            b = torch.cat([b_o, b_l[..., None]], -1) * STATS_MARGIN
            units = [self._unit("combine", r[0], self.tap("combine", r[0]), e[i], b[i], (Feed.KERNEL,), r[2])
                     for i, r in enumerate(rows)]
        return StageResult("combine", self.judge(units), self._chained_lse("combine", False))

    def store_forced(self, received: torch.Tensor, keep: torch.Tensor) -> Comparison:
        """The output against the kernel's own last tap (combine, or normalize when not split) rounded
        to the output type: received / keep [B * H * n_qblocks, BQ, DV + 1] in unit order."""
        g, s = self.geo, self.spec
        stage = "combine" if g.splits > 1 else "normalize"
        nqb = -(-max(self.geo.lay.max_q, 1) // g.bq)
        units = []
        u_o, step = u_of(s.o_dtype), sub_step(s.o_dtype) / 2
        for key in self.sites(stage):
            t = self.tap(stage, key).double()
            bound = torch.cat([u_o * _fin(t[:, :-1]) + step, torch.zeros_like(t[:, -1:])], -1)
            u = (key[0] * s.heads_q + key[1]) * nqb + key[2]
            units.append(_Unit(key[:3] + (None, None), received[u], t, bound, keep[u].bool(), (key[2] * g.bq, 0),
                               (Feed.KERNEL,), padding=int((~keep[u].bool()).sum())))
        return self.judge(units)

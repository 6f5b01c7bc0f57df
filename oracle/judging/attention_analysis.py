"""The differential of an attention recording: the stage table of the attention chain, judged on
what was observed, as the same Analysis a GEMM gets (so the report renders it unchanged).

Stages, in order (harness.taps.attention_pipeline): load_q, load_k, load_v, s, mask,
softmax_state, p, o, normalize, combine (split-KV only), store. Every tapped stage is judged
teacher-forced and chained (oracle.judging.attention_stages); the first divergence is
oracle.judging.diagnose.first_divergence over them, and a finding is a VERDICT only on controlled
inputs, with no open confound, for a teacher-forced root cause fed by the kernel's own taps or
global memory (no stand-in); a DRAFT says what a VERDICT needs. A recording without taps
(oracle.check_attention) has every stage but `store` NOT_RUN. `store` is judged chained: the
kernel's O and LSE against the reference forward
(kernels_ref.attention.forward, on the reference device) with the bound of
oracle.judging.attention_tolerance, per unit (batch * heads_q + head, query block). The store's
element space is one sequence's [query, head_dim_v + 1]: columns 0..head_dim_v - 1 are O, column
head_dim_v is LSE. Padding rows (past a sequence's length) are not compared. The reference is
cross-checked on a few (batch, head) pairs against the float64 specification
(attention_forward_host) with the reference's own share of the bound: a disagreement makes the run
ORACLE_UNTRUSTED.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from harness.taps import ATTENTION_KV_STAGES, SOFTMAX_STATE_COLUMNS, attention_pipeline
from kernels_ref.attention.forward import attention_forward, attention_forward_host
from kernels_ref.attention.geometry import layout
from oracle import knobs
from oracle.judging.attention_stages import StageJudge, params_of, sequence_args
from oracle.judging.attention_tolerance import STATS_MARGIN, U, output_bound, row_terms
from oracle.judging.compare import NOT_RUN, Status, combine, compare_units
from oracle.judging.diagnose import Diagnosis, Kind, Verdict, evidence_kind, first_divergence
from oracle.judging.differential.analysis import Analysis, reference_device
from oracle.judging.differential.context import StageResult
from oracle.judging.differential.findings import NO_OPEN_CONFOUND, FirstDivergence, first_nonfinite
from oracle.judging.differential.judge import with_unit_maps
from oracle.judging.differential.out_of_bounds import ordered, out_of_bounds_finding
from oracle.judging.evidence import Evidence, Feed
from oracle.run.caller import Advice, Option
from oracle.run.confounds import Confound, ConfoundKind

STAGES = attention_pipeline(split=True)
__all__ = ["STAGES", "analyze_attention", "cross_check", "describe_element", "params_of", "rows_of"]


def rows_of(x: torch.Tensor, spec, lay, varlen: bool, lse: bool = False) -> torch.Tensor:
    """O ([.., heads, C]) or an LSE (lse=True) in FlashAttention's layout -> [batch, heads_q, max_q, C],
    float64, padded with 0."""
    if lse:  # dense [B, H, Lq] -> [B, Lq, H, 1]; varlen [H, total_q] -> [total_q, H, 1]
        x = (x.permute(1, 0) if varlen else x.permute(0, 2, 1)).unsqueeze(-1)
    maxq = max(lay.max_q, 1)
    out = torch.zeros((spec.batch, spec.heads_q, maxq, x.shape[-1]), dtype=torch.float64, device=x.device)
    if not varlen:
        out[:, :, :x.shape[1]] = x.permute(0, 2, 1, 3).double()
        return out
    for b, (q0, n) in enumerate(zip(lay.q_start.tolist(), lay.lq.tolist())):
        out[b, :, :n] = x[q0:q0 + n].permute(1, 0, 2).double()
    return out


def _units(x: torch.Tensor, bq: int) -> torch.Tensor:
    """[B, H, maxq, C] -> [B * H * n_qblocks, bq, C] (rows padded to whole blocks)."""
    b, h, q, c = x.shape
    nqb = -(-q // bq)
    if nqb * bq != q:
        pad = torch.zeros((b, h, nqb * bq - q, c), dtype=x.dtype, device=x.device)
        x = torch.cat([x, pad], dim=2)
    return x.reshape(b * h * nqb, bq, c)


def v_abs_max(v: torch.Tensor) -> float:
    """max |V| for the output model's per-key terms; a NaN in V is left out (it makes NaN outputs on both
    sides, which agree), so that it does not make every other element's bound NaN."""
    return float(v.detach().float().abs().nan_to_num(nan=0.0).amax()) if v.numel() else 0.0


def _store(rec, o_ref, lse_ref, stats, dev, judge: Optional[StageJudge] = None) -> StageResult:
    spec = rec.spec
    lay = layout(rec.q, rec.k, **sequence_args(spec, rec))
    v_abs = v_abs_max(rec.v)
    b, hq, maxq = stats.rows_shape
    e_o = rows_of(o_ref, spec, lay, spec.varlen_q)
    e_l = rows_of(lse_ref, spec, lay, spec.varlen_q, True)
    b_o, b_l = output_bound(spec, stats, e_o.reshape(-1, spec.head_dim_v), e_l.reshape(-1), v_abs)
    if spec.empty_lse == "+inf":
        e_l = torch.where(e_l == float("-inf"), torch.full_like(e_l, float("inf")), e_l)
    received_o = rows_of(rec.output.to(dev), spec, lay, spec.varlen_q)
    if rec.lse is not None:
        received_l = rows_of(rec.lse.to(dev).float(), spec, lay, spec.varlen_q, True)
    else:
        received_l = torch.zeros_like(e_l)
    rows_ok = (torch.arange(maxq, device=dev)[None, :] < lay.lq.to(dev)[:, None].long())  # [B, maxq]
    rows_ok = rows_ok[:, None, :, None].expand(b, hq, maxq, 1)
    keep = torch.cat([rows_ok.expand(b, hq, maxq, spec.head_dim_v), rows_ok & (rec.lse is not None)], dim=-1)
    bound = torch.cat([b_o.reshape(b, hq, maxq, -1), b_l.reshape(b, hq, maxq, 1)], dim=-1)
    bq = spec.block_q
    r, e, bd, m = (_units(t, bq) for t in (torch.cat([received_o, received_l], -1), torch.cat([e_o, e_l], -1),
                                           bound, keep.double()))
    nqb = -(-maxq // bq)
    tiles = [(u // nqb, u % nqb) for u in range(r.shape[0])]
    origins = [((u % nqb) * bq, 0) for u in range(r.shape[0])]
    parts = compare_units(r, e, origins=origins, tiles=tiles, k_blocks=[None] * len(tiles), bound=bd, mask=m > 0)
    parts = with_unit_maps(parts, r, e, bd, m > 0)
    cmp = combine([p for p in parts if p.tiles]) if any(p.tiles for p in parts) else NOT_RUN
    forced = NOT_RUN if judge is None else judge.store_forced(r, m > 0)
    return StageResult("store", forced, cmp.labelled(Evidence.of(Feed.REFERENCE)))


def cross_check(spec, rec, o_ref, lse_ref, stats, dev) -> list[str]:
    """The Triton reference against the float64 specification on a few (batch, head) pairs; `rec`
    holds the inputs (q, k, v, cu_seqlens_q, cu_seqlens_k, page_table: a recording or the operands)."""
    n = max(1, knobs.CROSS_CHECK_TILES.get())
    pairs = sorted({(0, 0), (spec.batch - 1, spec.heads_q - 1)})[:n]
    params = params_of(spec)
    o_h, l_h = attention_forward_host(rec.q, rec.k, rec.v, params, **sequence_args(spec, rec), heads=pairs,
                                      device=dev)
    lay = layout(rec.q, rec.k, **sequence_args(spec, rec))
    v_abs = v_abs_max(rec.v)
    terms = row_terms(spec, stats, v_abs)
    b, hq, maxq = stats.rows_shape
    out = []
    for bb, h in pairs:  # only these rows leave their device, never the whole output
        n_q = int(lay.lq[bb])
        e_o, h_o = (_pair_rows(x, lay, spec.varlen_q, bb, h, n_q).to(dev) for x in (o_ref, o_h))
        ll, lh = (_pair_rows(x, lay, spec.varlen_q, bb, h, n_q, lse=True).to(dev) for x in (lse_ref, l_h))
        a = stats.av.reshape(b, hq, maxq, -1)[bb, h, :n_q].double().to(dev) * STATS_MARGIN
        rel, absolute, lse_t = (t.reshape(b, hq, maxq)[bb, h, :n_q].double().to(dev)
                                for t in (terms.rel, terms.absolute, terms.lse))
        # a row whose |q||k| passes fp32's range: its scores overflow in fp32 (the reference's, as in any
        # fp32 kernel) and not in float64, which no bound covers; the stages judge it against the reference
        in_range = torch.isfinite(stats.qk_abs.reshape(b, hq, maxq)[bb, h, :n_q].to(dev))
        # equal values (an infinity in V) and NaN in both (a NaN among the inputs) agree: each side
        # propagates them as the kernel would
        bad = ~(((e_o - h_o).abs() <= rel[:, None] * a + absolute[:, None]) | (e_o == h_o)
                | (torch.isnan(e_o) & torch.isnan(h_o)))
        both_inf = torch.isinf(ll) & torch.isinf(lh) & (torch.sign(ll) == torch.sign(lh))
        both_nan = torch.isnan(ll) & torch.isnan(lh)
        bad_l = ~(both_inf | both_nan | ((ll - lh).abs() <= lse_t + 4 * U * lh.abs().nan_to_num(0, 0, 0)))
        bad, bad_l = bad & in_range[:, None], bad_l & in_range
        if bool(bad.any()) or bool(bad_l.any()):
            i = int((bad.any(-1) | bad_l).nonzero()[0, 0])
            out.append(f"attention_forward disagrees with attention_forward_host at batch {bb}, head {h}, query {i}: "
                       f"O {e_o[i, :4].tolist()} vs {h_o[i, :4].tolist()}, LSE {float(ll[i])} vs {float(lh[i])}")
    return out


def _pair_rows(x: torch.Tensor, lay, varlen: bool, b: int, h: int, n_q: int, lse: bool = False) -> torch.Tensor:
    """The n_q query rows of (batch b, query head h), float64: of O ([n_q, C]) or of an LSE ([n_q]),
    in FlashAttention's layout (as rows_of reads them)."""
    if lse:  # dense [B, H, Lq]; varlen [H, total_q]
        q0 = int(lay.q_start[b]) if varlen else 0
        return (x[h, q0:q0 + n_q] if varlen else x[b, h, :n_q]).double()
    if varlen:  # [total_q, H, C]
        q0 = int(lay.q_start[b])
        return x[q0:q0 + n_q, h].double()
    return x[b, :n_q, h].double()  # [B, Lq, H, C]


def analyze_attention(rec, device: Optional[torch.device] = None) -> Analysis:
    """The attention differential on an AttentionRecording (module docstring)."""
    rec.validate()
    spec = rec.spec
    dev = device or reference_device()
    names = attention_pipeline(split=spec.splits > 1)
    if rec.output is None and not rec.taps:
        diag = first_divergence([], kernel_error=True)
        stages = tuple(StageResult(n, NOT_RUN, NOT_RUN) for n in names)
        return Analysis(rec, stages, (), diag, Kind.DRAFT, (), (), None, None, str(dev))
    judge = StageJudge(rec, dev) if rec.taps else None
    stages = _stages(judge, names)
    params = params_of(spec)
    q, k, v = (t.detach().to(dev) for t in (rec.q, rec.k, rec.v))
    o_ref, lse_ref, stats = attention_forward(q, k, v, params, **sequence_args(spec, rec, dev), with_stats=True)
    cross = tuple(cross_check(spec, rec, o_ref, lse_ref, stats, dev))
    if rec.output is not None:
        stages.append(_store(rec, o_ref, lse_ref, stats, dev, judge))
    else:
        stages.append(StageResult("store", NOT_RUN, NOT_RUN))
    traced = judge.traced_tiles() if judge is not None else None
    diag = first_divergence([s.outcome for s in stages], kernel_error=rec.kernel_error is not None,
                            references_trusted=not cross, traced_tiles=traced or None)
    controlled = rec.provenance.controlled
    open_conf = list(rec.confounds)
    if not controlled:
        open_conf.append(Confound.of(ConfoundKind.UNCONTROLLED_INPUTS, provenance=rec.provenance.describe()))
    incomplete = tuple(_trace_confounds(rec))
    open_conf.extend(incomplete)
    if judge is not None:
        open_conf.extend(judge.confounds)
    handled = ()
    if judge is not None:
        pad = {s.name: s.teacher_forced.evidence.masked_count("padding") for s in stages}
        per = ", ".join(f"{n} {c}" for n, c in pad.items() if c)
        if per:
            handled = (Confound.of(ConfoundKind.PADDED_QUERIES, by_stage=per),)
    first, kind = None, evidence_kind(diag, inputs_controlled=controlled, confounds=open_conf)
    if diag.verdict is Verdict.DIVERGED:
        first, kind = _finding(rec, judge, stages, diag, controlled, open_conf)
    breach = out_of_bounds_finding(rec.guard_breaches, diag, inputs_controlled=controlled, confounds=open_conf,
                                   stage="store")
    if breach is not None:  # the stage table saw nothing wrong, the guard bands did
        diag, first, kind = breach
    unobserved = _unobserved(rec, stages, judge)
    notes = tuple(judge.notes) if judge is not None else ()
    if notes:
        rec_notes = tuple(dict.fromkeys(tuple(rec.notes) + notes))
        rec = dataclasses.replace(rec, notes=rec_notes)
    return Analysis(rec, tuple(stages), cross, diag, kind, tuple(open_conf), handled, first, first_nonfinite(stages),
                    str(dev), unobserved, out_of_bounds=ordered(rec.guard_breaches))


def _stages(judge: Optional[StageJudge], names) -> list[StageResult]:
    """Every stage but store, in pipeline order (NOT_RUN without taps)."""
    if judge is None:
        return [StageResult(n, NOT_RUN, NOT_RUN) for n in names[:-1]]
    out = []
    for n in names[:-1]:
        if n.startswith("load_"):
            out.append(judge.loads(n))
        else:
            out.append(getattr(judge, n)())
    return out


def _trace_confounds(rec) -> list[Confound]:
    """An overflowed or torn trace: the stages that lost records (every finding on them is a draft)."""
    acc = rec.trace
    if acc is None or acc.complete:
        return []
    out = []
    if acc.dropped:
        by = ", ".join(f"{s} {n}" for s, n in acc.dropped_by_stage) if acc.dropped_by_stage else "not said"
        out.append(Confound.of(ConfoundKind.DROPPED_RECORDS, dropped=acc.dropped, capacity=acc.capacity,
                               needed_bytes=acc.needed_bytes, by_stage=by, lost="", advice=False))
    if acc.torn:
        out.append(Confound.of(ConfoundKind.TORN_RECORDS, torn=acc.torn))
    return out


def _unobserved(rec, stages, judge) -> tuple[str, ...]:
    silent = [s.name for s in stages if s.name != "store" and s.teacher_forced.status is Status.NOT_RUN
              and s.chained.status is Status.NOT_RUN]
    out = []
    if silent:
        why = "no tap" if rec.taps else "no tap: the recording holds only the output"
        out.append(f"not observed: {', '.join(silent)} ({why})")
    for s in stages:
        if s.teacher_forced.evidence.stand_ins:
            from oracle.judging.evidence import describe_sites

            out.append(f"{s.name} was teacher-forced through reference stand-ins for "
                       f"{describe_sites(s.teacher_forced.evidence.stand_ins)}")
    if judge is not None:
        spec = rec.spec
        total = spec.batch * spec.heads_q * spec.q_blocks
        if len(judge.units) < total:
            out.append(f"{len(judge.units)} of {total} units (batch, head, query block) traced (the others are judged "
                       f"at the output only)")
    return tuple(out)


# -- the finding -----------------------------------------------------------------------------
def describe_element(spec, stage: str, element: tuple[int, int]) -> str:
    """An element of a stage's tensor space in words: 'query 5, key 17', 'key 17, dim 3',
    'query 5 l', 'query 5 LSE'."""
    r, c = element
    if stage in ("load_k", "load_v"):
        return f"key {r}, dim {c}"
    if stage in ("s", "mask", "p"):
        return f"query {r}, key {c}"
    if stage == "softmax_state":
        return f"query {r} {SOFTMAX_STATE_COLUMNS[c] if 0 <= c < 3 else c}"
    if stage in ("normalize", "combine", "store") and c == spec.head_dim_v:
        return f"query {r} LSE"
    return f"query {r}, dim {c}"


def _site_words(spec, tile, kb, partial) -> str:
    b, h, qb = spec.unit_of(tile)
    return (f"batch {b}, head {h}, query block {qb}" + (f", KV block {kb}" if kb is not None else "") +
            (f", split {partial}" if partial is not None else ""))


def _finding(rec, judge, stages, diag: Diagnosis, controlled: bool, confounds) -> tuple[FirstDivergence, Kind]:
    spec = rec.spec
    st = next(s for s in stages if s.name == diag.stage)
    which = "teacher_forced" if diag.root_cause else "chained"
    cmp = st.teacher_forced if diag.root_cause else st.chained
    unit = cmp.first_bad_tile
    if diag.untraced:
        bad = cmp.failing_in(diag.untraced)
        unit = max(bad, key=lambda t: (t.max_ratio, t.mismatches)) if bad else unit
    missing = []
    if not controlled:
        missing.append(Advice.of("controlled inputs (oracle.run.attention_inputs: ones, one_hot, index, large_logits, "
                                 "masked_row, random[:seed])"))
    if confounds:
        missing.append(NO_OPEN_CONFOUND)
    stand_ins = unit.stand_ins if unit is not None else ()
    if not rec.taps:
        missing.append(Advice.of("taps of the attention stages inside the kernel (oracle_trace/attention.cuh): the "
                                 "output alone cannot say which stage went wrong"))
    elif diag.untraced and unit is not None:
        b, h, qb = spec.unit_of(unit.tile)
        missing.append(Advice.of(f"a trace of batch {b}, head {h}, query block {qb} (", Option.tiles([(qb, h)]), ")"))
    elif not diag.root_cause and unit is not None:
        names = [s.name for s in stages]
        before = names[names.index(st.name) - 1] if names.index(st.name) else None
        untapped = [s.name for s in stages[:names.index(st.name)] if s.teacher_forced.status is Status.NOT_RUN]
        if before is not None:
            kb = unit.k_block if before in ATTENTION_KV_STAGES else None
            missing.append(Advice.of(f"a tap of {before} at {_site_words(spec, unit.tile, kb, unit.partial)}"
                                     + (f" ({', '.join(untapped)} not teacher-forced)" if untapped else "")))
    if stand_ins:
        missing.append(Advice.of("the kernel's own " + "; ".join(
            f"{s} at {_site_words(spec, t, kb, unit.partial)}" for s, t, kb in stand_ins) +
            " (a reference value stood in for each: trace those stages and sites)"))
    kind = evidence_kind(diag, inputs_controlled=controlled, confounds=confounds, stand_ins=stand_ins)
    if unit is None:
        return FirstDivergence(st.name, None, None, None, None, None, None, None, kind, which,
                               missing=tuple(missing) if kind is Kind.DRAFT else ()), kind
    el = unit.first_bad[0] if unit.first_bad else None
    origin = _origin(spec, st.name, unit)
    hint = _hint(rec, judge, st.name, unit, el) if el is not None else None
    return FirstDivergence(st.name, tuple(unit.tile), unit.k_block, None if el is None else (el.row, el.col),
                           None if el is None else (el.row - origin[0], el.col - origin[1]),
                           None if el is None else el.received, None if el is None else el.expected,
                           None if el is None else el.bound, kind, which, hint=hint, fed_by=unit.fed_by,
                           stand_ins=tuple(stand_ins), untraced=tuple(diag.untraced),
                           unwritten=bool(el.unwritten) if el else False,
                           missing=tuple(missing) if kind is Kind.DRAFT else (), partial=unit.partial), kind


def _origin(spec, stage: str, unit) -> tuple[int, int]:
    qb, kb = unit.tile[1], unit.k_block
    if stage in ("load_k", "load_v"):
        return (kb * spec.block_kv, 0)
    if stage in ("s", "mask", "p"):
        return (qb * spec.block_q, kb * spec.block_kv)
    return (qb * spec.block_q, 0)


def _hint(rec, judge, stage: str, unit, el) -> Optional[str]:
    spec = rec.spec
    b, h, qb = spec.unit_of(unit.tile)
    words = describe_element(spec, stage, (el.row, el.col))
    if stage in ("load_k", "load_v") and judge is not None:
        return _row_hint(rec, judge, stage, (b, h, qb, unit.k_block, unit.partial or 0), el)
    if stage == "mask" and judge is not None:
        if el.expected == float("-inf") and el.received != float("-inf"):
            return (f"{words}: the kernel let through a key the mask hides (causal {spec.causal}"
                    f"{', window ' + str(spec.window) if spec.window else ''}, seqlen_k {judge.geo.lk[b]})")
        if el.received == float("-inf") and el.expected != float("-inf"):
            return f"{words}: the kernel masked a key the query may see"
    if stage in ("normalize", "combine", "store") and el.received != el.received and el.expected == 0.0:
        return f"{words}: NaN where a row that sees no key must give O = 0 (divided by l = 0?)"
    return None


def _row_hint(rec, judge, stage: str, key, el) -> str:
    """Which row of K or V (any batch, KV head, key) the kernel loaded instead, if any."""
    spec, g = rec.spec, judge.geo
    which = stage[-1]
    tap = judge.tap(stage, key)
    r = el.row - key[3] * spec.block_kv
    row = tap[r]
    if bool(torch.isnan(row.float()).any()):
        past = el.row >= g.lk[key[0]]
        return (f"key {el.row} of the tile holds NaN" +
                (f": it lies past seqlen_k = {g.lk[key[0]]}, where the tile must be zero (the tail was not "
                 f"cleared)" if past else ""))
    src = g.k_tok if which == "k" else g.v_tok
    hits = (src == row[None, None, :]).all(-1).nonzero().tolist() if bool(row.ne(0).any()) else []
    want = f"key {el.row}, KV head {key[1] // spec.group}"
    if not hits:
        return f"the loaded row of {want} matches no row of {which.upper()} in global memory"
    tok, hk = hits[0]
    where = _token_words(rec, g, tok)
    return f"the loaded row of {want} is {which.upper()}'s {where}, KV head {hk}"


def _token_words(rec, g, tok: int) -> str:
    """A token row of K / V's [tokens, heads, dim] view as (batch, key) words."""
    tab = g.key_tab.cpu()
    for b in range(rec.spec.batch):
        j = (tab[b, :g.lk[b]] == tok).nonzero()
        if j.numel():
            return f"batch {b} key {int(j[0])}"
    return f"token row {tok} (no sequence's key)"

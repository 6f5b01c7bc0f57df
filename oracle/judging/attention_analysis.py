"""The differential of an attention recording: the stage table of the attention chain, judged on
what was observed, as the same Analysis a GEMM gets (so the report renders it unchanged).

Stages, in order: load_q, load_k, load_v, s, mask, softmax_state, p, o, normalize, combine,
store. An output-only recording (oracle.check_attention) has no taps, so every stage but `store`
is NOT_RUN and `store` is judged chained: the kernel's O and LSE against the reference forward
(kernels_ref.attention.forward, on the reference device) with the bound of
oracle.judging.attention_tolerance, per unit (batch * heads_q + head, query block). The store's
element space is one sequence's [query, head_dim_v + 1]: columns 0..head_dim_v - 1 are O, column
head_dim_v is LSE. Padding rows (past a sequence's length) are not compared. The reference is
cross-checked on a few (batch, head) pairs against the float64 specification
(attention_forward_host) with the reference's own share of the bound: a disagreement makes the run
ORACLE_UNTRUSTED.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels_ref.attention.forward import attention_forward, attention_forward_host
from kernels_ref.attention.geometry import AttnParams, layout
from oracle import knobs
from oracle.judging.attention_tolerance import STATS_MARGIN, U, output_bound, row_terms
from oracle.judging.compare import NOT_RUN, Comparison, combine, compare_units
from oracle.judging.diagnose import Kind, Verdict, evidence_kind, first_divergence
from oracle.judging.differential.analysis import Analysis, reference_device
from oracle.judging.differential.context import StageResult
from oracle.judging.differential.findings import FirstDivergence, first_nonfinite
from oracle.judging.evidence import Evidence, Feed

STAGES = ("load_q", "load_k", "load_v", "s", "mask", "softmax_state", "p", "o", "normalize", "combine", "store")


def params_of(spec) -> AttnParams:
    """The reference's parameters for a problem."""
    return AttnParams(scale=spec.softmax_scale, softcap=spec.softcap, causal=spec.causal,
                      window=spec.window or (-1, -1), block_q=spec.block_q, block_kv=spec.block_kv,
                      p_dtype=spec.v_dtype, p_scale=spec.p_scale or 1.0, descale_q=spec.descale_q or 1.0,
                      descale_k=spec.descale_k or 1.0, descale_v=spec.descale_v or 1.0, splits=spec.splits)


def _rows(x: torch.Tensor, spec, lay, varlen: bool, lse: bool = False) -> torch.Tensor:
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


def _store(rec, o_ref, lse_ref, stats, dev) -> tuple[Comparison, torch.Tensor]:
    spec = rec.spec
    lay = layout(rec.q, rec.k, cu_seqlens_q=rec.cu_seqlens_q, cu_seqlens_k=rec.cu_seqlens_k,
                 page_table=rec.page_table)
    v_abs = float(rec.v.detach().float().abs().amax()) if rec.v.numel() else 0.0
    b, hq, maxq = stats.rows_shape
    e_o = _rows(o_ref, spec, lay, spec.varlen_q)
    e_l = _rows(lse_ref, spec, lay, spec.varlen_q, True)
    b_o, b_l = output_bound(spec, stats, e_o.reshape(-1, spec.head_dim_v), e_l.reshape(-1), v_abs)
    if spec.empty_lse == "+inf":
        e_l = torch.where(e_l == float("-inf"), torch.full_like(e_l, float("inf")), e_l)
    received_o = _rows(rec.output.to(dev), spec, lay, spec.varlen_q)
    if rec.lse is not None:
        received_l = _rows(rec.lse.to(dev).float(), spec, lay, spec.varlen_q, True)
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
    cmp = combine([p for p in parts if p.tiles]) if any(p.tiles for p in parts) else NOT_RUN
    return cmp.labelled(Evidence.of(Feed.REFERENCE)), bound


def _cross_check(rec, o_ref, lse_ref, stats, dev) -> list[str]:
    """The Triton reference against the float64 specification on a few (batch, head) pairs."""
    spec = rec.spec
    n = max(1, knobs.CROSS_CHECK_TILES.get())
    pairs = sorted({(0, 0), (spec.batch - 1, spec.heads_q - 1)})[:n]
    params = params_of(spec)
    o_h, l_h = attention_forward_host(rec.q, rec.k, rec.v, params, cu_seqlens_q=rec.cu_seqlens_q,
                                      cu_seqlens_k=rec.cu_seqlens_k, page_table=rec.page_table, heads=pairs)
    lay = layout(rec.q, rec.k, cu_seqlens_q=rec.cu_seqlens_q, cu_seqlens_k=rec.cu_seqlens_k,
                 page_table=rec.page_table)
    v_abs = float(rec.v.detach().float().abs().amax()) if rec.v.numel() else 0.0
    terms = row_terms(spec, stats, v_abs)
    e_o = _rows(o_ref.cpu(), spec, lay, spec.varlen_q)
    e_l = _rows(lse_ref.cpu(), spec, lay, spec.varlen_q, True)
    h_o = _rows(o_h, spec, lay, spec.varlen_q)
    h_l = _rows(l_h, spec, lay, spec.varlen_q, True)
    b, hq, maxq = stats.rows_shape
    a = stats.av.double().cpu().reshape(b, hq, maxq, -1) * STATS_MARGIN
    rel = terms.rel.cpu().reshape(b, hq, maxq, 1)
    absolute = terms.absolute.cpu().reshape(b, hq, maxq, 1)
    bound_o = rel * a + absolute
    bound_l = terms.lse.cpu().reshape(b, hq, maxq) + 4 * U * h_l[..., 0].abs().nan_to_num(0, 0, 0)
    out = []
    for bb, h in pairs:
        n_q = int(lay.lq[bb])
        do = (e_o[bb, h, :n_q] - h_o[bb, h, :n_q]).abs()
        bad = ~(do <= bound_o[bb, h, :n_q])
        ll, lh = e_l[bb, h, :n_q, 0], h_l[bb, h, :n_q, 0]
        both_inf = torch.isinf(ll) & torch.isinf(lh) & (torch.sign(ll) == torch.sign(lh))
        bad_l = ~(both_inf | ((ll - lh).abs() <= bound_l[bb, h, :n_q]))
        if bool(bad.any()) or bool(bad_l.any()):
            i = int((bad.any(-1) | bad_l).nonzero()[0, 0])
            out.append(f"attention_forward disagrees with attention_forward_host at batch {bb}, head {h}, query {i}: "
                       f"O {e_o[bb, h, i, :4].tolist()} vs {h_o[bb, h, i, :4].tolist()}, LSE {float(ll[i])} vs "
                       f"{float(lh[i])}")
    return out


def analyze_attention(rec, device: Optional[torch.device] = None) -> Analysis:
    """The attention differential on an AttentionRecording (module docstring)."""
    rec.validate()
    spec = rec.spec
    dev = device or reference_device()
    stages = [StageResult(name, NOT_RUN, NOT_RUN) for name in STAGES[:-1]]
    if rec.output is None:
        diag = first_divergence([], kernel_error=True)
        return Analysis(rec, tuple(stages + [StageResult("store", NOT_RUN, NOT_RUN)]), (), diag, Kind.DRAFT, (), (),
                        None, None, str(dev))
    params = params_of(spec)
    q, k, v = (t.detach().to(dev) for t in (rec.q, rec.k, rec.v))
    cu_q = None if rec.cu_seqlens_q is None else rec.cu_seqlens_q.to(dev)
    cu_k = None if rec.cu_seqlens_k is None else rec.cu_seqlens_k.to(dev)
    pt = None if rec.page_table is None else rec.page_table.to(dev)
    o_ref, lse_ref, stats = attention_forward(q, k, v, params, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, page_table=pt,
                                              with_stats=True)
    store, _ = _store(rec, o_ref, lse_ref, stats, dev)
    stages.append(StageResult("store", NOT_RUN, store))
    cross = tuple(_cross_check(rec, o_ref, lse_ref, stats, dev))
    diag = first_divergence([s.outcome for s in stages], kernel_error=rec.kernel_error is not None,
                            references_trusted=not cross, traced_tiles=None)
    controlled = rec.provenance.controlled
    open_conf = list(rec.confounds)
    if not controlled:
        open_conf.append(f"inputs are not controlled ({rec.provenance.describe()}): a localisation on them is a "
                         f"draft until reproduced on a controlled input")
    kind = evidence_kind(diag, inputs_controlled=controlled, confounds=open_conf)
    first = None
    if diag.verdict is Verdict.DIVERGED:
        first = _finding(spec, store, diag, kind, controlled, open_conf)
    unobserved = (f"not observed: {', '.join(STAGES[:-1])} (no tap: the trace protocol has no attention taps yet, "
                  f"so only the output was judged)",)
    return Analysis(rec, tuple(stages), cross, diag, kind, tuple(open_conf), (), first, first_nonfinite(stages),
                    str(dev), unobserved)


def _finding(spec, store: Comparison, diag, kind, controlled: bool, confounds) -> FirstDivergence:
    unit = store.first_bad_tile
    el = unit.first_bad[0] if unit is not None and unit.first_bad else None
    missing = []
    if not controlled:
        missing.append("controlled inputs (oracle.run.attention_inputs: ones, one_hot, index, large_logits, "
                       "masked_row, random)")
    if confounds:
        missing.append("no open confound")
    missing.append("taps of the attention stages inside the kernel (not in the trace protocol yet): the output "
                   "alone cannot say which stage went wrong")
    b, h, qb = spec.unit_of(unit.tile)
    hint = None
    if el is not None:
        what = "LSE" if el.col == spec.head_dim_v else f"O dim {el.col}"
        hint = f"batch {b}, query head {h} (KV head {h // spec.group}), query {el.row}: {what}"
    return FirstDivergence("store", tuple(unit.tile), None, None if el is None else (el.row, el.col),
                           None if el is None else (el.row - qb * spec.block_q, el.col),
                           None if el is None else el.received, None if el is None else el.expected,
                           None if el is None else el.bound, kind, "chained", hint=hint, fed_by=Feed.REFERENCE.value,
                           untraced=tuple(diag.untraced), unwritten=bool(el.unwritten) if el else False,
                           missing=tuple(missing) if kind is Kind.DRAFT else ())

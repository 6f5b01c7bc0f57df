"""Each Triton attention stage against its float64 host spec on small tiles, within the stage's
bound from oracle.judging.attention_tolerance (or bit for bit where nothing rounds), and the fused
forward against the exact attention on GQA, both causal alignments, a window, softcap, varlen,
paged KV, split-KV, fully masked rows and seqlen_k not a multiple of block_kv."""

import math

import pytest
import torch

from kernels_ref.attention import combine, forward, mask, normalize, o, p, scores, softmax_state
from kernels_ref.attention.geometry import AttnParams, allowed_host
from oracle.judging.attention_tolerance import TABLE, U, lookup, output_bound, row_terms
from oracle.judging.hardware_numerics import ToleranceError
from oracle.problem.attention import AttentionSpec

G = torch.Generator().manual_seed(7)


def rnd(*shape, dtype=torch.bfloat16, s=1.0):
    return (torch.randn(*shape, generator=G) * s).to(dtype)


def within(got, want, bound):
    got, want = got.double(), want.double()
    both = (torch.isinf(got) & torch.isinf(want) & (got.sign() == want.sign())) | (torch.isnan(got) & torch.isnan(want))
    ok = both | ((got - want).abs() <= bound)
    assert bool(ok.all()), f"worst {((got - want).abs() - bound)[~ok].max()} over the bound"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_scores_against_host(dtype):
    q, k = rnd(3, 5, 24, dtype=dtype), rnd(3, 19, 24, dtype=dtype)
    s, a = scores.scores(q, k, descale=0.5, with_abs=True)
    host = scores.scores_host(q, k, descale=0.5)
    within(s, host, lookup("s", "bf16").bound(a.double(), 24))
    assert scores.check_supported(q, k.float()) != []


def test_mask_causal_both_alignments_window_softcap():
    s = torch.randn(4, 6, 20, generator=G) * 30
    coords = torch.tensor([[0, 0, 6, 20], [0, 16, 6, 20], [2, 4, 9, 7], [0, 0, 0, 5]])
    for causal in ("none", "top_left", "bottom_right"):
        for window, cap in (((-1, -1), 0.0), ((3, 1), 0.0), ((-1, -1), 20.0)):
            prm = AttnParams(scale=0.3, causal=causal, window=window, softcap=cap)
            got, want = mask.mask(s, coords, prm), mask.mask_host(s, coords, prm)
            assert torch.equal(torch.isinf(got), torch.isinf(want.float())), (causal, window)
            within(got, want, lookup("mask", "bf16").bound(want.abs().nan_to_num(0, 0, 0), cap))
    # bottom-right: query i sees j <= i + lk - lq; top-left: j <= i
    br = allowed_host(torch.arange(3), torch.arange(5), 3, 5, AttnParams(scale=1.0, causal="bottom_right"))
    tl = allowed_host(torch.arange(3), torch.arange(5), 3, 5, AttnParams(scale=1.0, causal="top_left"))
    assert br.sum(1).tolist() == [3, 4, 5] and tl.sum(1).tolist() == [1, 2, 3]


def test_softmax_state_p_o_normalize_against_host():
    x = torch.randn(2, 5, 18, generator=G) * 4
    x[0, 1] = float("-inf")  # a row that has seen nothing yet
    m0 = torch.randn(2, 5, generator=G)
    m0[0, 1] = float("-inf")
    l0 = torch.rand(2, 5, generator=G)
    l0[0, 1] = 0.0
    m, alpha, l = softmax_state.softmax_state(x, m0, l0)
    hm, ha, hl = softmax_state.softmax_state_host(x, m0, l0)
    assert torch.equal(m.double(), hm)
    within(alpha, ha, lookup("softmax_state.alpha", "bf16").bound(ha, (m0.double() - hm).abs().nan_to_num(0, 0, 0)))
    within(l, hl, lookup("softmax_state.l", "bf16").bound(hl, x.abs().nan_to_num(0, 0, 0).amax(), 18, 1))
    assert float(l[0, 1]) == 0.0 and float(alpha[0, 1]) == 0.0
    for pd, ps in (("bf16", 1.0), ("fp16", 1.0), ("e4m3", 16.0)):
        pt, ph = p.p_tile(x, m, pd, ps), p.p_tile_host(x, m, pd, ps)
        exact = torch.exp(x.double() - torch.where(torch.isinf(hm), 0, hm)[..., None])
        xm = (x.double() - hm[..., None]).abs().nan_to_num(0, 0, 0)
        b = lookup("p", pd).bound(exact, xm, ps) * ps
        within(pt.double(), ph.double(), 2 * b)
    v = rnd(2, 18, 12)
    pb = p.p_tile(x, m, "bf16")
    acc0 = torch.randn(2, 5, 12, generator=G)
    acc = o.o_step(acc0, alpha, pb, v)
    host = o.o_step_host(acc0, alpha, pb, v)
    pv = torch.einsum("urc,ucd->urd", pb.double().abs(), v.double().abs())
    within(acc, host, lookup("o", "bf16").bound(alpha.double()[..., None] * acc0.double().abs(), pv, 18))
    on, ln = normalize.normalize(acc, m, l, 0.5)
    hon, hln = normalize.normalize_host(acc, m, l, 0.5)
    within(on, hon, lookup("normalize.o", "bf16").bound(hon.abs()))
    within(ln, hln, lookup("normalize.lse", "bf16").bound(hln.abs().nan_to_num(0, 0, 0), hm.abs().nan_to_num(0, 0, 0)))
    assert bool((on[0, 1] == 0).all()) and float(ln[0, 1]) == float("-inf")  # l = 0: O = 0, LSE = -inf


def test_combine_against_host_and_an_empty_split():
    o_parts = torch.randn(3, 7, 10, generator=G)
    lse = torch.randn(3, 7, generator=G) * 3
    lse[1, 2] = float("-inf")
    lse[:, 4] = float("-inf")  # no split saw row 4
    got, gl = combine.combine(o_parts, lse)
    want, wl = combine.combine_host(o_parts, lse)
    a = (o_parts.double().abs()).amax(0)
    within(got, want, lookup("combine", "bf16").bound(a, wl.abs().nan_to_num(0, 0, 0)[:, None], 3) + 4 * U * a)
    within(gl, wl, 8 * U * (wl.abs().nan_to_num(0, 0, 0) + 1))
    assert bool((got[4] == 0).all()) and float(gl[4]) == float("-inf")


def test_the_table_refuses_a_missing_key():
    with pytest.raises(ToleranceError, match="fp32"):
        lookup("s", "fp32")
    assert ("output", "e4m3") in TABLE


CASES = {
    "gqa_causal_br": dict(b=2, lq=9, lk=21, hq=4, hk=2, causal="bottom_right"),
    "mqa_top_left_splits": dict(b=1, lq=21, lk=21, hq=3, hk=1, causal="top_left", splits=2),
    "window_softcap": dict(b=1, lq=12, lk=30, hq=2, hk=2, window=(5, 2), softcap=8.0),
    "masked_rows": dict(b=1, lq=20, lk=6, hq=2, hk=1, causal="bottom_right"),
    "varlen": dict(b=3, lq=None, lk=None, hq=2, hk=1, seqlens_q=(5, 0, 17), seqlens_k=(9, 3, 20), causal="bottom_right"),
    "paged_splits": dict(b=2, lq=4, lk=None, hq=4, hk=2, page_size=8, seqlens_k=(19, 11), splits=3),
    "fp16_dv": dict(b=1, lq=7, lk=33, hq=2, hk=2, dtype=torch.float16, dv=8),
}


def _case(c):
    d, dv, dtype = 16, c.get("dv", 16), c.get("dtype", torch.bfloat16)
    hq, hk, b = c["hq"], c["hk"], c["b"]
    kw, spec_kw = {}, {}
    if "seqlens_q" in c:
        lq = c["seqlens_q"]
        q = rnd(sum(lq), hq, d, dtype=dtype)
        kw["cu_seqlens_q"] = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32)
        spec_kw.update(seqlens_q=lq, seqlen_q=max(lq))
    else:
        q = rnd(b, c["lq"], hq, d, dtype=dtype)
        spec_kw["seqlen_q"] = c["lq"]
    if "page_size" in c:
        ps, lk = c["page_size"], c["seqlens_k"]
        mp = max(-(-n // ps) for n in lk) + 1
        pages = b * mp + 2
        k, v = rnd(pages, ps, hk, d, dtype=dtype), rnd(pages, ps, hk, dv, dtype=dtype)
        perm = torch.randperm(pages, generator=G)
        kw["page_table"] = perm[:b * mp].reshape(b, mp).to(torch.int32)
        kw["seqlens_k"] = torch.tensor(lk)
        spec_kw.update(seqlens_k=lk, seqlen_k=max(lk), page_size=ps, num_pages=pages, max_pages=mp)
    elif "seqlens_k" in c:
        lk = c["seqlens_k"]
        k, v = rnd(sum(lk), hk, d, dtype=dtype), rnd(sum(lk), hk, dv, dtype=dtype)
        kw["cu_seqlens_k"] = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int32)
        spec_kw.update(seqlens_k=lk, seqlen_k=max(lk))
    else:
        k, v = rnd(b, c["lk"], hk, d, dtype=dtype), rnd(b, c["lk"], hk, dv, dtype=dtype)
        spec_kw["seqlen_k"] = c["lk"]
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    spec = AttentionSpec(batch=b, heads_q=hq, heads_kv=hk, head_dim=d, head_dim_v=dv, causal=c.get("causal", "none"),
                         window=c.get("window"), softcap=c.get("softcap", 0.0), q_dtype=name, k_dtype=name, v_dtype=name,
                         block_q=8, block_kv=8, splits=c.get("splits", 1), **spec_kw)
    prm = AttnParams(scale=spec.softmax_scale, softcap=spec.softcap, causal=spec.causal, window=spec.window or (-1, -1),
                     block_q=8, block_kv=8, p_dtype=name, splits=spec.splits)
    return spec, prm, q, k, v, kw


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_against_exact_attention(name):
    spec, prm, q, k, v, kw = _case(CASES[name])
    o_, lse, st = forward.attention_forward(q, k, v, prm, with_stats=True, **kw)
    oh, lh = forward.attention_forward_host(q, k, v, prm, **kw)
    kw.pop("seqlens_k", None)
    assert o_.shape == oh.shape and lse.shape == lh.shape
    # the reference's own share of the output model (one side of oracle.judging.attention_tolerance)
    t = row_terms(spec, st, float(v.float().abs().max()))
    b, hq, maxq = st.rows_shape
    dv = v.shape[-1]
    rows = forward._to_layout((t.rel[:, None] * st.av.double() * 1.01 + t.absolute[:, None]).reshape(b, hq, maxq, dv)
                              .expand(b, hq, maxq, dv), forward.layout(q, k, **kw), "cu_seqlens_q" in kw)
    within(o_, oh, rows)
    within(lse, lh, forward._lse_layout(t.lse.reshape(b, hq, maxq), forward.layout(q, k, **kw), "cu_seqlens_q" in kw)
           + 8 * U * lh.abs().nan_to_num(0, 0, 0))
    if name == "masked_rows":  # rows i < lq - lk see no key
        assert bool((o_[:, :14] == 0).all()) and bool(torch.isinf(lse[:, :, :14]).all())
    if name == "gqa_causal_br":  # bottom-right: the last query sees every key
        assert int(st.keys.reshape(b, hq, maxq)[0, 0, 8]) == 21


def test_forward_gqa_head_map():
    """Query heads 2h and 2h + 1 read KV head h: making KV head 1 differ changes query heads 2, 3 only."""
    spec, prm, q, k, v, kw = _case(dict(b=1, lq=4, lk=8, hq=4, hk=2))
    q = q[:, :, :1].expand(-1, -1, 4, -1).contiguous()  # every query head asks the same
    o1, _ = forward.attention_forward(q, k, v, prm)
    v2 = v.clone()
    v2[:, :, 1] += 1
    o2, _ = forward.attention_forward(q, k, v2, prm)
    changed = (o1 != o2).flatten(0, 1).any(0).any(-1).tolist()
    assert changed == [False, False, True, True]


def test_p_s_bound_holds_a_weight_that_exp2_flushed_to_zero():
    """ex2.approx.ftz.f32 returns 0 below fp32's normal range (measured on the H100 by
    benchmarks/measure_attention_numerics.py, docs/benchmarks.md); a bf16 P can hold 2^-130, so a correct kernel's 0 there must
    be within the p stage's bound, and an error of a normal-sized weight must not be."""
    from oracle.judging.attention_tolerance import EXP_FLUSH

    exact = torch.tensor([2.0**-130, 2.0**-127, 0.25], dtype=torch.float64)
    xm = torch.tensor([90.0, 88.5, 1.0], dtype=torch.float64)
    b = lookup("p", "bf16").bound(exact, xm, 1.0)
    kernel = torch.tensor([0.0, 0.0, 0.25 * (1 + 2.0**-6)], dtype=torch.float64)  # flushed, flushed, off by 2^-6
    assert ((kernel - exact).abs() <= b).tolist() == [True, True, False]
    assert EXP_FLUSH.value == 2.0**-126

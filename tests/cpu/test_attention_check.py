"""oracle.check_attention through the one path: MATCH on torch SDPA's (CPU math backend) outputs
for GQA, both causal alignments, windows, softcap, varlen and fully masked rows; planted output
defects DIVERGED at `store` naming the unit and element; the JSON validates against the schema."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import oracle
from kernels_ref.attention.geometry import AttnParams, allowed_host
from oracle.report.table import validate

G = torch.Generator().manual_seed(11)


def sdpa(q, k, v, *, causal="none", window=(-1, -1), softcap=0.0, lq=None, lk=None, bad=None):
    """O and LSE in FlashAttention's layout from SDPA's math backend, per sequence (lists of
    [L, H, D] tensors), with an explicit mask (softcap through a float mask of the capped scores).
    `bad` plants a defect: "offbyone" (causal sees one key past the diagonal), "droptail" (the
    last 8 keys dropped), "gqa_mod" (query head h reads KV head h % heads_kv)."""
    outs, lses = [], []
    for qs, ks, vs in zip(q, k, v):
        n_q, n_k, hq, hk = qs.shape[0], ks.shape[0], qs.shape[1], ks.shape[1]
        prm = AttnParams(scale=qs.shape[-1] ** -0.5, causal=causal, window=window)
        keep = allowed_host(torch.arange(n_q), torch.arange(n_k), n_q, n_k, prm)
        if bad == "offbyone":  # row i also sees key i + 1 (top-left alignment)
            keep = keep | allowed_host(torch.arange(n_q) + 1, torch.arange(n_k), n_q + 1, n_k, prm)
        if bad == "droptail":
            keep = keep & (torch.arange(n_k) < n_k - 8)[None, :]
        kk, vv = ks.transpose(0, 1), vs.transpose(0, 1)
        if bad == "gqa_mod":
            idx = torch.arange(hq) % hk
        else:
            idx = torch.arange(hq) // (hq // hk)
        kk, vv = kk[idx], vv[idx]
        qq = qs.transpose(0, 1)
        x = (qq.float() @ kk.float().transpose(-1, -2)) * prm.scale
        if softcap:
            x = softcap * torch.tanh(x / softcap)
        x = torch.where(keep, x, float("-inf"))
        lse = torch.logsumexp(x, dim=-1)
        with sdpa_kernel(SDPBackend.MATH):
            if softcap:  # SDPA has no cap: feed the capped scores as a bias on zero scores
                o = F.scaled_dot_product_attention(torch.zeros_like(qq), kk, vv, attn_mask=x.to(qq.dtype), scale=1.0)
            else:
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=keep)
        outs.append(o.transpose(0, 1))
        lses.append(lse.float())
    return outs, lses


def dense_case(b=1, lq=24, lk=40, hq=4, hk=2, d=16, dtype=torch.bfloat16, **kw):
    q = [torch.randn(lq, hq, d, generator=G).to(dtype) for _ in range(b)]
    k = [torch.randn(lk, hk, d, generator=G).to(dtype) for _ in range(b)]
    v = [torch.randn(lk, hk, d, generator=G).to(dtype) for _ in range(b)]
    return q, k, v


def check_dense(q, k, v, o, lse, **kw):
    return oracle.check_attention(torch.stack(q), torch.stack(k), torch.stack(v), torch.stack(o), torch.stack(lse),
                                  block_q=16, block_kv=16, **kw)


CONFIGS = {
    "mha": dict(hq=2, hk=2),
    "gqa_top_left": dict(causal="top_left"),
    "mqa_bottom_right": dict(hk=1, causal="bottom_right", lq=12, lk=40),
    "window": dict(window=(7, 3)),
    "softcap": dict(softcap=5.0),
    "fully_masked": dict(causal="bottom_right", lq=30, lk=10),
    "fp16": dict(dtype=torch.float16, causal="bottom_right"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sdpa_outputs_match(name):
    c = dict(CONFIGS[name])
    mask_kw = {x: c.pop(x) for x in ("causal", "window", "softcap") if x in c}
    q, k, v = dense_case(**c)
    o, lse = sdpa(q, k, v, **mask_kw)
    causal = mask_kw.get("causal", "none")
    rep = check_dense(q, k, v, o, lse, causal=causal, window=mask_kw.get("window"), softcap=mask_kw.get("softcap", 0.0))
    assert rep.verdict == "MATCH", rep
    assert [s.name for s in rep.stages][-1] == "store"
    assert all(s.chained.status.value == "NOT_RUN" for s in rep.stages[:-1])
    validate(rep.to_json())


def test_varlen_sdpa_outputs_match():
    lq, lk = (5, 0, 19), (9, 4, 33)
    q = [torch.randn(n, 4, 16, generator=G).bfloat16() for n in lq]
    k = [torch.randn(n, 2, 16, generator=G).bfloat16() for n in lk]
    v = [torch.randn(n, 2, 16, generator=G).bfloat16() for n in lk]
    o, lse = sdpa(q, k, v, causal="bottom_right")
    cu = (lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32))
    rep = oracle.check_attention(torch.cat(q), torch.cat(k), torch.cat(v), torch.cat(o), torch.cat(lse, dim=1),
                                 causal=True, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), block_q=16, block_kv=16)
    assert rep.verdict == "MATCH", rep
    assert rep.recording.spec.seqlens_q == lq


def _diverged(rep, want_unit=None):
    assert rep.verdict == "DIVERGED", rep
    f = rep.first_divergence
    assert f.stage == "store" and f.element is not None
    if want_unit is not None:
        assert tuple(f.tile) == want_unit, f
    assert "query head" in str(rep)
    validate(rep.to_json())
    return f


def test_planted_output_defects_are_found_at_store():
    q, k, v = dense_case(causal="top_left")
    o, lse = sdpa(q, k, v, causal="top_left")
    base = dict(causal="top_left")
    # O scaled by 2
    _diverged(check_dense(q, k, v, [x * 2 for x in o], lse, **base))
    # one row's NaN: kept apart from plain mismatches
    o_nan = [x.clone() for x in o]
    o_nan[0][9, 3, :] = float("nan")
    rep = check_dense(q, k, v, o_nan, lse, **base)
    f = _diverged(rep, want_unit=(3, 0))
    assert f.element[0] == 9 and rep.analysis.first_nonfinite is not None
    assert rep.stages[-1].chained.worst.nan_received > 0
    # a causal mask off by one at the diagonal
    o1, l1 = sdpa(q, k, v, causal="top_left", bad="offbyone")
    f = _diverged(check_dense(q, k, v, o1, l1, **base))
    # the last KV tile dropped
    o2, l2 = sdpa(q, k, v, bad="droptail")
    _diverged(check_dense(q, k, v, o2, l2))
    # GQA mapped as h % heads_kv: query head 1 reads KV head 1 instead of 0
    o3, l3 = sdpa(q, k, v, bad="gqa_mod")
    f = _diverged(check_dense(q, k, v, o3, l3), want_unit=(1, 0))


def test_a_fully_masked_row_normalised_by_zero():
    q, k, v = dense_case(lq=20, lk=6)
    o, lse = sdpa(q, k, v, causal="bottom_right")
    assert bool((o[0][:14] == 0).all())
    bad = [x.clone() for x in o]
    bad[0][:14] = float("nan")  # 0 / 0
    rep = check_dense(q, k, v, bad, lse, causal=True)
    f = _diverged(rep)
    assert f.element == (0, 0) and math.isnan(f.received) and f.expected == 0


def test_lse_is_judged_and_empty_lse_declared():
    q, k, v = dense_case(lq=20, lk=6)
    o, lse = sdpa(q, k, v, causal="bottom_right")
    rep = check_dense(q, k, v, o, [x + 0.01 for x in lse], causal=True)
    f = _diverged(rep)
    assert f.element[1] == 16 and "LSE" in str(rep)  # column head_dim_v is LSE
    fa2 = [torch.where(torch.isinf(x), torch.full_like(x, float("inf")), x) for x in lse]
    assert check_dense(q, k, v, o, fa2, causal=True).verdict == "DIVERGED"
    assert check_dense(q, k, v, o, fa2, causal=True, empty_lse="+inf").verdict == "MATCH"


def test_check_attention_refuses_bad_tensors():
    from oracle.problem.spec import SpecError
    from oracle.run.recording import RecordingError

    q, k, v = dense_case()
    o, lse = sdpa(q, k, v)
    with pytest.raises(SpecError, match="heads_kv"):
        oracle.check_attention(torch.stack(q), torch.stack(k)[:, :, :1].expand(-1, -1, 3, -1),
                               torch.stack(v)[:, :, :1].expand(-1, -1, 3, -1), torch.stack(o))
    with pytest.raises(RecordingError, match="o has shape"):
        oracle.check_attention(torch.stack(q), torch.stack(k), torch.stack(v), torch.stack(o)[:, :-1])
    with pytest.raises(SpecError, match="causal"):
        oracle.check_attention(torch.stack(q), torch.stack(k), torch.stack(v), torch.stack(o), causal="diagonal")

"""The FlashAttention-2-style model (oracle.run.attention_model): its output against a float64
reference (torch SDPA's math backend where SDPA expresses the problem), its taps read back from
the sink, and each planted defect first visible at the stage where it is planted, and in the output."""

from __future__ import annotations

import math

import pytest
import torch

from harness.taps import ATTENTION_TAP_STAGES
from oracle.run.attention_model import (
    INJECTION_STAGE, AttentionModelError, Injection, run_attention_model, to_paged)


def _inputs(b, sq, sk, h, hkv, d, dtype=torch.float32, seed=0, dv=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hkv, dv or d, generator=g).to(dtype)
    return q, k, v


def _allowed(sq, sk, causal):
    i, j = torch.arange(sq)[:, None], torch.arange(sk)[None]
    if causal == "top_left":
        return j <= i
    if causal == "bottom_right":
        return j <= i + sk - sq
    return torch.ones(sq, sk, dtype=torch.bool)


def _reference(q, k, v, causal, scale=None, softcap=0.0):
    """O and LSE in float64: SDPA (math backend) without a softcap, the same formula by hand with one."""
    g = q.shape[2] // k.shape[2]
    qd, kd, vd = (x.double().permute(0, 2, 1, 3) for x in (q, k, v))
    kd, vd = kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = qd @ kd.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~_allowed(q.shape[1], k.shape[1], causal), -math.inf)
    lse = torch.logsumexp(s, -1)
    if softcap:
        o = torch.softmax(s, -1) @ vd
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=_allowed(q.shape[1], k.shape[1], causal), scale=scale)
    return o.permute(0, 2, 1, 3), lse


@pytest.mark.parametrize("causal,splits,hkv", [("none", 1, 4), ("top_left", 3, 2), ("bottom_right", 2, 1),
                                               ("bottom_right", 1, 2)])
def test_the_model_matches_sdpa_in_float64(causal, splits, hkv):
    q, k, v = _inputs(2, 37, 45, 4, hkv, 16, dv=8)
    run = run_attention_model(q, k, v, causal=causal, block_q=16, block_kv=16, splits=splits, sites=[(0, 1)])
    o, lse = _reference(q, k, v, causal)
    assert run.out.dtype == torch.float32 and run.out.shape == (2, 37, 4, 8) and run.lse.shape == (2, 4, 37)
    assert torch.allclose(run.out.double(), o, rtol=0, atol=2e-6), (run.out.double() - o).abs().max()
    assert torch.allclose(run.lse.double(), lse, rtol=0, atol=2e-6)


def test_softcap_scale_and_a_paged_cache():
    q, k, v = _inputs(1, 20, 50, 2, 2, 16, seed=3)
    o, lse = _reference(q, k, v, "none", scale=0.3, softcap=2.0)
    run = run_attention_model(q, k, v, softmax_scale=0.3, softcap=2.0, block_q=16, block_kv=16, sites=[])
    assert torch.allclose(run.out.double(), o, atol=2e-6) and torch.allclose(run.lse.double(), lse, atol=2e-6)
    paged = to_paged(k, v, 8, seed=1)
    assert not torch.equal(paged.page_table.flatten(), torch.arange(paged.page_table.numel(), dtype=torch.int32))
    run = run_attention_model(q, None, None, paged=paged, softmax_scale=0.3, softcap=2.0, block_q=16, block_kv=16)
    assert torch.allclose(run.out.double(), o, atol=2e-6)


def test_bf16_rounds_p_to_the_v_dtype():
    q, k, v = _inputs(1, 32, 32, 2, 2, 16, dtype=torch.bfloat16, seed=4)
    run = run_attention_model(q, k, v, block_q=16, block_kv=16)
    o, _ = _reference(q, k, v, "none")
    assert run.out.dtype == torch.bfloat16 and torch.allclose(run.out.double(), o, atol=3e-2)
    p = run.trace.of_stage("p")
    assert p and all(t.values.dtype == torch.bfloat16 for t in p)


def test_the_taps_are_the_model_s_own_values():
    q, k, v = _inputs(2, 40, 40, 2, 1, 16, seed=5)
    run = run_attention_model(q, k, v, causal="top_left", block_q=16, block_kv=16, splits=2, sites=[(1, -1)],
                              kv_blocks=[0, 1])
    stages = {t.stage for t in run.trace.taps}
    assert stages == set(ATTENTION_TAP_STAGES) and run.trace.complete
    assert {t.tile for t in run.trace.taps} == {(1, 0), (1, 1)} and {t.group for t in run.trace.taps} == {0, 1}
    assert all(t.k_block in (0, 1) for t in run.trace.taps if t.k_block is not None)
    comb = next(t for t in run.trace.of_stage("combine") if t.tile == (1, 1) and t.group == 1)
    assert comb.partial is None and comb.k_block is None
    assert torch.equal(comb.values[:, :16], run.out[1, 16:32, 1]) and torch.equal(comb.values[:, 16], run.lse[1, 1, 16:32])
    state = next(t for t in run.trace.of_stage("softmax_state") if t.k_block == 1 and t.partial == 0)
    assert state.values.shape == (16, 3) and (state.values[:, 2] > 0).all()
    assert {t.partial for t in run.trace.of_stage("normalize")} == {0, 1}
    qt = next(t for t in run.trace.of_stage("load_q") if t.tile == (1, 0) and t.group == 0 and t.partial == 0)
    assert torch.equal(qt.values, q[0, 16:32, 0])


def test_a_small_sink_drops_records_as_the_device_does():
    q, k, v = _inputs(1, 16, 16, 1, 1, 8)
    run = run_attention_model(q, k, v, block_q=16, block_kv=16, capacity=4096)
    assert run.trace.dropped > 0 and not run.trace.complete and dict(run.trace.dropped_by_stage)


def _nan_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _first_divergent_stage(good, bad):
    taps = {(t.stage, t.tile, t.k_block, t.partial, t.group): t for t in bad.trace.taps}
    for stage in ATTENTION_TAP_STAGES:
        for t in good.trace.of_stage(stage):
            other = taps.get((t.stage, t.tile, t.k_block, t.partial, t.group))
            if other is None or not _nan_equal(t.values, other.values):
                return stage
    return None


@pytest.fixture(scope="module")
def clean():
    """bf16, GQA 4:2, bottom-right causal with seqlen_q > seqlen_k (fully masked rows), a K/V tail,
    two splits, a paged cache of shuffled pages."""
    q, k, v = _inputs(1, 60, 50, 4, 2, 16, dtype=torch.bfloat16, seed=7)
    paged = to_paged(k, v, 16, seed=2)
    kw = dict(causal="bottom_right", block_q=16, block_kv=16, splits=2, paged=paged)
    return q, kw, run_attention_model(q, None, None, **kw)


@pytest.mark.parametrize("injection", list(Injection))
def test_each_defect_shows_first_at_its_stage_and_in_the_output(clean, injection):
    q, kw, good = clean
    bad = run_attention_model(q, None, None, injection=injection, **kw)
    assert _first_divergent_stage(good, bad) == INJECTION_STAGE[injection]
    assert not _nan_equal(good.out, bad.out)


def test_the_clean_run_has_no_nan_and_empty_rows_are_zero(clean):
    _, _, good = clean
    assert not good.out.isnan().any() and (good.out[0, :10] == 0).all() and torch.isinf(good.lse[0, :, :10]).all()


def test_bad_arguments_are_named():
    q, k, v = _inputs(1, 8, 8, 3, 2, 8)
    with pytest.raises(AttentionModelError, match="heads_kv 2 must divide heads 3"):
        run_attention_model(q, k, v)
    q, k, v = _inputs(1, 8, 8, 2, 2, 8)
    with pytest.raises(AttentionModelError, match="causal 'diagonal'"):
        run_attention_model(q, k, v, causal="diagonal")
    with pytest.raises(AttentionModelError, match="needs a paged KV cache"):
        run_attention_model(q, k, v, injection=Injection.PAGE_TABLE_OFF_BY_ONE)
    with pytest.raises(AttentionModelError, match="needs an fp16 or bf16 V"):
        run_attention_model(q, k, v, injection=Injection.P_WRONG_TYPE)
    with pytest.raises(AttentionModelError, match="block_q 0"):
        run_attention_model(q, k, v, block_q=0)

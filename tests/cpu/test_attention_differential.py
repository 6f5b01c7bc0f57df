"""The attention differential stage by stage on the FlashAttention-2-style model
(oracle.run.attention_model): a correct kernel MATCHes at every stage (MHA, GQA, both causal
alignments, softcap, splits 1 and 3, a paged cache, seqlen_k not a multiple of the KV block, fp16),
each planted defect is named at its INJECTION_STAGE as a teacher-forced VERDICT on controlled
inputs (every stage before it MATCH) with the KV block, split and element it shows at, a missing
upstream tap makes a DRAFT that names it, and the JSON report validates against the schema."""

from __future__ import annotations

import pytest
import torch

from harness.taps import ATTENTION_TAP_STAGES, attention_pipeline
from oracle.judging.attention_analysis import analyze_attention
from oracle.judging.compare import Status
from oracle.judging.diagnose import Kind, Verdict
from oracle.problem.attention import AttentionSpec
from oracle.report.table import render, sentence, to_json, validate
from oracle.run.attention_inputs import make_attention_operands
from oracle.run.attention_model import INJECTION_STAGE, Injection, to_paged
from oracle.run.attention_recording import model_recording
from oracle.run.inputs import Provenance
from oracle.run.caller import Caller

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _run(*, batch=1, hq=2, hkv=2, sq=40, sk=50, causal="none", splits=1, softcap=0.0, paged=0, dtype="bf16",
         injection=None, seed=3, stages=ATTENTION_TAP_STAGES, provenance=None, d=16):
    spec = AttentionSpec(batch=batch, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d, q_dtype=dtype,
                         k_dtype=dtype, v_dtype=dtype, o_dtype=dtype)
    ops = make_attention_operands(spec, "random", seed)  # controlled: seeded, the seed recorded
    kw = dict(causal=causal, softcap=softcap, block_q=16, block_kv=16, splits=splits, injection=injection,
              stages=stages)
    prov = provenance or ops.provenance
    if paged:
        return analyze_attention(model_recording(ops.q, None, None, prov, paged=to_paged(ops.k, ops.v, paged, seed=1),
                                                 **kw))
    return analyze_attention(model_recording(ops.q, ops.k, ops.v, prov, **kw))


MATCHES = {
    "mha_ragged_k": dict(sk=50),
    "gqa_top_left_3_splits": dict(hq=4, hkv=2, causal="top_left", splits=3, sk=70),
    "bottom_right_softcap_masked_rows": dict(batch=2, hkv=1, causal="bottom_right", softcap=5.0, sq=60, sk=40),
    "paged_3_splits_fp16": dict(paged=8, splits=3, sk=45, dtype="fp16", causal="bottom_right"),
}


@pytest.mark.parametrize("name", sorted(MATCHES))
def test_a_correct_kernel_matches_at_every_stage(name):
    an = _run(**MATCHES[name])
    split = MATCHES[name].get("splits", 1) > 1
    assert [s.name for s in an.stages] == list(attention_pipeline(split=split))
    for st in an.stages:
        assert st.teacher_forced.status is Status.MATCH, (name, st.name, st.teacher_forced.worst)
        assert st.chained.status is Status.MATCH, (name, st.name, st.chained.worst)
    assert an.verdict is Verdict.MATCH and an.first is None, sentence(an)
    assert not an.unobserved


# defect -> (model arguments, the KV block it first shows at (None: a stage without one), its split)
DEFECTS = {
    Injection.KV_TAIL_NOT_ZEROED: (dict(sk=50), 3, None),  # keys 48..63 of block 3, past 50
    Injection.CAUSAL_OFF_BY_ONE: (dict(causal="bottom_right"), 0, None),
    Injection.MAX_NOT_UPDATED: (dict(), 1, None),  # a first block has nothing to rescale
    Injection.L_BEFORE_RESCALE: (dict(splits=3, sk=64), 1, 0),  # split 0 holds blocks 0, 1
    Injection.P_WRONG_TYPE: (dict(), 0, None),
    Injection.P_NOT_ROUNDED: (dict(dtype="fp16"), 0, None),
    Injection.V_K_LAYOUT: (dict(), 0, None),
    Injection.MERGE_WITHOUT_MAX: (dict(splits=3), None, None),
    Injection.EMPTY_ROW_NAN: (dict(causal="bottom_right", sq=60, sk=40), None, None),
    Injection.GQA_HEAD_MODULO: (dict(hq=4, hkv=2), 0, None),
    Injection.PAGE_TABLE_OFF_BY_ONE: (dict(paged=8), 0, None),
}


@pytest.mark.parametrize("defect", list(Injection), ids=lambda d: d.value)
def test_each_planted_defect_is_named_at_its_stage(defect):
    args, kb, split = DEFECTS[defect]
    an = _run(injection=defect, **args)
    stage = INJECTION_STAGE[defect]
    names = [s.name for s in an.stages]
    assert an.verdict is Verdict.DIVERGED and an.diagnosis.stage == stage, sentence(an)
    assert an.diagnosis.root_cause and an.kind is Kind.VERDICT and not an.first.missing
    at = an.stages[names.index(stage)]
    assert at.teacher_forced.status is Status.MISMATCH
    for st in an.stages[:names.index(stage)]:
        assert st.teacher_forced.status is Status.MATCH, (st.name, sentence(an))
    f = an.first
    assert (f.stage, f.k_block, f.partial, f.kind) == (stage, kb, split, Kind.VERDICT), sentence(an)
    assert f.element is not None and f.tile is not None
    text = sentence(an)
    assert text.startswith(f"First divergence: {stage} at unit") and "VERDICT" in text
    assert "batch 0, query head" in text and (kb is None or f"KV block {kb}" in text)
    if split is not None:
        assert f"split {split}" in text
    if defect is Injection.CAUSAL_OFF_BY_ONE:  # query i sees key i + (sk - sq) + 1 too
        assert f.expected == float("-inf") and f.element[1] == f.element[0] + 10 + 1
        assert "let through a key the mask hides" in f.hint
    if defect is Injection.KV_TAIL_NOT_ZEROED:
        assert f.element[0] >= 50 and "past seqlen_k = 50" in f.hint
    if defect is Injection.GQA_HEAD_MODULO:  # query head 1 read KV head 1, not 0
        assert an.stages[names.index("load_k")].teacher_forced.bad_tiles == {(1, 0), (1, 1), (1, 2), (2, 0), (2, 1),
                                                                               (2, 2)}
        assert "KV head 1" in f.hint and "key 0, KV head 0" in f.hint
    if defect is Injection.PAGE_TABLE_OFF_BY_ONE:  # the next page: key j + 8
        assert f"batch 0 key {f.element[0] + 8}" in f.hint
    if defect in (Injection.P_WRONG_TYPE, Injection.P_NOT_ROUNDED):
        assert f.bound == 0.0 and "are not values of" in render(an)
    if defect is Injection.EMPTY_ROW_NAN:
        assert f.received != f.received and f.expected == 0.0


def test_a_missing_upstream_tap_is_stood_in_for_and_makes_a_draft():
    """Without softmax_state's taps, o is fed the reference's rescale: the kernel's rescale-less o is
    named, as a DRAFT that asks for the softmax_state tap at that KV block."""
    stages = tuple(s for s in ATTENTION_TAP_STAGES if s != "softmax_state")
    an = _run(injection=Injection.MAX_NOT_UPDATED, stages=stages)
    assert an.verdict is Verdict.DIVERGED and an.diagnosis.stage == "o" and an.kind is Kind.DRAFT
    f = an.first
    assert f.stand_ins and f.k_block == 1
    said = [m.say(Caller.PYTHON) for m in f.missing]
    assert any("softmax_state at batch 0, head" in m and "KV block 1" in m for m in said), said
    assert "not observed: softmax_state" in "; ".join(an.unobserved)


def test_uncontrolled_inputs_make_a_draft_and_the_json_validates():
    an = _run(injection=Injection.CAUSAL_OFF_BY_ONE, causal="bottom_right", provenance=Provenance("captured"))
    assert an.diagnosis.stage == "mask" and an.kind is Kind.DRAFT
    assert any("controlled inputs" in m.say(Caller.PYTHON) for m in an.first.missing)
    doc = to_json(an)
    validate(doc)
    assert doc["first_divergence"]["stage"] == "mask" and doc["first_divergence"]["kind"] == "DRAFT"
    assert [s["name"] for s in doc["stages"]][:4] == ["load_q", "load_k", "load_v", "s"]
    match = _run(hq=4, hkv=2, splits=3)
    validate(to_json(match))


def test_a_paged_cache_holds_seqlen_k_keys_not_what_its_pages_could_hold():
    """A live paged problem names seqlen_k and no cu_seqlens_k: each sequence has seqlen_k keys (45),
    not the 48 its six pages of 8 could hold (the last page's 3 spare rows are no keys)."""
    import dataclasses

    spec = AttentionSpec(batch=2, heads_q=2, heads_kv=2, seqlen_q=40, seqlen_k=45, head_dim=16)
    ops = make_attention_operands(spec, "random", 3)
    rec = model_recording(ops.q, None, None, ops.provenance, paged=to_paged(ops.k, ops.v, 8, seed=1),
                          causal="bottom_right", block_q=16, block_kv=16)
    assert rec.spec.seqlens_k == (45, 45) and rec.spec.max_pages * rec.spec.page_size == 48
    live = dataclasses.replace(rec, spec=dataclasses.replace(rec.spec, seqlens_k=None), cu_seqlens_k=None)
    an = analyze_attention(live)
    assert an.verdict is Verdict.MATCH and an.first is None, sentence(an)


@pytest.mark.parametrize("varlen", [False, True])
def test_the_cross_check_reads_only_its_sampled_rows_and_finds_a_reference_off_there(varlen):
    """The reference is checked against the float64 specification at (batch 0, head 0) and the last
    (batch, head): a reference off there, by more than its own share of the bound, is named with its
    batch, head and query; one off elsewhere is not the cross-check's to see."""
    from kernels_ref.attention.forward import attention_forward
    from oracle.judging.attention_analysis import cross_check
    from oracle.judging.attention_stages import params_of, sequence_args

    kw = dict(seqlens_q=[9, 5], seqlens_k=[12, 7]) if varlen else {}
    spec = AttentionSpec(batch=2, heads_q=2, heads_kv=1, seqlen_q=9, seqlen_k=12, head_dim=16, block_q=8, block_kv=8,
                         **kw)
    ops = make_attention_operands(spec, "random", 3)
    o_ref, lse_ref, stats = attention_forward(ops.q, ops.k, ops.v, params_of(spec), **sequence_args(spec, ops),
                                              with_stats=True)
    dev = torch.device("cpu")
    assert cross_check(spec, ops, o_ref, lse_ref, stats, dev) == []
    last = (9 + 4, 1) if varlen else (1, 4, 1)  # query 4 of batch 1, head 1 ([total_q, H, C] or [B, Lq, H, C])
    off = o_ref.clone()
    off[last] += 1.0 + off[last].abs()
    (msg,) = cross_check(spec, ops, off, lse_ref, stats, dev)
    assert "at batch 1, head 1, query 4" in msg, msg
    elsewhere = o_ref.clone()
    elsewhere[(3, 1) if varlen else (0, 3, 1)] += 1.0  # batch 0, head 1: not sampled
    assert cross_check(spec, ops, elsewhere, lse_ref, stats, dev) == []

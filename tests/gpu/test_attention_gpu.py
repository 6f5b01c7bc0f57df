"""Attention on a GPU: the reference stages compiled for the device (not the interpreter) give the
judgements the CPU tier pins. check_attention MATCHes torch SDPA's outputs computed on the GPU
(math and memory-efficient backends; MHA, GQA, both causal alignments, fully masked rows) and names
planted output defects; the stage-by-stage differential MATCHes the FlashAttention-2-style model
at every stage and names a planted defect at its stage, with every reference stage running on CUDA."""

import pytest
import torch
import torch.nn.functional as F

import oracle
from harness.taps import ATTENTION_TAP_STAGES
from oracle.judging.attention_analysis import analyze_attention
from oracle.judging.compare import Status
from oracle.judging.diagnose import Kind, Verdict
from oracle.problem.attention import AttentionSpec
from oracle.report.table import sentence
from oracle.run.attention_inputs import make_attention_operands
from oracle.run.attention_model import INJECTION_STAGE, Injection
from oracle.run.attention_recording import model_recording

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _sdpa(backend, q, k, v, causal):
    """SDPA on FlashAttention's layout [B, L, H, D]; top-left causal is SDPA's is_causal."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    groups = q.shape[2] // k.shape[2]
    qq, kk, vv = (x.transpose(1, 2) for x in (q, k, v))
    kk, vv = kk.repeat_interleave(groups, dim=1), vv.repeat_interleave(groups, dim=1)
    with sdpa_kernel([{"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]]):
        return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal).transpose(1, 2).contiguous()


CASES = {
    "mha": dict(b=2, lq=256, lk=256, hq=4, hk=4, causal=False),
    "gqa_causal": dict(b=1, lq=300, lk=300, hq=8, hk=2, causal=True),
    "long_keys": dict(b=1, lq=64, lk=4096, hq=4, hk=1, causal=False),
}


@pytest.mark.parametrize("backend", ["math", "efficient"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_outputs_on_the_gpu_match(name, backend):
    c = CASES[name]
    g = torch.Generator(device=DEV).manual_seed(5)
    q = torch.randn(c["b"], c["lq"], c["hq"], 64, device=DEV, generator=g).bfloat16()
    k = torch.randn(c["b"], c["lk"], c["hk"], 64, device=DEV, generator=g).bfloat16()
    v = torch.randn(c["b"], c["lk"], c["hk"], 64, device=DEV, generator=g).bfloat16()
    o = _sdpa(backend, q, k, v, c["causal"])
    causal = "top_left" if c["causal"] else "none"
    rep = oracle.check_attention(q, k, v, o, causal=causal)
    assert rep.verdict == "MATCH", rep
    assert not rep.analysis.cross_check  # the Triton reference agrees with the float64 spec
    bad = o.clone()
    bad[0, 7, 1] *= 2
    rep = oracle.check_attention(q, k, v, bad, causal=causal)
    assert rep.verdict == "DIVERGED" and rep.first_divergence.stage == "store", rep


def _model(**kw):
    spec = AttentionSpec(batch=1, heads_q=4, heads_kv=2, seqlen_q=70, seqlen_k=90, head_dim=32, q_dtype="bf16",
                         k_dtype="bf16", v_dtype="bf16", o_dtype="bf16")
    ops = make_attention_operands(spec, "random", 3)
    args = dict(causal="bottom_right", block_q=32, block_kv=32, stages=ATTENTION_TAP_STAGES)
    args.update(kw)
    return analyze_attention(model_recording(ops.q, ops.k, ops.v, ops.provenance, **args),
                             device=torch.device(DEV))


def test_the_model_matches_at_every_stage_with_the_references_on_the_gpu():
    an = _model(splits=3)
    assert an.device.startswith("cuda")
    for st in an.stages:
        assert st.teacher_forced.status is Status.MATCH and st.chained.status is Status.MATCH, (st.name, sentence(an))
    assert an.verdict is Verdict.MATCH


# a defect inside a split's KV loop needs a split of several KV blocks to show (90 keys, blocks of 32)
SPLITS = {Injection.MAX_NOT_UPDATED: 1, Injection.CAUSAL_OFF_BY_ONE: 1, Injection.MERGE_WITHOUT_MAX: 3}


@pytest.mark.parametrize("defect", sorted(SPLITS, key=lambda d: d.value))
def test_a_planted_defect_is_named_at_its_stage_on_the_gpu(defect):
    an = _model(splits=SPLITS[defect], injection=defect)
    assert an.verdict is Verdict.DIVERGED and an.first.stage == INJECTION_STAGE[defect], sentence(an)
    assert an.kind is Kind.VERDICT, sentence(an)

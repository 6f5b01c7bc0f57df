"""A W4A16 problem through the differential: recordings made to order by the model kernel
(oracle.run.simulate), and oracle.check on a stored (packed) B."""

from __future__ import annotations

import re

import pytest
import torch

import oracle
from kernels_ref import dequant as dq
from oracle.judging import accumulation_models
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, SpecError, Tile
from oracle.report.table import sentence
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate
from quant_checks import (DEFECT_HINTS, assert_check_refuses_an_unreadable_quantised, assert_dequant_finding, assert_kernel_fed_match, assert_draft_without_load, assert_verify_tells_the_nibble_order,
                          int4_op, model_analysis, with_stored_byte_flipped)

SPEC = ProblemSpec(16, 64, 128, a_dtype="fp16", b_dtype="int4", out_dtype="fp16", b_packing="k_pairs_low_first",
                   b_group_size=32, b_scales="fp16", b_zeros="int", tile=Tile(16, 32, 32))
TILE, KB = (0, 1), 2  # the defect's tile and k-block: group 2 of B (k 64..95)


@pytest.fixture(scope="module")
def ops():
    return make_operands(SPEC, "index")


def _run(ops, defect=None, *, drop=()):
    return model_analysis(SPEC, ops, TILE, KB, defect, drop=drop)


def test_correct_w4a16_matches(ops):
    an = _run(ops)
    assert_kernel_fed_match(an, "b")
    names = [s.name for s in an.stages]
    assert names.index("load_b") + 1 == names.index("dequant_b") == names.index("mma") - 1


@pytest.mark.parametrize("defect,says", DEFECT_HINTS)
def test_each_dequant_defect_is_named_at_dequant_b(ops, defect, says):
    f, _ = assert_dequant_finding(_run(ops, defect), "b", TILE, KB, 32, 32, says)
    assert f.element[0] // 32 == 2  # group 2 of B (k 64..95)


def test_an_untapped_load_makes_the_dequant_finding_a_draft(ops):
    assert_draft_without_load(_run(ops, "dequant_zero_twice", drop=("load_b",)), "b", TILE, KB)


def test_a_correct_output_of_a_packed_b_is_checked_output_only():
    spec = ProblemSpec(16, 64, 256, a_dtype="bf16", b_dtype="uint4", out_dtype="bf16",
                       b_packing="k_pairs_high_first", b_group_size=64, b_scales="bf16", b_zeros="float")
    o = make_operands(spec, "random", 2)
    w = dq.dequant_operand_host(o.b, o.b_scales, o.b_zeros, spec.dequant_config)
    d = (o.a.float() @ w.float()).to(torch.bfloat16)
    kw = dict(b_scales=o.b_scales, b_zeros=o.b_zeros, b_dtype="uint4", b_packing="k_pairs_high_first")
    rep = oracle.check(o.a, o.b, d, **kw)
    assert rep.verdict == "MATCH", str(rep)
    got = rep.recording.spec
    assert (got.b_group_size, got.b_scales, got.b_zeros, got.k) == (64, "bf16", "float", 256)
    # the same output judged with the other nibble order is wrong
    rep = oracle.check(o.a, o.b, d, **{**kw, "b_packing": "k_pairs_low_first"})
    assert rep.verdict == "DIVERGED" and rep.first_divergence.stage == "epilogue_store"


def test_check_refuses_a_quantised_b_it_cannot_read():
    assert_check_refuses_an_unreadable_quantised("b", "b_scales has shape")


def test_w4a16_accumulates_with_the_models_of_its_fp16_operands():
    """The dequantised operands enter an fp16 / bf16 MMA: the accumulation models are those of fp16 /
    bf16 operands (keyed by a_dtype), so a cuBLAS-like bf16 output with split-K partials rounded to
    bf16 passes under acc_model="any", and an fp16-accumulated one is judged by the fp16 model."""
    assert accumulation_models.resolved_model(SPEC) is accumulation_models.acc_model("fp32", "fp16")
    spec = ProblemSpec(8, 32, 512, a_dtype="bf16", b_dtype="int4", out_dtype="bf16", b_packing="k_pairs_low_first",
                       b_group_size=128, b_scales="bf16", acc_model="any")
    assert accumulation_models.resolved_model(spec) is accumulation_models.acc_model("any", "bf16")
    o = make_operands(spec, "random", 4)
    w = dq.dequant_operand_host(o.b, o.b_scales, None, spec.dequant_config).float()
    parts = [(o.a.float()[:, i:i + 128] @ w[i:i + 128]).to(torch.bfloat16).float() for i in range(0, 512, 128)]
    d = torch.zeros(8, 32)
    for p in parts:
        d = (d + p).to(torch.bfloat16).float()
    kw = dict(b_scales=o.b_scales, b_dtype="int4", b_packing="k_pairs_low_first")
    assert oracle.check(o.a, o.b, d.to(torch.bfloat16), acc_model="any", **kw).verdict == "MATCH"
    spec16 = ProblemSpec(8, 32, 512, a_dtype="fp16", b_dtype="int4", out_dtype="fp16", acc_dtype="fp16",
                         b_packing="k_pairs_low_first", b_group_size=128, b_scales="fp16")
    assert accumulation_models.resolved_model(spec16) is accumulation_models.acc_model("fp16", "fp16")


def test_verify_runs_a_w4a16_op():
    from oracle.run.case_types import CaseError
    from oracle.tools.verify import VerifyCase

    quant = dict(b_dtype="int4", b_packing="k_pairs_low_first", b_group_size=64, b_scales="fp16", b_zeros="int")
    assert_verify_tells_the_nibble_order(int4_op("b"), dict(name="w4", m=8, n=64, k=256, dtype="fp16"), quant,
                                         "b_packing")
    with pytest.raises(CaseError, match="takes a quant table"):
        VerifyCase("w4", 8, 64, 256, "fp16", call="w4a16")
    with pytest.raises(CaseError, match="quant must be a table"):
        VerifyCase("w4", 8, 64, 256, "fp16", call="w4a16", quant={"b_dtyp": "int4"})


def test_a_wrong_stored_byte_is_named_at_load_b(ops):
    rec = simulate(SPEC, ops, Provenance("index"), tap_tiles=[TILE])
    an = analyze(with_stored_byte_flipped(rec, "b", 1, (3, 5)))  # the kernel's copy of one byte differs from memory
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "load_b" and an.first.k_block == 1, sentence(an)
    assert an.kind is Kind.VERDICT and an.first.element_in_tile == (3, 5)


SPEC_K8 = ProblemSpec(16, 64, 128, a_dtype="fp16", b_dtype="int4", out_dtype="fp16", b_packing="k8_interleaved",
                      b_group_size=32, b_scales="fp16", b_zeros="int", tile=Tile(16, 32, 32))


@pytest.fixture(scope="module")
def ops_k8():
    return make_operands(SPEC_K8, "index")


def _run_k8(ops, defect=None):
    return model_analysis(SPEC_K8, ops, TILE, KB, defect)


def test_a_k8_interleaved_kernel_matches(ops_k8):
    an = _run_k8(ops_k8)
    assert an.verdict is Verdict.MATCH, sentence(an)
    deq = next(s for s in an.stages if s.name == "dequant_b")
    assert deq.teacher_forced.status.value == "MATCH" and deq.teacher_forced.evidence.feeds[0].value == "kernel tap"


@pytest.mark.parametrize("defect,says", [
    # element 8w + i of a word read as plain pairs gets element 8w + [0, 2, 4, 6, 1, 3, 5, 7][i]
    ("dequant_plain_pairs", r"the value stored for k = (\d+): B's bytes read as k_pairs_low_first, not "
                            r"k8_interleaved \(the packing / nibble order is wrong\)"),
    ("dequant_nibble_order", r"the other nibble of its byte \(k = (\d+)\): the nibble order is swapped"),
])
def test_a_k8_interleaved_b_read_in_another_order_is_named_at_dequant_b(ops_k8, defect, says):
    an = _run_k8(ops_k8, defect)
    f = an.first
    assert an.verdict is Verdict.DIVERGED and f.stage == "dequant_b" and an.kind is Kind.VERDICT, sentence(an)
    assert (f.tile, f.k_block) == (TILE, KB) and f.comparison == "teacher_forced"
    k = f.element[0]
    text = sentence(an)
    found = re.search(says, text)
    assert found, text
    src = int(found.group(1))
    word = (k // 8) * 8
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    want = word + (order[k % 8] if defect == "dequant_plain_pairs" else order[order.index(k % 8) ^ 1])
    assert src == want != k, (k, src)
    assert "mma" in an.diagnosis.inherited


def test_the_plain_pair_read_needs_an_interleaved_b(ops):
    with pytest.raises(ValueError, match="dequant_plain_pairs needs a k8_interleaved B"):
        simulate(SPEC, ops, Provenance("index"), injection=Injection("dequant_plain_pairs", TILE, KB))


def test_a_packed_load_marks_the_k_its_bytes_hold():
    from oracle.judging.differential.dequant import _byte_rows

    assert _byte_rows(16, "k8_interleaved").tolist() == [0, 2, 0, 2, 1, 3, 1, 3, 4, 6, 4, 6, 5, 7, 5, 7]
    assert _byte_rows(6, "k_pairs_high_first").tolist() == [0, 0, 1, 1, 2, 2]


def _interleaved_codes(b: torch.Tensor) -> torch.Tensor:
    """Codes [K, N] of a k8_interleaved B, read as a kernel does: one little-endian uint32 per 4 bytes."""
    raw = b.to(torch.int64)
    words = raw[0::4] | (raw[1::4] << 8) | (raw[2::4] << 16) | (raw[3::4] << 24)
    codes = torch.empty(2 * b.shape[0], b.shape[1], dtype=torch.int64)
    for i, e in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
        codes[e::8] = (words >> (4 * i)) & 0xF
    return codes


def test_check_judges_a_k8_interleaved_b():
    spec = ProblemSpec(16, 64, 256, a_dtype="fp16", b_dtype="int4", out_dtype="fp16", b_packing="k8_interleaved",
                       b_group_size=64, b_scales="fp16", b_zeros="int")
    o = make_operands(spec, "random", 3)
    codes = _interleaved_codes(o.b)
    q = torch.where(codes >= 8, codes - 16, codes).float()
    g = torch.arange(256) // 64
    w = ((q - o.b_zeros.float()[g]) * o.b_scales.float()[g]).half()
    d = (o.a.float() @ w.float()).half()
    kw = dict(b_scales=o.b_scales, b_zeros=o.b_zeros, b_dtype="int4", b_packing="k8_interleaved")
    rep = oracle.check(o.a, o.b, d, **kw)
    assert rep.verdict == "MATCH", str(rep)
    assert rep.recording.spec.b_packing == "k8_interleaved"
    # the same bytes taken as plain pairs are another B, and a kernel that read them so is wrong
    assert oracle.check(o.a, o.b, d, **{**kw, "b_packing": "k_pairs_low_first"}).verdict == "DIVERGED"
    d_plain = int4_op("b")(o.a, o.b, o.b_scales, o.b_zeros)
    rep = oracle.check(o.a, o.b, d_plain, **kw)
    assert rep.verdict == "DIVERGED" and rep.first_divergence.stage == "epilogue_store", str(rep)
    with pytest.raises(SpecError, match="b_group_size=4 .*multiple of 8"):
        oracle.check(o.a, o.b, d, **{**kw, "b_scales": torch.ones(64, 64, dtype=torch.float16),
                                     "b_zeros": None})


def test_verify_runs_a_k8_interleaved_op():
    from oracle.tools.verify import VerifyCase, run_case

    def op(a, b, b_scales, b_zeros):
        codes = _interleaved_codes(b)
        q = torch.where(codes >= 8, codes - 16, codes).float()
        g = torch.arange(q.shape[0]) // (q.shape[0] // b_scales.shape[0])
        w = ((q - b_zeros.float()[g]) * b_scales.float()[g]).to(a.dtype)
        return (a.float() @ w.float()).to(a.dtype)

    quant = dict(b_dtype="int4", b_packing="k8_interleaved", b_group_size=64, b_scales="fp16", b_zeros="int")
    row = run_case(op, VerifyCase("w4", 8, 64, 256, "fp16", call="w4a16", quant=quant, time=False))
    assert row["verdict"] == "MATCH", row
    row = run_case(int4_op("b"), VerifyCase("w4", 8, 64, 256, "fp16", call="w4a16", quant=quant, time=False))
    assert row["verdict"] == "DIVERGED", row

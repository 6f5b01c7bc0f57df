"""A quantised A (the swapped problem of a mixed-input Hopper kernel: the weight is WGMMA's register
operand A): its problem fields, stored operands, the dequant_a stage of the differential on
recordings made by the model kernel, oracle.check and verify, and what refuses it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import oracle
from harness.taps import Tap
from kernels_ref import dequant as dq
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, SpecError, Tile
from oracle.report import table as report
from oracle.report.table import sentence
from oracle.run.case import load_case
from oracle.run.inputs import Operands, Provenance, check_operands, expected_shapes, make_operands
from oracle.run.recording import Recording, RecordingError
from oracle.run.simulate import simulate
from quant_checks import (DEFECT_HINTS, assert_check_refuses_an_unreadable_quantised, assert_dequant_finding, assert_kernel_fed_match, assert_draft_without_load, assert_verify_tells_the_nibble_order,
                          assert_case_file_carries_the_quant_fields, int4_op, model_analysis, with_stored_byte_flipped)

ROOT = Path(__file__).resolve().parents[2]
WA = dict(a_dtype="int4", b_dtype="fp16", out_dtype="fp16", a_packing="k_pairs_low_first", a_group_size=32,
          a_scales="fp16", a_zeros="int", tile=Tile(32, 16, 32))
TILE, KB = (1, 0), 2  # the defect's tile and k-block: rows 32..63 of A, its group 2 (k 64..95)


def wa(**kw) -> ProblemSpec:
    return ProblemSpec(64, 16, 128, **{**WA, **kw})


# -- the problem ---------------------------------------------------------------------------------
def test_a_quantised_a_has_the_dequant_a_stage_and_reads_b_dtype():
    s = wa()
    assert s.quant_op == "a" and s.quantised_a and not s.quantised_b and s.dequant_operands == ("a",)
    assert s.mma_dtype == "fp16" and s.quant_groups == 4 and s.group_k == 32
    cfg = s.dequant_config
    assert (cfg.dtype, cfg.out_dtype, cfg.group_size, cfg.packing, cfg.zeros) == ("int4", "fp16", 32,
                                                                                  "k_pairs_low_first", "int")
    assert "A k_pairs_low_first group 32" in s.describe()
    assert ProblemSpec.from_json(s.to_json()) == s
    assert "a_packing" not in ProblemSpec(8, 8, 8).to_json() and "a_zeros" not in ProblemSpec(8, 8, 8).to_json()
    assert wa(a_dtype="e4m3", b_dtype="bf16", out_dtype="bf16", a_packing=None, a_zeros="none").quant_op == "a"


@pytest.mark.parametrize("kw,field,allowed", [
    (dict(a_packing=None), "a_packing", "A of int4 is packed two to a byte along K"),
    (dict(a_packing="k_pairs_interleaved"), "a_packing", "k_pairs_low_first, k_pairs_high_first, k8_interleaved"),
    (dict(a_dtype="int8", a_packing="k_pairs_low_first"), "a_packing", "one value per byte"),
    (dict(a_scales=None), "a_scales", "fp16, bf16, fp32, e4m3, e8m0"),
    (dict(a_scales="e8m0"), "a_scales", "micro-scaling scales of a float A"),
    (dict(a_group_size=48), "a_group_size", "divides K = 128"),
    (dict(a_packing="k8_interleaved", a_group_size=4, tile=Tile(32, 16, 8)), "a_group_size", "multiple of 8"),
    (dict(b_dtype="fp32", out_dtype="fp32"), "b_dtype", "dequantised to B's dtype for the MMA: one of fp16, bf16"),
    (dict(a_zeros="half"), "a_zeros", "none, int, float"),
    (dict(a_dtype="fp4_e2m1", a_scales="e8m0", a_zeros="int"), "a_zeros", "integer A"),
    (dict(dequant_precision="fp64"), "dequant_precision", "fp32, operand"),
    (dict(tile=Tile(32, 16, 48)), "k", "multiple of tile.bk"),
    (dict(oob_fill="nan"), "oob_fill", "no NaN"),
    (dict(promotion_interval=32), "promotion_interval", "no fp8 promotion"),
    (dict(batch=2), "batch", "single GEMM"),
])
def test_every_a_quant_field_is_checked_by_name(kw, field, allowed):
    with pytest.raises(SpecError) as e:
        wa(**kw)
    assert str(e.value).startswith(f"{field}=") and allowed in str(e.value), str(e.value)


def test_exactly_one_operand_is_quantised_and_the_error_names_both():
    with pytest.raises(SpecError) as e:
        wa(b_scales="fp16")
    assert str(e.value).startswith("a_scales and b_scales=") and "exactly one operand" in str(e.value)
    with pytest.raises(SpecError) as e:
        wa(b_dtype="int4", b_packing="k_pairs_low_first")
    assert str(e.value).startswith("a_dtype='int4'") and "b_dtype='int4'" in str(e.value), str(e.value)
    for kw in (dict(a_group_size=32), dict(a_packing="k_pairs_low_first"), dict(a_scales="fp16"),
               dict(a_zeros="int")):
        with pytest.raises(SpecError, match="only a quantised A"):
            ProblemSpec(16, 64, 128, **kw)
    with pytest.raises(SpecError, match=r"^a_scales=None .*a quantised A needs its scales"):
        ProblemSpec(16, 64, 128, a_dtype="int4", b_dtype="fp16", out_dtype="fp16", a_packing="k_pairs_low_first")
    for a in ("int8", "e4m3"):  # an 8-bit A with no quant field is a plain A: its B must match it
        with pytest.raises(SpecError, match=r"^b_dtype='fp16' is not allowed: .*unless A is quantised: then give "
                                            r"a_scales"):
            ProblemSpec(16, 64, 128, a_dtype=a, b_dtype="fp16", out_dtype="fp16")
    assert ProblemSpec(16, 64, 128, a_dtype="int8", b_dtype="fp16", out_dtype="fp16", a_scales="fp16").quantised_a


def test_stored_a_shapes_dtypes_and_the_ones_ladder():
    s = wa()
    sh = expected_shapes(s)
    assert sh["a"] == (64, 64) and sh["a_scales"] == (64, 4) and sh["a_zeros"] == (64, 4) and sh["b"] == (128, 16)
    assert sh["b_scales"] is None and expected_shapes(wa(a_zeros="none"))["a_zeros"] is None
    ops = make_operands(s, "index")
    check_operands(s, ops)
    assert ops.a.dtype == torch.uint8 and ops.a_zeros.dtype == torch.int8 and ops.b.dtype == torch.float16
    with pytest.raises(Exception, match="'a_zeros' is missing"):
        check_operands(s, Operands(a=ops.a, b=ops.b, a_scales=ops.a_scales))
    with pytest.raises(Exception, match="ktag"):
        make_operands(s, "ktag")
    for kw in (dict(), dict(a_dtype="uint4", a_scales="bf16", b_dtype="bf16", out_dtype="bf16", a_zeros="float")):
        spec = wa(**kw)
        o = make_operands(spec, "ones")
        w = dq.dequant_operand_host(*o.quant_kn("a"), spec.dequant_config)
        assert w.shape == (128, 64) and bool((w.float() == 1).all()), kw


def test_a_stored_a_is_packed_along_k_row_by_row():
    """Byte (m, r) of a k_pairs_low_first A holds k = 2r (low nibble) and 2r + 1 of row m."""
    s = wa()
    o = make_operands(s, "random", 1)
    codes = dq.unpack_host(o.a.t(), s.dequant_config).t()  # [M, K]
    assert codes.shape == (64, 128)
    assert torch.equal(codes[:, 0::2], (o.a & 0xF).long()) and torch.equal(codes[:, 1::2], (o.a >> 4).long())


# -- the differential on the model kernel --------------------------------------------------------
@pytest.fixture(scope="module")
def ops():
    return make_operands(wa(), "index")


def _run(ops, defect=None, *, drop=(), spec=None):
    return model_analysis(spec or wa(), ops, TILE, KB, defect, drop=drop)


def test_a_correct_quantised_a_kernel_matches(ops):
    an = _run(ops)
    assert_kernel_fed_match(an, "a")


@pytest.mark.parametrize("defect,says", DEFECT_HINTS)
def test_each_dequant_defect_is_named_at_dequant_a(ops, defect, says):
    an = _run(ops, defect)
    f, text = assert_dequant_finding(an, "a", TILE, KB, 32, 32, says)
    m = f.element[0]
    assert 32 <= m < 64 and f"of row m = {m}" in text  # A's (m, k): a row of the defect's tile
    doc = json.loads(json.dumps(report.to_json(an), default=str))
    report.validate(doc)  # the shipped schema holds a quantised A's problem and its dequant_a finding
    assert doc["problem"]["a_scales"] == "fp16" and doc["first_divergence"]["stage"] == "dequant_a"


def test_a_k8_interleaved_a_read_as_plain_pairs_is_named(ops):
    spec = wa(a_packing="k8_interleaved")
    o = make_operands(spec, "index")
    assert _run(o, spec=spec).verdict is Verdict.MATCH
    an = _run(o, "dequant_plain_pairs", spec=spec)
    assert an.first.stage == "dequant_a" and an.kind is Kind.VERDICT, sentence(an)
    assert re.search(r"A's bytes read as k_pairs_low_first, not k8_interleaved", sentence(an)), sentence(an)


def test_an_untapped_load_a_makes_the_finding_a_draft(ops):
    assert_draft_without_load(_run(ops, "dequant_zero_twice", drop=("load_a",)), "a", TILE, KB)


def test_a_wrong_stored_byte_is_named_at_load_a(ops):
    rec = simulate(wa(), ops, Provenance("index"), tap_tiles=[TILE])
    an = analyze(with_stored_byte_flipped(rec, "a", 1, (5, 3)))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "load_a" and an.first.k_block == 1, sentence(an)
    assert an.kind is Kind.VERDICT and an.first.element_in_tile == (5, 3)


def test_a_dequant_a_tap_holds_b_dtype_and_a_packed_load_a_its_bytes():
    s = wa()
    o = make_operands(s, "ones")
    out = torch.zeros(64, 16, dtype=torch.float16)
    good = (Tap("load_a", (0, 0), torch.zeros(32, 16, dtype=torch.uint8), k_block=0),
            Tap("dequant_a", (0, 0), torch.zeros(32, 32, dtype=torch.float16), k_block=0))
    Recording(spec=s, operands=o, output=out, provenance=Provenance("ones"), taps=good).validate()
    for tap, why in ((Tap("dequant_a", (0, 0), torch.zeros(32, 32, dtype=torch.bfloat16), k_block=0),
                      "MMA's operand: fp16"),
                     (Tap("load_a", (0, 0), torch.zeros(32, 32, dtype=torch.uint8), k_block=0), r"expected \[32, 16\]"),
                     (Tap("dequant_b", (0, 0), torch.zeros(32, 16, dtype=torch.float16), k_block=0), "not quantised")):
        with pytest.raises(RecordingError, match=why):
            Recording(spec=s, operands=o, output=out, provenance=Provenance("ones"), taps=(tap,)).validate()


def test_a_quantised_a_recording_round_trips_through_the_dump(tmp_path):
    s = wa(a_dtype="uint4", a_scales="bf16", b_dtype="bf16", out_dtype="bf16", a_zeros="float_offset",
           dequant_precision="operand", a_packing="k_pairs_high_first")
    rec = simulate(s, make_operands(s, "random", 4), Provenance("random", 4), tap_tiles=[(0, 0)])
    assert analyze(rec).verdict is Verdict.MATCH
    path = str(tmp_path / "wa.safetensors")
    rec.save(path)
    back = Recording.load(path)
    assert back.spec == s and set(back.operands.named()) == {"a", "b", "a_scales", "a_zeros"}
    assert analyze(back).verdict is Verdict.MATCH


# -- oracle.check and verify ---------------------------------------------------------------------
def _dequantised_a(spec, o):
    return dq.dequant_operand_host(*o.quant_kn("a"), spec.dequant_config).t()


def test_check_judges_a_quantised_a_output_only():
    spec = ProblemSpec(32, 16, 128, a_dtype="int4", b_dtype="bf16", out_dtype="bf16", a_packing="k_pairs_high_first",
                       a_group_size=32, a_scales="bf16", a_zeros="int")
    o = make_operands(spec, "random", 3)
    d = (_dequantised_a(spec, o).float() @ o.b.float()).to(torch.bfloat16)
    kw = dict(a_scales=o.a_scales, a_zeros=o.a_zeros, a_dtype="int4", a_packing="k_pairs_high_first")
    rep = oracle.check(o.a, o.b, d, **kw)
    assert rep.verdict == "MATCH", str(rep)
    got = rep.recording.spec
    assert (got.quant_op, got.a_group_size, got.a_scales, got.a_zeros, got.k) == ("a", 32, "bf16", "int", 128)
    bad = o.a_scales.clone()
    bad[5, 2] = bad[5, 2] * 2  # the kernel's scale of row 5, group 2 is not the one it was given
    d_bad = (_dequantised_a(spec, Operands(a=o.a, b=o.b, a_scales=bad, a_zeros=o.a_zeros)).float()
             @ o.b.float()).to(torch.bfloat16)
    rep = oracle.check(o.a, o.b, d_bad, **kw)
    assert rep.verdict == "DIVERGED" and rep.first_divergence.stage == "epilogue_store", str(rep)
    assert rep.first_divergence.element[0] == 5


def test_the_dequant_bound_applies_on_a_side():
    """A kernel whose dequantised A is one ulp off the reference's everywhere (allowed by the
    "operand" dequant bound) passes where the problem declares that arithmetic, through the A-side
    term sum_k bound(w_mk) |b_kn| of the accumulator's bound, and is DIVERGED where the dequant is
    declared exact (fp32)."""
    spec = ProblemSpec(32, 16, 512, a_dtype="int4", b_dtype="fp16", out_dtype="fp32", a_packing="k_pairs_low_first",
                       a_group_size=64, a_scales="fp16", a_zeros="float", dequant_precision="operand")
    o = make_operands(spec, "random", 7)
    b = o.b.abs()  # positive B: the ulps add up
    w = _dequantised_a(spec, o).half()
    w_off = (w.view(torch.int16) + torch.where(w >= 0, 1, -1).to(torch.int16)).view(torch.float16)
    d = (w_off.double() @ b.double()).float()
    kw = dict(a_scales=o.a_scales, a_zeros=o.a_zeros, a_dtype="int4", a_packing="k_pairs_low_first")
    assert oracle.check(o.a, b, d, dequant_precision="operand", **kw).verdict == "MATCH"
    assert oracle.check(o.a, b, d, dequant_precision="fp32", **kw).verdict == "DIVERGED"


def test_check_refuses_a_quantised_a_it_cannot_read():
    assert_check_refuses_an_unreadable_quantised("a", r"a_scales has shape \[3, 2\]: it must be \[M, K / group\]")
    a = torch.zeros(8, 32, dtype=torch.uint8)
    b = torch.ones(64, 4, dtype=torch.float16)
    d = torch.zeros(8, 4, dtype=torch.float16)
    s = torch.ones(8, 2, dtype=torch.float16)
    with pytest.raises(SpecError, match="a_scales and b_scales were both given"):
        oracle.check(a, b, d, a_scales=s, b_scales=s, a_dtype="int4", a_packing="k_pairs_low_first")


def test_verify_runs_an_op_with_a_quantised_a():
    from oracle.run.case_types import CaseError
    from oracle.tools.verify import VerifyCase

    quant = dict(a_dtype="int4", a_packing="k_pairs_low_first", a_group_size=64, a_scales="fp16", a_zeros="int")
    assert_verify_tells_the_nibble_order(int4_op("a"), dict(name="wa", m=64, n=8, k=256, dtype="fp16"), quant,
                                         "a_packing")
    with pytest.raises(CaseError, match="both a_\\* and b_\\*"):
        VerifyCase("wa", 64, 8, 256, "fp16", call="w4a16", quant={**quant, "b_scales": "fp16"})


# -- case files and what refuses a quantised A ---------------------------------------------------
def test_case_file_carries_the_a_quant_fields(tmp_path):
    assert_case_file_carries_the_quant_fields(
        tmp_path, "a", '[problem]\nm = 64\nn = 16\nk = 128\na_dtype = "int4"\nb_dtype = "fp16"\nout_dtype = "fp16"\n'
        'a_packing = "k_pairs_low_first"\na_group_size = 32\na_scales = "fp16"\na_zeros = "int"\n'
        'tile = [32, 16, 32]\n[launch]\ngrid = [1, 1, 1]\nblock = [32, 1, 1]\n'
        'args = ["a", "b", "a_scales", "a_zeros", "d", "m", "n", "k"]\n', wa())


def test_the_reproducer_refuses_a_quantised_a_by_name(tmp_path):
    from oracle.repro.generate import ReproError, write_repro

    over = dict(m=64, n=64, k=64, a_dtype="int4", b_dtype="bf16", out_dtype="bf16", a_packing="k_pairs_low_first",
                a_group_size=32, a_scales="bf16", bias_dtype="bf16")
    case = load_case(str(ROOT / "harness" / "examples" / "simple_gemm.toml"), over)
    ops = make_operands(case.spec, "ones")
    with pytest.raises(ReproError, match=r"a quantised A \(int4, its scales and zero points\) has no standalone "
                                         r"reproducer"):
        write_repro(case, ops, Provenance("ones"), tmp_path / "repro")
    assert not (tmp_path / "repro").exists() or not any((tmp_path / "repro").iterdir())

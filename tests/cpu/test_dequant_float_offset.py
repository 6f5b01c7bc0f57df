"""The float_offset zero points, w = (q - c) * s + z (torch's tinygemm int4 form: uint4 nibbles
centred on 8, a float added after the scale): the Triton stage against its host spec, the bound of
an fma in the operand dtype, the problem's fields, oracle.check on a stored B, and a wrong zero
point found and named."""

from __future__ import annotations

import pytest
import torch

import oracle
from kernels_ref import dequant as dq
from kernels_ref.dtypes import ALL_TYPES
from oracle.judging import tolerance
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, SpecError, Tile
from oracle.report.table import sentence
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate

CONFIGS = [
    ("uint4", "bf16", "bf16", "fp32", "k_pairs_high_first"),
    ("uint4", "bf16", "bf16", "operand", "k_pairs_low_first"),
    ("uint4", "fp32", "fp16", "operand", "k_pairs_high_first"),
    ("int4", "fp16", "fp16", "fp32", "k_pairs_low_first"),
    ("int8", "fp32", "bf16", "fp32", None),
]


def _inputs(cfg: dq.DequantConfig, k: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16 if cfg.packed else 256, (k, n), generator=g)
    groups = k // cfg.group_size
    s = ((torch.rand(groups, n, generator=g) + 0.5) / 4).to(ALL_TYPES[cfg.scale_dtype].torch)
    z = (torch.rand(groups, n, generator=g) - 0.5).to(cfg.zero_torch())
    return dq.pack_host(codes, cfg), codes, s, z


@pytest.mark.parametrize("dtype,scale,out,precision,packing", CONFIGS)
def test_triton_matches_the_host_spec_bit_for_bit(dtype, scale, out, precision, packing):
    cfg = dq.DequantConfig(dtype, scale, out, 16, packing, "float_offset", precision)
    stored, codes, s, z = _inputs(cfg, 64, 40, seed=len(dtype) + len(scale))
    per = 2 if cfg.packed else 1
    tile = stored[32 // per:64 // per, 8:40]
    host = dq.dequant_host(tile, s, z, cfg, k0=32, n0=8)
    tri = dq.dequant(tile, s, z, cfg, k0=32, n0=8)
    assert torch.equal(host.view(torch.int16), tri.view(torch.int16))


def test_the_form_is_q_minus_the_centre_times_s_plus_z():
    cfg = dq.DequantConfig("uint4", "bf16", "bf16", 16, "k_pairs_high_first", "float_offset")
    assert cfg.centre == 8.0 and dq.DequantConfig("int4", "bf16", "bf16", 16, "k_pairs_high_first",
                                                  "float_offset").centre == 0.0
    stored, codes, s, z = _inputs(cfg, 64, 32, 3)
    host = dq.dequant_operand_host(stored, s, z, cfg).double()
    g = torch.arange(64) // 16
    exact = (codes.double() - 8) * s.double()[g] + z.double()[g]  # float64: exact
    once = exact.to(torch.float32).to(torch.bfloat16).double()  # fp32 (t * s exact: one rounding), then bf16
    assert torch.equal(host, once)
    assert not torch.equal(host, ((codes.double() - 8) * s.double()[g]).to(torch.bfloat16).double())  # z counts


@pytest.mark.parametrize("out", ["bf16", "fp16"])
def test_an_fma_in_the_operand_dtype_stays_within_the_bound(out):
    """op(t * s + z) in one rounding (tinygemm's bf16 fma) against the reference's op(op(t * s) + z):
    within the bound everywhere, not always equal (so the bound is needed)."""
    cfg = dq.DequantConfig("uint4", out, out, 16, "k_pairs_high_first", "float_offset", "operand")
    stored, codes, s, z = _inputs(cfg, 256, 64, 9)
    ref = dq.dequant_host(stored, s, z, cfg).double()
    g = torch.arange(256) // 16
    q = dq.values_of_codes(codes, "uint4")
    sv, zv = s.double()[g], z.double()[g]
    fma = ((q - 8) * sv + zv).to(torch.float32).to(ALL_TYPES[out].torch).double()
    bound = tolerance.dequant_bound(q, zv, sv, out_dtype=out, precision="operand", zeros="float_offset",
                                    scale_dtype=out, centre=8.0)
    assert bool(((fma - ref).abs() <= bound).all())
    assert bool((fma != ref).any())
    assert tolerance.dequant_bound(q, zv, sv, out_dtype=out, precision="fp32", zeros="float_offset",
                                   scale_dtype=out, centre=8.0) is None  # declared fp32: bit-exact


def test_the_problem_field_is_checked_and_named():
    kw = dict(a_dtype="bf16", b_dtype="uint4", out_dtype="bf16", b_packing="k_pairs_high_first", b_group_size=32,
              b_scales="bf16", b_zeros="float_offset", tile=Tile(16, 32, 32))
    spec = ProblemSpec(16, 64, 128, **kw)
    assert ProblemSpec.from_json(spec.to_json()) == spec and "float_offset" in spec.describe()
    for bad, says in ((dict(b_dtype="fp4_e2m1", b_scales="bf16"), "integer B"),
                      (dict(b_dtype="uint4", b_scales="e8m0"), "b_scales")):
        with pytest.raises(SpecError, match=says):
            ProblemSpec(16, 64, 128, **{**kw, **bad})
    with pytest.raises(SpecError, match="none, int, float, float_offset"):
        ProblemSpec(16, 64, 128, **{**kw, "b_zeros": "offset"})
    ops = make_operands(spec, "ones")
    assert bool((dq.dequant_operand_host(ops.b, ops.b_scales, ops.b_zeros, spec.dequant_config).float() == 1).all())


def _w4a16(seed=2, precision=None):
    spec = ProblemSpec(24, 64, 256, a_dtype="bf16", b_dtype="uint4", out_dtype="bf16", b_packing="k_pairs_high_first",
                       b_group_size=64, b_scales="bf16", b_zeros="float_offset", dequant_precision=precision)
    return spec, make_operands(spec, "random", seed)


def test_check_matches_a_correct_output_and_a_wrong_zero_diverges():
    spec, o = _w4a16()
    w = dq.dequant_operand_host(o.b, o.b_scales, o.b_zeros, spec.dequant_config)
    d = (o.a.double() @ w.double()).to(torch.bfloat16)
    kw = dict(b_scales=o.b_scales, b_zeros=o.b_zeros, b_zeros_kind="float_offset", b_dtype="uint4",
              b_packing="k_pairs_high_first")
    rep = oracle.check(o.a, o.b, d, **kw)
    assert rep.verdict == "MATCH", str(rep)
    assert rep.recording.spec.b_zeros == "float_offset"
    # the same zero points read as (q - z) * s: another problem, and the output is wrong for it
    assert oracle.check(o.a, o.b, d, **{**kw, "b_zeros_kind": "float"}).verdict == "DIVERGED"
    wrong = o.b_zeros.clone()
    wrong[2, :32] = o.b_zeros[1, :32]  # group 2 of the first 32 columns takes group 1's zero point
    bad_w = dq.dequant_operand_host(o.b, o.b_scales, wrong, spec.dequant_config)
    bad = (o.a.double() @ bad_w.double()).to(torch.bfloat16)
    rep = oracle.check(o.a, o.b, bad, **kw)
    assert rep.verdict == "DIVERGED" and rep.first_divergence.stage == "epilogue_store", str(rep)


def test_check_refuses_a_float_offset_it_cannot_read():
    spec, o = _w4a16()
    d = torch.zeros(24, 64, dtype=torch.bfloat16)
    kw = dict(b_scales=o.b_scales, b_dtype="uint4", b_packing="k_pairs_high_first")
    with pytest.raises(SpecError, match="without b_zeros"):
        oracle.check(o.a, o.b, d, b_zeros_kind="float_offset", **kw)
    with pytest.raises(SpecError, match="floats in the scales' dtype"):
        oracle.check(o.a, o.b, d, b_zeros=torch.zeros(4, 64, dtype=torch.uint8), b_zeros_kind="float_offset", **kw)


@pytest.mark.parametrize("defect,says", [("dequant_group_index", "a wrong group index"),
                                         ("dequant_zero_twice", "the zero point applied twice")])
def test_a_wrong_zero_point_is_found_and_named_at_dequant_b(defect, says):
    spec = ProblemSpec(16, 64, 128, a_dtype="bf16", b_dtype="uint4", out_dtype="bf16", b_packing="k_pairs_high_first",
                       b_group_size=32, b_scales="bf16", b_zeros="float_offset", tile=Tile(16, 32, 32))
    ops = make_operands(spec, "index")
    clean = analyze(simulate(spec, ops, Provenance("index"), tap_tiles=[(0, 1)]))
    assert clean.verdict is Verdict.MATCH, sentence(clean)
    an = analyze(simulate(spec, ops, Provenance("index"), injection=Injection(defect, (0, 1), 2), tap_tiles=[(0, 1)]))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "dequant_b", sentence(an)
    assert says in sentence(an), sentence(an)


def test_an_fma_dequant_kernel_judged_output_only_matches_as_operand():
    """A kernel whose dequant is one bf16 fma (tinygemm's arithmetic) then an exact GEMM: judged from
    its output with dequant_precision "operand", the accumulator's bound carries |A| times the dequant
    bound, so it is MATCH; its dequant differs from the reference's (so the widening is needed)."""
    spec, o = _w4a16(seed=4, precision="operand")
    cfg = spec.dequant_config
    q = dq.values_of_codes(dq.unpack_host(o.b, cfg), "uint4")
    g = torch.arange(spec.k) // spec.group_k
    w = ((q - 8) * o.b_scales.double()[g] + o.b_zeros.double()[g]).to(torch.float32).to(torch.bfloat16)
    assert not torch.equal(w, dq.dequant_operand_host(o.b, o.b_scales, o.b_zeros, cfg))
    d = (o.a.double() @ w.double()).to(torch.bfloat16)
    kw = dict(b_scales=o.b_scales, b_zeros=o.b_zeros, b_zeros_kind="float_offset", b_dtype="uint4",
              b_packing="k_pairs_high_first")
    rep = oracle.check(o.a, o.b, d, dequant_precision="operand", **kw)
    assert rep.verdict == "MATCH", str(rep)
    d[3, 5] = -d[3, 5] if d[3, 5] != 0 else 1.0
    assert oracle.check(o.a, o.b, d, dequant_precision="operand", **kw).verdict == "DIVERGED"


def _tinygemm_op(a, b, b_scales, b_zeros):
    """tinygemm's W4A16 in plain torch: uint4, the even k in the high nibble, w = (q - 8) * s + z."""
    hi, lo = (b >> 4).to(torch.int32), (b & 0xF).to(torch.int32)
    q = torch.stack([hi, lo], dim=1).reshape(2 * b.shape[0], b.shape[1]).float()
    g = torch.arange(q.shape[0]) // (q.shape[0] // b_scales.shape[0])
    w = ((q - 8) * b_scales.float()[g] + b_zeros.float()[g]).to(a.dtype)
    return (a.float() @ w.float()).to(a.dtype)


def test_verify_runs_a_float_offset_op():
    from oracle.tools.verify import VerifyCase, run_case

    quant = dict(b_dtype="uint4", b_packing="k_pairs_high_first", b_group_size=64, b_scales="bf16",
                 b_zeros="float_offset")
    row = run_case(_tinygemm_op, VerifyCase("w4", 8, 64, 256, "bf16", call="w4a16", quant=quant, time=False))
    assert row["verdict"] == "MATCH", row
    row = run_case(_tinygemm_op, VerifyCase("w4", 8, 64, 256, "bf16", call="w4a16",
                                            quant={**quant, "b_zeros": "float"}, time=False))
    assert row["verdict"] == "DIVERGED", row

"""A quantised B's problem fields, stored operands, dtype rows, trace stages and dump round trip."""

from __future__ import annotations

import pytest
import torch

from harness.taps import DEQUANT_STAGES, TAP_STAGES, Tap, TapError, pipeline
from harness import trace_format as tf
from kernels_ref import dequant as dq
from kernels_ref.dtypes import ALL_TYPES, PACKED, QUANT_TYPES
from oracle.problem.spec import ProblemSpec, SpecError, Tile
from oracle.run.inputs import InputError, Operands, Provenance, check_operands, expected_shapes, make_operands
from oracle.run.recording import Recording, RecordingError
from quant_checks import assert_case_file_carries_the_quant_fields  # tests/ on sys.path

W4 = dict(a_dtype="fp16", b_dtype="int4", out_dtype="fp16", b_packing="k_pairs_low_first", b_group_size=32,
          b_scales="fp16", b_zeros="int", tile=Tile(16, 32, 32))


def w4(**kw) -> ProblemSpec:
    return ProblemSpec(16, 64, 128, **{**W4, **kw})


def test_dequant_stages_sit_between_load_and_mma():
    assert tf.STAGE_CODES["dequant_a"] == 14 and tf.STAGE_CODES["dequant_b"] == 15
    assert set(DEQUANT_STAGES) <= set(TAP_STAGES)
    p = pipeline(dequant=("b",))
    assert p.index("load_b") + 1 == p.index("dequant_b") and p.index("dequant_b") + 1 == p.index("mma")
    assert "dequant_b" not in pipeline() and "dequant_a" not in p
    assert w4().dequant_operands == ("b",) and ProblemSpec(8, 8, 8).dequant_operands == ()
    with pytest.raises(TapError, match="k_block is required"):
        Tap("dequant_b", (0, 0), torch.zeros(4, 4, dtype=torch.float16))


def test_packed_rows_of_the_dtype_table():
    for name in PACKED:
        d = QUANT_TYPES[name]
        assert (d.itemsize, d.value_bits, d.per_item, d.torch) == (1, 4, 2, torch.uint8), name
    assert (ALL_TYPES["int4"].lowest, ALL_TYPES["int4"].max_finite) == (-8.0, 7.0)
    assert (ALL_TYPES["uint4"].lowest, ALL_TYPES["uint4"].max_finite) == (0.0, 15.0)
    assert ALL_TYPES["fp4_e2m1"].max_finite == max(dq._FP4)
    assert ALL_TYPES["int8"].per_item == 1 and ALL_TYPES["e8m0"].torch == torch.uint8


@pytest.mark.parametrize("kw,field,allowed", [
    (dict(b_packing=None), "b_packing", "packed two to a byte"),
    (dict(b_packing="k_pairs_interleaved"), "b_packing", "k_pairs_low_first, k_pairs_high_first"),
    (dict(b_scales=None), "b_scales", "fp16, bf16, fp32, e4m3, e8m0"),
    (dict(b_group_size=48), "b_group_size", "divides K = 128"),
    (dict(b_group_size=3, tile=Tile(16, 32, 2), b_packing="k_pairs_low_first"), "b_group_size", "divides K"),
    (dict(a_dtype="fp32"), "a_dtype", "fp16, bf16"),
    (dict(b_zeros="half"), "b_zeros", "none, int, float"),
    (dict(b_dtype="fp4_e2m1", b_scales="e8m0", b_zeros="int"), "b_zeros", "integer B"),
    (dict(b_scales="e8m0"), "b_scales", "micro-scaling scales of a float B"),
    (dict(b_dtype="fp4_e2m1", b_scales="e8m0", b_zeros="float"), "b_zeros", "integer B"),
    (dict(b_dtype="uint4", b_scales="e4m3", b_zeros="none"), "b_scales", "not of uint4"),
    (dict(b_dtype="int8", b_packing="k_pairs_low_first"), "b_packing", "one value per byte"),
    (dict(dequant_precision="fp64"), "dequant_precision", "fp32, operand"),
    (dict(tile=Tile(16, 32, 48)), "k", "multiple of tile.bk"),
    (dict(oob_fill="nan"), "oob_fill", "no NaN"),
])
def test_every_quant_field_is_checked_by_name(kw, field, allowed):
    with pytest.raises(SpecError) as e:
        w4(**kw)
    assert str(e.value).startswith(f"{field}=") and allowed in str(e.value), str(e.value)


def test_k8_interleaved_needs_whole_words():
    assert w4(b_packing="k8_interleaved").dequant_config.packing == "k8_interleaved"
    for kw, field in ((dict(tile=Tile(16, 32, 4)), "tile.bk"), (dict(b_group_size=4, tile=Tile(16, 32, 8)),
                                                                "b_group_size")):
        with pytest.raises(SpecError) as e:
            w4(b_packing="k8_interleaved", **kw)
        assert str(e.value).startswith(f"{field}=") and "multiple of 8" in str(e.value), str(e.value)
    with pytest.raises(SpecError, match=r"^k=36 .*K must be a multiple of 8"):
        ProblemSpec(16, 64, 36, **{**W4, "b_packing": "k8_interleaved", "b_group_size": None, "tile": Tile(16, 32, 4)})
    assert w4(b_group_size=4, tile=Tile(16, 32, 8)).quant_groups == 32  # pairs: an even group is enough
    ops = make_operands(w4(b_packing="k8_interleaved"), "index")
    plain = make_operands(w4(), "index")
    assert ops.b.shape == plain.b.shape and not torch.equal(ops.b, plain.b)
    cfg = w4(b_packing="k8_interleaved").dequant_config
    assert torch.equal(dq.unpack_host(ops.b, cfg), dq.unpack_host(plain.b, w4().dequant_config))


def test_quant_fields_need_a_quantised_b():
    for kw in (dict(b_group_size=32), dict(b_packing="k_pairs_low_first"), dict(b_scales="fp16"),
               dict(dequant_precision="fp32"), dict(b_zeros="int")):
        with pytest.raises(SpecError, match="only a quantised B"):
            ProblemSpec(16, 64, 128, **kw)
    with pytest.raises(SpecError, match="a_dtype='int4' is not allowed"):
        ProblemSpec(16, 64, 128, b_dtype="int4", a_dtype="int4")  # int4 is a stored B type, no A type
    assert w4().quantised_b and w4().mma_b_dtype == "fp16" and w4().quant_groups == 4
    assert w4(b_group_size=None).quant_groups == 1 and w4(b_group_size=None).group_k == 128


def test_stored_operand_shapes_and_dtypes():
    spec = w4()
    sh = expected_shapes(spec)
    assert sh["b"] == (64, 64) and sh["b_scales"] == (4, 64) and sh["b_zeros"] == (4, 64)
    assert expected_shapes(w4(b_zeros="none"))["b_zeros"] is None
    assert expected_shapes(w4(b_dtype="int8", b_packing=None))["b"] == (128, 64)
    ops = make_operands(spec, "index")
    check_operands(spec, ops)
    assert ops.b.dtype == torch.uint8 and ops.b_zeros.dtype == torch.int8 and ops.b_scales.dtype == torch.float16
    bad = Operands(a=ops.a, b=ops.b, b_scales=ops.b_scales)
    with pytest.raises(InputError, match="'b_zeros' is missing"):
        check_operands(spec, bad)
    with pytest.raises(InputError, match="ktag"):
        make_operands(spec, "ktag")


def test_ones_ladder_dequantises_to_ones():
    for kw in (dict(), dict(b_dtype="fp4_e2m1", b_scales="e8m0", b_zeros="none"),
               dict(b_dtype="uint4", b_zeros="float", b_scales="bf16"), dict(b_dtype="e5m2", b_packing=None,
                                                                             b_zeros="none")):
        spec = w4(**kw)
        ops = make_operands(spec, "ones")
        w = dq.dequant_operand_host(ops.b, ops.b_scales, ops.b_zeros, spec.dequant_config)
        assert bool((w.float() == 1).all()), kw


def test_problem_and_operands_round_trip_through_the_dump(tmp_path):
    spec = w4(b_dtype="uint4", b_zeros="float", b_scales="bf16", b_packing="k_pairs_high_first",
              dequant_precision="operand")
    assert ProblemSpec.from_json(spec.to_json()) == spec
    assert "b_packing" not in ProblemSpec(8, 8, 8).to_json()  # an older recording reads the same
    ops = make_operands(spec, "random", 5)
    rec = Recording(spec=spec, operands=ops, output=torch.zeros(16, 64, dtype=torch.float16),
                    provenance=Provenance("random", 5))
    path = str(tmp_path / "w4.safetensors")
    rec.save(path)
    back = Recording.load(path)
    assert back.spec == spec
    got, want = back.operands.named(), ops.named()
    assert set(got) == set(want) == {"a", "b", "b_scales", "b_zeros"}
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8))
               for k in want)


def test_a_dequant_tap_must_hold_the_mma_operand():
    spec = w4()
    ops = make_operands(spec, "ones")
    out = torch.zeros(16, 64, dtype=torch.float16)
    good = Tap("dequant_b", (0, 0), torch.zeros(32, 32, dtype=torch.float16), k_block=0)
    Recording(spec=spec, operands=ops, output=out, provenance=Provenance("ones"), taps=(good,)).validate()
    for tap, why in ((Tap("dequant_b", (0, 0), torch.zeros(32, 32, dtype=torch.bfloat16), k_block=0), "MMA's operand"),
                     (Tap("load_b", (0, 0), torch.zeros(32, 32, dtype=torch.uint8), k_block=0),
                      r"expected \[16, 32\]")):
        with pytest.raises(RecordingError, match=why):
            Recording(spec=spec, operands=ops, output=out, provenance=Provenance("ones"), taps=(tap,)).validate()
    plain = ProblemSpec(16, 64, 128, a_dtype="fp16", b_dtype="fp16", out_dtype="fp16", tile=Tile(16, 32, 32))
    with pytest.raises(RecordingError, match="not quantised"):
        Recording(spec=plain, operands=make_operands(plain, "ones"), output=out, provenance=Provenance("ones"),
                  taps=(good,)).validate()


def test_case_file_carries_the_quant_fields(tmp_path):
    assert_case_file_carries_the_quant_fields(
        tmp_path, "b", '[problem]\nm = 16\nn = 64\nk = 128\na_dtype = "fp16"\nb_dtype = "int4"\nout_dtype = "fp16"\n'
        'b_packing = "k_pairs_low_first"\nb_group_size = 32\nb_scales = "fp16"\nb_zeros = "int"\n'
        'tile = [16, 32, 32]\n[launch]\ngrid = [1, 1, 1]\nblock = [32, 1, 1]\n'
        'args = ["a", "b", "b_scales", "b_zeros", "d", "m", "n", "k"]\n', w4())


def test_quantised_taps_round_trip_through_the_dump(tmp_path):
    from oracle.run.simulate import simulate

    spec = w4()
    rec = simulate(spec, make_operands(spec, "index"), Provenance("index"), tap_tiles=[(0, 1)])
    kinds = {(t.stage, t.values.dtype, tuple(t.values.shape)) for t in rec.taps if t.stage in ("load_b", "dequant_b")}
    assert kinds == {("load_b", torch.uint8, (16, 32)), ("dequant_b", torch.float16, (32, 32))}
    assert not any(t.stage == "descriptor_b" for t in rec.taps)  # a packed B is loaded without a TMA image
    path = str(tmp_path / "taps.safetensors")
    rec.save(path)
    back = Recording.load(path)
    assert len(back.taps) == len(rec.taps)
    for a, b in zip(sorted(rec.taps, key=lambda t: t.key), sorted(back.taps, key=lambda t: t.key)):
        assert a.key == b.key and a.values.dtype == b.values.dtype and torch.equal(a.values, b.values)

import pytest

from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile


def test_defaults_are_valid_and_round_trip():
    spec = ProblemSpec(m=100, n=200, k=300, swizzle_a=128, swizzle_b=128)
    assert ProblemSpec.from_json(spec.to_json()) == spec
    assert spec.tiles_m == 1 and spec.tiles_n == 2 and spec.k_blocks == 5


def test_block_scaled_fp8_round_trip():
    spec = ProblemSpec(m=256, n=256, k=512, a_dtype="e4m3", b_dtype="e4m3", tile=Tile(128, 128, 128),
                       scale_a=Scale("block", (1, 128)), scale_b=Scale("block", (128, 128)), promotion_interval=128)
    back = ProblemSpec.from_json(spec.to_json())
    assert back == spec and back.scale_a.block == (1, 128)


@pytest.mark.parametrize("kwargs, field", [
    (dict(m=0), "m"),
    (dict(a_dtype="fp64"), "a_dtype"),
    (dict(a_dtype="fp16", b_dtype="bf16"), "b_dtype"),
    (dict(a_dtype="e4m3", b_dtype="bf16"), "b_dtype"),
    (dict(acc_dtype="fp16"), "acc_dtype"),
    (dict(a_dtype="int8", b_dtype="int8"), "acc_dtype"),
    (dict(a_major="transposed"), "a_major"),
    (dict(swizzle_a=96), "swizzle_a"),
    (dict(swizzle_a=128, tile=Tile(64, 64, 32)), "swizzle_a"),  # 32 bf16 = 64 bytes < 128-byte span
    (dict(oob_fill="garbage"), "oob_fill"),
    (dict(promotion_interval=128), "promotion_interval"),
    (dict(beta=1.0), "c_dtype"),
    (dict(bias="diagonal"), "bias"),
    (dict(activation="gelu"), "activation"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(scale_a=Scale("col")), "scale_a.kind"),
    (dict(scale_b=Scale("row")), "scale_b.kind"),
    (dict(scale_a=Scale("block", (1, 128))), "scale_a.kind"),
    (dict(out_dtype="int32"), "out_dtype"),
])
def test_invalid_fields_are_named(kwargs, field):
    base = dict(m=64, n=64, k=64, tile=Tile(64, 64, 64))
    base.update(kwargs)
    with pytest.raises(SpecError) as e:
        ProblemSpec(**base)
    assert str(e.value).startswith(f"{field}=")


def test_tile_sizes_are_checked():
    with pytest.raises(SpecError, match=r"^tile\.bm=0"):
        Tile(0, 64, 64)


def test_block_scales_need_matching_k_group():
    with pytest.raises(SpecError, match="scale_b.block"):
        ProblemSpec(m=128, n=128, k=256, a_dtype="e4m3", b_dtype="e4m3", tile=Tile(128, 128, 128),
                    scale_a=Scale("block", (1, 128)), scale_b=Scale("block", (128, 256)))


def test_from_json_rejects_unknown_fields():
    with pytest.raises(SpecError, match="unknown problem field"):
        ProblemSpec.from_json({"m": 1, "n": 1, "k": 1, "flavour": "vanilla"})
    with pytest.raises(SpecError, match="tile"):
        ProblemSpec.from_json({"m": 1, "n": 1, "k": 1, "tile": [64, 64]})


def test_numerics_fields_round_trip_and_old_json_keeps_its_meaning():
    import json

    from oracle.problem.spec import ProblemSpec, SpecError

    for kw in (dict(acc_model="any"), dict(a_dtype="fp32", b_dtype="fp32", acc_model="tf32", out_dtype="fp32"),
               dict(a_dtype="e4m3", b_dtype="e4m3", acc_model="fp8_promoted", promotion_interval=64),
               dict(reduction="bf16", reduction_chunk=1024), dict(reduction="fp32"),
               dict(activation="gelu_tanh", activation_impl="fast")):
        s = ProblemSpec(m=8, n=8, k=64, **kw)
        assert ProblemSpec.from_json(json.loads(json.dumps(s.to_json()))) == s
    old = ProblemSpec(m=8, n=8, k=64, a_dtype="e4m3", b_dtype="e4m3", promotion_interval=64).to_json()
    for f in ("acc_model", "reduction", "reduction_chunk", "activation_impl"):
        del old[f]
    s = ProblemSpec.from_json(old)
    assert s.acc_model is None and s.resolved_acc_model == "fp8_promoted"
    assert ProblemSpec(m=8, n=8, k=64).resolved_acc_model == "fp32"
    assert ProblemSpec(m=8, n=8, k=64, a_dtype="int8", b_dtype="int8", acc_dtype="int32",
                       out_dtype="int32").resolved_acc_model == "int32"
    bad = [(dict(acc_model="fp8_fast"), "acc_model='fp8_fast' is not allowed: fp8_fast describes e4m3, e5m2"),
           (dict(a_dtype="e4m3", b_dtype="e4m3", acc_model="fp8_promoted"), "promotion_interval=None"),
           (dict(a_dtype="e4m3", b_dtype="e4m3", acc_model="fp8_fast", promotion_interval=32),
            "a promotion_interval describes fp8_promoted"),
           (dict(reduction="bf16"), "reduction_chunk=None"),
           (dict(reduction="fp16", reduction_chunk=100), "reduction_chunk=100"),
           (dict(reduction_chunk=128), "a chunk needs a reduction"),
           (dict(reduction="int8"), "reduction='int8'"),
           (dict(activation_impl="fast"), "approximate implementations are modelled for gelu_tanh and silu"),
           (dict(acc_model="tf32"), "tf32 describes fp32 operands")]
    for kw, msg in bad:
        with pytest.raises(SpecError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            ProblemSpec(m=8, n=8, k=64, **kw)

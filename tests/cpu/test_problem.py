import pytest

from oracle.problem import ProblemSpec, Scale, SpecError, Tile


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

"""TensorMapSpec rules, the GEMM operand maps and the swizzle formula, all without a GPU."""

import pytest

from harness import tensormap as tm
from harness.tensormap import TensorMapError, TensorMapSpec, operand_tensormap


def spec(**over):
    base = dict(dtype="bf16", global_dims=(256, 128), global_strides=(512,), box_dims=(64, 64),
                swizzle=128, oob_fill="zero")
    base.update(over)
    return TensorMapSpec(**base)


def test_a_valid_spec_fills_defaults():
    s = spec()
    assert s.element_strides == (1, 1)
    assert s.rank == 2 and s.itemsize == 2
    assert s.box_bytes == 64 * 64 * 2
    assert s.extent_bytes == 127 * 512 + 256 * 2


BROKEN = [
    ("dtype", dict(dtype="fp64")),
    ("rank", dict(global_dims=(), global_strides=(), box_dims=())),
    ("rank", dict(global_dims=(16,), global_strides=(), box_dims=(16,), element_strides=(1,))),
    ("rank", dict(global_dims=(2,) * 6, global_strides=(16,) * 5, box_dims=(8,) * 6)),
    ("field_count", dict(global_strides=(512, 1024))),
    ("field_count", dict(box_dims=(64,))),
    ("field_count", dict(element_strides=(1, 1, 1))),
    ("integer", dict(box_dims=(64.0, 64))),
    ("integer", dict(global_dims=(True, 128))),
    ("global_dim_range", dict(global_dims=(0, 128))),
    ("global_dim_range", dict(global_dims=(256, 2**32 + 1))),
    ("stride_multiple_16", dict(global_strides=(520,))),
    ("stride_max", dict(global_strides=(2**40,))),
    ("box_dim_range", dict(box_dims=(64, 257))),
    ("box_dim_range", dict(box_dims=(64, 0))),
    ("box_inner_bytes_multiple_16", dict(box_dims=(4, 64), swizzle=0)),
    ("box_inner_within_swizzle", dict(box_dims=(128, 64), swizzle=128)),
    ("box_inner_within_swizzle", dict(box_dims=(32, 64), swizzle=32)),
    ("element_stride_range", dict(element_strides=(1, 9))),
    ("element_stride_range", dict(element_strides=(0, 1))),
    ("swizzle", dict(swizzle=256)),
    ("oob_fill", dict(oob_fill="ones")),
    ("oob_nan_needs_float", dict(dtype="e4m3", box_dims=(128, 64), oob_fill="nan")),
    ("oob_nan_needs_float", dict(dtype="int32", box_dims=(32, 64), oob_fill="nan")),
    ("interleave", dict(interleave="32b")),
    ("l2_promotion", dict(l2_promotion=512)),
]


@pytest.mark.parametrize("rule,over", BROKEN, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BROKEN)])
def test_each_rule_is_named(rule, over):
    with pytest.raises(TensorMapError) as info:
        spec(**over)
    assert rule in info.value.rules, info.value
    assert f"[{rule}]" in str(info.value)
    assert rule in tm.RULES


def test_all_broken_rules_are_reported_first_one_first():
    with pytest.raises(TensorMapError) as info:
        spec(global_strides=(520,), box_dims=(64, 300))
    assert info.value.rules[:2] == ("stride_multiple_16", "box_dim_range")
    assert info.value.rule == "stride_multiple_16"


def test_nan_fill_is_fine_for_float_maps():
    for dt in ("fp32", "fp16", "bf16"):
        itemsize = tm.MAP_DTYPES[dt][0]
        spec(dtype=dt, box_dims=(128 // itemsize, 8), oob_fill="nan")


def test_limits_are_inclusive():
    spec(global_dims=(2**32, 1), global_strides=(2**40 - 16,), box_dims=(64, 256),
         element_strides=(8, 8))
    spec(global_dims=(16, 1), global_strides=(16,), box_dims=(16, 1), swizzle=0, dtype="int8")


def test_misaligned_address_is_refused_before_the_driver():
    with pytest.raises(TensorMapError) as info:
        tm.encode(spec(), 0x1000008)
    assert info.value.rule == "global_address_alignment"


def test_driver_args_use_the_cuda_enum_values():
    args = spec(dtype="e4m3", box_dims=(128, 64), l2_promotion=128).driver_args(0x10000)
    assert args["data_type"] == 0  # UINT8
    assert args["swizzle"] == 3 and args["l2_promotion"] == 2 and args["oob_fill"] == 0
    assert args["interleave"] == 0 and args["global_address"] == 0x10000
    assert spec(dtype="bf16").driver_args(0)["data_type"] == 9
    assert spec(dtype="fp16").driver_args(0)["data_type"] == 6
    assert spec(dtype="fp32", box_dims=(32, 8)).driver_args(0)["data_type"] == 7
    assert spec(dtype="int32", box_dims=(32, 8)).driver_args(0)["data_type"] == 3


def test_enum_values_match_cuda_bindings():
    drv = pytest.importorskip("cuda.bindings.driver")
    want = {"fp32": "FLOAT32", "fp16": "FLOAT16", "bf16": "BFLOAT16", "int32": "INT32"}  # the rest move bytes
    for name, (_, map_type, _) in tm.MAP_DTYPES.items():
        enum = getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{want.get(name, 'UINT8')}")
        assert int(enum) == map_type, name
    assert int(drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B) == tm.SWIZZLE_ENUM[128]
    assert int(drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B) == tm.SWIZZLE_ENUM[32]
    assert int(drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B) == tm.L2_PROMOTION_ENUM[256]
    assert int(drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) == tm.OOB_FILL_ENUM["nan"]


def test_map_dtypes_are_project_dtypes_with_the_same_itemsize():
    from kernels_ref.dtypes import DTYPES

    for name, (itemsize, _, _) in tm.MAP_DTYPES.items():
        if name == "uint8":
            continue
        assert name in DTYPES
        assert DTYPES[name].itemsize == itemsize


def test_dict_round_trip_and_descriptor_record():
    s = spec(oob_fill="nan")
    assert TensorMapSpec.from_dict(s.to_dict()) == s
    rec = s.to_descriptor_record("a")
    assert rec.stage == "descriptor_a"
    assert (rec.global_dims, rec.global_strides, rec.box_dims, rec.swizzle, rec.oob_fill) == \
        (s.global_dims, s.global_strides, s.box_dims, 128, "nan")


# --------------------------------------------------------------------------- operand maps

M, N, K = 300, 200, 512


@pytest.mark.parametrize("dtype,bk,want_inner,boxes", [("bf16", 64, 64, 1), ("bf16", 128, 64, 2),
                                                        ("e4m3", 128, 128, 1), ("fp32", 64, 32, 2)])
def test_a_row_major_is_k_major(dtype, bk, want_inner, boxes):
    s = operand_tensormap("a", "row", M, K, dtype, block_mn=128, block_k=bk, swizzle=128)
    item = tm.MAP_DTYPES[dtype][0]
    assert s.global_dims == (K, M)
    assert s.global_strides == (K * item,)
    assert s.box_dims == (want_inner, 128)
    assert tm.inner_boxes(s, bk) == boxes


def test_the_four_layouts():
    m = 320  # M contiguous: its row stride M * 2 bytes must be a multiple of 16
    a_col = operand_tensormap("a", "col", m, K, "bf16", block_mn=128, block_k=64, swizzle=128)
    assert a_col.global_dims == (m, K) and a_col.box_dims == (64, 64) and a_col.global_strides == (m * 2,)
    assert tm.inner_boxes(a_col, 128) == 2
    b_row = operand_tensormap("b", "row", K, N, "bf16", block_mn=128, block_k=64, swizzle=64)
    assert b_row.global_dims == (N, K) and b_row.box_dims == (32, 64) and b_row.global_strides == (N * 2,)
    b_col = operand_tensormap("b", "col", K, N, "e4m3", block_mn=256, block_k=128, swizzle=128)
    assert b_col.global_dims == (K, N) and b_col.box_dims == (128, 256) and b_col.global_strides == (K,)


def test_no_swizzle_takes_the_whole_tile_and_ld_pads_rows():
    s = operand_tensormap("a", "row", M, K, "bf16", block_mn=64, block_k=128, swizzle=0, ld=K + 8)
    assert s.box_dims == (128, 64) and s.swizzle == 0 and s.global_strides == ((K + 8) * 2,)
    with pytest.raises(ValueError, match="ld"):
        operand_tensormap("a", "row", M, K, "bf16", block_mn=64, block_k=64, ld=K - 1)


def test_operand_map_errors_name_the_rule():
    with pytest.raises(TensorMapError) as info:  # 300 * 2 bytes: row stride not a multiple of 16
        operand_tensormap("a", "row", 64, 300, "bf16", block_mn=64, block_k=64)
    assert info.value.rule == "stride_multiple_16"
    with pytest.raises(TensorMapError) as info:
        operand_tensormap("a", "row", 64, 512, "bf16", block_mn=512, block_k=64)
    assert info.value.rule == "box_dim_range"
    with pytest.raises(ValueError, match="operand"):
        operand_tensormap("c", "row", 64, 512, "bf16", block_mn=64, block_k=64)
    with pytest.raises(ValueError, match="multiple"):
        operand_tensormap("a", "row", 64, 512, "bf16", block_mn=64, block_k=96)


def test_swizzle_offset_formula():
    assert all(tm.swizzle_offset(a, 0) == a for a in range(2048))
    for sw, mask in ((32, 1), (64, 3), (128, 7)):
        image = [tm.swizzle_offset(a, sw) for a in range(1024)]
        assert sorted(image) == list(range(1024))  # a permutation of the 1024-byte atom
        assert all(tm.swizzle_offset(a, sw) % 16 == a % 16 for a in range(1024))  # 16-byte chunks move whole
    # 128B: row r of 128 bytes has its 16-byte chunk c stored at chunk c ^ (r % 8).
    assert tm.swizzle_offset(3 * 128 + 5 * 16 + 7, 128) == 3 * 128 + (5 ^ 3) * 16 + 7

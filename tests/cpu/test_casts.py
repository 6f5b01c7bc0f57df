"""Every output cast of the epilogue, Triton reference (interpreter here, the GPU in
tests/gpu/test_ref_gpu.py) against its float64 host spec, bit for bit, for every input class:
values past the range, NaN (either sign, any payload), +-inf, -0.0, subnormals of fp32 and of the
target, ties on both sides of an even neighbour, and the edges of each format. The int32 cast
is also held to what a CUDA kernel's __float2int_rn does (PTX cvt.rni.s32.f32: nearest even,
clamped to the range, NaN -> 0), written out value by value. (int8 is an operand type only: no
reference casts to it.)"""

import pytest
import torch

from cast_inputs import cast_inputs, int32_expectations, same_bits
from kernels_ref import epilogue as E

CASES = [(out, sat) for out in E.OUT_DTYPES for sat in (False, True)]


@pytest.mark.parametrize("out,sat", CASES, ids=[f"{o}-{'sat' if s else 'nosat'}" for o, s in CASES])
def test_cast_matches_host_bit_for_bit(out, sat):
    x = cast_inputs(out)
    got = E.apply_cast(x, out, sat)
    want = E.apply_cast_host(x, out, sat)
    assert got.dtype == want.dtype
    bad = same_bits(got, want)
    assert not bad, f"{out} saturate={sat}: " + "; ".join(
        f"x={x.reshape(-1)[i].item()!r} ({x.reshape(-1).view(torch.int32)[i].item() & 0xFFFFFFFF:#010x}): "
        f"got {g:#x}, want {w:#x}" for i, g, w in bad[:8])


def test_int32_cast_is_cvt_rni():
    """The host spec itself, against values written out by hand (so the spec cannot drift with it)."""
    xs, want = int32_expectations()
    x = torch.tensor(xs, dtype=torch.float32).reshape(1, -1)
    for sat in (False, True):
        assert E.apply_cast_host(x, "int32", sat).reshape(-1).tolist() == want
        assert E.apply_cast(x, "int32", sat).reshape(-1).tolist() == want


def test_float_nan_and_overflow_rules():
    """The float rules the spec states, spelled out: canonical NaN, e4m3 overflow NaN, infinity
    for the others, saturation to the largest finite value, the sign of zero kept."""
    x = torch.tensor([[float("nan"), -float("nan"), 1e30, -1e30, -0.0, 464.0, 465.0]], dtype=torch.float32)
    e4 = E.apply_cast(x, "e4m3").view(torch.uint8).reshape(-1).tolist()
    assert e4 == [0x7F, 0x7F, 0x7F, 0x7F, 0x80, 0x7E, 0x7F]  # 464 is the tie: to even, 448 (0x7E)
    e4s = E.apply_cast(x, "e4m3", True).view(torch.uint8).reshape(-1).tolist()
    assert e4s == [0x7F, 0x7F, 0x7E, 0xFE, 0x80, 0x7E, 0x7E]
    f16 = E.apply_cast(x, "fp16").view(torch.int16).reshape(-1).tolist()
    assert f16[:5] == [0x7E00, 0x7E00, 0x7C00, -0x400, -0x8000]
    f32 = E.apply_cast(x, "fp32").view(torch.int32).reshape(-1).tolist()
    assert f32[:2] == [0x7FC00000, 0x7FC00000]


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
def test_fast_gemm_rounds_its_output_to_nearest_even(out):
    """gemm_fast under the interpreter rounds its fp32 result as the GPU's cvt.rn does (the
    interpreter's own fp32 -> bf16 conversion truncates): its output in `out` is the RNE rounding
    of its own fp32 output, bit for bit."""
    from kernels_ref.gemm_fast import GemmConfig, gemm_fast

    g = torch.Generator().manual_seed(3)
    a = torch.randn(40, 64, generator=g).to(torch.bfloat16)
    b = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    cfg = GemmConfig(16, 32, 16, 2, 2, 4, False, True)
    d32 = gemm_fast(a, b, config=cfg, out_dtype=torch.float32)
    d = gemm_fast(a, b, config=cfg, out_dtype=out)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[out]
    assert not same_bits(d, E.apply_cast_host(d32, name))
    assert not same_bits(d32.to(out), d)  # torch's RNE conversion agrees

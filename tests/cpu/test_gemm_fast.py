"""The fast TMA-persistent GEMM under the triton interpreter (which runs host-side tensor
descriptors): ragged shapes, several programs per tile set, split epilogue, scales, output
dtypes, and the checks that refuse what TMA cannot do. Speed and the GPU's own fp8 accumulation
are the GPU tier's business (tests/gpu/test_gemm_fast_gpu.py).

Bound: under the interpreter the tiles are widened to fp32, products are exact and each element
is a sum of K fp32 terms, so |d - spec| <= 2 u_out |spec| + 2 K 2^-24 S (S = sum_k |a||b|), where
u_out is the unit roundoff of the output type and spec the float64 result. The factor 2 (one
ulp, not half) is the interpreter's: it converts fp32 to bf16 by truncation, where the GPU
rounds to nearest even."""

import pytest
import torch

from kernels_ref.gemm_fast import (CANDIDATES, DEFAULTS, GemmConfig, GemmFastError, check_supported, error_bound,
                                   error_report, gemm_fast, gemm_fast_host)

U_OUT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


def _operands(dtype, m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g)
    if dtype == torch.float8_e4m3fn:
        a, b = a * 4, b * 4  # use the fp8 exponent range, not just values near 1
    return a.to(dtype), b.to(dtype)


def _check(d, a, b, out_dtype=torch.bfloat16, scale_a=None, scale_b=None):
    spec = a.double() @ b.double().t()
    s = 1.0
    for x in (scale_a, scale_b):
        if x is not None:
            s *= float(x)
    spec = spec * s
    S = (a.double().abs() @ b.double().abs().t()) * abs(s)
    bound = 2 * U_OUT[out_dtype] * spec.abs() + 2 * a.shape[1] * 2.0 ** -24 * S
    err = (d.double() - spec).abs()
    assert d.dtype == out_dtype and d.shape == spec.shape
    assert torch.isfinite(d.double()).all()
    worst = (err / bound.clamp_min(1e-30)).max().item()
    assert worst <= 1.0, f"worst err/bound {worst:.3g}"
    assert spec.abs().max() > 0  # never pass on a trivially zero result


SMALL = {
    torch.bfloat16: GemmConfig(16, 32, 16, 2, 2, 4, False, True),
    torch.float8_e4m3fn: GemmConfig(16, 32, 32, 2, 2, 4, False, True),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("mnk", [(70, 48, 96), (33, 72, 144), (16, 32, 32), (1, 8, 16)])
def test_matches_the_float64_spec_on_ragged_shapes(dtype, mnk):
    m, n, k = mnk
    a, b = _operands(dtype, m, n, k, seed=m * 7 + n)
    d = gemm_fast(a, b, config=SMALL[dtype])
    _check(d, a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_split_epilogue_grouped_order_and_few_programs_cover_every_tile(dtype):
    a, b = _operands(dtype, 100, 96, 64, seed=5)
    cfg = GemmConfig(16, 32, 32, 3, 2, 4, True, True)
    out = torch.full((100, 96), float("nan"), dtype=torch.bfloat16)  # poisoned: a missed tile stays NaN
    for programs in (1, 3, 5, 100):
        out.fill_(float("nan"))
        d = gemm_fast(a, b, config=cfg, programs=programs, out=out)
        assert d is out
        _check(d, a, b)


def test_unflattened_loop_gives_the_same_bits():
    a, b = _operands(torch.bfloat16, 40, 64, 48, seed=9)
    flat = gemm_fast(a, b, config=GemmConfig(16, 32, 16, 2, 2, 4, False, True))
    nested = gemm_fast(a, b, config=GemmConfig(16, 32, 16, 2, 2, 4, False, False))
    assert torch.equal(flat, nested)


@pytest.mark.parametrize("which", ["both", "a", "b"])
def test_per_tensor_scales(which):
    a, b = _operands(torch.float8_e4m3fn, 48, 64, 64, seed=11)
    sa = torch.tensor([0.375]) if which in ("both", "a") else None
    sb = torch.tensor([2.5]) if which in ("both", "b") else None
    d = gemm_fast(a, b, scale_a=sa, scale_b=sb, config=SMALL[torch.float8_e4m3fn])
    _check(d, a, b, scale_a=sa, scale_b=sb)
    host = gemm_fast_host(a, b, scale_a=sa, scale_b=sb)
    assert host.dtype == torch.bfloat16 and (host.double() - d.double()).abs().max() <= \
        2.0 ** -7 * host.double().abs().max()


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_other_output_dtypes(out_dtype):
    a, b = _operands(torch.bfloat16, 32, 64, 48, seed=13)
    d = gemm_fast(a, b, out_dtype=out_dtype, config=SMALL[torch.bfloat16])
    _check(d, a, b, out_dtype=out_dtype)


def test_promoted_fp8_accumulation_runs_under_the_interpreter():
    a, b = _operands(torch.float8_e4m3fn, 32, 32, 96, seed=17)
    d = gemm_fast(a, b, config=SMALL[torch.float8_e4m3fn], fp8_acc="promoted")
    _check(d, a, b)


def test_check_supported_gives_reasons():
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    assert check_supported(bf, bf, 4096, 4096, 4096, config=DEFAULTS["bf16"]) == []
    assert check_supported(f8, f8, 8192, 8192, 8192, config=DEFAULTS["e4m3"]) == []
    assert any("K a multiple of 8" in r for r in check_supported(bf, bf, 64, 64, 100))
    assert any("K a multiple of 16" in r for r in check_supported(f8, f8, 64, 64, 40))
    assert any("N a multiple of 8" in r for r in check_supported(bf, bf, 64, 60, 64))
    assert any("both must be bf16" in r for r in check_supported(bf, f8, 64, 64, 64))
    assert any("allowed:" in r for r in check_supported(torch.float16, torch.float16, 64, 64, 64))
    assert any("applies to float8_e4m3fn" in r for r in check_supported(bf, bf, 64, 64, 64, fp8_acc="promoted"))
    assert any("fp8_acc='slow'" in r for r in check_supported(f8, f8, 64, 64, 64, fp8_acc="slow"))
    huge = GemmConfig(256, 256, 128, 8, 4, 8)
    assert any("shared memory" in r for r in check_supported(bf, bf, 64, 64, 64, config=huge))
    assert any("M=0" in r for r in check_supported(bf, bf, 0, 64, 64))


def test_candidate_configs_fit_in_shared_memory():
    for name, dt in (("bf16", torch.bfloat16), ("e4m3", torch.float8_e4m3fn)):
        assert CANDIDATES[name][0] == DEFAULTS[name]
        for cfg in CANDIDATES[name]:
            assert check_supported(dt, dt, 8192, 8192, 8192, config=cfg) == [], cfg.label()


def test_operand_errors_are_named():
    a, b = _operands(torch.bfloat16, 32, 32, 64, seed=1)
    with pytest.raises(GemmFastError, match=r"b must be given as \[N, K\]"):
        gemm_fast(a, torch.randn(64, 48).to(torch.bfloat16))
    with pytest.raises(GemmFastError, match="a must be row-major"):
        gemm_fast(torch.randn(64, 32).to(torch.bfloat16).t(), b)
    with pytest.raises(GemmFastError, match="b must be 2-D"):
        gemm_fast(a, b[0])
    with pytest.raises(GemmFastError, match="one-element float32 tensor"):
        gemm_fast(a, b, scale_a=0.5)
    with pytest.raises(GemmFastError, match="config must be a GemmConfig"):
        gemm_fast(a, b, config={"block_m": 64})
    with pytest.raises(GemmFastError, match="out must be a"):
        gemm_fast(a, b, out=torch.empty(32, 32))
    with pytest.raises(GemmFastError, match="programs=0"):
        gemm_fast(a, b, config=SMALL[torch.bfloat16], programs=0)


@pytest.mark.parametrize("kw,msg", [
    (dict(block_m=96), "block_m=96"), (dict(group_m=0), "group_m=0"), (dict(num_stages=0), "num_stages=0"),
    (dict(num_warps=2), "num_warps=2"), (dict(epilogue_split=1), "epilogue_split=1"),
])
def test_config_errors_name_the_field(kw, msg):
    with pytest.raises(GemmFastError, match=msg):
        GemmConfig(**kw)


def test_error_report_passes_a_right_result_and_names_a_wrong_element():
    a, b = _operands(torch.bfloat16, 32, 64, 64, seed=21)
    d = gemm_fast(a, b, config=SMALL[torch.bfloat16], out_dtype=torch.float32)
    rep = error_report(d, a, b)
    assert rep.ok and rep.worst <= 1.0 and rep.normwise < 1e-6, rep.describe()
    bad = d.clone()
    bad[5, 40] += 1.0
    rep = error_report(bad, a, b)
    assert not rep.ok and rep.where == (5, 40) and "at (5, 40)" in rep.describe()
    zero_a = torch.zeros_like(a)
    assert not error_report(torch.zeros_like(d), zero_a, b).ok  # trivially zero never passes


def test_error_bound_table():
    assert error_bound(torch.bfloat16, 4096) == (2.0 ** -8, 4096 * 2.0 ** -23)
    assert error_bound(torch.float8_e4m3fn, 8192) == (2.0 ** -8, 2.0 ** -9)
    assert error_bound(torch.float8_e4m3fn, 128, torch.float32, "promoted") == \
        (2.0 ** -24, 2.0 ** -11 + 128 * 2.0 ** -23)
    with pytest.raises(GemmFastError, match="no error envelope"):
        error_bound(torch.float16, 64)

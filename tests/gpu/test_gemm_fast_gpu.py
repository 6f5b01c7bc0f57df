"""The fast TMA-persistent GEMM compiled for the H200 (triton 3.6 there): correctness against the
float64 product at 4096^3 bf16 and 8192^3 fp8 e4m3, every candidate config, ragged shapes, and
fp8 accumulation in both modes, with cuBLAS / cuBLASLt held to the same envelope.

Tolerances (kernels_ref.gemm_fast.error_bound; loose on purpose, documented there): per element
|D - exact| <= r |exact| + s S, S = |sa sb| sum_k |a||b|, r = 2^-8 (one bf16 rounding) and
s = K 2^-23 for bf16, 2^-9 for fp8 with fast accumulation (an empirical envelope that cuBLASLt's
fast accumulation must meet too), 2^-11 + K 2^-23 for promoted fp8. Normwise: 2^-7 for bf16 and
promoted fp8, 2^-5 for fast fp8. Every test draws fresh random inputs with its own seed.
"""

import pytest
import torch

from kernels_ref.gemm_fast import CANDIDATES, GemmConfig, error_report, gemm_fast

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _operands(dtype, m, n, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randn(m, k, device=DEV, generator=g)
    b = torch.randn(n, k, device=DEV, generator=g)
    if dtype == torch.float8_e4m3fn:
        a, b = a * 2, b * 2
    return a.to(dtype), b.to(dtype)


def _scales(seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (0.5 + torch.rand((), device=DEV, generator=g), 0.5 + torch.rand((), device=DEV, generator=g))


def _assert_ok(rep, normwise, who):
    assert rep.ok, f"{who}: {rep.describe()}"
    assert rep.normwise <= normwise, f"{who}: {rep.describe()}"


def test_bf16_4096_cubed_against_float64_and_cublas():
    a, b = _operands(torch.bfloat16, 4096, 4096, 4096, seed=1)
    d = torch.full((4096, 4096), float("nan"), dtype=torch.bfloat16, device=DEV)  # poisoned
    gemm_fast(a, b, out=d)
    _assert_ok(error_report(d, a, b), 2.0 ** -7, "triton")
    ref = torch.matmul(a, b.t())
    _assert_ok(error_report(ref, a, b), 2.0 ** -7, "cublas")


def test_fp8_8192_cubed_fast_accumulation_against_float64_and_cublaslt():
    a, b = _operands(torch.float8_e4m3fn, 8192, 8192, 8192, seed=2)
    sa, sb = _scales(3)
    d = torch.full((8192, 8192), float("nan"), dtype=torch.bfloat16, device=DEV)
    gemm_fast(a, b, scale_a=sa, scale_b=sb, out=d)
    lt = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    rep_lt = error_report(lt, a, b, scale_a=sa, scale_b=sb, fp8_acc="fast")
    _assert_ok(rep_lt, 2.0 ** -5, "cuBLASLt fast accumulation (if this fails, the envelope is too tight)")
    _assert_ok(error_report(d, a, b, scale_a=sa, scale_b=sb, fp8_acc="fast"), 2.0 ** -5, "triton fast")


def test_fp8_promoted_accumulation_is_at_least_as_accurate_as_fast():
    a, b = _operands(torch.float8_e4m3fn, 2048, 2048, 8192, seed=4)
    sa, sb = _scales(5)
    fast = gemm_fast(a, b, scale_a=sa, scale_b=sb, fp8_acc="fast")
    prom = gemm_fast(a, b, scale_a=sa, scale_b=sb, fp8_acc="promoted")
    rf = error_report(fast, a, b, scale_a=sa, scale_b=sb, fp8_acc="fast")
    rp = error_report(prom, a, b, scale_a=sa, scale_b=sb, fp8_acc="promoted")
    _assert_ok(rf, 2.0 ** -5, "fast")
    _assert_ok(rp, 2.0 ** -7, "promoted")
    assert rp.normwise <= rf.normwise * 1.05, f"promoted {rp.describe()} / fast {rf.describe()}"
    lt = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=False)
    _assert_ok(error_report(lt, a, b, scale_a=sa, scale_b=sb, fp8_acc="promoted"), 2.0 ** -7, "cuBLASLt precise")


@pytest.mark.parametrize("name", ["bf16", "e4m3"])
def test_every_candidate_config_compiles_and_is_right(name):
    # at least one tile per SM and the benchmark's specialisation (sizes divisible by 16, scales
    # for fp8), so the kernels the benchmark compiled are reused from triton's cache
    dtype = torch.bfloat16 if name == "bf16" else torch.float8_e4m3fn
    a, b = _operands(dtype, 4096, 2048, 1024, seed=6)
    sa, sb = _scales(8) if name == "e4m3" else (None, None)
    failures = []
    for cfg in CANDIDATES[name]:
        d = torch.full((4096, 2048), float("nan"), dtype=torch.bfloat16, device=DEV)
        try:
            gemm_fast(a, b, config=cfg, out=d, scale_a=sa, scale_b=sb)
            torch.cuda.synchronize()
        except Exception as e:  # collect every failing config, not just the first
            failures.append(f"{cfg.label()}: {type(e).__name__}: {str(e)[:200]}")
            continue
        rep = error_report(d, a, b, scale_a=sa, scale_b=sb)
        if not rep.ok:
            failures.append(f"{cfg.label()}: {rep.describe()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("mnk", [(1000, 1000, 1024), (777, 520, 4096), (8, 4096, 512), (4100, 264, 96)])
def test_ragged_shapes_and_output_dtypes(dtype, mnk):
    m, n, k = mnk
    a, b = _operands(dtype, m, n, k, seed=m + n + k)
    outs = (torch.bfloat16, torch.float16, torch.float32) if mnk == (777, 520, 4096) else (torch.bfloat16,)
    for out_dtype in outs:
        d = torch.full((m, n), float("nan"), dtype=out_dtype, device=DEV)
        gemm_fast(a, b, out_dtype=out_dtype, out=d)
        rep = error_report(d, a, b)
        assert rep.ok, f"{out_dtype}: {rep.describe()}"


def test_few_programs_still_cover_every_tile():
    a, b = _operands(torch.bfloat16, 1024, 1024, 512, seed=7)
    for programs in (1, 7, 1000):
        d = torch.full((1024, 1024), float("nan"), dtype=torch.bfloat16, device=DEV)
        gemm_fast(a, b, programs=programs, config=GemmConfig(128, 128, 64, 4, 3, 8), out=d)
        assert error_report(d, a, b).ok, programs

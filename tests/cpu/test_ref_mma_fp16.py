"""MMA stage, the fp16 accumulator: rounded to fp16 after every MMA step (16 deep, 32 for fp8
operands), stagnating and overflowing as the register does, one step at a time and batched,
against the float64 host spec and an independent numpy statement of the rule."""

import numpy as np
import pytest
import torch

from kernels_ref import mma as X
from kernels_ref import mma_params
from kernels_ref.dtypes import DTYPES
from ref_checks import gen, ints, same  # tests/ is on sys.path


def _fp16_emulation(a, b, mma_k):
    """Independent statement of the fp16 accumulator: numpy fp16 register, fp32 per-step sums."""
    a64, b64 = a.double().numpy(), b.double().numpy()
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=np.float16)
    for k0 in range(0, a.shape[1], mma_k):
        s = (a64[:, k0:k0 + mma_k] @ b64[k0:k0 + mma_k, :]).astype(np.float32)
        acc = (acc.astype(np.float32) + s).astype(np.float16)
    return torch.from_numpy(acc.astype(np.float64))


def test_fp16_acc_rounds_after_every_mma_step():
    M, N, K = 16, 16, 1024
    a = torch.ones(M, K, dtype=torch.float16)
    b = torch.full((K, N), 1365 / 4096, dtype=torch.float16)  # 16 products sum to 5.33203125 exactly
    got = X.mma_accumulate(a, b, 16, 16, 64, acc="fp16")
    assert got.dtype == torch.float16
    want = _fp16_emulation(a, b, 16)
    assert same(got, want)
    assert same(X.mma_accumulate_host(a, b, 16, 16, 64, acc="fp16"), want)
    fp32 = X.mma_accumulate(a, b, 16, 16, 64, acc="fp32")
    assert float(fp32[0, 0]) == 64 * 5.33203125  # exact in fp32 ...
    assert float(got[0, 0]) != float(fp32[0, 0])  # ... but not in the fp16 register


def test_fp16_acc_stagnates_and_overflows():
    # acc 2048 + 1 rounds back to 2048 in fp16 (ties to even); fp32 would give 2049.
    a = torch.zeros(16, 16, dtype=torch.float16)
    a[:, 0] = 1
    b = torch.ones(16, 16, dtype=torch.float16)
    prev = torch.full((16, 16), 2048.0, dtype=torch.float16)
    assert torch.all(X.mma_step(prev, a, b, acc="fp16") == 2048)
    assert torch.all(X.mma_step(prev.float(), a, b, acc="fp32") == 2049)
    # overflow: 16 steps of 16 * 256 = 4096 reach 65536 > 65504 -> inf
    a = torch.ones(16, 256, dtype=torch.float16)
    b = torch.full((256, 16), 256.0, dtype=torch.float16)
    got = X.mma_accumulate(a, b, 16, 16, 64, acc="fp16")
    assert torch.isinf(got).all()
    assert torch.isinf(X.mma_accumulate_host(a, b, 16, 16, 64, acc="fp16")).all()


@pytest.mark.parametrize("ad,bd", [("e4m3", "e4m3"), ("e5m2", "e4m3")])
def test_fp16_acc_with_fp8_operands(ad, bd):
    M, N, K = 20, 18, 640
    a = (torch.randn(M, K, generator=gen(5)) * 3).to(DTYPES[ad].torch)
    b = (torch.randn(K, N, generator=gen(6)) * 3).to(DTYPES[bd].torch)
    got = X.mma_accumulate(a, b, 16, 16, 64, acc="fp16")
    want = _fp16_emulation(a, b, 32)  # fp8 MMA steps are 32 deep
    host = X.mma_accumulate_host(a, b, 16, 16, 64, acc="fp16")
    # fp8 products are exact in fp32 and 32 of them are exact here unless the exponents spread
    # far; a differing per-step fp32 sum can move the fp16 result by at most a few ulps.
    ulp = torch.clamp(want.abs(), min=2.0 ** -14) * 2.0 ** -10
    assert torch.all((got.double() - want).abs() <= 2 * ulp)
    assert torch.all((host - want).abs() <= 2 * ulp)
    assert (got.double() == want).float().mean() > 0.95


def test_mma_step_batched_and_host():
    T0, T1, BM, BN, BK = 2, 3, 16, 24, 64
    a = (torch.randn(T0, T1, BM, BK, generator=gen(21)) * 4).to(torch.float16)
    b = (torch.randn(T0, T1, BK, BN, generator=gen(22)) * 4).to(torch.float16)
    prev = (torch.randn(T0, T1, BM, BN, generator=gen(23)) * 100).to(torch.float16)
    got = X.mma_step(prev, a, b, acc="fp16")
    assert got.shape == (T0, T1, BM, BN) and got.dtype == torch.float16
    host = X.mma_step_host(prev, a, b, acc="fp16")
    # a different fp32 order inside one MMA step can flip one fp16 rounding of an intermediate
    # accumulator, whose size is bounded by |prev| + sum |a||b|
    scale = prev.double().abs() + a.double().abs() @ b.double().abs()
    assert torch.all((got.double() - host).abs() <= (BK // 16) * 2.0 ** -10 * scale)
    assert (got.double() == host).float().mean() > 0.98
    zero = X.mma_step(torch.zeros_like(prev), a, b, acc="fp16")
    assert torch.equal(X.mma_step(None, a, b, acc="fp16"), zero)
    one = X.mma_step(prev[1, 2], a[1, 2], b[1, 2], acc="fp16")
    assert torch.equal(one, got[1, 2])
    ai = ints((4, 32, 32), -128, 127, torch.int8, 24)
    bi = ints((4, 32, 32), -128, 127, torch.int8, 25)
    pi = torch.randint(-1000, 1000, (4, 32, 32), generator=gen(26), dtype=torch.int32)
    assert torch.equal(X.mma_step(pi, ai, bi, acc="int32").long(), pi.long() + ai.long() @ bi.long())



@pytest.mark.parametrize("ad,bd,fill", [("fp16", "fp16", "zero"), ("fp16", "fp16", "nan"), ("e5m2", "e4m3", "zero")])
def test_interpreter_step_scan_is_the_compiled_loop(monkeypatch, ad, bd, fill):
    """Under the interpreter each fp16-accumulator MMA step is one scan; the compiled path's
    k-at-a-time loop (run here under the interpreter too) gives the same bits, S and statistics
    included, on a ragged tile, overflow to inf and an fp32 order that differs from the exact sum."""
    M, N, K = 12, 10, 80
    a = (torch.randn(M, K, generator=gen(31)) * 8).to(DTYPES[ad].torch)
    b = (torch.randn(K, N, generator=gen(32)) * 8).to(DTYPES[bd].torch)
    a[0, :], b[:, 0] = 64.0, 64.0  # row 0 x column 0 overflows the fp16 register
    if ad == "fp16":  # row 1 x column 1: 8192 + 4, then 2^-11 fourteen times, then zeros
        a[1, :], b[:, 1] = 0.0, 0.0
        a[1, :16], b[:16, 1] = 1.0, 2.0 ** -11
        a[1, 0], b[0, 1], a[1, 1], b[1, 1] = 128.0, 64.0, 2.0, 2.0

    def run():
        acc = X.mma_accumulate(a, b, 16, 16, 64, acc="fp16", oob_fill=fill, with_abs_sum=True)
        stats = X.mma_accumulate(a, b, 16, 16, 64, acc="fp16", oob_fill=fill, with_stats=True, stats_chunk=128)
        step = X.mma_step(None, a[:, :32], b[:32], acc="fp16")
        return (*acc, stats[0], stats[1], *(getattr(stats[2], f) for f in ("l", "v", "pabs", "prun")), step)

    def bits(t):
        return t.view(torch.int16 if t.dtype == torch.float16 else torch.int32)

    scan = run()
    monkeypatch.setattr(mma_params, "INTERPRET_FP16_STEPS_AS_LOOP", True)
    loop = run()
    for i, (x, y) in enumerate(zip(scan, loop)):
        assert torch.equal(bits(x), bits(y)), i
    if fill == "nan":  # K = 80 is ragged: the NaN fill reaches every output
        assert torch.isnan(scan[0]).all(), scan[0]
    else:
        assert torch.isinf(scan[0][0, 0]) and torch.isfinite(scan[0][2:, 2:]).all(), scan[0]
    if ad == "fp16" and fill == "zero":
        # fp32 in k order gives 8196, which rounds to 8192 in fp16 (ties to even); the exact sum
        # 8196 + 7 * 2^-10 rounds to 8200, as the float64 host spec has it
        assert float(scan[0][1, 1]) == float(scan[-1][1, 1]) == 8192.0
        assert float(X.mma_accumulate_host(a, b, 16, 16, 64, acc="fp16")[1, 1]) == 8200.0

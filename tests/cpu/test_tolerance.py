"""The accumulator bound is tight: correct kernels never exceed it, a wrong k-block always does."""

import pytest
import torch

from oracle.judging import accumulation_bound, bound_stats, hardware_numerics, tolerance
from oracle.judging.compare import Status, compare
from oracle.problem.spec import ProblemSpec, Tile

BM = BN = 64
BK = 64


def _operands(dtype, m, n, k, seed, positive=False):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g, dtype=torch.float64)
    b = torch.randn(k, n, generator=g, dtype=torch.float64)
    if positive:
        a, b = a.abs(), b.abs()
    t = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn}[dtype]
    return a.to(t), b.to(t)


def _kernel_like(a, b, drop=None, twice=None):
    """Blocked fp32 accumulation, k-block by k-block, as a tensor-core main loop does.
    drop/twice: (k_block, tile_rows, tile_cols) slices where one k-block is skipped or doubled."""
    m, k = a.shape
    acc = torch.zeros(m, b.shape[1], dtype=torch.float32)
    for kb in range(0, -(-k // BK)):
        part = a[:, kb * BK:(kb + 1) * BK].float() @ b[kb * BK:(kb + 1) * BK, :].float()
        if drop and drop[0] == kb:
            part[drop[1], drop[2]] = 0
        if twice and twice[0] == kb:
            part[twice[1], twice[2]] *= 2
        acc += part
    return acc


_BOUNDS = {}


def _judge(spec, out, a, b):
    """The bound from the span statistics the reference computes (L, V over k-blocks)."""
    key = (spec, a.data_ptr(), b.data_ptr())
    if key not in _BOUNDS:
        _BOUNDS.clear()
        _BOUNDS[key] = _bound(spec, a, b)
    exact, bound = _BOUNDS[key]
    return compare(out, exact, bound=bound, tile_shape=(BM, BN))


def _bound(spec, a, b):
    a64, b64 = a.double(), b.double()
    exact = a64 @ b64
    s = a64.abs() @ b64.abs()
    span = bound_stats.SpanStats(torch.zeros_like(s))
    x = torch.zeros_like(s)
    for k0 in range(0, a.shape[1], BK):
        x = x + a64[:, k0:k0 + BK] @ b64[k0:k0 + BK]
        span.add(a64[:, k0:k0 + BK].abs() @ b64[k0:k0 + BK].abs(), x)
    return exact, accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, spec.k, span)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32", "e4m3"])
@pytest.mark.parametrize("k", [256, 4096, 16384])
@pytest.mark.parametrize("positive", [False, True])
def test_correct_never_exceeds_and_one_bad_k_block_always_does(dtype, k, positive):
    spec = ProblemSpec(m=128, n=128, k=k, a_dtype=dtype, b_dtype=dtype, tile=Tile(BM, BN, BK))
    for seed in range(2):
        a, b = _operands(dtype, 128, 128, k, seed, positive)
        good = _judge(spec, _kernel_like(a, b), a, b)
        assert good.status is Status.MATCH, f"correct result exceeded the bound: {good.worst.max_ratio}"
        assert good.worst.max_ratio < 0.5  # with margin to spare
        kb = (seed * 7 + 3) % (k // BK)
        rows, cols = slice(64, 128), slice(0, 64)  # output tile (1, 0) only
        for kw in (dict(drop=(kb, rows, cols)), dict(twice=(kb, rows, cols))):
            bad = _judge(spec, _kernel_like(a, b, **kw), a, b)
            assert bad.status is Status.MISMATCH
            failing = {t.tile for t in bad.tiles if not t.passed}
            assert failing == {(1, 0)}, f"{kw}: failing tiles {failing}"
            assert bad.worst.max_ratio > 2  # not a near miss


def test_fp16_accumulation_where_fp32_is_declared_is_caught():
    spec = ProblemSpec(m=64, n=64, k=4096, a_dtype="fp16", b_dtype="fp16", tile=Tile(BM, BN, BK))
    a, b = _operands("fp16", 64, 64, 4096, 0, positive=True)
    acc = torch.zeros(64, 64, dtype=torch.float16)
    for kb in range(4096 // BK):
        for kk in range(0, BK, 16):  # rounds to fp16 after every 16-deep MMA instruction
            k0 = kb * BK + kk
            acc = (acc.float() + a[:, k0:k0 + 16].float() @ b[k0:k0 + 16, :].float()).half()
    bad = _judge(spec, acc.float(), a, b)
    assert bad.status is Status.MISMATCH
    declared = ProblemSpec(m=64, n=64, k=4096, a_dtype="fp16", b_dtype="fp16", acc_dtype="fp16",
                           tile=Tile(BM, BN, BK))
    assert _judge(declared, acc.float(), a, b).status is Status.MATCH


def test_missing_key_is_an_error():
    with pytest.raises(hardware_numerics.ToleranceError):
        tolerance.lookup("mma", "bf16")
    with pytest.raises(hardware_numerics.ToleranceError):
        tolerance.lookup("epilogue_bias", "fp16")


def test_ulp_of_formats():
    y = torch.tensor([1.0, 3.0, 448.0])
    assert tolerance.ulp(y, "bf16").tolist() == [2**-7, 2**-6, 2.0]
    assert tolerance.ulp(y, "e4m3").tolist() == [2**-3, 2**-2, 32.0]
    assert tolerance.ulp(torch.tensor([0.0]), "fp16").tolist() == [2**-24]
    powers = torch.tensor([2.0**e for e in range(-6, 15)], dtype=torch.float64)
    assert tolerance.ulp(powers, "bf16").tolist() == [2.0**(e - 7) for e in range(-6, 15)]
    assert tolerance.ulp(torch.nextafter(powers, torch.zeros_like(powers)), "bf16").tolist() == \
        [2.0**(e - 8) for e in range(-6, 15)]


@pytest.mark.parametrize("held,name", [(torch.bfloat16, "bf16"), (torch.float16, "fp16"),
                                       (torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2"),
                                       (torch.float32, "fp32"), (torch.float32, "bf16")])
def test_ulp_from_exponent_bits_is_frexps_for_every_value(held, name):
    """ulp of a tensor float32 holds (the cast's output) reads |y|'s exponent bits; it gives what the
    float64 frexp path gives for every value of 1- and 2-byte types (zeros, subnormals, inf and NaN
    included) and for float32's subnormals, powers of two, their neighbours, inf and NaN."""
    if held.itemsize <= 2:
        bits = torch.arange(2 ** (8 * held.itemsize), dtype=torch.int32)
        y = bits.to(torch.int16 if held.itemsize == 2 else torch.uint8).view(held)
    else:
        p = torch.tensor([2.0 ** e for e in range(-149, 128)], dtype=torch.float32)
        y = torch.cat([p, torch.nextafter(p, torch.zeros_like(p)), torch.nextafter(p, torch.full_like(p, 1e38)),
                       -p, torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")]),
                       torch.randn(4096) * 1e10])
    got = tolerance.ulp(y, name)
    want = tolerance.ulp(y.double(), name)
    assert got.dtype == torch.float64 and torch.equal(got, want)

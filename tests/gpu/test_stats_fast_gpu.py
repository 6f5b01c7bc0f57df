"""The statistics kernel's fast path on a GPU: for every problem it takes (bf16 or fp16 operands, an
fp32 accumulator, zero fill, no promotion, no block scales), the accumulator, S and every statistic
are the general kernel's bits, on every launch, ragged edges, strided operands, split-K chunks and
non-finite operands included."""

import pytest
import torch

from kernels_ref import mma_stats as S
from kernels_ref.mma_params import MainloopParams

from tests.ref_checks import same

pytestmark = pytest.mark.gpu

LAUNCHES = [S.STATS_FAST_LAUNCH, S.StatsLaunch(128, 32, 8, 3), S.StatsLaunch(64, 64, 4, 4), S.StatsLaunch(32, 32, 4, 2)]


def _fields(run):
    acc, s, st = run
    return [acc, s, st.l, st.v, st.q, st.pabs, st.prun]


def _operands(m, n, k, dtype, seed, b_transposed=False, poison=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, device="cuda", generator=g) * 3).to(dtype)
    b = torch.randn(n, k, device="cuda", generator=g).to(dtype).t() if b_transposed else \
        torch.randn(k, n, device="cuda", generator=g).to(dtype)
    if poison:
        a[1, 5] = float("nan")
        a[2, :7] = float("inf")
        b[9, 3] = -float("inf")
        a[3, 40] = -0.0
    return a, b


def _both(p, chunk, launch):
    fast = S.accumulate_stats(p, chunk, p.a.device, launch=launch, fast=True)
    general = S.accumulate_stats(p, chunk, p.a.device, fast=False)
    return _fields(fast), _fields(general)


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: l.label())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,bk,chunk", [((256, 192, 512), 64, None), ((200, 72, 320), 64, 128),
                                            ((130, 97, 992), 32, None), ((64, 64, 256), 128, 128),
                                            ((1, 1, 64), 64, None), ((5, 3, 32), 16, 32)])
def test_fast_kernel_gives_the_general_kernels_bits(launch, dtype, shape, bk, chunk):
    a, b = _operands(*shape, dtype, seed=sum(shape) + bk)
    p = MainloopParams(a, b, 128, 128, bk)
    assert S.fast_path_applies(p)
    for got, want in zip(*_both(p, chunk, launch)):
        assert same(got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fast_kernel_on_strided_and_non_finite_operands(dtype):
    a, b = _operands(96, 80, 704, dtype, seed=3, b_transposed=True, poison=True)
    a = a[:, :640]  # a row stride that is not K
    b = b[:640]
    p = MainloopParams(a, b, 64, 64, 64)
    assert S.fast_path_applies(p)
    for launch in LAUNCHES[:2]:
        for got, want in zip(*_both(p, 128, launch)):
            assert same(got, want)


def test_fast_kernel_at_size_is_the_general_kernels_bits():
    a, b = _operands(1024, 1024, 4096, torch.bfloat16, seed=11)
    p = MainloopParams(a, b, 128, 128, 64)
    assert S.fast_path_applies(p)  # else the default path would compare the general kernel with itself
    for got, want in zip(*_both(p, None, None)):
        assert same(got, want)

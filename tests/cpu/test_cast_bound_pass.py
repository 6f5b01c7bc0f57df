"""The cast's bound in one Triton pass gives the torch definition's bits (tolerance.cast_bound on the
CPU), on every kind of value a cast meets: zeros of both signs, subnormals, the extremes, infinities,
NaN, and input bounds that are zero, negative, infinite or NaN."""

from __future__ import annotations

import pytest
import torch

from kernels_ref.dtypes import DTYPES
from oracle.judging import cast_bound_pass, tolerance


def _values(dtype: torch.dtype, n: int, g: torch.Generator) -> torch.Tensor:
    fi = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, fi.tiny, -fi.tiny, fi.tiny / 4, fi.max, -fi.max, float("inf"),
                            float("-inf"), float("nan"), 1.0, -1.5, fi.eps], dtype=torch.float32)
    spread = torch.randn(n, generator=g) * torch.exp2(torch.randint(-140, 120, (n,), generator=g).float())
    return torch.cat([special, spread]).to(dtype)


@pytest.mark.parametrize("out_dtype", ["bf16", "fp16", "fp32"])
def test_the_pass_gives_the_torch_definitions_bits(out_dtype):
    g = torch.Generator().manual_seed(3)
    d = DTYPES[out_dtype]
    y = _values(d.torch, 2000, g)
    n = y.numel()
    bound = torch.rand(n, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-60, 10, (n,), generator=g).double())
    bound[::7] = 0.0
    bound[1::11] = -1.0
    bound[2::13] = float("inf")
    bound[3::17] = float("nan")
    want = tolerance.cast_bound(bound, y, out_dtype)  # CPU tensors: the torch definition
    assert not cast_bound_pass.applies(bound, y)
    got = cast_bound_pass.cast_bound(bound, y, torch.finfo(d.torch).tiny, tolerance._mantissa_bits(d))
    assert got.dtype == torch.float64 and got.shape == want.shape
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))


def test_the_pass_applies_only_to_what_its_kernel_reads():
    b = torch.zeros(4, 4, dtype=torch.float64)
    assert not cast_bound_pass.applies(b, torch.zeros(4, 4))  # on the CPU: the torch definition
    empty = cast_bound_pass.cast_bound(torch.zeros(0, dtype=torch.float64), torch.zeros(0), 2.0 ** -126, 23)
    assert empty.shape == (0,) and empty.dtype == torch.float64

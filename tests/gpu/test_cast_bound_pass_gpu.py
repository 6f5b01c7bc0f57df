"""The cast's bound on a GPU goes through its one Triton pass and gives the bits of the torch
definition on the CPU, hostile values included; a strided value takes the torch definition."""

import pytest
import torch

from oracle.judging import cast_bound_pass, tolerance

from tests.cpu.test_cast_bound_pass import _values

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("out_dtype,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                             ("fp32", torch.float32)])
def test_the_gpu_pass_is_the_cpu_definition(out_dtype, dtype):
    g = torch.Generator().manual_seed(11)
    y = _values(dtype, 1 << 20, g)[:1 << 20].reshape(1024, -1)
    bound = torch.rand(y.shape, generator=g, dtype=torch.float64)
    bound[::5] = 0.0
    bound[1::9] = float("nan")
    want = tolerance.cast_bound(bound, y, out_dtype)
    yd, bd = y.cuda(), bound.cuda()
    assert cast_bound_pass.applies(bd, yd)
    got = tolerance.cast_bound(bd, yd, out_dtype)
    assert torch.equal(got.cpu().view(torch.int64), want.view(torch.int64))
    strided = tolerance.cast_bound(bd.t(), yd.t(), out_dtype)  # not contiguous: the torch definition
    assert not cast_bound_pass.applies(bd.t(), yd.t())
    assert torch.equal(strided.cpu().view(torch.int64), want.t().view(torch.int64))

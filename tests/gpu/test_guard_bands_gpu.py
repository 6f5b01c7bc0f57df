"""Guard bands on a real GPU: a kernel that stores past the end of its output is named with the byte
offset (harness.guard_bands), and a kernel that stays inside leaves no breach."""

import pytest
import torch

from harness.build import build_cubin
from harness.launch import LaunchSpec, ScalarArg, TensorArg
from harness.runner import run_kernel

pytestmark = pytest.mark.gpu

SOURCE = r'''
extern "C" __global__ void store_n(float* z, int write_n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < write_n) z[i] = 1.0f;
}
'''


@pytest.mark.parametrize("extra", [0, 3])
def test_a_store_past_the_end_is_named_with_its_offset(extra):
    n = 1000
    cubin = build_cubin(SOURCE, arch="sm_90a").read()
    launch = LaunchSpec(grid=(n + extra + 127) // 128, block=128, args=[TensorArg("z", "out"), ScalarArg(n + extra)])
    run = run_kernel(cubin, "store_n", launch, {"z": torch.zeros(n)}, timeout_s=60)
    assert run.ok, run.describe() + run.stderr_tail
    if not extra:
        assert run.guard_breaches == ()
        return
    (b,) = run.guard_breaches
    assert (b.tensor, b.side, b.first, b.last, b.nbytes) == ("z", "after", 4 * n, 4 * n + 4 * extra - 1, 4 * n)

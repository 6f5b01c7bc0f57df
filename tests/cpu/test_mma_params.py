"""The MMA stage's params objects: validated once, and naming what the mainloop kernels take."""

import inspect

import pytest
import torch
import triton.language as tl

from kernels_ref import gemm as G
from kernels_ref import mma as X
from kernels_ref import mma_stats as S
from kernels_ref.mma_params import MainloopParams, MmaConfig

# What each launcher adds to MainloopParams.kernel_args(): its outputs and its own switches.
OWN = {
    X._mma_tiles_kernel: {"tiles_ptr", "tr", "ts", "WITH_ABS"},
    X._mma_accumulate_kernel: {"out", "abs_ptr", "WITH_ABS"},
    S._mma_stats_kernel: {"out", "abs_ptr", "st_ptr", "st_s", "CHUNK_KB", "WITH_Q", "BKP"},
    G._gemm_kernel: {"out", "ep", "EP", "OUT_W", "GROUP_M"},
}


def _names(kernel) -> set:
    return set(inspect.signature(kernel.fn).parameters)


@pytest.mark.parametrize("scaled", [False, True])
def test_kernel_args_are_every_shared_argument_of_the_mainloop_kernels(scaled):
    a = torch.ones(16, 64, dtype=torch.float8_e4m3fn)
    b = torch.ones(64, 16, dtype=torch.float8_e4m3fn)
    kw = dict(scale_a=torch.ones(1, 1), scale_b=torch.ones(1, 1), block_scale_group=(16, 16, 64)) if scaled else {}
    args = MainloopParams(a, b, 16, 16, 64, **kw).kernel_args()
    assert set(args) == {"ml", "MC"}
    for kernel, own in OWN.items():
        assert set(args) | own == _names(kernel), kernel.fn.__name__
        assert not set(args) & own


def test_every_constant_is_a_constexpr_and_the_scales_are_the_tensors_given():
    """Each field of MC is a tl.constexpr (a plain int in a tuple would be a runtime argument on the
    GPU, and tl.arange refuses it); ml carries the block scales' bits, or A's with strides 0."""
    a = torch.ones(16, 64, dtype=torch.float8_e4m3fn)
    b = torch.ones(64, 16, dtype=torch.float8_e4m3fn)
    sa, sb = torch.ones(1, 1), torch.full((1, 1), 2.0)
    for kw in ({}, dict(scale_a=sa, scale_b=sb, block_scale_group=(16, 16, 64))):
        args = MainloopParams(a, b, 16, 16, 64, **kw).kernel_args()
        assert all(isinstance(v, tl.constexpr) for v in args["MC"])
        ml = args["ml"]
        if kw:
            assert args["MC"].SCALED.value and ml.sa.ptr.data_ptr() == sa.data_ptr()
            assert ml.sb.ptr.data_ptr() == sb.data_ptr() and (ml.sa.s_r, ml.sa.s_c) == sa.stride()
        else:
            assert not args["MC"].SCALED.value and ml.sa == (ml.a.ptr, 0, 0)


def test_config_is_checked_once_with_every_reason():
    with pytest.raises(ValueError) as e:
        MmaConfig("int8", "int8", "fp32", 16, 16, 32, oob_fill="nan")
    assert "acc='fp32' takes operands" in str(e.value) and "oob_fill='nan' needs floating-point" in str(e.value)
    with pytest.raises(ValueError, match="block_k=0 must be a positive int"):
        MmaConfig("bf16", "bf16", "fp32", 16, 16, 0)
    cfg = MmaConfig("e4m3", "e5m2", "fp32", 16, 16, 128, promotion_interval=64)
    assert cfg.steps == (32, 2, 2)
    with pytest.raises(AttributeError):
        cfg.acc = "fp16"


def test_params_name_the_operand_at_fault():
    a = torch.ones(16, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"scale_a has shape \(2, 1\); with block_scale_group=\(16, 16, 32\)"):
        MainloopParams(a.to(torch.float8_e4m3fn), torch.ones(32, 16, dtype=torch.float8_e4m3fn), 16, 16, 32,
                       scale_a=torch.ones(2, 1), scale_b=torch.ones(1, 1), block_scale_group=(16, 16, 32))
    with pytest.raises(ValueError, match="a must be \\[M, K\\] and b \\[K, N\\]"):
        MainloopParams(a, torch.ones(16, 16, dtype=torch.bfloat16), 16, 16, 32)

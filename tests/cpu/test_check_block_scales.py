"""oracle.check with block scales: every layout the spec takes (per tensor, row / column, 1 x 128 and
128 x 128 blocks in both storage orders, OCP MX e8m0 and NVFP4-style e4m3 blocks), judged against
results emulated the way Blackwell's formats are run on Hopper: each element dequantised with its
block's scale, then one product."""

from __future__ import annotations

import pytest
import torch

import oracle
from oracle.problem.spec import SpecError

M, N, K = 48, 40, 128


def _operands(seed: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(K, N, generator=g) * 2).to(torch.float8_e4m3fn)
    return a, b, g


def _expand(values: torch.Tensor, rows: int, block: tuple[int, int]) -> torch.Tensor:
    """A [rows / br, K / bk] grid of scale values as one value per element [rows, K]."""
    return values.double().repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :K]


def _emulated(a, b, va, vb, block_a, block_b) -> torch.Tensor:
    """D = (A * scales) @ (B * scales), dequantised per element in float64, rounded once to bf16."""
    a_deq = a.double() * _expand(va, M, block_a)
    b_deq = b.double() * _expand(vb, N, block_b).T
    return (a_deq @ b_deq).to(torch.bfloat16)


def _pow2(g, shape, lo=-3, hi=3) -> torch.Tensor:
    return torch.pow(2.0, torch.randint(lo, hi + 1, shape, generator=g).double())


def _mx(seed: int):
    """MXFP8-style: 1 x 32 blocks of e8m0 exponents (bytes), on A's rows and B's columns."""
    a, b, g = _operands(seed)
    va, vb = _pow2(g, (M, K // 32)), _pow2(g, (N, K // 32))
    return a, b, va, vb, (va.log2().long() + 127).to(torch.uint8), (vb.log2().long() + 127).to(torch.uint8)


def _nvfp4(seed: int):
    """NVFP4-style: 1 x 16 blocks of e4m3 scales (not only powers of two)."""
    a, b, g = _operands(seed)
    va = (torch.rand(M, K // 16, generator=g) * 3 + 0.25).to(torch.float8_e4m3fn)
    vb = (torch.rand(N, K // 16, generator=g) * 3 + 0.25).to(torch.float8_e4m3fn)
    return a, b, va.double(), vb.double(), va, vb


@pytest.mark.parametrize("make,gk", [(_mx, 32), (_nvfp4, 16)], ids=["mx", "nvfp4"])
def test_a_correct_emulated_result_matches(make, gk):
    a, b, va, vb, sa, sb = make(1)
    d = _emulated(a, b, va, vb, (1, gk), (1, gk))
    report = oracle.check(a, b, d, scale_a=sa, scale_b=sb)
    assert report.verdict == "MATCH", report
    spec = report.recording.spec
    assert spec.scale_a.dtype == spec.scale_b.dtype == ("e8m0" if make is _mx else "e4m3")
    assert spec.scale_a.block == (1, gk) and spec.tile.bk % gk == 0  # several groups per k-block


@pytest.mark.parametrize("make,gk", [(_mx, 32), (_nvfp4, 16)], ids=["mx", "nvfp4"])
def test_one_wrong_scale_block_diverges_where_it_lies(make, gk):
    a, b, va, vb, sa, sb = make(2)
    wrong = va.clone()
    wrong[37, 2] *= 4  # one block of row 37, k in 2 gk .. 3 gk
    report = oracle.check(a, b, _emulated(a, b, wrong, vb, (1, gk), (1, gk)), scale_a=sa, scale_b=sb)
    assert report.verdict == "DIVERGED", report
    first = report.first_divergence
    assert first.stage == "epilogue_store" and first.element[0] == 37, first


def test_e8m0_as_torch_float8_e8m0fnu_is_the_same_check():
    e8 = getattr(torch, "float8_e8m0fnu", None)
    if e8 is None:
        pytest.skip("this torch has no float8_e8m0fnu dtype; the uint8 bytes are the same check")
    a, b, va, vb, sa, sb = _mx(3)
    report = oracle.check(a, b, _emulated(a, b, va, vb, (1, 32), (1, 32)), scale_a=sa.view(e8), scale_b=sb.view(e8))
    assert report.verdict == "MATCH", report


@pytest.mark.parametrize("col", [False, True], ids=["row_major", "col_major"])
def test_deepseek_blocks_in_either_storage_order_match(col):
    a, b, g = _operands(4)
    va, vb = torch.rand(M, 1, generator=g).double() + 0.5, torch.rand(1, 1, generator=g).double() + 0.5
    va = va.repeat(1, K // 64) * _pow2(g, (M, K // 64))  # 1 x 64 blocks over A, 64 x 64 over B
    vb = vb.repeat(1, K // 64) * _pow2(g, (1, K // 64))
    sa = va.float().T.contiguous().T if col else va.float()
    report = oracle.check(a, b, _emulated(a, b, va.float(), vb.float(), (1, 64), (64, 64)), scale_a=sa,
                          scale_b=vb.float())
    assert report.verdict == "MATCH", report
    assert report.recording.spec.scale_a.major == ("col" if col else "row")
    assert report.recording.spec.scale_b.block == (64, 64)


def test_per_tensor_and_row_col_scales_still_match():
    a, b, g = _operands(5)
    ra, cb = torch.rand(M, generator=g) + 0.5, torch.rand(N, generator=g) + 0.5
    d = (a.double() @ b.double() * ra.double()[:, None] * cb.double()[None, :]).to(torch.bfloat16)
    assert oracle.check(a, b, d, scale_a=ra, scale_b=cb).verdict == "MATCH"
    t = torch.tensor([0.5])
    assert oracle.check(a, b, (a.double() @ b.double() * 0.25).to(torch.bfloat16), scale_a=t,
                        scale_b=t).verdict == "MATCH"


def test_a_stored_block_dtype_in_a_flat_scale_is_refused_by_name():
    a, b, _ = _operands(6)
    with pytest.raises(SpecError, match="scale_a has dtype torch.uint8"):
        oracle.check(a, b, torch.zeros(M, N, dtype=torch.bfloat16), scale_a=torch.ones(M, dtype=torch.uint8),
                     scale_b=torch.ones(N, dtype=torch.uint8))

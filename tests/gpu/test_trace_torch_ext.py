"""GPU: a traced kernel inside a torch extension (harness/examples/torch_ext) fills a sink
tensor that harness.torch_ext reads back; every tap matches what the kernel computed."""

from __future__ import annotations

import pytest
import torch

from harness.taps import DescriptorRecord
from harness.torch_ext import load_example, make_sink, read_sink, reset_sink
from harness.trace_format import HEADER_BYTES

pytestmark = pytest.mark.gpu

T = 16  # the example's tile and k-block


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    return load_example(build_directory=str(tmp_path_factory.mktemp("oracle_trace_ext")))


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=t.dtype, device=t.device)
    out[:t.shape[0], :t.shape[1]] = t
    return out


def test_full_trace(ext):
    g = torch.Generator(device="cuda").manual_seed(11)
    M, K, N = 40, 40, 24  # 3 x 2 tiles, 3 k-blocks, ragged everywhere
    a = torch.randn(M, K, generator=g, device="cuda")
    b = torch.randn(K, N, generator=g, device="cuda")
    sink = make_sink(1 << 22)
    ext.set_trace_sink(sink)
    d = ext.tile_gemm(a, b, True)
    res = read_sink(sink, block_m=T, block_n=T, block_k=T)
    assert res.complete, res.warnings
    torch.testing.assert_close(d.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-4)
    assert res.descriptors == (DescriptorRecord(operand="a", dtype="fp32", global_dims=(K, M), global_strides=(4 * K,),
                                                box_dims=(T, T), element_strides=(1, 1), swizzle=0, oob_fill="zero"),)
    ap, bp = _pad(a, 3 * T, 3 * T), _pad(b, 3 * T, 2 * T)
    for tm in range(3):
        for tn in range(2):
            acc = torch.zeros(T, T, dtype=torch.float64, device="cuda")
            for kb in range(3):
                la = res.get("load_a", (tm, tn), kb)
                lb = res.get("load_b", (tm, tn), kb)
                img = res.get("descriptor_a", (tm, tn), kb)
                assert la.cta == tn + 2 * tm and la.slot == 0
                assert torch.equal(la.values.cuda(), ap[tm * T:(tm + 1) * T, kb * T:(kb + 1) * T])
                assert torch.equal(lb.values.cuda(), bp[kb * T:(kb + 1) * T, tn * T:(tn + 1) * T])
                assert img.mask is None and img.values.numel() == T * T * 4
                assert torch.equal(img.values, la.values.contiguous().view(torch.uint8).reshape(-1))
                acc += la.values.cuda().double() @ lb.values.cuda().double()
                torch.testing.assert_close(res.get("mma", (tm, tn), kb).values.cuda().double(), acc,
                                           rtol=1e-5, atol=1e-4)
            cast = res.get("epilogue_cast", (tm, tn)).values.cuda()
            assert torch.equal(cast, res.get("mma", (tm, tn), 2).values.cuda())
            rows, cols = slice(tm * T, min(M, (tm + 1) * T)), slice(tn * T, min(N, (tn + 1) * T))
            assert torch.equal(cast[:rows.stop - rows.start, :cols.stop - cols.start], d[rows, cols])


def test_selection_untraced_and_cleared(ext):
    a = torch.ones(40, 40, device="cuda")
    b = torch.ones(40, 24, device="cuda")
    sink = make_sink(1 << 20, tiles=[(1, -1)], k_blocks=[1], stages=["mma", "epilogue_cast"])
    ext.set_trace_sink(sink)
    ext.tile_gemm(a, b, True)
    res = read_sink(sink, block_m=T, block_n=T, block_k=T)
    assert [t.key for t in res.taps] == [("mma", (1, 0), 1), ("mma", (1, 1), 1), ("epilogue_cast", (1, 0), None),
                                         ("epilogue_cast", (1, 1), None)]
    assert res.descriptors == ()
    # all-ones: after k-block 1 every accumulator holds 32 (in-range rows and cols)
    assert (res.get("mma", (1, 0), 1).values == 32).all()

    reset_sink(sink)
    ext.tile_gemm(a, b, False)  # the untraced instantiation taps nothing
    assert read_sink(sink, block_m=T, block_n=T, block_k=T).records == 0
    ext.clear_trace_sink()
    ext.tile_gemm(a, b, True)  # a null sink: nothing either
    assert read_sink(sink, block_m=T, block_n=T, block_k=T).records == 0


def test_overflow_is_counted(ext):
    a = torch.randn(64, 64, device="cuda")
    b = torch.randn(64, 64, device="cuda")
    sink = make_sink(HEADER_BYTES + 4096)
    ext.set_trace_sink(sink)
    d = ext.tile_gemm(a, b, True)
    res = read_sink(sink, block_m=T, block_n=T, block_k=T)
    assert res.dropped > 0 and res.used_bytes == 4096 and not res.complete
    torch.testing.assert_close(d, a @ b, rtol=1e-4, atol=1e-4)
    ext.clear_trace_sink()

"""GPU: the traced simple_gemm writes a trace the parser reads back, and every tap is right.

Builds harness/examples/simple_gemm.cu with nvcc (-DORACLE_TRACE), loads it into torch's CUDA
context with cuda.bindings.driver, points `oracle_trace_sink` at a torch uint8 tensor and
launches with cuLaunchKernel, so the test depends only on the trace header and parser.
"""

from __future__ import annotations

import ctypes
import struct

import pytest
import torch

from cuda_tools import traced_example_cubin  # tests/ on sys.path
from harness.torch_ext import make_sink, read_sink, reset_sink

pytestmark = pytest.mark.gpu

BM, BN, BK = 64, 64, 16
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _check(result):
    from cuda.bindings import driver as cu

    err, *rest = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")
    return rest[0] if len(rest) == 1 else rest


class _Module:
    def __init__(self, cubin: bytes) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        torch.zeros(1, device="cuda")  # make torch's primary context current
        self.module = _check(cu.cuModuleLoadData(cubin))

    def set_sink(self, sink: torch.Tensor) -> None:
        ptr, size = _check(self.cu.cuModuleGetGlobal(self.module, b"oracle_trace_sink"))
        assert size == 8
        _check(self.cu.cuMemcpyHtoD(ptr, struct.pack("<Q", sink.data_ptr()), 8))

    def launch(self, name: str, grid, block, args: list) -> None:
        fn = _check(self.cu.cuModuleGetFunction(self.module, name.encode()))
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        torch.cuda.synchronize()
        _check(self.cu.cuLaunchKernel(fn, *grid, *block, 0, 0, ctypes.addressof(params), 0))
        _check(self.cu.cuCtxSynchronize())


@pytest.fixture(scope="module")
def gemm_module(tmp_path_factory) -> _Module:
    out = traced_example_cubin("simple_gemm.cu", tmp_path_factory.mktemp("gemm") / "simple_gemm.cubin")
    return _Module(out.read_bytes())


def _run(mod: _Module, dtype: str, traced: bool, A, B, C, bias, alpha, beta, activation) -> torch.Tensor:
    M, K = A.shape
    N = B.shape[1]
    D = torch.full((M, N), float("nan"), dtype=A.dtype, device="cuda")
    p = lambda t: ctypes.c_void_p(0 if t is None else t.data_ptr())  # noqa: E731
    args = [p(A), p(B), p(C), p(D), p(bias), *(ctypes.c_int(v) for v in (M, N, K, K, N, N, N)),
            ctypes.c_float(alpha), ctypes.c_float(beta), ctypes.c_int(activation)]
    name = f"simple_gemm_{dtype}" + ("_traced" if traced else "")
    mod.launch(name, ((N + BN - 1) // BN, (M + BM - 1) // BM, 1), (16, 16, 1), args)
    return D


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=t.dtype, device=t.device)
    out[:t.shape[0], :t.shape[1]] = t
    return out


@pytest.mark.parametrize("dtype,activation", [("fp32", 1), ("fp16", 2), ("bf16", 3)])
def test_simple_gemm_trace(gemm_module, dtype, activation):
    g = torch.Generator(device="cuda").manual_seed(1234 + activation)
    tdt = TORCH_DTYPES[dtype]
    M, N, K = 100, 72, 50  # ragged in M, N and K: 2 x 2 tiles, 4 k-blocks
    A = torch.randn(M, K, generator=g, device="cuda").to(tdt)
    B = torch.randn(K, N, generator=g, device="cuda").to(tdt)
    C = torch.randn(M, N, generator=g, device="cuda").to(tdt)
    bias = torch.randn(N, generator=g, device="cuda").to(tdt)
    alpha, beta = 1.5, 0.5

    sink = make_sink(1 << 24)
    gemm_module.set_sink(sink)
    D_plain = _run(gemm_module, dtype, False, A, B, C, bias, alpha, beta, activation)
    assert read_sink(sink, block_m=BM, block_n=BN, block_k=BK).records == 0  # untraced: nothing
    D = _run(gemm_module, dtype, True, A, B, C, bias, alpha, beta, activation)
    res = read_sink(sink, block_m=BM, block_n=BN, block_k=BK)
    assert res.complete, res.warnings
    assert torch.equal(D, D_plain)  # taps do not change results

    # the output against a float64 reference
    x = alpha * (A.double() @ B.double()) + beta * C.double() + bias.double()
    act = {1: torch.relu, 2: lambda v: torch.nn.functional.gelu(v),
           3: lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[activation]
    ref = act(x)
    tol = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 1e-1}[dtype]
    torch.testing.assert_close(D.double(), ref, rtol=tol, atol=tol)

    tiles_m, tiles_n, kbs = 2, 2, 4
    assert len(res.taps) == tiles_m * tiles_n * (3 * kbs + 4)
    Ap = _pad(A, tiles_m * BM, kbs * BK)
    Bp = _pad(B, kbs * BK, tiles_n * BN)
    for tm in range(tiles_m):
        for tn in range(tiles_n):
            acc = torch.zeros(BM, BN, dtype=torch.float64, device="cuda")
            for kb in range(kbs):
                la = res.get("load_a", (tm, tn), kb)
                lb = res.get("load_b", (tm, tn), kb)
                assert la.slot == 0 and la.cta == tn + tiles_n * tm and la.mask is None
                assert torch.equal(la.values.cuda(), Ap[tm * BM:(tm + 1) * BM, kb * BK:(kb + 1) * BK])
                assert torch.equal(lb.values.cuda(), Bp[kb * BK:(kb + 1) * BK, tn * BN:(tn + 1) * BN])
                acc += la.values.cuda().double() @ lb.values.cuda().double()
                mma = res.get("mma", (tm, tn), kb)
                assert mma.values.dtype == torch.float32 and mma.mask is None
                torch.testing.assert_close(mma.values.cuda().double(), acc, rtol=1e-5, atol=1e-4)
            final = res.get("mma", (tm, tn), kbs - 1).values.cuda()
            ab = res.get("epilogue_alpha_beta", (tm, tn)).values.cuda()
            rows = slice(tm * BM, min((tm + 1) * BM, M))
            cols = slice(tn * BN, min((tn + 1) * BN, N))
            c_tile = _pad(C[rows, cols].float(), BM, BN)
            torch.testing.assert_close(ab, alpha * final + beta * c_tile, rtol=1e-6, atol=1e-6)
            bs = res.get("epilogue_bias", (tm, tn)).values.cuda()
            torch.testing.assert_close(bs, ab + _pad(bias[cols].float()[None, :], 1, BN), rtol=0, atol=0)
            av = res.get("epilogue_activation", (tm, tn)).values.cuda()
            torch.testing.assert_close(av.double(), act(bs.double()), rtol=1e-5, atol=1e-5)
            cast = res.get("epilogue_cast", (tm, tn)).values.cuda()
            assert cast.dtype == tdt
            assert torch.equal(cast, av.to(tdt))
            nr, nc = rows.stop - rows.start, cols.stop - cols.start
            assert torch.equal(cast[:nr, :nc], D[rows, cols])


def test_simple_gemm_selection_and_overflow(gemm_module):
    g = torch.Generator(device="cuda").manual_seed(7)
    M, N, K = 128, 128, 64
    A = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
    B = torch.randn(K, N, generator=g, device="cuda").to(torch.bfloat16)
    sink = make_sink(1 << 22, tiles=[(1, 0)], k_blocks=[2], stages=["mma", "epilogue_cast"])
    gemm_module.set_sink(sink)
    _run(gemm_module, "bf16", True, A, B, None, None, 1.0, 0.0, 0)
    res = read_sink(sink, block_m=BM, block_n=BN, block_k=BK)
    assert [t.key for t in res.taps] == [("mma", (1, 0), 2), ("epilogue_cast", (1, 0), None)]
    assert res.complete

    reset_sink(sink[:4096])  # a small sink: most records are dropped, and counted
    gemm_module.set_sink(sink[:4096])
    _run(gemm_module, "bf16", True, A, B, None, None, 1.0, 0.0, 0)
    small = read_sink(sink[:4096], block_m=BM, block_n=BN, block_k=BK)
    assert small.dropped > 0 and small.used_bytes == 4096 - 512 and not small.complete

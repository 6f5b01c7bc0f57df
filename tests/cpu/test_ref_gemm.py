"""The fused reference GEMM equals the composition of its stages (bit for bit), its host spec,
and an independent torch statement within the rounding bound."""

import pytest
import torch

import kernels_ref
from kernels_ref import descriptor as D
from kernels_ref import load as L
from kernels_ref import mma as X
from kernels_ref.dtypes import DTYPES
from kernels_ref.epilogue import Epilogue, epilogue_host
from kernels_ref.epilogue import epilogue as run_epilogue
from kernels_ref.gemm import check_supported, gemm, gemm_host

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _same(got, want):
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    return g.shape == w.shape and torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(0), w.nan_to_num(0))


def _ints(shape, lo, hi, dtype, seed):
    return torch.randint(lo, hi + 1, shape, generator=_gen(seed)).to(dtype)


def _case(name):
    """(a, b, gemm kwargs) for a named configuration; shapes are ragged on every side."""
    M, N, K = 50, 70, 300
    g = _gen(len(name))
    if name == "bf16":
        a = torch.randn(M, K, generator=g).to(torch.bfloat16)
        b = torch.randn(K, N, generator=g).to(torch.bfloat16)
        kw = dict(block_m=16, block_n=32, block_k=64,
                  ep=Epilogue(alpha=0.5, bias_axis="row", activation="relu", out_dtype="bf16"),
                  bias=torch.randn(M, generator=g))
    elif name == "fp16acc":
        a = torch.randn(M, K, generator=g).to(torch.float16)
        b = torch.randn(K, N, generator=g).to(torch.float16)
        kw = dict(block_m=32, block_n=24, block_k=32, acc="fp16",
                  ep=Epilogue(bias_axis="col", activation="silu", out_dtype="fp16"),
                  bias=torch.randn(N, generator=g).to(torch.float16))
    elif name == "fp8":
        a = (torch.randn(M, K, generator=g) * 4).to(torch.float8_e4m3fn)
        b = (torch.randn(K, N, generator=g) * 4).to(torch.float8_e5m2)
        kw = dict(block_m=16, block_n=32, block_k=64, promotion_interval=32,
                  ep=Epilogue(alpha=0.25, beta=1.0, activation="gelu_erf", out_dtype="e4m3", saturate=True),
                  c=torch.randn(M, N, generator=g).to(torch.bfloat16),
                  scale_a_block=torch.rand(M, 3, generator=g) + 0.5, scale_b_block=torch.rand(3, 3, generator=g) + 0.5,
                  block_scale_group=(1, 32, 128))
    elif name == "int8":
        a = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (K, N), generator=g, dtype=torch.int8)
        kw = dict(block_m=16, block_n=16, block_k=64, acc="int32",
                  ep=Epilogue(out_dtype="fp32"), row_scale=torch.rand(M, generator=g),
                  col_scale=torch.rand(N, generator=g).to(torch.bfloat16), tensor_scale=torch.tensor(0.01))
    else:  # fp32 operands, transposed (column-major) B, nan fill with K a multiple of block_k
        a = torch.randn(M, 256, generator=g)
        b = torch.randn(N, 256, generator=g).t()
        kw = dict(block_m=32, block_n=32, block_k=64, oob_fill="nan",
                  ep=Epilogue(alpha=2.0, activation="gelu_tanh", out_dtype="fp32"))
    return a, b, kw


def _mma_kw(kw):
    return dict(acc=kw.get("acc", "fp32"), promotion_interval=kw.get("promotion_interval"),
                scale_a=kw.get("scale_a_block"), scale_b=kw.get("scale_b_block"),
                block_scale_group=kw.get("block_scale_group"), oob_fill=kw.get("oob_fill", "zero"))


def _ep_kw(kw):
    return {k: kw[k] for k in ("c", "bias", "row_scale", "col_scale", "tensor_scale") if k in kw}


CASES = ["bf16", "fp16acc", "fp8", "int8", "fp32"]


@pytest.mark.parametrize("name", CASES)
def test_gemm_is_mma_then_epilogue(name):
    a, b, kw = _case(name)
    d = gemm(a, b, **kw)
    assert d.dtype == DTYPES[kw["ep"].out_dtype].torch and d.shape == (a.shape[0], b.shape[1])
    acc = X.mma_accumulate(a, b, kw["block_m"], kw["block_n"], kw["block_k"], **_mma_kw(kw))
    assert _same(d.float(), run_epilogue(acc, kw["ep"], **_ep_kw(kw)).float())
    assert not torch.isnan(d.float()).any()


@pytest.mark.parametrize("name", CASES)
def test_gemm_matches_host_and_torch(name):
    a, b, kw = _case(name)
    d = gemm(a, b, **kw).double()
    host = gemm_host(a, b, **kw).double()
    ep = kw["ep"]
    # independent statement: float64 product, scaled per k-block, then the epilogue in float64
    a64, b64 = a.double(), b.double()
    if "scale_a_block" in kw:
        gm, gn, gk = kw["block_scale_group"]
        sa, sb = kw["scale_a_block"].double(), kw["scale_b_block"].double()
        acc = sum((a64[:, k0:k0 + gk] @ b64[k0:k0 + gk]) * sa[:, k0 // gk][torch.arange(a.shape[0]) // gm, None]
                  * sb[torch.arange(b.shape[1]) // gn, k0 // gk][None, :] for k0 in range(0, a.shape[1], gk))
    else:
        acc = a64 @ b64
    s = a64.abs() @ b64.abs()
    want = epilogue_host(acc.float(), Epilogue(alpha=ep.alpha, beta=ep.beta, bias_axis=ep.bias_axis,
                                               activation=ep.activation, out_dtype="fp32"), **_ep_kw(kw))
    u_out = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "e4m3": 2.0 ** -4}[ep.out_dtype]
    u_acc = {"fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "int32": 0.0}[kw.get("acc", "fp32")]
    if kw.get("promotion_interval"):
        u_acc = 2.0 ** -13
    gain = abs(ep.alpha) * 1.7  # activations here grow values by at most 1.13x; scales are <= 1.5 x 1.5
    steps = a.shape[1] // 16
    bound = u_out * want.abs() + gain * 4 * steps * u_acc * s * (2.25 if "scale_a_block" in kw else 1) + 1e-6
    if ep.out_dtype == "e4m3":
        bound = bound + 2.0 ** -9  # smallest e4m3 subnormal
    assert torch.all((d - want).abs() <= bound)
    assert torch.all((host - want).abs() <= bound)
    assert torch.all((d - host).abs() <= bound)


def test_gemm_host_bit_exact_on_exact_inputs():
    a = _ints((45, 200), -8, 8, torch.bfloat16, 1)
    b = _ints((200, 33), -8, 8, torch.bfloat16, 2)
    ep = Epilogue(alpha=0.5, beta=2.0, bias_axis="col", activation="relu", out_dtype="fp32")
    c = _ints((45, 33), -4, 4, torch.float32, 3)
    bias = _ints((33,), -4, 4, torch.float32, 4)
    d = gemm(a, b, block_m=16, block_n=16, block_k=64, ep=ep, c=c, bias=bias)
    assert _same(d, gemm_host(a, b, block_m=16, block_n=16, block_k=64, ep=ep, c=c, bias=bias))
    want = torch.relu(0.5 * (a.double() @ b.double()) + 2.0 * c.double() + bias.double()[None, :])
    assert _same(d, want)


@pytest.mark.parametrize("a_major,b_major,sw", [("row", "col", 128), ("col", "row", 64), ("row", "row", 0)])
def test_gemm_tile_is_the_literal_stage_chain(a_major, b_major, sw):
    """descriptor -> load -> mma (teacher-forced steps) -> epilogue on one tile == the fused gemm."""
    M, N, K, BM, BN, BK = 70, 80, 200, 32, 64, 64
    a = torch.randn(M, K, generator=_gen(5)).to(torch.bfloat16)
    b = torch.randn(K, N, generator=_gen(6)).to(torch.bfloat16)
    rs = torch.rand(M, generator=_gen(7)) + 0.5
    bias = torch.randn(N, generator=_gen(8))
    ep = Epilogue(alpha=1.5, bias_axis="col", activation="gelu_tanh", out_dtype="bf16")
    d = gemm(a, b, block_m=BM, block_n=BN, block_k=BK, ep=ep, row_scale=rs, bias=bias)
    n_kb = -(-K // BK)
    for tm, tn in ((0, 0), (2, 1)):
        acc = None
        for kb in range(n_kb):
            img_a = D.operand_image(a, "a", a_major, tm, kb, BM, BK, sw)
            img_b = D.operand_image(b, "b", b_major, tn, kb, BN, BK, sw)
            at = L.tile_from_image(img_a, "a", a_major, BM, BK, "bf16", sw)
            bt = L.tile_from_image(img_b, "b", b_major, BN, BK, "bf16", sw)
            acc = X.mma_step(acc, at, bt)
        r0, c0 = tm * BM, tn * BN
        rows, cols = min(BM, M - r0), min(BN, N - c0)
        rs_t = torch.zeros(BM)
        rs_t[:rows] = rs[r0:r0 + rows]
        bias_t = torch.zeros(BN)
        bias_t[:cols] = bias[c0:c0 + cols]
        tile = run_epilogue(acc, ep, row_scale=rs_t, bias=bias_t)
        assert _same(tile[:rows, :cols].float(), d[r0:r0 + rows, c0:c0 + cols].float())


def test_package_surface():
    a = _ints((20, 40), -3, 3, torch.float16, 9)
    b = _ints((40, 20), -3, 3, torch.float16, 10)
    d1 = kernels_ref.gemm(a, b, block_m=16, block_n=16, block_k=32, ep=Epilogue(out_dtype="fp32"))
    d2 = kernels_ref.gemm.gemm(a, b, block_m=16, block_n=16, block_k=32, ep=Epilogue(out_dtype="fp32"))
    assert _same(d1, d2) and _same(d1, a.double() @ b.double())
    assert callable(kernels_ref.epilogue) and hasattr(kernels_ref.epilogue, "apply_cast")
    for name in kernels_ref.__all__:
        assert hasattr(kernels_ref, name), name


def test_gemm_errors_and_check_supported():
    a = torch.zeros(32, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="ep must be an Epilogue"):
        gemm(a, b, ep={"alpha": 1.0})
    with pytest.raises(ValueError, match="c .* is required"):
        gemm(a, b, block_m=16, block_n=16, block_k=32, ep=Epilogue(beta=1.0))
    with pytest.raises(ValueError, match="promotion_interval"):
        gemm(a, b, block_m=16, block_n=16, block_k=32, promotion_interval=32)
    with pytest.raises(ValueError, match="block_scale_group"):
        gemm(a, b, block_m=16, block_n=16, block_k=32, scale_a_block=torch.ones(32, 1),
             scale_b_block=torch.ones(1, 1))
    assert check_supported("e4m3", "e4m3", "fp32", 128, 128, 128, 128, (1, 128, 128), True,
                           Epilogue(out_dtype="e4m3")) == []
    assert len(check_supported("bf16", "bf16", "fp16", 128, 128, 64)) == 1
    assert gemm(a[:0], b, block_m=16, block_n=16, block_k=32).shape == (0, 32)

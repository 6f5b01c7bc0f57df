"""GPU tier for kernels_ref: the compiled Triton references (not the interpreter) against torch on
CUDA and against the host specs, at realistic sizes. Each test seeds its own inputs.

Bounds: an fp32 accumulation of K products per element is within (BK + n_kblocks + 2) * 2**-24 *
sum_k |a||b| of the exact value (each k-block's dot, then one rounding per k-block); TF32 or an
fp16 accumulator would break it. Data movement and the cast are bit-exact.
"""

import pytest
import torch

from kernels_ref import descriptor as D
from kernels_ref import epilogue as E
from kernels_ref import load as L
from kernels_ref import mma as X
from kernels_ref.dtypes import DTYPES
from kernels_ref.gemm import gemm

pytestmark = pytest.mark.gpu

U32 = 2.0 ** -24
DEV = "cuda"


def _gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def _randn(shape, dtype, seed, scale=1.0):
    return (torch.randn(shape, generator=_gen(seed), device=DEV) * scale).to(dtype)


def _ints(shape, lo, hi, dtype, seed):
    return torch.randint(lo, hi + 1, shape, generator=_gen(seed), device=DEV).to(dtype)


def _same(got, want):
    g, w = got.double(), want.double().to(got.device)
    return g.shape == w.shape and torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(0), w.nan_to_num(0))


def _fp32_bound(a, b, bk):
    s = a.double().abs() @ b.double().abs()
    n_kb = -(-a.shape[1] // bk)
    return (bk + n_kb + 2) * U32 * s


@pytest.mark.parametrize("dtype,shape", [
    (torch.bfloat16, (4096, 4096, 4096)), (torch.float16, (4096, 4096, 4096)), (torch.bfloat16, (3000, 2500, 3333)),
    (torch.float32, (2048, 2048, 2048)),
])
def test_gemm_fp32_acc_vs_float64(dtype, shape):
    M, N, K = shape
    a, b = _randn((M, K), dtype, 1), _randn((K, N), dtype, 2)
    bk = 64 if dtype != torch.float32 else 32
    d = gemm(a, b, block_m=128, block_n=128, block_k=bk, ep=E.Epilogue(out_dtype="fp32"))
    exact = a.double() @ b.double()
    bound = _fp32_bound(a, b, bk)  # TF32 (10-bit mantissa) products would break it
    err = (d.double() - exact).abs()
    assert torch.all(err <= bound), float((err / bound).max())
    if dtype != torch.float32:
        out = "bf16" if dtype == torch.bfloat16 else "fp16"
        d16 = gemm(a, b, ep=E.Epilogue(out_dtype=out))
        assert d16.dtype == DTYPES[out].torch
        ref = torch.matmul(a, b)  # cuBLAS, fp32 accumulation, rounded to the operand type
        u = DTYPES[out].unit_roundoff
        assert torch.all((d16.double() - ref.double()).abs() <= 2 * u * exact.abs() + 2 * bound)


def test_gemm_exact_inputs_bit_exact():
    a, b = _ints((4096, 4096), -8, 8, torch.bfloat16, 3), _ints((4096, 4096), -8, 8, torch.bfloat16, 4)
    d = gemm(a, b, ep=E.Epilogue(out_dtype="fp32"))
    assert _same(d, a.double() @ b.double())


def _scaled_exact(a, b, sa, sb, group):
    gm, gn, gk = group
    M, K = a.shape
    N = b.shape[1]
    out = torch.zeros(M, N, dtype=torch.float64, device=DEV)
    ra = torch.arange(M, device=DEV) // gm
    cb = torch.arange(N, device=DEV) // gn
    for k0 in range(0, K, gk):
        part = a[:, k0:k0 + gk].double() @ b[k0:k0 + gk].double()
        out += part * sa.double()[ra, k0 // gk][:, None] * sb.double()[cb, k0 // gk][None, :]
    return out


@pytest.mark.parametrize("promotion", [None, 128])
def test_fp8_block_scaled_gemm(promotion):
    M, N, K = 4096, 4096, 4096
    group = (1, 128, 128)
    a = _randn((M, K), torch.float8_e4m3fn, 5, 8.0)
    b = _randn((K, N), torch.float8_e4m3fn, 6, 8.0)
    sa = torch.rand(M, K // 128, generator=_gen(7), device=DEV) + 0.5
    sb = torch.rand(N // 128, K // 128, generator=_gen(8), device=DEV) + 0.5
    acc, s = X.mma_accumulate(a, b, 128, 128, 128, promotion_interval=promotion, scale_a=sa, scale_b=sb,
                              block_scale_group=group, with_abs_sum=True)
    exact = _scaled_exact(a, b, sa, sb, group)
    s_exact = _scaled_exact(a.float().abs().to(a.dtype), b.float().abs().to(b.dtype), sa, sb, group)
    assert torch.allclose(s.double(), s_exact, rtol=1e-5)
    # each promotion chunk (4 MMA steps) truncates to 13 bits at most 4 times: 4 * 2**-13 * its
    # own sum |a||b|; then fp32 roundings per k-block (dot, scale, add)
    bound = ((4 * 2.0 ** -13) if promotion else 0.0) * s_exact + (128 + 3 * (K // 128) + 2) * U32 * s_exact
    err = (acc.double() - exact).abs()
    assert torch.all(err <= bound), float((err / bound).max())
    d = gemm(a, b, block_k=128, promotion_interval=promotion, scale_a_block=sa, scale_b_block=sb,
             block_scale_group=group, ep=E.Epilogue(out_dtype="bf16"))
    assert _same(d, E.epilogue(acc, E.Epilogue(out_dtype="bf16")))  # the fused kernel is the composition


def test_fp8_promotion_exact_sums_match_host():
    """Sums of 32 fp8 products that are exact in fp32: the GPU's promotion model equals the host."""
    M, N, K = 512, 512, 2048
    g = _gen(9)
    a = _spread((M, K), torch.float8_e4m3fn, g, -2, 2)
    b = _spread((K, N), torch.float8_e4m3fn, g, -2, 2)
    tiles = [(0, 0), (3, 1)]
    traj = X.mma_trajectory(a, b, tiles, 128, 128, 128, promotion_interval=64)
    host = X.mma_trajectory_host(a.cpu(), b.cpu(), tiles, 128, 128, 128, promotion_interval=64)
    assert _same(traj.cpu(), host)
    plain = X.mma_trajectory(a, b, tiles, 128, 128, 128)
    assert not torch.equal(plain, traj)


def test_int8_gemm_exact():
    a = _ints((4096, 4096), -128, 127, torch.int8, 10)
    b = _ints((4096, 4096), -128, 127, torch.int8, 11)
    acc = X.mma_accumulate(a, b, 128, 128, 64, acc="int32")
    assert acc.dtype == torch.int32 and _same(acc, a.double() @ b.double())
    d = gemm(a, b, acc="int32", tensor_scale=torch.tensor(2.0 ** -10, device=DEV), ep=E.Epilogue(out_dtype="fp32"))
    assert _same(d, (acc.float() * 2.0 ** -10))


def _fp16_acc_emulation(a, b, mma_k):
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16, device=DEV)
    a64, b64 = a.double(), b.double()
    for k0 in range(0, a.shape[1], mma_k):
        s = (a64[:, k0:k0 + mma_k] @ b64[k0:k0 + mma_k]).float()
        acc = (acc.float() + s).half()
    return acc


def _spread(shape, dtype, g, lo=-3, hi=1):
    """Values +-1.mmm * 2^e (3 mantissa bits, e in [lo, hi]): products are exact, a 32-deep sum of
    them spans about 20 bits (exact in fp32), yet an fp16 or 13-bit register must round."""
    mant = torch.randint(8, 16, shape, generator=g, device=DEV).double() / 8
    exp = torch.randint(lo, hi + 1, shape, generator=g, device=DEV).double()
    sign = torch.randint(0, 2, shape, generator=g, device=DEV).double() * 2 - 1
    return (sign * mant * 2.0 ** exp).to(dtype)


def test_fp16_acc_exact_steps_bit_exact():
    g = _gen(12)
    a, b = _spread((2048, 2048), torch.float16, g), _spread((2048, 2048), torch.float16, g)
    got = X.mma_accumulate(a, b, 128, 128, 64, acc="fp16")
    want = _fp16_acc_emulation(a, b, 16)
    assert _same(got, want)
    assert not _same(got, (a.double() @ b.double()).half())  # rounding per step really happened


def test_fp16_acc_random_close():
    a, b = _randn((2048, 2048), torch.float16, 13), _randn((2048, 2048), torch.float16, 14)
    got = X.mma_accumulate(a, b, 128, 128, 64, acc="fp16").double()
    want = _fp16_acc_emulation(a, b, 16).double()
    s = a.double().abs() @ b.double().abs()
    assert torch.all((got - want).abs() <= 2048 // 16 * 2.0 ** -11 * s)
    assert (got == want).double().mean() > 0.9


def test_trajectory_and_teacher_forced_steps():
    M = N = K = 4096
    BM, BN, BK = 128, 128, 64
    a, b = _randn((M, K), torch.bfloat16, 15), _randn((K, N), torch.bfloat16, 16)
    tiles = [(0, 0), (5, 7), (31, 31), (17, 2)]
    traj, s_traj = X.mma_trajectory(a, b, tiles, BM, BN, BK, with_abs_sum=True)
    full = X.mma_accumulate(a, b, BM, BN, BK)
    n_kb = K // BK
    for t, (tm, tn) in enumerate(tiles):
        rows, cols = slice(tm * BM, (tm + 1) * BM), slice(tn * BN, (tn + 1) * BN)
        assert _same(traj[t, -1], full[rows, cols])
        ref = torch.cumsum(torch.stack([a[rows, k:k + BK].double() @ b[k:k + BK, cols].double()
                                        for k in range(0, K, BK)]), 0)
        kb_idx = torch.arange(1, n_kb + 1, device=DEV).double()[:, None, None]
        bound = (BK + kb_idx + 2) * U32 * s_traj[t].double()
        assert torch.all((traj[t].double() - ref).abs() <= bound * 1.01)
        for kb in (0, 1, n_kb // 2, n_kb - 1):
            prev = traj[t, kb - 1] if kb else None
            step = X.mma_step(prev, L.load_tile(a, "a", tm, kb, BM, BK), L.load_tile(b, "b", tn, kb, BN, BK))
            assert _same(step, traj[t, kb]), (t, kb)
    host = X.mma_trajectory_host(a.cpu(), b.cpu(), tiles[:1], BM, BN, BK)
    assert torch.all((traj[:1].cpu().double() - host).abs() <= _fp32_bound(a[:BM], b[:, :BN], BK).cpu() * 1.01)


def test_descriptor_and_load_realistic_tiles():
    for dt, name, bk, sw in ((torch.bfloat16, "bf16", 64, 128), (torch.float8_e4m3fn, "e4m3", 128, 128),
                             (torch.float16, "fp16", 64, 64), (torch.float32, "fp32", 32, 128)):
        x = _randn((1000, 3000), dt, 17)
        for operand in ("a", "b"):
            for major in ("row", "col"):
                if D.check_supported(name, operand, major, 128, bk, sw, "nan"):
                    continue
                n_mn, n_kb = D.tile_counts(operand, x.shape, 128, bk)
                pairs = [(0, 0), (n_mn - 1, n_kb - 1), (3, 5)]
                imgs = D.operand_images(x, operand, major, pairs, 128, bk, sw, "nan")
                host = D.operand_images_host(x.cpu(), operand, major, pairs, 128, bk, sw, "nan")
                assert torch.equal(imgs.cpu(), host), (name, operand, major)
                tiles = L.tile_from_image(imgs, operand, major, 128, bk, name, sw)
                direct = L.load_tiles(x, operand, pairs, 128, bk, "nan")
                bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
                assert torch.equal(tiles.view(bits), direct.view(bits))
    img = torch.randint(0, 256, (1 << 20,), generator=_gen(18), device=DEV, dtype=torch.int32).to(torch.uint8)
    for sw in (32, 64, 128):
        assert torch.equal(D.swizzle(img, sw).cpu(), D.swizzle_host(img.cpu(), sw))


def test_epilogue_4096():
    R = C = 4096
    x = _randn((R, C), torch.float32, 19, 4.0)
    c = _randn((R, C), torch.bfloat16, 20)
    bias = _randn((C,), torch.float32, 21)
    rs = torch.rand(R, generator=_gen(22), device=DEV) + 0.5
    cs = (torch.rand(C, generator=_gen(23), device=DEV) + 0.5).half()
    ts = torch.tensor([0.75], device=DEV)
    kw = dict(c=c, bias=bias, row_scale=rs, col_scale=cs, tensor_scale=ts)
    for act, out, sat in (("relu", "e4m3", False), ("gelu_erf", "bf16", False), ("gelu_tanh", "fp16", True),
                          ("silu", "e5m2", True), ("none", "fp32", False)):
        ep = E.Epilogue(alpha=1.25, beta=-0.5, bias_axis="col", activation=act, out_dtype=out, saturate=sat)
        steps = E.epilogue(x, ep, return_steps=True, **kw)
        host = E.epilogue_host(x.cpu(), ep, return_steps=True, **{k: v.cpu() for k, v in kw.items()})
        for f in ("scale", "alpha_beta", "bias"):
            assert _same(getattr(steps, f).cpu(), getattr(host, f)), (act, f)
        got_act, want_act = steps.activation.cpu().double(), host.activation
        if act in ("relu", "none"):
            assert _same(got_act, want_act)
        else:  # GPU erf/exp are not correctly rounded: a few ulps, plus 1 + erf cancellation
            tol = 2e-6 * want_act.abs() + 4 * U32 * steps.bias.cpu().double().abs() + 1e-30
            assert torch.all((got_act - want_act).abs() <= tol), act
        # the cast itself is integer arithmetic: bit-exact given the same input
        assert _same(steps.cast.cpu().float(), E.apply_cast_host(steps.activation.cpu(), out, sat).float())
    vals = torch.cat([torch.randn(1 << 20, generator=_gen(24), device=DEV) * 10.0 ** torch.randint(
        -8, 8, (1 << 20,), generator=_gen(25), device=DEV),
        torch.tensor([float("inf"), -float("inf"), float("nan"), 464.0, 465.0, 65520.0, 3.4e38], device=DEV)])
    vals = torch.cat([vals, torch.zeros((-vals.numel()) % 1024, device=DEV)]).reshape(-1, 1024)
    for out in E.OUT_DTYPES:
        for sat in (False, True):
            got = E.apply_cast(vals, out, sat).cpu().float()
            assert _same(got, E.apply_cast_host(vals.cpu(), out, sat).float()), (out, sat)


@pytest.mark.parametrize("out", E.OUT_DTYPES)
def test_casts_bit_exact_on_the_gpu(out):
    """The compiled cast against its host spec, bit for bit, on every input class the CPU test
    (tests/cpu/test_casts.py) holds the interpreter to: past the range, NaN, +-inf, -0.0,
    subnormals, ties. The GPU converts float -> int by saturating and NaN -> 0 and numpy does
    not; the explicit integer arithmetic of the cast must make both agree."""
    from cast_inputs import cast_inputs, same_bits

    x = cast_inputs(out)
    for sat in (False, True):
        got = E.apply_cast(x.to(DEV), out, sat)
        want = E.apply_cast_host(x, out, sat)
        bad = same_bits(got, want)
        flat = x.reshape(-1)
        assert not bad, f"{out} saturate={sat}, {len(bad)} elements: " + "; ".join(
            f"x={flat[i].item()!r}: got {g:#x}, want {w:#x}" for i, g, w in bad[:8])
        # the fused epilogue (the gemm's epilogue helper) casts the same way
        steps = E.epilogue(x.to(DEV), E.Epilogue(out_dtype=out, saturate=sat), return_steps=True)
        assert not same_bits(steps.cast, E.apply_cast_host(steps.activation.cpu(), out, sat))

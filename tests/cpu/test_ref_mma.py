"""MMA stage: accumulator semantics (fp32, int32, fp8 promotion, block scales) against the float64
host spec and against independent statements of each rule (the fp16 accumulator's per-MMA-step
rounding is in tests/cpu/test_ref_mma_fp16.py)."""

import pytest
import torch

from kernels_ref import load as L
from kernels_ref import mma as X
from kernels_ref import mma_sample
from kernels_ref import mma_stats as S
from kernels_ref.mma_params import MainloopParams
from kernels_ref.dtypes import DTYPES
from ref_checks import block_scaled_operands, gen, ints, same  # tests/ is on sys.path

U32 = 2.0 ** -24


PAIRS = [("fp32", "fp32"), ("fp16", "fp16"), ("bf16", "bf16"), ("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2")]


@pytest.mark.parametrize("ad,bd", PAIRS)
def test_fp32_acc_exact_inputs_bit_exact(ad, bd):
    M, N, K = 33, 47, 2500
    a = ints((M, K), -8, 8, DTYPES[ad].torch, 1)
    b = ints((K, N), -8, 8, DTYPES[bd].torch, 2)
    got = X.mma_accumulate(a, b, 32, 24, 128)  # ragged in M, N and K; BN not a power of two
    assert got.dtype == torch.float32 and got.shape == (M, N)
    exact = a.double() @ b.double()
    assert same(got, exact)
    assert same(X.mma_accumulate_host(a, b, 32, 24, 128), exact)


@pytest.mark.parametrize("ad", ["fp32", "fp16", "bf16", "e4m3", "e5m2"])
def test_fp32_acc_random_within_rounding_bound(ad):
    M, N, K, BK = 40, 24, 700, 64
    a = (torch.randn(M, K, generator=gen(3)) * 2).to(DTYPES[ad].torch)
    b = torch.randn(K, N, generator=gen(4)).to(DTYPES[ad].torch)
    got, s = X.mma_accumulate(a, b, 32, 16, BK, with_abs_sum=True)
    host, s_host = X.mma_accumulate_host(a, b, 32, 16, BK, with_abs_sum=True)
    exact = a.double() @ b.double()
    s_exact = a.double().abs() @ b.double().abs()
    n_kb = -(-K // BK)
    bound = (BK + n_kb + 2) * U32 * s_exact
    assert torch.all((got.double() - exact).abs() <= bound)
    assert torch.all((host - exact).abs() <= bound)
    assert torch.all((got.double() - host).abs() <= bound)
    assert torch.allclose(s.double(), s_exact, rtol=1e-5, atol=0)
    assert torch.allclose(s_host, s_exact, rtol=1e-12, atol=0)


def test_int8_exact_accumulation():
    M, N, K = 35, 29, 3000
    a = torch.randint(-128, 128, (M, K), generator=gen(7), dtype=torch.int8)
    b = torch.randint(-128, 128, (K, N), generator=gen(8), dtype=torch.int8)
    got, s = X.mma_accumulate(a, b, 32, 16, 128, acc="int32", with_abs_sum=True)
    assert got.dtype == torch.int32
    want = a.long() @ b.long()
    assert torch.equal(got.long(), want)
    assert torch.equal(X.mma_accumulate_host(a, b, 32, 16, 128, acc="int32").long(), want)
    assert torch.allclose(s.double(), (a.double().abs() @ b.double().abs()), rtol=1e-6)


def test_truncate_mantissa_host_rule():
    v = torch.tensor([1 + 2.0 ** -13, 1 + 2.0 ** -14, -(1 + 2.0 ** -14), 3.0 * 2 ** 20 + 1, float("inf"),
                      float("nan"), 0.0, 1e-40], dtype=torch.float64)
    t = X.truncate_mantissa_host(v)
    assert t[0] == 1 + 2.0 ** -13 and t[1] == 1.0 and t[2] == -1.0 and t[3] == 3.0 * 2 ** 20
    assert torch.isinf(t[4]) and torch.isnan(t[5]) and t[6] == 0
    assert 0 < t[7] <= v[7]


def _promotion_case():
    a = torch.zeros(16, 64)
    b = torch.zeros(64, 16)
    a[:, :32] = 16.0
    b[:32, :] = 32.0  # first MMA step: 32 * 512 = 16384
    a[:, 32] = 1.0
    b[32, :] = 1.0  # second MMA step: 1
    a[8:, :] *= -1  # negative rows: truncation goes toward zero
    return a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)


def test_fp8_promotion_truncates_inside_the_interval():
    a, b = _promotion_case()
    promoted = X.mma_accumulate(a, b, 16, 16, 64, promotion_interval=64)
    assert torch.all(promoted[:8] == 16384) and torch.all(promoted[8:] == -16384)
    each_step = X.mma_accumulate(a, b, 16, 16, 64, promotion_interval=32)
    plain = X.mma_accumulate(a, b, 16, 16, 64)
    assert torch.all(each_step[:8] == 16385) and torch.all(plain[8:] == -16385)
    assert same(X.mma_accumulate_host(a, b, 16, 16, 64, promotion_interval=64), promoted)
    assert same(X.mma_step(None, a, b, promotion_interval=64), promoted)
    assert same(X.mma_step_host(None, a, b, promotion_interval=64), promoted)


def _spread_fp8(shape, seed):
    """e4m3 values 1.mmm * 2^e, e in [-2, 2], random sign: a 32-deep sum of products spans about
    21 bits, so it is exact in fp32 but does not fit the 13-bit promotion mantissa."""
    g = gen(seed)
    mant = torch.randint(8, 16, shape, generator=g).double() / 8
    exp = torch.randint(-2, 3, shape, generator=g).double()
    sign = torch.randint(0, 2, shape, generator=g).double() * 2 - 1
    return (sign * mant * 2.0 ** exp).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("bk,p", [(64, 32), (128, 64), (128, 128)])
def test_fp8_promotion_matches_host(bk, p):
    M, N, K = 24, 40, 1000
    a, b = _spread_fp8((M, K), bk + p), _spread_fp8((K, N), bk + p + 1)
    got = X.mma_accumulate(a, b, 16, 32, bk, promotion_interval=p)
    host = X.mma_accumulate_host(a, b, 16, 32, bk, promotion_interval=p)
    assert same(got, host)
    plain = X.mma_accumulate(a, b, 16, 32, bk)
    exact = a.double() @ b.double()
    s = a.double().abs() @ b.double().abs()
    assert torch.all((plain.double() - exact).abs() <= 4 * U32 * s)
    assert not torch.equal(got, plain)  # the limited-precision accumulation is visible ...
    assert torch.all((got.double() - exact).abs() <= (K // 32) * 2.0 ** -12 * s)  # ... and bounded


def _scaled_case(seed, pow2=True):
    return block_scaled_operands(45, 70, 300, 32, 64, seed, seed, pow2)


def _scaled_exact(a, b, sa, sb, group, bk):
    gm, gn, gk = group
    M, K = a.shape
    N = b.shape[1]
    out = torch.zeros(M, N, dtype=torch.float64)
    for k0 in range(0, K, bk):
        kc = k0 // gk
        part = a.double()[:, k0:k0 + bk] @ b.double()[k0:k0 + bk, :]
        out += part * sa.double()[torch.arange(M) // gm, kc][:, None] * sb.double()[torch.arange(N) // gn, kc][None, :]
    return out


def test_block_scales_exact():
    a, b, sa, sb, grp = _scaled_case(11)
    got, s = X.mma_accumulate(a, b, 16, 32, 32, scale_a=sa, scale_b=sb, block_scale_group=grp, with_abs_sum=True)
    want = _scaled_exact(a, b, sa, sb, grp, 32)
    assert same(got, want)
    assert same(X.mma_accumulate_host(a, b, 16, 32, 32, scale_a=sa, scale_b=sb, block_scale_group=grp), want)
    s_want = _scaled_exact(a.float().abs().to(a.dtype), b.float().abs().to(b.dtype), sa, sb, grp, 32)
    assert torch.allclose(s.double(), s_want, rtol=1e-6)
    # scales on the wrong axis give something else: the stage can tell
    wrong = X.mma_accumulate(a, b, 16, 32, 32, scale_a=sa, scale_b=torch.ones_like(sb), block_scale_group=grp)
    assert not torch.equal(wrong, got)


def test_block_scales_random_and_with_promotion():
    a, b, sa, sb, grp = _scaled_case(12, pow2=False)
    got = X.mma_accumulate(a, b, 16, 32, 64, scale_a=sa, scale_b=sb, block_scale_group=grp)
    host = X.mma_accumulate_host(a, b, 16, 32, 64, scale_a=sa, scale_b=sb, block_scale_group=grp)
    assert same(got, host)  # integer operands: every partial product is exact, so is each rounding order
    exact = _scaled_exact(a, b, sa, sb, grp, 64)
    assert torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-3)
    pro = X.mma_accumulate(a, b, 16, 32, 64, promotion_interval=32, scale_a=sa, scale_b=sb, block_scale_group=grp)
    pro_host = X.mma_accumulate_host(a, b, 16, 32, 64, promotion_interval=32, scale_a=sa, scale_b=sb,
                                     block_scale_group=grp)
    assert same(pro, pro_host)


def test_trajectory_is_teacher_forced_steps():
    a, b, sa, sb, grp = _scaled_case(13, pow2=False)
    BM, BN, BK = 16, 32, 32
    tiles = [(0, 0), (2, 1), (1, 2)]
    traj, s_traj = X.mma_trajectory(a, b, tiles, BM, BN, BK, promotion_interval=32, scale_a=sa, scale_b=sb,
                                    block_scale_group=grp, with_abs_sum=True)
    n_kb = -(-a.shape[1] // BK)
    assert traj.shape == (3, n_kb, BM, BN) and traj.dtype == torch.float32
    host = X.mma_trajectory_host(a, b, tiles, BM, BN, BK, promotion_interval=32, scale_a=sa, scale_b=sb,
                                 block_scale_group=grp)
    assert same(traj, host)
    full = X.mma_accumulate(a, b, BM, BN, BK, promotion_interval=32, scale_a=sa, scale_b=sb, block_scale_group=grp)
    M, N = full.shape
    for t, (tm, tn) in enumerate(tiles):
        rows = slice(tm * BM, min((tm + 1) * BM, M))
        cols = slice(tn * BN, min((tn + 1) * BN, N))
        last = traj[t, -1][:rows.stop - rows.start, :cols.stop - cols.start]
        assert same(last, full[rows, cols])
        prev = None
        for kb in range(n_kb):
            ridx = (tm * BM + torch.arange(BM)).clamp(max=M - 1)
            cidx = (tn * BN + torch.arange(BN)).clamp(max=N - 1)
            kc = kb * BK // grp[2]
            ra = torch.where(tm * BM + torch.arange(BM) < M, sa[ridx // grp[0], kc], 0.0)
            cb = torch.where(tn * BN + torch.arange(BN) < N, sb[cidx // grp[1], kc], 0.0)
            step, s_step = X.mma_step(prev, L.load_tile(a, "a", tm, kb, BM, BK), L.load_tile(b, "b", tn, kb, BN, BK),
                                      promotion_interval=32, scale_a=ra, scale_b=cb, with_abs_sum=True)
            assert same(step, traj[t, kb]), (t, kb)
            s_prev = s_traj[t, kb - 1] if kb else 0
            assert torch.allclose(s_step, s_traj[t, kb] - s_prev, rtol=1e-5, atol=1e-3)
            prev = step


def test_oob_nan_fill_reaches_the_accumulator():
    a = torch.randn(40, 100, generator=gen(30)).to(torch.bfloat16)
    b = torch.randn(100, 36, generator=gen(31)).to(torch.bfloat16)
    assert torch.isnan(X.mma_accumulate(a, b, 16, 16, 64, oob_fill="nan")).all()  # K=100 is ragged
    a2, b2 = a[:, :64], b[:64, :]  # K a multiple of BK: only M/N padding is NaN, which feeds no output
    got = X.mma_accumulate(a2, b2, 16, 16, 64, oob_fill="nan")
    assert torch.equal(got, X.mma_accumulate(a2, b2, 16, 16, 64))
    traj = X.mma_trajectory(a2, b2, [(2, 2)], 16, 16, 64, oob_fill="nan")
    assert torch.isnan(traj[0, 0, 8:, :]).all() and not torch.isnan(traj[0, 0, :8, :4]).any()
    host = X.mma_trajectory_host(a2, b2, [(2, 2)], 16, 16, 64, oob_fill="nan")
    assert torch.equal(traj.isnan(), host.isnan())
    assert torch.allclose(traj.double().nan_to_num(0), host.nan_to_num(0), rtol=1e-5, atol=1e-5)


def test_check_supported_and_errors():
    assert X.check_supported("bf16", "bf16", "fp32", 128, 128, 64) == []
    assert X.check_supported("e4m3", "e5m2", "fp32", 128, 128, 128, 128, (1, 128, 128), True) == []
    r = X.check_supported("bf16", "bf16", "fp16", 64, 64, 64)
    assert len(r) == 1 and "acc='fp16'" in r[0]
    r = X.check_supported("fp16", "fp16", "fp16", 64, 64, 40)
    assert len(r) == 1 and "multiple" in r[0]
    r = X.check_supported("e4m3", "e4m3", "fp32", 64, 64, 64, 48)
    assert len(r) == 1 and "promotion_interval" in r[0]
    r = X.check_supported("bf16", "bf16", "fp32", 64, 64, 64, 64)
    assert len(r) == 1 and "fp8" in r[0]
    r = X.check_supported("e4m3", "e4m3", "fp32", 64, 64, 64, None, (1, 128, 96), True)
    assert len(r) == 1 and "gk=96" in r[0]
    r = X.check_supported("int8", "fp16", "int32", 64, 64, 64)
    assert len(r) == 1 and "int8" in r[0]
    a = torch.zeros(32, 64, dtype=torch.bfloat16)
    b = torch.zeros(64, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="acc="):
        X.mma_accumulate(a, b, 16, 16, 32, acc="fp64")
    with pytest.raises(ValueError, match=r"a must be \[M, K\]"):
        X.mma_accumulate(a, a, 16, 16, 32)
    with pytest.raises(ValueError, match="together"):
        X.mma_accumulate(a, b, 16, 16, 32, scale_a=torch.ones(32, 1))
    f8a, f8b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="scale_b has shape"):
        X.mma_accumulate(f8a, f8b, 16, 16, 32, scale_a=torch.ones(32, 1), scale_b=torch.ones(2, 2),
                         block_scale_group=(1, 16, 64))
    with pytest.raises(ValueError, match="tiles"):
        X.mma_trajectory(a, b, [(2, 0)], 16, 16, 32)
    with pytest.raises(ValueError, match="acc_prev has dtype"):
        X.mma_step(torch.zeros(16, 16), a[:16, :32].half(), b[:32, :16].half(), acc="fp16")


@pytest.mark.parametrize("ad,acc,promo,chunk", [("bf16", "fp32", None, 128), ("fp32", "fp32", None, None),
                                                ("e4m3", "fp32", 64, 128), ("fp16", "fp16", None, None)])
def test_bound_statistics_triton_against_host_spec(ad, acc, promo, chunk):
    """with_stats: l, v, q, pabs, prun from the kernel equal the host spec's (its trajectory's)."""
    M, N, K = 40, 24, 300
    a = torch.randn(M, K, generator=gen(11)).to(DTYPES[ad].torch)
    b = torch.randn(K, N, generator=gen(12)).to(DTYPES[ad].torch)
    got, s, st = X.mma_accumulate(a, b, 32, 16, 64, acc=acc, promotion_interval=promo, with_stats=True,
                                  stats_chunk=chunk)
    host, s_h, st_h = X.mma_accumulate_host(a, b, 32, 16, 64, acc=acc, promotion_interval=promo, with_stats=True,
                                            stats_chunk=chunk)
    assert same(got, X.mma_accumulate(a, b, 32, 16, 64, acc=acc, promotion_interval=promo))
    for f in ("l", "v", "q", "pabs", "prun"):
        g, w = getattr(st, f).double(), getattr(st_h, f).double()
        assert torch.allclose(g, w, rtol=2e-3 if acc == "fp16" else 1e-5, atol=0), f
    assert (st.q.abs().max() > 0) == (ad == "fp32")
    assert (st.pabs.abs().max() > 0) == (chunk is not None)
    # the definitions, stated independently on the exact trajectory
    a64, b64 = a.double(), b.double()
    x, lo, hi, l = torch.zeros(M, N, dtype=torch.float64), None, None, torch.zeros(M, N, dtype=torch.float64)
    seen = [x]
    for k0 in range(0, K, 64):
        prev = x
        x = x + a64[:, k0:k0 + 64] @ b64[k0:k0 + 64]
        rng = torch.stack([(prev - c).abs() for c in seen]).amax(0)
        l = l + rng + a64[:, k0:k0 + 64].abs() @ b64[k0:k0 + 64].abs()
        seen.append(x)
    assert torch.allclose(st_h.l.double(), l, rtol=1e-2 if acc == "fp16" or ad == "e4m3" else 1e-4)


@pytest.mark.parametrize("ad,promo", [("bf16", None), ("e4m3", 64)])
def test_bound_statistics_do_not_depend_on_the_launch_tile(ad, promo):
    """The GPU launches the statistics kernel on its own tile (STATS_LAUNCH): every output bit
    is the problem tile's, ragged edges included. The operands are quarters, whose k-block sums
    are exact in fp32 in any order: the interpreter's dot sums in numpy's BLAS order, which on
    some CPUs changes with the tile's shape."""
    M, N, K = 70, 40, 200
    a = ints((M, K), -8, 8, torch.float32, 15).div(4).to(DTYPES[ad].torch)
    b = ints((K, N), -8, 8, torch.float32, 16).div(4).to(DTYPES[ad].torch)
    p = MainloopParams(a, b, 32, 32, 64, "fp32", promo)
    runs = [S.accumulate_stats(p, 128, a.device, launch=t) for t in (None, S.STATS_LAUNCH, S.StatsLaunch(16, 64))]
    for got in runs[1:]:
        for x, y in zip(runs[0][:2] + (runs[0][2].l, runs[0][2].v, runs[0][2].pabs, runs[0][2].prun),
                        got[:2] + (got[2].l, got[2].v, got[2].pabs, got[2].prun)):
            assert same(x, y)


def test_stats_launch_is_named_and_parsed_and_the_fast_path_is_the_gpus_only():
    assert S.StatsLaunch.parse("64x32") == S.StatsLaunch(64, 32, 4, 3)
    assert S.StatsLaunch.parse("128x32x8x4").label() == "128x32x8x4"
    for bad in ("64", "64x0", "64x32x4", "ax32"):
        with pytest.raises(ValueError):
            S.StatsLaunch.parse(bad)
    a = torch.randn(16, 64, generator=gen(3)).to(torch.bfloat16)
    p = MainloopParams(a, a.t().contiguous(), 16, 16, 64)
    assert not S.fast_path_applies(p)  # interpreted: the general kernel, whose bits the GPU's fast one must give


def test_a_fast_kernel_the_compiler_refuses_gives_way_to_the_general_one(monkeypatch):
    from triton.compiler.errors import CompilationError

    class Refused:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise CompilationError("src", None, "planted refusal")
            return launch

    a = torch.randn(16, 64, generator=gen(4)).to(torch.bfloat16)
    p = MainloopParams(a, a.t().contiguous(), 16, 16, 64)
    want = S.accumulate_stats(p, None, a.device)
    monkeypatch.setattr(S, "fast_path_applies", lambda p: True)
    monkeypatch.setattr(S, "_stats_fast_kernel", Refused())
    with pytest.warns(RuntimeWarning, match="fast path could not be built.*general kernel is used"):
        got = S.accumulate_stats(p, None, a.device, fast=True)
    assert all(same(x, y) for x, y in zip(got[:2] + (got[2].l, got[2].v), want[:2] + (want[2].l, want[2].v)))


def test_the_fast_path_is_taken_only_in_the_envelope_its_gpu_test_holds(monkeypatch):
    """fast_path_applies as it answers when compiled (tests/gpu/test_stats_fast_gpu.py holds the bits
    inside it): bf16 / fp16, fp32 accumulator, zero fill, K a multiple of block_k, A row-major with a
    row stride of a multiple of 16, B row- or column-major."""
    monkeypatch.setattr(S.C, "interpreting", lambda: False)
    a = torch.randn(64, 128, generator=gen(5)).to(torch.bfloat16)
    b = torch.randn(128, 64, generator=gen(6)).to(torch.bfloat16)
    assert S.fast_path_applies(MainloopParams(a, b, 64, 64, 64))
    assert S.fast_path_applies(MainloopParams(a.half(), b.half(), 64, 64, 64))
    assert S.fast_path_applies(MainloopParams(a, b.t().contiguous().t(), 64, 64, 64))  # B column-major
    assert not S.fast_path_applies(MainloopParams(a, b, 64, 64, 64, oob_fill="nan"))
    assert not S.fast_path_applies(MainloopParams(a, b, 64, 64, 48))  # a dot of 48 is padded
    assert not S.fast_path_applies(MainloopParams(a[:, :100], b[:100], 64, 64, 64))  # a ragged last k-block
    wide = torch.zeros(64, 136, dtype=a.dtype)
    assert not S.fast_path_applies(MainloopParams(wide[:, :128], b, 64, 64, 64))  # A's row stride 136
    assert not S.fast_path_applies(MainloopParams(a.t().contiguous().t(), b, 64, 64, 64))  # A column-major
    assert not S.fast_path_applies(MainloopParams(a.float(), b.float(), 64, 64, 64))
    e4 = torch.float8_e4m3fn
    assert not S.fast_path_applies(MainloopParams(a.to(e4), b.to(e4), 64, 64, 64))
    assert not S.fast_path_applies(MainloopParams(a.to(e4), b.to(e4), 64, 64, 64, promotion_interval=64))


def test_trajectory_stats_of_a_trajectory_end_where_the_whole_accumulation_does():
    a = torch.randn(16, 256, generator=gen(13)).to(torch.bfloat16)
    b = torch.randn(256, 16, generator=gen(14)).to(torch.bfloat16)
    traj, s_traj = X.mma_trajectory_host(a, b, [(0, 0)], 16, 16, 64, with_abs_sum=True)
    st = S.trajectory_stats(traj, s_traj, 128, 64)
    _, _, whole = X.mma_accumulate_host(a, b, 16, 16, 64, with_stats=True, stats_chunk=128)
    for f in ("l", "v", "pabs", "prun"):
        assert torch.allclose(getattr(st, f)[0, -1].double(), getattr(whole, f).double(), rtol=1e-6)
    with pytest.raises(ValueError, match="stats_chunk=100 must be a positive multiple of block_k=64"):
        S.trajectory_stats(traj, s_traj, 100, 64)
    with pytest.raises(ValueError, match="acc='int32' is exact"):
        X.mma_accumulate_host(torch.ones(4, 64, dtype=torch.int8), torch.ones(64, 4, dtype=torch.int8), 4, 4, 64,
                              acc="int32", with_stats=True)


def _sampled_and_loop(seed: int, shape, ad, acc, promo, scaled, tiles, lines, **kw):
    """mma_sample_host's accumulator and S at the rows `lines` (every column) of `tiles`, and the loop
    spec's at the same elements, on random operands of `ad` ([m, k] x [k, n], 32 x 32 tiles)."""
    g = gen(seed)
    m, n, k = shape
    bm, bn, bk = 32, 32, (128 if promo else 64)
    dt = DTYPES[ad].torch
    if ad == "int8":
        a, b = ints((m, k), -128, 127, dt, seed + 1), ints((k, n), -128, 127, dt, seed + 2)
    else:
        a, b = (torch.randn(m, k, generator=g) * 3).to(dt), (torch.randn(k, n, generator=g) * 3).to(dt)
    kw.update(acc=acc, promotion_interval=promo)
    if scaled:
        kw.update(scale_a=torch.rand(-(-m // 32), -(-k // bk), generator=g) + 0.5,
                  scale_b=torch.rand(-(-n // 32), -(-k // bk), generator=g) + 0.5, block_scale_group=(32, 32, bk))
    loop, loop_s = X.mma_trajectory_host(a, b, tiles, bm, bn, bk, with_abs_sum=True, **kw)
    rows = torch.tensor([[tm * bm + r for r in lines] for tm, _ in tiles])
    cols = torch.tensor([[tn * bn + c for c in range(bn)] for _, tn in tiles])
    got, s = mma_sample.mma_sample_host(a, b, rows, cols, bm, bn, bk, **kw)
    return got, s, loop[:, -1][:, lines], loop_s[:, -1][:, lines]


@pytest.mark.parametrize("ad, acc, promo, scaled, oob", [
    ("bf16", "fp32", None, False, "zero"), ("bf16", "fp32", None, False, "nan"), ("fp32", "fp32", None, False, "zero"),
    ("fp16", "fp16", None, False, "zero"), ("e4m3", "fp32", 64, False, "zero"), ("e4m3", "fp32", None, True, "zero"),
    ("e4m3", "fp32", 64, True, "zero"), ("int8", "int32", None, False, "zero")])
def test_the_sampled_spec_is_the_loop_spec_at_its_elements(ad, acc, promo, scaled, oob):
    """mma_sample_host (every k-block's product at once, the roundings in order) gives the loop
    spec's final accumulator bit for bit at the sampled rows and columns, ragged tiles included,
    and S up to float64 summation order."""
    lines = [0, 1, 5, 31]
    got, s, want, want_s = _sampled_and_loop(3, (70, 50, 200), ad, acc, promo, scaled, [(0, 0), (2, 1)], lines,
                                             oob_fill=oob)  # tile (2, 1): rows past M; K = 200: a ragged k-block
    assert got.shape == s.shape == (2, len(lines), 32) and got.dtype == torch.float64
    assert same(got, want)
    assert torch.allclose(s, want_s, rtol=1e-12, atol=0, equal_nan=True)


@pytest.mark.parametrize("ad, acc, promo, scaled", [
    ("bf16", "fp32", None, False), ("fp16", "fp16", None, False), ("e4m3", "fp32", 64, True),
    ("int8", "int32", None, False)])
def test_the_sampled_spec_inside_the_problem_reads_the_operands_without_a_fill(ad, acc, promo, scaled, monkeypatch):
    """Sampled elements inside M x N with K a whole number of k-blocks: their rows and columns are
    read as they are (no fill to place), and the spec is still the loop spec's at those elements."""

    def no_fill(*args):
        raise AssertionError("the operands were filled")

    monkeypatch.setattr(mma_sample, "_filled_operands", no_fill)
    got, s, want, want_s = _sampled_and_loop(4, (64, 64, 256), ad, acc, promo, scaled, [(0, 1), (1, 0)], [0, 7, 31])
    assert same(got, want)
    assert torch.allclose(s, want_s, rtol=1e-12, atol=0)

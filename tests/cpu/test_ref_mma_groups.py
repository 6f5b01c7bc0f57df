"""MMA stage with block scales beyond one scale per k-block: scale groups narrower than the k-block
(each group's product promoted into the fp32 accumulator with its own scale) and split-K partials
with block scales, against the float64 host specs and against the rule written out by hand."""

import pytest
import torch

from kernels_ref import gemm as G
from kernels_ref import load as L
from kernels_ref import mma as X
from kernels_ref import mma_sample
from kernels_ref.epilogue import Epilogue, epilogue
from ref_checks import block_scaled_operands, same  # tests/ is on sys.path

M, N, K, BM, BN, BK = 40, 36, 128, 16, 16, 64


def _case(seed: int, gk: int, pow2: bool = True, gn: int = 16):
    return block_scaled_operands(M, N, K, gn, gk, seed, seed + 2, pow2)


def _by_hand(a, b, sa, sb, group, k_begin=0, k_end=K, width=None):
    """The rule written out: for each scale group in k order, fp32 of its product, times
    fp32(sa * sb), added into an fp32 accumulator (width: the k of one promoted product)."""
    gm, gn, gk = group
    width = width or gk
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    rows, cols = torch.arange(a.shape[0]) // gm, torch.arange(b.shape[1]) // gn
    for k0 in range(k_begin, k_end, width):
        p = (a.double()[:, k0:k0 + width] @ b.double()[k0:k0 + width]).float()
        s = (sa[rows, k0 // gk][:, None] * sb[cols, k0 // gk][None, :]).float()
        acc = acc + p * s
    return acc


@pytest.mark.parametrize("gk", [16, 32])
def test_groups_narrower_than_the_k_block_promote_each_group_with_its_scale(gk):
    a, b, sa, sb, grp = _case(40, gk, pow2=False)
    got, s = X.mma_accumulate(a, b, BM, BN, BK, scale_a=sa, scale_b=sb, block_scale_group=grp, with_abs_sum=True)
    want = _by_hand(a, b, sa, sb, grp)
    assert same(got, want)
    assert same(X.mma_accumulate_host(a, b, BM, BN, BK, scale_a=sa, scale_b=sb, block_scale_group=grp), want)
    s_want = _by_hand(a.float().abs().to(a.dtype), b.float().abs().to(b.dtype), sa, sb, grp)
    assert torch.allclose(s.double(), s_want.double(), rtol=1e-6)
    # one scale per k-block (the first group's for the whole block) is something else
    first = sa[:, ::BK // gk].repeat_interleave(BK // gk, 1), sb[:, ::BK // gk].repeat_interleave(BK // gk, 1)
    assert not torch.equal(X.mma_accumulate(a, b, BM, BN, BK, scale_a=first[0], scale_b=first[1],
                                            block_scale_group=grp), got)


def test_groups_with_promotion_follow_the_host_spec_and_the_gemm():
    a, b, sa, sb, grp = _case(41, 32, pow2=False)
    kw = dict(promotion_interval=32, scale_a=sa, scale_b=sb, block_scale_group=grp)
    got = X.mma_accumulate(a, b, BM, BN, BK, **kw)
    assert same(got, X.mma_accumulate_host(a, b, BM, BN, BK, **kw))
    assert same(got, _by_hand(a, b, sa, sb, grp))  # small integers: the 13-bit chunks are exact
    gk = dict(scale_a_block=sa, scale_b_block=sb, block_scale_group=grp, promotion_interval=32)
    d = G.gemm(a, b, block_m=BM, block_n=BN, block_k=BK, ep=Epilogue(out_dtype="fp32"), **gk)
    assert same(d, epilogue(got, Epilogue(out_dtype="fp32")))
    assert same(d, G.gemm_host(a, b, block_m=BM, block_n=BN, block_k=BK, ep=Epilogue(out_dtype="fp32"), **gk))


def test_trajectory_with_groups_is_teacher_forced_steps_of_group_scales():
    a, b, sa, sb, grp = _case(42, 32, pow2=False)
    tiles = [(0, 0), (2, 1)]
    traj, s_traj = X.mma_trajectory(a, b, tiles, BM, BN, BK, scale_a=sa, scale_b=sb, block_scale_group=grp,
                                    with_abs_sum=True)
    assert same(traj, X.mma_trajectory_host(a, b, tiles, BM, BN, BK, scale_a=sa, scale_b=sb, block_scale_group=grp))
    for t, (tm, tn) in enumerate(tiles):
        prev = None
        for kb in range(K // BK):
            cols = [kb * 2, kb * 2 + 1]  # the k-block's two groups
            ra = sa[(tm * BM + torch.arange(BM)).clamp(max=M - 1)][:, cols]
            ra[tm * BM + torch.arange(BM) >= M] = 0.0
            cb = sb[(tn * BN + torch.arange(BN)).clamp(max=N - 1) // grp[1]][:, cols]
            cb[tn * BN + torch.arange(BN) >= N] = 0.0
            a_t, b_t = L.load_tile(a, "a", tm, kb, BM, BK), L.load_tile(b, "b", tn, kb, BN, BK)
            step, s_step = X.mma_step(prev, a_t, b_t, scale_a=ra, scale_b=cb, with_abs_sum=True)
            assert same(step, traj[t, kb]), (t, kb)
            host = X.mma_step_host(prev, a_t, b_t, scale_a=ra, scale_b=cb)
            assert same(step, host), (t, kb)
            assert torch.allclose(s_step, s_traj[t, kb] - (s_traj[t, kb - 1] if kb else 0), rtol=1e-5, atol=1e-3)
            prev = step


def test_statistics_and_sample_with_groups_follow_the_host_spec():
    a, b, sa, sb, grp = _case(43, 16, pow2=False)
    kw = dict(scale_a=sa, scale_b=sb, block_scale_group=grp)
    acc, s, st = X.mma_accumulate(a, b, BM, BN, BK, with_stats=True, **kw)
    acc_h, s_h, st_h = X.mma_accumulate_host(a, b, BM, BN, BK, with_stats=True, **kw)
    assert same(acc, acc_h)
    assert torch.allclose(s.double(), s_h, rtol=1e-5)
    assert torch.allclose(st.l.double(), st_h.l.double(), rtol=1e-4)
    rows, cols = torch.tensor([[0, 7, 39]]), torch.tensor([[1, 20, 35]])
    x, s2 = mma_sample.mma_sample_host(a, b, rows, cols, BM, BN, BK, **kw)
    assert same(x[0], acc_h[rows[0]][:, cols[0]])
    assert torch.allclose(s2[0], s_h[rows[0]][:, cols[0]], rtol=1e-12)


@pytest.mark.parametrize("gk,b0,b1", [(32, 1, 2), (128, 1, 2), (64, 1, 2), (128, 0, 1)])
def test_a_partial_applies_the_scales_of_its_own_k_blocks(gk, b0, b1):
    a, b, sa, sb, grp = _case(44, gk)
    kw = dict(scale_a=sa, scale_b=sb, block_scale_group=grp)
    got = X.partial_trajectory(a, b, [(1, 1)], BM, BN, BK, b0, b1, **kw)
    assert got.shape == (1, b1 - b0, BM, BN)
    assert same(got, X.partial_trajectory_host(a, b, [(1, 1)], BM, BN, BK, b0, b1, **kw))
    want = _by_hand(a, b, sa, sb, grp, b0 * BK, b1 * BK, width=min(gk, BK))[BM:2 * BM, BN:2 * BN]
    assert same(got[0, -1], want)
    if b0 == 0:  # the first partial is the whole trajectory's start
        assert same(got[0], X.mma_trajectory(a, b, [(1, 1)], BM, BN, BK, **kw)[0, :b1])


def test_group_errors_name_the_argument():
    r = X.check_supported("e4m3", "e4m3", "fp32", 64, 64, 128, 64, (1, 128, 32), True)
    assert len(r) == 1 and "promotion_interval=64" in r[0] and "gk=32" in r[0]
    assert X.check_supported("e4m3", "e4m3", "fp32", 64, 64, 128, 32, (1, 128, 64), True) == []
    r = X.check_supported("e4m3", "e4m3", "fp32", 64, 64, 64, None, (1, 128, 48), True)
    assert len(r) == 1 and "gk=48" in r[0]
    a, b = torch.zeros(16, 64).to(torch.float8_e4m3fn), torch.zeros(64, 16).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"scale_b has shape \(16, 3\)"):
        X.mma_step(None, a, b, scale_a=torch.ones(16, 2), scale_b=torch.ones(16, 3))
    with pytest.raises(ValueError, match="scale groups per k-block"):
        X.mma_step(None, a, b, scale_a=torch.ones(16, 3), scale_b=torch.ones(16, 3))

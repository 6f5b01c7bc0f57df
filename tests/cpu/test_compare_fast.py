"""compare_fast against the torch reference (compare_reference), under the Triton interpreter.

Counts, max_abs_err, NaN/Inf counts, trivial and the first bad elements must be identical; the sums
(rel_l2, cosine, amplification) agree up to summation order; max_ratio and max_rel_err are float32
quotients on tiles the fast pass vouches for, and identical on tiles the float64 pass computes.
Every case carries its own seed."""

import math

import pytest
import torch

from oracle.judging.compare import Status, compare_reference
from compare_checks import assert_same  # noqa: E402  (tests/ is on sys.path)
from oracle.judging.compare_fast import (S_GENERAL, FastConfig, check_supported, compare_fast, inline_bound,
                                 tile_stats)


def check(received, expected, *, rtol=None, atol=None, bound=None, expect_general=None, slow=True, **kw):
    """compare_fast against the reference, and with slow=True its float64 pass alone too; returns
    the fast Comparison and the number of strips the float64 pass took."""
    ref_bound = inline_bound(expected, rtol, atol) if rtol is not None else bound
    ref = compare_reference(received, expected, bound=ref_bound, **kw)
    fast = compare_fast(received, expected, rtol=rtol, atol=atol, bound=bound, **kw)
    assert_same(fast, ref)
    if slow:
        slow_c = compare_fast(received, expected, rtol=rtol, atol=atol, bound=bound, fast_pass=False, **kw)
        assert_same(slow_c, ref, quotient_rel=0.0)  # the float64 pass is the reference, element by element
    st = tile_stats(received, expected, rtol=rtol, atol=atol, bound=bound, mask=kw.get("mask"),
                    tile_shape=kw.get("tile_shape"))
    general = int(st.rows[..., S_GENERAL].sum())
    if expect_general is not None:
        assert general == expect_general, general
    return fast, general


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _pair(shape, dtype, seed, rel=4e-3):
    """expected, and a received within rel of it (passes rtol = 1.6e-2)."""
    g = _gen(seed)
    e = torch.randn(shape, generator=g)
    r = e * (1 + rel * (2 * torch.rand(shape, generator=g) - 1))
    return r.to(dtype), e.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tile_shape", [(24, 40), None])
def test_random_within_tolerance_takes_the_fast_pass(dtype, tile_shape):
    r, e = _pair((48, 80), dtype, seed=11)
    c, _ = check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=tile_shape, expect_general=0, slow=tile_shape is None)
    assert c.status is Status.MATCH


def test_a_zeroed_tile_is_found_with_its_first_bad_elements():
    r, e = _pair((64, 96), torch.bfloat16, seed=12)
    r[32:48, 64:96] = 0
    c, general = check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=(16, 32))
    assert c.status is Status.MISMATCH and general == 1
    bad = [t for t in c.tiles if not t.passed]
    assert [t.tile for t in bad] == [(2, 2)]
    assert bad[0].amplification == 0.0 and (bad[0].first_bad[0].row, bad[0].first_bad[0].col) == (32, 64)


def test_bound_tensors_float64_and_float32_and_a_failing_element():
    r, e = _pair((40, 72), torch.bfloat16, seed=13)
    b = inline_bound(e, 1.6e-2, 1e-5)
    r[7, 9] = 5.0
    for bound in (b.double(), b, b.to(torch.bfloat16)):
        c, general = check(r, e, bound=bound, tile_shape=(16, 32))
        assert c.status is Status.MISMATCH and general == 1
        assert c.first_bad_tile.first_bad[0].row == 7 and c.first_bad_tile.first_bad[0].col == 9
    r2, e2 = _pair((32, 128), torch.bfloat16, seed=27)  # even tiles: bf16 read in pairs, with a bound
    r2[20, 100] = 3.0
    check(r2, e2, bound=inline_bound(e2, 1.6e-2, 1e-5).double(), tile_shape=(16, 64), expect_general=1, slow=False)


def test_nan_and_inf_are_counted_apart_and_nan_matches_nan():
    r, e = _pair((32, 64), torch.float32, seed=14)
    e[1, 1] = math.nan
    r[1, 1] = math.nan  # NaN matches NaN
    e[2, 2] = math.inf
    r[2, 2] = math.inf  # same-sign inf matches
    r[3, 3] = -math.inf
    e[3, 3] = math.inf
    r[20, 40] = math.nan
    e[21, 50] = -math.inf
    b = inline_bound(e, 1e-2, 1e-5).double()
    c, _ = check(r, e, bound=b, tile_shape=(16, 32))
    w = {t.tile: t for t in c.tiles}
    assert (w[(0, 0)].nan_received, w[(0, 0)].nan_expected, w[(0, 0)].inf_received, w[(0, 0)].inf_expected) == \
        (1, 1, 2, 2)
    assert w[(0, 0)].mismatches == 1 and w[(1, 1)].mismatches == 2
    check(r, e, rtol=1e-2, atol=1e-5, tile_shape=(16, 32))


def test_nan_bound_and_infinite_and_negative_bounds():
    r, e = _pair((32, 32), torch.float16, seed=15)
    b = inline_bound(e, 1.6e-2, 1e-5)
    b[0, 0] = math.nan
    b[5, 5] = math.inf
    b[9, 9] = -1.0
    b[20, 20] = 0.0
    r[20, 20] = e[20, 20]
    for bound in (b, b.double()):
        c, _ = check(r, e, bound=bound, tile_shape=(16, 16))
        assert c.tiles[0].mismatches == 2 and math.isnan(c.tiles[0].max_ratio)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.int8, torch.int32, torch.bool])
def test_exact_mode(dtype):
    g = _gen(16)
    if dtype == torch.bool:
        e = torch.rand(24, 40, generator=g) > 0.5
    elif dtype.is_floating_point:
        e = (torch.randn(24, 40, generator=g) * 4).to(dtype)
    else:
        e = torch.randint(-100, 100, (24, 40), generator=g).to(dtype)
    wide = dtype == torch.int32  # 32-bit integers take the float64 pass only
    c, general = check(e.clone(), e, tile_shape=(8, 16), expect_general=None if wide else 0)
    assert c.status is Status.MATCH and all(t.exact for t in c.tiles)
    r = e.clone()
    r[3, 5] = ~r[3, 5] if dtype == torch.bool else (r[3, 5].float() + 1).to(dtype)
    c, general = check(r, e, tile_shape=(8, 16), expect_general=None if wide else 1)
    assert c.status is Status.MISMATCH and c.first_bad_tile.first_bad[0].col == 5


def test_exact_mode_signed_zero_differs_and_nan_payloads_match():
    e = torch.zeros(16, 32, dtype=torch.bfloat16)
    e[0, :] = 1.0
    r = e.clone()
    r[3, 4] = -0.0
    bits_e, bits_r = e.view(torch.int16), r.view(torch.int16)
    bits_e[5, 6], bits_r[5, 6] = 0x7FC0, 0x7FC1  # two NaNs, different payloads
    bits_e[6, 6], bits_r[6, 6] = 0x7FC0, -0x0040  # NaN vs a negative NaN
    c, _ = check(r, e, tile_shape=(8, 16))
    assert c.status is Status.MISMATCH and c.tiles[0].mismatches == 1
    assert (c.tiles[0].first_bad[0].row, c.tiles[0].first_bad[0].col) == (3, 4)
    assert c.tiles[0].nan_received == c.tiles[0].nan_expected == 2


def test_mask_excludes_garbage_and_counts_it():
    r, e = _pair((40, 48), torch.bfloat16, seed=17)
    r[30:, :] = 1e4  # stale rows past the real extent
    mask = torch.ones(40, 48, dtype=torch.bool)
    mask[30:, :] = False
    c, general = check(r, e, rtol=1.6e-2, atol=1e-5, mask=mask, tile_shape=(16, 16), expect_general=0)
    assert c.status is Status.MATCH
    # rows 30-31 are excluded inside tiles that compare something; tiles of rows 32-39 compare nothing
    assert sum(t.excluded for t in c.tiles) == 2 * 48 and len(c.tiles) == 2 * 3
    col_mask = torch.tensor([True, False] * 24).expand(40, 48)  # a broadcast mask
    r2 = r.clone()
    r2[:, 1::2] = -7
    r2[30:, :] = e[30:, :]
    check(r2, e, rtol=1.6e-2, atol=1e-5, mask=col_mask, tile_shape=(16, 16), expect_general=0)
    fully_masked = torch.zeros(40, 48, dtype=torch.bool)
    c, _ = check(r, e, rtol=1.6e-2, atol=1e-5, mask=fully_masked, tile_shape=(16, 16))
    assert c.status is Status.NOT_RUN


def test_ragged_edges_and_tiles_larger_than_the_tensor():
    r, e = _pair((37, 53), torch.float16, seed=18)
    r[36, 52] = 9.0  # the last element, in the ragged corner tile
    c, _ = check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=(16, 16))
    assert c.first_bad_tile.tile == (2, 3) and c.first_bad_tile.compared == 5 * 5
    check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=(64, 300))
    check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=(1, 53), slow=False)
    check(r[:, :1], e[:, :1], rtol=1.6e-2, atol=1e-5, tile_shape=(8, 8), slow=False)


def test_single_tile_keeps_origin_and_tile_index():
    r, e = _pair((20, 24), torch.bfloat16, seed=19)
    r[4, 5] = 3
    c, _ = check(r, e, rtol=1.6e-2, atol=1e-5, origin=(128, 256), tile_index=(1, 2), k_block=3)
    t = c.tiles[0]
    assert t.tile == (1, 2) and t.k_block == 3 and (t.first_bad[0].row, t.first_bad[0].col) == (132, 261)
    c, _ = check(r, e, rtol=1.6e-2, atol=1e-5, origin=(128, 256), tile_shape=(8, 8))
    assert c.first_bad_tile.tile == (16, 32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e5m2])
def test_inline_tolerances_with_zero_atol_and_exact_zeros(dtype):
    r, e = _pair((32, 48), dtype, seed=20, rel=2e-3)
    e[0, :8] = 0
    r[0, :8] = 0
    r[1, 0] = 0  # received zero where expected is not
    c, _ = check(r, e, rtol=0.05, atol=0.0, tile_shape=(16, 16))
    check(r, e, rtol=0.05, atol=1e-3, tile_shape=(16, 16))


def test_all_zero_expected_is_mistrusted():
    e = torch.zeros(32, 32, dtype=torch.bfloat16)
    c, _ = check(e.clone(), e, rtol=1e-2, atol=1e-5, tile_shape=(16, 16))
    assert c.status is Status.MISTRUSTED and all(t.trivial for t in c.tiles)
    c, _ = check(e.clone(), e, tile_shape=(16, 16))
    assert c.status is Status.MISTRUSTED
    tiny = torch.full((32, 32), 1e-31)  # below TRIVIAL: still nothing to discriminate
    c, _ = check(tiny.clone(), tiny, rtol=1e-2, atol=1e-5, tile_shape=(16, 16))
    assert c.status is Status.MISTRUSTED


def test_differences_float32_cannot_hold_are_exact():
    # 1 + 2^-7 minus 1.5 * 2^-30 needs 32 significant bits: not a float32 number; a loose atol passes it
    e = torch.full((16, 16), 1.5 * 2.0 ** -30).to(torch.bfloat16)
    r = torch.full((16, 16), 1 + 2.0 ** -7).to(torch.bfloat16)
    e[3, 3] = 1.0
    exact_diff = (1 + 2.0 ** -7) - 1.5 * 2.0 ** -30
    for kw in (dict(rtol=1e-2, atol=2.0), dict(bound=torch.full((16, 16), 2.0))):
        c, general = check(r, e, tile_shape=(8, 8), **kw)
        assert c.tiles[0].max_abs_err == exact_diff and c.status is Status.MATCH and general == 4
    r32, e32 = torch.full((8, 8), 1.0), torch.full((8, 8), 1e-9)  # float32: TwoSum territory
    c, _ = check(r32, e32, rtol=1e-2, atol=2.0, tile_shape=(8, 8))
    assert c.tiles[0].max_abs_err == 1.0 - float(e32[0, 0])
    check(r32, e32, bound=torch.full((8, 8), 2.0), tile_shape=(8, 8))
    # a difference that overflows float32 (the reference has it in float64)
    f = torch.full((8, 8), 3e38)
    c, _ = check(f, -f, bound=torch.full((8, 8), 1e39, dtype=torch.float64), tile_shape=(8, 8))
    assert c.tiles[0].max_abs_err == 2 * float(f[0, 0]) and c.status is Status.MATCH


def test_ties_at_the_bound_are_ok():
    e = torch.ones(16, 16)
    r = e + 0.25
    c, _ = check(r, e, bound=torch.full((16, 16), 0.25), tile_shape=(8, 8))
    assert c.status is Status.MATCH and c.tiles[0].max_ratio == 1.0
    c, _ = check(r, e, rtol=0.0, atol=0.25, tile_shape=(8, 8))
    assert c.status is Status.MATCH


def test_mixed_dtypes_and_strided_views():
    g = _gen(21)
    e = torch.randn(40, 64, generator=g)
    r = (e * (1 + 1e-3 * torch.randn(40, 64, generator=g))).to(torch.bfloat16)
    check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=(16, 32), expect_general=0)
    check(r.t(), e.t(), rtol=1.6e-2, atol=1e-5, tile_shape=(16, 16), expect_general=0, slow=False)
    check(r[::2, 1::3], e[::2, 1::3], rtol=1.6e-2, atol=1e-5, tile_shape=(8, 8), expect_general=0, slow=False)
    check(r.float(), e.double(), rtol=1.6e-2, atol=1e-5, tile_shape=(16, 32))  # float64: the float64 pass
    check(torch.randint(-50, 50, (24, 24), generator=g).to(torch.int64),
          torch.randint(-50, 50, (24, 24), generator=g).to(torch.int16), bound=torch.full((24, 24), 40.0),
          tile_shape=(8, 8))


def test_huge_and_tiny_magnitudes():
    g = _gen(22)
    e = torch.randn(16, 32, generator=g) * 1e30
    r = e * 1.001
    check(r, e, rtol=1e-2, atol=1e-5, tile_shape=(8, 16))  # squares overflow float32: float64 pass
    e2 = torch.randn(16, 32, generator=g) * 1e-25
    e2[0, 0] = 2e-30  # just above TRIVIAL: a huge relative error
    r2 = e2 + 1e-6 * torch.randn(16, 32, generator=g)
    check(r2, e2, rtol=1e-2, atol=1e-5, tile_shape=(8, 16))
    c, general = check(e2 * (1 + 1e-3), e2, rtol=1e-2, atol=1e-35, tile_shape=(8, 16))  # squares underflow
    assert general == 4 and c.tiles[0].rel_l2 > 0
    # on the fast pass: |e| = float32(1e-30) is above TRIVIAL (1e-30 is no float32 number), just below is not
    e3 = torch.randn(16, 32, generator=g) * 1e-10
    r3 = e3 * (1 + 1e-3 * (2 * torch.rand(16, 32, generator=g) - 1))
    e3[0, 1] = 1e-30
    r3[0, 1] = e3[0, 1] * 1.005
    e3[0, 2] = -1e-30 * (1 - 2 ** -20)
    r3[0, 2] = e3[0, 2] * 1.009
    c, _ = check(r3, e3, rtol=1e-2, atol=1e-30, tile_shape=(8, 16), expect_general=0)
    assert 0.004 < c.tiles[0].max_rel_err < 0.006


def test_detail_budget_covers_the_first_failing_tiles_only():
    r, e = _pair((32, 64), torch.float32, seed=23)
    r += 1.0
    c, _ = check(r, e, rtol=1e-2, atol=1e-5, tile_shape=(8, 8), max_detail_tiles=3, slow=False)
    assert sum(1 for t in c.tiles if t.first_bad) == 3 and sum(not t.passed for t in c.tiles) == 32


def test_configs_agree():
    r, e = _pair((64, 256), torch.bfloat16, seed=24)
    r[10, 200] = 2.0
    ref = compare_reference(r, e, bound=inline_bound(e, 1.6e-2, 1e-5), tile_shape=(32, 128))
    for cfg in (FastConfig(32, 8, 4), FastConfig(16, 16, 2), FastConfig(64, 64, 8), FastConfig(8, 8, 1)):
        assert_same(compare_fast(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=(32, 128), config=cfg), ref)


def test_rejects_what_it_cannot_take():
    a = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="shape"):
        compare_fast(a, torch.zeros(4, 5))
    with pytest.raises(ValueError, match="2-D"):
        compare_fast(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="one dtype"):
        compare_fast(a, a.double())
    assert any("rtol" in s for s in check_supported(a, a, rtol=1e-2))
    assert any("bound" in s for s in check_supported(a, a, bound=a, rtol=1e-2, atol=0.0))
    assert any("complex" in s or "dtype" in s for s in check_supported(a.to(torch.complex64), a))
    assert any("mask" in s for s in check_supported(a, a, mask=a))
    assert check_supported(a, a, rtol=1e-2, atol=1e-5) == []
    with pytest.raises(ValueError, match="power of two"):
        FastConfig(rows_per_program=48)


def test_programs_sharing_a_tile_take_every_gth_strip(monkeypatch):
    import oracle.judging.compare_fast.plan as cf

    monkeypatch.setattr(cf, "MAX_PROGRAMS_PER_TILE", 3)  # 7 strips of 8 rows, 3 programs
    r, e = _pair((52, 40), torch.bfloat16, seed=25)
    r[45, 33] = 4.0
    for cfg in (FastConfig(8, 8, 4), FastConfig(8, 4, 2)):
        ref = compare_reference(r, e, bound=inline_bound(e, 1.6e-2, 1e-5))
        assert_same(compare_fast(r, e, rtol=1.6e-2, atol=1e-5, config=cfg), ref)
        assert_same(compare_fast(r, e, rtol=1.6e-2, atol=1e-5, config=cfg, fast_pass=False), ref, 0.0)
        assert_same(compare_fast(r[:44], e[:44], rtol=1.6e-2, atol=1e-5, config=cfg),
                    compare_reference(r[:44], e[:44], bound=inline_bound(e[:44], 1.6e-2, 1e-5)))


def test_the_gpu_arithmetic_fma_chains_and_one_combined_reduction(monkeypatch):
    import oracle.judging.compare_fast.launch as cf

    monkeypatch.setattr(cf, "_FUSED_IN_INTERPRETER", True)
    for dtype, shape, tile in ((torch.bfloat16, (16, 128), (16, 128)), (torch.float32, (8, 64), (8, 32))):
        r, e = _pair(shape, dtype, seed=26)
        check(r, e, rtol=1.6e-2, atol=1e-5, tile_shape=tile, expect_general=0, slow=False)

"""compare_fast compiled on the H200: against the torch reference at 8192 x 8192, its extra memory
(O(tiles), never a full-size temporary), int64 offsets past 2^31 elements, and the dispatch from
`compare`. Each test seeds its own inputs."""

import math

import pytest
import torch

from oracle.judging.compare import FAST_MIN_ELEMENTS, Status, compare, compare_reference
from compare_checks import assert_same
from oracle.judging.compare_fast import NSTAT, S_GENERAL, compare_fast, inline_bound, tile_stats

pytestmark = pytest.mark.gpu
DEV = "cuda"
N = 8192
RTOL, ATOL = 1.6e-2, 1e-5


def _inputs(seed, n=N, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    e = torch.randn(n, n, device=DEV, generator=g)
    r = e * (1 + 4e-3 * (2 * torch.rand(n, n, device=DEV, generator=g) - 1))
    return r.to(dtype), e.to(dtype)


def _general(stats) -> int:
    return int(stats.rows[..., S_GENERAL].sum())


def test_bf16_8192_matches_the_reference_with_a_bad_tile_and_nonfinite_values():
    r, e = _inputs(1)
    r[1024:1152, 2048:2176] = 0  # tile (8, 16) zeroed
    r[5000, 77] = math.nan  # tile (39, 0)
    e[6000, 6000] = r[6000, 6000] = math.inf  # same-sign inf: a match, counted apart
    fast = compare_fast(r, e, rtol=RTOL, atol=ATOL, tile_shape=(128, 128))
    ref = compare_reference(r, e, bound=inline_bound(e, RTOL, ATOL), tile_shape=(128, 128))
    assert_same(fast, ref)
    assert {t.tile for t in fast.tiles if not t.passed} == fast.bad_tiles == {(8, 16), (39, 0)}
    assert fast.tables and len(fast.tiles) == 2  # 4096 units on the device: the two failing ones on the host
    assert _general(tile_stats(r, e, rtol=RTOL, atol=ATOL, tile_shape=(128, 128))) == 3
    slow = compare_fast(r, e, rtol=RTOL, atol=ATOL, tile_shape=(128, 128), fast_pass=False)
    assert_same(slow, ref, quotient_rel=0.0)  # the compiled float64 pass is the reference


def test_bound_tensors_masks_and_float32():
    r, e = _inputs(2, dtype=torch.float32)
    bound = inline_bound(e, RTOL, ATOL).double()
    mask = torch.ones(N, N, dtype=torch.bool, device=DEV)
    mask[-100:, :] = False
    r[-50:, :] = 1e6  # stale rows, excluded
    r[300, 4000] += 1.0
    fast = compare_fast(r, e, bound=bound, mask=mask, tile_shape=(256, 64))
    assert_same(fast, compare_reference(r, e, bound=bound, mask=mask, tile_shape=(256, 64)))
    assert fast.first_bad_tile.first_bad[0].row == 300
    rb, eb = _inputs(3)
    assert_same(compare_fast(rb, eb, bound=inline_bound(eb, RTOL, ATOL), tile_shape=(128, 128)),
                compare_reference(rb, eb, bound=inline_bound(eb, RTOL, ATOL), tile_shape=(128, 128)))


def test_exact_mode_bf16_and_fp8():
    _, e = _inputs(4)
    r = e.clone()
    r[7, 9] = -r[7, 9]
    assert_same(compare_fast(r, e, tile_shape=(128, 128)), compare_reference(r, e, tile_shape=(128, 128)))
    e8 = e.to(torch.float8_e4m3fn)
    c = compare_fast(e8.clone(), e8, tile_shape=(128, 128))
    assert c.status is Status.MATCH and _general(tile_stats(e8.clone(), e8, tile_shape=(128, 128))) == 0


def test_extra_memory_is_o_tiles_and_bounded_for_one_big_tile():
    r, e = _inputs(5)
    extra = {}
    for key, (a, b, ts) in {"tiles_8192": (r, e, (128, 128)), "one_8192": (r, e, None),
                            "one_4096": (r[:4096, :4096], e[:4096, :4096], None)}.items():
        compare_fast(a, b, rtol=RTOL, atol=ATOL, tile_shape=ts)  # compile outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        c = compare_fast(a, b, rtol=RTOL, atol=ATOL, tile_shape=ts)
        torch.cuda.synchronize()
        extra[key] = torch.cuda.max_memory_allocated() - base
        assert c.status is Status.MATCH
    tiles = (N // 128) ** 2
    assert extra["tiles_8192"] <= 2 * tiles * NSTAT * 8 + (1 << 20), extra  # partial rows (and their fold)
    # one tile: at most MAX_PROGRAMS_PER_TILE rows, whatever the size (8192^2 already has that many)
    assert extra["one_4096"] <= extra["one_8192"] <= (4 << 20), extra
    assert extra["tiles_8192"] < r.numel() * r.element_size() // 100, extra


def test_int64_offsets_past_2_31_elements():
    rows, cols = 32768, 65600  # 2.15e9 one-byte elements
    e = torch.randint(0, 120, (rows, cols), dtype=torch.uint8, device=DEV).view(torch.float8_e4m3fn)
    r = e.clone()
    r.view(torch.uint8)[-1, -1] ^= 1
    c = compare_fast(r, e, tile_shape=(1024, 1024))
    bad = [t for t in c.tiles if not t.passed]
    assert len(bad) == 1 and (bad[0].first_bad[0].row, bad[0].first_bad[0].col) == (rows - 1, cols - 1)
    assert c.compared == rows * cols and c.units == len(c.all_units())


def test_compare_dispatches_large_cuda_tensors_to_the_fast_path():
    r, e = _inputs(6, n=2048)
    assert r.numel() >= FAST_MIN_ELEMENTS
    bound = inline_bound(e, RTOL, ATOL)
    assert compare(r, e, bound=bound, tile_shape=(128, 128)) == compare_fast(r, e, bound=bound,
                                                                              tile_shape=(128, 128))
    small_r, small_e = r[:64, :64].contiguous(), e[:64, :64].contiguous()
    assert compare(small_r, small_e, bound=bound[:64, :64]) == compare_reference(small_r, small_e,
                                                                                  bound=bound[:64, :64])


def test_the_summary_kernels_pick_what_python_picks_over_many_blocks():
    """Compiled: 300000 rows (1172 blocks, 5 chunks), keys that tie often, failing units spread."""
    from oracle.judging.compare_fast import summary
    from oracle.judging.compare_fast.stats import S_BAD, S_COMPARED, S_MAX_ABS, S_MAX_RATIO

    g = torch.Generator(device=DEV).manual_seed(9)
    u = 300_000
    rows = torch.zeros(u, NSTAT, dtype=torch.float64, device=DEV)
    rows[:, S_COMPARED] = (torch.rand(u, device=DEV, generator=g) > 0.1).double() * 64
    rows[:, S_BAD] = (torch.rand(u, device=DEV, generator=g) < 0.002).double()
    rows[:, S_MAX_RATIO] = torch.randint(0, 5, (u,), device=DEV, generator=g) / 4.0
    rows[:, S_MAX_ABS] = torch.randint(0, 3, (u,), device=DEV, generator=g) / 8.0
    got = summary.summarize(rows, 1024, 64)
    rs = rows.tolist()
    keep = [i for i, r in enumerate(rs) if r[S_COMPARED] > 0]
    fail = [i for i in keep if rs[i][S_BAD] > 0]
    worst = max(fail, key=lambda i: (rs[i][S_MAX_RATIO], rs[i][S_BAD], rs[i][S_MAX_ABS]))
    assert (got.units, got.failing, got.worst) == (len(keep), len(fail), worst)
    assert got.failing_rows == tuple(fail[:1024]) and got.detail_rows == tuple(rs[i] for i in fail[:64])


def test_the_summary_written_into_host_memory_equals_its_copied_form(monkeypatch):
    """The final kernel writes the summary into page-locked host memory; a buffer the device cannot
    reach (pageable memory: Triton refuses it before launching) takes the copy instead, with the same
    summary, and two summaries in a row each read their own."""
    from oracle.judging.compare_fast import summary
    from oracle.judging.compare_fast.stats import S_BAD, S_COMPARED

    g = torch.Generator(device=DEV).manual_seed(11)
    u = 5000
    rows = torch.zeros(u, NSTAT, dtype=torch.float64, device=DEV)
    rows[:, S_COMPARED] = 64.0
    first = summary.summarize(rows, 1024, 64)
    rows[:, S_BAD] = (torch.rand(u, device=DEV, generator=g) < 0.01).double()
    mapped = summary.summarize(rows, 1024, 64)
    assert first.failing == 0 and mapped.failing == int(rows[:, S_BAD].sum()) > 0
    monkeypatch.setattr(summary, "_host_buffer", lambda n, device: torch.empty(n, dtype=torch.float64))
    copied = summary.summarize(rows, 1024, 64)
    assert copied == mapped

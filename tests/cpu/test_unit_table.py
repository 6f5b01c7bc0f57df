"""A comparison of many units keeps them as tensors (oracle.judging.comparison.UnitTable) and makes
host objects only for what the report reads: what it reads must be what the reference gives
(compare_reference makes every unit on the host), under the Triton interpreter."""

import math

import pytest
import torch

from compare_checks import assert_same  # noqa: E402  (tests/ is on sys.path)
from oracle.judging import comparison
from oracle.judging.compare import Status, compare_reference
from oracle.judging.compare_fast import compare_fast, inline_bound
from oracle.judging.compare_fast import results as fast_results
from oracle.judging.evidence import Evidence, Feed

TILE = (4, 8)
RTOL, ATOL = 1.6e-2, 1e-5


def _pair(seed, shape=(48, 64)):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(shape, generator=g)
    r = e * (1 + 4e-3 * (2 * torch.rand(shape, generator=g) - 1))
    return r.to(torch.bfloat16), e.to(torch.bfloat16)


def _both(r, e, **kw):
    fast = compare_fast(r, e, rtol=RTOL, atol=ATOL, tile_shape=TILE, **kw)
    ref = compare_reference(r, e, bound=inline_bound(e, RTOL, ATOL), tile_shape=TILE, **kw)
    return fast, ref


def _key(u):
    return None if u is None else (u.tile, u.k_block, u.compared, u.mismatches, u.max_abs_err, repr(u.first_bad),
                                   u.nan_received, u.inf_received)  # repr: NaN never equals NaN


def _same_report(fast, ref):
    """What the report and the diagnosis read, from the table, equals the reference's."""
    assert fast.tables and len(fast.tiles) <= 64 + 2, len(fast.tiles)
    assert fast.status is ref.status
    assert (fast.units, fast.failing_units, fast.compared, fast.mismatches) == \
        (ref.units, ref.failing_units, ref.compared, ref.mismatches)
    assert fast.bad_tiles == ref.bad_tiles
    for prop in ("worst", "first_bad_tile", "first_nonfinite_tile"):
        assert _key(getattr(fast, prop)) == _key(getattr(ref, prop)), prop
    assert math.isclose(fast.worst.max_ratio, ref.worst.max_ratio, rel_tol=2e-6)
    jf, jr = fast.to_json(), ref.to_json()
    assert (jf["units"], jf["failing_units"], jf["compared"], jf["status"]) == \
        (jr["units"], jr["failing_units"], jr["compared"], jr["status"])
    assert_same(fast, ref)


def test_a_matching_comparison_of_many_units_shows_only_its_worst():
    r, e = _pair(1)
    fast, ref = _both(r, e)
    assert ref.units == 96 and fast.status is Status.MATCH
    _same_report(fast, ref)
    assert [t.tile for t in fast.tiles] == [ref.worst.tile]


def test_failing_and_nonfinite_units_are_shown_and_counted():
    r, e = _pair(2)
    r[8:12, 16:24] *= 3  # tile (2, 2)
    r[40, 60] = float("nan")  # tile (10, 7): non-finite
    r[0, 0] = -e[0, 0] * 4  # tile (0, 0)
    fast, ref = _both(r, e)
    _same_report(fast, ref)
    assert fast.bad_tiles == {(0, 0), (2, 2), (10, 7)}
    assert fast.first_nonfinite_tile.tile == (10, 7) and fast.first_bad_tile.tile == (0, 0)


def test_past_the_detail_cap_the_counts_stay_whole_and_the_first_failing_are_shown():
    r, e = _pair(3)
    r[:, :] = r * 2  # every unit fails
    r[44:48, 56:64] *= 8  # the worst, the last tile
    fast, ref = _both(r, e, max_detail_tiles=5)
    _same_report(fast, ref)
    shown = [t for t in fast.tiles if not t.passed]
    assert len(shown) == 6 and sum(bool(t.first_bad) for t in shown) == 5 and fast.worst.tile == (11, 7)
    assert fast.worst.first_bad == ()  # past the cap, as the reference: no details


def test_labels_and_combine_carry_the_table():
    r, e = _pair(4)
    r[20, 3] = e[20, 3] * 5
    fast, ref = _both(r, e)
    ev = Evidence.of(Feed.KERNEL, {}, ())
    lf = comparison.combine([fast.labelled(ev).of_partial(1), comparison.Comparison(Status.MATCH)])
    lr = comparison.combine([ref.labelled(ev).of_partial(1), comparison.Comparison(Status.MATCH)])
    _same_report(lf, lr)
    assert all(u.fed_by == Feed.KERNEL.value and u.partial == 1 for u in lf.all_units())
    assert lf.failing_in({(5, 0)}) == tuple(t for t in lf.tiles if t.tile == (5, 0))


def test_a_nan_err_bound_makes_every_unit_on_the_host():
    r, e = _pair(5)
    bound = inline_bound(e, RTOL, ATOL).double()
    bound[7, 7] = float("nan")
    r[7, 7] = e[7, 7] * 1.5
    fast = compare_fast(r, e, bound=bound, tile_shape=TILE)
    ref = compare_reference(r, e, bound=bound, tile_shape=TILE)
    assert math.isnan(ref.worst.max_ratio)
    assert not fast.tables and len(fast.tiles) == ref.units
    assert _key(fast.worst) == _key(ref.worst)


@pytest.mark.parametrize("cap", [0, 3])
def test_the_host_threshold_only_changes_where_units_live(monkeypatch, cap):
    monkeypatch.setattr(fast_results, "HOST_UNITS", cap)
    r, e = _pair(6, shape=(8, 16))
    r[5, 9] *= 4
    fast, ref = _both(r, e)
    _same_report(fast, ref)


def test_past_the_failing_list_every_failing_tile_is_still_counted(monkeypatch):
    monkeypatch.setattr(fast_results, "FAIL_LIST", 2)
    r, e = _pair(7)
    for i, j in ((0, 3), (2, 2), (5, 1), (11, 7)):
        r[i * 4 + 1, j * 8 + 2] = e[i * 4 + 1, j * 8 + 2] * 3
    fast, ref = _both(r, e, max_detail_tiles=1)
    _same_report(fast, ref)
    assert fast.bad_tiles == {(0, 3), (2, 2), (5, 1), (11, 7)}


def test_a_matching_comparison_reads_the_device_once(monkeypatch):
    """Every read of a tensor by the comparator's own modules (tolist, item, cpu, numpy, bool/int/float
    of a tensor), past those of what a read brought to the host: one, the summary's, when nothing
    fails."""
    import sys

    reads, fetched = [], set()
    for name in ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **kw):
            caller = sys._getframe(1).f_code.co_filename
            out = _orig(self, *a, **kw)
            if "compare_fast" in caller and "triton" not in caller and \
                    self.untyped_storage().data_ptr() not in fetched:
                reads.append((_name, caller.rsplit("/", 1)[-1], sys._getframe(1).f_lineno))
                if isinstance(out, torch.Tensor):
                    fetched.add(out.untyped_storage().data_ptr())
            return out

        monkeypatch.setattr(torch.Tensor, name, counted)
    r, e = _pair(8)
    fast = compare_fast(r, e, rtol=RTOL, atol=ATOL, tile_shape=TILE)
    assert fast.status is Status.MATCH and fast.tables
    assert len(reads) == 1 and reads[0][1] == "summary.py", reads

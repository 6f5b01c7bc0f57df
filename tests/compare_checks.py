"""Checks shared by the CPU and GPU tests of the one-pass comparator: the fast path must give
what the torch specification (oracle.judging.compare.compare_reference) gives."""

import math

EXACT_FIELDS = ("tile", "k_block", "compared", "excluded", "mismatches", "max_abs_err", "nan_received",
                "nan_expected", "inf_received", "inf_expected", "trivial", "exact", "first_bad")


def _close(a, b, rel, abs_=0.0):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b)) + abs_


def assert_same(fast, ref, quotient_rel=2e-6):
    """Identical counts, maxima and first bad elements; sums up to summation order; quotients of
    tiles the fast pass vouched for up to float32 rounding."""
    assert fast.status is ref.status, (fast.status, ref.status)
    fast_units, ref_units = fast.all_units(), ref.all_units()
    assert len(fast_units) == len(ref_units)
    assert fast.units == len(fast_units) and fast.compared == ref.compared and fast.bad_tiles == ref.bad_tiles
    for a, b in zip(fast_units, ref_units):
        for f in EXACT_FIELDS:
            assert getattr(a, f) == getattr(b, f) or f == "first_bad", (a.tile, f, getattr(a, f), getattr(b, f))
        # repr: NaN never equals NaN, but its repr does
        assert [repr((x.row, x.col, x.received, x.expected, x.bound)) for x in a.first_bad] == \
            [repr((x.row, x.col, x.received, x.expected, x.bound)) for x in b.first_bad], a.tile
        for f in ("max_ratio", "max_rel_err"):
            assert _close(getattr(a, f), getattr(b, f), quotient_rel), (a.tile, f, getattr(a, f), getattr(b, f))
        for f in ("rel_l2", "amplification"):
            assert _close(getattr(a, f), getattr(b, f), 1e-5, 1e-12), (a.tile, f, getattr(a, f), getattr(b, f))
        assert _close(a.cosine, b.cosine, 0.0, 2e-6), (a.tile, a.cosine, b.cosine)

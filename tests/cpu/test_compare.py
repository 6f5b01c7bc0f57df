import math

import pytest
import torch

from oracle.judging.compare import Status, compare


def test_single_bad_tile_at_4096_is_found_though_global_metrics_pass():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(4096, 4096, generator=g)
    out = ref.clone()
    out[1024:1152, 2048:2176] = 0  # tile (8, 16) of 128x128 zeroed
    cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
    assert cos > 0.999  # a whole-tensor check would pass this
    bound = torch.full_like(ref, 1e-3, dtype=torch.float64)
    c = compare(out, ref, bound=bound, tile_shape=(128, 128))
    assert c.status is Status.MISMATCH
    w = c.worst
    assert w.tile == (8, 16)
    assert w.mismatches > 0.99 * 128 * 128  # all but the few reference values within 1e-3 of zero
    assert w.amplification == 0.0
    assert sum(not t.passed for t in c.tiles) == 1
    first = w.first_bad[0]
    assert (first.row, first.col) == (1024, 2048)
    assert first.received == 0.0 and first.expected == pytest.approx(float(ref[1024, 2048]))


def test_within_bound_matches_and_reports_smallest_passing_scale():
    ref = torch.linspace(1, 2, 64).reshape(8, 8)
    out = ref + 0.5e-3
    bound = torch.full((8, 8), 1e-3, dtype=torch.float64)
    c = compare(out, ref, bound=bound)
    assert c.status is Status.MATCH
    assert c.worst.max_ratio == pytest.approx(0.5, rel=1e-3)
    assert c.worst.max_abs_err == pytest.approx(0.5e-3, rel=1e-3)
    c2 = compare(out, ref, bound=bound / 4)
    assert c2.status is Status.MISMATCH and c2.worst.max_ratio == pytest.approx(2.0, rel=1e-3)


def test_nan_and_inf_are_counted_apart():
    ref = torch.ones(4, 4)
    out = ref.clone()
    out[0, 0] = math.nan
    out[1, 1] = math.inf
    out[2, 2] = -math.inf
    c = compare(out, ref, bound=torch.full((4, 4), 1e-6, dtype=torch.float64))
    w = c.worst
    assert (w.nan_received, w.inf_received, w.nan_expected, w.inf_expected) == (1, 2, 0, 0)
    assert w.mismatches == 3 and w.nonfinite
    assert c.first_nonfinite_tile is w


def test_nan_matches_nan_and_same_sign_inf():
    ref = torch.tensor([[math.nan, math.inf, 1.0]])
    out = torch.tensor([[math.nan, math.inf, 1.0]])
    assert compare(out, ref, bound=torch.zeros(1, 3, dtype=torch.float64)).status is Status.MATCH
    assert compare(out, ref).status is Status.MATCH  # bit-exact with NaN == NaN
    out2 = torch.tensor([[math.nan, -math.inf, 1.0]])
    assert compare(out2, ref).status is Status.MISMATCH


def test_exact_compare_is_bitwise():
    ref = torch.tensor([[0.0, 1.0]], dtype=torch.bfloat16)
    out = torch.tensor([[-0.0, 1.0]], dtype=torch.bfloat16)
    c = compare(out, ref)
    assert c.status is Status.MISMATCH and c.worst.mismatches == 1
    assert c.worst.exact


def test_masked_elements_are_excluded_and_counted():
    ref = torch.ones(4, 4)
    out = ref.clone()
    out[3, :] = 99  # padding row holding stale data
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[3, :] = False
    c = compare(out, ref, mask=mask)
    assert c.status is Status.MATCH
    assert c.worst.excluded == 4 and c.worst.compared == 12


def test_all_zero_reference_is_mistrusted_not_passed():
    z = torch.zeros(64, 64)
    c = compare(z, z, bound=torch.zeros(64, 64, dtype=torch.float64), tile_shape=(32, 32))
    assert c.status is Status.MISTRUSTED


def test_tiles_are_numbered_from_origin_and_ragged_edges_count():
    ref = torch.randn(100, 70)
    out = ref.clone()
    out[99, 69] += 1
    c = compare(out, ref, bound=torch.full((100, 70), 1e-3, dtype=torch.float64), tile_shape=(64, 64))
    assert len(c.tiles) == 4
    assert c.worst.tile == (1, 1) and c.worst.compared == 36 * 6
    assert (c.worst.first_bad[0].row, c.worst.first_bad[0].col) == (99, 69)
    one = compare(out[64:, 64:], ref[64:, 64:], bound=torch.full((36, 6), 1e-3, dtype=torch.float64),
                  origin=(64, 64), tile_index=(1, 1), k_block=3)
    assert one.worst.tile == (1, 1) and one.worst.k_block == 3
    assert (one.worst.first_bad[0].row, one.worst.first_bad[0].col) == (99, 69)


def test_first_bad_tile_prefers_earliest_k_block():
    from oracle.judging.compare import combine

    ref = torch.ones(2, 2)
    bad = ref + 1
    b = torch.full((2, 2), 1e-3, dtype=torch.float64)
    late = compare(bad, ref, bound=b, tile_index=(0, 0), k_block=5)
    early = compare(bad, ref, bound=b, tile_index=(3, 3), k_block=2)
    c = combine([late, early])
    assert c.first_bad_tile.k_block == 2 and c.first_bad_tile.tile == (3, 3)


def test_what_fed_a_comparison_is_kept_apart_from_its_notes():
    """The report shows what fed a stage only at the stage of the finding: it reads a field of its
    own, not notes matched by their wording."""
    from oracle.judging.comparison import NOT_RUN, combine

    a = NOT_RUN.fed("the kernel's epilogue_bias tap").with_notes("a note")
    b = NOT_RUN.fed("the kernel's epilogue_bias tap").fed("the kernel's mma tap")
    both = combine([a, b], "closing note")
    assert both.fed_from == ("the kernel's epilogue_bias tap", "the kernel's mma tap")
    assert both.notes == ("a note", "closing note")
    assert both.all_notes[:2] == ("fed from the kernel's epilogue_bias tap", "fed from the kernel's mma tap")
    assert both.to_json()["notes"] == list(both.all_notes)

"""The summary kernels (oracle.judging.compare_fast.summary) against the same picks made in Python
over the rows: counts, the worst unit (ties to the first row), the first non-finite unit, the first
failing units in order and their rows. Small blocks and chunks make several of each, under the
Triton interpreter."""

import math

import pytest
import torch

from oracle.judging.compare_fast import summary
from oracle.judging.compare_fast.stats import (NSTAT, S_BAD, S_COMPARED, S_INF_E, S_INF_R, S_INFO, S_MAX_ABS,
                                               S_MAX_RATIO, S_NAN_E, S_NAN_R, S_RATIO_NAN)


def _rows(u, seed, fail_rate=0.1, empty_rate=0.2):
    """Rows with few distinct values, so that the worst unit's keys tie often."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(u, NSTAT, generator=g, dtype=torch.float64)
    rows[:, S_COMPARED] = torch.where(torch.rand(u, generator=g) < empty_rate, 0.0, 32.0)
    rows[:, S_BAD] = torch.where(torch.rand(u, generator=g) < fail_rate, torch.randint(1, 3, (u,), generator=g), 0)
    rows[:, S_MAX_RATIO] = torch.randint(0, 4, (u,), generator=g) / 4.0
    rows[:, S_MAX_ABS] = torch.randint(0, 3, (u,), generator=g) / 8.0
    for c in (S_NAN_R, S_INF_R, S_NAN_E, S_INF_E):
        rows[:, c] = (torch.rand(u, generator=g) < 0.05).double()
    rows[:, S_INFO] = torch.randint(0, 2, (u,), generator=g)
    rows[:, S_RATIO_NAN] = 0.0
    return rows


def _expected(rows, cap, detail):
    """The picks, in Python."""
    rs = rows.tolist()
    keep = [i for i, r in enumerate(rs) if r[S_COMPARED] > 0]
    fail = [i for i in keep if rs[i][S_BAD] > 0]
    nonfinite = [i for i in keep if rs[i][S_NAN_R] + rs[i][S_INF_R] > rs[i][S_NAN_E] + rs[i][S_INF_E]]
    unknown = [i for i in keep if rs[i][S_RATIO_NAN] > 0 or math.isnan(rs[i][S_MAX_ABS])]
    pool = fail or keep
    worst = max(pool, key=lambda i: (rs[i][S_MAX_RATIO], rs[i][S_BAD], rs[i][S_MAX_ABS])) if pool else 0
    first_nf = nonfinite[0] if nonfinite else 0
    return summary.Summary(
        len(keep), len(fail), int(sum(rs[i][S_COMPARED] for i in keep)), int(sum(rs[i][S_BAD] for i in keep)),
        sum(rs[i][S_INFO] > 0 for i in keep), len(unknown), len(nonfinite), worst, first_nf, rs[worst], rs[first_nf],
        tuple(fail[:cap]), tuple(rs[i] for i in fail[:detail]))


@pytest.mark.parametrize("u, seed, fail_rate, cap, detail", [
    (200, 1, 0.1, 6, 4),  # the list full in the first blocks
    (200, 2, 0.0, 6, 4),  # nothing fails: the worst of every unit
    (333, 3, 0.02, 64, 64),  # every failing unit listed, across chunks
    (90, 4, 1.0, 1024, 5),  # every unit fails
    (5, 5, 0.5, 3, 0),  # one block, no rows asked for
])
def test_the_summary_picks_what_python_picks(monkeypatch, u, seed, fail_rate, cap, detail):
    monkeypatch.setattr(summary, "BLOCK", 16)
    monkeypatch.setattr(summary, "CHUNK", 4)
    rows = _rows(u, seed, fail_rate)
    assert summary.summarize(rows, cap, detail) == _expected(rows, cap, detail)
    assert summary._counter(rows.device).item() == 0  # the last program set the tickets back


def test_summaries_one_after_another_share_the_counter(monkeypatch):
    monkeypatch.setattr(summary, "BLOCK", 16)
    monkeypatch.setattr(summary, "CHUNK", 4)
    for u, seed in ((200, 6), (17, 7), (333, 8), (1, 9)):  # blocks: 13, 2, 21, 1
        rows = _rows(u, seed, 0.1)
        assert summary.summarize(rows, 8, 3) == _expected(rows, 8, 3)
        assert summary._counter(rows.device).item() == 0


def test_defaults_and_a_strided_table():
    rows = _rows(700, 6)
    wide = torch.zeros(700, 2 * NSTAT, dtype=torch.float64)
    wide[:, ::2] = rows  # columns two apart: copied to a plain table first
    assert summary.summarize(wide[:, ::2], 8, 2) == _expected(rows, 8, 2)


def test_nothing_compared_and_unknown_units_are_counted():
    rows = _rows(40, 7)
    rows[:, S_COMPARED] = 0.0
    got = summary.summarize(rows, 4, 4)
    assert (got.units, got.failing, got.worst, got.failing_rows) == (0, 0, 0, ())
    rows = _rows(40, 8)
    rows[3, S_COMPARED], rows[3, S_MAX_ABS] = 32.0, float("nan")
    rows[9, S_COMPARED], rows[9, S_RATIO_NAN] = 32.0, 1.0
    assert summary.summarize(rows, 4, 4).unknown == 2


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="float64 rows"):
        summary.summarize(torch.zeros(4, NSTAT), 4, 2)
    with pytest.raises(ValueError, match="detail = 5, cap = 4"):
        summary.summarize(torch.zeros(4, NSTAT, dtype=torch.float64), 4, 5)

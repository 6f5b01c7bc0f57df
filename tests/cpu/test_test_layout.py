"""The test tree collects as one pytest session: no two test modules share a basename."""

import collections
import pathlib


def test_test_module_basenames_are_unique():
    root = pathlib.Path(__file__).resolve().parents[1]
    names = collections.Counter(p.name for p in root.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []

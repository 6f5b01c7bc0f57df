"""The test tree collects as one pytest session: no two test modules share a basename."""

import collections
import pathlib


def test_test_module_basenames_are_unique():
    root = pathlib.Path(__file__).resolve().parents[1]
    names = collections.Counter(p.name for p in root.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_the_long_files_started_first_exist():
    """tests/conftest.py's LONG_FIRST names files by path: a renamed or split file left there would
    silently lose its place at the front of the --dist loadfile queue."""
    import conftest  # tests/ is on sys.path

    root = pathlib.Path(__file__).resolve().parents[1]
    assert [p for p in conftest.LONG_FIRST if not (root / p).is_file()] == []
    assert len(set(conftest.LONG_FIRST)) == len(conftest.LONG_FIRST)

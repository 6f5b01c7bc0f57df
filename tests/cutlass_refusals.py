"""A CUTLASS build the adapter's checks stop in the front end: built, timed and its error text
returned, for the CUTLASS tests (tests/cpu/test_cutlass_checks.py, test_cutlass_evt.py)."""

from __future__ import annotations

import time

import pytest

from harness.build import BuildError, build_library

EARLY_REFUSAL_S = 60.0  # the front end alone; the full traced CUTLASS build takes minutes


def refused_early(source, cache_dir, **build) -> str:
    """nvcc's error text for `source` built as harness.build.build_library(source, **build) into
    `cache_dir` (a private cache: the build runs), which must fail within EARLY_REFUSAL_S."""
    started = time.monotonic()
    with pytest.raises(BuildError) as e:
        build_library(source, cache_dir=cache_dir, **build)
    seconds = time.monotonic() - started
    assert seconds < EARLY_REFUSAL_S, f"the refusal took {seconds:.0f} s: it came after the kernel was compiled"
    return e.value.stderr or ""

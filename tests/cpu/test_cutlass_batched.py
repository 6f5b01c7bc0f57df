"""The zoo's strided batched CUTLASS GEMM (zoo/cutlass_sm90/batched.cu) builds with nvcc, traced, as a live run
builds it (oracle.run.adapters.library_defines: ORACLE_CASE_BATCH included), in each of its variants: the quick
route, the host route (the user's make_arguments called with l = batch) and the two planted defects (one in
the host code, one through the traced mainloop's per-entry mutation). Each exports oracle_launch and keeps the
traced tree's epilogue order for the oracle to read. The builds go through the build cache (shared with the
live runs of the same cases); without a GPU nothing is launched (tests/gpu/test_zoo.py runs them). This file
holds the quick route's builds, test_cutlass_batched_host.py the host route's (four CUTLASS compiles: two
files, so that --dist loadfile builds them side by side). All four are the build tier's (--every-build).
"""

from __future__ import annotations

import pytest
from cutlass_launch import check_batched_build  # tests/ is on sys.path

from harness.build import cutlass_include_dirs

pytestmark = [pytest.mark.nvcc, pytest.mark.slow, pytest.mark.every_build]

CASES = ("batched.toml", "defects/batched_entry1_kblock_twice.toml")  # the quick route's (host: test_cutlass_batched_host.py)


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.mark.parametrize("case_file", CASES)
def test_every_batched_variant_builds_traced_as_a_live_run_builds_it(case_file):
    check_batched_build(case_file)

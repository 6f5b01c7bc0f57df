"""The host route's variants of the zoo's strided batched CUTLASS GEMM (zoo/cutlass_sm90/batched.cu with
ZOO_BATCHED_HOST: the user's make_arguments called with l = batch, correct and with the planted host-code
defect) build traced as a live run builds them, each exporting oracle_launch and keeping the traced tree's
epilogue order (the checks of test_cutlass_batched.py, whose quick-route builds run beside these under
--dist loadfile).
"""

from __future__ import annotations

import pytest
from cutlass_launch import check_batched_build  # tests/ is on sys.path

from harness.build import cutlass_include_dirs

pytestmark = [pytest.mark.nvcc, pytest.mark.slow, pytest.mark.every_build]

HOST_CASES = ("batched_host.toml", "defects/batched_host_b_stride_of_a.toml")


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.mark.parametrize("case_file", HOST_CASES)
def test_every_batched_host_variant_builds_traced_as_a_live_run_builds_it(case_file):
    check_batched_build(case_file)

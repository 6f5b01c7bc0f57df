"""The zoo's strided batched CUTLASS GEMM (zoo/cutlass_sm90/batched.cu) builds with nvcc, traced, as a live run
builds it (oracle.run.adapters.library_defines: ORACLE_CASE_BATCH included), in each of its variants: the quick
route, the host route (the user's make_arguments called with l = batch) and the two planted defects (one in
the host code, one through the traced mainloop's per-entry mutation). Each exports oracle_launch and keeps the
traced tree's epilogue order for the oracle to read. The builds go through the build cache (shared with the
live runs of the same cases); without a GPU nothing is launched (tests/gpu/test_zoo.py runs them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.build import build_library, cutlass_include_dirs
from oracle.run.adapters import library_defines
from oracle.run.case import load_case
from oracle.run.library_epilogue import declared_order

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"
CASES = ("batched.toml", "batched_host.toml", "defects/batched_host_b_stride_of_a.toml",
         "defects/batched_entry1_kblock_twice.toml")


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.mark.parametrize("case_file", CASES)
def test_every_batched_variant_builds_traced_as_a_live_run_builds_it(case_file):
    case = load_case(str(ZOO / case_file), allow_library=True)
    defines = library_defines(case.kernel, case.spec, traced=True)
    assert defines["ORACLE_CASE_BATCH"] == str(case.spec.batch) == "3"
    built = build_library(case.kernel.library, arch=case.kernel.arch, defines=defines)
    blob = Path(built.cubin_path).read_bytes()
    assert b"oracle_launch" in blob, case_file
    assert declared_order(blob) == ("alpha_beta", "cast"), case_file  # the LinearCombination tree's

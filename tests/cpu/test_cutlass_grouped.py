"""The zoo's grouped CUTLASS GEMM (zoo/cutlass_sm90/grouped.cu, CUTLASS's example 57 pointer-array kernel) builds
with nvcc, traced, as a live run builds it (oracle.run.adapters.library_defines: ORACLE_CASE_GROUPS included),
through the quick route (the adapter fills the group arrays) and the host route (the user's make_arguments
with the groups' sizes; its planted per-group alpha defect, the variant that also fills alpha_ptr_array). Each
exports oracle_launch and keeps the traced pointer-array tree's epilogue order for the oracle to read. The
builds go through the build cache (shared with the live runs of the same cases); without a GPU nothing is
launched (tests/gpu/test_zoo.py runs them). Both builds are the build tier's (--every-build).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.build import build_library, cutlass_include_dirs
from oracle.run.adapters import library_defines
from oracle.run.case import load_case
from oracle.run.library_epilogue import declared_order

pytestmark = [pytest.mark.nvcc, pytest.mark.slow, pytest.mark.every_build]

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"
CASES = ("grouped.toml", "defects/grouped_host_alpha_twice_group1.toml")


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.mark.parametrize("case_file", CASES)
def test_grouped_variants_build_traced_as_a_live_run_builds_them(case_file):
    case = load_case(str(ZOO / case_file), allow_library=True)
    defines = library_defines(case.kernel, case.spec, traced=True)
    assert defines["ORACLE_CASE_GROUPS"] == str(len(case.spec.groups)) == "4"
    built = build_library(case.kernel.library, arch=case.kernel.arch, defines=defines)
    blob = Path(built.cubin_path).read_bytes()
    assert b"oracle_launch" in blob, case_file
    assert declared_order(blob) == ("alpha_beta", "cast"), case_file  # the pointer-array LinearCombination tree's

"""The zoo's grouped CUTLASS GEMM in example 57's ping-pong schedule (zoo/cutlass_sm90/grouped.cu with
ZOO_GROUPED_PINGPONG: KernelPtrArrayTmaWarpSpecializedPingpong, PtrArrayTmaWarpSpecializedPingpong) builds with
nvcc, traced, as a live run builds it (oracle.run.adapters.library_defines: ORACLE_CASE_GROUPS included),
through the quick route and the host route (its planted group-3 A pointer defect). Each exports oracle_launch,
keeps the traced pointer-array tree's epilogue order for the oracle to read, and holds the ping-pong kernel with
the traced pointer-array collectives (the kernel's name: its schedule, Sm90TracedArrayMainloop, TracedFusion).
Without a GPU nothing is launched (tests/gpu/test_zoo.py runs them).
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
CASES = ("grouped_pingpong.toml", "defects/pingpong_grouped_host_a_of_group0.toml")


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.mark.parametrize("case_file", CASES)
def test_grouped_ping_pong_variants_build_traced_as_a_live_run_builds_them(case_file):
    case = load_case(str(ZOO / case_file), allow_library=True)
    defines = library_defines(case.kernel, case.spec, traced=True)
    assert defines["ZOO_GROUPED_PINGPONG"] == "1" and defines["ORACLE_TRACE"] == "1", defines
    assert defines["ORACLE_CASE_GROUPS"] == str(len(case.spec.groups)) == "4"
    built = build_library(case.kernel.library, arch=case.kernel.arch, defines=defines)
    blob = Path(built.cubin_path).read_bytes()
    assert b"oracle_launch" in blob, case_file
    assert declared_order(blob) == ("alpha_beta", "cast"), case_file  # the pointer-array LinearCombination tree's
    # the kernel is the ping-pong grouped one, its collectives the traced pointer-array ones
    assert b"KernelPtrArrayTmaWarpSpecializedPingpong" in blob, case_file
    assert b"KernelPtrArrayTmaWarpSpecializedCooperative" not in blob, case_file
    assert b"Sm90TracedArrayMainloop" in blob and b"TracedFusion" in blob, case_file

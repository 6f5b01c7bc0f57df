"""The CUTLASS adapter's stream-K scheduler (TracedScheduler, harness/include/oracle_trace/cutlass/
sm90_stream_k.hpp) on the zoo's CUTLASS SM90 GEMM without a GPU: the stream-K build (ZOO_CUTLASS_STREAMK,
zoo/cutlass_sm90/splitk.toml's, which streamk.toml and streamk_dp.toml share) takes a split-K or stream-K
case up to its first CUDA call and refuses splits it cannot run; the host route's stream-K build refuses
the arguments the zoo's make_arguments leave at CUTLASS's defaults for an unsplit case. Two CUTLASS
builds, in a file of their own so that --dist loadfile builds them beside test_cutlass_adapter.py's; the
build tier's (--every-build).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_tools import cuobjdump, sass_by_function  # tests/ is on sys.path
from cutlass_launch import SOURCE, launch, launch_without_a_device, library_call, require_cutlass, zoo_library

from harness.build import build_library

pytestmark = [pytest.mark.nvcc, pytest.mark.every_build]


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    require_cutlass()


@pytest.fixture(scope="module")
def stream_k_library() -> Path:
    """The kernel with CUTLASS's stream-K scheduler through TracedScheduler (zoo/cutlass_sm90/splitk.toml's
    build, which streamk.toml and streamk_dp.toml share), traced."""
    return zoo_library("splitk.toml")


@pytest.mark.slow
@pytest.mark.parametrize("fields, words", [
    ({"splits": 2, "stream_k_workers": 8}, "splits 2, stream_k_workers 8: splits >= 1, stream_k_workers >= 0, not both"),
    ({"splits": 0}, "splits 0, stream_k_workers 0: splits >= 1"),
    ({"stream_k_workers": -1}, "stream_k_workers -1"),
])
def test_the_stream_k_library_refuses_a_split_it_cannot_run(stream_k_library, fields, words):
    got, message = launch(stream_k_library, library_call(), **fields)
    assert got == 1001 and words in message, message


@pytest.mark.slow
def test_the_host_route_s_stream_k_arguments_may_not_split_an_unsplit_case():
    # the zoo's make_arguments leaves the scheduler's arguments at CUTLASS's defaults: the Heuristic
    # decomposition, which may split tiles that the unsplit case would judge whole
    lib = build_library(SOURCE, defines={"ORACLE_TRACE": "1", "ZOO_CUTLASS_HOST": "1",
                                         "ZOO_CUTLASS_STREAMK": "1"}).cubin_path
    got, message = launch(lib, library_call())
    assert got == 1001, message
    assert ("make_arguments asks CUTLASS's stream-K scheduler for decomposition Heuristic with splits 1, and the "
            "case declares no split") in message, message


@pytest.mark.slow
@pytest.mark.parametrize("field", ["splits", "stream_k_workers"])
def test_the_stream_k_library_takes_a_split_case_up_to_the_first_cuda_call(stream_k_library, field):
    out = launch_without_a_device(stream_k_library, **{field: 3 if field == "splits" else 16})
    # the split passed every check before the device is asked for its SM count (the quick route's first
    # CUDA call), which fails without a device
    assert out.startswith("1002 cudaGetDevice: "), out
    traced = sass_by_function(stream_k_library) if cuobjdump() is not None else {}
    assert all("TracedStreamKTag" in name for name in traced), sorted(traced)  # the kernel's scheduler tag

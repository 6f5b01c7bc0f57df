"""Tracing off costs nothing in the zoo's CUTLASS SM90 GEMM (zoo/cutlass_sm90/cutlass_sm90.cu): CUTLASS's
production instantiation has the same SASS with the adapter included (aliases, entry macro) as without it,
and the traced kernel (read from the traced library, whose device code a traced cubin build would repeat)
differs. Two CUTLASS cubin builds (and the traced library test_cutlass_adapter.py builds, shared through the
build cache), in a file of their own so that --dist loadfile builds them beside the adapter's. The build
tier's (--every-build).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_tools import cuobjdump, sass_by_function  # tests/ is on sys.path
from cutlass_launch import SOURCE, require_cutlass, zoo_library

from harness.build import build_cubin

pytestmark = [pytest.mark.nvcc, pytest.mark.every_build]


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    require_cutlass()


@pytest.fixture(scope="module")
def traced_library() -> Path:
    return zoo_library("cutlass_sm90.toml")


def _cubin(*defines: str) -> dict[str, list[str]]:
    res = build_cubin(SOURCE, defines={d: "1" for d in defines})
    return sass_by_function(res.cubin_path)


def test_the_production_instantiation_has_the_same_sass_with_the_adapter_included(traced_library):
    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    plain = _cubin("ZOO_CUTLASS_PLAIN")
    adapted = _cubin()
    assert len(plain) == 1 and all("device_kernel" in name for name in plain), sorted(plain)
    assert adapted == plain  # same kernel name (same types) and the same instructions
    # the traced kernel as the library embeds it (the same device code as a traced cubin build)
    traced = sass_by_function(traced_library)
    (name,) = traced
    assert "Sm90TracedMainloop" in name and "TracedFusion" in name
    assert traced[name] != plain[next(iter(plain))]



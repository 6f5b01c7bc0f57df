"""The split GEMMs of the zoo (zoo/split_gemm/split_gemm.cu: split-K serial, atomic and floor-share,
stream-K, grouped) build without a GPU (nvcc): every manifest entry point is in the cubin built with
-DORACLE_TRACE and every variant in the build without it, the split-K and stream-K variants spill
nothing and use no stack (ptxas -v), and every untraced variant's SASS is the same with tracing
compiled in."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_tools import (assert_no_spills, assert_sink_only_traced, assert_tracing_compiled_out, entry_symbols,
                        traced_entries)  # tests/ on sys.path

ROOT = Path(__file__).resolve().parents[2]
SPLIT_SOURCE = ROOT / "zoo" / "split_gemm" / "split_gemm.cu"
ZOO_SOURCE = SPLIT_SOURCE  # what the zoo_builds fixture (tests/conftest.py) builds
SPLIT_CORRECT = ["zoo_splitk_serial", "zoo_splitk_serial_floor", "zoo_splitk_atomic_partials",
                 "zoo_splitk_atomic_reduce", "zoo_streamk", "zoo_streamk_cutlass", "zoo_grouped"]
SPLIT_DEFECTIVE = ["zoo_splitk_serial_partial_twice", "zoo_splitk_serial_partial_missing", "zoo_splitk_serial_overlap",
                   "zoo_splitk_serial_floor_partial_twice", "zoo_splitk_atomic_partials_partial_twice",
                   "zoo_streamk_wrong_partial", "zoo_streamk_cutlass_skip_extra", "zoo_streamk_cutlass_overlap_iter",
                   "zoo_streamk_cutlass_wrong_partial", "zoo_grouped_offset", "zoo_grouped_wrong_b",
                   "zoo_grouped_cross_boundary"]


@pytest.mark.nvcc
def test_split_entry_points_traced_and_plain(zoo_builds):
    traced = traced_entries(zoo_builds, "split_gemm")
    every = set(SPLIT_CORRECT + SPLIT_DEFECTIVE)
    assert traced == {f"{n}_traced" for n in every} | every, sorted(traced ^ ({f"{n}_traced" for n in every} | every))
    assert entry_symbols(zoo_builds["plain"].cubin_path) == every
    assert_sink_only_traced(zoo_builds)


@pytest.mark.nvcc
def test_split_k_and_stream_k_variants_do_not_spill_or_use_a_stack(zoo_builds):
    # (the grouped kernels are left out: zoo_grouped_cross_boundary spills 4 bytes and has an 8-byte frame)
    for build in ("traced", "plain"):
        assert_no_spills(zoo_builds[build], exempt=lambda f: f.startswith("zoo_grouped"))


@pytest.mark.nvcc
def test_split_untraced_variants_are_the_same_with_tracing_compiled_in(zoo_builds):
    assert_tracing_compiled_out(zoo_builds, SPLIT_CORRECT + SPLIT_DEFECTIVE, SPLIT_CORRECT)

"""The split GEMMs of the zoo (zoo/split_gemm/split_gemm.cu: split-K serial, atomic and floor-share,
stream-K, grouped) build without a GPU (nvcc): every manifest entry point is in the cubin built with
-DORACLE_TRACE and every variant in the build without it, the split-K and stream-K variants spill
nothing and use no stack (ptxas -v), and every untraced variant's SASS is the same with tracing
compiled in."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_tools import all_symbols, entry_symbols, ptxas_usage, sass_by_function, traced_and_plain  # tests/ on sys.path
from zoo_cases import entries

ROOT = Path(__file__).resolve().parents[2]
SPLIT_SOURCE = ROOT / "zoo" / "split_gemm" / "split_gemm.cu"
SPLIT_CORRECT = ["zoo_splitk_serial", "zoo_splitk_serial_floor", "zoo_splitk_atomic_partials",
                 "zoo_splitk_atomic_reduce", "zoo_streamk", "zoo_streamk_cutlass", "zoo_grouped"]
SPLIT_DEFECTIVE = ["zoo_splitk_serial_partial_twice", "zoo_splitk_serial_partial_missing", "zoo_splitk_serial_overlap",
                   "zoo_splitk_serial_floor_partial_twice", "zoo_splitk_atomic_partials_partial_twice",
                   "zoo_streamk_wrong_partial", "zoo_streamk_cutlass_skip_extra", "zoo_streamk_cutlass_overlap_iter",
                   "zoo_streamk_cutlass_wrong_partial", "zoo_grouped_offset", "zoo_grouped_wrong_b",
                   "zoo_grouped_cross_boundary"]


@pytest.fixture(scope="module")
def split_builds():
    return traced_and_plain(SPLIT_SOURCE)


@pytest.mark.nvcc
def test_split_entry_points_traced_and_plain(split_builds):
    traced = entry_symbols(split_builds["traced"].cubin_path)
    want = {e["kernel"].partition(":")[2] for e in entries() if e["kernel"].startswith("zoo/split_gemm/")}
    assert want <= traced, f"missing entry points: {sorted(want - traced)}"
    every = set(SPLIT_CORRECT + SPLIT_DEFECTIVE)
    assert traced == {f"{n}_traced" for n in every} | every, sorted(traced ^ ({f"{n}_traced" for n in every} | every))
    assert entry_symbols(split_builds["plain"].cubin_path) == every
    assert "oracle_trace_sink" in all_symbols(split_builds["traced"].cubin_path)
    assert "oracle_trace_sink" not in all_symbols(split_builds["plain"].cubin_path)


@pytest.mark.nvcc
def test_split_k_and_stream_k_variants_do_not_spill_or_use_a_stack(split_builds):
    # (the grouped kernels are left out: zoo_grouped_cross_boundary spills 4 bytes and has an 8-byte frame)
    for build in ("traced", "plain"):
        usage = ptxas_usage(split_builds[build].log)
        assert set(usage) == entry_symbols(split_builds[build].cubin_path), split_builds[build].log[:2000]
        bad = {f: u for f, u in usage.items() if u != (0, 0, 0) and not f.startswith("zoo_grouped")}
        assert not bad, f"{build}: (stack frame, spill stores, spill loads) bytes: {bad}"


@pytest.mark.nvcc
def test_split_untraced_variants_are_the_same_with_tracing_compiled_in(split_builds):
    on, off = sass_by_function(split_builds["traced"].cubin_path), sass_by_function(split_builds["plain"].cubin_path)
    for name in SPLIT_CORRECT + SPLIT_DEFECTIVE:
        assert on[name] == off[name], name
    for name in SPLIT_CORRECT:
        assert on[f"{name}_traced"] != off[name], name

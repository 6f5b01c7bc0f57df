"""The zoo's CuTe Hopper GEMM (zoo/hopper_gemm/) holds together without a GPU.

- the manifest plants each of its defects once, over the stages the oracle must name, with the
  padding confound among the correct runs;
- (nvcc, the build tier's: --every-build) every manifest entry point is in the cubin built with
  -DORACLE_TRACE (the session's build, tests/conftest.py, shared with the reproducer's test), every variant in the build without
  it, the bf16 production variants do not spill, and the correct variants' untraced SASS does not
  change when ORACLE_TRACE is on; its case files launch the shared memory and transaction bytes the
  kernel needs;
- (nvcc) its shared-memory slot layouts (zoo/hopper_gemm/hopper_layout.cuh), printed by a host
  program through the same CuTe tensors the kernel and its load taps use: they are exactly where a
  128-byte-swizzled TMA box puts each element, and the transposed_a view is a permutation of the
  same slot.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from cuda_tools import (HOPPER_SOURCE, assert_sink_only_traced, assert_tracing_compiled_out, entry_symbols, ptxas_usage,
                        require_nvcc, traced_entries)  # tests/ on sys.path
from zoo_cases import ROOT, entries


def test_manifest_covers_every_hopper_defect():
    doc = [e for e in entries() if e["kernel"].startswith("zoo/hopper_gemm/")]
    defects = sorted(e["defect"] for e in doc if e["defect"] is not None)
    kernel = sorted(n.replace("zoo_hopper_", "").split("_", 1)[1] for n in HOPPER_DEFECTIVE)
    kernel = [k.replace("tensor_e4m3out_", "").replace("tensor_", "").replace("rowcol_", "") for k in kernel]
    kernel = [k if k == "block_scale_twice" else k.removeprefix("block_") for k in kernel]
    assert defects == sorted(kernel + ["wrong_stride", "narrow_box", "no_swizzle", "nan_fill", "mn_scales_read_k_major"])
    stages = {e["expected_stage"] for e in doc}
    assert {"descriptor_a", "descriptor_b", "load_a", "mma", "epilogue_scale", "epilogue_bias", "epilogue_activation",
            "epilogue_cast", "epilogue_store", None} <= stages
    confound = [e for e in doc if e["defect"] is None and e["problem"]["n"] < 16]
    assert confound and confound[0]["problem"] == {"m": 1024, "n": 8, "k": 6144}, \
        "the padding confound (batch 8 < MMA N 16, K = 6144, OUT = 1024, bf16) is missing"



def test_block_scale_defects_are_named_at_mma_at_both_shapes():
    # the block scales act per k-block in the main loop, so a wrong scale is an mma finding, run live
    # at 4096^3 and recorded at a decode shape; the correct block-scaled variant runs at both
    big = {"m": 4096, "n": 4096, "k": 4096}
    doc = [e for e in entries() if e["kernel"].startswith("zoo/hopper_gemm/")
           and e["kernel"].partition(":")[2].startswith("zoo_hopper_e4m3_block")]
    planted = {e["defect"]: e for e in doc if e["defect"] is not None}
    assert set(planted) == {"scale_prev_kblock", "block_scale_twice", "skip_promotion", "mn_scales_read_k_major"}
    for e in planted.values():
        assert e["expected_stage"] == "mma" and e["problem"] == big and e["record_problem"]["m"] <= 16, e["name"]
        assert e["expected_k_block"] == (1 if e["defect"] == "scale_prev_kblock" else 0), e["name"]
    correct = [e["problem"] for e in doc if e["defect"] is None]
    assert big in correct and any(p["m"] <= 16 for p in correct), correct
    from oracle.run.case import load_case

    c = load_case(str(ROOT / "zoo" / "hopper_gemm" / "hopper_gemm_e4m3_block.toml"))
    assert (c.spec.scale_a.kind, c.spec.scale_a.block, c.spec.scale_b.block) == ("block", (1, 128), (128, 128))
    # DeepGEMM's layout: A's scales MN-major, read by the _mn kernel; the k-major kernel given them is the defect
    mn = load_case(str(ROOT / "zoo" / "hopper_gemm" / "hopper_gemm_e4m3_block_mn.toml"))
    assert (mn.spec.scale_a.major, mn.spec.scale_b.major, mn.kernel.entry) == \
        ("col", "row", "zoo_hopper_e4m3_block_mn_traced")
    assert {e["kernel"].partition(":")[2] for e in doc if e["case"].endswith("_mn.toml")} == \
        {"zoo_hopper_e4m3_block_mn_traced"}
    bad = load_case(str(ROOT / planted["mn_scales_read_k_major"]["case"]))
    assert bad.spec.scale_a.major == "col" and bad.kernel.entry == "zoo_hopper_e4m3_block_traced"

# -- the Hopper GEMM's builds --------------------------------------------------------------------
HOPPER_CORRECT = ["zoo_hopper_bf16", "zoo_hopper_bf16_n16", "zoo_hopper_fp16", "zoo_hopper_e4m3_tensor",
                  "zoo_hopper_e4m3_rowcol", "zoo_hopper_e4m3_block", "zoo_hopper_e4m3_block_mn",
                  "zoo_hopper_e4m3_tensor_e4m3out"]
HOPPER_DEFECTIVE = ["zoo_hopper_bf16_stale_slot", "zoo_hopper_bf16_transposed_a", "zoo_hopper_bf16_kblock_twice",
                    "zoo_hopper_bf16_no_reset", "zoo_hopper_fp16_fp16_acc", "zoo_hopper_e4m3_tensor_scale_twice",
                    "zoo_hopper_e4m3_rowcol_col_scale_row", "zoo_hopper_bf16_bias_row", "zoo_hopper_bf16_gelu_tanh",
                    "zoo_hopper_e4m3_tensor_e4m3out_cast_no_sat", "zoo_hopper_bf16_swapped_store",
                    "zoo_hopper_e4m3_block_scale_prev_kblock", "zoo_hopper_e4m3_block_scale_twice",
                    "zoo_hopper_e4m3_block_skip_promotion"]


@pytest.mark.nvcc
@pytest.mark.every_build
def test_hopper_entry_points_traced_and_plain(hopper_builds):
    traced = traced_entries(hopper_builds, "hopper_gemm")
    assert traced == {f"{n}_traced" for n in HOPPER_CORRECT + HOPPER_DEFECTIVE} | set(HOPPER_CORRECT)
    assert entry_symbols(hopper_builds["plain"].cubin_path) == set(HOPPER_CORRECT + HOPPER_DEFECTIVE)
    assert_sink_only_traced(hopper_builds)


@pytest.mark.nvcc
@pytest.mark.every_build
def test_hopper_bf16_production_variants_do_not_spill(hopper_builds):
    # The fp8 variants hold two fragments (the k-block's partial sum beside the accumulator) and do
    # spill a little; the bf16 ones, timed in the warm-path benchmark, must not.
    usage = ptxas_usage(hopper_builds["plain"].log)
    for name in ("zoo_hopper_bf16", "zoo_hopper_bf16_n16"):
        assert usage[name] == (0, 0, 0), (name, usage[name])


@pytest.mark.nvcc
@pytest.mark.every_build
def test_hopper_untraced_variants_are_the_same_with_tracing_compiled_in(hopper_builds):
    assert_tracing_compiled_out(hopper_builds, HOPPER_CORRECT, HOPPER_CORRECT)


def test_hopper_cases_launch_what_the_kernel_needs():
    text = HOPPER_SOURCE.read_text()
    for case, smem, tx in (("hopper_gemm.toml", 133120, 32768), ("hopper_gemm_n16.toml", 75776, 18432)):
        from oracle.run.case import load_case

        c = load_case(str(ROOT / "zoo" / "hopper_gemm" / case))
        assert c.launch.block == (256, 1, 1) and c.launch.shared_mem_bytes == smem
        assert str(smem) in text and str(tx) in text
        assert c.launch.args[-1].expr == tx  # tx_bytes = (BM + BN) * 128
        t = c.spec.tile
        assert (t.bm + t.bn) * 128 == tx and (c.spec.swizzle_a, c.spec.swizzle_b) == (128, 128)
        # sizeof(SharedStorage): 4 slots of (BM + BN) rows of 128 bytes, then the barriers, rounded up to
        # the 1 KiB alignment of the struct; plus 1 KiB to align the dynamic shared memory base
        storage = -(-(4 * (t.bm + t.bn) * 128 + 64) // 1024) * 1024
        assert smem == storage + 1024


HOPPER_PROBE = r'''
#include <cstdio>
#include <cstdlib>
#include "hopper_layout.cuh"
using namespace zoo_hopper;

// every element offset of a (rows, cols, 4) slot ring, row-major per slot
template <class T, class L>
static void dump(const char* name, int rows, int cols, bool first) {
  T* base = static_cast<T*>(std::aligned_alloc(1024, sizeof(T) * rows * cols * 4));
  auto t = cute::make_tensor(cute::make_smem_ptr(base), L{});
  std::printf("%s\"%s\": [", first ? "" : ",\n", name);
  for (int s = 0; s < 4; ++s)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) std::printf("%s%d", s + r + c ? "," : "", element_offset(t, base, r, c, s));
  std::printf("]");
  std::free(base);
}

int main() {
  using B16 = SmemLayouts<cutlass::bfloat16_t, 128, 16, 64, 4, false>;
  using B16T = SmemLayouts<cutlass::bfloat16_t, 128, 16, 64, 4, true>;
  using F8 = SmemLayouts<cutlass::float_e4m3_t, 128, 16, 128, 4, false>;
  std::printf("{");
  dump<cutlass::bfloat16_t, B16::A>("bf16_a", 128, 64, true);
  dump<cutlass::bfloat16_t, B16::B>("bf16_b", 16, 64, false);
  dump<cutlass::bfloat16_t, B16T::AMma>("bf16_a_mn", 128, 64, false);
  dump<cutlass::float_e4m3_t, F8::A>("e4m3_a", 128, 128, false);
  std::printf("}\n");
  return 0;
}
'''


@pytest.fixture(scope="module")
def hopper_offsets(tmp_path_factory) -> dict:
    require_nvcc()
    from harness.build import build_slot, cutlass_include_dirs

    if not cutlass_include_dirs():
        pytest.skip("The Hopper layouts are CuTe layouts: install the nvidia-cutlass wheel for its headers.")
    tmp = tmp_path_factory.mktemp("hopper_probe")
    src, exe = tmp / "probe.cu", tmp / "probe"
    src.write_text(HOPPER_PROBE)
    cmd = ["nvcc", "-std=c++17", "--expt-relaxed-constexpr", f"-I{HOPPER_SOURCE.parent}"] + \
        [f"-I{d}" for d in cutlass_include_dirs()] + ["-o", str(exe), str(src)]
    with build_slot():
        proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {k: np.array(v) for k, v in json.loads(out).items()}


def _tma_offsets(rows: int, cols: int, itemsize: int) -> np.ndarray:
    """Where a 128B-swizzled TMA box of (cols, rows) puts element (slot, row, col), in elements."""
    from harness.tensormap import swizzle_offset

    out = []
    for s in range(4):
        for r in range(rows):
            for c in range(cols):
                out.append(swizzle_offset(s * rows * 128 + r * 128 + c * itemsize, 128) // itemsize)
    return np.array(out)


@pytest.mark.nvcc
@pytest.mark.every_build
@pytest.mark.parametrize("name, rows, cols, itemsize", [("bf16_a", 128, 64, 2), ("bf16_b", 16, 64, 2),
                                                        ("e4m3_a", 128, 128, 1)])
def test_hopper_slot_layouts_are_what_the_tma_writes(hopper_offsets, name, rows, cols, itemsize):
    # the layout the MMAs read and the load taps read through, against the TMA's swizzle formula
    assert np.array_equal(hopper_offsets[name], _tma_offsets(rows, cols, itemsize))


@pytest.mark.nvcc
@pytest.mark.every_build
def test_hopper_transposed_a_view_reads_the_same_bytes_elsewhere(hopper_offsets):
    mn, k = hopper_offsets["bf16_a_mn"], hopper_offsets["bf16_a"]
    assert np.array_equal(np.sort(mn), np.sort(k))  # a permutation of the slot ring
    moved = mn != k
    assert moved.mean() > 0.9, "the MN-major view must read almost every element from another place"
    per_slot = 128 * 64
    assert np.array_equal(mn[:per_slot] // per_slot, np.zeros(per_slot)), "it stays inside its slot"

"""The zoo's W4A16 GEMM (zoo/w4a16_sm80/) holds together without a GPU.

- the manifest plants each of its defects once, at the stage the oracle must name, every defect run
  live at 4096 x 4096 x 4096 and recorded at a decode shape (M <= 16), beside correct runs at both;
- its case files describe the kernel: a uint4 B packed low nibble first, group 128 with fp16 scales
  and integer zero points, the tile, block and shared memory the source states, one defect case per
  defective entry point;
- (nvcc) every manifest entry point is in the cubin built with -DORACLE_TRACE and every variant in
  the build without it, nothing spills or uses a stack (ptxas -v), and the correct variant's
  untraced SASS does not change when ORACLE_TRACE is on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_tools import (assert_no_spills, assert_sink_only_traced, assert_tracing_compiled_out, entry_symbols,
                        traced_entries)  # tests/ on sys.path
from zoo_cases import ROOT, entries

from oracle.run.case import load_case

W4A16_DIR = ROOT / "zoo" / "w4a16_sm80"
W4A16_SOURCE = W4A16_DIR / "w4a16_gemm.cu"
ZOO_SOURCE = W4A16_SOURCE  # what the zoo_builds fixture (tests/conftest.py) builds
W4A16_CORRECT = ["zoo_w4a16_uint4"]
# defect -> the stage the oracle must name
W4A16_DEFECTS = {"nibble_order": "dequant_b", "group_index": "dequant_b", "zero_twice": "dequant_b",
                 "scale_group": "dequant_b", "stale_b": "load_b", "kblock_twice": "mma"}
BIG = {"m": 4096, "n": 4096, "k": 4096}


def _mine() -> list[dict]:
    return entries("zoo/w4a16_sm80/")


def test_manifest_covers_every_w4a16_defect_at_its_stage_and_both_shapes():
    doc = _mine()
    planted = {e["defect"]: e for e in doc if e["defect"] is not None}
    assert sorted(e["defect"] for e in doc if e["defect"] is not None) == sorted(W4A16_DEFECTS)
    for defect, e in planted.items():
        assert e["expected_stage"] == W4A16_DEFECTS[defect], e["name"]
        assert e["problem"] == BIG and e["record_problem"]["m"] <= 16, e["name"]
        assert e["case"] == f"zoo/w4a16_sm80/defects/{defect}.toml", e["name"]
    correct = [e for e in doc if e["defect"] is None]
    assert any(e["problem"] == BIG for e in correct), "a correct run at 4096^3 is missing"
    assert any(e["problem"]["m"] <= 16 and "record_problem" not in e for e in correct), \
        "a correct decode run (M <= 16) is missing"
    assert all(e["kernel"] == "zoo/w4a16_sm80/w4a16_gemm.cu:zoo_w4a16_uint4_traced" for e in correct)


def test_w4a16_cases_describe_the_kernel():
    text = W4A16_SOURCE.read_text()
    base = load_case(str(W4A16_DIR / "w4a16_gemm.toml"))
    s = base.spec
    assert (s.a_dtype, s.b_dtype, s.b_packing, s.b_group_size, s.b_scales, s.b_zeros) == \
        ("fp16", "uint4", "k_pairs_low_first", 128, "fp16", "int")
    assert (s.tile.bm, s.tile.bn, s.tile.bk) == (64, 128, 64) and s.b_major == "col" and s.out_dtype == "fp16"
    assert base.launch.block == (256, 1, 1) and base.launch.shared_mem_bytes == 26624
    assert "26624 bytes" in text and "block (256, 1, 1)" in text and "k_pairs_low_first" in text
    assert "kBM = 64, kBN = 128, kBK = 64" in (W4A16_DIR / "w4a16_layout.cuh").read_text()
    cases = sorted(p.stem for p in (W4A16_DIR / "defects").glob("*.toml"))
    assert cases == sorted(W4A16_DEFECTS)
    for defect in W4A16_DEFECTS:
        c = load_case(str(W4A16_DIR / "defects" / f"{defect}.toml"), {"m": 16, "n": 256, "k": 512})
        assert c.kernel.entry == f"zoo_w4a16_uint4_{defect}_traced" and c.spec.b_dtype == "uint4", defect
        assert Path(c.kernel.source).resolve() == W4A16_SOURCE.resolve()


# -- builds ---------------------------------------------------------------------------------------
@pytest.mark.nvcc
def test_w4a16_entry_points_traced_and_plain(zoo_builds):
    every = set(W4A16_CORRECT) | {f"zoo_w4a16_uint4_{d}" for d in W4A16_DEFECTS}
    traced = traced_entries(zoo_builds, "w4a16_sm80")
    assert traced == {f"{n}_traced" for n in every} | set(W4A16_CORRECT), sorted(traced)
    assert entry_symbols(zoo_builds["plain"].cubin_path) == every
    assert_sink_only_traced(zoo_builds)


@pytest.mark.nvcc
def test_w4a16_does_not_spill_or_use_a_stack(zoo_builds):
    for build in ("traced", "plain"):
        assert_no_spills(zoo_builds[build])


@pytest.mark.nvcc
def test_w4a16_untraced_variant_is_the_same_with_tracing_compiled_in(zoo_builds):
    assert_tracing_compiled_out(zoo_builds, W4A16_CORRECT, W4A16_CORRECT)

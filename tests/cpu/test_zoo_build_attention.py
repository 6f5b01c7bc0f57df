"""The zoo's FlashAttention-2-style kernel (zoo/fa2_sm80) holds together without a GPU: its builds,
its manifest entries and its case files.

- (nvcc) the build with -DORACLE_TRACE holds every entry point traced and untraced, the build
  without it the untraced ones only; every untraced entry point's SASS is the same in both (the
  taps add nothing to a production build), every traced one differs; no untraced function spills
  or uses a stack; two defect builds (a ZOO_FA2_<DEFECT> define) compile traced and change the
  kernel they plant the defect in;
- tests/zoo/manifest.json: one entry per planted defect of the source (by its define), the correct
  dense, head_dim 128, split-KV and paged variants, every entry point in the traced cubin, every
  defect case defining exactly its defect's macro;
- every case file under zoo/fa2_sm80 loads (oracle.run.case.load_case) with a launch that fits the
  kernel: the shared memory of its head dim, 128 threads, the combine after a split.
Builds go through the oracle's build cache (tests/cuda_tools.zoo_build), two at a time.
"""

from __future__ import annotations


import pytest
from cuda_tools import sass_by_function, traced_and_plain  # tests/ on sys.path
from attention_zoo_checks import check_builds, check_case_file, check_manifest, check_stages_named
from zoo_cases import ROOT

FA2_DIR = ROOT / "zoo" / "fa2_sm80"
FA2_SOURCE = FA2_DIR / "fa2_sm80.cu"
BUILT_DEFECTS = ("p_wrong_type", "v_read_with_k_layout")  # compiled by the build tier (--every-build); the others only on the GPU
ENTRIES = {f"zoo_fa2_{kind}{dt}_d{d}" for kind in ("", "split_", "paged_", "combine_") for dt in ("bf16", "fp16")
           for d in (64, 128)}


def _defect_build(defect: str):
    from harness.build import build_cubin

    return build_cubin(FA2_SOURCE, defines={"ORACLE_TRACE": "1", f"ZOO_FA2_{defect.upper()}": "1"})


@pytest.fixture(scope="module")
def builds():
    return traced_and_plain(FA2_SOURCE)


# -- builds ---------------------------------------------------------------------------------------
@pytest.mark.nvcc
@pytest.mark.every_build
def test_every_entry_point_is_built_traced_and_untraced_with_tracing_compiled_out_and_no_spills(builds):
    check_builds(builds, "fa2_sm80", ENTRIES)


@pytest.mark.nvcc
@pytest.mark.every_build
@pytest.mark.parametrize("defect", BUILT_DEFECTS)
def test_a_defect_define_changes_the_kernel_it_plants_the_defect_in(builds, defect):
    bad, good = sass_by_function(_defect_build(defect).cubin_path), sass_by_function(builds["traced"].cubin_path)
    assert set(bad) == set(good)
    assert bad["zoo_fa2_bf16_d64"] != good["zoo_fa2_bf16_d64"]
    assert bad["zoo_fa2_combine_bf16_d64"] == good["zoo_fa2_combine_bf16_d64"]  # the combine has neither defect


# -- the manifest ---------------------------------------------------------------------------------
def test_the_manifest_holds_every_defect_of_the_source_once_and_the_correct_variants():
    check_manifest("fa2_sm80", FA2_SOURCE, "FA2", {"zoo_fa2_bf16_d64_traced", "zoo_fa2_fp16_d128_traced", "zoo_fa2_split_bf16_d64_traced",
                                                "zoo_fa2_paged_bf16_d64_traced"})


def test_the_manifest_names_the_stage_each_defect_first_changes():
    check_stages_named("fa2_sm80")


# -- the case files -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(FA2_DIR.rglob("*.toml")), ids=lambda p: str(p.relative_to(FA2_DIR)))
def test_every_case_file_loads_with_a_launch_that_fits_the_kernel(path):
    check_case_file(path, "fa2", 128, lambda d: 3 * 64 * (d + 8) * 2)  # Q, K, V tiles with rows padded by 8

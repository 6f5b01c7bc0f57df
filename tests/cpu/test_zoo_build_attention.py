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

import re

import pytest
from cuda_tools import (assert_every_entry_traced_and_plain, assert_no_spills, assert_tracing_compiled_out,  # tests/ on sys.path
                        sass_by_function, zoo_builds_with_defects)
from zoo_cases import ROOT, attention_entry_case, entries

FA2_DIR = ROOT / "zoo" / "fa2_sm80"
FA2_SOURCE = FA2_DIR / "fa2_sm80.cu"
DEFECTS = ("kv_tail_not_zeroed", "causal_off_by_one", "max_not_updated_before_rescale", "l_summed_before_rescale",
           "p_wrong_type", "v_read_with_k_layout", "split_merge_without_max", "empty_row_divided_by_zero",
           "gqa_head_modulo", "page_table_off_by_one")
BUILT_DEFECTS = ("p_wrong_type", "v_read_with_k_layout")  # compiled here; the others only on the GPU
ENTRIES = {f"zoo_fa2_{kind}{dt}_d{d}" for kind in ("", "split_", "paged_", "combine_") for dt in ("bf16", "fp16")
           for d in (64, 128)}


def _defect_build(defect: str):
    from harness.build import build_cubin

    return build_cubin(FA2_SOURCE, defines={"ORACLE_TRACE": "1", f"ZOO_FA2_{defect.upper()}": "1"})


@pytest.fixture(scope="module")
def builds():
    return zoo_builds_with_defects(FA2_SOURCE, _defect_build, BUILT_DEFECTS)


def _fa2_entries() -> list[dict]:
    return entries("zoo/fa2_sm80/", kind="attention")


# -- builds ---------------------------------------------------------------------------------------
@pytest.mark.nvcc
def test_the_traced_build_holds_every_entry_point_traced_and_untraced(builds):
    assert_every_entry_traced_and_plain(builds, ENTRIES, {e["kernel"].partition(":")[2] for e in _fa2_entries()})


@pytest.mark.nvcc
def test_untraced_sass_is_the_same_with_tracing_compiled_in(builds):
    assert_tracing_compiled_out(builds, sorted(ENTRIES), sorted(ENTRIES))


@pytest.mark.nvcc
def test_no_untraced_function_spills_or_uses_a_stack(builds):
    assert_no_spills(builds["plain"])


@pytest.mark.nvcc
@pytest.mark.parametrize("defect", BUILT_DEFECTS)
def test_a_defect_define_changes_the_kernel_it_plants_the_defect_in(builds, defect):
    bad, good = sass_by_function(builds[defect].cubin_path), sass_by_function(builds["traced"].cubin_path)
    assert set(bad) == set(good)
    assert bad["zoo_fa2_bf16_d64"] != good["zoo_fa2_bf16_d64"]
    assert bad["zoo_fa2_combine_bf16_d64"] == good["zoo_fa2_combine_bf16_d64"]  # the combine has neither defect


# -- the manifest ---------------------------------------------------------------------------------
def test_the_manifest_holds_every_defect_of_the_source_once_and_the_correct_variants():
    text = FA2_SOURCE.read_text()
    macros = set(re.findall(r"#if defined\(ZOO_FA2_([A-Z0-9_]+)\)", text))
    assert macros == {d.upper() for d in DEFECTS}
    doc = _fa2_entries()
    assert sorted(e["defect"] for e in doc if e["defect"]) == sorted(DEFECTS)
    correct = {e["kernel"].partition(":")[2] for e in doc if e["defect"] is None}
    assert {"zoo_fa2_bf16_d64_traced", "zoo_fa2_fp16_d128_traced", "zoo_fa2_split_bf16_d64_traced",
            "zoo_fa2_paged_bf16_d64_traced"} <= correct
    for e in doc:
        assert e["dump_pending"] is True, f"{e['name']}: no recording yet; dump_pending says so"
        case = attention_entry_case(e)
        defines = dict(case.kernel.defines)
        if e["defect"] is None:
            assert e["expected_stage"] is None and not defines, e["name"]
        else:
            assert e["case"] == f"zoo/fa2_sm80/defects/{e['defect']}.toml", e["name"]
            assert defines == {f"ZOO_FA2_{e['defect'].upper()}": "1"}, (e["name"], defines)
        split = "_split_" in case.kernel.entry
        assert (case.spec.splits > 1) == split and (case.spec.paged == ("_paged_" in case.kernel.entry)), e["name"]


def test_the_manifest_names_the_stage_each_defect_first_changes():
    from oracle.run.attention_model import INJECTION_STAGE, Injection

    for e in _fa2_entries():
        if e["defect"] is not None:
            assert e["expected_stage"] == INJECTION_STAGE[Injection(e["defect"])], e["name"]


# -- the case files -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(FA2_DIR.rglob("*.toml")), ids=lambda p: str(p.relative_to(FA2_DIR)))
def test_every_case_file_loads_with_a_launch_that_fits_the_kernel(path):
    from oracle.run.case import load_case as load_attention_case

    case = load_attention_case(str(path))
    s = case.spec
    m = re.fullmatch(r"zoo_fa2_(split_|paged_)?(bf16|fp16)_d(64|128)_traced", case.kernel.entry)
    assert m, case.kernel.entry
    assert case.kernel.untraced_entry == case.kernel.entry.removesuffix("_traced")
    assert (m.group(2), int(m.group(3))) == (s.q_dtype, s.head_dim) and s.head_dim_v == s.head_dim
    assert (s.block_q, s.block_kv) == (64, 64)
    assert case.launch.block == (128, 1, 1)
    assert case.launch.shared_mem_bytes == 3 * 64 * (s.head_dim + 8) * 2
    if s.splits > 1:
        (combine,) = case.launch.next
        assert combine.entry == f"zoo_fa2_combine_{m.group(2)}_d{m.group(3)}_traced"
        assert [a.name for a in combine.args][:2] == ["o_partial", "lse_partial"]
    else:
        assert not case.launch.next

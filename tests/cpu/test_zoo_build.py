"""The bug zoo holds together without a GPU: its manifest, and the sm80 GEMM's builds and layouts.

- tests/zoo/manifest.json: every entry names a source, an entry point and a case that exist, a
  defect and the stage the oracle must name (the oracle's own stage names), problem overrides the
  case accepts, and where its recorded dump goes;
- (nvcc) every sm80 manifest entry point is in the cubin built with -DORACLE_TRACE, every variant
  is in the build without it, no function of either spills registers or uses a stack (ptxas -v),
  and the correct variants' untraced SASS does not change when ORACLE_TRACE is on (the split GEMMs'
  and the Hopper GEMM's builds: tests/cpu/test_zoo_build_split.py, tests/cpu/test_zoo_build_hopper.py,
  one file each so that --dist loadfile builds them side by side);
- (nvcc) the sm80 GEMM's index maps (zoo/sm80_gemm/sm80_layout.cuh), printed by a host program
  compiled from the same header, fed through a model of cp.async, ldmatrix and
  mma.sync.m16n8k16 written from the PTX ISA's fragment tables: every fragment map is a bijection
  onto its 16x16 / 16x8 tile, every warp computes its part of A_tile @ B_tile, the accumulator
  elements are tapped at the (row, col) where the MMA put them, and the load taps show what the
  MMAs read (also through ldmatrix .trans, the transposed_a defect).
"""
from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pytest
from cuda_tools import (assert_no_spills, assert_sink_only_traced, assert_tracing_compiled_out, entry_symbols,
                        require_nvcc, traced_entries)  # tests/ on sys.path

from harness.build import build_slot
from harness.taps import ALL_STAGES

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "zoo" / "manifest.json"
SM80_DIR = ROOT / "zoo" / "sm80_gemm"
SM80_SOURCE = SM80_DIR / "sm80_gemm.cu"
ZOO_SOURCE = SM80_SOURCE  # what the zoo_builds fixture (tests/conftest.py) builds
ENTRY_KEYS = {"name", "kernel", "case", "defect", "expected_stage", "problem", "dump"}
OPTIONAL_KEYS = {"seed", "note", "trace", "record_problem", "expected_group", "expected_partial", "expected_race",
                 "dump_pending", "expected_tile", "expected_k_block", "kind"}

# Every variant of the sm80 GEMM (the ZOO_SM80_* lists in sm80_gemm.cu): (dtype, defect).
SM80_VARIANTS = [("bf16", None), ("fp16", None)] + [("bf16", d) for d in (
    "stale_slot", "transposed_a", "unmasked_tail", "uninit_padding", "uninit_rows", "kblock_twice", "no_reset",
    "bias_row", "gelu_tanh", "alpha_twice", "swapped_store", "race_store")] + [("fp16", "fp16_acc")]


def _entry_name(dtype: str, defect) -> str:
    return f"zoo_sm80_{dtype}" + (f"_{defect}" if defect else "")


def _manifest() -> list[dict]:
    with open(MANIFEST) as f:
        return json.load(f)


# -- the manifest ---------------------------------------------------------------------------------
def test_manifest_is_well_formed():
    from oracle.run.case import load_case

    doc = _manifest()
    assert isinstance(doc, list) and doc, "the manifest is a non-empty JSON list of entries"
    names = [e.get("name") for e in doc]
    assert len(set(names)) == len(names), f"duplicate entry names: {sorted(n for n in names if names.count(n) > 1)}"
    for e in doc:
        where = f"manifest entry {e.get('name')!r}"
        assert ENTRY_KEYS <= set(e), f"{where} lacks {sorted(ENTRY_KEYS - set(e))}"
        unknown = set(e) - ENTRY_KEYS - OPTIONAL_KEYS
        assert not unknown, f"{where} has unknown keys {sorted(unknown)}"
        assert re.fullmatch(r"[a-z0-9_]+", e["name"]), where
        src, sep, fn = e["kernel"].partition(":")
        library = not sep  # a launch library: the case builds `src` and enters it through oracle_launch
        assert (ROOT / src).is_file(), f"{where}: {src} does not exist"
        assert library or fn.endswith("_traced"), f"{where}: a live run needs the traced entry point, got {fn}"
        assert (ROOT / e["case"]).is_file(), f"{where}: case {e['case']} does not exist"
        assert e["expected_stage"] is None or e["expected_stage"] in ALL_STAGES, \
            f"{where}: expected_stage {e['expected_stage']!r} is not one of {', '.join(ALL_STAGES)}"
        if e["defect"] is None:
            assert e["expected_stage"] is None, f"{where}: a correct variant must MATCH (expected_stage null)"
        elif Path(e["case"]).stem == e["defect"] or library:  # the case builds the bad map, workspace or variant
            assert "/defects/" in e["case"] and Path(e["case"]).stem.endswith(e["defect"]), \
                f"{where}: a defect chosen by its case lives under defects/ in a file named for it"
        else:
            assert f"_{e['defect']}_" in fn, f"{where}: entry point {fn} does not carry the defect {e['defect']!r}"
        if e["expected_stage"] is None and e["defect"] is not None:
            assert e.get("note"), f"{where}: a defect the oracle must not blame needs a note saying why"
        assert e.get("kind", "gemm") in ("gemm", "attention"), f"{where}: kind {e.get('kind')!r}"
        if e.get("kind") == "attention":  # an attention case (oracle.run.attention_case), its own stages
            from harness.taps import ATTENTION_STAGES
            from zoo_cases import attention_entry_case

            assert e["expected_stage"] is None or e["expected_stage"] in ATTENTION_STAGES, where
            for prob in [e["problem"]] + ([e["record_problem"]] if "record_problem" in e else []):
                assert attention_entry_case(e, prob).spec.kind == "attention", where
            continue
        assert isinstance(e["problem"], dict) and {"m", "n", "k"} <= set(e["problem"]), \
            f"{where}: problem overrides must give at least m, n and k"
        assert isinstance(e.get("seed", 0), int), where
        assert e.get("dump_pending", True) is True, f"{where}: dump_pending is true or absent"
        dump = Path(e["dump"])
        assert dump.parent == Path("tests/zoo/dumps") and dump.name == f"{e['name']}.safetensors.gz", \
            f"{where}: dump must be tests/zoo/dumps/{e['name']}.safetensors.gz, got {e['dump']}"
        if "expected_race" in e:  # a race: held to it by repeated runs (tests/gpu/test_races_gpu.py)
            race = e["expected_race"]
            assert set(race) == {"verdict", "within_runs"} and race["verdict"] == "NONDETERMINISTIC", where
            assert isinstance(race["within_runs"], int) and 2 <= race["within_runs"] <= 100, where
            assert e["expected_stage"] is None, f"{where}: a race names no stage"
        if "trace" in e:
            assert set(e["trace"]) <= {"tiles", "k_blocks"} and e["trace"]["tiles"], f"{where}: trace {e['trace']}"
        if "expected_tile" in e:
            assert isinstance(e["expected_tile"], list) and len(e["expected_tile"]) == 2, where
        entry = None if library else fn
        for prob in [e["problem"]] + ([e["record_problem"]] if "record_problem" in e else []):
            load_case(str(ROOT / e["case"]), prob, entry=entry, allow_library=True)  # a valid problem
        case = load_case(str(ROOT / e["case"]), e["problem"], entry=entry, allow_library=True)
        assert case.kernel is not None and case.launch is not None, where
        built = case.kernel.library if library else case.kernel.source
        assert built is not None and Path(built).resolve() == (ROOT / src).resolve(), \
            f"{where}: the case builds {built}, the manifest names {src}"


def test_manifest_covers_the_cutlass_host_route():
    """The host route (ORACLE_CUTLASS_HOST_ENTRY): a correct entry and one per planted host-code defect,
    each case building the host route with its own define, which the source plants."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_host_"): e for e in _manifest()
           if e["name"].startswith("cutlass_sm90_host_")}
    defects = {"alpha_beta_swapped", "k_rounded_down", "c_as_d", "wrong_ldb"}
    assert set(doc) == {"correct"} | defects, sorted(doc)
    text = (ROOT / "zoo" / "cutlass_sm90" / "cutlass_sm90.cu").read_text()
    assert "ORACLE_CUTLASS_HOST_ENTRY(zoo_cutlass::Gemm, zoo_cutlass::make_arguments)" in text
    for name, e in doc.items():
        defines = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True).kernel.defines
        planted = {d for d in defines if d.startswith("ZOO_CUTLASS_HOST_")}
        assert "ZOO_CUTLASS_HOST" in defines and "ZOO_CUTLASS_PINGPONG" not in defines, (name, defines)
        assert planted == (set() if name == "correct" else {f"ZOO_CUTLASS_HOST_{name.upper()}"}), (name, defines)
        for define in planted:
            assert f"#if defined({define})" in text, f"{define} is planted nowhere in cutlass_sm90.cu"
        assert e.get("dump_pending") is True or (ROOT / e["dump"]).is_file(), name
    assert {e["expected_stage"] for e in doc.values()} == {None, "epilogue_alpha_beta", "mma", "descriptor_b"}


def test_manifest_covers_the_cutlass_evt_epilogues():
    """The bias + GELU epilogue: CUTLASS's fusion (correct), the user's own tree (correct) and one entry per
    defect planted in that tree, each case building its own define, which the source plants, with no
    `epilogue` declared (the tree's order is read from the built library)."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_"): e for e in _manifest()
           if e["name"].startswith(("cutlass_sm90_evt_", "cutlass_sm90_bias_"))}
    want = {"bias_gelu_correct": None, "evt_correct": None, "evt_bias_row": "epilogue_bias",
            "evt_gelu_tanh": "epilogue_activation", "evt_beta_first": "epilogue_bias"}
    assert {n: e["expected_stage"] for n, e in doc.items()} == want, sorted(doc)
    text = (ROOT / "zoo" / "cutlass_sm90" / "cutlass_sm90.cu").read_text()
    for name, e in doc.items():
        case = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True)
        defines = case.kernel.defines
        planted = {d for d in defines if d.startswith("ZOO_CUTLASS_EVT_")}
        assert planted == (set() if e["defect"] is None else {f"ZOO_CUTLASS_{e['defect'].upper()}"}), (name, defines)
        assert ("ZOO_CUTLASS_EVT" in defines) == name.startswith("evt_"), (name, defines)
        for define in planted | {"ZOO_CUTLASS_BIAS_GELU"}:
            assert define in defines and f"defined({define})" in text, (name, define)
        assert (case.spec.bias, case.spec.activation, case.spec.epilogue) == ("col", "gelu_erf", None), name
        assert e.get("dump_pending") is True or (ROOT / e["dump"]).is_file(), name


def test_manifest_covers_the_cutlass_gemm_in_both_schedules():
    doc = [e for e in _manifest() if e["kernel"].startswith("zoo/cutlass_sm90/")]
    text = (ROOT / "zoo" / "cutlass_sm90" / "cutlass_sm90.cu").read_text()
    both = {"correct", "correct_ragged", "wrong_stride", "kblock_twice", "alpha_twice", "smem_a", "e4m3_correct"}
    for sched, extra in (("coop", {"e4m3_correct_ragged", "e4m3_smem_a"}), ("pingpong", set())):
        mine = {e["name"].removeprefix(f"cutlass_sm90_{sched}_"): e for e in doc
                if e["name"].startswith(f"cutlass_sm90_{sched}_")}
        assert set(mine) == both | extra, sorted(mine)
        for name in ("correct", "e4m3_correct"):
            assert mine[name]["problem"] == {"m": 4096, "n": 4096, "k": 4096}
        assert any(mine["correct_ragged"]["problem"][d] % 128 for d in ("m", "n"))
        for defect, e in mine.items():
            from oracle.run.case import load_case

            case = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True)
            defines = case.kernel.defines
            assert ("ZOO_CUTLASS_PINGPONG" in defines) == (sched == "pingpong"), (e["name"], defines)
            fp8 = "ZOO_CUTLASS_E4M3" in defines
            assert fp8 == defect.startswith("e4m3"), (e["name"], defines)
            assert (case.spec.a_dtype, case.spec.resolved_acc_model) == (("e4m3", "fp8_fast") if fp8 else ("bf16", "fp32"))
            if e["defect"] is not None:
                macro = f"ZOO_CUTLASS_{e['defect'].upper()}"
                assert set(defines) - {"ZOO_CUTLASS_PINGPONG", "ZOO_CUTLASS_E4M3"} == {macro} and macro in text, \
                    (e["name"], defines)
    quick = [e for e in doc if not e["name"].startswith(("cutlass_sm90_host_", "cutlass_sm90_evt_",
                                                         "cutlass_sm90_bias_", "cutlass_sm90_batched_", "cutlass_sm90_streamk_",
                                                         "cutlass_sm90_grouped_", "cutlass_sm90_blockwise_",
                                                         "cutlass_sm90_cluster_"))]  # their own tests
    assert {e["expected_stage"] for e in quick} == {None, "descriptor_a", "load_a", "mma", "epilogue_alpha_beta"}


def test_manifest_covers_cutlass_s_gemm_in_a_2x1_cluster():
    """The cooperative GEMM in a 2 x 1 cluster (ZOO_CUTLASS_CLUSTER_2X1, B multicast), as CUTLASS's examples
    48 and 49 write it: a correct entry recorded where the cluster pads an odd count of M tiles, and the
    planted k-block defect traced in the cluster whose second CTA lies past M."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_cluster_"): e for e in _manifest()
           if e["name"].startswith("cutlass_sm90_cluster_")}
    assert {n: e["expected_stage"] for n, e in doc.items()} == {"correct": None, "kblock_twice": "mma"}
    text = (ROOT / "zoo" / "cutlass_sm90" / "cutlass_sm90.cu").read_text()
    assert "defined(ZOO_CUTLASS_CLUSTER_2X1)" in text and "Shape<_2, _1, _1>" in text
    for name, e in doc.items():
        problem = e.get("record_problem") or e["problem"]
        case = load_case(str(ROOT / e["case"]), problem, allow_library=True)
        planted = {"ZOO_CUTLASS_KBLOCK_TWICE"} if e["defect"] else set()
        assert set(case.kernel.defines) == {"ZOO_CUTLASS_CLUSTER_2X1"} | planted, (name, case.kernel.defines)
        assert case.spec.tiles_m % 2 == 1, name  # the cluster pads M's tiles: its last CTA has no tile of the problem
        assert all(tm < case.spec.tiles_m and tn < case.spec.tiles_n for tm, tn in e["trace"]["tiles"]), name
        assert e.get("dump_pending") is True or (ROOT / e["dump"]).is_file(), name


def test_manifest_covers_the_cutlass_batched_gemm():
    """The strided batched GEMM (zoo/cutlass_sm90/batched.cu): correct through both routes, a planted host-code
    defect and a traced-mainloop one, each case setting the define its source plants, found in entry 1."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_batched_"): e for e in _manifest()
           if e["kernel"] == "zoo/cutlass_sm90/batched.cu"}
    want = {"correct": None, "host_correct": None, "host_b_stride_of_a": "descriptor_b", "entry1_kblock_twice": "mma"}
    assert {n: e["expected_stage"] for n, e in doc.items()} == want, sorted(doc)
    text = (ROOT / "zoo" / "cutlass_sm90" / "batched.cu").read_text()
    for name, e in doc.items():
        case = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True)
        assert case.spec.batch > 1 and case.spec.m < case.spec.n, name  # M < N: the wrong stride reads inside B
        defines = case.kernel.defines
        assert ("ZOO_BATCHED_HOST" in defines) == name.startswith("host_"), (name, defines)
        planted = set(defines) - {"ZOO_BATCHED_HOST"}
        assert planted == (set() if e["defect"] is None else {f"ZOO_{e['defect'].upper()}"}), (name, defines)
        for define in planted:
            assert f"defined({define})" in text, f"{define} is planted nowhere in batched.cu"
        if e["defect"] is not None:
            assert e["expected_group"] == 1, name



def test_manifest_covers_the_cutlass_grouped_gemm():
    """The grouped GEMM (zoo/cutlass_sm90/grouped.cu): correct through both routes, three planted host-code
    defects, and in the ping-pong schedule (ZOO_GROUPED_PINGPONG) and the 2 x 1 cluster
    (ZOO_GROUPED_CLUSTER_2X1) a correct entry and one of those defects each, each case setting the define its
    source plants, found in the group the manifest names."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_grouped_"): e for e in _manifest()
           if e["kernel"] == "zoo/cutlass_sm90/grouped.cu"}
    want = {"correct": None, "host_correct": None, "host_b_of_group0": "descriptor_b",
            "host_a_of_group0": "descriptor_a", "host_alpha_twice_group1": "epilogue_alpha_beta",
            "pingpong_correct": None, "pingpong_host_a_of_group0": "descriptor_a",
            "cluster_correct": None, "cluster_host_a_of_group0": "descriptor_a"}
    assert {n: e["expected_stage"] for n, e in doc.items()} == want, sorted(doc)
    text = (ROOT / "zoo" / "cutlass_sm90" / "grouped.cu").read_text()
    schedules = {"pingpong_": "ZOO_GROUPED_PINGPONG", "cluster_": "ZOO_GROUPED_CLUSTER_2X1"}
    for name, e in doc.items():
        case = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True)
        assert case.spec.groups is not None and 0 in case.spec.groups, name
        defines = case.kernel.defines
        for prefix, define in schedules.items():
            assert (define in defines) == name.startswith(prefix), (name, defines)
        route = name.removeprefix("pingpong_").removeprefix("cluster_")
        assert ("ZOO_GROUPED_HOST" in defines) == route.startswith("host_"), (name, defines)
        planted = set(defines) - {"ZOO_GROUPED_HOST", *schedules.values()}
        assert planted == (set() if e["defect"] is None else {f"ZOO_{e['defect'].upper()}"}), (name, defines)
        for define in planted:
            assert f"defined({define})" in text, f"{define} is planted nowhere in grouped.cu"
        assert e.get("dump_pending") is True or (ROOT / e["dump"]).is_file(), name


def test_manifest_covers_cutlass_s_stream_k_scheduler():
    """CUTLASS's stream-K scheduler (ZOO_CUTLASS_STREAMK): split-K, stream-K and data-parallel correct entries
    and the planted fixup defect, each case building the stream-K kernel, split where the entry says."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_streamk_"): e for e in _manifest()
           if e["name"].startswith("cutlass_sm90_streamk_")}
    want = {"splitk_correct": None, "correct": None, "dp_correct": None, "partial_twice": "reduce"}
    assert {n: e["expected_stage"] for n, e in doc.items()} == want, sorted(doc)
    text = (ROOT / "zoo" / "cutlass_sm90" / "cutlass_sm90.cu").read_text()
    for name, e in doc.items():
        case = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True)
        defines = case.kernel.defines
        planted = set(defines) - {"ZOO_CUTLASS_STREAMK"}
        assert "ZOO_CUTLASS_STREAMK" in defines and "ZOO_CUTLASS_PINGPONG" not in defines, (name, defines)
        assert planted == (set() if e["defect"] is None else {"ZOO_CUTLASS_FIXUP_PARTIAL_TWICE"}), (name, defines)
        for define in planted | {"ZOO_CUTLASS_STREAMK"}:
            assert f"defined({define})" in text, (name, define)
        split = {"splitk_correct": (3, None), "dp_correct": (1, None)}.get(name, (1, 2))
        assert (case.spec.splits, case.spec.stream_k_workers) == split, name
        assert e.get("dump_pending") is True or (ROOT / e["dump"]).is_file(), name


def test_manifest_covers_cutlass_s_blockwise_scaled_gemm():
    """CUTLASS's blockwise-scaled fp8 GEMM (zoo/cutlass_sm90/blockwise.cu): a ragged correct entry and the two
    planted scale defects, each case setting the define its source plants, block-scaled as CUTLASS's example 67
    (A 1 x 128 M-major, B 128 x 128 K-major), promoted every k-block, pending its recording."""
    from oracle.run.case import load_case

    doc = {e["name"].removeprefix("cutlass_sm90_blockwise_"): e for e in _manifest()
           if e["kernel"] == "zoo/cutlass_sm90/blockwise.cu"}
    want = {"correct_ragged": None, "scale_b_hoisted": "scale_b", "scale_a_group_rows": "scale_a"}
    assert {n: e["expected_stage"] for n, e in doc.items()} == want, sorted(doc)
    text = (ROOT / "zoo" / "cutlass_sm90" / "blockwise.cu").read_text()
    assert "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise" in text
    assert "ScaleConfig::deduce_layoutSFA()" in text and "ORACLE_CUTLASS_ENTRY(zoo_blockwise::Gemm)" in text
    for name, e in doc.items():
        case = load_case(str(ROOT / e["case"]), e["problem"], allow_library=True)
        s = case.spec
        assert (s.scale_a.block, s.scale_a.major, s.scale_b.block, s.scale_b.major) == ((1, 128), "col", (128, 128), "row")
        assert (s.resolved_acc_model, s.promotion_interval, s.tile.bk) == ("fp8_promoted", 128, 128), name
        planted = set(case.kernel.defines)
        assert planted == (set() if e["defect"] is None else {f"ZOO_{e['defect'].upper()}"}), (name, planted)
        for define in planted:
            assert f"defined({define})" in text, f"{define} is planted nowhere in blockwise.cu"
        if e["defect"] is not None:
            assert "expected_tile" in e and "expected_k_block" in e, name
        assert e.get("dump_pending") is True or (ROOT / e["dump"]).is_file(), name
    ragged = doc["correct_ragged"]["problem"]
    assert all(ragged[d] % 128 for d in ("m", "n", "k")), ragged


def test_manifest_covers_every_sm80_defect_once_and_the_correct_variants():
    doc = [e for e in _manifest() if e["kernel"].startswith("zoo/sm80_gemm/")]
    fns = {e["kernel"].partition(":")[2] for e in doc}
    assert fns == {_entry_name(d, x) + "_traced" for d, x in SM80_VARIANTS}
    defects = [e["defect"] for e in doc if e["defect"] is not None]
    assert sorted(defects) == sorted(x for _, x in SM80_VARIANTS if x), defects
    small = [e for e in doc if e["defect"] is None and e["problem"]["m"] <= 16]
    assert small, "a correct small-batch run (m <= 16: rows past M are padding in a 128-row tile) is missing"


def test_sm80_case_launch_matches_the_kernel():
    with open(SM80_DIR / "sm80_gemm.toml", "rb") as f:
        doc = tomllib.load(f)
    text = SM80_SOURCE.read_text()
    assert doc["launch"]["block"] == [256, 1, 1]
    assert doc["launch"]["shared_mem_bytes"] == 65536
    assert "65536 bytes" in text and "block (256, 1, 1)" in text
    assert doc["problem"]["tile"] == [128, 128, 32] and doc["problem"]["b_major"] == "col"


# -- builds ---------------------------------------------------------------------------------------
@pytest.mark.nvcc
def test_every_manifest_entry_point_is_in_the_traced_cubin(zoo_builds):
    syms = traced_entries(zoo_builds, "sm80_gemm")
    expected = {_entry_name(d, x) + "_traced" for d, x in SM80_VARIANTS} | {"zoo_sm80_bf16", "zoo_sm80_fp16"}
    assert syms == expected, f"unexpected entry points {sorted(syms ^ expected)}"
    assert_sink_only_traced(zoo_builds)


@pytest.mark.nvcc
def test_the_untraced_build_has_every_variant_and_no_sink(zoo_builds):
    syms = entry_symbols(zoo_builds["plain"].cubin_path)
    assert syms == {_entry_name(d, x) for d, x in SM80_VARIANTS}
    assert_sink_only_traced(zoo_builds)


@pytest.mark.nvcc
@pytest.mark.parametrize("build", ["traced", "plain"])
def test_no_function_spills_or_uses_a_stack(zoo_builds, build):
    assert_no_spills(zoo_builds[build])


@pytest.mark.nvcc
def test_untraced_correct_variants_are_the_same_with_tracing_compiled_in(zoo_builds):
    correct = ("zoo_sm80_bf16", "zoo_sm80_fp16")
    assert_tracing_compiled_out(zoo_builds, correct, correct)


# -- the layouts, through a model of the PTX instructions -------------------------------------------
PROBE = r'''
#include <cstdio>
#include "sm80_layout.cuh"
using namespace zoo_sm80;

static void list_begin(const char* name, bool* first) {
  std::printf("%s\"%s\": [", *first ? "" : ",\n", name);
  *first = false;
}

int main() {
  bool first = true;
  std::printf("{");
  std::printf("\"consts\": {\"BM\": %d, \"BN\": %d, \"BK\": %d, \"stages\": %d, \"warps\": %d, \"threads\": %d, "
              "\"frags_m\": %d, \"frags_n\": %d, \"ksteps\": %d, \"acc\": %d, \"copies_a\": %d, \"copies_b\": %d, "
              "\"smem_bytes\": %d, \"stage_elems\": %d, \"tile_a_elems\": %d}",
              kBM, kBN, kBK, kStages, kWarps, kThreads, kFragsM, kFragsN, kKSteps, kAcc, kCopiesA, kCopiesB,
              kSmemBytes, kStageElems, kTileAElems);
  first = false;
  list_begin("smem", &first);
  for (int r = 0; r < kBM; ++r)
    for (int c = 0; c < kBK; ++c) std::printf("%s%d", r + c ? "," : "", smem_offset(r, c));
  std::printf("]");
  list_begin("smem_t8", &first);
  for (int r = 0; r < kBM; ++r)
    for (int c = 0; c < kBK; ++c) std::printf("%s%d", r + c ? "," : "", smem_offset_t8(r, c));
  std::printf("]");
  list_begin("a_ldm", &first);  // [warp][ks][mi][lane] -> [row, col]
  for (int w = 0; w < kWarps; ++w) for (int ks = 0; ks < kKSteps; ++ks) for (int mi = 0; mi < kFragsM; ++mi)
    for (int l = 0; l < 32; ++l)
      std::printf("%s[%d,%d]", (w + ks + mi + l) ? "," : "", a_ldm_row(w, l, mi), a_ldm_col(l, ks));
  std::printf("]");
  list_begin("b_ldm", &first);  // [warp][ks][p][lane] -> [n, k]
  for (int w = 0; w < kWarps; ++w) for (int ks = 0; ks < kKSteps; ++ks) for (int p = 0; p < kFragsN / 2; ++p)
    for (int l = 0; l < 32; ++l)
      std::printf("%s[%d,%d]", (w + ks + p + l) ? "," : "", b_ldm_row(w, l, p), b_ldm_col(l, ks));
  std::printf("]");
  list_begin("acc", &first);  // [warp][lane][i] -> [row, col]
  for (int w = 0; w < kWarps; ++w) for (int l = 0; l < 32; ++l) for (int i = 0; i < kAcc; ++i)
    std::printf("%s[%d,%d]", (w + l + i) ? "," : "", acc_row(w, l, i), acc_col(w, l, i));
  std::printf("]");
  list_begin("copy", &first);  // [tid][j] -> [row, chunk], j < max(copies)
  const int copies = kCopiesA > kCopiesB ? kCopiesA : kCopiesB;
  for (int t = 0; t < kThreads; ++t) for (int j = 0; j < copies; ++j)
    std::printf("%s[%d,%d]", (t + j) ? "," : "", copy_row(t, j), copy_chunk(t, j));
  std::printf("]}\n");
  return 0;
}
'''


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> dict:
    require_nvcc()
    tmp = tmp_path_factory.mktemp("sm80_probe")
    src, exe = tmp / "probe.cu", tmp / "probe"
    src.write_text(PROBE)
    cmd = ["nvcc", "-std=c++17", f"-I{SM80_DIR}", "-o", str(exe), str(src)]
    with build_slot():
        proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"nvcc failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    c = doc["consts"]
    doc["smem"] = np.array(doc["smem"]).reshape(c["BM"], c["BK"])
    doc["smem_t8"] = np.array(doc["smem_t8"]).reshape(c["BM"], c["BK"])
    doc["a_ldm"] = np.array(doc["a_ldm"]).reshape(c["warps"], c["ksteps"], c["frags_m"], 32, 2)
    doc["b_ldm"] = np.array(doc["b_ldm"]).reshape(c["warps"], c["ksteps"], c["frags_n"] // 2, 32, 2)
    doc["acc"] = np.array(doc["acc"]).reshape(c["warps"], 32, c["acc"], 2)
    doc["copy"] = np.array(doc["copy"]).reshape(c["threads"], -1, 2)
    return doc


# The PTX model. Registers are lists of 32-bit words, each a pair (lower half, upper half) of
# 16-bit elements; a fragment element index i lives in register i // 2, half i % 2.
def ldmatrix_x4(smem: np.ndarray, row_offsets: list[int], trans: bool) -> list[list[tuple]]:
    """ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lanes 8j..8j+7 address the rows of matrix j
    (eight consecutive elements each); register j of lane l gets row l // 4, elements 2(l % 4) and
    2(l % 4) + 1 of matrix j (with .trans: column l // 4, rows 2(l % 4) and 2(l % 4) + 1)."""
    mats = [np.stack([smem[row_offsets[8 * j + i]:row_offsets[8 * j + i] + 8] for i in range(8)]) for j in range(4)]
    regs = []
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if trans:
            regs.append([(m[2 * t, g], m[2 * t + 1, g]) for m in mats])
        else:
            regs.append([(m[g, 2 * t], m[g, 2 * t + 1]) for m in mats])
    return regs


def a_frag_pos(lane: int, i: int) -> tuple[int, int]:
    """m16n8k16 A (.f16/.bf16) element a_i of a lane: PTX ISA, matrix fragments for mma.m16n8k16."""
    g, t = lane >> 2, lane % 4
    row = g if (0 <= i < 2 or 4 <= i < 6) else g + 8
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_frag_pos(lane: int, i: int) -> tuple[int, int]:
    """m16n8k16 B element b_i: (k, n)."""
    g, t = lane >> 2, lane % 4
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def c_frag_pos(lane: int, i: int) -> tuple[int, int]:
    """m16n8k16 C/D element c_i: (row, col)."""
    g, t = lane >> 2, lane % 4
    return g + (8 if i >= 2 else 0), t * 2 + (i & 1)


def _gather(regs, pos, shape) -> np.ndarray:
    """A warp's fragment registers -> the matrix they hold; each position exactly once."""
    out = np.full(shape, np.nan)
    seen = np.zeros(shape, dtype=int)
    for lane in range(32):
        for i in range(2 * len(regs[lane])):
            r, c = pos(lane, i)
            out[r, c] = regs[lane][i // 2][i % 2]
            seen[r, c] += 1
    assert (seen == 1).all(), "a fragment map is not a bijection onto its tile"
    return out


def test_ptx_fragment_maps_are_bijections():
    for pos, shape, n in ((a_frag_pos, (16, 16), 8), (b_frag_pos, (16, 8), 4), (c_frag_pos, (16, 8), 4)):
        cells = {pos(lane, i) for lane in range(32) for i in range(n)}
        assert len(cells) == 32 * n == shape[0] * shape[1]
        assert all(0 <= r < shape[0] and 0 <= c < shape[1] for r, c in cells)


def _cta_product(lay: dict, smem_a: np.ndarray, smem_b: np.ndarray, trans_a: bool) -> np.ndarray:
    """Run every warp of the CTA through the model; return the [BM, BN] tile the accumulators
    form when each element is placed at the kernel's acc_row / acc_col."""
    c = lay["consts"]
    tile = np.full((c["BM"], c["BN"]), np.nan)
    for w in range(c["warps"]):
        acc = np.zeros((32, c["acc"]))
        for ks in range(c["ksteps"]):
            a_frags = []
            for mi in range(c["frags_m"]):
                offs = [int(lay["smem"][r, k]) for r, k in lay["a_ldm"][w, ks, mi]]
                a_frags.append(_gather(ldmatrix_x4(smem_a, offs, trans_a), a_frag_pos, (16, 16)))
            b_frags = []
            for p in range(c["frags_n"] // 2):
                offs = [int(lay["smem"][n, k]) for n, k in lay["b_ldm"][w, ks, p]]
                regs = ldmatrix_x4(smem_b, offs, False)
                b_frags.append(_gather([r[0:2] for r in regs], b_frag_pos, (16, 8)))
                b_frags.append(_gather([r[2:4] for r in regs], b_frag_pos, (16, 8)))
            for mi in range(c["frags_m"]):
                for ni in range(c["frags_n"]):
                    d = a_frags[mi] @ b_frags[ni]
                    for lane in range(32):
                        for e in range(4):
                            acc[lane, (mi * c["frags_n"] + ni) * 4 + e] += d[c_frag_pos(lane, e)]
        for lane in range(32):
            for i in range(c["acc"]):
                r, col = lay["acc"][w, lane, i]
                assert np.isnan(tile[r, col]), "two accumulator elements claim one tile element"
                tile[r, col] = acc[lane, i]
    assert not np.isnan(tile).any(), "tile elements no accumulator element covers"
    return tile


def _slot_images(lay: dict, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random integer A [BM, BK] and B^T [BN, BK] tiles, copied into slot images the way the
    kernel's copies place them (chunk by chunk, each chunk contiguous)."""
    c = lay["consts"]
    a = rng.integers(-8, 9, size=(c["BM"], c["BK"])).astype(np.float64)
    bt = rng.integers(-8, 9, size=(c["BN"], c["BK"])).astype(np.float64)
    images = []
    for src, copies in ((a, c["copies_a"]), (bt, c["copies_b"])):
        img = np.full(src.shape[0] * c["BK"], np.nan)
        for t in range(c["threads"]):
            for j in range(copies):
                r, ch = lay["copy"][t, j]
                dst = int(lay["smem"][r, 8 * ch])
                assert [int(lay["smem"][r, 8 * ch + e]) for e in range(8)] == list(range(dst, dst + 8)), \
                    "a 16-byte chunk is not contiguous in shared memory"
                assert np.isnan(img[dst:dst + 8]).all(), "two copies write one chunk"
                img[dst:dst + 8] = src[r, 8 * ch:8 * ch + 8]
        assert not np.isnan(img).any(), "the copies leave part of the slot unwritten"
        images.append(img)
    return a, bt, images[0], images[1]


@pytest.mark.nvcc
def test_layout_constants(layout):
    c = layout["consts"]
    assert (c["BM"], c["BN"], c["BK"]) == (128, 128, 32)
    assert c["smem_bytes"] == c["stages"] * c["stage_elems"] * 2 == 65536
    assert c["threads"] == 256 and c["acc"] * c["threads"] == c["BM"] * c["BN"]


@pytest.mark.nvcc
def test_every_warp_computes_its_part_of_the_tile_product(layout):
    rng = np.random.default_rng(7)
    a, bt, smem_a, smem_b = _slot_images(layout, rng)
    # what the load taps record: the logical tiles read back through the kernel's tap layouts
    tap_a = smem_a[layout["smem"]]
    tap_b = smem_b[layout["smem"]].T  # B tap is (k, n) = slot[smem_offset(n, k)]
    assert (tap_a == a).all() and (tap_b == bt.T).all()
    tile = _cta_product(layout, smem_a, smem_b, trans_a=False)
    assert (tile == a @ bt.T).all()  # integers: exact


@pytest.mark.nvcc
def test_transposed_a_tap_shows_what_ldmatrix_trans_feeds_the_mma(layout):
    rng = np.random.default_rng(8)
    a, bt, smem_a, smem_b = _slot_images(layout, rng)
    tap_a = smem_a[layout["smem_t8"]]  # the defect's load_a tap layout
    blocks = a.reshape(16, 8, 4, 8).transpose(0, 3, 2, 1).reshape(128, 32)  # every 8x8 block transposed
    assert (tap_a == blocks).all()
    assert not (tap_a == a).all()
    tile = _cta_product(layout, smem_a, smem_b, trans_a=True)
    assert (tile == tap_a @ bt.T).all()  # the mma stage fed from this tap matches exactly
    assert not (tile == a @ bt.T).all()

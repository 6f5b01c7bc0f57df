"""The zoo's OCP MXFP8 GEMM (zoo/mx_sm80/) holds together without a GPU.

- the manifest plants each of the six scale bugs of oracle/run/scale_model.py once, by its define
  ZOO_MX_<NAME>, each at scale_a or scale_b with its tile and k-block, beside correct runs (plain and
  split-K), each with its recording committed and judged offline in the "rest" shard;
- every case file loads, passes the launch checks and describes the kernel's launch: 64 x 64 x 64
  tiles, 128 threads, ue8m0 scales over 1 x 32 K blocks, the entry point's arguments;
- (nvcc) the traced build has every manifest entry point, the plain build the production ones, which
  do not spill, whose SASS does not change when ORACLE_TRACE is on, and whose static shared memory is
  the header's; every defect's define changes the production code it is planted in, and only that
  (slice 0's scales are a split-K bug: the plain entry compiles the same).
The judgements themselves are held to a model of the kernel in tests/zoo/test_mx_model.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cuda_tools import (assert_no_spills, assert_sink_only_traced, assert_tracing_compiled_out, entry_symbols,
                        require_nvcc, sass_by_function, traced_entries, zoo_builds_with_defects)  # tests/ on sys.path
from zoo_cases import ROOT, dump_shard, entries, entry_case, tapped_stages

ZOO_SOURCE = ROOT / "zoo" / "mx_sm80" / "mx_sm80.cu"
PRODUCTION = ["zoo_mx_e4m3", "zoo_mx_e4m3_splitk"]
SPLIT_ONLY = {"scale_split_slice0"}  # defects that can act only where K is split


def _entries() -> list[dict]:
    return entries("zoo/mx_sm80/")


def _define(defect: str) -> str:
    return f"ZOO_MX_{defect.upper()}"


def test_manifest_plants_every_scale_bug_of_the_model_once():
    from oracle.run.scale_model import SCALE_DEFECTS

    doc = _entries()
    planted = [e["defect"] for e in doc if e["defect"] is not None]
    assert sorted(planted) == sorted(SCALE_DEFECTS) == sorted(DEFECTS)
    for e in doc:
        assert (ROOT / e["dump"]).is_file() and not e.get("dump_pending"), f"{e['name']}: its recording is committed"
        assert dump_shard(e) == "rest", e["name"]  # judged offline by tests/cpu/test_zoo_dumps.py
        case = entry_case(e)
        assert tapped_stages(case) == {"load_a", "load_b", "scale_a", "scale_b", "mma", "epilogue_alpha_beta",
                                       "epilogue_cast"} | ({"reduce"} if case.spec.splits > 1 else set()), e["name"]
        if e["defect"] is None:
            continue
        assert e["expected_stage"] == ("scale_b" if e["defect"] == "scale_b_reused" else "scale_a"), e["name"]
        assert "expected_k_block" in e and "expected_tile" in e, e["name"]
        assert [list(t) for t in case.trace.tiles] == [e["expected_tile"]], e["name"]
        assert case.kernel.defines == {_define(e["defect"]): "1"}, (e["name"], case.kernel.defines)
        assert Path(e["case"]).parent.name == "defects" and Path(e["case"]).stem == e["defect"], e["name"]
        assert f"#ifndef {_define(e['defect'])}" in ZOO_SOURCE.read_text(), e["defect"]
        assert case.spec.splits > 1 if e["defect"] in SPLIT_ONLY else case.spec.splits == 1, e["name"]
        assert e.get("expected_partial") == (1 if e["defect"] in SPLIT_ONLY else None), e["name"]
    correct = {entry_case(e).kernel.entry for e in doc if e["defect"] is None}
    assert correct == {f"{n}_traced" for n in PRODUCTION}


@pytest.mark.parametrize("path", sorted((ROOT / "zoo" / "mx_sm80").rglob("*.toml")), ids=lambda p: p.stem)
def test_case_file_loads_and_passes_the_launch_checks(path):
    from oracle.run.case import load_case
    from oracle.run.sink import check_case

    c = load_case(str(path))
    check_case(c)
    t, text = c.spec.tile, ZOO_SOURCE.read_text()
    assert (t.bm, t.bn, t.bk) == (64, 64, 64) and "kBM = 64, kBN = 64, kBK = 64, kGroup = 32" in text
    assert c.launch.block == (128, 1, 1) and "kThreads = 128" in text
    for s in (c.spec.scale_a, c.spec.scale_b):  # OCP MX: one ue8m0 byte per 1 x 32 block along K, [rows, K / 32]
        assert (s.kind, s.block, s.dtype, s.major) == ("block", (1, 32), "e8m0", "row")
    assert c.spec.a_dtype == c.spec.b_dtype == "e4m3" and (c.spec.a_major, c.spec.b_major) == ("row", "col")
    assert c.spec.k % 16 == 0  # lda = ldb = K: whole 16-byte cp.async chunks
    split = c.spec.splits > 1
    assert c.kernel.entry == ("zoo_mx_e4m3_splitk_traced" if split else "zoo_mx_e4m3_traced")
    assert len(c.launch.args) == (14 if split else 12)  # the entry point's parameters (mx_sm80.cu's header)
    assert c.launch.shared_mem_bytes == 0  # static shared memory only


# -- the builds -----------------------------------------------------------------------------------
DEFECTS = ["scale_b_reused", "scale_split_slice0", "scale_raw_block_index", "scale_trailing_skipped",
           "scale_one_per_k_block", "scale_map_group_size"]


def _defect_build(defect: str):
    from harness.build import build_cubin

    return build_cubin(ZOO_SOURCE, defines={_define(defect): "1"}, extra_flags=("--ptxas-options=-v",))


@pytest.fixture(scope="module")
def mx_builds():
    require_nvcc()
    return zoo_builds_with_defects(ZOO_SOURCE, _defect_build, DEFECTS)  # about a second a build


@pytest.mark.nvcc
def test_entry_points_traced_and_plain(mx_builds):
    traced = traced_entries(mx_builds, "mx_sm80")
    assert traced == {f"{n}_traced" for n in PRODUCTION} | set(PRODUCTION)
    assert entry_symbols(mx_builds["plain"].cubin_path) == set(PRODUCTION)
    assert_sink_only_traced(mx_builds)


@pytest.mark.nvcc
def test_production_entries_do_not_spill_and_use_the_header_s_shared_memory(mx_builds):
    for name in ["plain", "traced"] + DEFECTS:
        assert_no_spills(mx_builds[name])
    smem = {int(x) for x in re.findall(r"(\d+) bytes smem", mx_builds["plain"].log)}
    assert len(smem) == 1, mx_builds["plain"].log[-2000:]
    assert f"static shared memory only ({smem.pop()} bytes)" in ZOO_SOURCE.read_text()


@pytest.mark.nvcc
def test_untraced_sass_is_the_same_with_tracing_compiled_in(mx_builds):
    assert_tracing_compiled_out(mx_builds, PRODUCTION, PRODUCTION)


@pytest.mark.nvcc
@pytest.mark.parametrize("defect", DEFECTS)
def test_a_defect_define_changes_the_code_it_is_planted_in(mx_builds, defect):
    plain, planted = sass_by_function(mx_builds["plain"].cubin_path), sass_by_function(mx_builds[defect].cubin_path)
    assert set(planted) == set(PRODUCTION)
    for name in PRODUCTION:
        acts = defect not in SPLIT_ONLY or name.endswith("_splitk")
        assert (planted[name] != plain[name]) == acts, (name, "changed" if not acts else "unchanged")

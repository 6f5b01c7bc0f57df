"""The zoo's DeepGEMM-style fp8 1d2d GEMM (zoo/deepgemm_sm90/) holds together without a GPU.

- the manifest plants each of the six scale bugs of oracle/run/scale_model.py once, by its define
  ZOO_DG_<NAME>, each at scale_a or scale_b, beside correct runs (plain, two groups per k-block,
  split-K); every case file loads and passes the launch checks;
- each entry's expected judgement holds for the CPU model of the same kernel (scale_model, whose
  defects carry the same names and whose launch order is the kernel's) at the entry's shape, traced
  tiles and inputs: the manifest asks of the kernel what the oracle says of the model;
- (nvcc) the traced build has every manifest entry point, the plain build the production ones, which
  do not spill and whose SASS does not change when ORACLE_TRACE is on; a defect's define changes the
  production code it is planted in. One defect is built (a build takes seconds, but the machine is
  shared); the others differ only in which scale index they compute.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cuda_tools import (assert_no_spills, assert_sink_only_traced, assert_tracing_compiled_out, entry_symbols,
                        require_nvcc, sass_by_function, traced_entries)  # tests/ on sys.path
from zoo_cases import ROOT, check_judgement, entries, entry_case

ZOO_SOURCE = ROOT / "zoo" / "deepgemm_sm90" / "deepgemm_sm90.cu"
PRODUCTION = ["zoo_dg_e4m3", "zoo_dg_e4m3_g64", "zoo_dg_e4m3_splitk"]


def _entries() -> list[dict]:
    return entries("zoo/deepgemm_sm90/")


def test_manifest_plants_every_scale_bug_of_the_model_once():
    from oracle.run.scale_model import SCALE_DEFECTS

    doc = _entries()
    planted = [e["defect"] for e in doc if e["defect"] is not None]
    assert sorted(planted) == sorted(SCALE_DEFECTS)
    for e in doc:
        assert (ROOT / e["dump"]).is_file() and not e.get("dump_pending"), f"{e['name']}: its recording is committed"
        if e["defect"] is None:
            continue
        assert e["expected_stage"] == ("scale_b" if e["defect"] == "scale_b_reused" else "scale_a"), e["name"]
        assert "expected_k_block" in e and "expected_tile" in e, e["name"]
        case = entry_case(e)
        assert case.kernel.defines == {f"ZOO_DG_{e['defect'].upper()}": "1"}, (e["name"], case.kernel.defines)
        assert Path(e["case"]).parent.name == "defects" and Path(e["case"]).stem == e["defect"], e["name"]
        assert f"ZOO_DG_{e['defect'].upper()}" in ZOO_SOURCE.read_text(), e["defect"]
    correct = {entry_case(e).kernel.entry for e in doc if e["defect"] is None}
    assert correct == {f"{n}_traced" for n in PRODUCTION}


@pytest.mark.parametrize("path", sorted((ROOT / "zoo" / "deepgemm_sm90").rglob("*.toml")), ids=lambda p: p.stem)
def test_case_file_loads_and_passes_the_launch_checks(path):
    from oracle.run.case import load_case
    from oracle.run.sink import check_case

    c = load_case(str(path))
    check_case(c)
    t = c.spec.tile
    assert (t.bm, t.bn, t.bk) == (64, 128, 128) and c.launch.block == (256, 1, 1)
    assert c.spec.scale_a.kind == c.spec.scale_b.kind == "block" and c.spec.scale_a.major == "col"
    assert c.spec.scale_b.block[0] == t.bn and c.spec.scale_a.block[1] == c.spec.scale_b.block[1]
    text = ZOO_SOURCE.read_text()
    tx = (t.bm + t.bn) * 128  # one k-block's two boxes
    assert c.launch.args[10].expr == tx and f"= {tx}" in text
    # sizeof(SharedStorage): 4 slots of (BM + BN) rows of 128 bytes, B's scale words, barriers and the
    # split flag, rounded up to the 1 KiB alignment; plus 1 KiB to align the dynamic shared memory base
    storage = -(-(4 * (t.bm + t.bn) * 128 + 4 * 2 * 4 + 64 + 4) // 1024) * 1024
    assert c.launch.shared_mem_bytes == storage + 1024 and f"= {storage + 1024} bytes" in text
    assert c.kernel.entry.endswith("_splitk_traced") == (c.spec.splits > 1)


def _model_analysis(entry: dict):
    """The model of the kernel on the entry's case, inputs and traced tiles, judged."""
    from oracle.judging.differential import analyze
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.scale_model import ScaleInjection, simulate_scaled

    case = entry_case(entry)
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    rec = simulate_scaled(case.spec, ops, Provenance("random", seed),
                          ScaleInjection(entry["defect"]) if entry["defect"] else None)
    tiles = set(case.trace.tiles)
    return case, analyze(replace(rec, taps=tuple(t for t in rec.taps if t.tile in tiles)))


@pytest.mark.slow
@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_the_model_of_the_kernel_is_judged_as_the_manifest_says(entry):
    from oracle.judging.compare import Status
    from oracle.judging.diagnose import Verdict

    case, an = _model_analysis(entry)
    if entry["expected_stage"] is not None:
        check_judgement(entry["expected_stage"], case, an, entry)
        return
    # the model taps the main loop (and reduce), not the epilogue's steps: each of those must MATCH
    assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, an.first)
    model = {"load_a", "load_b", "scale_a", "scale_b", "mma", "epilogue_store"} | \
        ({"reduce"} if case.spec.partitioned else set())
    for s in an.stages:
        if s.name in model:
            assert s.teacher_forced.status is Status.MATCH and s.chained.status is Status.MATCH, s.name


# -- the builds -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dg_builds():
    require_nvcc()
    from harness.build import cutlass_include_dirs

    if not cutlass_include_dirs():
        pytest.skip("The DeepGEMM-style GEMM is written with CuTe: install the nvidia-cutlass wheel for its headers.")
    from cuda_tools import traced_and_plain

    return traced_and_plain(ZOO_SOURCE)


@pytest.mark.nvcc
@pytest.mark.every_build
def test_entry_points_traced_and_plain(dg_builds):
    traced = traced_entries(dg_builds, "deepgemm_sm90")
    assert traced == {f"{n}_traced" for n in PRODUCTION} | set(PRODUCTION)
    assert entry_symbols(dg_builds["plain"].cubin_path) == set(PRODUCTION)
    assert_sink_only_traced(dg_builds)


@pytest.mark.nvcc
@pytest.mark.every_build
def test_production_entries_do_not_spill(dg_builds):
    assert_no_spills(dg_builds["plain"])


@pytest.mark.nvcc
@pytest.mark.every_build
def test_untraced_sass_is_the_same_with_tracing_compiled_in(dg_builds):
    assert_tracing_compiled_out(dg_builds, PRODUCTION, PRODUCTION)


@pytest.mark.nvcc
@pytest.mark.every_build
def test_a_defect_define_changes_the_code_it_is_planted_in(dg_builds):
    from harness.build import build_cubin

    bad = build_cubin(ZOO_SOURCE, defines={"ZOO_DG_SCALE_B_REUSED": "1"}, extra_flags=("--ptxas-options=-v",))
    assert_no_spills(bad)
    plain, planted = sass_by_function(dg_builds["plain"].cubin_path), sass_by_function(bad.cubin_path)
    for name in PRODUCTION:
        assert planted[name] != plain[name], name

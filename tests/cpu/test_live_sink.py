"""The trace sink is sized to the selection before anything is built or launched, and a selection
that cannot fit, or names tiles and k-blocks the problem does not have, is refused first."""

from __future__ import annotations

import dataclasses

import pytest
from zoo_cases import ROOT  # tests/ is on sys.path

from harness.trace_budget import trace_budget
from harness.trace_format import TraceSelection
from oracle.run.case import load_case
from oracle.run.case_types import CaseError, with_trace
from oracle.run.inputs import Provenance, make_operands
from oracle.run.live import run_live
from oracle.run.sink import sink_budget
from oracle.run.confounds import ConfoundKind

HOPPER = ROOT / "zoo" / "hopper_gemm" / "hopper_gemm.toml"
BIG = {"m": 4096, "n": 4096, "k": 4096}
EIGHT = ((0, 0), (31, 31), (0, 31), (31, 0), (15, 16), (16, 15), (7, 23), (23, 7))


def test_eight_tiles_of_a_4096_cube_fit_the_default_ceiling():
    # the selection that overflowed a fixed 64 MB sink: every k-block of eight tiles
    case = with_trace(load_case(str(HOPPER), BIG), EIGHT, None)
    budget, ceiling = sink_budget(case)
    assert budget.tiles == 8 and budget.k_blocks == 64
    assert 64 << 20 < budget.least <= budget.estimate <= ceiling


def test_a_selection_that_cannot_fit_is_refused_with_advice():
    case = with_trace(load_case(str(HOPPER), BIG), EIGHT, None)
    case = dataclasses.replace(case, trace=dataclasses.replace(case.trace, capacity_mb=16))
    with pytest.raises(CaseError, match=r"cannot fit in the 16 MiB ceiling.*--trace-tiles with at most 1 tile"):
        sink_budget(case)


def test_naming_the_tapped_stages_shrinks_the_budget():
    case = with_trace(load_case(str(HOPPER), BIG), EIGHT, None)
    only = with_trace(case, stages=("mma",))
    assert sink_budget(only)[0].estimate < sink_budget(case)[0].estimate / 2


@pytest.mark.parametrize("tiles, kbs, match", [(((999, 999),), None, r"trace tile \(999, 999\) is outside the 3 x 4"),
                                               (None, (3, 40), r"trace k-block 40 is outside 0..8")])
def test_a_selection_outside_the_problem_is_refused_before_the_build(tmp_path, tiles, kbs, match):
    case = with_trace(load_case(str(HOPPER)), tiles, kbs)
    case = dataclasses.replace(case, kernel=dataclasses.replace(case.kernel, source=str(tmp_path / "missing.cu")))
    ops = make_operands(case.spec, "ones", 0)
    with pytest.raises(CaseError, match=match):
        run_live(case, ops, Provenance("ones"))


def test_wildcard_selectors_count_each_tile_once():
    sel = TraceSelection(tiles=((2, -1), (-1, 3), (2, 3), (0, 0)))
    b = trace_budget(sel, tiles_m=4, tiles_n=5, k_blocks=2, block_m=8, block_n=8, block_k=8, itemsize={})
    assert b.tiles == 5 + 4 - 1 + 1


def _fake_child(monkeypatch, fake_run) -> None:
    """The live run without a GPU: no build, `fake_run` stands in for the child that launches the kernel."""
    from oracle.run import live

    monkeypatch.setattr(live, "build_cubin", lambda *a, **k: type("B", (), {"cubin_path": "x", "cached": True,
                                                                          "read": lambda self: b"cubin"})())
    monkeypatch.setattr(live, "run_kernel", fake_run)
    monkeypatch.setattr(live, "require_gpu", lambda: None)  # the run is faked: so is the GPU


def test_a_live_run_s_parser_warnings_are_sorted_into_confounds_and_notes(monkeypatch):
    """The child is stood in for (no GPU): it hands back D and a sink holding one record of a tile
    the header did not select and one tap written by two CTAs."""
    from harness.runner import KernelRun, RunStatus
    from harness.trace_format import TraceWriter
    from oracle.run import live
    from oracle.run.simulate import simulate

    case = with_trace(load_case(str(ROOT / "harness" / "examples" / "simple_gemm.toml"),
                                {"m": 128, "n": 64, "k": 48}), tiles=((0, 0),))
    ops = make_operands(case.spec, "random", 1)
    rec = simulate(case.spec, ops, Provenance("random", 1), tap_tiles=[(0, 0), (1, 0)])

    def fake_run(cubin, entry, launch, tensors, *, sink, **_):
        w = TraceWriter(sink.capacity, tiles=[(0, 0)])
        for t in rec.taps:
            if t.tile == (0, 0) or (t.stage == "mma" and t.k_block == 0):
                w.tap(t)
        cast = next(t for t in rec.taps if t.stage == "epilogue_cast" and t.tile == (0, 0))
        w.elements("epilogue_cast", (0, 0), [0], [0], cast.values[0, :1], shape=(64, 64), cta=5)
        return KernelRun(RunStatus.OK, outputs={"d": rec.output.clone()}, sink=w.to_bytes(), sink_source="test")

    _fake_child(monkeypatch, fake_run)
    got = live.run_live(case, ops, Provenance("random", 1)).recording
    (conf,) = got.confounds
    assert conf.kind is ConfoundKind.UNSELECTED_TAPS and "did not select" in conf.sentence
    assert "mma tile (1, 0) k-block 0" in conf.field("examples")
    assert any("several CTAs" in n for n in got.notes) and not any("did not select" in n for n in got.notes)


def test_a_block_scaled_case_traces_its_scale_stages_per_k_block():
    """The default selection of a block-scaled case holds scale_a and scale_b (else the kernel's
    scale taps would be refused by the sink header), and the budget counts them once per k-block,
    each [rows, scale groups]."""
    from oracle.run.sink import trace_selection

    case = load_case(str(ROOT / "zoo" / "deepgemm_sm90" / "deepgemm_sm90.toml"))
    sel = trace_selection(case)
    assert {"scale_a", "scale_b"} <= set(sel.stages), sel.stages
    both = sink_budget(with_trace(case, stages=("scale_a", "scale_b")))[0]
    one_kb = sink_budget(with_trace(case, stages=("scale_a", "scale_b"), k_blocks=(0,)))[0]
    assert both.estimate - 512 > 2 * (one_kb.estimate - 512)  # every k-block's taps, not one per tile


def test_a_grouped_run_s_taps_of_a_padding_tile_are_left_out_with_a_note(monkeypatch):
    """A scheduler that rounds each group's tile count up (CUTLASS's grouped one, to the cluster) runs
    tile (1, 0) of a one-tile group: the selection names that tile for the groups that have it, so the
    padding CTA taps it too, on TMA's zero fill of A. The run is judged without those taps and says so.
    Still refused when judged: a real tile tapped under an index past its group's grid (A's tile not
    zero), and a tap naming a group the problem does not have."""
    from harness.runner import KernelRun, RunStatus
    from harness.trace_format import TraceWriter
    from oracle.run import live
    from oracle.run.recording import RecordingError
    from oracle.run.simulate import simulate
    from oracle.tools.api import judge

    case = with_trace(load_case(str(ROOT / "zoo" / "split_gemm" / "grouped.toml")), tiles=((0, 0), (1, 0)))
    assert case.spec.group_sizes[0] <= case.spec.tile.bm < case.spec.group_sizes[2]  # group 0: one tile, group 2: two
    ops = make_operands(case.spec, "random", 1)
    rec = simulate(case.spec, ops, Provenance("random", 1), tap_tiles=[(0, 0), (1, 0)])
    site = [t for t in rec.taps if t.group == 2 and t.tile == (1, 0)]
    zero_a = {"descriptor_a", "load_a", "mma"}  # A past the group's M is TMA's zero fill, so is its sum
    padding = [dataclasses.replace(t, group=0, values=t.values * 0 if t.stage in zero_a else t.values) for t in site]
    assert {t.stage for t in padding} >= zero_a
    extra = {"taps": padding}

    def fake_run(cubin, entry, launch, tensors, *, sink, **_):
        w = TraceWriter(sink.capacity, tiles=[(0, 0), (1, 0)])
        for t in list(rec.taps) + extra["taps"]:
            w.tap(t)
        return KernelRun(RunStatus.OK, outputs={"d": rec.output.clone()}, sink=w.to_bytes(), sink_source="test")

    _fake_child(monkeypatch, fake_run)
    got = live.run_live(case, ops, Provenance("random", 1)).recording
    assert not [t for t in got.taps if t.group == 0 and t.tile == (1, 0)]
    assert len(got.taps) == len(rec.taps)
    (note,) = [n for n in got.notes if "outside the group's" in n]
    assert note.startswith("group 0: the taps of tile (1, 0), outside the group's 1 x 3 tile grid, are left out")
    assert judge(got).verdict == "MATCH"

    extra["taps"] = [dataclasses.replace(t, group=0) for t in site]  # group 2's real tile under group 0's index
    mislabelled = live.run_live(case, ops, Provenance("random", 1)).recording
    assert not [n for n in mislabelled.notes if "outside the group's" in n]
    with pytest.raises(RecordingError, match=r"tile is outside the 1x3 tile grid"):
        judge(mislabelled)

    extra["taps"] = [dataclasses.replace(t, group=len(case.spec.group_sizes)) for t in padding]
    bad = live.run_live(case, ops, Provenance("random", 1)).recording
    with pytest.raises(RecordingError, match="must name their group"):
        judge(bad)

"""Split-K, stream-K and grouped problems on the CPU: the decompositions, the partial and
reduction references against their host specs, and the differential on the Python kernel model
(each partial from zero, the reduce stage, every group its own GEMM)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels_ref import mma as ref_mma
from kernels_ref import reduce as ref_reduce
from oracle.report import table as report
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, expected_shapes, make_operands
from oracle.problem.partition import group_offsets, tile_partials
from oracle.problem.spec import ProblemSpec, SpecError, Tile
from oracle.run.recording import RecordingError
from oracle.run.simulate import Injection, simulate

SPLIT = ProblemSpec(m=40, n=24, k=256, tile=Tile(64, 64, 32), splits=3)
STREAM = ProblemSpec(m=130, n=70, k=256, tile=Tile(64, 64, 32), stream_k_workers=5)
GROUPED = ProblemSpec(m=218, n=64, k=128, tile=Tile(64, 64, 32), groups=(40, 0, 100, 8, 70))


def test_split_k_shares_are_even_and_cover_every_k_block():
    parts = tile_partials(SPLIT, (0, 0))
    assert [(p.kb_begin, p.kb_end) for p in parts] == [(0, 3), (3, 6), (6, 8)]
    for rule, want in (("floor_shares", [(0, 2), (2, 5), (5, 8)]), ("cutlass_stream_k", [(0, 3), (3, 6), (6, 8)])):
        assert [(p.kb_begin, p.kb_end) for p in tile_partials(dataclasses.replace(SPLIT, partition=rule), (0, 0))] \
            == want, rule
    assert [(p.kb_begin, p.kb_end) for p in tile_partials(dataclasses.replace(SPLIT, splits=8), (0, 0))] == \
        [(i, i + 1) for i in range(8)]


def test_stream_k_deals_every_iteration_to_exactly_one_worker():
    spec = STREAM
    covered = []
    for tm in range(spec.tiles_m):
        for tn in range(spec.tiles_n):
            parts = tile_partials(spec, (tm, tn))
            assert parts[0].kb_begin == 0 and parts[-1].kb_end == spec.k_blocks
            assert all(a.kb_end == b.kb_begin for a, b in zip(parts, parts[1:]))
            covered += [(tm, tn, kb) for p in parts for kb in range(p.kb_begin, p.kb_end)]
    assert len(covered) == len(set(covered)) == spec.tiles_m * spec.tiles_n * spec.k_blocks
    assert max(len(tile_partials(spec, (tm, tn))) for tm in range(3) for tn in range(2)) == 2


def test_problem_fields_are_validated_and_round_trip():
    assert ProblemSpec.from_json(GROUPED.to_json()) == GROUPED
    assert ProblemSpec.from_json(STREAM.to_json()) == STREAM
    with pytest.raises(SpecError, match="splits"):
        dataclasses.replace(SPLIT, splits=9)
    with pytest.raises(SpecError, match="stream-K and split-K"):
        dataclasses.replace(SPLIT, stream_k_workers=4)
    with pytest.raises(SpecError, match="must add up to m"):
        dataclasses.replace(GROUPED, m=200)
    assert group_offsets(GROUPED) == (0, 40, 40, 140, 148, 218)
    assert expected_shapes(GROUPED)["b"] == (5, 128, 64)
    assert ProblemSpec(m=8, n=16, k=32, batch=3).total_m == 24


def test_partial_and_reduce_references_match_their_host_specs():
    ops = make_operands(SPLIT, "random", 4)
    got = ref_mma.partial_trajectory(ops.a, ops.b, [(0, 0)], 64, 64, 32, 3, 6)
    want = ref_mma.partial_trajectory_host(ops.a, ops.b, [(0, 0)], 64, 64, 32, 3, 6)
    assert got.shape == (1, 3, 64, 64) and float((got.double() - want).abs().max()) < 1e-4
    x = torch.randn(4, 33, 17)
    assert torch.equal(ref_reduce.reduce_partials(x).double(), ref_reduce.reduce_partials_host(x))


def _judge(spec, defect=None, tile=(0, 0), kb=4, group=None, tiles=((0, 0),), seed=1):
    ops = make_operands(spec, "random", seed)
    inj = Injection(defect, tile, kb, group=group) if defect else None
    return analyze(simulate(spec, ops, Provenance("random", seed), injection=inj, tap_tiles=list(tiles)))


@pytest.mark.parametrize("spec, tiles", [(SPLIT, [(0, 0)]), (STREAM, [(0, 1), (2, 1)]),
                                          (GROUPED, [(0, 0), (1, 0)])])
def test_correct_split_and_grouped_kernels_match(spec, tiles):
    an = _judge(spec, tiles=tiles)
    assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, an.first)


@pytest.mark.parametrize("spec, defect, tile, stage, partial, kb", [
    (SPLIT, "reduce_partial_twice", (0, 0), "reduce", None, None),
    (SPLIT, "reduce_partial_missing", (0, 0), "reduce", None, None),
    (SPLIT, "partial_overlap", (0, 0), "mma", 1, 2),  # partial 1 also summed k-block 2, partial 0's last
    (SPLIT, "mma_kblock_twice", (0, 0), "mma", 1, 4),
    (STREAM, "reduce_partial_twice", (0, 1), "reduce", None, None),
])
def test_split_defects_are_found_at_their_stage_and_partial(spec, defect, tile, stage, partial, kb):
    an = _judge(spec, defect, tile, tiles=[tile])
    assert an.verdict is Verdict.DIVERGED and an.first.stage == stage, (an.first, an.diagnosis.reason)
    assert (an.first.partial, an.first.k_block) == (partial, kb) and an.first.kind is Kind.VERDICT
    if partial is not None:
        assert f"partial {partial}" in report.sentence(an)


def test_an_overlapping_partial_is_the_finding_and_names_the_k_block_summed_twice():
    an = _judge(SPLIT, "partial_overlap")
    assert an.first.hint == "tile (0, 0): k-block 2 is tapped in partial 0 and in partial 1: the partials overlap " \
                            "(a k-block summed twice)"
    assert "k-block 2 is tapped in partial 0 and in partial 1" in report.sentence(an)
    assert not an.open_confounds  # the overlap is the finding, not a note beside another one


@pytest.mark.parametrize("defect, group, stage", [("group_wrong_b", 2, "descriptor_b"),
                                                  ("group_offset", 3, "descriptor_a"),
                                                  ("mma_kblock_twice", 2, "mma")])
def test_grouped_defects_name_their_group(defect, group, stage):
    an = _judge(GROUPED, defect, (1, 0) if defect == "mma_kblock_twice" else (0, 0), 1, group=group,
                tiles=[(0, 0), (1, 0)])
    assert an.verdict is Verdict.DIVERGED and an.first.group == group and an.first.stage == stage
    assert f"in group {group}" in report.sentence(an)
    lines = report.render(an)
    assert "group 1 (empty): nothing to judge" in lines and f"group {group} (rows" in lines
    doc = report.to_json(an)
    assert doc["group"] == group and len(doc["groups"]) == 5 and doc["first_divergence"]["group"] == group


def test_split_taps_without_their_partial_say_the_tile_is_whole():
    """Partial -1 (None) is the trace format's "this tile is not split": the tile is judged as one
    accumulation, so a kernel that in fact restarted from zero at k-block 3 diverges there."""
    ops = make_operands(SPLIT, "random", 1)
    rec = simulate(SPLIT, ops, Provenance("random", 1), tap_tiles=[(0, 0)])
    bare = dataclasses.replace(rec, taps=tuple(dataclasses.replace(t, partial=None) for t in rec.taps
                                               if t.stage != "reduce"))
    an = analyze(bare)
    assert an.verdict is Verdict.DIVERGED and (an.first.stage, an.first.k_block) == ("mma", 3), an.first


def test_a_tile_whose_mma_taps_both_name_and_omit_a_partial_is_refused():
    ops = make_operands(SPLIT, "random", 1)
    rec = simulate(SPLIT, ops, Provenance("random", 1), tap_tiles=[(0, 0)])
    mixed = dataclasses.replace(rec, taps=tuple(dataclasses.replace(t, partial=None) if t.stage == "mma" and
                                                t.k_block == 0 else t for t in rec.taps))
    with pytest.raises(RecordingError, match="name partials and also none"):
        analyze(mixed)


def test_a_split_tile_without_a_reduce_tap_feeds_its_epilogue_through_a_stand_in():
    ops = make_operands(SPLIT, "random", 1)
    rec = simulate(SPLIT, ops, Provenance("random", 1), tap_tiles=[(0, 0)])
    an = analyze(dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.stage != "reduce")))
    assert an.verdict is Verdict.MATCH
    first_epi = next(s for s in an.stages if s.name == "epilogue_scale")
    assert ("reduce", (0, 0), None) in first_epi.teacher_forced.evidence.stand_ins
    assert "stand-ins for reduce tile (0, 0)" in report.sentence(an)


def test_grouped_reference_matches_its_host_spec():
    from kernels_ref import gemm

    g = torch.Generator().manual_seed(5)
    a = torch.randn(90, 64, generator=g).bfloat16()
    b = torch.randn(3, 64, 40, generator=g).bfloat16()
    offs = [0, 30, 30, 90][:3] + [90]
    b = b[:3]
    got = gemm.grouped_gemm(a, b, offs, block_m=32, block_n=32, block_k=32)
    want = gemm.grouped_gemm_host(a, b, offs, block_m=32, block_n=32, block_k=32)
    assert got.shape == (90, 40) and torch.equal(got.float(), want.float())
    with pytest.raises(ValueError, match="offsets"):
        gemm.grouped_gemm(a, b, [0, 10, 90])


def test_a_broken_partial_reference_makes_the_oracle_untrusted(monkeypatch):
    real = ref_reduce.reduce_partials_host
    monkeypatch.setattr(ref_reduce, "reduce_partials_host", lambda x: real(x) * 1.5)
    an = _judge(SPLIT)
    assert an.verdict is Verdict.ORACLE_UNTRUSTED and any("reduce" in p for p in an.cross_check)


def test_a_grouped_problem_s_expected_output_is_every_group_s_in_row_order():
    from oracle.judging.differential import expected_output
    from oracle.run.inputs import Operands

    ops = make_operands(GROUPED, "random", 1)
    y, b = expected_output(GROUPED, ops)
    assert tuple(y.shape) == tuple(b.shape) == (218, 64) and y.dtype == torch.float32
    offs = group_offsets(GROUPED)
    for g, m_g in enumerate(GROUPED.groups):
        if m_g == 0:
            continue
        sub = dataclasses.replace(GROUPED, m=m_g, groups=None)
        yg, bg = expected_output(sub, Operands(a=ops.a[offs[g]:offs[g + 1]], b=ops.b[g]))
        assert torch.equal(y[offs[g]:offs[g + 1]], yg) and torch.equal(b[offs[g]:offs[g + 1]], bg), g

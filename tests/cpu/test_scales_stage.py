"""The scale stages (scale_a, scale_b): the MX / NVFP4 decode tables, the scale references, the
identification of a wrong scale (one test per real bug), the scales input ladder, the spec's scale
layouts, the trace format's codes, and the block-scaled model's six planted bugs judged at scale_a /
scale_b as a VERDICT through the differential."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from harness import trace_format as tf
from harness.taps import SCALE_STAGES, Tap, pipeline
from kernels_ref import scales as S
from oracle.judging.scale_hint import ScaleSite, identify
from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile

ROOT = Path(__file__).resolve().parents[2]


# -- decode tables ----------------------------------------------------------------------------
def test_e2m1_table_is_the_ocp_one():
    assert S.element_table("e2m1").tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_fp6_tables_exact():
    e2m3, e3m2 = S.element_table("e2m3"), S.element_table("e3m2")
    assert e2m3.numel() == e3m2.numel() == 64
    assert e2m3[1] == 0.125 and e2m3[8] == 1.0 and e2m3[31] == 7.5 and e2m3[63] == -7.5  # subnormal, one, max
    assert e3m2[1] == 0.0625 and e3m2[12] == 1.0 and e3m2[31] == 28.0 and e3m2[32] == -0.0
    assert S.decode(torch.tensor([31, 63]), "e3m2").tolist() == [28.0, -28.0]
    with pytest.raises(ValueError, match="0..63"):
        S.decode(torch.tensor([64]), "e2m3")


def test_ue8m0_decode_and_encode():
    v = S.decode(torch.tensor([0, 1, 127, 254, 255]), "e8m0")
    assert v[:4].tolist() == [2.0 ** -127, 2.0 ** -126, 1.0, 2.0 ** 127] and torch.isnan(v[4])
    assert S.e8m0_codes(torch.tensor([0.25, 1.0, 8.0])).tolist() == [125, 127, 130]
    with pytest.raises(ValueError, match="powers of two"):
        S.e8m0_codes(torch.tensor([3.0]))


def test_tile_scales_groups_narrower_than_the_k_block():
    vals = torch.arange(12, dtype=torch.float64).reshape(3, 4)  # 3 rows, 4 groups of 32 k
    got = S.tile_scales(vals, 1, 32, 1, 4, 1, 64, 3)  # rows 1..4 of k-block 1 (groups 2 and 3); row 3 past M
    assert got.tolist() == [[6.0, 7.0], [10.0, 11.0], [0.0, 0.0], [0.0, 0.0]]
    assert S.tile_scales(vals, 2, 128, 0, 2, 3, 64, 3).tolist() == [[1.0], [1.0]]  # 2-row blocks, k-block 3 in group 1


# -- the spec's layouts ---------------------------------------------------------------------
def _spec(block_a=(1, 128), block_b=(128, 128), dtype="fp32", **kw):
    kw.setdefault("tile", Tile(128, 128, 64))
    return ProblemSpec(256, 256, 256, "e4m3", "e4m3", scale_a=Scale("block", block_a, dtype=dtype),
                       scale_b=Scale("block", block_b, dtype=dtype), **kw)


@pytest.mark.parametrize("block_a, block_b, dtype, major", [((1, 128), (128, 128), "fp32", "row"),
                                                            ((1, 128), (128, 128), "fp32", "col"),
                                                            ((1, 32), (1, 32), "e8m0", "row"),
                                                            ((1, 16), (1, 16), "e4m3", "row")])
def test_spec_takes_every_block_layout(block_a, block_b, dtype, major):
    spec = ProblemSpec(256, 256, 256, "e4m3", "e5m2", scale_a=Scale("block", block_a, major, dtype),
                       scale_b=Scale("block", block_b, major, dtype))
    assert ProblemSpec.from_json(spec.to_json()) == spec
    assert S.groups_of_problem(spec) == max(1, 64 // block_a[1])


def test_spec_refuses_bad_scale_layouts_naming_the_field():
    with pytest.raises(SpecError, match=r"scale_b.block=\(128, 32\): e8m0"):
        _spec((1, 32), (128, 32), "e8m0")
    with pytest.raises(SpecError, match="scale_a.dtype"):
        ProblemSpec(64, 64, 64, "e4m3", "e4m3", scale_a=Scale("tensor", dtype="e8m0"))
    with pytest.raises(SpecError, match="scale_a.block"):
        _spec((1, 48), (1, 48))  # neither divides nor is a multiple of tile.bk


# -- identification: one per real bug ----------------------------------------------------------
A = torch.tensor([[2.0 ** -1, 2.0 ** -2, 2.0 ** -3, 2.0 ** -4],
                  [2.0 ** -5, 2.0 ** -6, 2.0 ** -7, 2.0 ** -8],
                  [2.0 ** -9, 2.0 ** -10, 2.0 ** -11, 2.0 ** -12]], dtype=torch.float64)
B = torch.tensor([[2.0, 4.0, 8.0, 16.0]], dtype=torch.float64)


def _site(op="a", row=0, group=0, **kw):
    return ScaleSite(op, (0, 0), kw.pop("k_block", group), row, group, **kw)


def test_identify_the_right_scale_is_none():
    assert identify(_site(row=1, group=2), 2.0 ** -7, A, B) is None


def test_identify_a_group_used_for_another():  # the trailing group skipped; one scale per k-block
    h = identify(_site(row=0, group=3), 2.0 ** -3, A, B)
    assert "the scale of k-block group 2 was used for group 3" in h


def test_identify_a_scale_applied_twice():
    assert "A's scale applied twice (the applied value is A's scale squared)" in identify(_site(row=1, group=1),
                                                                                          2.0 ** -12, A, B)


def test_identify_the_other_operands_scale_in_bs_place():  # the B-scale register reused across M waves
    h = identify(_site("b", row=5, group=1, block_rows=128, other_row0=1), 2.0 ** -6, B, A, 1)
    assert "A's scale of row 1 (group 1) in B's place: A's scale applied twice" in h


def test_identify_a_zero_scale_read_past_the_tensor():
    assert "a zero scale: read past the scale tensor" in identify(_site(row=2, group=0), 0.0, A, B)


def test_identify_the_scale_of_a_neighbouring_row():  # scale rows from the raw block index
    assert "the scale of row 1's neighbour (row 2" in identify(_site(row=1, group=0, tile_rows=1), 2.0 ** -9, A, B)


def test_identify_slice_0s_scales_in_a_later_split():
    h = identify(_site(row=0, group=3, k_block=3, partial=1, slice0_group=1), 2.0 ** -2, A, B)
    assert h.split(": ", 2)[-1].startswith("slice 0's scales used by split 1: the scale of k-block group 1")


def test_identify_a_value_that_is_no_scale():
    assert "equals no other scale of the problem" in identify(_site(row=0, group=0), 3.0, A, B)


# -- inputs, trace codes --------------------------------------------------------------------
def test_scales_ladder_gives_distinct_powers_of_two_in_the_stored_dtype():
    from oracle.run.inputs import InputError, make_operands

    spec = _spec((1, 32), (1, 32), "e8m0")
    ops = make_operands(spec, "scales")
    assert ops.scale_a.dtype == torch.uint8 and bool((ops.a.float() == 1).all())
    va = S.scale_values(ops.scale_a, "e8m0")
    assert bool((torch.log2(va) == torch.log2(va).round()).all()) and bool((va < 1).all())
    assert len(set(va[0].tolist())) == va.shape[1]  # a row's groups differ
    assert bool((va[1:] != va[:-1]).all())  # neighbouring rows differ
    assert bool((S.scale_values(ops.scale_b, "e8m0") >= 1).all())  # B's never equal A's
    with pytest.raises(InputError, match="block-scaled"):
        make_operands(ProblemSpec(64, 64, 64, "bf16", "bf16"), "scales")


def test_scale_stages_have_trace_codes_and_sit_between_load_and_mma():
    assert (tf.STAGE_CODES["scale_a"], tf.STAGE_CODES["scale_b"]) == (26, 27)
    p = pipeline(block_scaled=True)
    assert p.index("load_b") < p.index("scale_a") < p.index("scale_b") < p.index("mma")
    assert not set(SCALE_STAGES) & set(pipeline())
    with pytest.raises(Exception, match="k_block is required"):
        Tap("scale_a", (0, 0), torch.ones(4, 1))


def test_a_scale_tap_round_trips_through_the_trace_format():
    w = tf.TraceWriter()
    vals = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    w.tap(Tap("scale_a", (0, 1), vals, k_block=3))
    got = tf.parse_trace(w.to_bytes(), block_m=4, block_n=4, block_k=64, scale_groups=2).taps
    assert [(t.stage, t.tile, t.k_block) for t in got] == [("scale_a", (0, 1), 3)]
    assert torch.equal(got[0].values, vals)


@pytest.mark.nvcc
def test_the_scale_header_compiles_for_sm90a(tmp_path):
    src = ROOT / "tests" / "cuda" / "scale_taps.cu"
    cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-std=c++17",
           f"-I{ROOT / 'harness' / 'include'}", "-DORACLE_TRACE", "-o", str(tmp_path / "on.cubin"), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- the model's six bugs, judged ---------------------------------------------------------------
BUGS = {
    "scale_b_reused": ("scale_b", "A's scale applied twice"),
    "scale_split_slice0": ("scale_a", "slice 0's scales used by split 1"),
    "scale_raw_block_index": ("scale_a", "the scale rows of another tile"),
    "scale_trailing_skipped": ("scale_a", "the scale of k-block group 0 was used for group 1"),
    "scale_one_per_k_block": ("scale_a", "the scale of k-block group 0 was used for group 1"),
    "scale_map_group_size": ("scale_a", "a zero scale: read past the scale tensor"),
}


@pytest.mark.parametrize("defect", list(BUGS))
def test_each_planted_scale_bug_is_a_verdict_at_its_scale_stage(defect):
    from oracle.judging.diagnose import Kind, Verdict
    from oracle.judging.differential import analyze
    from oracle.run.scale_model import simulate_block_scaled

    an = analyze(simulate_block_scaled(defect))
    stage, words = BUGS[defect]
    assert an.verdict is Verdict.DIVERGED and an.kind is Kind.VERDICT
    assert an.first.stage == stage, an.first
    assert words in an.first.hint, an.first.hint


def test_a_scale_stage_finding_is_a_report_its_schema_accepts():
    """The report's JSON of a finding at scale_b validates (the schema's stage names lacked the scale
    stages, so `--json` of a block-scaled kernel's report failed), and the schema names every stage."""
    import json

    from harness.taps import ALL_STAGES
    from oracle.judging.differential import analyze
    from oracle.report.table import to_json, validate
    from oracle.run.scale_model import simulate_block_scaled

    schema = json.loads((ROOT / "oracle" / "report" / "schema.json").read_text())
    assert set(schema["$defs"]["stage_name"]["enum"]) == set(ALL_STAGES)
    an = analyze(simulate_block_scaled("scale_b_reused"))
    assert an.first.stage == "scale_b"
    validate(to_json(an))


def test_the_correct_model_matches_with_mx_scales():
    from oracle.judging.diagnose import Verdict
    from oracle.judging.differential import analyze
    from oracle.run.scale_model import simulate_block_scaled

    an = analyze(simulate_block_scaled(None, scale_dtype="e8m0"))
    assert an.verdict is Verdict.MATCH
    assert {s.name: s.teacher_forced.status.name for s in an.stages}["scale_a"] == "MATCH"


def test_simulate_cli_writes_a_block_scaled_dump_and_refuses_other_defects(tmp_path, capsys):
    from oracle.tools.cli import main

    out = tmp_path / "d.safetensors"
    assert main(["simulate", "--block-scaled", "--defect", "scale_trailing_skipped", "--out", str(out)]) == 0
    assert "simulated_1d2d[scale_trailing_skipped]" in capsys.readouterr().out and out.exists()
    assert main(["simulate", "--block-scaled", "--defect", "mma_no_reset", "--out", str(out)]) == 2
    assert "not a block-scaled defect" in capsys.readouterr().err


# -- several scale groups per k-block, and split-K: judged at every stage --------------------------
@pytest.mark.parametrize("kw", [dict(groups=2), dict(splits=2), dict(scale_dtype="e8m0", groups=2, splits=2)],
                         ids=["narrow", "split", "mx_narrow_split"])
def test_the_correct_model_matches_at_mma_and_the_output(kw):
    from oracle.judging.diagnose import Verdict
    from oracle.judging.differential import analyze
    from oracle.run.scale_model import simulate_block_scaled

    an = analyze(simulate_block_scaled(None, **kw))
    assert an.verdict is Verdict.MATCH
    judged = {s.name: (s.teacher_forced.status.name, s.chained.status.name) for s in an.stages}
    for stage in ("scale_a", "scale_b", "mma", "epilogue_store") + (("reduce",) if "splits" in kw else ()):
        assert judged[stage] == ("MATCH", "MATCH"), (stage, judged)
    assert not any("scale_a / scale_b" in m for m in an.unobserved), an.unobserved
    assert not an.cross_check, an.cross_check


def test_right_scales_applied_to_the_wrong_groups_diverge_at_mma():
    """Scale registers that hold the right values, but every group of a k-block promoted with the
    first group's: the scale stages match, the accumulator does not."""
    import dataclasses

    from oracle.judging.diagnose import Verdict
    from oracle.judging.differential import analyze
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.scale_model import ScaleInjection, default_problem, simulate_scaled

    spec = default_problem("scale_one_per_k_block")
    ops = make_operands(spec, "scales", 0)
    right = simulate_scaled(spec, ops, Provenance("scales", 0))
    wrong = simulate_scaled(spec, ops, Provenance("scales", 0), ScaleInjection("scale_one_per_k_block"))
    scales = [t for t in right.taps if t.stage.startswith("scale_")]
    rec = dataclasses.replace(wrong, taps=tuple(t for t in wrong.taps if not t.stage.startswith("scale_")) +
                              tuple(scales))
    an = analyze(rec)
    assert an.verdict is Verdict.DIVERGED
    assert an.first.stage == "mma", an.first
    judged = {s.name: s.teacher_forced.status.name for s in an.stages}
    assert judged["scale_a"] == judged["scale_b"] == "MATCH"


def test_simulate_cli_takes_scale_groups_and_splits(tmp_path, capsys):
    from oracle.run.recording import Recording
    from oracle.tools.cli import main

    out = tmp_path / "g.safetensors"
    assert main(["simulate", "--block-scaled", "--scale-groups", "2", "--splits", "2", "--out", str(out)]) == 0
    spec = Recording.load(str(out)).spec
    assert spec.tile.bk == 2 * spec.scale_a.block[1] and spec.splits == 2

"""The oracle never claims more than it observed: recordings of the zoo changed to order, one
honesty rule per test (unrecorded is unobserved, drops make drafts, descriptor fields count,
stand-ins are not evidence, untraced tiles are named, unwritten is told from NaN, every stage
says what it compared and masked)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from zoo_cases import ROOT  # tests/ is on sys.path

from harness.trace_format import TraceAccount, TraceSelection
from oracle.report import table as report
from oracle.judging.compare import Status
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.judging.evidence import UNRECORDED, UPSTREAM_UNRECORDED, Feed
from oracle.run.recording import Recording
from oracle.run.caller import Caller
from oracle.run.confounds import ConfoundKind

pytestmark = pytest.mark.slow


def _rec(name: str) -> Recording:
    return Recording.load(str(ROOT / "tests" / "zoo" / "dumps" / f"{name}.safetensors.gz"))


def _stage(an, name):
    return next(s for s in an.stages if s.name == name)


def _with_taps(rec: Recording, taps) -> Recording:
    return dataclasses.replace(rec, taps=tuple(taps))


# -- 1. unrecorded is unobserved -------------------------------------------------------------
def test_half_an_upstream_accumulator_unrecorded_is_not_a_divergence():
    rec = _rec("hopper_bf16_correct")
    taps = []
    for t in rec.taps:
        if t.stage == "mma" and t.k_block == 0:  # the kernel lost the odd rows of the first accumulator
            mask = torch.ones_like(t.values, dtype=torch.bool)
            mask[1::2] = False
            values = torch.where(mask, t.values, torch.full_like(t.values, 1e9))  # garbage where unrecorded
            t = dataclasses.replace(t, values=values, mask=mask)
        taps.append(t)
    an = analyze(_with_taps(rec, taps))
    assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, an.first)
    mma = _stage(an, "mma")
    assert mma.teacher_forced.evidence.masked_count(UPSTREAM_UNRECORDED) > 0  # kb 1 fed by the partial kb 0
    assert mma.chained.evidence.masked_count(UNRECORDED) > 0  # kb 0 itself
    assert "masked: mma teacher-forced" in report.render(an)


def test_a_stage_with_nothing_recorded_is_not_run():
    rec = _rec("hopper_bf16_correct")
    taps = [dataclasses.replace(t, mask=torch.zeros_like(t.values, dtype=torch.bool)) if t.stage == "mma" else t
            for t in rec.taps]
    an = analyze(_with_taps(rec, taps))
    mma = _stage(an, "mma")
    assert mma.teacher_forced.status is Status.NOT_RUN and mma.chained.status is Status.NOT_RUN
    assert mma.chained.evidence.masked_count(UNRECORDED) > 0
    assert an.verdict is not Verdict.DIVERGED


def test_an_unrecorded_image_byte_is_not_compared():
    rec = _rec("hopper_bf16_correct")
    taps = []
    for t in rec.taps:
        if t.stage == "descriptor_a":  # the first warp's chunk of every image was lost: its bytes read as 0
            mask = torch.ones_like(t.values, dtype=torch.bool)
            mask[:1024] = False
            t = dataclasses.replace(t, values=torch.where(mask, t.values, torch.zeros_like(t.values)), mask=mask)
        taps.append(t)
    an = analyze(_with_taps(rec, taps))
    assert an.verdict is Verdict.MATCH, an.first
    assert _stage(an, "descriptor_a").teacher_forced.evidence.masked_count(UNRECORDED) > 0
    assert _stage(an, "load_a").teacher_forced.evidence.masked_count(UPSTREAM_UNRECORDED) > 0


# -- 2. drops are an open confound -----------------------------------------------------------
def _dropped(rec: Recording, stage: str, n: int) -> Recording:
    sel = TraceSelection(tiles=tuple(sorted({t.tile for t in rec.taps})))
    return dataclasses.replace(rec, trace=TraceAccount(selection=sel, dropped=n, dropped_by_stage=((stage, n),),
                                                       needed_bytes=1 << 27, capacity=1 << 26))


def test_dropped_records_make_a_draft_that_names_what_was_lost():
    rec = _rec("hopper_bf16_kblock_twice")
    kept = [t for t in rec.taps if not (t.stage == "epilogue_cast")]  # the cast taps fell off the end
    an = analyze(_dropped(_with_taps(rec, kept), "epilogue_cast", 96))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma"
    assert an.kind is Kind.DRAFT and an.first.kind is Kind.DRAFT
    (conf,) = an.incomplete_trace
    assert conf.kind is ConfoundKind.DROPPED_RECORDS and conf in an.open_confounds
    assert "epilogue_cast 96" in conf.field("by_stage")
    assert "epilogue_cast no tap: epilogue_cast tile (0, 0)" in conf.field("lost")


def test_a_match_with_dropped_records_says_it_is_incomplete():
    an = analyze(_dropped(_rec("hopper_bf16_correct"), "mma", 3))
    assert an.verdict is Verdict.MATCH
    assert "The trace was incomplete" in report.sentence(an)


# -- 3. stand-ins are not evidence; global memory is -----------------------------------------
def test_mma_fed_by_stand_ins_is_a_draft_naming_the_missing_taps():
    rec = _rec("hopper_bf16_stale_slot")  # the loads are wrong, but here nobody tapped them
    kept = [t for t in rec.taps if t.stage.split("_")[0] not in ("load", "descriptor")]
    an = analyze(_with_taps(rec, kept))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma"
    assert an.first.kind is Kind.DRAFT and an.first.fed_by == Feed.STAND_IN.value
    assert {s for s, _, _ in an.first.stand_ins} == {"load_a", "load_b"}
    text = report.sentence(an)
    assert "DRAFT" in text and "stand-ins for load_a tile (0, 0)" in text
    doc = report.to_json(an)
    assert doc["first_divergence"]["stand_ins"] and doc["stages"][4]["fed_by"] == ["reference stand-in"]


def test_a_load_judged_against_global_memory_is_a_verdict():
    # a cp.async kernel has no TMA image: global memory is the load's real input
    an = analyze(_rec("sm80_bf16_uninit_padding"))
    assert an.first.stage == "load_b" and an.first.kind is Kind.VERDICT
    assert an.first.fed_by == Feed.GLOBAL.value


def test_a_tma_load_without_its_image_is_a_draft():
    rec = _rec("hopper_bf16_stale_slot")
    an = analyze(_with_taps(rec, [t for t in rec.taps if not t.stage.startswith("descriptor")]))
    assert an.first.stage == "load_a" and an.first.kind is Kind.DRAFT
    assert any(s == "descriptor_a" for s, _, _ in an.first.stand_ins)


# -- 4. descriptor fields count --------------------------------------------------------------
def test_a_wrong_box_without_any_image_fails_the_descriptor_stage():
    rec = _rec("hopper_bf16_correct")
    kept = [t for t in rec.taps if not t.stage.startswith("descriptor")]
    descs = tuple(dataclasses.replace(d, box_dims=(32,) + d.box_dims[1:], source="kernel") if d.operand == "a" else d
                  for d in rec.descriptors)
    an = analyze(dataclasses.replace(_with_taps(rec, kept), descriptors=descs))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "descriptor_a"
    assert an.first.field.field == "box_dims" and an.first.tile is None
    assert an.first.kind is Kind.VERDICT
    assert "the kernel's tapped descriptor" in report.sentence(an)


def test_host_encoded_maps_are_said_to_check_the_case():
    rec = _rec("hopper_bf16_correct")
    descs = tuple(dataclasses.replace(d, source="host") for d in rec.descriptors)
    an = analyze(dataclasses.replace(rec, descriptors=descs))
    notes = " ".join(_stage(an, "descriptor_a").teacher_forced.notes)
    assert "encoded by the harness from the case" in notes


# -- 5. untraced tiles are named -------------------------------------------------------------
def test_a_wrong_untraced_tile_is_named_with_the_command_that_traces_it():
    rec = _rec("hopper_bf16_correct")  # 2 x 1 tiles, only tile (1, 0) traced
    out = rec.output.clone()
    out[:128] = out[:128] * 2  # tile (0, 0) is wrong and was never traced
    cmd = ("python", "-m", "oracle", "compare", "--problem", "zoo/hopper_gemm/hopper_gemm.toml", "--inputs",
           "random:1", "--trace-tiles", "1,0")
    an = analyze(dataclasses.replace(rec, output=out, command=cmd))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "epilogue_store"
    assert an.first.tile == (0, 0) and an.first.untraced == ((0, 0),)
    assert an.first.kind is Kind.DRAFT and not an.diagnosis.inherited
    assert an.first.rerun.endswith("--inputs random:1 --trace-tiles 0,0")
    text = report.sentence(an, Caller.COMMAND_LINE)  # the command line is shown the command
    assert "where nothing was traced" in text and an.first.rerun in text and "inherited" not in text
    assert "a trace of tile (0, 0): trace_tiles=[(0, 0)]" in report.sentence(an)  # Python, its keyword


# -- 6. unwritten is told apart from NaN -----------------------------------------------------
def test_an_element_still_holding_the_poison_is_never_written():
    rec = _rec("hopper_bf16_correct")
    out = rec.output.clone()
    out.view(torch.int16)[5, 7] = -1  # 0xFFFF: the harness's poison, a NaN
    an = analyze(dataclasses.replace(rec, output=out, output_poison=0xFF))
    assert an.first.stage == "epilogue_store" and an.first.unwritten
    assert "never written" in report.sentence(an)
    assert report.to_json(an)["stages"][-1]["worst_tile"]["unwritten"] == 1


def test_an_unwritten_element_is_caught_where_the_reference_is_nan_too():
    rec = _rec("hopper_bf16_correct")
    a = rec.operands.a.clone()
    a[130, 3] = float("nan")  # row 130 of D is NaN in the reference (tile (1, 0), traced)
    ops = dataclasses.replace(rec.operands, a=a)
    out = rec.output.clone()
    out.view(torch.int16)[130] = 0x7FFF  # the kernel computed NaN there: CUDA's canonical bf16 NaN ...
    out.view(torch.int16)[130, 4] = -1  # ... except one element it never wrote
    base = dataclasses.replace(rec, operands=ops, output=out, taps=(), descriptors=(), output_poison=None)
    blind = analyze(base)
    assert blind.verdict is Verdict.MATCH  # without knowing the poison, NaN matches NaN
    an = analyze(dataclasses.replace(base, output_poison=0xFF))
    assert an.verdict is Verdict.DIVERGED and an.first.unwritten and an.first.element == (130, 4)


# -- 7. every stage says what it compared and masked -----------------------------------------
def test_each_stage_reports_what_it_compared_and_masked(tmp_path):
    an = analyze(_rec("hopper_bf16_correct"))
    doc = report.to_json(an)
    by = {s["name"]: s for s in doc["stages"]}
    assert by["mma"]["compared"] > 0 and by["mma"]["masked"].get("padding", 0) > 0
    assert by["load_a"]["fed_by"] == ["kernel tap"] and by["descriptor_a"]["fed_by"] == ["global memory",
                                                                                          "descriptor fields"]
    for s in doc["stages"]:
        assert {"compared", "masked", "fed_by"} <= set(s)
    json.dumps(doc, allow_nan=False, default=str)
    table = report.table(an)
    assert "masked" in table.splitlines()[0] and "fed by" in table.splitlines()[0]


def test_the_trace_account_survives_a_dump(tmp_path):
    rec = _dropped(_rec("hopper_bf16_correct"), "mma", 3)
    rec = dataclasses.replace(rec, output_poison=0xFF, command=("python", "-m", "oracle", "compare"))
    path = str(tmp_path / "r.safetensors")
    rec.save(path)
    back = Recording.load(path)
    assert back.trace == rec.trace and back.output_poison == 0xFF and back.command == rec.command

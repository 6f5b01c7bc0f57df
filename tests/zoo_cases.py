"""The bug zoo's manifest, read once, and what each kernel of the zoo taps: shared by the GPU test
(live runs), the offline test (recorded dumps) and the build checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from oracle.run.case import load_case, trace_plan
from oracle.run.case_types import Case, with_trace
from oracle.judging.compare import Status
from oracle.judging.diagnose import Kind, Verdict

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "zoo" / "manifest.json"
EPILOGUE_TAPS = {"epilogue_alpha_beta", "epilogue_bias", "epilogue_activation", "epilogue_cast"}


def entries(kernel_dir: Optional[str] = None, kind: Optional[str] = "gemm") -> list[dict]:
    """The manifest's entries of problem kind `kind` (an entry's `kind`, "gemm" when absent; None:
    every kind), under `kernel_dir` if given."""
    with open(MANIFEST) as f:
        doc = json.load(f)
    return [e for e in doc if (kernel_dir is None or e["kernel"].startswith(kernel_dir))
            and (kind is None or e.get("kind", "gemm") == kind)]


# The offline dump test is spread over files (tests/cpu/test_zoo_dumps*.py), one per shard, so that
# `--dist loadfile` runs them side by side; every entry falls in exactly one shard, "rest" included.
DUMP_SHARDS = ("cutlass_coop", "cutlass_pingpong", "cutlass_more", "hopper", "split", "attention", "rest")


def dump_shard(entry: dict) -> str:
    if entry.get("kind") == "attention":
        return "attention"
    family = entry["kernel"].split("/")[1]
    if family == "cutlass_sm90":
        if any(w in entry["name"] for w in ("batched", "grouped", "blockwise", "streamk")):
            return "cutlass_more"
        return "cutlass_pingpong" if "pingpong" in entry["name"] else "cutlass_coop"
    return {"hopper_gemm": "hopper", "split_gemm": "split"}.get(family, "rest")


def dump_entries(shard: str) -> list[dict]:
    assert shard in DUMP_SHARDS, shard
    return [e for e in entries(kind=None) if dump_shard(e) == shard]


def judge_recorded_dump(entry: dict) -> None:
    """The entry's recorded trace, judged offline as the manifest says (tests/cpu/test_zoo_dumps*.py): a
    GEMM's by the differential, an attention kernel's by the attention analysis."""
    import pytest

    if entry.get("kind") == "attention":
        from oracle.judging.attention_analysis import analyze_attention as analyze
        from oracle.run.attention_recording import AttentionRecording as Recording

        make_case, tapped, check = attention_entry_case, attention_tapped_stages, check_attention_judgement
    else:
        from oracle.judging.differential import analyze
        from oracle.run.recording import Recording

        make_case, tapped, check = entry_case, tapped_stages, check_judgement
    path = ROOT / entry["dump"]
    if not path.is_file() and entry.get("dump_pending"):
        pytest.skip(pending_reason(entry))
    assert path.is_file(), f"{entry['dump']} is missing: record it on the GPU ({_gpu_test(entry)})"
    rec = Recording.load(str(path))
    case = make_case(entry, entry.get("record_problem") or entry["problem"])
    if entry.get("kind") != "attention" and case.kernel.library and case.spec.epilogue is None:
        from oracle.run.library_epilogue import with_library_order

        # the live run read the order from the built library (oracle.run.live), which this test does
        # not build: the recording keeps that order, and the same rules apply it to the case
        case, _ = with_library_order(case, rec.spec.epilogue)
    assert rec.spec == case.spec, "the dump was recorded for another problem than the manifest's"
    assert tapped(case) <= {t.stage for t in rec.taps}
    check(entry["expected_stage"], case, analyze(rec), entry)


def entry_case(entry: dict, problem: Optional[dict] = None) -> Case:
    """The entry's live case: its case file, problem overrides, traced entry point and trace selection.
    A launch library's entry names only its source (`kernel` without ":entry"): the case builds it."""
    src, sep, fn = entry["kernel"].partition(":")
    if sep:
        case = load_case(str(ROOT / entry["case"]), problem or entry["problem"], source=str(ROOT / src), entry=fn)
    else:
        case = load_case(str(ROOT / entry["case"]), problem or entry["problem"], allow_library=True)  # the zoo's own
        assert case.kernel.library == str(ROOT / src), (entry["name"], case.kernel.library)
    if "trace" in entry:
        plan = trace_plan(entry["trace"], where=f"manifest entry {entry['name']!r} trace")
        case = with_trace(case, plan.tiles, plan.k_blocks)
    return case


def tapped_stages(case: Case) -> set[str]:
    """The stages the case's zoo kernel taps."""
    folder = Path(case.kernel.library or case.kernel.source).resolve().parent
    if folder == ROOT / "zoo" / "cutlass_sm90":
        s = case.spec  # a split case: the stream-K scheduler's fixup, tapped as reduce
        stages = {"descriptor_a", "descriptor_b", "load_a", "load_b", "mma", "epilogue_cast"} | (
            {"reduce"} if s.partitioned else set()) | (
            {"scale_a", "scale_b"} if s.block_scaled else set())  # the blockwise-scaled mainloop's scales
        if s.bias != "none" or s.activation != "none":  # an EVT epilogue: a tap per step of the tree
            user_tree = "ZOO_CUTLASS_EVT" in case.kernel.defines  # its alpha is fused into the bias: no tap
            return stages | {"epilogue_bias"} | ({"epilogue_beta_c"} if s.beta else set()) | (
                {"epilogue_activation"} if s.activation != "none" else set()) | (
                set() if user_tree else {"epilogue_alpha"})
        # LinearCombination: alpha_beta, then the cast; scaled: the scale first
        return stages | {"epilogue_alpha_beta"} | ({"epilogue_scale"} if s.epilogue_scaled else set())
    if folder == ROOT / "zoo" / "w4a16_sm80":  # packed B as loaded, then dequantised; alpha, then the cast
        return {"load_a", "load_b", "dequant_b", "mma", "epilogue_alpha_beta", "epilogue_cast"}
    if folder in (ROOT / "zoo" / "deepgemm_sm90", ROOT / "zoo" / "mx_sm80"):  # the block scales a k-block applied
        stages = {"load_a", "load_b", "scale_a", "scale_b", "mma", "epilogue_alpha_beta", "epilogue_cast"}
        return stages | ({"reduce"} if case.spec.partitioned else set())
    if folder == ROOT / "zoo" / "split_gemm":
        stages = {"load_a", "load_b", "mma", "epilogue_alpha_beta", "epilogue_bias", "epilogue_cast"}
        return stages | ({"reduce"} if case.spec.partitioned else set())
    stages = {"load_a", "load_b", "mma"} | EPILOGUE_TAPS
    if folder == ROOT / "zoo" / "hopper_gemm":
        stages |= {"descriptor_a", "descriptor_b"}
        if case.spec.scale_a.kind in ("tensor", "row") or case.spec.scale_b.kind in ("tensor", "col"):
            stages.add("epilogue_scale")
    return stages


def _traced_padding(case: Case) -> bool:
    """Does a traced tile reach past M or N (so that its taps hold padding)?"""
    s = case.spec
    tiles = case.trace.tiles or ((s.tiles_m - 1, s.tiles_n - 1),)
    return any((tm + 1) * s.tile.bm > s.m or (tn + 1) * s.tile.bn > s.n for tm, tn in tiles)


def stage_table(an) -> dict:
    return {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}


def check_judgement(want: Optional[str], case: Case, an, entry: Optional[dict] = None) -> None:
    """The oracle's judgement of one run must be `want`: the first divergent stage, or None for a
    MATCH with every tapped stage compared (teacher-forced and chained); with the manifest entry,
    also its expected group and partial."""
    table = stage_table(an)
    assert not an.cross_check, an.cross_check
    tapped = tapped_stages(case)
    recorded = {s.name for s in an.stages if s.teacher_forced.status is not Status.NOT_RUN
                or s.chained.status is not Status.NOT_RUN}
    if want is None:
        assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, an.first, table)
        forced = {s.name for s in an.stages if s.teacher_forced.status is Status.MATCH}
        chained = {s.name for s in an.stages if s.chained.status is Status.MATCH}
        assert tapped | {"epilogue_store"} <= forced, table  # loads without TMA: against global memory
        assert {"load_a", "load_b", "mma", "epilogue_store"} <= chained, table
        if _traced_padding(case):
            assert an.handled_confounds, "rows past M or N were compared: the padding confound was not handled"
        return
    assert want in recorded, (want, sorted(recorded), table)
    assert an.verdict is Verdict.DIVERGED, (an.diagnosis.reason, table)
    assert an.first.stage == want, (an.first, an.diagnosis.reason, table)
    # every tap of the stage's input was recorded on controlled inputs: nothing less than a VERDICT
    assert an.first.kind is Kind.VERDICT, (an.first, an.open_confounds)
    for key, got in (("expected_group", an.first.group), ("expected_partial", an.first.partial),
                     ("expected_tile", list(an.first.tile) if an.first.tile is not None else None),
                     ("expected_k_block", an.first.k_block)):
        if entry is not None and key in entry:
            assert got == entry[key], (key, got, entry[key], an.first)
    names = [s.name for s in an.stages]  # the judged order: a declared epilogue's, not stage_rank's fixed one
    upstream = an.stages[:names.index(want)]
    assert all(Status.MISMATCH not in (s.teacher_forced.status, s.chained.status) for s in upstream), table


def _gpu_test(entry: dict) -> str:
    """The GPU test that runs the entry's kernel live and records its dump."""
    return "tests/gpu/test_attention_zoo_gpu.py" if entry.get("kind") == "attention" else "tests/gpu/test_zoo.py"


def pending_reason(entry: dict) -> str:
    """Why an entry added without a GPU has no recording yet, and how to make it."""
    return (f"{entry['dump']} has not been recorded yet: record it on the H200 with ORACLE_ZOO_RECORD_DIR="
            f"tests/zoo/dumps python -m pytest {_gpu_test(entry)} -k {entry['name']}")


# -- attention entries (`kind` "attention": a case file with [problem] kind = "attention") -------------
def attention_entry_case(entry: dict, problem: Optional[dict] = None):
    """The attention entry's case: its case file, problem overrides, traced entry point and trace selection."""
    from dataclasses import replace

    from oracle.run.case import load_case

    src, _, fn = entry["kernel"].partition(":")
    case = load_case(str(ROOT / entry["case"]), problem if problem is not None else entry["problem"], entry=fn)
    assert case.kernel.source is not None and Path(case.kernel.source).resolve() == (ROOT / src).resolve(), \
        (entry["name"], case.kernel.source, src)
    if "trace" in entry:
        plan = trace_plan(entry["trace"], where=f"manifest entry {entry['name']!r} trace")
        case = replace(case, trace=replace(case.trace, tiles=plan.tiles or case.trace.tiles, k_blocks=plan.k_blocks))
    return case


def attention_tapped_stages(case) -> set[str]:
    """The stages the zoo's attention kernels (fa2_sm80, fa3_sm90) tap: every attention stage, combine
    only when split."""
    from harness.taps import ATTENTION_TAP_STAGES

    return {s for s in ATTENTION_TAP_STAGES if s != "combine" or case.spec.splits > 1}


def check_attention_judgement(want: Optional[str], case, an, entry: Optional[dict] = None) -> None:
    """The oracle's judgement of one attention run must be `want`: the first divergent stage (a
    VERDICT, every stage before it MATCH teacher-forced, the manifest's KV block if it names one),
    or None for a MATCH at every tapped stage, teacher-forced and chained."""
    from oracle.report.table import sentence

    table = {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}
    tapped = attention_tapped_stages(case)
    if want is None:
        assert an.verdict is Verdict.MATCH and an.first is None, (sentence(an), table)
        for st in an.stages:
            if st.name in tapped:
                assert st.teacher_forced.status is Status.MATCH and st.chained.status is Status.MATCH, (st.name, table)
        return
    names = [s.name for s in an.stages]
    assert want in names, (want, names)
    assert an.verdict is Verdict.DIVERGED and an.first.stage == want, (sentence(an), table)
    assert an.first.kind is Kind.VERDICT, (sentence(an), an.first.missing)
    assert an.stages[names.index(want)].teacher_forced.status is Status.MISMATCH, table
    for st in an.stages[:names.index(want)]:
        assert st.teacher_forced.status is Status.MATCH, (st.name, table)
    if entry is not None and "expected_k_block" in entry:
        assert an.first.k_block == entry["expected_k_block"], (an.first.k_block, entry["expected_k_block"], sentence(an))

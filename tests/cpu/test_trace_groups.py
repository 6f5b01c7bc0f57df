"""A trace selection of groups (a grouped GEMM's groups, a batched GEMM's or an attention batch's
entries): the sink header carries up to four (n_groups, groups[] at bytes 44-63), the parser says
when a kernel recorded another group, a case file and the command line select them, the sink is
sized for them, and a run that traced some groups judges the others from their output alone."""

import dataclasses
import sys
from pathlib import Path

import pytest
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter

from harness import trace_format
from harness.taps import Tap
from harness.trace_budget import attention_trace_budget
from harness.trace_format import TraceHeaderError, TraceSelection, TraceWriter, parse_header, parse_trace
from harness.trace_format.account import TraceAccount
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, Tile
from oracle.run.case import load_case, trace_plan
from oracle.run.case_types import CaseError
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate

ROOT = Path(__file__).resolve().parents[2]
GROUPED = ProblemSpec(m=218, n=64, k=128, tile=Tile(64, 64, 32), groups=(40, 0, 100, 8, 70))


def test_the_header_carries_the_groups_and_the_reader_checks_them():
    head = trace_format.sink_init_bytes(4096, tiles=[(0, 0)], groups=[3, 0])
    sel = parse_header(head).selection
    assert sel.groups == (0, 3) and sel.records("mma", (0, 0), 1, 3) and not sel.records("mma", (0, 0), 1, 2)
    assert sel.records("mma", (0, 0), 1, None)  # a tap of no group is always recorded
    assert int.from_bytes(head[44:48], "little") == 2 and int.from_bytes(head[48:52], "little") == 0
    assert parse_header(trace_format.sink_init_bytes(4096)).selection.groups is None
    bad = bytearray(head)
    bad[44:48] = (5).to_bytes(4, "little")
    with pytest.raises(TraceHeaderError, match="n_groups 5 exceeds 4"):
        parse_header(bytes(bad))
    bad = bytearray(head)
    bad[52:56] = (-2).to_bytes(4, "little", signed=True)
    with pytest.raises(TraceHeaderError, match="group selectors"):
        parse_header(bytes(bad))
    for groups, words in (([0, 1, 2, 3, 4], "at most 4"), ([-1], "ints >= 0"), ([], "non-empty"),
                          ([True], "ints >= 0")):
        with pytest.raises(ValueError, match=words):
            TraceSelection(groups=groups)


def test_a_record_of_a_group_the_header_left_out_is_named_by_the_parser():
    w = TraceWriter(1 << 16, groups=[1])
    w.elements("mma", (0, 0), [0], [0], [1.0], shape=(64, 64), k_block=0, dtype="fp32", group=1)
    w.elements("mma", (0, 0), [0], [0], [2.0], shape=(64, 64), k_block=0, dtype="fp32", group=2)
    res = parse_trace(w.to_bytes(), block_m=64, block_n=64, block_k=32)
    assert any("group 2 was not selected" in line for line in res.warnings), res.warnings
    assert not any("group 1 " in line for line in res.warnings)


def test_a_case_selects_groups_and_a_selection_outside_the_problem_is_refused(tmp_path):
    assert trace_plan({"groups": [0, 3]}).groups == (0, 3)
    assert trace_plan({}).groups is None and trace_plan({"groups": "all"}).groups is None
    for bad in ([], [-1], "some", [0, 1, 2, 3, 4]):
        with pytest.raises(CaseError, match="groups"):
            trace_plan({"groups": bad})
    case = tmp_path / "c.toml"
    case.write_text('[problem]\nm = 64\nn = 64\nk = 64\nbatch = 3\ntile = [64, 64, 32]\n'
                    '[trace]\ngroups = [2]\n')
    from oracle.run.case import check_trace_selection

    loaded = load_case(str(case))
    check_trace_selection(loaded)  # batch entry 2 of 3
    with pytest.raises(CaseError, match="trace group 3 is outside the problem's 3 batch entries"):
        check_trace_selection(load_case(str(case), {"batch": 3}).__class__(
            **{**loaded.__dict__, "trace": dataclasses.replace(loaded.trace, groups=(3,))}))
    with pytest.raises(CaseError, match="one GEMM, with no groups or batch entries to select"):
        check_trace_selection(load_case(str(case), {"batch": 1}))


def test_the_attention_sink_is_sized_for_the_batch_entries_selected():
    kw = dict(batch=64, q_blocks=1, heads_q=8, kv_blocks=16, splits=4, block_q=64, block_kv=64, head_dim=128,
              head_dim_v=128, itemsize={"load_q": 2, "load_k": 2, "load_v": 2, "p": 2})
    whole = attention_trace_budget(TraceSelection(tiles=((0, 0),), stages=("s", "o")), **kw)
    two = attention_trace_budget(TraceSelection(tiles=((0, 0),), stages=("s", "o"), groups=(0, 63)), **kw)
    assert 30 * two.estimate < whole.estimate < 34 * two.estimate


def _grouped_run(traced_groups, defect=None, group=None):
    ops = make_operands(GROUPED, "random", 3)
    inj = Injection(defect, (0, 0), 1, group=group) if defect else None
    rec = simulate(GROUPED, ops, Provenance("random", 3), injection=inj, tap_tiles=[(0, 0), (1, 0)])
    kept = tuple(t for t in rec.taps if t.group in traced_groups)  # what a kernel with the selection records
    return analyze(dataclasses.replace(rec, taps=kept))


def test_groups_left_out_of_the_trace_are_judged_from_their_output():
    an = _grouped_run({2})
    assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, an.first)
    traced = _grouped_run({2}, "group_wrong_b", group=2)
    assert traced.verdict is Verdict.DIVERGED and traced.first.group == 2 and traced.first.stage == "descriptor_b"
    untraced = _grouped_run({2}, "group_wrong_b", group=4)  # not traced: its D says it, no stage can
    assert untraced.verdict is Verdict.DIVERGED and untraced.first.group == 4, untraced.first


def test_a_selected_group_that_no_tap_came_from_is_named_in_what_the_run_did_not_see():
    """A complete trace that selected every group, where one group's taps never arrived (a kernel tapping it under
    another index, or skipping it): its MATCH from D alone is said, in its group's line and in what the run did
    not see. Not for a group the selection left out, one with no selected tile in its grid, or a trace that lost
    records (which names its lost sites itself)."""
    ops = make_operands(GROUPED, "random", 3)
    rec = simulate(GROUPED, ops, Provenance("random", 3), tap_tiles=[(0, 0), (1, 0)])
    quiet = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.group != 4))

    def judged(selection, **lost):
        return analyze(dataclasses.replace(quiet, trace=TraceAccount(selection=selection, **lost)))

    both = ((0, 0), (1, 0))
    an = judged(TraceSelection(tiles=both))
    assert an.verdict is Verdict.MATCH
    assert [o.untapped for o in an.groups] == [False, False, False, False, True]
    assert an.groups[4].describe() == "group 4 (rows 148..217): MATCH (from its output alone: no tap of it arrived)"
    said = [u for u in an.unobserved if u.startswith("group 4: the trace selected its tiles (0, 0), (1, 0)")]
    assert len(said) == 1, an.unobserved
    for other in (judged(TraceSelection(tiles=both, groups=(0, 2, 3))), judged(TraceSelection(tiles=((2, 0),))),
                  judged(TraceSelection(tiles=both), dropped=3, capacity=4096, needed_bytes=8192)):
        assert not any(o.untapped for o in other.groups)
        assert not any(u.startswith("group 4:") for u in other.unobserved), other.unobserved
    # one selected tile of a group that has taps of another: named as a tile, the group not called untapped
    partial = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if (t.group, t.tile) != (2, (1, 0))),
                                  trace=TraceAccount(selection=TraceSelection(tiles=both)))
    an = analyze(partial)
    assert an.verdict is Verdict.MATCH and not any(o.untapped for o in an.groups)
    said = [u for u in an.unobserved if u.startswith("group 2: selected tile (1, 0) had no tap")]
    assert len(said) == 1, an.unobserved


def test_a_selected_tile_of_a_single_gemm_that_no_tap_came_from_is_named():
    spec = ProblemSpec(m=128, n=128, k=64, tile=Tile(64, 64, 32))
    rec = simulate(spec, make_operands(spec, "random", 5), Provenance("random", 5), tap_tiles=[(0, 0), (1, 1)])
    sel = TraceSelection(tiles=((0, 0), (1, 1)))
    whole = analyze(dataclasses.replace(rec, trace=TraceAccount(selection=sel)))
    assert not any("had no tap" in u for u in whole.unobserved), whole.unobserved
    quiet = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.tile != (1, 1)),
                                trace=TraceAccount(selection=sel))
    an = analyze(quiet)
    assert an.verdict is Verdict.MATCH
    said = [u for u in an.unobserved if u.startswith("selected tile (1, 1) had no tap: judged at the output only")]
    assert len(said) == 1, an.unobserved


def test_the_command_line_takes_trace_groups_and_names_a_bad_one():
    done = warm_python.run([sys.executable, "-m", "oracle", "compare", "--problem", "m=64,n=64,k=64,batch=2",
                            "--trace-groups", "0,x"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--trace-groups '0,x': 'x' is not a non-negative integer" in done.stderr


def test_an_attention_run_that_traced_one_batch_entry_judges_it_by_stage_and_the_others_by_output():
    import oracle
    from oracle.problem.attention import AttentionSpec
    from oracle.run.attention_simulate import simulate_attention

    spec = AttentionSpec(batch=3, heads_q=2, heads_kv=1, seqlen_q=20, seqlen_k=40, head_dim=16, causal="bottom_right",
                         block_q=16, block_kv=16)
    for defect, want in ((None, "MATCH"), ("max_not_updated_before_rescale", "DIVERGED")):
        rec = simulate_attention(spec, defect=defect, seed=4)
        one = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.group == 1))
        rep = oracle.judge(one)
        assert rep.verdict == want, str(rep)
        if defect:  # batch entry 1 is traced: the stage is named there; the other entries' outputs diverge too
            assert rep.first_divergence.stage == "softmax_state" and rep.first_divergence.kind.value == "VERDICT"
            assert "(batch 1, query head 0, query block 0)" in str(rep) and "(not traced there)" in str(rep)


def test_a_decode_batch_too_large_to_trace_whole_names_trace_groups_and_two_entries_fit():
    from oracle.run.request import resolve_case
    from oracle.run.sink import check_case

    sizes = ["batch=64", "seqlen_k=32768"]
    with pytest.raises(CaseError, match="or --trace-groups naming at most 4 of its 64 batch entries"):
        check_case(resolve_case(str(ROOT / "zoo/fa3_sm90/split.toml"), assignments=sizes))
    budget, ceiling = check_case(resolve_case(str(ROOT / "zoo/fa3_sm90/split.toml"), assignments=sizes,
                                              trace_groups=(0, 63)))
    assert budget.estimate < ceiling // 4

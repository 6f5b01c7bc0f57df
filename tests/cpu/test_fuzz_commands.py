"""Hostile command lines and calls, seeded: command lines around mutated case files and bench
lists, cases whose new fields (stream-K workers, splits, batch, groups, workspaces, launch fields)
are mutated, and oracle.check calls with hostile arguments are refused with one error line or a
documented error type, in bounded time and memory. The inputs come from tests/fuzz_inputs.py,
whose script is the long campaign; this tier runs seeds 0.. of each kind, enough that every
mutation kind of each is tried (asserted), in about a minute on two cores (the trace buffers,
recordings and reproducer folders are in tests/cpu/test_fuzz_inputs.py, so the two halves run side
by side). A failure names its seed: `fuzz_inputs.make_case(seed, ...)` and its siblings rebuild
the input."""

from __future__ import annotations

import fuzz_inputs as F  # tests/ is on sys.path
import pytest

CASES, CASE_FIELDS = 300, 300
CHECK_CALLS, JUDGE_EVERY = 600, 10


def test_mutated_case_files_and_flags_exit_2_with_one_error_line():
    t = F.run_cases(CASES)
    assert t.clean, t.failures()
    assert t.inputs == CASES and t.refused["error: (exit 2)"] > CASES // 2
    assert t.extra["reached the build"] > 10  # valid cases pass every check and stop at the (stubbed) build
    assert not F.kinds_missing(t, F.CASE_KINDS), F.kinds_missing(t, F.CASE_KINDS)


def test_mutated_partition_batch_group_workspace_and_launch_fields_exit_2_with_one_error_line():
    t = F.run_case_fields(CASE_FIELDS)
    assert t.clean, t.failures()
    assert t.inputs == CASE_FIELDS and t.refused["error: (exit 2)"] > CASE_FIELDS // 2
    assert t.extra["reached the build"] > 20  # cases that stay valid pass every check and reach the (stubbed) build
    assert not F.kinds_missing(t, F.FIELD_KINDS), F.kinds_missing(t, F.FIELD_KINDS)


def test_oracle_check_refuses_bad_arguments_with_documented_errors_and_judges_the_rest():
    t = F.run_check_calls(CHECK_CALLS, judge_every=JUDGE_EVERY)
    assert t.clean, t.failures()  # no untyped error, no hang, no ORACLE_UNTRUSTED on a valid input
    assert t.inputs == CHECK_CALLS and t.refused["SpecError"] > CHECK_CALLS // 2
    judged = sum(n for k, n in t.extra.items() if k.startswith("verdict "))
    assert judged >= 10 and t.extra["verdict MATCH"] >= 3 and t.extra["valid, not judged"] > judged
    assert not F.kinds_missing(t, F.CHECK_KINDS), F.kinds_missing(t, F.CHECK_KINDS)


# -- the campaign can fail: each kind of defect it looks for is seen when planted -------------


@pytest.mark.parametrize("broken", ["traceback", "two lines", "bench row"])
def test_a_command_failing_untyped_is_caught(monkeypatch, broken):
    import oracle.run.case
    import oracle.run.case_types

    if broken == "traceback":
        monkeypatch.setattr(oracle.run.case, "load_case", lambda *a, **k: 1 // 0)
    elif broken == "two lines":
        def two_lines(*a, **k):
            raise oracle.run.case_types.CaseError("first line\nsecond line")
        monkeypatch.setattr(oracle.run.case, "load_case", two_lines)
    else:
        import oracle.tools.bench

        def untyped(c):
            raise AttributeError("planted")
        monkeypatch.setattr(oracle.tools.bench, "live_case", untyped)
    t = F.run_cases(20)
    assert t.untyped and all(u[1] == "Untyped" for u in t.untyped)


def test_a_check_call_failing_untyped_or_judged_untrusted_is_caught(monkeypatch):
    import oracle
    from oracle.tools import api

    class Report:
        verdict = "ORACLE_UNTRUSTED"
        analysis = type("Analysis", (), {"cross_check": ("planted",)})()

    calls = iter(range(10))

    def planted(*a, **k):
        if next(calls) == 0:
            raise KeyError("planted")
        return Report()

    monkeypatch.setattr(api, "recording_of", lambda *a, **k: object())
    monkeypatch.setattr(oracle, "check", planted)
    t = F.run_check_calls(2)
    assert [u[1] for u in t.untyped] == ["KeyError", "ORACLE_UNTRUSTED"] and not t.clean


ATTENTION_CALLS = 600


def test_oracle_check_attention_refuses_bad_arguments_with_documented_errors_and_judges_the_rest():
    """NaN and infinite inputs, scores past fp32's range, fully masked rows among them: a documented
    error or a judgement, and never the oracle's own references disagreeing (ORACLE_UNTRUSTED)."""
    t = F.run_attention_check_calls(ATTENTION_CALLS)
    assert t.clean, t.failures()
    assert t.inputs == ATTENTION_CALLS and t.refused["SpecError"] > ATTENTION_CALLS // 2
    judged = sum(n for k, n in t.extra.items() if k.startswith("verdict "))
    assert judged >= 10 and t.extra["verdict MATCH"] >= 2, dict(t.extra)
    assert not F.kinds_missing(t, F.ATTENTION_CHECK_KINDS), F.kinds_missing(t, F.ATTENTION_CHECK_KINDS)

"""Hostile inputs, seeded: mutated trace buffers (built with the header's writer), the zoo's
recordings mutated, and command lines around mutated case files and bench lists are refused with
the documented error types only, in bounded time and memory. The inputs come from
tests/fuzz_inputs.py, whose script is the long campaign; this tier runs seeds 0.. of each kind
(about a minute and a half on two cores), then cases whose new fields (stream-K workers,
splits, batch, groups, workspaces, launch fields) are mutated and oracle.check calls with hostile
arguments (about a minute and a half more). A failure names its seed: `fuzz_inputs.make_trace(seed)` and its
siblings rebuild the input."""

from __future__ import annotations

import time

import fuzz_inputs as F  # tests/ is on sys.path
import numpy as np
import pytest

TRACES, DUMPS, CASES = 8000, 500, 1000
CASE_FIELDS, CHECK_CALLS, JUDGE_EVERY = 600, 1000, 10
REPRO_DIRS = 320


def test_mutated_trace_buffers_raise_only_trace_format_errors():
    t = F.run_traces(TRACES)
    assert t.clean, t.failures()
    assert t.inputs == TRACES and t.extra["unmutated refused"] == 0
    # the mutations reach every check, and what survives them still parses
    assert len(t.refused) >= 6 and sum(t.refused.values()) > TRACES // 3 and t.accepted > TRACES // 5


def test_mutated_dumps_raise_only_dump_errors():
    t = F.run_dumps(DUMPS, analyze_every=15)
    assert t.clean, t.failures()
    assert t.inputs == DUMPS and t.refused["DumpError"] > DUMPS // 2 and t.accepted > 20
    assert t.extra["unmutated"] > 10 and t.extra["unmutated refused"] == 0 and t.extra["gzip bombs"] >= 1
    assert t.extra["judged"] >= 3  # recordings that load are judged without a failure of the differential


def test_mutated_case_files_and_flags_exit_2_with_one_error_line():
    t = F.run_cases(CASES)
    assert t.clean, t.failures()
    assert t.inputs == CASES and t.refused["error: (exit 2)"] > CASES // 2
    assert t.extra["reached the build"] > 10  # valid cases pass every check and stop at the (stubbed) build


def test_mutated_partition_batch_group_workspace_and_launch_fields_exit_2_with_one_error_line():
    t = F.run_case_fields(CASE_FIELDS)
    assert t.clean, t.failures()
    assert t.inputs == CASE_FIELDS and t.refused["error: (exit 2)"] > CASE_FIELDS // 2
    assert t.extra["reached the build"] > 20  # cases that stay valid pass every check and reach the (stubbed) build


def test_oracle_check_refuses_bad_arguments_with_documented_errors_and_judges_the_rest():
    t = F.run_check_calls(CHECK_CALLS, judge_every=JUDGE_EVERY)
    assert t.clean, t.failures()  # no untyped error, no hang, no ORACLE_UNTRUSTED on a valid input
    assert t.inputs == CHECK_CALLS and t.refused["SpecError"] > CHECK_CALLS // 2
    judged = sum(n for k, n in t.extra.items() if k.startswith("verdict "))
    assert judged >= 10 and t.extra["verdict MATCH"] >= 3 and t.extra["valid, not judged"] > judged


def test_mutated_reproducer_folders_are_refused_typed_and_never_touched():
    t = F.run_repro_dirs(REPRO_DIRS)
    assert t.clean, t.failures()
    assert t.inputs == REPRO_DIRS and t.refused["ReproError"] > REPRO_DIRS // 4 and t.accepted > REPRO_DIRS // 5
    # refused writes left every byte as it was (else a breach); the oracle's own folders were written again
    assert t.extra["write refused: ReproError"] > REPRO_DIRS // 2 and t.extra["written again"] > REPRO_DIRS // 10


# -- the campaign can fail: each kind of defect it looks for is seen when planted -------------


def test_an_untyped_exception_a_hang_and_an_allocation_past_the_limits_are_caught(monkeypatch):
    from harness import trace_format

    real = trace_format.parse_trace
    planted = {"untyped": 3, "hang": 5, "alloc": 7}

    def planted_parse(buf, **kw):
        seed = calls.pop(0)
        if seed == planted["untyped"]:
            raise ValueError("a plain ValueError")
        if seed == planted["hang"]:
            time.sleep(5)
        if seed == planted["alloc"]:
            np.ones(F.LIMIT_MB << 21, dtype=np.uint8)  # twice the limit
        return real(buf, **kw)

    calls = list(range(10))
    monkeypatch.setattr(trace_format, "parse_trace", planted_parse)
    monkeypatch.setattr(F, "HANG_S", 1.0)
    monkeypatch.setattr(F, "LIMIT_MB", 8)
    t = F.run_traces(10)
    assert [s for s, *_ in t.untyped] == [planted["untyped"]] and t.untyped[0][1] == "ValueError"
    assert t.hangs == [planted["hang"]]
    assert [s for s, _ in t.breaches] == [planted["alloc"]]
    assert not t.clean


def test_a_dump_reader_failing_untyped_is_caught(monkeypatch):
    from oracle.run.recording import Recording

    monkeypatch.setattr(Recording, "load", classmethod(lambda cls, path: {}["missing"]))
    t = F.run_dumps(3)
    assert [u[1] for u in t.untyped] == ["KeyError"] * 3


@pytest.mark.parametrize("broken", ["traceback", "two lines", "bench row"])
def test_a_command_failing_untyped_is_caught(monkeypatch, broken):
    import oracle.run.case

    if broken == "traceback":
        monkeypatch.setattr(oracle.run.case, "load_case", lambda *a, **k: 1 // 0)
    elif broken == "two lines":
        def two_lines(*a, **k):
            raise oracle.run.case.CaseError("first line\nsecond line")
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


@pytest.mark.parametrize("planted", ["reader follows links", "writer ignores the manifest"])
def test_a_reproducer_folder_read_through_a_link_or_overwritten_is_caught(monkeypatch, planted):
    import oracle.repro.folder
    import oracle.repro.readback

    if planted == "reader follows links":
        real = oracle.repro.readback.read_bounded
        monkeypatch.setattr(oracle.repro.readback, "read_bounded", lambda *a, nofollow=False, **k: real(*a, **k))
    else:
        monkeypatch.setattr(oracle.repro.folder.ReproFolder, "_survey", lambda self: ({}, set()))
    t = F.run_repro_dirs(40)
    assert not t.clean and (t.breaches or planted != "reader follows links"), t.failures()

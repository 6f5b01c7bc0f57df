"""Hostile inputs, seeded: mutated trace buffers (built with the header's writer), the zoo's
recordings mutated, mutated reproducer folders and the warm server's mutated request lines are
refused with the documented error types
only, in bounded time and memory, and no link is followed. The inputs come from
tests/fuzz_inputs.py, whose script is the long campaign; this tier runs seeds 0.. of each kind,
enough that every mutation kind of each is tried (asserted), in about a minute on two cores (the
command lines and oracle.check calls are in tests/cpu/test_fuzz_commands.py, so the two halves run
side by side). A failure names its seed: `fuzz_inputs.make_trace(seed)` and its siblings rebuild
the input."""

from __future__ import annotations

import time

import fuzz_inputs as F  # tests/ is on sys.path
import numpy as np
import pytest

TRACES, DUMPS, ANALYZE_EVERY, REPRO_DIRS, SERVER_REQUESTS = 1500, 250, 12, 120, 400


def test_mutated_trace_buffers_raise_only_trace_format_errors():
    t = F.run_traces(TRACES)
    assert t.clean, t.failures()
    assert t.inputs == TRACES and t.extra["unmutated refused"] == 0
    # the mutations reach every check, and what survives them still parses
    assert len(t.refused) >= 6 and sum(t.refused.values()) > TRACES // 3 and t.accepted > TRACES // 5
    assert not F.kinds_missing(t, F.TRACE_KINDS), F.kinds_missing(t, F.TRACE_KINDS)


def test_mutated_dumps_raise_only_dump_errors():
    t = F.run_dumps(DUMPS, analyze_every=ANALYZE_EVERY)
    assert t.clean, t.failures()
    assert t.inputs == DUMPS and t.refused["DumpError"] > DUMPS // 2 and t.accepted > 20
    assert t.extra["unmutated"] > 10 and t.extra["unmutated refused"] == 0 and t.extra["gzip bombs"] >= 1
    assert t.extra["judged"] >= 3  # recordings that load are judged without a failure of the differential
    assert not F.kinds_missing(t, F.DUMP_KINDS), F.kinds_missing(t, F.DUMP_KINDS)


def test_mutated_reproducer_folders_are_refused_typed_and_never_touched():
    t = F.run_repro_dirs(REPRO_DIRS)
    assert t.clean, t.failures()
    assert t.inputs == REPRO_DIRS and t.refused["ReproError"] > REPRO_DIRS // 4 and t.accepted > REPRO_DIRS // 5
    # refused writes left every byte as it was (else a breach); the oracle's own folders were written again
    assert t.extra["write refused: ReproError"] > REPRO_DIRS // 2 and t.extra["written again"] > REPRO_DIRS // 10
    assert not F.kinds_missing(t, F.REPRO_KINDS), F.kinds_missing(t, F.REPRO_KINDS)


def test_mutated_server_requests_are_refused_typed():
    t = F.run_server_requests(SERVER_REQUESTS)
    assert t.clean, t.failures()
    assert t.inputs == SERVER_REQUESTS and t.extra["unmutated refused"] == 0
    assert t.refused["BadRequest"] > SERVER_REQUESTS // 2 and t.accepted >= SERVER_REQUESTS // 20
    assert not F.kinds_missing(t, F.SERVER_KINDS), F.kinds_missing(t, F.SERVER_KINDS)


def test_a_request_parser_failing_untyped_is_caught(monkeypatch):
    from oracle.tools import server

    def broken(data):
        raise KeyError("the parser's own defect")

    monkeypatch.setattr(server, "parse_request", broken)
    t = F.run_server_requests(3)
    assert len(t.untyped) == 3 and not t.clean


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


def test_a_hang_the_code_under_test_wraps_or_swallows_is_a_hang(monkeypatch):
    """Triton's interpreter raises the Hang again as InterpreterError and a command reports it as its
    own failure (exit 4): the input is still a hang, not an untyped exception."""
    def spin():
        while True:  # CPU time, which the limit counts
            pass

    def wrapped():
        try:
            spin()
        except F.Hang as e:
            raise RuntimeError("Hang()") from e

    def swallowed():
        try:
            spin()
        except F.Hang:
            return 4

    monkeypatch.setattr(F, "HANG_S", 0.2)
    t = F.Tally("planted")
    for seed, fn in ((1, wrapped), (2, swallowed), (3, spin)):
        assert F._record(t, seed, fn, ()) is None
    assert t.hangs == [1, 2, 3] and not t.untyped and t.accepted == 0
    assert F._record(t, 4, lambda: 5, ()) == 5 and t.accepted == 1  # no limit fired: accepted


def test_a_dump_reader_failing_untyped_is_caught(monkeypatch):
    import oracle.run.dumps

    monkeypatch.setattr(oracle.run.dumps, "load_recording", lambda path: {}["missing"])
    t = F.run_dumps(3)
    assert [u[1] for u in t.untyped] == ["KeyError"] * 3


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

"""The run step of the one path: RunRequest -> RunOutcome.

A live case: its inputs made (or read from a dump), then built, run and traced once (oracle.run.live
run_live), or run for races (run_races: repeated traced and untraced runs, shared-memory poison,
compute-sanitizer), and, with `time`, the kernel and its peers timed (oracle.run.perf). A dump (of
either problem kind: oracle.run.dumps.load_recording) or a recording: read, nothing run. What
comes back is data only; judging it is oracle.judging.judgement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from oracle.problem.attention import is_attention
from oracle.run import attention_live
from oracle.run.inputs import Operands, Provenance, check_operands, make_operands, parse_inputs
from oracle.run.dumps import load_recording
from oracle.run.recording import Recording
from oracle.run.request import RunRequest


@dataclass(frozen=True)
class KernelRunInfo:
    """How the live run of the kernel went (the JSON's `run`)."""

    status: str
    message: str
    elapsed_s: Optional[float]
    kernel_s: Optional[float]
    build_cached: Optional[bool]
    phases_s: dict = field(default_factory=dict)  # the child's own phases (harness KernelRun.phases_s)
    started_ahead: Optional[dict] = None  # harness KernelRun.started_ahead

    def to_json(self) -> dict:
        return {"status": self.status, "message": self.message, "elapsed_s": self.elapsed_s,
                "kernel_s": self.kernel_s, "build_cached": self.build_cached,
                "phases_s": {k: round(v, 6) for k, v in self.phases_s.items()},
                "started_ahead": self.started_ahead}


@dataclass(frozen=True)
class RunOutcome:
    """What a request's run gave: the recording to judge (a live case: its first traced run), where
    it came from, and for a live case how the kernel ran, every run made for races, the timings and
    the seconds each phase took. `notices` are lines for the user beside the report (a sanitizer
    that could not run)."""

    request: RunRequest
    recording: Recording  # or an AttentionRecording (a dump or a recording of that kind)
    source: str
    kernel_run: Optional[KernelRunInfo] = None
    races: Optional[object] = None  # oracle.run.races.RaceRuns, when the request looked for races
    performance: Optional[object] = None  # oracle.run.perf.Performance, with `time`
    phases_s: dict = field(default_factory=dict)
    notices: tuple[str, ...] = ()


def generator() -> str:
    """Live runs draw random inputs on the GPU when there is one (fast at any size)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def operands_for(request: RunRequest) -> tuple[Operands, Provenance]:
    """A live request's inputs: controlled ones made for its problem, or a dump's operands, which
    must fit the case's problem."""
    spec = request.case.spec
    if is_attention(spec):
        ops = attention_live.operands(spec, request.inputs)
        return ops, ops.provenance
    ladder, seed, path = parse_inputs(request.inputs)
    if ladder == "dump":
        ops = Recording.load(path).operands
        check_operands(spec, ops)
        return ops, Provenance("dump", source=path)
    gen = generator()
    return make_operands(spec, ladder, seed, generator=gen), \
        Provenance(ladder, seed if ladder == "random" else None, generator=gen)


def run(request: RunRequest, *, while_running: Optional[Callable[[], None]] = None) -> RunOutcome:
    """Run what `request` asks. `while_running` is this process's own preparation for judging
    (imports, first-call costs), done while a live kernel runs in its child process."""
    t0 = time.perf_counter()
    if request.recording is not None:
        return RunOutcome(request, request.recording, request.source or request.recording.kernel,
                          phases_s={"recording": time.perf_counter() - t0})
    if request.dump is not None:
        rec = load_recording(request.dump)  # either problem kind
        return RunOutcome(request, rec, request.source or request.dump,
                          phases_s={"recording": time.perf_counter() - t0})
    return _run_live(request, t0, while_running)


def _keep_a_child_ahead() -> None:
    """A process that runs a live kernel on a GPU keeps the next run's child started ahead (unless
    it is the plain command, which runs one: harness.child_process.one_run_only)."""
    import torch

    if torch.cuda.is_available():
        from harness.child_process import keep_ahead

        keep_ahead()


def _run_live(request: RunRequest, t0: float, while_running) -> RunOutcome:
    from oracle.run.live import run_live
    from oracle.run.races import run_races
    from oracle.run.sink import check_case

    case = request.case
    check_case(case)  # every check that needs no inputs, no build and no GPU, before any of them
    _keep_a_child_ahead()
    t_in = time.perf_counter()
    ops, prov = operands_for(request)
    inputs_s = time.perf_counter() - t_in
    races, notices = None, ()
    if request.races or request.sanitize:
        races = run_races(case, ops, prov, repeat=request.runs, smem_poison=request.poison, sanitize=request.sanitize,
                          timeout_s=request.timeout_s, command=request.command, while_running=while_running)
        live = races.first
        if races.sanitizer is not None and races.sanitizer.unavailable:
            notices = (races.sanitizer.unavailable,)
    else:
        timing = None
        if request.time:
            from oracle.run.perf import kernel_timing_request

            timing = kernel_timing_request()
        live = run_live(case, ops, prov, timeout_s=request.timeout_s, timing=timing, command=request.command,
                        while_running=while_running)
    performance = None
    if request.time and live.run.ok:
        from oracle.run.perf import Performance, kernel_path, reference_paths

        k = kernel_path(case.spec, live.run.timing, case.kernel.time_entry or case.kernel.entry)
        refs, notes = reference_paths(case.spec, ops)
        performance = Performance(tuple(([k] if k else []) + refs), tuple(notes))
    info = KernelRunInfo(live.run.status.value, live.run.message, live.run.elapsed_s, live.run.kernel_s,
                         live.build_cached, dict(live.run.phases_s), live.run.started_ahead)
    phases = dict(live.phases_s or {}, inputs=inputs_s, recording=time.perf_counter() - t0)
    return RunOutcome(request, live.recording, live.recording.kernel, info, races, performance, phases, notices)

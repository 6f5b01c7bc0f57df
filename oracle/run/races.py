"""Runs for races: the traced and the untraced build run again on the same inputs, with
shared-memory poison, or under compute-sanitizer (run_races); oracle.judging.repeat compares what
they gave. Each run is a fresh child process (oracle.run.live, harness.runner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from harness.build import build_cubin, build_library
from harness.runner import KernelRun, run_kernel, run_library
from oracle.problem.attention import is_attention
from oracle.run.case_types import Case, CaseError
from oracle.run.adapters import library_defines
from oracle.run.kernel_flags import build_options
from oracle.run.inputs import Operands, Provenance
from oracle.run.recording import Recording
from oracle.run.launch import from_storage, is_library, launch_sequence, library_call
from oracle.run.live import LiveRun, run_live


@dataclass(frozen=True)


class RaceRuns:
    """A live case run for races (oracle.judging.repeat): the first traced run (the one judged), every
    traced recording, the untraced build's outputs, the two poison runs' outputs and the
    sanitizer's report."""

    first: LiveRun
    traced: tuple[Recording, ...]
    untraced: tuple[Optional[torch.Tensor], ...]
    failed: tuple[str, ...]
    poison: Optional[tuple[int, int]] = None
    poisoned: tuple[Optional[torch.Tensor], ...] = ()
    poison_note: str = ""
    sanitizer: Optional[object] = None  # harness.sanitizer.SanitizerReport
    untraced_entry: str = ""


TRACED_SUFFIX = "_traced"  # the zoo's naming: NAME_traced exists only with -DORACLE_TRACE, NAME in both builds
UNTRACED_KEYS = ("--untraced-entry or [kernel] untraced_entry (the first launch), [[launch.next]] untraced_entry "
                 "(a later one)")


def default_untraced_entry(entry: str) -> str:
    """The untraced build's entry point for a traced `entry`: NAME for NAME_traced, else the same name."""
    if entry.endswith(TRACED_SUFFIX) and len(entry) > len(TRACED_SUFFIX):
        return entry[:-len(TRACED_SUFFIX)]
    return entry


def untraced_entries(case: Case) -> tuple[str, ...]:
    """The entry point of every launch in the untraced build, in order: [kernel] untraced_entry (or
    --untraced-entry) for the first, each [[launch.next]] untraced_entry for the later ones, each
    defaulting to its traced entry without the _traced suffix."""
    k = case.kernel
    first = k.untraced_entry or default_untraced_entry(k.entry)
    later = tuple(plan.untraced_entry or default_untraced_entry(plan.entry)
                  for plan in (case.launch.next if case.launch is not None else ()))
    return (first,) + later


def untraced_build(case: Case):
    """The case's kernel built without -DORACLE_TRACE, and the entry point of its first launch
    (untraced_entries). A prebuilt cubin has no untraced build: CaseError."""
    k = case.kernel
    if k.cubin:
        raise CaseError("a prebuilt [kernel] cubin has no untraced build: give the source to run the untraced "
                        "kernel (--repeat, --sanitize)")
    br = build_cubin(k.source, arch=k.arch, defines=dict(k.defines), **build_options(k))
    return br.read(), untraced_entries(case)[0]


def untraced_sequence(case: Case, sequence) -> list:
    """launch_sequence's later launches ((entry, LaunchSpec)) with the untraced build's entry points."""
    entries = untraced_entries(case)
    return [(entries[i], spec) for i, (_, spec) in enumerate(sequence) if i > 0]


def untraced_failure(case: Case, run: KernelRun) -> CaseError:
    """An untraced run that could not start (no such entry point, say), naming the keys that choose them."""
    if is_library(case):
        return CaseError(f"the untraced launch library could not be run: {run.describe()}\n{run.stderr_tail}")
    return CaseError(f"the untraced build's kernel(s) {', '.join(untraced_entries(case))} could not be run: "
                     f"{run.describe()}; the untraced build (without -DORACLE_TRACE) runs each launch's entry "
                     f"without its _traced suffix unless {UNTRACED_KEYS} names another\n{run.stderr_tail}")


def _run_untraced_library(case: Case, ops: Operands, timeout_s: Optional[float]) -> KernelRun:
    """One call of the launch library built without -DORACLE_TRACE (no sink)."""
    k = case.kernel
    call, tensors = library_call(case, ops)
    br = build_library(k.library, arch=k.arch, defines=library_defines(k, case.spec, traced=False), **build_options(k))
    return run_library(br, call, tensors, timeout_s=timeout_s)


def run_untraced(case: Case, ops: Operands, *, timeout_s: Optional[float] = None) -> KernelRun:
    """One run of the untraced build on `ops` (no sink)."""
    if is_library(case):
        return _run_untraced_library(case, ops, timeout_s)
    sequence, tensors = launch_sequence(case, ops)
    cubin, entry = untraced_build(case)
    return run_kernel(cubin, entry, sequence[0][1], tensors, timeout_s=timeout_s, then=untraced_sequence(case, sequence))


def run_races(case: Case, ops: Operands, provenance: Provenance, *, repeat: int, smem_poison: Optional[int] = None,
              sanitize: bool = False, timeout_s: Optional[float] = None, command: Sequence[str] = (),
              sanitizer_timeout_s: Optional[float] = None,
              while_running: Optional[Callable[[], None]] = None) -> RaceRuns:
    """`repeat` traced runs and `repeat` untraced runs (each a fresh child process) on the same
    inputs; with `smem_poison`, two more traced runs with that pattern and its complement; with
    `sanitize`, the untraced build once under each compute-sanitizer tool."""
    from harness.sanitizer import find_sanitizer, unavailable_report
    from harness.sanitizer import sanitize as run_sanitizer

    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise CaseError(f"repeat {repeat!r} must be a positive integer")
    if is_library(case) and (sanitize or smem_poison is not None):
        raise CaseError("--sanitize and shared-memory poison run a cubin's kernel by its entry point; a launch "
                        "library ([kernel] library) is entered only through oracle_launch: use --repeat alone")
    first = run_live(case, ops, provenance, timeout_s=timeout_s, command=command, while_running=while_running)
    traced, failed = [first.recording], []
    if first.recording.kernel_error:
        failed.append("traced run 1")
    for i in range(2, repeat + 1):
        rec = run_live(case, ops, provenance, timeout_s=timeout_s, command=command).recording
        traced.append(rec)
        if rec.kernel_error:
            failed.append(f"traced run {i}")
    untraced, entry = [], ""
    want_untraced = repeat > 1 or sanitize
    if want_untraced:
        if is_library(case):
            entry = case.kernel.entry

            def one() -> KernelRun:
                return _run_untraced_library(case, ops, timeout_s)
        else:
            cubin, entry = untraced_build(case)
            sequence, tensors = launch_sequence(case, ops)

            def one() -> KernelRun:
                return run_kernel(cubin, entry, sequence[0][1], tensors, timeout_s=timeout_s,
                                  then=untraced_sequence(case, sequence))
        for i in range(1, repeat + 1) if repeat > 1 else ():
            run = one()
            if not run.ok and not run.kernel_fault:
                raise untraced_failure(case, run)
            untraced.append(kernel_output(case, run) if run.ok else None)
            if not run.ok:
                failed.append(f"untraced run {i}")
    if len(failed) == len(traced) + len(untraced):
        failed = []  # every run failed alike: that is a KERNEL_ERROR, not a difference between runs
    poison, poisoned, note = None, [], ""
    if smem_poison is not None:
        poison = (smem_poison, complement(smem_poison))
        for p in poison:
            live = run_live(case, ops, provenance, timeout_s=timeout_s, command=command, smem_poison=p)
            applied = (live.run.smem_poison or {}).get("ctas", 0)
            if not applied:
                note = ("the kernel never called oracle_trace smem_prologue() (0 CTAs filled their shared memory): "
                        "the poison runs show nothing")
            poisoned.append(live.recording.output)
        if note:
            poisoned = []
    report = None
    if sanitize and find_sanitizer() is None:
        report = unavailable_report()  # nothing to build for
    elif sanitize:
        cubin, entry = untraced_build(case)
        sequence, tensors = launch_sequence(case, ops)
        limit = sanitizer_timeout_s or max(120.0, 5.0 * float(timeout_s or knobs_timeout()))
        report = run_sanitizer(cubin, entry, sequence[0][1], tensors, timeout_s=limit,
                               then=untraced_sequence(case, sequence))
    return RaceRuns(first, tuple(traced), tuple(untraced), tuple(failed), poison, tuple(poisoned), note, report, entry)


def kernel_output(case: Case, run: KernelRun) -> torch.Tensor:
    """What a run wrote, logical: a GEMM's D, an attention's O."""
    if is_attention(case.spec):
        return run.outputs["o"]
    return from_storage(run.outputs["d"], case.spec.d_major)


def knobs_timeout() -> float:
    from harness import knobs as harness_knobs

    return float(harness_knobs.get("ORACLE_KERNEL_TIMEOUT_S"))


def complement(pattern: int) -> int:
    """The second poison pattern: every bit of the first flipped."""
    return (~pattern) & 0xFFFFFFFF


def parse_pattern(text) -> int:
    """A 32-bit shared-memory poison word: an int, or a string in decimal or 0x hex."""
    if isinstance(text, bool):
        raise ValueError(f"smem poison {text!r} must be a 32-bit word such as 0xFFFFFFFF")
    try:
        v = text if isinstance(text, int) else int(str(text).strip(), 0)
    except ValueError:
        raise ValueError(f"smem poison {text!r} must be a 32-bit word such as 0xFFFFFFFF or 0x7F800001") from None
    if not 0 <= v <= 0xFFFFFFFF:
        raise ValueError(f"smem poison {text!r} must be a 32-bit word (0 to 0xFFFFFFFF)")
    return v

"""The whole differential: every stage's references run on the recording, in pipeline order, then
the first divergence and what the report may claim about it.

descriptor -> load -> (dequant, for a quantised A or B) -> (scale_a, scale_b, for block scales) -> mma -> epilogue sub-steps -> store, each compared
teacher-forced (fed with
the kernel's own upstream tap) and chained (fed with the reference pipeline); the Triton
references are cross-checked against their float64 host specs on a few tiles of every run.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

import torch

from harness.taps import pipeline
from kernels_ref.dtypes import DTYPES
from oracle import knobs
from oracle.judging.diagnose import Diagnosis, Kind, Verdict, first_divergence
from oracle.judging.differential.context import Context, StageResult
from oracle.judging.differential.cross_check import start_cross_check
from oracle.judging.differential.dequant import dequant_stage
from oracle.judging.differential.epilogue import epilogue_stages, reference_accumulation, reference_chain, steps_of
from oracle.judging.differential.groups import (GroupOutcome, deciding, empty_k_group_hint, group_recordings,
                                               scale_peers)
from oracle.judging.differential.findings import (FirstDivergence, NonFinite, first_finding, first_nonfinite, mixing_confound,
                                              trace_confounds, unobserved, untapped_tiles)
from oracle.judging.differential.judge import StageNotes, fold_notes
from oracle.judging.differential.mma import mma_stage
from oracle.judging.differential.out_of_bounds import ordered, out_of_bounds_finding
from oracle.judging.differential.operands import descriptor_stage, load_stage
from oracle.judging.differential.reduce import reduce_stage
from oracle.judging.differential.scales import scale_stage
from oracle.problem.partition import describe_partitions
from oracle.run.caller import Option
from oracle.run.recording import Recording, RecordingError
from oracle.run.confounds import Confound, ConfoundKind


@dataclass(frozen=True)
class Analysis:
    recording: Recording
    stages: tuple[StageResult, ...]
    cross_check: tuple[str, ...]  # disagreements between Triton references and host specs
    diagnosis: Diagnosis
    kind: Kind
    open_confounds: tuple[Confound, ...]  # oracle.run.confounds
    handled_confounds: tuple[Confound, ...]
    first: Optional[FirstDivergence]
    first_nonfinite: Optional[NonFinite]
    device: str
    unobserved: tuple[str, ...] = ()  # what the run did not see (stages without taps, stand-ins, tiles)
    group: Optional[int] = None  # a grouped or batched run: the group these stages are of
    groups: tuple = ()  # a grouped or batched run: every group's outcome (oracle.judging.differential.groups)
    whole: Optional[Recording] = None  # a grouped or batched run: the recording of the whole run
    partition: Optional[str] = None  # a split problem: the rule the taps' partitions follow (oracle.problem.partition)
    assumed: tuple[str, ...] = ()  # partition boundaries the declared rule placed over untraced k-blocks
    phases: tuple[tuple[str, float], ...] = ()  # wall milliseconds per phase of the run (_Clock)
    out_of_bounds: tuple = ()  # harness.guard_bands.GuardBreach: bytes written outside D or another output

    @property
    def verdict(self) -> Verdict:
        return self.diagnosis.verdict

    @property
    def incomplete_trace(self) -> tuple[Confound, ...]:
        """The open confounds of an overflowed or torn trace."""
        return tuple(c for c in self.open_confounds if c.incomplete_trace)


def reference_device() -> torch.device:
    want = knobs.DEVICE.get()
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def analyze(rec: Recording, device: Optional[torch.device] = None) -> Analysis:
    rec.validate()
    if rec.spec.group_sizes is not None:
        return _analyze_groups(rec, device)
    an = _analyze_one(rec, device)
    return dataclasses.replace(an, unobserved=an.unobserved + _untapped_notes(untapped_tiles(rec)))


def _untapped_notes(silent: dict) -> tuple[str, ...]:
    """What the unobserved list says of selected tiles no tap came from (findings.untapped_tiles)."""
    return tuple(u.note(g) for g, u in silent.items())


def _analyze_groups(rec: Recording, device) -> Analysis:
    parts = group_recordings(rec)
    judged = [(g, o, _empty_k_group(rec, g, _analyze_one(sub, device, scale_peers(rec, g))))
              for g, o, sub in parts if sub is not None]
    if not judged:
        raise RecordingError(f"every group of {rec.spec.describe()} is empty: there is nothing to judge")
    outcomes = []
    koffs = rec.spec.k_offsets
    silent = untapped_tiles(rec)
    for g, o, sub in parts:
        an = next((a for gg, _, a in judged if gg == g), None)
        outcomes.append(GroupOutcome(g, o, rec.spec.group_sizes[g], None if an is None else an.verdict,
                                     an.first.stage if an is not None and an.first else None,
                                     an.first.kind.value if an is not None and an.first else None,
                                     None if koffs is None else (koffs[g], rec.spec.k_groups[g]),
                                     g in silent and silent[g].group_silent))
    g, _, an = judged[deciding([a for _, _, a in judged])]
    first = dataclasses.replace(an.first, group=g) if an.first is not None else None
    phases: dict[str, float] = {}
    for _, _, a in judged:  # the whole run's: every group's phases summed
        for name, ms in a.phases:
            phases[name] = phases.get(name, 0.0) + ms
    return dataclasses.replace(an, group=g, groups=tuple(outcomes), whole=rec, first=first,
                               phases=tuple(phases.items()),
                               unobserved=an.unobserved + _untapped_notes(silent))


def _empty_k_group(rec: Recording, g: int, an: Analysis) -> Analysis:
    """An empty group of a K-grouped problem: its divergence says what D must be (groups.empty_k_group_hint)."""
    spec = rec.spec
    if spec.k_groups is None or spec.k_groups[g] != 0:
        return an
    if an.verdict is Verdict.MISTRUSTED and an.first is None:  # a zero reference is what an empty group must give
        return dataclasses.replace(an, diagnosis=dataclasses.replace(
            an.diagnosis, verdict=Verdict.MATCH, reason=f"group {g} has K = 0 and its D is zero, the epilogue of a "
                                                        f"zero accumulator without C or bias"))
    if an.first is None:
        return an
    hint = empty_k_group_hint(spec, g, an.first.element)
    if an.first.hint:
        hint += f"; {an.first.hint}"
    # the group runs no k-block: a trace would show nothing the stored D does not (no trace advice)
    missing = tuple(m for m in an.first.missing
                    if not any(isinstance(p, Option) and p.name.startswith("trace") for p in m.parts))
    return dataclasses.replace(an, first=dataclasses.replace(an.first, hint=hint, missing=missing, rerun=None))


class _Clock:
    """Wall time of each phase of one analysis, in ms, with no synchronisation between phases: each
    boundary notes the host clock and, on a GPU, records an event; `phases` synchronises once, on
    the last event, and a phase ends when both its host work and the device work queued up to its
    boundary are done (the device work queued before the analysis is waited for at the start, so
    it counts in no phase). `compare` is the time inside the stages' comparisons (StageNotes.compare_s),
    a part of the stages' phases."""

    def __init__(self, dev: torch.device):
        self.marks: list[tuple[str, float, Optional[torch.cuda.Event]]] = []
        self.start = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            self.stream = torch.cuda.current_stream(dev)
            self.start = self._event()
        self.t = time.perf_counter()

    def _event(self) -> "torch.cuda.Event":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        return ev

    def lap(self, name: str) -> None:
        ev = self._event() if self.start is not None else None
        self.marks.append((name, time.perf_counter() - self.t, ev))

    def phases(self, compare_s: float) -> tuple[tuple[str, float], ...]:
        if self.start is not None and self.marks:
            self.marks[-1][2].synchronize()
        out, prev = [], 0.0
        for name, host_s, ev in self.marks:
            end = host_s if ev is None else max(host_s, self.start.elapsed_time(ev) * 1e-3)
            end = max(end, prev)
            out.append((name, (end - prev) * 1e3))
            prev = end
        return tuple(out) + (("compare", compare_s * 1e3),)


def _analyze_one(rec: Recording, device: Optional[torch.device] = None, peers=None) -> Analysis:
    spec = rec.spec
    dev = device or reference_device()
    clock = _Clock(dev)
    ctx = Context.of(rec, dev, peers)
    clock.lap("context")
    if rec.kernel_error is not None and rec.output is None and not rec.taps:
        diag = first_divergence([], kernel_error=True)
        incomplete = tuple(trace_confounds(ctx))
        return Analysis(rec, (), (), diag, Kind.DRAFT, incomplete, (), None, None, str(dev))

    tapped = sorted(ctx.taps.traced_tiles)
    n_check = knobs.CROSS_CHECK_TILES.get()
    sample = tapped[:n_check] or sorted({(0, 0), (spec.tiles_m - 1, spec.tiles_n - 1)})[:n_check]
    # The whole-output references are queued first: the GPU runs them while the host queues the rest.
    accumulation = reference_accumulation(ctx)
    clock.lap("reference_gemm")
    chain = reference_chain(ctx, accumulation)
    clock.lap("reference_chain")
    pending = start_cross_check(ctx, sample)  # its host side overlaps the stages
    try:
        pending.watch_accumulator(accumulation[0])  # the accumulator the verdict reads, on the checked tiles
        clock.lap("cross_check")
        stages, notes = _stages(ctx, clock, chain)
        cross = tuple(pending.result())
        clock.lap("cross_check_host")
    finally:
        pending.close()

    diag = first_divergence([s.outcome for s in stages], kernel_error=rec.kernel_error is not None,
                            references_trusted=not cross, traced_tiles=ctx.taps.traced_tiles)
    handled = ()
    if notes.padding:
        per = ", ".join(f"{stage} {n}" for stage, n in notes.padding)
        handled = (Confound.of(ConfoundKind.PADDING, m=spec.m, n=spec.n, by_stage=per),)
    open_conf = list(rec.confounds)
    if not rec.provenance.controlled:
        open_conf.append(Confound.of(ConfoundKind.UNCONTROLLED_INPUTS, provenance=rec.provenance.describe()))
    open_conf.extend(mixing_confound(ctx))
    incomplete = tuple(trace_confounds(ctx))
    open_conf.extend(incomplete)
    open_conf.extend(notes.confounds)  # noticed by the tap index and the stages: taps that break an assumption
    partition = describe_partitions(spec, ctx.geo.partitions)
    if partition is not None:
        handled += (Confound.of(ConfoundKind.PARTITION, rule=partition),)
    first, kind = first_finding(ctx, stages, diag, confounds=open_conf)
    breach = out_of_bounds_finding(rec.guard_breaches, diag, inputs_controlled=rec.provenance.controlled,
                                   confounds=open_conf)
    if breach is not None:  # the stage table saw nothing wrong, the guard bands did
        diag, first, kind = breach
    if first is not None:  # the finding's own assumptions are open confounds of the run's report
        assumed = (Confound.of(ConfoundKind.ASSUMED_BOUNDARY, "mma", boundary=a) for a in first.assumed)
        open_conf.extend(c for c in assumed if c not in open_conf)
    nonfinite, missing = first_nonfinite(stages), tuple(unobserved(ctx, stages))
    clock.lap("findings")
    return Analysis(rec, tuple(stages), cross, diag, kind, tuple(open_conf), handled, first, nonfinite,
                    str(dev), missing, partition=partition, assumed=ctx.geo.partition_assumptions,
                    phases=clock.phases(notes.compare_s), out_of_bounds=ordered(rec.guard_breaches))


def _stages(ctx: Context, clock: _Clock, chain: dict) -> tuple[list[StageResult], StageNotes]:
    """Every stage's result, in the pipeline's order, and their notes folded in that order (after
    what the tap index found in the records); `chain` is the whole output's reference pipeline
    (reference_chain's)."""
    spec = ctx.geo.spec
    done = [descriptor_stage(ctx, op) for op in ("a", "b")]
    done += [load_stage(ctx, op) for op in ("a", "b")]
    done += [dequant_stage(ctx, op) for op in spec.dequant_operands]
    done += [scale_stage(ctx, op) for op in (("a", "b") if spec.block_scaled else ())]
    clock.lap("descriptor_load")
    mma_result, mma_notes, finals = mma_stage(ctx.geo, ctx.taps, ctx.ops)
    reduce_result, reduce_notes, sources = reduce_stage(ctx, finals)
    done += [(mma_result, mma_notes), (reduce_result, reduce_notes)]
    clock.lap("mma_reduce")
    epilogue, epilogue_notes = epilogue_stages(ctx, chain, sources)
    clock.lap("epilogue_store")
    stages = [result for result, _ in done] + epilogue
    notes = fold_notes([StageNotes(ctx.taps.confounds)] + [n for _, n in done] + [epilogue_notes])
    assert [s.name for s in stages] == list(pipeline(steps_of(spec), spec.dequant_operands, spec.block_scaled)), \
        "stage order drifted from harness.taps.pipeline"
    return stages, notes


def expected_output(spec, operands, device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference D of the whole problem and its per-element bound: what epilogue_store's chained
    comparison holds the output to. D is in the output dtype where the bound is zero everywhere
    (bit-exact), else float32; the bound is float64 (0 = bit-exact). A grouped or batched problem's
    D is every group's, each judged as its own GEMM (oracle.judging.differential.groups), rows in order."""
    from oracle.run.inputs import Provenance

    rec = Recording(spec=spec, operands=operands, output=None, provenance=Provenance("captured"),
                    kernel_error="none: a reference-only recording")
    rec.validate()
    if spec.group_sizes is not None:
        parts = [expected_output(sub.spec, sub.operands, device) for _, _, sub in group_recordings(rec)
                 if sub is not None]
        exact = all(bool((b == 0).all()) for _, b in parts)
        ys = [y if exact else y.float() for y, _ in parts]
        return torch.cat(ys), torch.cat([b for _, b in parts])
    ctx = Context.of(rec, device or reference_device())
    y, b = reference_chain(ctx)["cast"]
    exact = bool((b == 0).all())
    return (y.to(DTYPES[spec.out_dtype].torch) if exact else y.float()), b

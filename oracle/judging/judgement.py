"""The judge step of the one path: RunOutcome -> Judgement.

The recording is analysed stage by stage (oracle.judging.differential); a run made for races has
its runs compared bit for bit (oracle.judging.repeat), with the stage finding of every traced run
that differs from run 1 where it is not run 1's. The one final verdict and kind are composed here
and nowhere else: NONDETERMINISTIC when the runs differ (the stage finding then told as a DRAFT),
else the stage table's. Renderers (oracle.report) print a Judgement; they never recompute it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

from oracle.judging.diagnose import EXIT_CODES, Kind, Verdict
from oracle.judging.repeat import RepeatResult, as_draft, compare_runs, finding_of

MAX_OTHER_FINDINGS = 4  # traced runs beyond run 1 whose own stage finding is judged


@dataclass(frozen=True)
class Judgement:
    """Everything a report tells: `analysis` (the stage table as told: a DRAFT when the runs
    differ), `stage_analysis` (run 1's as judged), the race comparison, the sanitizer's report,
    the timings, the run of the kernel, where the recording came from, the seconds of each phase,
    and the one final `verdict` and `kind`."""

    analysis: object  # oracle.judging.differential.Analysis, as told
    stage_analysis: object  # the same before a race made it a DRAFT
    verdict: Verdict
    races: Optional[RepeatResult] = None
    sanitizer: Optional[object] = None  # harness.sanitizer.SanitizerReport
    performance: Optional[object] = None  # oracle.run.perf.Performance
    kernel_run: Optional[object] = None  # oracle.run.execute.KernelRunInfo
    source: str = ""
    phases_s: dict = field(default_factory=dict)
    notices: tuple[str, ...] = ()

    @property
    def kind(self) -> Optional[Kind]:
        return self.analysis.kind

    @property
    def first(self):
        """The first divergence as told (None when nothing diverged)."""
        return self.analysis.first

    @property
    def recording(self):
        """The recording judged (the whole of a grouped run, whose stages are one group's)."""
        return self.analysis.whole or self.analysis.recording

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.MATCH

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def final_verdict(analysis, races: Optional[RepeatResult]) -> Verdict:
    """NONDETERMINISTIC when the runs differ; otherwise the stage table's verdict."""
    if races is not None and races.nondeterministic:
        return Verdict.NONDETERMINISTIC
    return analysis.verdict


def judge(outcome) -> Judgement:
    """Judge what a request's run gave (oracle.run.execute.RunOutcome): a GEMM recording through
    oracle.judging.differential, an attention one (problem kind "attention") through
    oracle.judging.attention_analysis; both give the same Analysis type."""
    t0 = time.perf_counter()
    analyze = _analysis_of(getattr(outcome.recording.spec, "kind", "gemm"))
    an = analyze(outcome.recording)
    runs, races, sanitizer = outcome.races, None, None
    if runs is not None:
        sanitizer = runs.sanitizer
        if outcome.request.races:
            races = compare_runs(runs.traced, runs.untraced, poisoned=runs.poisoned, poison=runs.poison,
                                 poison_note=runs.poison_note, failed=runs.failed)
            races = replace(races, finding_runs=_other_findings(an, races, runs.traced, analyze))
    phases = dict(outcome.phases_s, analyze=time.perf_counter() - t0)
    return judgement_of(an, races, sanitizer, performance=outcome.performance, kernel_run=outcome.kernel_run,
                        source=outcome.source, phases_s=phases, notices=outcome.notices)


def _analysis_of(kind: str):
    """The stage-by-stage analysis of a problem kind."""
    if kind == "attention":  # the attention chain's stages
        from oracle.judging.attention_analysis import analyze_attention

        return analyze_attention
    from oracle.judging.differential import analyze

    return analyze


def judgement_of(analysis, races: Optional[RepeatResult] = None, sanitizer=None, **told) -> Judgement:
    """The one composition of a final verdict and kind: an analysis, the race comparison and the
    sanitizer's report (and what else the judgement carries, `told`)."""
    drafted = as_draft(analysis, races) if races is not None else analysis
    return Judgement(drafted, analysis, final_verdict(analysis, races), races, sanitizer, **told)


def _other_findings(an, races: RepeatResult, traced, analyze) -> tuple[tuple[str, str], ...]:
    """The stage finding of each traced run that differs from run 1, where it is not run 1's."""
    mine = finding_of(an)
    runs = []
    for i in races.differing_traced[:MAX_OTHER_FINDINGS]:
        other = finding_of(analyze(traced[i - 1]))
        if other != mine:
            runs.append((f"traced run {i}", other))
    if runs:
        runs.insert(0, ("traced run 1", mine))
    return tuple(runs)

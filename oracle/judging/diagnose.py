"""Verdicts, and the first divergent stage as a pure function of per-stage outcomes.

For each stage S (pipeline order) there are two comparisons:
- teacher-forced: S's reference fed with the kernel's OWN tap of the stage before it;
- chained: S's reference fed with the reference output of the stage before it.

| teacher-forced | chained  | meaning                                        |
|----------------|----------|------------------------------------------------|
| MATCH          | MATCH    | S is right                                     |
| MISMATCH       | any      | S itself is wrong: root cause                  |
| MATCH          | MISMATCH | S is right but inherited bad input             |
| NOT_RUN        | MISMATCH | wrong at S or upstream: no tap to tell (draft) |

Per tile: a downstream stage "inherited" the error only where it fails in a tile where the root
cause failed too; a stage that fails in tiles nothing was traced in is named with those tiles
(`Diagnosis.untraced`), never called inherited.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import AbstractSet, Optional, Sequence

from oracle.judging.compare import Status
from oracle.run.confounds import Confound


class Verdict(str, enum.Enum):
    MATCH = "MATCH"
    DIVERGED = "DIVERGED"
    MISTRUSTED = "MISTRUSTED"
    KERNEL_ERROR = "KERNEL_ERROR"
    ORACLE_UNTRUSTED = "ORACLE_UNTRUSTED"
    NONDETERMINISTIC = "NONDETERMINISTIC"  # runs on the same inputs differ (oracle.judging.repeat): a race, not a stage


class Kind(str, enum.Enum):
    VERDICT = "VERDICT"  # controlled inputs, taps free of confounds, teacher-forced root cause
    DRAFT = "DRAFT"  # confounded inputs or taps, or a localisation without an upstream tap


EXIT_CODES = {Verdict.MATCH: 0, Verdict.DIVERGED: 1, Verdict.KERNEL_ERROR: 3, Verdict.ORACLE_UNTRUSTED: 4,
              Verdict.MISTRUSTED: 5, Verdict.NONDETERMINISTIC: 6}
EXIT_USAGE = 2
EXIT_NO_GPU = 7  # a live run asked for on a machine with no visible CUDA GPU (harness.errors.NoGpuError)


Tiles = AbstractSet[tuple[int, int]]


@dataclass(frozen=True)
class StageOutcome:
    """A stage's two statuses and, where known, the tiles behind them (None: not known)."""

    name: str
    teacher_forced: Status
    chained: Status
    forced_bad_tiles: Optional[Tiles] = None  # tiles whose teacher-forced comparison failed
    chained_bad_tiles: Optional[Tiles] = None  # tiles whose chained comparison failed


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    stage: Optional[str] = None  # the first divergent stage
    root_cause: bool = False  # True: its teacher-forced comparison failed
    reason: str = ""
    inherited: tuple[str, ...] = ()  # downstream stages that only inherited the error
    untraced: tuple[tuple[int, int], ...] = ()  # failing tiles of `stage` in which nothing was traced
    unexplained: tuple[tuple[int, int], ...] = ()  # downstream failing tiles the root cause does not cover


def first_divergence(outcomes: Sequence[StageOutcome], *, kernel_error: bool = False,
                     references_trusted: bool = True, traced_tiles: Optional[Tiles] = None) -> Diagnosis:
    """Judge a run from its stage outcomes (in pipeline order). `traced_tiles`: the tiles in which
    the kernel recorded any tap (None: not known)."""
    if kernel_error:
        return Diagnosis(Verdict.KERNEL_ERROR, reason="the kernel did not complete")
    if not references_trusted:
        return Diagnosis(Verdict.ORACLE_UNTRUSTED,
                         reason="the Triton references disagree with the float64 host specs")
    names = [o.name for o in outcomes]
    for i, o in enumerate(outcomes):
        if o.teacher_forced is Status.MISMATCH:
            root_tiles = None
            if o.forced_bad_tiles is not None:
                root_tiles = set(o.forced_bad_tiles) | set(o.chained_bad_tiles or ())
            inherited, unexplained = [], set()
            for x in outcomes[i + 1:]:
                if x.chained is not Status.MISMATCH or x.teacher_forced is Status.MISMATCH:
                    continue
                if root_tiles is None or x.chained_bad_tiles is None:
                    inherited.append(x.name)
                    continue
                if set(x.chained_bad_tiles) & root_tiles:
                    inherited.append(x.name)
                unexplained |= set(x.chained_bad_tiles) - root_tiles
            return Diagnosis(Verdict.DIVERGED, o.name, True,
                             f"{o.name} fed with the kernel's own upstream values already disagrees", tuple(inherited),
                             unexplained=tuple(sorted(unexplained)))
    for i, o in enumerate(outcomes):
        if o.chained is Status.MISMATCH:
            untraced = ()
            if o.chained_bad_tiles is not None and traced_tiles is not None:
                untraced = tuple(sorted(set(o.chained_bad_tiles) - set(traced_tiles)))
            if untraced:
                traced_bad = sorted(set(o.chained_bad_tiles) - set(untraced))
                also = ""
                if traced_bad:
                    why = ("it is right on the kernel's own upstream taps there" if o.teacher_forced is Status.MATCH
                           else "no upstream tap tells why")
                    also = f"; it also diverges in traced tile(s) {', '.join(map(str, traced_bad))}, where {why}"
                return Diagnosis(Verdict.DIVERGED, o.name, False,
                                 f"{o.name} diverges in tile(s) {', '.join(map(str, untraced[:4]))}"
                                 f"{' and others' if len(untraced) > 4 else ''} where nothing was traced: which stage "
                                 f"goes wrong there was not observed{also}", untraced=untraced)
            if o.teacher_forced is Status.MATCH:
                untapped = [x.name for x in outcomes[:i] if x.teacher_forced is Status.NOT_RUN]
                where = f"upstream of {o.name} ({', '.join(untapped)} untapped)" if untapped else \
                    f"upstream of {o.name}"
                return Diagnosis(Verdict.DIVERGED, o.name, False,
                                 f"{o.name} is right on the kernel's own inputs but inherited an error from {where}")
            return Diagnosis(Verdict.DIVERGED, o.name, False,
                             f"{o.name} or a stage before it without taps diverges (no upstream tap to tell)")
    compared = [o for o in outcomes if Status.MATCH in (o.teacher_forced, o.chained)]
    if not compared:
        trivial = [o.name for o in outcomes if Status.MISTRUSTED in (o.teacher_forced, o.chained)]
        reason = (f"nothing could discriminate: {', '.join(trivial)} had trivially zero references"
                  if trivial else "no stage could be compared")
        return Diagnosis(Verdict.MISTRUSTED, reason=reason)
    last = outcomes[-1] if outcomes else None
    if last is not None and last.name == names[-1] and Status.MISTRUSTED in (last.chained, last.teacher_forced) \
            and Status.MATCH not in (last.chained, last.teacher_forced):
        return Diagnosis(Verdict.MISTRUSTED, reason=f"the output is trivially right ({last.name}: reference all zero)")
    return Diagnosis(Verdict.MATCH, reason="every compared stage is within its bound")


def evidence_kind(diagnosis: Diagnosis, *, inputs_controlled: bool, confounds: Sequence[Confound],
                  stand_ins: Sequence = ()) -> Kind:
    """VERDICT only for a teacher-forced root cause on controlled inputs with no open confound,
    whose comparison was fed by the kernel's own taps or global memory (no stand-in)."""
    if diagnosis.root_cause and inputs_controlled and not confounds and not stand_ins:
        return Kind.VERDICT
    return Kind.DRAFT

"""Races told apart from defects: runs of one kernel on the same inputs, compared bit for bit.

Data path: the traced runs' recordings (output and taps), the untraced build's outputs and the
shared-memory poison runs' outputs -> compare_runs -> RepeatResult: which runs differ, in which
stage, tiles and elements; whether tracing changes the result (the untraced output differs from
the traced one's); whether the output depends on shared memory the kernel never wrote (two poison
patterns, two outputs). A result whose runs differ is NONDETERMINISTIC; a stage finding then does
not repeat and is a DRAFT at most (oracle.report.table says so).

Constraints: pure functions of tensors; nothing here runs a kernel (oracle.run.live does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch

from oracle.judging.comparison import bit_patterns
from oracle.run.confounds import Confound, ConfoundKind

MAX_ELEMENTS_SHOWN = 8


@dataclass(frozen=True)
class RunChange:
    """Where two runs differ: `what` is "output" or a tap stage; `between` names the two runs."""

    what: str
    between: tuple[str, str]
    elements: int  # elements whose bits differ (a tap present in one run only counts all of its)
    compared: int
    tiles: tuple[tuple[int, int], ...]
    first: tuple[tuple[int, int], ...] = ()  # the first elements (row, col; in the tile for a tap)
    k_blocks: tuple[int, ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if len(self.between) != 2 or not all(isinstance(x, str) and x for x in self.between):
            raise ValueError(f"RunChange.between {self.between!r} must name two runs")
        if self.elements < 0 or self.compared < 0:
            raise ValueError(f"RunChange counts must be >= 0, got {self.elements}/{self.compared}")

    def describe(self) -> str:
        tiles = ", ".join(map(str, self.tiles[:4])) + (" and others" if len(self.tiles) > 4 else "")
        kbs = f", k-block(s) {', '.join(map(str, self.k_blocks[:6]))}" if self.k_blocks else ""
        first = f"; first at {', '.join(map(str, self.first[:3]))}" if self.first else ""
        note = f" ({self.note})" if self.note else ""
        return (f"{self.what}: {self.between[0]} vs {self.between[1]}: {self.elements} of {self.compared} elements "
                f"differ in tile(s) {tiles}{kbs}{first}{note}")

    def to_json(self) -> dict:
        return {"what": self.what, "between": list(self.between), "elements": self.elements,
                "compared": self.compared, "tiles": [list(t) for t in self.tiles],
                "first": [list(e) for e in self.first], "k_blocks": list(self.k_blocks), "note": self.note}


@dataclass(frozen=True)
class RepeatResult:
    """The repeated runs: how many of each build, and every difference found between them."""

    traced_runs: int
    untraced_runs: int
    changes: tuple[RunChange, ...] = ()  # traced vs traced and untraced vs untraced
    tracing_changes: tuple[RunChange, ...] = ()  # untraced output vs the first traced output
    poison: Optional[tuple[int, int]] = None  # the two shared-memory patterns, when poison ran
    poison_changes: tuple[RunChange, ...] = ()  # the outputs of the two patterns
    poison_note: str = ""  # why poison was not (or not fully) applied
    failed: tuple[str, ...] = ()  # runs that did not complete (a run that fails once in N is a symptom too)
    finding_runs: tuple[tuple[str, str], ...] = ()  # (run, its verdict and stage) where they disagree
    differing_traced: tuple[int, ...] = ()  # the traced runs (2, 3, ...) whose output or taps differ from run 1

    def __post_init__(self) -> None:
        if self.traced_runs < 1 or self.untraced_runs < 0:
            raise ValueError(f"RepeatResult: {self.traced_runs} traced / {self.untraced_runs} untraced runs")

    @property
    def nondeterministic(self) -> bool:
        return bool(self.changes or self.tracing_changes or self.poison_changes or self.failed)

    def first_difference(self) -> str:
        """Where the runs first differ, earliest stage first: the stage (or the output), the two
        runs, the tile, the k-block and the element; "" when they agree."""
        from harness.taps import ALL_STAGES, stage_rank

        found = self.changes + self.tracing_changes + self.poison_changes
        if not found:
            return ""
        c = min(found, key=lambda c: stage_rank(c.what) if c.what in ALL_STAGES else len(ALL_STAGES))
        where = f"{c.what} between {c.between[0]} and {c.between[1]}"
        if c.tiles:
            where += f", tile {c.tiles[0]}"
        if c.k_blocks:
            where += f", k-block {c.k_blocks[0]}"
        if c.first:
            where += f", element {c.first[0]}" + (" in the tile" if c.what != "output" else "")
        return where

    def reasons(self) -> list[str]:
        out = []
        if self.changes:
            stages = sorted({c.what for c in self.changes})
            out.append(f"repeated runs on the same inputs differ ({', '.join(stages)})")
        if self.tracing_changes:
            out.append("tracing changes the result: the untraced build's output differs from the traced one's "
                       "(a serialising tap may hide a race)")
        if self.poison_changes:
            out.append("the output depends on the initial contents of shared memory (two poison patterns, two "
                       "outputs): the kernel reads shared memory it never wrote")
        if self.failed:
            out.append(f"run(s) {', '.join(self.failed)} did not complete while others did")
        return out

    def to_json(self) -> dict:
        return {"traced_runs": self.traced_runs, "untraced_runs": self.untraced_runs,
                "nondeterministic": self.nondeterministic, "tracing_changes_result": bool(self.tracing_changes),
                "changes": [c.to_json() for c in self.changes],
                "tracing_changes": [c.to_json() for c in self.tracing_changes],
                "poison": None if self.poison is None else {
                    "patterns": [f"{p:#010x}" for p in self.poison],
                    "changes": [c.to_json() for c in self.poison_changes], "note": self.poison_note},
                "failed": list(self.failed), "finding_runs": [list(x) for x in self.finding_runs],
                "reasons": self.reasons()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers (so NaN == NaN of the same bits, -0 != +0)."""
    return bit_patterns(t.detach().cpu())


def diff_output(a: Optional[torch.Tensor], b: Optional[torch.Tensor], block: tuple[int, int],
                between: tuple[str, str]) -> Optional[RunChange]:
    """The output elements (row, col of D) whose bits differ, by output tile; None when equal."""
    if a is None or b is None:
        if a is None and b is None:
            return None
        return RunChange("output", between, 0, 0, (), note="one run has no output")
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return RunChange("output", between, a.numel(), a.numel(), (), note=f"shape/dtype {tuple(a.shape)} "
                         f"{a.dtype} vs {tuple(b.shape)} {b.dtype}")
    bad = _bits(a) != _bits(b)
    if bad.dim() == 3:  # a batch: flatten the batch into rows
        bad = bad.reshape(-1, bad.shape[-1])
    if not bool(bad.any()):
        return None
    idx = bad.nonzero()
    bm, bn = block
    tiles = tuple(sorted({(int(r) // bm, int(c) // bn) for r, c in idx.tolist()}))
    first = tuple((int(r), int(c)) for r, c in idx[:MAX_ELEMENTS_SHOWN].tolist())
    return RunChange("output", between, int(bad.sum()), bad.numel(), tiles, first)


def _tap_key(t) -> tuple:
    return (t.stage, tuple(t.tile), t.k_block, t.partial, t.group, t.slot)


def diff_taps(a: Sequence, b: Sequence, between: tuple[str, str]) -> list[RunChange]:
    """Per stage: the tapped elements whose bits differ between two runs' taps (taps matched by
    stage, tile, k-block, partial, group and slot; a tap only one run made counts whole)."""
    left: dict = {}
    for t in a:
        left.setdefault(_tap_key(t), []).append(t)
    right: dict = {}
    for t in b:
        right.setdefault(_tap_key(t), []).append(t)
    per_stage: dict[str, dict] = {}
    for key in sorted(set(left) | set(right), key=repr):
        stage = key[0]
        acc = per_stage.setdefault(stage, {"elements": 0, "compared": 0, "tiles": set(), "kbs": set(), "first": [],
                                           "unmatched": 0})
        la, rb = left.get(key, []), right.get(key, [])
        for i in range(max(len(la), len(rb))):
            x = la[i] if i < len(la) else None
            y = rb[i] if i < len(rb) else None
            if x is None or y is None or tuple(x.values.shape) != tuple(y.values.shape):
                n = (x or y).values.numel()
                acc["elements"] += n
                acc["compared"] += n
                acc["unmatched"] += 1
                acc["tiles"].add(key[1])
                if key[2] is not None:
                    acc["kbs"].add(key[2])
                continue
            bad = _bits(x.values) != _bits(y.values)
            for m in (x.mask, y.mask):  # elements a run did not record are not compared
                if m is not None:
                    bad = bad & m.to(torch.bool).reshape(bad.shape)
            acc["compared"] += bad.numel()
            n = int(bad.sum())
            if n:
                acc["elements"] += n
                acc["tiles"].add(key[1])
                if key[2] is not None:
                    acc["kbs"].add(key[2])
                if len(acc["first"]) < MAX_ELEMENTS_SHOWN:
                    acc["first"].extend(tuple(int(v) for v in e) for e in bad.nonzero()[:MAX_ELEMENTS_SHOWN].tolist())
    out = []
    for stage, acc in per_stage.items():
        if acc["elements"]:
            note = f"{acc['unmatched']} tap(s) in one run only" if acc["unmatched"] else ""
            out.append(RunChange(stage, between, acc["elements"], acc["compared"], tuple(sorted(acc["tiles"])),
                                 tuple(acc["first"][:MAX_ELEMENTS_SHOWN]), tuple(sorted(acc["kbs"])), note))
    return out


def output_view(spec):
    """How runs' outputs are compared: the block that names an output tile, and the view of an output
    as a matrix. A GEMM's D as it is; an attention's O as rows of queries, each sequence padded to
    whole query blocks (so an output tile is (batch x q_blocks + query block, query head)), and
    columns head x head_dim_v + column."""
    if getattr(spec, "kind", "gemm") != "attention":
        return (spec.tile.bm, spec.tile.bn), (lambda t: t)

    def view(o):
        if o is None:
            return None
        rows = spec.q_blocks * spec.block_q
        seqs = list(o) if not spec.varlen_q else list(torch.split(o, list(spec.lengths_q)))
        out = o.new_zeros((len(seqs) * rows, spec.heads_q * spec.head_dim_v))
        for b, seq in enumerate(seqs):
            out[b * rows:b * rows + seq.shape[0]] = seq.reshape(seq.shape[0], -1)
        return out

    return (spec.block_q, spec.head_dim_v), view


def compare_runs(traced: Sequence, untraced: Sequence[Optional[torch.Tensor]] = (), *,
                 poisoned: Sequence[Optional[torch.Tensor]] = (), poison: Optional[tuple[int, int]] = None,
                 poison_note: str = "", failed: Sequence[str] = (),
                 finding_runs: Sequence[tuple[str, str]] = ()) -> RepeatResult:
    """`traced`: the traced runs' recordings (output and taps), the first is the one judged;
    `untraced`: the untraced build's outputs (D as the kernel stored it, logical [M, N]);
    `poisoned`: the outputs of the two poison patterns. Every traced run is compared with the
    first, every untraced one with the first untraced one, and the first untraced with the first
    traced output (tracing changes the result)."""
    if not traced:
        raise ValueError("compare_runs needs at least one traced run")
    first = traced[0]
    block, view = output_view(first.spec)
    traced = [replace(r, output=view(r.output)) for r in traced]
    untraced, poisoned = [view(t) for t in untraced], [view(t) for t in poisoned]
    first = traced[0]
    changes: list[RunChange] = []
    differing: list[int] = []
    for i, rec in enumerate(traced[1:], start=2):
        between = ("traced run 1", f"traced run {i}")
        d = diff_output(first.output, rec.output, block, between)
        found = ([d] if d is not None else []) + diff_taps(first.taps, rec.taps, between)
        changes.extend(found)
        if found:
            differing.append(i)
    tracing: list[RunChange] = []
    if untraced:
        for i, out in enumerate(untraced[1:], start=2):
            d = diff_output(untraced[0], out, block, ("untraced run 1", f"untraced run {i}"))
            if d is not None:
                changes.append(d)
        d = diff_output(first.output, untraced[0], block, ("traced run 1", "untraced run 1"))
        if d is not None:
            tracing.append(d)
    poison_changes: list[RunChange] = []
    if len(poisoned) == 2 and poison is not None:
        d = diff_output(poisoned[0], poisoned[1], block, (f"poison {poison[0]:#010x}", f"poison {poison[1]:#010x}"))
        if d is not None:
            poison_changes.append(d)
    return RepeatResult(len(traced), len(untraced), tuple(changes), tuple(tracing), poison, tuple(poison_changes),
                        poison_note, tuple(failed), tuple(finding_runs), tuple(differing))


def as_draft(an, result: RepeatResult):
    """The analysis of run 1 as the report tells it when the runs differ: its stage finding a
    DRAFT whose reason is that it does not repeat (the verdict stays the stage table's)."""
    from dataclasses import replace

    from oracle.judging.diagnose import Kind

    if not result.nondeterministic:
        return an
    why = Confound.of(ConfoundKind.NONDETERMINISTIC, an.first.stage if an.first is not None else "",
                      reasons="; ".join(result.reasons()))
    if why in an.open_confounds:
        return an
    first = replace(an.first, kind=Kind.DRAFT) if an.first is not None else None
    return replace(an, kind=Kind.DRAFT, first=first, open_confounds=tuple(an.open_confounds) + (why,))


def finding_of(an) -> str:
    """A run's verdict and stage in a few words (to tell runs apart)."""
    if an.first is None:
        return an.verdict.value
    return f"{an.verdict.value} {an.first.stage} {an.first.kind.value}"

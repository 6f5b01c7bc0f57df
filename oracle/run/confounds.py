"""Confounds as values: what breaks an assumption a judgement rests on (open: no finding on it is
more than a DRAFT), or what the judgement set aside and says so (handled).

A Confound is made where it is found (the recorder, the trace account, the tap index, a stage,
the race comparison), carried by the Analysis and the Judgement, and rendered by oracle.report:
its kind, the stage it concerns ("" for the run as a whole), the fields that say what was seen,
and the sentence rendered from them. Code reads the kind and the fields, never the sentence.

Constraints: every kind has exactly its fields (a missing or unknown one is a ConfoundError naming
it); field values are JSON scalars (str, int, float, bool). A dump's metadata holds the
sentences of its recorder's confounds; read back, each is a DECLARED confound with its words.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping

from harness.fields import shown


class ConfoundError(ValueError):
    """A confound whose fields do not fit its kind: a fault of the code that made it (no input
    makes one: a dump's confounds are read back as DECLARED sentences)."""


class ConfoundKind(Enum):
    DECLARED = "declared"  # declared by the recorder (a dump's metadata, a model of a kernel): its words
    UNSELECTED_TAPS = "unselected_taps"  # records the sink header did not select
    UNCONTROLLED_INPUTS = "uncontrolled_inputs"
    MIXED_TAPS = "mixed_taps"  # operand taps far larger than any input value
    DROPPED_RECORDS = "dropped_records"  # incomplete trace: the sink was full
    TORN_RECORDS = "torn_records"  # incomplete trace: records reserved, never completed
    DISAGREEING_TAPS = "disagreeing_taps"  # one site tapped twice with different values
    UNPLACED_OPERAND_TAPS = "unplaced_operand_taps"  # operand records outside the mma taps' partition
    MMA_TAP_OUTSIDE_PARTIAL = "mma_tap_outside_partial"
    UNDECLARED_EPILOGUE = "undeclared_epilogue"  # taps of epilogue steps the declaration lacks
    QUANTISED_DESCRIPTOR = "quantised_descriptor"  # a TMA image of stored codes, not modelled
    ASSUMED_BOUNDARY = "assumed_boundary"  # a partition boundary placed by the declared rule, not traced
    NONDETERMINISTIC = "nondeterministic"  # the runs on the same inputs differ
    OUTSIDE_SPLIT = "outside_split"  # attention taps outside their split's KV blocks
    PADDING = "padding"  # handled: tap elements past the real extent
    PADDED_QUERIES = "padded_queries"  # handled: attention query rows past a sequence's length
    PARTITION = "partition"  # handled: the rule the taps' partitions follow
    SCALE_TAP_SHAPE = "scale_tap_shape"  # a scale tap not shaped as one k-block's scales: left out


INCOMPLETE_TRACE = frozenset({ConfoundKind.DROPPED_RECORDS, ConfoundKind.TORN_RECORDS})


def _dropped(dropped, capacity, needed_bytes, by_stage, lost, advice) -> str:
    return (f"incomplete trace: {dropped} tap record(s) were dropped because the {capacity}-byte sink was full (the "
            f"kernel needed {needed_bytes} bytes; by stage: {by_stage})" + (f"; {lost}" if lost else "")
            + (": raise ORACLE_TRACE_MAX_MB or narrow the selection (--trace-tiles, --trace-k-blocks, --trace-stages)"
               if advice else ""))


# kind -> (its fields, in order; the sentence from them)
_SENTENCES: Mapping[ConfoundKind, tuple[tuple[str, ...], Callable[..., str]]] = {
    ConfoundKind.DECLARED: (("text",), lambda text: text),
    ConfoundKind.UNSELECTED_TAPS: (("count", "examples"), lambda count, examples: (
        f"the kernel wrote {count} tap(s) the sink header did not select ({examples}): the taps check the selection "
        f"themselves, so these were written past the trace API or over an altered header; which tiles and k-blocks "
        f"were traced, and where the records belong, cannot be trusted")),
    ConfoundKind.UNCONTROLLED_INPUTS: (("provenance",), lambda provenance: (
        f"inputs are not controlled ({provenance}): a localisation on them is a draft until reproduced on a "
        f"controlled input")),
    ConfoundKind.MIXED_TAPS: (("tap_max", "input_max"), lambda stage, tap_max, input_max: (
        f"{stage} taps reach {tap_max:.4g} but no input value exceeds {input_max:.4g}: the taps may come from another "
        f"layer or config than the inputs (mixing confound)")),
    ConfoundKind.DROPPED_RECORDS: (("dropped", "capacity", "needed_bytes", "by_stage", "lost", "advice"), _dropped),
    ConfoundKind.TORN_RECORDS: (("torn",), lambda torn: (
        f"incomplete trace: {torn} record(s) were reserved but never completed (the kernel stopped while writing "
        f"them)")),
    ConfoundKind.DISAGREEING_TAPS: (("site",), lambda site: (
        f"two {site} records disagree (a site tapped twice with different values: a race, or taps of two runs "
        f"mixed); the later one is judged")),
    ConfoundKind.UNPLACED_OPERAND_TAPS: (("records",), lambda records: (
        f"operand records outside the partition the mma taps show: {records} (no partial of the tile holds them "
        f"there)")),
    ConfoundKind.MMA_TAP_OUTSIDE_PARTIAL: (("tile", "partial", "k_block"), lambda stage, tile, partial, k_block: (
        f"{stage} tile {tile} {partial} tapped k-block {k_block}, outside its range: the tap is left out of the "
        f"judgement")),
    ConfoundKind.UNDECLARED_EPILOGUE: (("tapped", "declared"), lambda tapped, declared: (
        f"the kernel tapped {tapped}, which the declared epilogue ({declared}) does not have: the kernel's epilogue "
        f"is not the one declared, so its taps were not judged; declare the kernel's steps in their order "
        f"([problem] epilogue)")),
    ConfoundKind.QUANTISED_DESCRIPTOR: (("operand", "dtype"), lambda stage, operand, dtype: (
        f"{stage} of a quantised {operand.upper()} ({dtype}) was recorded but is not judged: the oracle models no TMA "
        f"image of stored codes")),
    ConfoundKind.ASSUMED_BOUNDARY: (("boundary",), lambda boundary: boundary),
    ConfoundKind.NONDETERMINISTIC: (("reasons",), lambda reasons: (
        f"the runs on the same inputs differ, so this stage finding does not repeat ({reasons})")),
    ConfoundKind.OUTSIDE_SPLIT: (("count", "first", "blocks"), lambda count, first, blocks: (
        f"{count} tap(s) lie outside their split's KV blocks under FlashAttention's rule (first: {first}, whose "
        f"split has blocks {blocks}): they are teacher-forced only")),
    ConfoundKind.PADDING: (("m", "n", "by_stage"), lambda m, n, by_stage: (
        f"padding confound: tap elements past the real extent (rows >= M={m} or columns >= N={n}) feed no valid "
        f"output and were excluded ({by_stage})")),
    ConfoundKind.PADDED_QUERIES: (("by_stage",), lambda by_stage: (
        f"padding: query rows past a sequence's length (and the rescale of a split's first KV block, which "
        f"multiplies an empty accumulator) feed no output and were not compared ({by_stage})")),
    ConfoundKind.PARTITION: (("rule",), lambda rule: rule),
    ConfoundKind.SCALE_TAP_SHAPE: (("tap", "shape", "want"), lambda tap, shape, want: (
        f"{tap} holds shape {shape}, not the {want} of one k-block's scales: the tap is left out")),
}
# the kinds whose sentence names the stage (the rest say it in their fields, or concern the run)
_NAMES_STAGE = frozenset({ConfoundKind.MIXED_TAPS, ConfoundKind.MMA_TAP_OUTSIDE_PARTIAL,
                          ConfoundKind.QUANTISED_DESCRIPTOR})


@dataclass(frozen=True)
class Confound:
    kind: ConfoundKind
    stage: str = ""  # the stage it concerns; "" for the run as a whole
    fields: tuple[tuple[str, Any], ...] = ()  # the kind's fields, in its order

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ConfoundKind):
            raise ConfoundError(f"Confound.kind = {shown(self.kind)} is not allowed: one of "
                                f"{', '.join(k.value for k in ConfoundKind)}")
        if not isinstance(self.stage, str):
            raise ConfoundError(f"Confound.stage = {shown(self.stage)} must be a stage name or \"\"")
        names = tuple(name for name, _ in self.fields)
        want = _SENTENCES[self.kind][0]
        if names != want:
            raise ConfoundError(f"a {self.kind.value} confound has the fields {', '.join(want)}, in that order; got "
                                f"{shown(list(names))}")
        for name, value in self.fields:
            if not isinstance(value, (str, int, float, bool)):
                raise ConfoundError(f"Confound field {name} = {shown(value)} must be a string, a number or a boolean")

    @classmethod
    def of(cls, kind: ConfoundKind, stage: str = "", **fields: Any) -> "Confound":
        """A confound of `kind` with its fields by name (in any order)."""
        want = _SENTENCES[kind][0] if isinstance(kind, ConfoundKind) else ()
        extra = sorted(set(fields) - set(want))
        if extra:
            raise ConfoundError(f"a {getattr(kind, 'value', kind)} confound has no field(s) {', '.join(extra)}; "
                                f"its fields: {', '.join(want)}")
        missing = [f for f in want if f not in fields]
        if missing:
            raise ConfoundError(f"a {kind.value} confound needs the field(s) {', '.join(missing)}")
        return cls(kind, stage, tuple((f, fields[f]) for f in want))

    @classmethod
    def declared(cls, text: str) -> "Confound":
        """What a recorder declared, in its words."""
        return cls.of(ConfoundKind.DECLARED, text=text)

    def field(self, name: str) -> Any:
        return dict(self.fields)[name]

    @property
    def incomplete_trace(self) -> bool:
        return self.kind in INCOMPLETE_TRACE

    @property
    def sentence(self) -> str:
        render = _SENTENCES[self.kind][1]
        stage = {"stage": self.stage} if self.kind in _NAMES_STAGE else {}
        return render(**stage, **dict(self.fields))

    def to_json(self) -> dict:
        return {"kind": self.kind.value, "stage": self.stage, "fields": dict(self.fields), "sentence": self.sentence}

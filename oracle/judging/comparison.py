"""The evidence a comparison returns: its status, one TileMetrics per compared unit (with the first
bad elements), the Comparison that carries them with their evidence, and `combine`.

The types both comparators build (oracle.judging.compare's reference in torch, oracle.judging.compare_fast's one
Triton pass); they import this module, it imports neither. Also the bit-exact equality both use.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from oracle.judging.evidence import Evidence, FieldCheck, sites_json

FIRST_BAD = 5  # bad elements reported per tile
TRIVIAL = 1e-30  # |expected| at or below this carries no information


class Status(str, enum.Enum):
    MATCH = "MATCH"
    MISMATCH = "MISMATCH"
    MISTRUSTED = "MISTRUSTED"  # nothing to discriminate: expected all zero
    NOT_RUN = "NOT_RUN"  # no tap to compare, or nothing to feed it


@dataclass(frozen=True)
class BadElement:
    row: int  # global coordinates in the stage's tensor space
    col: int
    received: float
    expected: float
    bound: float
    unwritten: bool = False  # the output element still holds the poison: the kernel never wrote it

    def to_json(self) -> dict:
        return {"row": self.row, "col": self.col, "received": _num(self.received),
                "expected": _num(self.expected), "bound": _num(self.bound), "unwritten": self.unwritten}


@dataclass(frozen=True)
class TileMetrics:
    tile: tuple[int, int]
    k_block: Optional[int]
    compared: int
    excluded: int
    mismatches: int
    max_abs_err: float
    max_rel_err: float
    max_ratio: float  # worst err / bound; the smallest bound scale that would have passed
    rel_l2: float
    cosine: float
    amplification: float  # sum|received| / sum|expected|
    nan_received: int
    nan_expected: int
    inf_received: int
    inf_expected: int
    trivial: bool
    exact: bool
    first_bad: tuple[BadElement, ...] = ()
    unwritten: int = 0  # output elements still holding the poison
    fed_by: str = ""  # oracle.judging.evidence.Feed value: what fed the expected side of this unit
    partial: Optional[int] = None  # the partial of a split tile the unit belongs to
    # a failing unit's per-element err/bound (inf where bit-exact data differ, 0 where not compared),
    # kept for pictures (oracle.report.plots); not part of the evidence
    ratio_map: Optional[torch.Tensor] = field(default=None, compare=False, repr=False)
    stand_ins: tuple = ()  # (stage, tile, k_block) of upstream taps that were missing: the reference stood in
    # what the unit's expected side rests on that was assumed, not observed (a partition boundary the
    # declared rule placed over untraced k-blocks): open confounds of this unit alone
    assumed: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    @property
    def nonfinite(self) -> bool:
        return self.nan_received + self.inf_received > self.nan_expected + self.inf_expected

    def to_json(self) -> dict:
        d = {k: _num(getattr(self, k)) for k in (
            "compared", "excluded", "mismatches", "max_abs_err", "max_rel_err", "max_ratio", "rel_l2", "cosine",
            "amplification", "nan_received", "nan_expected", "inf_received", "inf_expected", "trivial", "exact",
            "unwritten", "fed_by")}
        d["tile"] = list(self.tile)
        d["k_block"] = self.k_block
        d["partial"] = self.partial
        d["min_passing_bound_scale"] = _num(self.max_ratio)
        d["min_passing_atol"] = _num(self.max_abs_err)
        d["first_bad"] = [b.to_json() for b in self.first_bad]
        d["stand_ins"] = sites_json(self.stand_ins)
        d["assumed"] = list(self.assumed)
        return d


@dataclass(frozen=True)
class Comparison:
    status: Status
    tiles: tuple[TileMetrics, ...] = ()
    notes: tuple[str, ...] = field(default=())
    fields: tuple[FieldCheck, ...] = ()  # descriptor fields checked (no elements)
    evidence: Evidence = field(default_factory=Evidence)

    @property
    def compared(self) -> int:
        """Elements compared, over every unit."""
        return sum(t.compared for t in self.tiles)

    @property
    def field_mismatches(self) -> tuple[FieldCheck, ...]:
        return tuple(f for f in self.fields if not f.ok)

    @property
    def worst(self) -> Optional[TileMetrics]:
        if not self.tiles:
            return None
        return max(self.tiles, key=lambda t: (not t.passed, t.max_ratio, t.mismatches, t.max_abs_err))

    @property
    def first_bad_tile(self) -> Optional[TileMetrics]:
        """The failing unit that comes first in pipeline order: earliest k-block, then tile."""
        bad = [t for t in self.tiles if not t.passed]
        if not bad:
            return None
        return min(bad, key=lambda t: (t.k_block if t.k_block is not None else -1, t.tile,
                                       t.partial if t.partial is not None else -1))

    @property
    def first_nonfinite_tile(self) -> Optional[TileMetrics]:
        bad = [t for t in self.tiles if t.nonfinite]
        return min(bad, key=lambda t: (t.k_block if t.k_block is not None else -1, t.tile)) if bad else None

    def with_notes(self, *notes: str) -> "Comparison":
        return dataclasses.replace(self, notes=self.notes + tuple(n for n in notes if n))

    def labelled(self, evidence: Evidence) -> "Comparison":
        """The same comparison, its units and its evidence saying what fed it."""
        feed = evidence.feeds[0].value if len(evidence.feeds) == 1 else \
            " + ".join(f.value for f in evidence.feeds)
        tiles = tuple(dataclasses.replace(t, fed_by=feed, stand_ins=evidence.stand_ins) for t in self.tiles)
        return dataclasses.replace(self, tiles=tiles, evidence=self.evidence.merge(evidence))

    def to_json(self) -> dict:
        w = self.worst
        return {"status": self.status.value, "units": len(self.tiles),
                "failing_units": sum(not t.passed for t in self.tiles),
                "compared": self.compared, "evidence": self.evidence.to_json(),
                "fields": [f.to_json() for f in self.fields],
                "worst_tile": w.to_json() if w else None, "notes": list(self.notes)}


NOT_RUN = Comparison(Status.NOT_RUN)


def combine(parts: Sequence[Comparison], *notes: str) -> Comparison:
    """One comparison out of several (e.g. one per tap): a failing unit or a mismatching field
    fails it; nothing compared (no unit, no field) leaves it NOT_RUN."""
    tiles = tuple(t for p in parts for t in p.tiles)
    fields = tuple(f for p in parts for f in p.fields)
    all_notes = tuple(n for p in parts for n in p.notes) + tuple(n for n in notes if n)
    all_notes = tuple(dict.fromkeys(all_notes))
    evidence = Evidence()
    for p in parts:
        evidence = evidence.merge(p.evidence)
    if any(not t.passed for t in tiles) or any(not f.ok for f in fields):
        status = Status.MISMATCH
    elif not tiles and not fields:
        status = Status.NOT_RUN
    elif tiles and all(t.trivial for t in tiles):
        status = Status.MISTRUSTED
    else:
        status = Status.MATCH
    return Comparison(status, tiles, all_notes, fields, evidence)


def _num(v):
    if isinstance(v, bool) or isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def _bits(x: torch.Tensor) -> torch.Tensor:
    size = x.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return x.contiguous().view(as_int)


def exact_equal(r: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Element by element: the same bit pattern, or both NaN (a bit-exact comparison's `ok`)."""
    same = _bits(r) == _bits(e)
    if r.is_floating_point():
        same |= torch.isnan(r) & torch.isnan(e)
    return same

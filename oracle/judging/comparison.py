"""The evidence a comparison returns: its status, one TileMetrics per compared unit (with the first
bad elements), the Comparison that carries them with their evidence, and `combine`.

A comparison of many units (oracle.judging.compare_fast on the device) keeps them as tensors, a
`UnitTable`, and makes host TileMetrics only of the units a report reads: the worst one, the first
failing ones (up to max_detail_tiles, those with their first bad elements) and the first non-finite
one; its counts (units, failing, compared, mismatches, the failing tiles) are host numbers.
`Comparison.all_units()` makes every unit on demand (pictures, tests).

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
HOST_UNITS = 64  # a comparison of at most this many units makes every one of them on the host
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
    # a failing unit's per-element err/bound (inf where bit-exact data differ, NaN where not compared),
    # kept for pictures (oracle.report.plots, oracle.report.html); not part of the evidence
    ratio_map: Optional[torch.Tensor] = field(default=None, compare=False, repr=False)
    stand_ins: tuple = ()  # (stage, tile, k_block) of upstream taps that were missing: the reference stood in
    # what the unit's expected side rests on that was assumed, not observed (a partition boundary the
    # declared rule placed over untraced k-blocks): open confounds of this unit alone
    assumed: tuple[str, ...] = ()
    shown: bool = field(default=False, compare=False, repr=False)  # one of a UnitTable's units, made for the report

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
class UnitTable:
    """Every unit of one comparison kept on its device (a comparator's subclass holds the data and
    says how a row becomes a TileMetrics: `row_unit`, `all_units`), with host counts over the units
    that compared something and the labels every unit shares. `details` holds the first bad
    elements of the failing units that have them ((row, elements), ...)."""

    units: int
    failing: int
    compared: int
    mismatches: int
    nontrivial: int
    bad_tiles: frozenset
    details: tuple = ()
    k_block: Optional[int] = None
    exact: bool = False
    fed_by: str = ""
    stand_ins: tuple = ()
    partial: Optional[int] = None
    assumed: tuple = ()  # TileMetrics.assumed of every unit

    def all_units(self) -> tuple[TileMetrics, ...]:
        """Every unit that compared something, on the host, in row order."""
        raise NotImplementedError(f"{type(self).__name__} does not say how its units are made")

    def labelled(self, **labels) -> "UnitTable":
        return dataclasses.replace(self, **labels)

    def metrics(self, tile: tuple[int, int], compared: int, excluded: int, mismatches: int, floats, counts,
                first_bad=(), shown: bool = True) -> TileMetrics:
        """A unit with the table's labels: floats (max_abs_err, max_rel_err, max_ratio, rel_l2, cosine,
        amplification), counts (nan_received, nan_expected, inf_received, inf_expected, informative)."""
        mabs, mrel, mratio, rel_l2, cosine, ampl = floats
        nr, ne, ir, ie, info = counts
        return TileMetrics(tile=tile, k_block=self.k_block, compared=compared, excluded=excluded,
                           mismatches=mismatches, max_abs_err=mabs, max_rel_err=mrel, max_ratio=mratio,
                           rel_l2=rel_l2, cosine=cosine, amplification=ampl, nan_received=nr, nan_expected=ne,
                           inf_received=ir, inf_expected=ie, trivial=info == 0, exact=self.exact,
                           first_bad=first_bad, fed_by=self.fed_by, partial=self.partial, stand_ins=self.stand_ins,
                           assumed=self.assumed, shown=shown)


@dataclass(frozen=True)
class Comparison:
    status: Status
    tiles: tuple[TileMetrics, ...] = ()
    notes: tuple[str, ...] = field(default=())
    fields: tuple[FieldCheck, ...] = ()  # descriptor fields checked (no elements)
    evidence: Evidence = field(default_factory=Evidence)
    # units kept as tensors (oracle.judging.compare_fast): `tiles` then holds only those of them the
    # report reads (shown=True), beside the units made on the host
    tables: tuple[UnitTable, ...] = field(default=(), compare=False, repr=False)
    fed_from: tuple[str, ...] = ()  # what fed each teacher-forced unit (the kernel's tap a step read), in order

    @property
    def _host_units(self) -> tuple[TileMetrics, ...]:
        return tuple(t for t in self.tiles if not t.shown) if self.tables else self.tiles

    @property
    def compared(self) -> int:
        """Elements compared, over every unit."""
        return sum(t.compared for t in self._host_units) + sum(tb.compared for tb in self.tables)

    @property
    def units(self) -> int:
        return len(self._host_units) + sum(tb.units for tb in self.tables)

    @property
    def failing_units(self) -> int:
        return sum(not t.passed for t in self._host_units) + sum(tb.failing for tb in self.tables)

    @property
    def mismatches(self) -> int:
        """Bad elements, over every unit."""
        return sum(t.mismatches for t in self._host_units) + sum(tb.mismatches for tb in self.tables)

    @property
    def bad_tiles(self) -> frozenset:
        """The tiles of every failing unit."""
        out = {t.tile for t in self._host_units if not t.passed}
        for tb in self.tables:
            out |= tb.bad_tiles
        return frozenset(out)

    def all_units(self) -> tuple[TileMetrics, ...]:
        """Every unit, on the host (the units of a UnitTable made now, in its row order)."""
        if not self.tables:
            return self.tiles
        return self._host_units + tuple(u for tb in self.tables for u in tb.all_units())

    def failing_in(self, tiles) -> tuple[TileMetrics, ...]:
        """The failing units whose tile is in `tiles` (a table's are made on the host only when its
        shown units do not hold every one of its failing units)."""
        tiles = set(tiles)
        shown_failing = sum(not t.passed for t in self.tiles if t.shown)
        pool = self.all_units() if sum(tb.failing for tb in self.tables) > shown_failing else self.tiles
        return tuple(t for t in pool if not t.passed and t.tile in tiles)

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

    def fed(self, source: str) -> "Comparison":
        """The same comparison, saying what fed it (kept apart from the notes: the report shows it
        only for the stage the finding is at)."""
        return dataclasses.replace(self, fed_from=self.fed_from + (source,))

    @property
    def all_notes(self) -> tuple[str, ...]:
        """What fed it ("fed from ..."), then the notes."""
        return tuple(f"fed from {f}" for f in self.fed_from) + self.notes

    def labelled(self, evidence: Evidence, partial: Optional[int] = None,
                 assumed: tuple[str, ...] = ()) -> "Comparison":
        """The same comparison, its units and its evidence saying what fed it; with `partial` or
        `assumed`, also what of_partial and assuming say, in the same pass over the units."""
        labels = unit_labels(evidence, partial, assumed)
        tiles = tuple(dataclasses.replace(t, **labels) for t in self.tiles)
        tables = tuple(tb.labelled(**labels) for tb in self.tables)
        return dataclasses.replace(self, tiles=tiles, evidence=self.evidence.merge(evidence), tables=tables)

    def with_evidence(self, evidence: Evidence) -> "Comparison":
        """`labelled(evidence, ...)` of a comparison whose units already carry unit_labels(evidence, ...)."""
        return dataclasses.replace(self, evidence=self.evidence.merge(evidence))

    def of_partial(self, partial: Optional[int]) -> "Comparison":
        """The same comparison, its units saying which partial of a split tile they belong to."""
        return dataclasses.replace(self, tiles=tuple(dataclasses.replace(t, partial=partial) for t in self.tiles),
                                   tables=tuple(tb.labelled(partial=partial) for tb in self.tables))

    def assuming(self, assumed: tuple[str, ...]) -> "Comparison":
        """The same comparison, every unit resting on the partition assumptions `assumed`."""
        return dataclasses.replace(self, tiles=tuple(dataclasses.replace(t, assumed=assumed) for t in self.tiles),
                                   tables=tuple(tb.labelled(assumed=assumed) for tb in self.tables))

    def to_json(self) -> dict:
        w = self.worst
        return {"status": self.status.value, "units": self.units,
                "failing_units": self.failing_units,
                "compared": self.compared, "evidence": self.evidence.to_json(),
                "fields": [f.to_json() for f in self.fields],
                "worst_tile": w.to_json() if w else None, "notes": list(self.all_notes)}


NOT_RUN = Comparison(Status.NOT_RUN)


def unit_labels(evidence: Evidence, partial: Optional[int] = None, assumed: tuple[str, ...] = ()) -> dict:
    """The TileMetrics fields Comparison.labelled gives each unit: what fed it (and the stand-ins),
    and, where given, its partial and what it assumed."""
    feed = evidence.feeds[0].value if len(evidence.feeds) == 1 else " + ".join(f.value for f in evidence.feeds)
    labels = dict(fed_by=feed, stand_ins=evidence.stand_ins)
    if partial is not None:
        labels["partial"] = partial
    if assumed:
        labels["assumed"] = tuple(assumed)
    return labels


def combine(parts: Sequence[Comparison], *notes: str) -> Comparison:
    """One comparison out of several (e.g. one per tap): a failing unit or a mismatching field
    fails it; nothing compared (no unit, no field) leaves it NOT_RUN."""
    tiles = tuple(t for p in parts for t in p.tiles)
    tables = tuple(tb for p in parts for tb in p.tables)
    fields = tuple(f for p in parts for f in p.fields)
    all_notes = tuple(n for p in parts for n in p.notes) + tuple(n for n in notes if n)
    all_notes = tuple(dict.fromkeys(all_notes))
    fed_from = tuple(dict.fromkeys(f for p in parts for f in p.fed_from))
    evidence = Evidence()
    for p in parts:
        evidence = evidence.merge(p.evidence)
    return Comparison(status_of(tiles, tables, fields), tiles, all_notes, fields, evidence, tables, fed_from)


def status_of(tiles: Sequence[TileMetrics], tables: Sequence[UnitTable] = (),
              fields: Sequence[FieldCheck] = ()) -> Status:
    """The status of a comparison of these units and fields (combine's rule)."""
    if any(not t.passed for t in tiles) or any(tb.failing for tb in tables) or any(not f.ok for f in fields):
        return Status.MISMATCH
    if not tiles and not tables and not fields:
        return Status.NOT_RUN
    host = tuple(t for t in tiles if not t.shown)
    if (tiles or tables) and all(t.trivial for t in host) and not any(tb.nontrivial for tb in tables):
        return Status.MISTRUSTED
    return Status.MATCH


def _num(v):
    if isinstance(v, bool) or isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def bit_patterns(x: torch.Tensor) -> torch.Tensor:
    """x's bit patterns, as the signed integer type of its width."""
    size = x.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return x.contiguous().view(as_int)


def exact_equal(r: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Element by element: the same bit pattern, or both NaN (a bit-exact comparison's `ok`)."""
    same = bit_patterns(r) == bit_patterns(e)
    if r.is_floating_point():
        same |= torch.isnan(r) & torch.isnan(e)
    return same

"""What a comparison rests on: what fed its expected side, and which elements it could not see.

A teacher-forced comparison is only as good as its input. `Feed` says where that input came from:
the kernel's own upstream tap, the operand in global memory (the real input of a load or a TMA
copy), a reference value standing in for a tap the kernel did not record, the reference pipeline
(chained comparisons), or descriptor fields. `Evidence` adds the elements that were masked and
why (never recorded, fed by an unrecorded upstream element, padding past the real extent), and
the missing taps a stand-in replaced. A finding can be a VERDICT only on kernel taps, global
memory or fields (oracle.judging.differential.findings).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Optional

Site = tuple[str, tuple[int, int], Optional[int]]  # (stage, tile, k-block) of a tap


class Feed(str, enum.Enum):
    KERNEL = "kernel tap"  # teacher-forced from the kernel's own upstream tap
    GLOBAL = "global memory"  # the stage's real input: the operand as it lies in global memory
    STAND_IN = "reference stand-in"  # an upstream tap is missing: the reference's value stood in
    REFERENCE = "reference"  # chained: the reference pipeline fed it
    FIELDS = "descriptor fields"  # tensor-map fields against the ones the problem implies


# Why an element was not compared.
PADDING = "padding"  # past the real extent (rows >= M, columns >= N): feeds no valid output
UNRECORDED = "unrecorded"  # the kernel's tap does not hold it (mask false, a dropped or torn record)
UPSTREAM_UNRECORDED = "upstream unrecorded"  # an element feeding it was never recorded
MASK_REASONS = (PADDING, UNRECORDED, UPSTREAM_UNRECORDED)


@dataclass(frozen=True)
class Evidence:
    feeds: tuple[Feed, ...] = ()
    masked: tuple[tuple[str, int], ...] = ()  # (reason, elements), reasons from MASK_REASONS
    stand_ins: tuple[Site, ...] = ()  # the missing taps the reference stood in for

    def __post_init__(self) -> None:
        for reason, n in self.masked:
            if reason not in MASK_REASONS or not isinstance(n, int) or n < 0:
                raise ValueError(f"masked entry ({reason!r}, {n!r}): the reason must be one of {MASK_REASONS} "
                                 f"and the count a non-negative int")

    @classmethod
    def of(cls, feed: Feed, masked: Optional[dict[str, int]] = None, stand_ins=()) -> "Evidence":
        return cls((feed,), tuple((r, int(masked[r])) for r in MASK_REASONS if masked and masked.get(r)),
                   tuple(stand_ins))

    @property
    def masked_total(self) -> int:
        return sum(n for _, n in self.masked)

    def masked_count(self, reason: str) -> int:
        return dict(self.masked).get(reason, 0)

    @property
    def rests_on_stand_ins(self) -> bool:
        return Feed.STAND_IN in self.feeds

    def merge(self, other: "Evidence") -> "Evidence":
        counts = dict(self.masked)
        for r, n in other.masked:
            counts[r] = counts.get(r, 0) + n
        return Evidence(tuple(dict.fromkeys(self.feeds + other.feeds)),
                        tuple((r, counts[r]) for r in MASK_REASONS if counts.get(r)),
                        tuple(dict.fromkeys(self.stand_ins + other.stand_ins)))

    def describe_masked(self) -> str:
        return ", ".join(f"{r} {n}" for r, n in self.masked) or "none"

    def to_json(self) -> dict:
        return {"fed_by": [f.value for f in self.feeds], "masked": dict(self.masked),
                "masked_total": self.masked_total, "stand_ins": sites_json(self.stand_ins)}


def sites_json(sites: Iterable[Site]) -> list[dict]:
    return [{"stage": s, "tile": list(t), "k_block": kb} for s, t, kb in sites]


def _ranges(values: list[int]) -> str:
    out, start, prev = [], None, None
    for v in sorted(set(values)):
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = v
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def describe_sites(sites: Iterable[Site], limit: int = 6) -> str:
    """'load_a tile (0, 0) k-blocks 0-7; epilogue_bias tile (1, 2)', grouped by stage and tile."""
    groups: dict[tuple[str, tuple[int, int]], list[int]] = {}
    for stage, tile, kb in sites:
        groups.setdefault((stage, tuple(tile)), [])
        if kb is not None:
            groups[(stage, tuple(tile))].append(kb)
    parts = []
    for (stage, tile), kbs in list(groups.items())[:limit]:
        kb_text = "" if not kbs else f" k-block{'s' if len(set(kbs)) > 1 else ''} {_ranges(kbs)}"
        parts.append(f"{stage} tile {tile}{kb_text}")
    if len(groups) > limit:
        parts.append(f"and {len(groups) - limit} more")
    return "; ".join(parts)


@dataclass(frozen=True)
class FieldCheck:
    """One tensor-map field of one descriptor record against the value the problem implies."""

    operand: str
    source: str  # "kernel" (tapped by the kernel), "host" (encoded by the harness from the case), "unknown"
    field: str
    received: str
    expected: str
    note: str = ""  # e.g. a map that covers only padding rows past M / N (not a mismatch)

    @property
    def ok(self) -> bool:
        return self.received == self.expected or bool(self.note)

    def describe(self) -> str:
        who = {"kernel": "the kernel's tapped descriptor", "host": "the map the harness encoded from the case",
               "unknown": "a descriptor of unknown origin"}[self.source]
        return f"descriptor_{self.operand} {self.field}: {self.received}, expected {self.expected} ({who})"

    def to_json(self) -> dict:
        return {"operand": self.operand, "source": self.source, "field": self.field, "received": self.received,
                "expected": self.expected, "ok": self.ok, "note": self.note}

"""Which scale a kernel applied: a wrong block scale named by the scale of the problem it equals.

A pure function over the applied value, the problem's scale values of both operands and where the
value sits (ScaleSite): no recording, no device. The mistakes it names, in this order (the first
that fits is named, the others beside it):
- a zero scale where the problem's is not: read past the scale tensor (a tensor map or bound built
  with the group size where the scale count belonged);
- on a grouped or batched problem, the scale another group holds at the same place (PeerScales):
  "the scale of group 0", a scale pointer not advanced to the group;
- the expected scale squared: the operand's scale applied twice;
- the other operand's scale (for B: A's scale of some row, so A's scale is applied twice);
- split s > 0 of a split tile holding the scale slice 0 has at the same place: slice 0's scales;
- the same row's (column's) scale of another k-block group: "the scale of k-block group g2 was used
  for group g";
- the same group's scale of another row (column): its neighbour, or a row a number of tiles away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

NAME = {"a": "A", "b": "B"}
LINE = {"a": "row", "b": "column"}


@dataclass(frozen=True)
class ScaleSite:
    """Where an applied scale sits: operand, tile, k-block, the row of A (column of B) in the operand,
    its global scale group, the rows (columns) one scale block covers, the tile's extent along that
    axis, and for a split tile its partial and the group slice 0 holds at the same place."""

    op: str
    tile: tuple[int, int]
    k_block: int
    row: int
    group: int
    block_rows: int = 1
    tile_rows: int = 128
    partial: Optional[int] = None
    slice0_group: Optional[int] = None
    other_row0: int = 0  # the tile's first row along the other operand's axis (B's site: A's first row)

    def __post_init__(self) -> None:
        if self.op not in NAME:
            raise ValueError(f"ScaleSite.op={self.op!r}: 'a' or 'b'")
        for f in ("k_block", "row", "group", "block_rows", "tile_rows"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if f in ("block_rows", "tile_rows") else 0):
                raise ValueError(f"ScaleSite.{f}={v!r}: a non-negative int" + (" (positive)" if f in
                                                                               ("block_rows", "tile_rows") else ""))

    def describe(self) -> str:
        part = "" if self.partial is None else f" (split {self.partial})"
        return (f"tile {self.tile} k-block {self.k_block}{part}, {LINE[self.op]} {self.row} of {NAME[self.op]}, "
                f"scale group {self.group}")


@dataclass(frozen=True, eq=False)
class PeerScales:
    """The other groups of a grouped (or batched) problem beside the one a site lies in: `word` names
    them ("group" or "batch entry"), `group` is the site's, `others` (group, the operand's scale
    values [row blocks, k groups] float64) each, A's rows counted from that group's first row."""

    word: str
    group: int
    others: tuple[tuple[int, torch.Tensor], ...] = ()


def _same(x: float, y: float) -> bool:
    return x == y or (x != x and y != y)


def identify(site: ScaleSite, applied: float, own: torch.Tensor, other: Optional[torch.Tensor] = None,
             other_block_rows: int = 1, peers: Optional[PeerScales] = None) -> Optional[str]:
    """What the applied scale at `site` is, read from the scales the problem holds: `own` the operand's
    scale values [row blocks, groups] (float64), `other` the other operand's, `peers` the same
    operand's scales of the other groups of a grouped problem. None when the applied value is the
    expected one; a sentence naming the mistake (or saying it matches none) otherwise."""
    rb, g = site.row // site.block_rows, site.group
    if not (0 <= rb < own.shape[0] and 0 <= g < own.shape[1]):
        return None
    want = float(own[rb, g])
    if _same(applied, want):
        return None
    X, line, r = NAME[site.op], LINE[site.op], site.row
    found = []
    if applied == 0.0 and want != 0.0:
        found.append("a zero scale: read past the scale tensor (its tensor map or bound holds fewer scales than the "
                     "problem: the group size where the scale count belonged)")
    if peers is not None:
        for e, vals in peers.others:
            if rb < vals.shape[0] and g < vals.shape[1] and _same(applied, float(vals[rb, g])):
                found.append(f"the scale of {peers.word} {e}: {X}'s scales of {peers.word} {e} applied to "
                             f"{peers.word} {peers.group} (the same {line} and k group of {peers.word} {e}'s "
                             f"scales: a scale pointer not advanced to its {peers.word})")
                break
    if want not in (0.0, 1.0, -1.0) and _same(applied, want * want):
        found.append(f"{X}'s scale applied twice (the applied value is {X}'s scale squared)")
    if other is not None and g < other.shape[1]:
        hits = sorted((other.double()[:, g] == applied).nonzero().flatten().tolist(),
                      key=lambda h: abs(h * other_block_rows - site.other_row0))
        if hits:
            o = "b" if site.op == "a" else "a"
            found.append(f"{NAME[o]}'s scale of {LINE[o]} {hits[0] * other_block_rows} (group {g}) in {X}'s place: "
                         f"{NAME[o]}'s scale applied twice")
    if site.partial and site.slice0_group is not None and site.slice0_group != g \
            and site.slice0_group < own.shape[1] and _same(applied, float(own[rb, site.slice0_group])):
        found.append(f"slice 0's scales used by split {site.partial}: the scale of k-block group "
                     f"{site.slice0_group} was used for group {g}")
    groups = [g2 for g2 in range(own.shape[1]) if g2 != g and _same(applied, float(own[rb, g2]))]
    if groups:
        found.append(f"the scale of k-block group {groups[0]} was used for group {g}")
    rows = sorted((r2 for r2 in range(own.shape[0]) if r2 != rb and _same(applied, float(own[r2, g]))),
                  key=lambda r2: (abs(r2 - rb) != 1 and (r2 - rb) * site.block_rows % site.tile_rows != 0,
                                  abs(r2 - rb)))  # a neighbour, or a whole number of tiles away, first
    if rows:
        r2 = rows[0] * site.block_rows
        if abs(rows[0] - rb) == 1:
            found.append(f"the scale of {line} {r}'s neighbour ({line} {r2}, the next scale block)")
        else:
            tiles = (r2 - r) / site.tile_rows
            away = f"{abs(tiles):g} tiles {'on' if tiles > 0 else 'back'}" if tiles == int(tiles) else \
                f"{abs(r2 - r)} {line}s {'on' if r2 > r else 'back'}"
            found.append(f"the scale of {line} {r2} ({away}: the scale {line}s of another tile, as from the raw "
                         f"block index instead of the swizzled tile coordinate)")
    found = list(dict.fromkeys(f for f in found if not any(f != o and f in o for o in found)))
    head = f"{site.describe()}: applied scale {applied!r}, the problem's is {want!r}"
    if not found:
        return f"{head}; it equals no other scale of the problem"
    also = f" (it also fits: {'; '.join(found[1:3])})" if len(found) > 1 else ""
    return f"{head}: {found[0]}{also}"

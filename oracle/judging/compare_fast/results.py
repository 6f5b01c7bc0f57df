"""`compare_fast`: the per-tile statistics of one pass (oracle.judging.compare_fast.launch) as the same
Comparison as oracle.judging.compare.compare_reference, and the second look at failing tiles for
their first bad elements (`_first_bad`, bounded chunks of rows).

A comparison of at most HOST_UNITS units makes all of them on the host; a larger one keeps the
folded rows on the device (`DeviceUnits`) and makes only the units a report reads: the worst, the
first failing ones (up to max_detail_tiles: those get their first bad elements, as the reference
gives them) and the first non-finite one. Two small kernels pick them on the device
(oracle.judging.compare_fast.summary) and the host reads one copy: the counts, those rows and the
first FAIL_LIST failing units (a second copy lists every failing unit past those). Worst-unit ties
go to the first tile, as Python's max does; a NaN err/bound (a NaN bound) makes every unit on the
host, as the reference does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from oracle.judging.comparison import (FIRST_BAD, HOST_UNITS, BadElement, Comparison, Status, TileMetrics, UnitTable,
                                       combine, exact_equal, status_of)
from oracle.judging.compare_fast.fold import _tile_fields
from oracle.judging.compare_fast.kinds import inline_bound
from oracle.judging.compare_fast.launch import tile_stats
from oracle.judging.compare_fast.plan import FastConfig
from oracle.judging.compare_fast.stats import NSTAT, S_BAD, S_COMPARED, S_FIRST_BAD, _NO_BAD
from oracle.judging.compare_fast.summary import summarize

_DETAIL_CHUNK = 1 << 18  # elements per chunk of the second look at a failing tile
FAIL_LIST = 1024  # failing units listed in the summary (their tiles: Comparison.bad_tiles)


@dataclass(frozen=True)
class DeviceUnits(UnitTable):
    """Every tile's folded statistics on the device ([U, NSTAT] float64, row-major tile order) and
    the grid that names them; a row becomes a TileMetrics on the host (fold._tile_fields)."""

    rows: Optional[torch.Tensor] = None
    shape: tuple[int, int] = (0, 0)  # the compared tensors'
    tile_shape: tuple[int, int] = (1, 1)
    tiles_w: int = 1
    base: tuple[int, int] = (0, 0)  # the tile index of row 0

    def row_unit(self, r: int, row, first_bad=(), shown: bool = True) -> TileMetrics:
        (compared, mismatches, _), floats, counts = _tile_fields(row)
        i, j = divmod(r, self.tiles_w)
        (h, w), (th, tw) = self.shape, self.tile_shape
        excluded = min(th, h - i * th) * min(tw, w - j * tw) - compared
        return self.metrics((self.base[0] + i, self.base[1] + j), compared, excluded, mismatches, floats, counts,
                            first_bad, shown)

    def all_units(self) -> tuple[TileMetrics, ...]:
        details = dict(self.details)
        return tuple(self.row_unit(r, row, details.get(r, ()), shown=False)
                     for r, row in enumerate(self.rows.cpu().tolist()) if row[S_COMPARED] > 0)


def compare_fast(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
                 rtol: Optional[float] = None, atol: Optional[float] = None, mask: Optional[torch.Tensor] = None,
                 tile_shape: Optional[tuple[int, int]] = None, origin: tuple[int, int] = (0, 0),
                 tile_index: Optional[tuple[int, int]] = None, k_block: Optional[int] = None,
                 max_detail_tiles: int = 64, config: Optional[FastConfig] = None,
                 fast_pass: bool = True) -> Comparison:
    """`oracle.judging.compare.compare_reference` in one pass. The bound is `bound` (a tensor), or
    `atol + rtol * |expected|` computed inline (see `inline_bound`), or none (bit-exact)."""
    stats = tile_stats(received, expected, bound=bound, rtol=rtol, atol=atol, mask=mask, tile_shape=tile_shape,
                       config=config, fast_pass=fast_pass)
    exact = bound is None and rtol is None
    h, w = stats.shape
    th, tw = stats.tile_shape
    tiles_w = stats.rows.shape[1]
    rows = stats.rows.reshape(-1, NSTAT)
    if rows.shape[0] == 0:
        return Comparison(Status.NOT_RUN)
    base_ti = tile_index if (tile_shape is None and tile_index is not None) else (origin[0] // th, origin[1] // tw)

    def table(units=0, failing=0, compared=0, mismatches=0, nontrivial=0, bad_tiles=frozenset(), details=()):
        return DeviceUnits(units, failing, compared, mismatches, nontrivial, bad_tiles, k_block=k_block, exact=exact,
                           details=details, rows=rows, shape=(h, w), tile_shape=(th, tw), tiles_w=tiles_w,
                           base=tuple(base_ti))

    def details(r: int, row):
        i, j = divmod(r, tiles_w)
        return _first_bad(received, expected, bound, rtol, atol, mask, exact, int(row[S_FIRST_BAD]),
                          (i * th, min(h, i * th + th)), (j * tw, min(w, j * tw + tw)), origin)

    if rows.shape[0] <= HOST_UNITS:
        return _every_unit(table(), rows.tolist(), details, max_detail_tiles)
    detail = max(0, max_detail_tiles)
    sm = summarize(rows, max(FAIL_LIST, detail), detail)
    if sm.units == 0:
        return Comparison(Status.NOT_RUN)
    if sm.units <= HOST_UNITS or sm.unknown:
        return _every_unit(table(), rows.tolist(), details, max_detail_tiles)
    shown = {sm.worst: sm.worst_row}
    if sm.nonfinite:
        shown.setdefault(sm.first_nonfinite, sm.nonfinite_row)
    bad_tiles, detailed = frozenset(), {}
    if sm.failing:
        idx = sm.failing_rows
        if len(idx) < sm.failing:  # past the list: every failing row's index, one more copy
            c = rows.unbind(-1)
            idx = tuple(((c[S_COMPARED] > 0) & (c[S_BAD] > 0)).nonzero().squeeze(1).tolist())
        bad_tiles = frozenset((base_ti[0] + r // tiles_w, base_ti[1] + r % tiles_w) for r in idx)
        for r, row in zip(idx, sm.detail_rows):
            shown[r] = row
            detailed[r] = details(r, row)
    made = table(sm.units, sm.failing, sm.compared, sm.mismatches, sm.nontrivial, bad_tiles,
                 tuple(sorted(detailed.items())))
    units = tuple(made.row_unit(r, row, detailed.get(r, ())) for r, row in sorted(shown.items()))
    return Comparison(status_of(units, (made,)), units, tables=(made,))  # combine's status, one part


def _every_unit(table: DeviceUnits, rows: list, details, max_detail_tiles: int) -> Comparison:
    """Every unit on the host, as the reference makes them (the first failing ones with details)."""
    out, budget = [], max_detail_tiles
    for r, row in enumerate(rows):
        if row[S_COMPARED] == 0:
            continue
        first = ()
        if row[S_BAD] and budget > 0:
            budget -= 1
            first = details(r, row)
        out.append(table.row_unit(r, row, first, shown=False))
    if not out:
        return Comparison(Status.NOT_RUN)
    return combine([Comparison(Status.MATCH, tuple(out))])


def _first_bad(received, expected, bound, rtol, atol, mask, exact, first_lin, row_span, col_span,
               origin) -> tuple[BadElement, ...]:
    """The first FIRST_BAD bad elements of one tile in row-major order, from the row of the first
    one (which the kernel located), a bounded chunk of rows at a time."""
    dev = received.device
    r_lo, r_hi = row_span
    c_lo, c_hi = col_span
    h, w = received.shape
    start = max(r_lo, first_lin // w) if first_lin < _NO_BAD else r_lo
    step = max(1, _DETAIL_CHUNK // max(1, c_hi - c_lo))
    res: list[BadElement] = []
    for a in range(start, r_hi, step):
        z = min(r_hi, a + step)
        rs = received[a:z, c_lo:c_hi]
        es = expected[a:z, c_lo:c_hi].to(dev)
        r, e = rs.to(torch.float64), es.to(torch.float64)
        if exact:
            ok = exact_equal(rs, es)
            b = torch.zeros_like(r)
        else:
            if bound is None:
                b = inline_bound(es, rtol, atol).to(torch.float64)
            else:
                b = bound.to(dev).expand(h, w)[a:z, c_lo:c_hi].to(torch.float64)
            err = (r - e).abs()
            r_nan, e_nan, r_inf, e_inf = torch.isnan(r), torch.isnan(e), torch.isinf(r), torch.isinf(e)
            same_inf = r_inf & e_inf & (torch.sign(r) == torch.sign(e))
            ok = (r_nan & e_nan) | same_inf | (torch.isfinite(r) & torch.isfinite(e) & (err <= b))
        bad = ~ok
        if mask is not None:
            bad &= mask.to(dev).expand(h, w)[a:z, c_lo:c_hi]
        for ii, jj in bad.nonzero()[:FIRST_BAD - len(res)].cpu().tolist():
            res.append(BadElement(origin[0] + a + ii, origin[1] + c_lo + jj, float(r[ii, jj]), float(e[ii, jj]),
                                  float(b[ii, jj])))
        if len(res) >= FIRST_BAD:
            break
    return tuple(res)

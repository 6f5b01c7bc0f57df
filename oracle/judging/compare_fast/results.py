"""`compare_fast`: the per-tile statistics of one pass (oracle.judging.compare_fast.launch) as the same
Comparison as oracle.judging.compare.compare_reference, and the second look at failing tiles for
their first bad elements (`_first_bad`, bounded chunks of rows).

A comparison of at most HOST_UNITS units makes all of them on the host; a larger one keeps the
folded rows on the device (`DeviceUnits`) and makes only the units a report reads: the worst, the
first failing ones (up to max_detail_tiles: those get their first bad elements, as the reference
gives them) and the first non-finite one. A few reductions on the device pick them; the host reads
one copy of the counts and those rows when nothing fails, one more of the failing rows otherwise.
Worst-unit ties go to the first tile, as Python's max does; a NaN err/bound (a NaN bound) makes
every unit on the host, as the reference does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch

from oracle.judging.comparison import (FIRST_BAD, HOST_UNITS, BadElement, Comparison, Status, TileMetrics, UnitTable,
                                       combine, exact_equal)
from oracle.judging.compare_fast.fold import _tile_fields
from oracle.judging.compare_fast.kinds import inline_bound
from oracle.judging.compare_fast.launch import tile_stats
from oracle.judging.compare_fast.plan import FastConfig
from oracle.judging.compare_fast.stats import (NSTAT, S_BAD, S_COMPARED, S_INF_E, S_INF_R, S_INFO, S_MAX_ABS,
                                               S_MAX_RATIO, S_NAN_E, S_NAN_R, S_RATIO_NAN, S_FIRST_BAD,
                                               _NO_BAD)

_DETAIL_CHUNK = 1 << 18  # elements per chunk of the second look at a failing tile


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
    table = DeviceUnits(0, 0, 0, 0, 0, frozenset(), k_block=k_block, exact=exact, rows=rows, shape=(h, w),
                        tile_shape=(th, tw), tiles_w=tiles_w, base=tuple(base_ti))

    def details(r: int, row):
        i, j = divmod(r, tiles_w)
        return _first_bad(received, expected, bound, rtol, atol, mask, exact, int(row[S_FIRST_BAD]),
                          (i * th, min(h, i * th + th)), (j * tw, min(w, j * tw + tw)), origin)

    c = rows.unbind(-1)
    keep = c[S_COMPARED] > 0
    fail = keep & (c[S_BAD] > 0)
    nonfinite = keep & (c[S_NAN_R] + c[S_INF_R] > c[S_NAN_E] + c[S_INF_E])
    unknown = keep & ((c[S_RATIO_NAN] > 0) | torch.isnan(c[S_MAX_ABS]))
    worst = _worst(keep, fail, c)
    first_nonfinite = torch.argmax(nonfinite.to(torch.int32))
    zero = torch.zeros((), dtype=rows.dtype, device=rows.device)
    counts = torch.stack([keep.sum(), fail.sum(), torch.where(keep, c[S_COMPARED], zero).sum(),
                          torch.where(keep, c[S_BAD], zero).sum(), (keep & (c[S_INFO] > 0)).sum(), unknown.sum(),
                          nonfinite.sum(), worst, first_nonfinite]).to(rows.dtype)
    head = torch.cat([counts, rows[worst], rows[first_nonfinite]]).cpu().tolist()
    n_units, n_failing, n_compared, n_bad, n_nontrivial, n_unknown, n_nonfinite, i_worst, i_nonfinite = \
        (int(v) for v in head[:9])
    if n_units == 0:
        return Comparison(Status.NOT_RUN)
    if n_units <= HOST_UNITS or n_unknown:  # every unit on the host, as the reference makes them
        out, budget = [], max_detail_tiles
        for r, row in enumerate(rows.cpu().tolist()):
            if row[S_COMPARED] == 0:
                continue
            first = ()
            if row[S_BAD] and budget > 0:
                budget -= 1
                first = details(r, row)
            out.append(table.row_unit(r, row, first, shown=False))
        return combine([Comparison(Status.MATCH, tuple(out))])
    shown = {i_worst: head[9:9 + NSTAT]}
    if n_nonfinite:
        shown.setdefault(i_nonfinite, head[9 + NSTAT:9 + 2 * NSTAT])
    bad_tiles, detailed = frozenset(), {}
    if n_failing:
        failing = fail.nonzero().squeeze(1)
        first = failing[:max_detail_tiles]
        got = torch.cat([failing.to(rows.dtype), rows[first].reshape(-1)]).cpu().tolist()
        idx = [int(v) for v in got[:n_failing]]
        bad_tiles = frozenset((base_ti[0] + r // tiles_w, base_ti[1] + r % tiles_w) for r in idx)
        for k, r in enumerate(idx[:len(first)]):
            row = got[n_failing + k * NSTAT:n_failing + (k + 1) * NSTAT]
            shown[r] = row
            detailed[r] = details(r, row)
    table = dataclasses.replace(table, units=n_units, failing=n_failing, compared=n_compared, mismatches=n_bad,
                                nontrivial=n_nontrivial, bad_tiles=bad_tiles, details=tuple(sorted(detailed.items())))
    units = tuple(table.row_unit(r, row, detailed.get(r, ())) for r, row in sorted(shown.items()))
    return combine([Comparison(Status.MATCH, units, tables=(table,))])


def _worst(keep: torch.Tensor, fail: torch.Tensor, c) -> torch.Tensor:
    """The row of Comparison.worst's unit, on the device: the largest (failing, err/bound,
    mismatches, max_abs_err), the first tile on ties."""
    cand = keep & (fail | ~fail.any())
    for col in (c[S_MAX_RATIO], c[S_BAD], c[S_MAX_ABS]):
        top = torch.where(cand, col, -math.inf).max()
        cand = cand & (col == top)
    return torch.argmax(cand.to(torch.int32))


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

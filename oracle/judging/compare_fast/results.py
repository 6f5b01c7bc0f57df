"""`compare_fast`: the per-tile statistics of one pass (oracle.judging.compare_fast.launch) as the same
Comparison as oracle.judging.compare.compare_reference, and the second look at failing tiles for
their first bad elements (`_first_bad`, bounded chunks of rows).

Every tile's fields are computed on the device (fold._tile_fields). A comparison of at most
HOST_UNITS units makes all of them on the host; a larger one keeps them as a UnitTable and makes
only the units a report reads: the worst, the first failing ones (up to max_detail_tiles: those
get their first bad elements, as the reference gives them) and the first non-finite one. The host
reads one copy of counts and those two units in the common case (nothing fails), one more of the
failing units' tiles and rows when something fails. Worst-unit ties go to the first tile, as
Python's max; a NaN err/bound (a NaN bound) makes every unit on the host, as the reference does.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from oracle.judging.comparison import (FIRST_BAD, HOST_UNITS, U_COMPARED, U_INF_E, U_INF_R, U_INFORMATIVE,
                                       U_MAX_ABS, U_MAX_RATIO, U_MISMATCHES, U_NAN_E, U_NAN_R, BadElement, Comparison,
                                       Status, UnitTable, combine, exact_equal)
from oracle.judging.compare_fast.fold import _tile_fields
from oracle.judging.compare_fast.kinds import inline_bound
from oracle.judging.compare_fast.launch import tile_stats
from oracle.judging.compare_fast.plan import FastConfig
from oracle.judging.compare_fast.stats import _NO_BAD

_DETAIL_CHUNK = 1 << 18  # elements per chunk of the second look at a failing tile
_ROW = 16  # a unit as one float64 row: tile (2), ints (8), floats (6)


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
    tiles_h, tiles_w = stats.rows.shape[:2]
    ints, floats, first_lin = _tile_fields(stats.rows, stats.shape, stats.tile_shape)
    if ints.shape[0] == 0:
        return Comparison(Status.NOT_RUN)
    base_ti = tile_index if (tile_shape is None and tile_index is not None) else (origin[0] // th, origin[1] // tw)
    dev = ints.device
    ti = torch.arange(tiles_h, device=dev).repeat_interleave(tiles_w) + base_ti[0]
    tj = torch.arange(tiles_w, device=dev).repeat(tiles_h) + base_ti[1]
    tile = torch.stack([ti, tj], -1)

    def details(row: int, lin: int):
        i, j = divmod(row, tiles_w)
        return _first_bad(received, expected, bound, rtol, atol, mask, exact, lin,
                          (i * th, min(h, i * th + th)), (j * tw, min(w, j * tw + tw)), origin)

    keep = ints[:, U_COMPARED] > 0
    fail = keep & (ints[:, U_MISMATCHES] > 0)
    nonfinite = keep & (ints[:, U_NAN_R] + ints[:, U_INF_R] > ints[:, U_NAN_E] + ints[:, U_INF_E])
    unknown = keep & (torch.isnan(floats[:, U_MAX_RATIO]) | torch.isnan(floats[:, U_MAX_ABS]))
    worst = _worst(keep, fail, ints, floats)
    first_nonfinite = torch.argmax(nonfinite.to(torch.int32))
    counts = torch.stack([keep.sum(), fail.sum(), torch.where(keep, ints[:, U_COMPARED], 0).sum(),
                          torch.where(keep, ints[:, U_MISMATCHES], 0).sum(),
                          (keep & (ints[:, U_INFORMATIVE] > 0)).sum(), unknown.sum(), nonfinite.sum(),
                          worst, first_nonfinite]).double()
    rows = torch.cat([tile.double(), ints.double(), floats], -1)
    head = torch.cat([counts, rows[worst], rows[first_nonfinite]]).cpu().tolist()
    n_units, n_failing, n_compared, n_bad, n_nontrivial, n_unknown, n_nonfinite, i_worst, i_nonfinite = \
        (int(v) for v in head[:9])
    if n_units == 0:
        return Comparison(Status.NOT_RUN)
    if n_units <= HOST_UNITS or n_unknown:  # every unit on the host, as the reference makes them
        host = torch.cat([rows, first_lin.double()[:, None]], -1)[keep.nonzero().squeeze(1)].cpu().tolist()
        kept = keep.nonzero().squeeze(1).cpu().tolist()
        table = UnitTable(tile, ints, floats, k_block, exact, 0, 0, 0, 0, 0, frozenset())
        out, budget = [], max_detail_tiles
        for r, v in zip(kept, host):
            first = ()
            if v[2 + U_MISMATCHES] and budget > 0:
                budget -= 1
                first = details(r, int(v[-1]))
            out.append(table.unit(v[:2], v[2:10], v[10:16], first, shown=False))
        return combine([Comparison(Status.MATCH, tuple(out))])
    shown: dict[int, tuple] = {i_worst: tuple(head[9:9 + _ROW])}
    if n_nonfinite:
        shown.setdefault(i_nonfinite, tuple(head[9 + _ROW:9 + 2 * _ROW]))
    bad_tiles, detailed = frozenset(), {}
    if n_failing:
        failing = fail.nonzero().squeeze(1)
        first = failing[:max_detail_tiles]
        got = torch.cat([tile[failing].double().reshape(-1), first.double(),
                         torch.cat([rows[first], first_lin[first].double()[:, None]], -1).reshape(-1)]).cpu().tolist()
        n2 = 2 * n_failing
        bad_tiles = frozenset(zip((int(v) for v in got[0:n2:2]), (int(v) for v in got[1:n2:2])))
        at = n2 + len(first)
        for k, r in enumerate(int(v) for v in got[n2:at]):
            v = got[at + k * (_ROW + 1):at + (k + 1) * (_ROW + 1)]
            shown[r] = tuple(v[:_ROW])
            detailed[r] = details(r, int(v[_ROW]))
    table = UnitTable(tile, ints, floats, k_block, exact, n_units, n_failing, n_compared, n_bad, n_nontrivial,
                      bad_tiles, tuple(sorted(detailed.items())))
    units = tuple(table.unit(v[:2], v[2:10], v[10:16], detailed.get(r, ())) for r, v in sorted(shown.items()))
    return combine([Comparison(Status.MATCH, units, tables=(table,))])


def _worst(keep: torch.Tensor, fail: torch.Tensor, ints: torch.Tensor, floats: torch.Tensor) -> torch.Tensor:
    """The index of Comparison.worst's unit, on the device: the largest (failing, err/bound,
    mismatches, max_abs_err), the first tile on ties."""
    cand = keep & (fail | ~fail.any())
    for col in (floats[:, U_MAX_RATIO], ints[:, U_MISMATCHES].double(), floats[:, U_MAX_ABS]):
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

"""`compare_fast`: the per-tile statistics of one pass (oracle.judging.compare_fast.launch) as the same
Comparison as oracle.judging.compare.compare_reference, one TileMetrics per tile, and the second look at
failing tiles for their first bad elements (`_first_bad`, bounded chunks of rows).
"""

from __future__ import annotations

from typing import Optional

import torch

from oracle.judging.comparison import FIRST_BAD, BadElement, Comparison, Status, TileMetrics, combine, exact_equal
from oracle.judging.compare_fast.fold import _tile_fields
from oracle.judging.compare_fast.kinds import inline_bound
from oracle.judging.compare_fast.launch import tile_stats
from oracle.judging.compare_fast.plan import FastConfig
from oracle.judging.compare_fast.stats import _NO_BAD

_DETAIL_CHUNK = 1 << 18  # elements per chunk of the second look at a failing tile


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
    ints, floats = _tile_fields(stats.rows.cpu())
    base_ti = tile_index if (tile_shape is None and tile_index is not None) else (origin[0] // th, origin[1] // tw)
    out = []
    budget = max_detail_tiles
    for i, (irow, frow) in enumerate(zip(ints, floats)):
        in_h = min(th, h - i * th)
        for j, ((cmp_, nbad, nr, ne, ir, ie, info, first_lin), (mabs, mrel, mratio, rel_l2, cosine, ampl)) in \
                enumerate(zip(irow, frow)):
            if cmp_ == 0:
                continue
            first = ()
            if nbad and budget > 0:
                budget -= 1
                first = _first_bad(received, expected, bound, rtol, atol, mask, exact, first_lin,
                                   (i * th, min(h, i * th + th)), (j * tw, min(w, j * tw + tw)), origin)
            out.append(TileMetrics(
                tile=(base_ti[0] + i, base_ti[1] + j), k_block=k_block, compared=cmp_,
                excluded=in_h * min(tw, w - j * tw) - cmp_, mismatches=nbad, max_abs_err=mabs, max_rel_err=mrel,
                max_ratio=mratio, rel_l2=rel_l2, cosine=cosine, amplification=ampl, nan_received=nr,
                nan_expected=ne, inf_received=ir, inf_expected=ie, trivial=info == 0, exact=exact, first_bad=first))
    return combine([Comparison(Status.MATCH, tuple(out))]) if out else Comparison(Status.NOT_RUN)


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

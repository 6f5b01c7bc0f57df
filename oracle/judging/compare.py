"""Per-tile comparison of a received tensor against an expected one, returning evidence.

Whole-tensor metrics hide a single bad tile, so every metric is computed per tile and the worst
tile is what is judged. A comparison is either bit-exact (data movement: NaN matches NaN) or
bounded per element (`bound`, same shape). Elements can be excluded (`mask` False): elements a
kernel did not record, or padding past the real extent that no valid output depends on. Elements
marked `unwritten` (an output still holding the harness's poison) fail whatever they hold.
A comparison also carries its evidence (oracle.judging.evidence): what fed it and what was masked.

This module owns the specification (`compare_reference`, torch, float64) and `compare`, which
sends large CUDA tensors to oracle.judging.compare_fast; the types they return are oracle.judging.comparison's.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

# The evidence types live below both comparators (oracle.judging.comparison); they are re-exported here,
# where callers have always imported them from.
from oracle.judging.comparison import (FIRST_BAD, NOT_RUN, TRIVIAL, BadElement, Comparison, Status,  # noqa: F401
                               TileMetrics, _num, combine, exact_equal, status_of)


def _tiles(x: torch.Tensor, th: int, tw: int, fill) -> torch.Tensor:
    """[H, W] -> [Th, Tw, th*tw], padding with `fill`."""
    h, w = x.shape
    th_n, tw_n = -(-h // th), -(-w // tw)
    if (th_n * th, tw_n * tw) != (h, w):
        p = torch.full((th_n * th, tw_n * tw), fill, dtype=x.dtype, device=x.device)
        p[:h, :w] = x
        x = p
    return x.reshape(th_n, th, tw_n, tw).permute(0, 2, 1, 3).reshape(th_n, tw_n, th * tw)


FAST_MIN_ELEMENTS = 1 << 20  # CUDA tensors from this size on take the one-pass comparator


def compare(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
            mask: Optional[torch.Tensor] = None, tile_shape: Optional[tuple[int, int]] = None,
            origin: tuple[int, int] = (0, 0), tile_index: Optional[tuple[int, int]] = None,
            k_block: Optional[int] = None, max_detail_tiles: int = 64,
            unwritten: Optional[torch.Tensor] = None) -> Comparison:
    """Compare two 2-D tensors tile by tile.

    bound None means bit-exact. `tile_shape` splits the tensors into tiles (default: one tile);
    `origin` is the global coordinate of element [0, 0]; `tile_index` names the single tile when
    no split is asked for (default: origin // shape).

    Large CUDA tensors go to `oracle.judging.compare_fast.compare_fast` (one Triton pass, O(tiles) extra
    memory, the same Comparison); everything else to `compare_reference`, the specification."""
    kw = dict(bound=bound, mask=mask, tile_shape=tile_shape, origin=origin, tile_index=tile_index,
              k_block=k_block, max_detail_tiles=max_detail_tiles)
    if unwritten is not None and bool(unwritten.any()):
        return compare_reference(received, expected, unwritten=unwritten, **kw)
    if received.is_cuda and received.numel() >= FAST_MIN_ELEMENTS and received.shape == expected.shape:
        from oracle.judging.compare_fast import check_supported, compare_fast  # on first use: it imports Triton

        if (bound is not None or received.dtype == expected.dtype) and \
                not check_supported(received, expected, bound=bound, mask=mask):
            return compare_fast(received, expected, **kw)
    return compare_reference(received, expected, **kw)


def compare_reference(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
                      mask: Optional[torch.Tensor] = None, tile_shape: Optional[tuple[int, int]] = None,
                      origin: tuple[int, int] = (0, 0), tile_index: Optional[tuple[int, int]] = None,
                      k_block: Optional[int] = None, max_detail_tiles: int = 64,
                      unwritten: Optional[torch.Tensor] = None) -> Comparison:
    """The reference comparison in torch, float64 element by element: the specification of every
    metric (see `compare` for the arguments). Its temporaries grow with the tensors."""
    if received.shape != expected.shape:
        raise ValueError(f"received shape {tuple(received.shape)} != expected shape {tuple(expected.shape)}")
    if received.dim() != 2:
        raise ValueError(f"compare takes 2-D tensors, got {received.dim()}-D")
    h, w = received.shape
    th, tw = tile_shape or (h, w)
    th, tw = max(th, 1), max(tw, 1)
    exact = bound is None
    stats, fstats, (bad, r, e, b, never) = _tile_stats(received, expected, bound, mask, unwritten, th, tw)
    stats, fstats = stats.cpu().tolist(), fstats.cpu().tolist()
    tiles_h, tiles_w = len(stats[0]), len(stats[0][0]) if stats[0] else 0
    grid_single = tile_shape is None
    base_ti = tile_index if (grid_single and tile_index is not None) else (origin[0] // th, origin[1] // tw)
    out = []
    detail_budget = max_detail_tiles
    for i in range(tiles_h):
        for j in range(tiles_w):
            (cmp_, exc, nbad, nr, ne, ir, ie, info, nvr) = (s[i][j] for s in stats)
            if cmp_ == 0:
                continue
            (mabs, mrel, mrat, dsq, esq, rsq, dt, sr, se) = (s[i][j] for s in fstats)
            first = ()
            if nbad and detail_budget > 0:
                detail_budget -= 1
                first = _first_bad(bad, r, e, b, i * th, j * tw, th, tw, origin, never)
            out.append(_metrics((base_ti[0] + i, base_ti[1] + j), k_block, exact, first,
                                (cmp_, exc, nbad, nr, ne, ir, ie, info, nvr),
                                (mabs, mrel, mrat, dsq, esq, rsq, dt, sr, se)))
    return combine([Comparison(Status.MATCH, tuple(out))]) if out else Comparison(Status.NOT_RUN)


def _metrics(tile, k_block, exact, first, counts, floats, labels=None) -> TileMetrics:
    cmp_, exc, nbad, nr, ne, ir, ie, info, nvr = counts
    mabs, mrel, mrat, dsq, esq, rsq, dt, sr, se = floats
    return TileMetrics(**(labels or {}),
        tile=tile, k_block=k_block, compared=cmp_, excluded=exc,
        mismatches=nbad, max_abs_err=mabs, max_rel_err=mrel, max_ratio=mrat,
        rel_l2=math.sqrt(dsq / esq) if esq > 0 else (0.0 if dsq == 0 else math.inf),
        cosine=dt / math.sqrt(esq * rsq) if esq > 0 and rsq > 0 else (1.0 if esq == rsq else 0.0),
        amplification=sr / se if se > 0 else (1.0 if sr == 0 else math.inf),
        nan_received=nr, nan_expected=ne, inf_received=ir, inf_expected=ie,
        trivial=info == 0, exact=exact, first_bad=first, unwritten=nvr)


def compare_units(received: torch.Tensor, expected: torch.Tensor, *, origins, tiles, k_blocks,
                  bound: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None,
                  labels: Optional[Sequence[dict]] = None) -> list[Comparison]:
    """Many whole-tensor comparisons of one shape in one pass: received, expected (and bound, mask)
    [U, R, C], unit u at global `origins[u]`, named `tiles[u]` and `k_blocks[u]`. Returns, in unit
    order, what compare_reference(received[u], expected[u], bound=bound[u], mask=mask[u],
    origin=origins[u], tile_index=tiles[u], k_block=k_blocks[u]) returns, with two host reads for
    the metrics of every unit and two for the first bad elements of every failing one. `labels[u]`:
    TileMetrics fields unit u is made with (comparison.unit_labels)."""
    if received.shape != expected.shape:
        raise ValueError(f"received shape {tuple(received.shape)} != expected shape {tuple(expected.shape)}")
    if received.dim() != 3:
        raise ValueError(f"compare_units takes [units, rows, cols] tensors, got {received.dim()}-D")
    n, h, w = received.shape
    if not (len(origins) == len(tiles) == len(k_blocks) == n):
        raise ValueError(f"{n} units need as many origins, tiles and k_blocks (got {len(origins)}, {len(tiles)}, "
                         f"{len(k_blocks)})")
    if n == 0:
        return []
    flat = (lambda t: None if t is None else t.expand(n, h, w).reshape(n * h, w))
    exact = bound is None
    stats, fstats, (bad, r, e, b, never) = _tile_stats(flat(received), flat(expected), flat(bound), flat(mask), None,
                                                       h, w)
    stats, fstats = stats.reshape(-1, n).t().cpu().tolist(), fstats.reshape(-1, n).t().cpu().tolist()  # per unit
    firsts = _first_bad_units(bad, r, e, b, never, h, origins, [u for u in range(n) if stats[u][0] and stats[u][2]])
    out = []
    for u in range(n):
        counts = stats[u]
        if counts[0] == 0:
            out.append(Comparison(Status.NOT_RUN))
            continue
        tm = _metrics(tuple(tiles[u]), k_blocks[u], exact, firsts.get(u, ()), counts, fstats[u],
                      labels[u] if labels is not None else None)
        out.append(Comparison(status_of((tm,)), (tm,)))  # combine's answer for the one unit
    return out


def _first_bad_units(bad, r, e, b, never, h, origins, failing) -> dict[int, tuple[BadElement, ...]]:
    """The first bad elements (row-major) of each failing unit of a [units * h, w] stack."""
    if not failing:
        return {}
    idx = bad.nonzero()
    unit = idx[:, 0] // h
    rank = torch.arange(idx.shape[0], device=idx.device) - torch.searchsorted(unit, unit, right=False)
    idx = idx[rank < FIRST_BAD]
    gi, gj = idx[:, 0], idx[:, 1]
    vals = torch.stack([r[gi, gj], e[gi, gj], b[gi, gj], never[gi, gj].double()], dim=1)
    out: dict[int, list] = {}
    for (i, j), (rv, ev, bv, nv) in zip(idx.cpu().tolist(), vals.cpu().tolist()):
        u = i // h
        out.setdefault(u, []).append(BadElement(origins[u][0] + i - u * h, origins[u][1] + j, rv, ev, bv, bool(nv)))
    return {u: tuple(v) for u, v in out.items()}


def _tile_stats(received, expected, bound, mask, unwritten, th: int, tw: int):
    """Every metric's per-tile sums and maxima of a 2-D comparison split into th x tw tiles, stacked
    [9, tiles_h, tiles_w] on its device (counts, floats: see compare_reference), and the element maps the first
    bad elements are read from (bad, received, expected, bound, never written), float64."""
    h, w = received.shape
    exact = bound is None
    dev = received.device
    keep = torch.ones(h, w, dtype=torch.bool, device=dev) if mask is None else mask.to(dev)
    if exact:
        if received.dtype != expected.dtype:
            raise ValueError(f"bit-exact compare needs one dtype, got {received.dtype} and {expected.dtype}")
        ok = exact_equal(received, expected)
    r = received.to(torch.float64)
    e = expected.to(dev, torch.float64)
    err = (r - e).abs()
    r_nan, e_nan = torch.isnan(r), torch.isnan(e)
    r_inf, e_inf = torch.isinf(r), torch.isinf(e)
    if not exact:
        b = bound.to(dev, torch.float64)
        both_nan = r_nan & e_nan
        same_inf = r_inf & e_inf & (torch.sign(r) == torch.sign(e))
        finite_both = torch.isfinite(r) & torch.isfinite(e)
        ok = both_nan | same_inf | (finite_both & (err <= b))
        ratio = torch.where(finite_both, err / b.clamp(min=1e-300), torch.full_like(err, math.inf))
        ratio = torch.where(finite_both & (err == 0), torch.zeros_like(err), ratio)
        ratio = torch.where(both_nan | same_inf, torch.zeros_like(err), ratio)
    else:
        b = torch.zeros_like(err)
        ratio = torch.where(ok, torch.zeros_like(err), torch.full_like(err, math.inf))
    never = torch.zeros_like(keep) if unwritten is None else unwritten.to(dev) & keep
    if unwritten is not None:
        ok = ok & ~never
        ratio = torch.where(never, torch.full_like(ratio, math.inf), ratio)
    bad = ~ok & keep
    finite = torch.isfinite(r) & torch.isfinite(e) & keep
    err_f = torch.where(finite, err, torch.zeros_like(err))
    rel = torch.where(finite & (e.abs() > TRIVIAL), err / e.abs().clamp(min=TRIVIAL), torch.zeros_like(err))
    ratio = torch.where(keep, ratio, torch.zeros_like(ratio))
    rf = torch.where(finite, r, torch.zeros_like(r))
    ef = torch.where(finite, e, torch.zeros_like(e))

    def T(x, fill=0):
        return _tiles(x, th, tw, fill)

    n_cmp = T(keep).sum(-1)
    n_exc = T(~keep).sum(-1)
    n_bad = T(bad).sum(-1)
    max_abs = T(err_f).amax(-1)
    max_rel = T(rel).amax(-1)
    max_ratio = T(ratio).amax(-1)
    diff_sq = T((rf - ef) ** 2).sum(-1)
    e_sq = T(ef * ef).sum(-1)
    r_sq = T(rf * rf).sum(-1)
    dot = T(rf * ef).sum(-1)
    sum_r = T(rf.abs()).sum(-1)
    sum_e = T(ef.abs()).sum(-1)
    nan_r, nan_e = T(r_nan & keep).sum(-1), T(e_nan & keep).sum(-1)
    inf_r, inf_e = T(r_inf & keep).sum(-1), T(e_inf & keep).sum(-1)
    informative = T((e.abs() > TRIVIAL) & keep).sum(-1)
    n_never = T(never).sum(-1)

    stats = torch.stack([n_cmp, n_exc, n_bad, nan_r, nan_e, inf_r, inf_e, informative, n_never])
    fstats = torch.stack([max_abs, max_rel, max_ratio, diff_sq, e_sq, r_sq, dot, sum_r, sum_e])
    return stats, fstats, (bad, r, e, b, never)


def _first_bad(bad, r, e, b, r0, c0, th, tw, origin, never) -> tuple[BadElement, ...]:
    sub = bad[r0:r0 + th, c0:c0 + tw]
    idx = sub.nonzero()[:FIRST_BAD].cpu().tolist()
    res = []
    for ii, jj in idx:
        gi, gj = r0 + ii, c0 + jj
        res.append(BadElement(origin[0] + gi, origin[1] + gj, float(r[gi, gj]), float(e[gi, gj]), float(b[gi, gj]),
                              bool(never[gi, gj])))
    return tuple(res)

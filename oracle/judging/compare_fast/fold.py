"""The fold: the partial rows of a tile's programs into one row per tile (`_fold`), and the folded
rows into every tile's integer and float fields by the reference's formulas (`_tile_fields`), both
in float64 on the tensors' device (IEEE division and square root, like `math`): nothing per tile
crosses to the host here.
"""

from __future__ import annotations

import math

import torch

from oracle.judging.compare_fast.plan import _Plan
from oracle.judging.compare_fast.stats import (NSTAT, S_BAD, S_COMPARED, S_D2, S_DOT, S_E2, S_FIRST_BAD, S_INF_E,
                                       S_INF_R, S_INFO, S_MAX_ABS, S_MAX_RATIO, S_MAX_REL, S_NAN_E, S_NAN_R,
                                       S_R2, S_RATIO_NAN, S_SUM_E, S_SUM_R)


def _fold(out: torch.Tensor, plan: _Plan) -> torch.Tensor:
    parts = out.view(plan.tiles_h, plan.tiles_w, plan.per_tile, NSTAT)
    if plan.per_tile == 1:
        return parts[:, :, 0]
    folded = parts.sum(2)
    folded[..., S_MAX_ABS:S_MAX_RATIO + 1] = parts[..., S_MAX_ABS:S_MAX_RATIO + 1].amax(2)
    folded[..., S_FIRST_BAD] = parts[..., S_FIRST_BAD].amin(2)
    return folded


def _tile_fields(rows: torch.Tensor, shape: tuple[int, int], tile_shape: tuple[int, int]):
    """Folded rows [tiles_h, tiles_w, NSTAT] (float64) -> per tile, flattened in row-major tile
    order on the rows' device: the integer fields [U, 8] int64 (oracle.judging.comparison U_COMPARED ..
    U_INFORMATIVE: compared, excluded, mismatches, NaN/Inf counts, informative), the float fields
    [U, 6] float64 (U_MAX_ABS .. U_AMPLIFICATION) and the linear index of the first bad element [U]."""
    c = rows.reshape(-1, NSTAT).unbind(-1)
    dsq, esq, rsq, dot, sr, se = c[S_D2], c[S_E2], c[S_R2], c[S_DOT], c[S_SUM_R], c[S_SUM_E]
    inf, nan = math.inf, math.nan
    zero = torch.zeros((), dtype=torch.float64, device=rows.device)
    rel_l2 = torch.where(esq > 0, torch.sqrt(dsq / esq), torch.where(dsq == 0, zero, zero + inf))
    cosine = torch.where((esq > 0) & (rsq > 0), dot / torch.sqrt(esq * rsq), torch.where(esq == rsq, zero + 1, zero))
    ampl = torch.where(se > 0, sr / se, torch.where(sr == 0, zero + 1, zero + inf))
    ratio = torch.where(c[S_RATIO_NAN] > 0, zero + nan, c[S_MAX_RATIO])
    floats = torch.stack([c[S_MAX_ABS], c[S_MAX_REL], ratio, rel_l2, cosine, ampl], -1)
    (h, w), (th, tw) = shape, tile_shape
    tiles_h, tiles_w = rows.shape[:2]
    in_h = (h - torch.arange(tiles_h, device=rows.device) * th).clamp(max=th)
    in_w = (w - torch.arange(tiles_w, device=rows.device) * tw).clamp(max=tw)
    compared = c[S_COMPARED].to(torch.int64)
    excluded = (in_h[:, None] * in_w[None, :]).reshape(-1) - compared
    ints = torch.stack([compared, excluded, c[S_BAD].to(torch.int64), c[S_NAN_R].to(torch.int64),
                        c[S_NAN_E].to(torch.int64), c[S_INF_R].to(torch.int64), c[S_INF_E].to(torch.int64),
                        c[S_INFO].to(torch.int64)], -1)
    return ints, floats, c[S_FIRST_BAD].to(torch.int64)

"""The host-side fold: the partial rows of a tile's programs into one row per tile (`_fold`, in
float64 on the device), and a folded row into a tile's integer and float fields by the reference's
formulas (`_tile_fields`, on the CPU).
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


def _tile_fields(rows: torch.Tensor) -> tuple[list, list]:
    """Folded rows [tiles_h, tiles_w, NSTAT] (CPU, float64) -> per tile the integer fields
    (compared, mismatches, NaN/Inf counts, informative, first bad index) and the float fields
    (max_abs_err, max_rel_err, max_ratio, rel_l2, cosine, amplification), the latter by the
    reference's formulas (IEEE division and square root, like `math`)."""
    c = rows.unbind(-1)
    dsq, esq, rsq, dot, sr, se = c[S_D2], c[S_E2], c[S_R2], c[S_DOT], c[S_SUM_R], c[S_SUM_E]
    inf, nan = torch.tensor(math.inf, dtype=torch.float64), torch.tensor(math.nan, dtype=torch.float64)
    one, zero = torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    rel_l2 = torch.where(esq > 0, torch.sqrt(dsq / esq), torch.where(dsq == 0, zero, inf))
    cosine = torch.where((esq > 0) & (rsq > 0), dot / torch.sqrt(esq * rsq), torch.where(esq == rsq, one, zero))
    ampl = torch.where(se > 0, sr / se, torch.where(sr == 0, one, inf))
    ratio = torch.where(c[S_RATIO_NAN] > 0, nan, c[S_MAX_RATIO])
    floats = torch.stack([c[S_MAX_ABS], c[S_MAX_REL], ratio, rel_l2, cosine, ampl], -1).tolist()
    ints = torch.stack([c[S_COMPARED], c[S_BAD], c[S_NAN_R], c[S_NAN_E], c[S_INF_R], c[S_INF_E], c[S_INFO],
                        c[S_FIRST_BAD]], -1).to(torch.int64).tolist()
    return ints, floats

"""The fold: the partial rows of a tile's programs into one row per tile (`_fold`, in float64 on
the device), and one folded row, on the host, into its tile's integer and float fields by the
reference's formulas (`_tile_fields`: IEEE division and square root, as torch computes them).
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


def _tile_fields(row) -> tuple[tuple, tuple, int]:
    """A folded row (NSTAT floats, columns S_*) -> (compared, mismatches, first bad index), the float
    fields (max_abs_err, max_rel_err, max_ratio, rel_l2, cosine, amplification) and the counts
    (NaN received / expected, Inf received / expected, informative)."""
    dsq, esq, rsq, dot, sr, se = row[S_D2], row[S_E2], row[S_R2], row[S_DOT], row[S_SUM_R], row[S_SUM_E]
    rel_l2 = math.sqrt(dsq / esq) if esq > 0 else (0.0 if dsq == 0 else math.inf)
    cosine = dot / math.sqrt(esq * rsq) if esq > 0 and rsq > 0 else (1.0 if esq == rsq else 0.0)
    ampl = sr / se if se > 0 else (1.0 if sr == 0 else math.inf)
    ratio = math.nan if row[S_RATIO_NAN] > 0 else row[S_MAX_RATIO]
    floats = (row[S_MAX_ABS], row[S_MAX_REL], ratio, rel_l2, cosine, ampl)
    counts = tuple(int(row[c]) for c in (S_NAN_R, S_NAN_E, S_INF_R, S_INF_E, S_INFO))
    return (int(row[S_COMPARED]), int(row[S_BAD]), int(row[S_FIRST_BAD])), floats, counts

"""What one pass leaves: the columns of a row of partial statistics (S_*, NSTAT; the kernels write
them by these positions) and `TileStats`, the rows folded into one per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Columns of a row of partial statistics.
(S_COMPARED, S_BAD, S_NAN_R, S_NAN_E, S_INF_R, S_INF_E, S_INFO, S_MAX_ABS, S_MAX_REL, S_MAX_RATIO,
 S_RATIO_NAN, S_D2, S_E2, S_R2, S_DOT, S_SUM_R, S_SUM_E, S_FIRST_BAD, S_GENERAL) = range(19)
NSTAT = 19
_NO_BAD = 2.0 ** 62  # "no bad element" in S_FIRST_BAD; larger than any linear index


@dataclass(frozen=True)
class TileStats:
    """Per-tile statistics from the one pass, folded in float64: `rows` is [tiles_h, tiles_w, NSTAT]
    on the tensors' device (columns S_*), before any host work."""
    rows: torch.Tensor
    shape: tuple[int, int]
    tile_shape: tuple[int, int]
    programs: int

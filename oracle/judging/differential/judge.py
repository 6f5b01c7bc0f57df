"""How one comparison of a stage is judged."""

from __future__ import annotations

import torch

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(_INT_OF_SIZE[x.element_size()])

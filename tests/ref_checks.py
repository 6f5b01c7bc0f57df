"""Seeded operands and a NaN-aware equality for the reference stages' tests."""

import torch


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ints(shape, lo: int, hi: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Small integers: exactly representable in every operand type and summed exactly in fp32."""
    return torch.randint(lo, hi + 1, shape, generator=gen(seed)).to(dtype)


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values, NaN where NaN (float64 comparison)."""
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    return g.shape == w.shape and torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(0), w.nan_to_num(0))

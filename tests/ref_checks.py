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


def block_scaled_operands(m: int, n: int, k: int, gn: int, gk: int, seed: int, scale_seed: int, pow2: bool = True):
    """fp8 A [m, k] and B [k, n] of small integers, and their block scales: A's per row and k group
    [m, k / gk], B's per gn columns and k group [n / gn, k / gk]; powers of two (exact products) or
    values in [0.5, 1.5). Returns (a, b, sa, sb, (1, gn, gk)), the last the block scale groups."""
    a = ints((m, k), -6, 6, torch.float8_e4m3fn, seed)
    b = ints((k, n), -6, 6, torch.float8_e4m3fn, seed + 1)
    g = gen(scale_seed)
    shape_a, shape_b = (m, -(-k // gk)), (-(-n // gn), -(-k // gk))
    if pow2:
        sa = 2.0 ** torch.randint(-3, 4, shape_a, generator=g).float()
        sb = 2.0 ** torch.randint(-3, 4, shape_b, generator=g).float()
    else:
        sa = torch.rand(shape_a, generator=g) + 0.5
        sb = torch.rand(shape_b, generator=g) + 0.5
    return a, b, sa, sb, (1, gn, gk)

"""Seeded operands: what the envelope measurement (benchmarks.numerics.families) runs, and what the tests
that hold the tolerance models to emulated and measured engines feed them."""

import torch

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32,
         "e4m3": torch.float8_e4m3fn}


def gemm_inputs(kind: str, dtype: str, m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A [m, k] and B [k, n] in `dtype`: normal, all-positive, outlier-channel (every 256th column
    of A scaled up) or cancelling (the second half of K undoes the first: the result is tiny
    against S)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g, dtype=torch.float64)
    b = torch.randn(k, n, generator=g, dtype=torch.float64)
    if kind == "positive":
        a, b = a.abs(), b.abs()
    elif kind == "outlier":
        a[:, torch.randperm(k, generator=g)[:max(1, k // 256)]] *= 8.0 if dtype == "e4m3" else 1000.0
    elif kind == "cancel":
        h = k // 2
        a[:, h:2 * h] = a[:, :h]
        b[h:2 * h] = -b[:h] + 2.0 ** -6 * torch.randn(h, n, generator=g, dtype=torch.float64)
    if dtype == "e4m3":
        a, b = a * 4, b * 4
    t = TORCH[dtype]
    return a.to(torch.float32).to(t), b.to(torch.float32).to(t)

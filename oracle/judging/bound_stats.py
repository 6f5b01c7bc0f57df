"""The per-element statistics an accumulation bound reads (the reference computes them;
kernels_ref.mma_stats.MmaStats): L = sum_j m_j and V = sum_j m_j^2 over a span's k-blocks, with
m_j = max_c |X_(j-1) - X_c| + s_j (oracle.judging.accumulation_bound), and, where known, the sum of
squared products and the split-K partial magnitudes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Stats:
    """Per-element statistics of an accumulation span (module docstring). q: sum of squared products
    (fp32 operands only), pabs / prun: split-K partial magnitudes (None when not computed)."""

    l: torch.Tensor
    v: torch.Tensor
    q: Optional[torch.Tensor] = None
    pabs: Optional[torch.Tensor] = None
    prun: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, st) -> "Stats":
        """From kernels_ref.mma_stats.MmaStats (or anything with l, v, q, pabs, prun)."""
        return cls(st.l, st.v, getattr(st, "q", None), getattr(st, "pabs", None), getattr(st, "prun", None))

    @classmethod
    def crude(cls, x0_abs: torch.Tensor, s: torch.Tensor, n_kb: int) -> "Stats":
        """What |x0| and S alone guarantee: every prefix lies within |x0| + S of 0."""
        x0 = x0_abs.double()
        s = s.double()
        m = 2 * (x0 + s) + s
        return cls(n_kb * m, n_kb * m * m, None, s + x0, n_kb * (x0 + s))


class SpanStats:
    """L and V of a span accumulated k-block by k-block from a known accumulator x0 (teacher
    forcing), and the span's own sum (the accumulator now less x0)."""

    def __init__(self, x0: torch.Tensor):
        x = x0.double()
        self.x0 = x
        self.x = x
        self.lo = torch.minimum(x, torch.zeros_like(x))
        self.hi = torch.maximum(x, torch.zeros_like(x))
        self.l = torch.zeros_like(x)
        self.v = torch.zeros_like(x)

    def add(self, s_block: torch.Tensor, acc_after: torch.Tensor) -> None:
        m = torch.maximum(self.x - self.lo, self.hi - self.x) + s_block.double().abs()
        self.l = self.l + m
        self.v = self.v + m * m
        self.x = acc_after.double()
        self.lo = torch.minimum(self.lo, self.x)
        self.hi = torch.maximum(self.hi, self.x)

    def add_at(self, idx: Optional[torch.Tensor], s_block: torch.Tensor, acc_after: torch.Tensor) -> None:
        """add() for the units `idx` of a stack of spans (first dim; None: every unit)."""
        if idx is None:
            return self.add(s_block, acc_after)
        x, lo, hi = self.x[idx], self.lo[idx], self.hi[idx]
        m = torch.maximum(x - lo, hi - x) + s_block.double().abs()
        self.l = self.l.index_put((idx,), self.l[idx] + m)
        self.v = self.v.index_put((idx,), self.v[idx] + m * m)
        x = acc_after.double()
        self.x = self.x.index_put((idx,), x)
        self.lo = self.lo.index_put((idx,), torch.minimum(lo, x))
        self.hi = self.hi.index_put((idx,), torch.maximum(hi, x))

    def stats(self) -> Stats:
        return Stats(self.l, self.v)

    def span_sum_abs(self) -> torch.Tensor:
        return (self.x - self.x0).abs()

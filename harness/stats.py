"""The statistics of timing, pure Python: the stopping policy, percentiles and the relative
standard error of the median. Shared by the oracle's timing (oracle.run.timing) and the kernel
child process (harness._child), which times the kernel under test with the same rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class Policy:
    """How long to warm up and when to stop; every field is checked with a message naming it."""

    warmup_ms: float = 25.0
    min_reps: int = 10
    max_reps: int = 1000
    rse_target: float = 0.02
    max_ms: float = 1000.0
    use_graph: object = "auto"
    cold_l2: bool = True
    graph_below_ms: float = 0.1

    def __post_init__(self):
        for name in ("warmup_ms", "max_ms", "graph_below_ms"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}={v!r} is not allowed; allowed: a finite number >= 0")
        if not _is_int(self.min_reps) or self.min_reps < 1:
            raise ValueError(f"min_reps={self.min_reps!r} is not allowed; allowed: an integer >= 1")
        if not _is_int(self.max_reps) or self.max_reps < self.min_reps:
            raise ValueError(f"max_reps={self.max_reps!r} is not allowed; allowed: an integer >= min_reps "
                             f"({self.min_reps})")
        if isinstance(self.rse_target, bool) or not isinstance(self.rse_target, (int, float)) \
                or not 0 < self.rse_target < 1:
            raise ValueError(f"rse_target={self.rse_target!r} is not allowed; allowed: 0 < rse_target < 1")
        if not (self.use_graph is True or self.use_graph is False
                or (isinstance(self.use_graph, str) and self.use_graph == "auto")):
            raise ValueError(f"use_graph={self.use_graph!r} is not allowed; allowed: True, False, 'auto'")
        if not isinstance(self.cold_l2, bool):
            raise ValueError(f"cold_l2={self.cold_l2!r} is not allowed; allowed: True, False")


def percentile(sorted_samples: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted samples, interpolated linearly between ranks."""
    n = len(sorted_samples)
    if n == 0:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 1:
        raise ValueError(f"q={q!r} is not allowed; allowed: 0 <= q <= 1")
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_samples[lo] + (sorted_samples[hi] - sorted_samples[lo]) * (pos - lo)


def relative_standard_error(samples: Sequence[float]) -> float:
    """Standard error of the median over the median, from a robust spread: 1.2533 * sigma /
    sqrt(n), sigma = 1.4826 * MAD (the sample stdev when the MAD is zero). Robust to the rare
    preempted rep that would keep a mean-based rule running. inf for fewer than 2 samples."""
    n = len(samples)
    if n < 2:
        return math.inf
    s = sorted(samples)
    med = percentile(s, 0.5)
    if not med > 0:
        return math.inf
    mad = percentile(sorted(abs(x - med) for x in s), 0.5)
    sigma = 1.4826 * mad
    if sigma == 0:
        mean = sum(s) / n
        sigma = math.sqrt(sum((x - mean) ** 2 for x in s) / (n - 1))
    return 1.2533 * sigma / math.sqrt(n) / med


def stop_reason(n: int, rse: float, elapsed_ms: float, policy: Policy) -> Optional[str]:
    """Why to stop after n reps (None: go on). min_reps always run; max_reps is a hard cap;
    in between, stop when converged (rse <= rse_target) or when max_ms of host time is spent."""
    if n >= policy.max_reps:
        return "max_reps"
    if n < policy.min_reps:
        return None
    if rse <= policy.rse_target:
        return "converged"
    if elapsed_ms >= policy.max_ms:
        return "max_ms"
    return None

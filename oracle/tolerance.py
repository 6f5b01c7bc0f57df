"""Per-element error bounds, from one table keyed by (stage, dtype).

Data-movement stages (descriptor, load, store, and a cast fed exactly) are bit-exact: a NaN
matches a NaN, nothing else is tolerated. Arithmetic stages get a bound per element:

mma, fp32 accumulator, a span of n products starting from an exactly known accumulator x0:
    |kernel - reference| <= 2 * lam * u * sqrt(n + 1) * (|x0| + S)
  where S = sum_k |a_k||b_k| (times |block scales|), u = 2^-23 (one ulp: tensor cores may
  truncate) and lam = 8. Rounding errors of a long sum behave like a random walk, so their
  size grows with sqrt(n), not n (Higham and Mary's probabilistic bound); lam = 8 puts the
  chance of a correct element exceeding it far below one in 10^9. The factor 2 covers the
  reference's own rounding. A dropped or repeated k-block changes an element by a whole
  partial dot product ~ sqrt(BK) * |a||b|, far above this.
mma, fp16 accumulator (rounded after every MMA instruction, mma_k products): deterministic,
    2 * u16 * ceil(n / mma_k) * (|x0| + S).
mma, fp8 with promotion interval P (tensor-core partial sums kept to 13 mantissa bits):
    2 * (P / 32) * 2^-13 * (|x0| + S) + the fp32 term.
mma, int32: exact.
epilogue (fp32 arithmetic on an exactly known input x, result y):
    scale 4u|y|; alpha_beta 3u(|alpha x| + |beta c|); bias 2u(|x| + |bias|);
    activation 2^8 u (|x| + |y|) (accurate erf/tanh/exp assumed), relu exact;
    cast: exact when its input is exact, else the input bound plus one ulp of the output type.
A bound carried through a step grows by the step's gain: |scale|, |alpha|, 1 (bias, cast),
and 1.13 (the largest slope of gelu and silu).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from kernels_ref.dtypes import DTYPES

LAMBDA = 8.0
U32 = 2.0**-23
ACTIVATION_SLOPE = {"none": 1.0, "relu": 1.0, "gelu_erf": 1.13, "gelu_tanh": 1.13, "silu": 1.1}


class ToleranceError(KeyError):
    """No tolerance model for a (stage, dtype): a missing key is an error, never a default."""


@dataclass(frozen=True)
class Model:
    name: str  # "exact" | "accumulate" | "elementwise"
    doc: str
    u: float = 0.0


TABLE: dict[tuple[str, str], Model] = {}


def _register(stages, dtypes, model: Model) -> None:
    for s in stages:
        for d in dtypes:
            TABLE[(s, d)] = model


_ALL = ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int8", "int32")
_register(("descriptor", "load", "epilogue_store"), _ALL, Model("exact", "bit-exact data movement"))
_register(("mma",), ("fp32",), Model("accumulate", "fp32 accumulation, probabilistic bound", U32))
_register(("mma",), ("fp16",), Model("accumulate", "fp16 accumulation per MMA step, deterministic", 2.0**-11))
_register(("mma",), ("int32",), Model("exact", "integer accumulation is exact"))
for _s in ("epilogue_scale", "epilogue_alpha_beta", "epilogue_bias", "epilogue_activation"):
    _register((_s,), ("fp32",), Model("elementwise", f"fp32 {_s[9:]}", U32))
_register(("epilogue_cast",), ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int32"),
          Model("elementwise", "round to nearest even; exact on an exact input"))


def lookup(stage: str, dtype: str) -> Model:
    family = stage if stage.startswith("epilogue") or stage == "mma" else stage.split("_")[0]
    try:
        return TABLE[(family, dtype)]
    except KeyError:
        raise ToleranceError(f"no tolerance model for stage {stage!r} with dtype {dtype!r}") from None


def mma_bound(spec, x0_abs: torch.Tensor, s: torch.Tensor, n: int) -> torch.Tensor:
    """Bound on |kernel - reference| for an accumulator after a span of `n` products.

    x0_abs: |accumulator| at the start of the span (exactly known: a tap, or 0);
    s: sum of |a||b| (scaled) over the span."""
    model = lookup("mma", spec.acc_dtype)
    if model.name == "exact":
        return torch.zeros_like(s)
    mag = x0_abs + s
    if spec.acc_dtype == "fp16":
        steps = math.ceil(n / DTYPES[spec.a_dtype].mma_k)
        return 2.0 * model.u * steps * mag
    bound = 2.0 * LAMBDA * model.u * math.sqrt(n + 1) * mag
    if spec.promotion_interval:
        bound = bound + 2.0 * (spec.promotion_interval / 32) * 2.0**-13 * mag
    return bound


def ulp(y: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """Spacing of dtype `dtype_name` at |y| (float64), subnormals included."""
    d = DTYPES[dtype_name]
    if not d.is_float:
        return torch.ones_like(y, dtype=torch.float64)
    fi = torch.finfo(d.torch)
    mant = round(-math.log2(d.unit_roundoff)) - 1
    a = y.abs().to(torch.float64).clamp(min=fi.tiny)
    _, e = torch.frexp(a)  # exact, where log2 on a GPU can land just under an integer at a power of two
    return torch.pow(2.0, (e - 1 - mant).to(torch.float64))


# Step bounds on an exactly known input. Each returns (own_bound, gain) as float64 tensors.
StepBound = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def scale_step(y, factor) -> tuple[torch.Tensor, torch.Tensor]:
    lookup("epilogue_scale", "fp32")
    return 4 * U32 * y.abs(), factor.abs()


def alpha_beta_step(x, c, alpha: float, beta: float):
    lookup("epilogue_alpha_beta", "fp32")
    cterm = (beta * c).abs() if c is not None else 0.0
    return 3 * U32 * ((alpha * x).abs() + cterm), torch.full_like(x, abs(alpha))


def bias_step(x, bias_b):
    lookup("epilogue_bias", "fp32")
    return 2 * U32 * (x.abs() + bias_b.abs()), torch.ones_like(x)


def activation_step(x, y, kind: str):
    lookup("epilogue_activation", "fp32")
    own = torch.zeros_like(x) if kind in ("none", "relu") else 2.0**8 * U32 * (x.abs() + y.abs())
    return own, torch.full_like(x, ACTIVATION_SLOPE[kind])


def cast_bound(bound_in: torch.Tensor, y: torch.Tensor, out_dtype: str) -> torch.Tensor:
    """A cast is exact on an exact input; otherwise the input bound plus one output ulp."""
    lookup("epilogue_cast", out_dtype)
    return torch.where(bound_in > 0, bound_in + ulp(y, out_dtype), torch.zeros_like(bound_in))


def reduce_bound(abs_sum: torch.Tensor, n_partials: int) -> torch.Tensor:
    """Bound on a sum of `n_partials` fp32 partials done in any order, against the reference's sum in
    partial order: each of the n-1 additions rounds once on either side, at most u of the running
    magnitude, which sum |p| bounds (deterministic: the order is not known)."""
    return 2.0 * max(n_partials - 1, 0) * U32 * abs_sum

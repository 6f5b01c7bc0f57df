"""Per-element error bounds of the stages other than the accumulation, from one table keyed by
(stage, dtype); the accumulation's bound is oracle.judging.accumulation_bound.

Data-movement stages (descriptor, load, store, and a cast fed exactly) are bit-exact: a NaN
matches a NaN, nothing else is tolerated. Arithmetic stages get a bound per element.

epilogue (fp32 arithmetic on an exactly known input x, result y):
    scale 4u|y|; alpha_beta 3u(|alpha x| + |beta c|) (a declared graph's alpha alone u|alpha x|,
    beta_c alone 2u(|x| + |beta c|)); bias 2u(|x| + |bias|);
    activation 2^8 u (|x| + |y|) (accurate erf/tanh/exp), or the measured constant of an
    approximate implementation (activation_impl = "fast": tanh.approx GELU, ex2.approx SiLU);
    relu exact; cast: exact on an exact input, else the input bound plus one ulp of the output (a
    declared rounding between steps, `bias:bf16`, the same in its type).
    An int32 output is exact up to 2^24 and within one fp32 ulp above (the reference carries the
    accumulator through fp32 epilogue steps).
A bound carried through a step grows by the step's gain: |scale|, |alpha|, 1 (bias, cast),
and 1.13 (the largest slope of gelu and silu).

dequant (a quantised operand's w = (q - z) * s in the MMA's operand dtype, u its unit roundoff;
kernels_ref.dequant): bit-exact when the problem declares dequant_precision = "fp32" (fp32 then one
rounding: the reference computes exactly that), and when there are no zero points and the scales
convert to the operand dtype exactly (scales in the operand dtype, e4m3, e8m0: then w is one
rounding of q * s in any order). Otherwise ("operand": fp16 / bf16 arithmetic, sub then mul or an
fma with z * s taken first) 2u(|q - z| |s| + |z| |s|) plus one subnormal step of the operand dtype.
The float_offset form w = (q - c) * s + z, declared "operand" (an fma in the operand dtype, or a
rounded product then a rounded add), differs from the reference by at most twice one side's error:
2u((2 + e)|q - c| |s| + (1 + e)|z|), e = 1 where the scales (and offsets) are not in the operand
dtype (their rounding to it adds u each), 0 where they are; plus one subnormal step.
The dequantised operands then enter the fp16 / bf16 MMA: the accumulation models of those
operands apply unchanged (ACC_TABLE, keyed by the MMA's operand dtype, spec.mma_dtype). Where the
dequant is not exact, the accumulator's reference (computed from the reference's dequantised operand)
adds sum_k |a_mk| times the dequant bound of w_kn to its bound (a quantised A: sum_k the bound of w_mk
times |b_kn|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from kernels_ref.dtypes import DTYPES
from oracle.judging.hardware_numerics import ToleranceError, entry, hw

U32 = 2.0**-23
ACTIVATION_SLOPE = {"none": 1.0, "relu": 1.0, "gelu_erf": 1.13, "gelu_tanh": 1.13, "silu": 1.1}


def lookup(stage: str, dtype: str) -> "Model":
    family = stage if stage.startswith("epilogue") or stage == "mma" else stage.split("_")[0]
    return entry(TABLE, (family, dtype), lambda: f"no tolerance model for stage {stage!r} with dtype {dtype!r}")


@dataclass(frozen=True)
class Model:
    name: str  # "exact" | "accumulate" | "elementwise"
    doc: str
    u: float = 0.0


TABLE: dict[tuple[str, str], Model] = {}


def _register(stages, dtypes, model: Model) -> None:
    for st in stages:
        for d in dtypes:
            TABLE[(st, d)] = model


_ALL = ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int8", "int32")
_register(("descriptor", "load", "epilogue_store"), _ALL, Model("exact", "bit-exact data movement"))
_register(("mma",), ("fp32",), Model("accumulate", "an fp32 accumulator: the accumulation models (ACC_TABLE)", U32))
_register(("mma",), ("fp16",), Model("accumulate", "an fp16 accumulator rounded per MMA step", 2.0**-11))
_register(("mma",), ("int32",), Model("exact", "integer accumulation is exact"))
for _s in ("epilogue_scale", "epilogue_alpha_beta", "epilogue_alpha", "epilogue_beta_c", "epilogue_bias",
           "epilogue_activation"):
    _register((_s,), ("fp32",), Model("elementwise", f"fp32 {_s[9:]}", U32))
_register(("epilogue_cast",), ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int32"),
          Model("elementwise", "round to nearest even; exact on an exact input"))

_register(("dequant",), ("fp16",), Model("elementwise", "(q - z) * s rounded to fp16: exact as declared fp32, "
                                                        "else 2u(|q - z||s| + |z||s|)", 2.0**-11))
_register(("dequant",), ("bf16",), Model("elementwise", "(q - z) * s rounded to bf16: exact as declared fp32, "
                                                        "else 2u(|q - z||s| + |z||s|)", 2.0**-8))


def dequant_bound(q: torch.Tensor, z: torch.Tensor, s: torch.Tensor, *, out_dtype: str, precision: str,
                  zeros: str, scale_dtype: str, centre: float = 0.0) -> Optional[torch.Tensor]:
    """The per-element bound of a dequantised tile (module docstring), float64; None where the
    arithmetic is exact (bit-exact comparison). q, z, s: the values of every element (float64);
    `centre`: the c of the float_offset form."""
    model = lookup("dequant_b", out_dtype)
    if precision == "fp32" or (zeros == "none" and scale_dtype in (out_dtype, "e4m3", "e8m0")):
        return None
    tiny = float(torch.finfo(DTYPES[out_dtype].torch).tiny) * model.u * 2  # the smallest subnormal step
    q, z, s = q.double(), z.double(), s.double()
    if zeros == "float_offset":
        e = 0.0 if scale_dtype == out_dtype else 1.0
        return 2 * model.u * ((2 + e) * (q - centre).abs() * s.abs() + (1 + e) * z.abs()) + tiny
    return 2 * model.u * ((q - z).abs() * s.abs() + z.abs() * s.abs()) + tiny


ACTIVATION_IMPLS = ("accurate", "fast")
_ACCURATE_ULPS = 2.0**8


_F32_EXPONENT, _F32_HALF = 0x7F800000, 0x3F000000  # float32's exponent bits; 0.5's bits


def _mantissa_bits(d) -> int:
    return round(-math.log2(d.unit_roundoff)) - 1


def ulp(y: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """Spacing of dtype `dtype_name` at |y| (float64), subnormals included: 2^(e - 1 - mantissa bits)
    for |y| = m 2^e, m in [0.5, 1) (frexp; inf and NaN have e = 0)."""
    d = DTYPES[dtype_name]
    if not d.is_float:
        return torch.ones_like(y, dtype=torch.float64)
    fi = torch.finfo(d.torch)
    mant = _mantissa_bits(d)
    if y.is_floating_point() and y.element_size() <= 4:  # float32 holds y: 2^(e - 1) is |y|'s exponent bits
        top = y.float().abs().clamp_(min=fi.tiny).view(torch.int32) & _F32_EXPONENT
        top = torch.where(top == _F32_EXPONENT, _F32_HALF, top)  # inf, NaN: 2^-1, as frexp's e = 0 gives
        return (top.view(torch.float32) * 2.0 ** -mant).double()  # a power of two >= 2^-149: exact
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
    if alpha == 1.0 and (c is None or beta == 0.0):  # fp32(1 * x) is x: nothing rounds
        return torch.zeros_like(x), torch.ones_like(x)
    cterm = (beta * c).abs() if c is not None else 0.0
    return 3 * U32 * ((alpha * x).abs() + cterm), torch.full_like(x, abs(alpha))


def alpha_step(x, alpha: float):
    """fp32(alpha x) alone (a declared epilogue's alpha step): one rounding."""
    lookup("epilogue_alpha", "fp32")
    if alpha == 1.0:
        return torch.zeros_like(x), torch.ones_like(x)
    return U32 * (alpha * x).abs(), torch.full_like(x, abs(alpha))


def beta_c_step(x, c, beta: float):
    """x + fp32(beta c) (a declared epilogue's beta_c step): two roundings."""
    lookup("epilogue_beta_c", "fp32")
    if c is None or beta == 0.0:
        return torch.zeros_like(x), torch.ones_like(x)
    return 2 * U32 * (x.abs() + (beta * c).abs()), torch.ones_like(x)


def bias_step(x, bias_b):
    lookup("epilogue_bias", "fp32")
    return 2 * U32 * (x.abs() + bias_b.abs()), torch.ones_like(x)


def activation_ulps(kind: str, impl: str = "accurate") -> float:
    """The activation's own error in units of 2^-23 (|x| + |y|)."""
    if impl not in ACTIVATION_IMPLS:
        raise ToleranceError(f"activation_impl={impl!r} is not known; known: {', '.join(ACTIVATION_IMPLS)}")
    if kind in ("none", "relu"):
        return 0.0
    if impl == "accurate":
        return _ACCURATE_ULPS
    return max(_ACCURATE_ULPS, hw(f"act.{kind}.fast").value)  # never tighter than the accurate allowance


def activation_step(x, y, kind: str, impl: str = "accurate"):
    lookup("epilogue_activation", "fp32")
    c = activation_ulps(kind, impl)
    own = torch.zeros_like(x) if c == 0 else c * U32 * (x.abs() + y.abs())
    return own, torch.full_like(x, ACTIVATION_SLOPE[kind])


INT32_EXACT_LIMIT = 2.0**24  # the epilogue reference carries values in fp32


def cast_bound(bound_in: torch.Tensor, y: torch.Tensor, out_dtype: str) -> torch.Tensor:
    """A cast is exact on an exact input; otherwise the input bound plus one output ulp. An int32
    output above 2^24 in magnitude went through fp32 in the reference: one fp32 ulp there."""
    lookup("epilogue_cast", out_dtype)
    d = DTYPES[out_dtype]
    if d.is_float and y.device.type == "cuda":  # one pass on a GPU, the same bits (Triton loaded only then)
        from oracle.judging import cast_bound_pass

        if cast_bound_pass.applies(bound_in, y):
            return cast_bound_pass.cast_bound(bound_in, y, torch.finfo(d.torch).tiny, _mantissa_bits(d))
    out = torch.where(bound_in > 0, bound_in + ulp(y, out_dtype), 0.0)
    if out_dtype == "int32":
        yy = y.double()
        out = torch.where(yy.abs() >= INT32_EXACT_LIMIT, out + ulp(yy, "fp32"), out)
    return out


def round_bound(bound_in: torch.Tensor, y: torch.Tensor, dtype: str) -> torch.Tensor:
    """A declared rounding between epilogue steps (a node `step:bf16`) is a cast to that type:
    exact on an exact input, else the input bound plus one ulp of the type."""
    return cast_bound(bound_in, y, dtype)


def reduce_bound(abs_sum: torch.Tensor, n_partials: int) -> torch.Tensor:
    """Bound on a sum of `n_partials` fp32 partials done in any order, against the reference's sum in
    partial order: each of the n-1 additions rounds once on either side, at most u of the running
    magnitude, which sum |p| bounds (deterministic: the order is not known)."""
    return 2.0 * max(n_partials - 1, 0) * U32 * abs_sum

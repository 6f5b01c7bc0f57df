"""Float64 emulations of real GEMM engines: what a tensor core, cuBLAS or cuBLASLt does to a dot.

Data path per output element (every rule is one field of `Engine`):
  operands   optionally rounded first (TF32: fp32 operands to `operand_bits` fraction bits);
             `passes = 3` splits each operand into hi + lo and sums hi*hi + hi*lo + lo*hi
             (the lo*lo term is dropped, as tf32x3 / bf16x3 do)
  step       every `mma_k` products form one MMA step. The step's terms (its products and, when
             `fused`, the running accumulator) are aligned to the largest of them and cut to
             `align_bits` fraction bits below its leading bit (`align_round`: trunc = toward
             zero, rn = to nearest even); the aligned terms are summed exactly (without `fused`
             the accumulator is added after that sum) and the result is cut to `acc_bits`
             fraction bits (`acc_round`). fp32 tensor cores: acc_bits 23.
  promotion  every `promotion` k elements the partial accumulator is added into an fp32
             accumulator that rounds to nearest (a CUDA-core add) and restarts from zero
  reduction  (split-K) the k range is cut into partials of `chunk` k elements, each accumulated
             from zero as above, rounded to `dtype` (to nearest even) and summed in k order in
             `sum_dtype`, every add rounded to nearest.
The engine parameters may be tensors broadcastable against the batch of dots: the measurement
fits many candidate engines to one probe at once.

Constraints: no fp32 overflow, underflow or subnormal modelling (probes and tests stay in the
normal range); sums are exact in float64 while align_bits + log2(mma_k + 2) < 52.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional, Union

import torch

from kernels_ref.dtypes import DTYPES

ROUNDINGS = ("trunc", "rn", "rna")  # toward zero, to nearest even, to nearest away from zero
ROUND_CODE = {r: i for i, r in enumerate(ROUNDINGS)}
REDUCTION_DTYPES = ("fp32", "bf16", "fp16")
_TORCH = {k: DTYPES[k].torch for k in ("fp32", "bf16", "fp16")}  # the reduction dtypes

Param = Union[int, bool, torch.Tensor]


class EngineError(ValueError):
    """An engine description that is not valid."""


def _need(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise EngineError(f"{field}={value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class Reduction:
    """Split-K: partials of `chunk` k elements rounded to `dtype`, summed in `sum_dtype`."""

    dtype: str = "bf16"
    chunk: int = 1024
    sum_dtype: str = "fp32"

    def __post_init__(self) -> None:
        _need(self.dtype in REDUCTION_DTYPES, "reduction.dtype", self.dtype, f"one of {', '.join(REDUCTION_DTYPES)}")
        _need(self.sum_dtype in REDUCTION_DTYPES, "reduction.sum_dtype", self.sum_dtype,
              f"one of {', '.join(REDUCTION_DTYPES)}")
        _need(isinstance(self.chunk, int) and not isinstance(self.chunk, bool) and self.chunk > 0,
              "reduction.chunk", self.chunk, "a positive number of k elements")


@dataclass(frozen=True)
class Engine:
    """One accumulation datapath (module docstring). Defaults: an fp32 tensor core that truncates."""

    mma_k: int = 16
    fused: Param = True
    align_bits: Param = 23
    align_round: Param = "trunc"
    acc_bits: Param = 23
    acc_round: Param = "trunc"
    promotion: Optional[int] = None
    operand_bits: Optional[int] = None
    operand_round: str = "rn"
    passes: int = 1
    reduction: Optional[Reduction] = None

    def __post_init__(self) -> None:
        _need(isinstance(self.mma_k, int) and self.mma_k > 0, "mma_k", self.mma_k, "a positive int")
        for f in ("align_round", "acc_round", "operand_round"):
            v = getattr(self, f)
            if isinstance(v, str):
                _need(v in ROUNDINGS, f, v, f"one of {', '.join(ROUNDINGS)}")
        for f in ("align_bits", "acc_bits"):
            v = getattr(self, f)
            if not isinstance(v, torch.Tensor):
                _need(isinstance(v, int) and 1 <= v <= 40, f, v, "fraction bits, an int in 1..40")
        if self.promotion is not None:
            _need(isinstance(self.promotion, int) and self.promotion > 0 and self.promotion % self.mma_k == 0,
                  "promotion", self.promotion, f"a positive multiple of mma_k ({self.mma_k})")
        if self.operand_bits is not None:
            _need(isinstance(self.operand_bits, int) and 1 <= self.operand_bits <= 23, "operand_bits",
                  self.operand_bits, "fraction bits, an int in 1..23")
        _need(self.passes in (1, 3), "passes", self.passes, "1, or 3 (hi*hi + hi*lo + lo*hi)")
        _need(self.passes == 1 or self.operand_bits is not None, "passes", self.passes,
              "a split into hi + lo needs operand_bits")
        if self.reduction is not None:
            _need(isinstance(self.reduction, Reduction), "reduction", self.reduction, "a Reduction or None")
            if self.promotion is not None:
                _need(self.reduction.chunk % self.promotion == 0, "reduction.chunk", self.reduction.chunk,
                      f"a multiple of promotion ({self.promotion})")
            else:
                _need(self.reduction.chunk % self.mma_k == 0, "reduction.chunk", self.reduction.chunk,
                      f"a multiple of mma_k ({self.mma_k})")

    def with_(self, **kw) -> "Engine":
        return replace(self, **kw)

    def describe(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                v = "batched"
            parts.append(f"{f.name}={v}")
        return ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# rounding primitives (float64)
# ----------------------------------------------------------------------------------------------


def _code(mode: Param, like: torch.Tensor) -> torch.Tensor:
    if isinstance(mode, str):
        return torch.tensor(ROUND_CODE[mode], device=like.device)
    return mode.to(like.device)


def lead_pow2(x: torch.Tensor) -> torch.Tensor:
    """2^floor(log2 |x|); 0 where x is 0."""
    _, e = torch.frexp(x)
    return torch.where(x == 0, torch.zeros_like(x), torch.ldexp(torch.ones_like(x), e - 1))


def round_to_lsb(x: torch.Tensor, lsb: torch.Tensor, mode: Param) -> torch.Tensor:
    """x rounded to a multiple of lsb (powers of two, > 0; where lsb is 0, x is kept)."""
    code = _code(mode, x)
    safe = torch.where(lsb > 0, lsb, torch.ones_like(lsb))
    q = x / safe
    t = torch.trunc(q)
    r = torch.round(q)  # half to even
    a = torch.copysign(torch.floor(q.abs() + 0.5), q)
    out = torch.where(code == 0, t, torch.where(code == 1, r, a)) * safe
    return torch.where(lsb > 0, out, x)


def _pow2_neg(bits: Param, like: torch.Tensor) -> torch.Tensor:
    b = torch.as_tensor(bits, device=like.device, dtype=torch.float64)
    return torch.exp2(-b)


def round_bits(x: torch.Tensor, bits: Param, mode: Param) -> torch.Tensor:
    """x cut to `bits` fraction bits below its own leading bit."""
    return round_to_lsb(x, lead_pow2(x) * _pow2_neg(bits, x), mode)


def to_dtype(x: torch.Tensor, name: str) -> torch.Tensor:
    """Round to nearest even into fp32 / bf16 / fp16, back as float64."""
    if name == "fp32":
        return x.to(torch.float32).to(torch.float64)
    return x.to(torch.float32).to(_TORCH[name]).to(torch.float64)


# ----------------------------------------------------------------------------------------------
# the datapath
# ----------------------------------------------------------------------------------------------


_ROUNDERS = {  # what round_to_lsb computes for each rounding, on q = x / lsb
    "trunc": torch.trunc,
    "rn": torch.round,  # half to even
    "rna": lambda q: torch.copysign(torch.floor(q.abs() + 0.5), q),
}


def _fast_path(a: torch.Tensor, b: torch.Tensor, eng: Engine) -> bool:
    """Whether _step_scalar may run: plain (not batched) parameters, and operands whose products
    and sums stay finite float64 of normal magnitude (where exponent bits are the leading power of
    two), as every fp32 / bf16 / fp16 / fp8 value's do."""
    if any(isinstance(v, torch.Tensor) for v in (eng.fused, eng.align_bits, eng.align_round, eng.acc_bits,
                                                 eng.acc_round)):
        return False
    for x in (a, b):
        mag = x.abs()
        if not bool(torch.all(torch.isfinite(mag) & (mag <= 2.0 ** 300) & ((mag >= 2.0 ** -300) | (mag == 0)))):
            return False
    return True


def _round_scalar(x: torch.Tensor, lsb: torch.Tensor, mode: str) -> torch.Tensor:
    """round_to_lsb for one rounding named by a string: the same values, one rounding computed."""
    keep = lsb > 0
    safe = torch.where(keep, lsb, 1.0)
    return torch.where(keep, _ROUNDERS[mode](x / safe) * safe, x)


_EXPONENT = 0x7FF0000000000000  # a float64's exponent bits


def _lead_pow2_fast(x: torch.Tensor) -> torch.Tensor:
    """lead_pow2 for finite x of normal magnitude (the emulation's range, module docstring): the
    exponent bits alone (0 for x = 0)."""
    return (x.view(torch.int64) & _EXPONENT).view(torch.float64)


def _step_scalar(acc, p, eng: Engine):
    """_step for an engine of plain (not batched) parameters: the same arithmetic, with the
    parameters read once instead of turned into tensors every step."""
    terms = torch.cat([(acc if eng.fused else torch.zeros_like(acc))[..., None], p], -1)
    big = terms.abs().amax(-1)
    lsb = _lead_pow2_fast(big) * 2.0 ** -eng.align_bits
    s = _round_scalar(terms, lsb[..., None], eng.align_round).sum(-1)
    if not eng.fused:
        s = acc + s
    return _round_scalar(s, _lead_pow2_fast(s) * 2.0 ** -eng.acc_bits, eng.acc_round)


def _step(acc, p, eng: Engine, fast: bool = False):
    """One MMA step: acc [...], p [..., g] -> new acc (fast: _fast_path holds)."""
    if fast:
        return _step_scalar(acc, p, eng)
    fused = torch.as_tensor(eng.fused, device=acc.device)
    lead_in = torch.where(fused, acc, torch.zeros_like(acc))
    terms = torch.cat([lead_in[..., None], p], -1)
    big = terms.abs().amax(-1)
    lsb = lead_pow2(big) * _pow2_neg(eng.align_bits, big)
    fmode = _code(eng.align_round, acc)
    aligned = round_to_lsb(terms, lsb[..., None], fmode[..., None] if fmode.dim() else fmode)
    s = aligned.sum(-1)
    s = torch.where(fused, s, acc + s)
    return round_bits(s, eng.acc_bits, eng.acc_round)


def _operands(a: torch.Tensor, b: torch.Tensor, eng: Engine):
    """The products' factors, one (a, b) pair per pass."""
    if eng.operand_bits is None:
        return [(a, b)]
    ah = round_bits(a, eng.operand_bits, eng.operand_round)
    bh = round_bits(b, eng.operand_bits, eng.operand_round)
    if eng.passes == 1:
        return [(ah, bh)]
    al = round_bits(a - ah, eng.operand_bits, eng.operand_round)
    bl = round_bits(b - bh, eng.operand_bits, eng.operand_round)
    return [(al, bh), (ah, bl), (ah, bh)]


def _chain(pairs, k0: int, k1: int, eng: Engine, shape, product, fast: bool) -> torch.Tensor:
    """Accumulate k in [k0, k1) from zero (with promotion); product(x, y, lo, hi) -> [..., g]."""
    dev = pairs[0][0].device
    acc = torch.zeros(shape, dtype=torch.float64, device=dev)
    master = torch.zeros_like(acc) if eng.promotion else None
    for s0 in range(k0, k1, eng.mma_k):
        s1 = min(s0 + eng.mma_k, k1)
        for x, y in pairs:
            acc = _step(acc, product(x, y, s0, s1).expand(shape + (s1 - s0,)), eng, fast)
        if eng.promotion and ((s1 - k0) % eng.promotion == 0 or s1 == k1):
            master = to_dtype(master + acc, "fp32")
            acc = torch.zeros_like(acc)
    return master if eng.promotion else acc


def _run(pairs, K: int, eng: Engine, shape, product) -> torch.Tensor:
    red = eng.reduction
    fast = all(_fast_path(x, y, eng) for x, y in pairs)
    if red is None or red.chunk >= K:
        out = _chain(pairs, 0, K, eng, shape, product, fast)
        return out if red is None else to_dtype(out, red.dtype)
    total = None
    for c0 in range(0, K, red.chunk):
        part = to_dtype(_chain(pairs, c0, min(c0 + red.chunk, K), eng, shape, product, fast), red.dtype)
        total = part if total is None else to_dtype(total + part, red.sum_dtype)
    return total


def _batch_shape(lead: tuple, eng: Engine) -> tuple:
    shapes = [lead] + [tuple(v.shape) for v in (eng.fused, eng.align_bits, eng.align_round, eng.acc_bits,
                                                  eng.acc_round) if isinstance(v, torch.Tensor)]
    return tuple(torch.broadcast_shapes(*shapes))


def dot(a: torch.Tensor, b: torch.Tensor, eng: Engine) -> torch.Tensor:
    """Row-wise dots: a, b [..., n, K] float64 -> [..., n] (batched engine parameters broadcast
    against [..., n])."""
    if a.shape != b.shape:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must have one shape [..., n, K]")
    a, b = a.to(torch.float64), b.to(torch.float64)
    shape = _batch_shape(tuple(a.shape[:-1]), eng)
    return _run(_operands(a, b, eng), a.shape[-1], eng, shape, lambda x, y, lo, hi: x[..., lo:hi] * y[..., lo:hi])


def gemm(a: torch.Tensor, b: torch.Tensor, eng: Engine) -> torch.Tensor:
    """A [M, K] @ B [K, N] -> [M, N] float64 through the engine (products formed one step at a time)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must be [M, K] and [K, N]")
    a, b = a.to(torch.float64), b.to(torch.float64).t()
    shape = (a.shape[0], b.shape[0])
    return _run(_operands(a, b, eng), a.shape[1], eng, shape,
                lambda x, y, lo, hi: x[:, None, lo:hi] * y[None, :, lo:hi])


# ----------------------------------------------------------------------------------------------
# elementwise approximations (the activation models)
# ----------------------------------------------------------------------------------------------


def gelu_tanh_approx(x: torch.Tensor, tanh_rel_err: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + t(u)) with t = tanh (1 + e): how a tanh.approx-based GELU differs from exact,
    for a given relative error e of the tanh (a tensor like x)."""
    x = x.to(torch.float64)
    u = 0.7978845608028654 * (x + 0.044715 * x ** 3)
    return 0.5 * x * (1.0 + torch.tanh(u) * (1.0 + tanh_rel_err))


def silu_exp_approx(x: torch.Tensor, exp_rel_err: torch.Tensor) -> torch.Tensor:
    """x / (1 + e^-x (1 + e)): a SiLU whose exp has relative error e."""
    x = x.to(torch.float64)
    return x / (1.0 + torch.exp(-x) * (1.0 + exp_rel_err))

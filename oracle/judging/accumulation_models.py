"""The accumulation models, keyed by (model, operand dtype): which chain of hardware constants an
engine's partial sums go through (oracle.judging.hardware_numerics), how many passes, whether its
operands are rounded first, whether it promotes into fp32; and the reference's own chains.

Constraints: a missing key is a ToleranceError, never a default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from kernels_ref.dtypes import FP8
from oracle.judging.hardware_numerics import entry, hw

STATS_MARGIN = 1.01  # L, V, S come from the reference's own fp32 values, not the exact ones


@dataclass(frozen=True)
class Chain:
    """The constants of one accumulation chain, by HW key prefix (module docstring)."""

    prefix: str
    acc_bits: Optional[int] = None  # overrides HW[prefix.acc_bits] (the reference's own emulations)
    acc_trunc: Optional[bool] = None
    align_bits_max: Optional[int] = None

    def values(self) -> tuple[int, int, bool, int, bool]:
        p = self.prefix
        g = int(hw(f"{p}.mma_k").value)
        f = int(hw(f"{p}.align_bits").value)
        if self.align_bits_max is not None:
            f = min(f, self.align_bits_max)
        a_tr = bool(hw(f"{p}.align_trunc").value)
        acc = self.acc_bits if self.acc_bits is not None else int(hw(f"{p}.acc_bits").value)
        acc_tr = self.acc_trunc if self.acc_trunc is not None else bool(hw(f"{p}.acc_trunc").value)
        return g, f, a_tr, acc, acc_tr

    def keys(self) -> tuple[str, ...]:
        out = [f"{self.prefix}.{k}" for k in ("mma_k", "align_bits", "align_trunc")]
        if self.acc_bits is None:
            out.append(f"{self.prefix}.acc_bits")
        if self.acc_trunc is None:
            out.append(f"{self.prefix}.acc_trunc")
        return tuple(out)

    def step_constants(self) -> tuple[int, float, float, float]:
        """(g, deterministic, rounding^2, largest) per-step error constants, relative to m_t."""
        g, f, a_tr, acc, acc_tr = self.values()
        align, last = (g + 1) * 2.0 ** -f, STATS_MARGIN * 2.0 ** -acc
        det = (align if a_tr else 0.0) + (last if acc_tr else 0.0)
        rnd2 = ((g + 1) * (2.0 ** -f / 2) ** 2 if not a_tr else 0.0) + ((last / 2) ** 2 if not acc_tr else 0.0)
        largest = det + (align / 2 if not a_tr else 0.0) + (last / 2 if not acc_tr else 0.0)
        return g, det, rnd2, largest

    def growth(self, steps: float) -> float:
        """exp(c * steps): the engine's running sum drifts from the reference's by its own error, so
        each step's m_t is larger than the reference's by the error so far (a discrete Gronwall
        bound on that feedback). About 1 for fp32 chains; it explodes for a narrow accumulator
        over a long K, where no useful bound exists."""
        return math.exp(min(self.step_constants()[3] * steps, 700.0))


@dataclass(frozen=True)
class AccModel:
    name: str
    doc: str
    chain: Optional[Chain]  # None: exact
    passes: int = 1  # 3: hi/lo operand split, three products per pair
    operand: Optional[str] = None  # HW prefix of operand rounding (tf32, bf16x3)
    promoted: bool = False  # restarts every spec.promotion_interval k into an fp32 accumulator
    union: tuple[str, ...] = ()  # "any": the models it covers
    catches: str = ""

    def keys(self) -> tuple[str, ...]:
        out = list(self.chain.keys()) if self.chain else []
        if self.operand:
            out += [f"{self.operand}.operand_bits", f"{self.operand}.operand_trunc"]
        return tuple(dict.fromkeys(out))


TC16, FMA, TF32, FP8CH = Chain("tc16"), Chain("fma"), Chain("tf32"), Chain("fp8")
FP32ANY = Chain("fp32any")  # an fp32 accumulator whose steps were not identified
FP16ACC = Chain("tc16", acc_bits=10, acc_trunc=False)  # rounds to nearest fp16 after every MMA step
# The reference's own accumulation: each k-block's dot from zero (tensor cores on the GPU for
# 16- and 8-bit operands, the ieee path for fp32, BLAS on the CPU; at most 23 aligned bits) added
# by an fp32 add rounding to nearest; its fp8 promotion emulation keeps 13 bits per chunk
# (kernels_ref.mma).
REF_CHAIN = Chain("tc16", align_bits_max=23)
REF_PROMOTED = Chain("tc16", acc_bits=13, acc_trunc=True, align_bits_max=23)
REF_FP16 = Chain("tc16", acc_bits=10, acc_trunc=False, align_bits_max=23)

ACC_TABLE: dict[tuple[str, str], AccModel] = {}


def _reg(model: AccModel, operands) -> None:
    for d in operands:
        ACC_TABLE[(model.name, d)] = model


_CUBLAS_TF32 = ("cuBLAS's TF32 datapath over a long K was not identified (its k ladders keep more of the small "
                "products than one chain or any power-of-two promotion interval; the bound covers partials "
                "restarted at k-block boundaries)")
_reg(AccModel("fp32", "bf16/fp16 products summed by the tensor cores into an fp32 accumulator (cuBLAS, Triton "
              "tl.dot, WGMMA kernels), in k order or split into fp32 partials at k-block boundaries",
              TC16, catches="a missing or repeated k-block, a wrong scale or operand, anything above the tensor "
              "core's own truncation of the partial sums (about 2^-25 of the running sum per product, "
              "adding up)"), ("bf16", "fp16"))
_reg(AccModel("fp32", "fp32 operands, IEEE fma accumulation (cuBLAS with TF32 off, tl.dot input_precision='ieee')",
              FMA, catches="anything above fp32 rounding of the partial sums"), ("fp32",))
_reg(AccModel("fp32", "fp8 products accumulated as an fp32 tensor core would (the meaning of a spec without "
              "acc_model; Hopper's fp8 WGMMA keeps 13 bits: declare fp8_fast or fp8_promoted)",
              TC16, catches="as fp32"), FP8)
_reg(AccModel("tf32", "fp32 operands cut to TF32, tensor-core accumulation, whichever way the operands are cut "
              f"(Triton tl.dot input_precision='tf32' truncates, cuBLAS rounds to nearest); {_CUBLAS_TF32}",
              TF32, operand="tf32", catches="errors above the TF32 truncation of the operands: its bias (2^-9 of "
              "|D|) and its random part (8 * 2^-9 of sqrt(sum (ab)^2))"), ("fp32",))
_reg(AccModel("tf32_rn", f"fp32 operands rounded to nearest TF32 (cuBLAS with TF32 on); {_CUBLAS_TF32}",
              TF32, operand="tf32_rn", catches="errors above the TF32 rounding of the operands (8 * 2^-10 of "
              "sqrt(sum (ab)^2), or 2^-10 of sum |a||b| where one product dominates)"), ("fp32",))
_reg(AccModel("tf32x3", "fp32 operands split into TF32 hi + lo, three products (tl.dot input_precision='tf32x3')",
              TF32, passes=3, operand="tf32", catches="near fp32 accuracy (2^-18 of sum |a||b|)"), ("fp32",))
_reg(AccModel("bf16x3", "fp32 operands split into bf16 hi + lo, three products (tl.dot input_precision='bf16x3'); "
              "its datapath was not identified: the operand split is taken as truncating and the steps as the "
              "loosest fp32 accumulator (one product per step, 23 aligned bits, truncation)",
              FP32ANY, passes=3, operand="bf16x3", catches="errors above 2^-12 of sum |a||b| (or its random part "
              "where sum (ab)^2 is known)"), ("fp32",))
_reg(AccModel("fp16", "an fp16 accumulator rounded to nearest after every MMA step", FP16ACC,
              catches="errors above fp16 rounding of every partial sum"), ("fp16", "e4m3", "e5m2"))
_reg(AccModel("fp8_fast", "Hopper fp8 WGMMA with its 13-bit accumulator and no promotion (cuBLASLt fast "
              "accumulation, Triton's sm_90 default)", FP8CH,
              catches="only errors above the narrow accumulator's drift, which grows with K (about 2^-13 of the "
              "running sum per step of 32 products)"), FP8)
_reg(AccModel("fp8_promoted", "Hopper fp8 WGMMA, the 13-bit partial added into fp32 every promotion_interval k "
              "(cuBLASLt without fast accumulation: 128 measured; DeepGEMM; Triton max_num_imprecise_acc: the "
              "interval it is given)", FP8CH, promoted=True,
              catches="errors above about 2^-13 of each promotion chunk's sum |a||b| per step"), FP8)
_reg(AccModel("int32", "int8 products, exact integer accumulation (torch._int_mm measured exact)", None,
              catches="any difference"), ("int8",))
_reg(AccModel("any", "the loosest sound bound over every engine model for these operands, including cuBLAS "
              "reduced-precision split-K", TC16, union=("fp32",),
              catches="errors above the largest of: the tensor core's truncation, and the output type's rounding "
              "of every split-K partial and partial sum"), ("bf16", "fp16"))
_reg(AccModel("any", "the loosest of fp32 (fma), tf32 (truncated or rounded operands), tf32x3 and bf16x3", TF32,
              union=("fp32", "tf32", "tf32x3", "bf16x3"), catches="errors above bf16x3's (2^-12 of sum |a||b|)"),
     ("fp32",))
_reg(AccModel("any", "the loosest of fp8_fast and fp8_promoted (with its interval, where the spec gives one)", FP8CH,
              union=("fp32", "fp8_fast", "fp8_promoted"),
              catches="only errors above the fp8 narrow accumulator's drift over the whole K"), FP8)
_reg(AccModel("any", "int8: exact", None, union=("int32",), catches="any difference"), ("int8",))


def acc_model(name: str, operand: str) -> AccModel:
    return entry(ACC_TABLE, (name, operand), lambda: f"no accumulation model {name!r} for {operand!r} operands; "
                 f"known: {', '.join(sorted({f'{m}/{d}' for m, d in ACC_TABLE}))}")


def resolved_model(spec) -> AccModel:
    return acc_model(spec.resolved_acc_model, spec.mma_dtype)

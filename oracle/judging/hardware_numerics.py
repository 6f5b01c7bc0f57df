"""The hardware constants the error bounds read, keyed by name: each a value, where it came from
and which way a recorded value stays sound.

Each hardware constant (HW) says where it was measured (benchmarks/measure_numerics.py on the
H200, its JSON in benchmarks/results/numerics_h200.json). Where no candidate datapath reproduced
an engine's probes (cuBLAS TF32 over a long K, Triton bf16x3), the model uses conservative
stand-ins marked NOT IDENTIFIED, and tests/cpu/test_measured_numerics.py holds the bound against
what that engine was seen to do.

Constraints: a missing key is a ToleranceError, never a default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

RESULTS = "benchmarks/results/numerics_h200.json"


class ToleranceError(KeyError):
    """No tolerance model for a key: a missing key is an error, never a default."""


def entry(table: Mapping, key, missing: Callable[[], str]):
    """table[key], or a ToleranceError saying `missing()` (what was asked and what the table has)."""
    try:
        return table[key]
    except KeyError:
        raise ToleranceError(missing()) from None


@dataclass(frozen=True)
class Constant:
    value: float
    source: str  # where it was measured; "UNMEASURED: ..." a placeholder; "NOT IDENTIFIED: ..." a stand-in
    measure_key: Optional[str] = None  # the key in RESULTS["summary"] that measures it
    sound: str = "le"  # le: a recorded value <= the measured one is sound; ge: >=; flag: 1 covers 0

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ToleranceError(f"Constant.value={self.value!r} must be a finite number")
        if not isinstance(self.source, str) or not self.source:
            raise ToleranceError("Constant.source must say where the value was measured")
        if self.sound not in ("le", "ge", "flag"):
            raise ToleranceError(f"Constant.sound={self.sound!r} is not allowed: le, ge or flag")

    @property
    def measured(self) -> bool:
        """Measured or defined by a format; False for a placeholder and for a stand-in."""
        return not self.source.startswith(("UNMEASURED", "NOT IDENTIFIED"))

    @property
    def stand_in(self) -> bool:
        """A conservative value for a datapath the measurement could not identify."""
        return self.source.startswith("NOT IDENTIFIED")

    def describe(self) -> str:
        return f"{self.value:g} ({self.source})"


def _unmeasured(value, why: str, key: Optional[str], sound: str = "le") -> Constant:
    where = f"; {RESULTS} summary.{key}" if key else ""
    return Constant(value, f"UNMEASURED: placeholder, {why}{where}", key, sound)


def _defined(value, why: str) -> Constant:
    return Constant(value, why)


MEASURED = f"{RESULTS}, H200, 2026-12-01"


def _measured(value, probe: str, key: Optional[str], sound: str = "le") -> Constant:
    return Constant(value, f"measured: {MEASURED}, {probe}", key, sound)


def _not_identified(value, why: str) -> Constant:
    return Constant(value, f"NOT IDENTIFIED: {why} ({MEASURED})")


_TC16_FITS = "step and ladder fits of cublas_bf16, cublas_bf16_out, cublas_fp16, triton_bf16, triton_fp16 (one " \
    "datapath each)"
_TF32_FITS = "step fits of triton_tf32, cublas_tf32 and triton_tf32x3 (one datapath each)"
_FP8_FITS = "fits of triton_e4m3, triton_e4m3_mni64, lt_e4m3, lt_e4m3_fast and their row/col-scaled kinds"

HW: dict[str, Constant] = {
    # bf16 / fp16 products on the tensor cores, fp32 accumulator (cuBLAS torch.mm, Triton tl.dot)
    # fewer products per step means more steps: a smaller mma_k is the looser bound
    "tc16.mma_k": _measured(16, f"{_TC16_FITS}: 16 products per step", "tc16_mma_k"),
    "tc16.align_bits": _measured(25, f"{_TC16_FITS}: 25 fraction bits kept when aligning", "tc16_align_bits"),
    "tc16.align_trunc": _measured(1, f"{_TC16_FITS}: aligned terms truncated", "tc16_truncates", "flag"),
    "tc16.acc_bits": _defined(23, "the fp32 accumulator register"),
    "tc16.acc_trunc": _measured(1, f"{_TC16_FITS}: the step's sum truncated to fp32", "tc16_truncates", "flag"),
    # fp32 operands on the CUDA cores (cuBLAS SGEMM, tl.dot input_precision="ieee"): IEEE fma, which
    # the fits of cublas_fp32 and triton_ieee agree with (one product per step, rounding to nearest)
    "fma.mma_k": _defined(1, "one fused multiply-add per product"),
    "fma.align_bits": _defined(48, "an fma adds the exact product"),
    "fma.align_trunc": _defined(0, "IEEE 754 fma rounds to nearest"),
    "fma.acc_bits": _defined(23, "fp32"),
    "fma.acc_trunc": _defined(0, "IEEE 754 fma rounds to nearest"),
    # TF32: fp32 operands cut to 10 fraction bits, products on the tensor cores
    "tf32.operand_bits": _defined(10, "the TF32 format"),
    "tf32.operand_trunc": _measured(1, "operand fits: triton_tf32 truncates, cublas_tf32 rounds to nearest even; "
                                    "truncation covers both", "tf32_operand_trunc", "flag"),
    "tf32_rn.operand_bits": _defined(10, "the TF32 format"),
    "tf32_rn.operand_trunc": _measured(0, "operand fit of cublas_tf32: rounded to nearest even",
                                       "cublas_tf32_operand_trunc", "flag"),
    "tf32.mma_k": _measured(8, f"{_TF32_FITS}: 8 products per step", "tf32_mma_k"),
    "tf32.align_bits": _measured(25, f"{_TF32_FITS}: 25 fraction bits kept when aligning", "tf32_align_bits"),
    "tf32.align_trunc": _measured(1, f"{_TF32_FITS}: truncated", "tf32_truncates", "flag"),
    "tf32.acc_bits": _defined(23, "the fp32 accumulator register"),
    "tf32.acc_trunc": _measured(1, f"{_TF32_FITS}: truncated", "tf32_truncates", "flag"),
    # bf16x3 (tl.dot input_precision="bf16x3"): no candidate reproduced its operand, step or ladder probes
    "bf16x3.operand_bits": _defined(7, "the bf16 format (hi and lo parts)"),
    "bf16x3.operand_trunc": _not_identified(1, "triton_bf16x3's operand probes fit neither truncation nor "
                                            "rounding of the split (2 of 288 missed each): truncation covers both"),
    # an fp32 accumulator whose steps were not identified: a step of g products that keeps f >= 23
    # aligned bits and truncates errs by at most ((g + 1) 2^-f + 2^-23) per step, (g + 2) / g 2^-23
    # per product, largest at g = 1, f = 23: every fp32 datapath measured keeps 25 bits (or is an fma)
    "fp32any.mma_k": _defined(1, "one product per step, the largest error per product"),
    "fp32any.align_bits": _defined(23, "fp32's fraction bits, fewer than any fp32 accumulator measured kept (25)"),
    "fp32any.align_trunc": _defined(1, "truncation, which covers rounding"),
    "fp32any.acc_bits": _defined(23, "the fp32 accumulator register"),
    "fp32any.acc_trunc": _defined(1, "truncation, which covers rounding"),
    # fp8 products on Hopper's wgmma: a narrow accumulator inside the tensor core
    "fp8.mma_k": _measured(32, f"{_FP8_FITS}: 32 products per step", "fp8_mma_k"),
    "fp8.align_bits": _measured(13, f"{_FP8_FITS}: 13 fraction bits kept when aligning", "fp8_align_bits"),
    "fp8.acc_bits": _measured(13, f"{_FP8_FITS}: 13 to 23 fit, the fewest recorded", "fp8_acc_bits"),
    "fp8.align_trunc": _measured(1, f"{_FP8_FITS}: truncated", "fp8_truncates", "flag"),
    "fp8.acc_trunc": _measured(1, f"{_FP8_FITS}: truncation and rounding both fit; truncation covers both",
                               "fp8_truncates", "flag"),
    # cuBLAS reduced-precision split-K (torch's default for bf16/fp16 GEMMs): not seen in the 12
    # shapes probed on 2026-12-01, seen on other shapes another day, so `any` keeps allowing it
    "splitk.chunk_min": _unmeasured(128, "the smallest partial (k elements) allowed for cuBLAS; no reduced-"
                                    f"precision split-K was seen in {MEASURED} (splitk)", "splitk_chunk_min"),
    # approximate activations: max |err| / (2^-23 (|x| + |y|)) over a dense fp32 sweep (93M inputs,
    # |x| in [2^-32, 128)), rounded up
    "act.gelu_tanh.fast": _measured(31.04, "activations: tanh.approx.f32 GELU, 31.04 (x(1 + c x^2) form 30.60)",
                                    "act_gelu_tanh_fast", "ge"),
    "act.silu.fast": _measured(0.71, "activations: ex2.approx.ftz + div.approx SiLU 0.70 (ex2.approx + div.rn "
                               "0.51)", "act_silu_fast", "ge"),
}


def hw(key: str) -> Constant:
    return entry(HW, key, lambda: f"no hardware constant {key!r}; known: {', '.join(sorted(HW))}")

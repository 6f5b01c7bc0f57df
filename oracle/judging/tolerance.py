"""Per-element error bounds, from tables: accumulation models keyed by (model, operand dtype),
hardware constants keyed by name (each says where it was measured), epilogue steps by (stage, dtype).

Data-movement stages (descriptor, load, store, and a cast fed exactly) are bit-exact: a NaN
matches a NaN, nothing else is tolerated. Arithmetic stages get a bound per element.

The accumulation bound (`mma_bound`) follows what the engine's datapath does to the partial sums,
not sqrt(K) * S. An engine accumulates in steps of g products; a step aligns its terms (the g
products and the running accumulator) to the largest, keeping f fraction bits, sums them and cuts
the sum to a fraction bits (kernels_ref.emulate states it exactly). A step's error is therefore at
most c * m_t with c = (g + 1) 2^-f + 2^-a and m_t = |running accumulator| + the step's sum |a||b|.
Over a k-block j every step has m_t <= m_j = max_c |X_(j-1) - X_c| + s_j, where X are the
accumulator values at k-block boundaries (X_c over every earlier boundary and 0, so a partial
restarted at any boundary, as split-K and stream-K do, is covered) and s_j the block's sum |a||b|.
The reference accumulates two statistics per element, L = sum_j m_j and V = sum_j m_j^2
(kernels_ref.mma_stats, `with_stats`), and the bound is
    det * n_steps * L  +  LAMBDA * sqrt(rnd^2 * n_steps * V)
with the truncating parts of c in `det` (a truncation errs in one direction, so those errors add
up: the bias of a truncating tensor core at large K) and the rounding parts in `rnd` (errors of
rounding to nearest behave like a random walk: Higham and Mary's probabilistic bound, by
Azuma-Hoeffding; LAMBDA = 8 puts the chance of one correct element exceeding it at 2 exp(-32)).
Promotion every P (fp8) restarts the narrow chain from 0, so its terms scale with S instead of L.
Block scales enter through S (sum |a||b| times |scales|); scale groups narrower than the k-block add
the scaling and the add of every group into the fp32 accumulator (`_scale_groups_bound`).
Reduced-precision split-K adds the rounding of every partial and of every partial sum
(statistics pabs = sum_i |partial_i|, prun = sum_i |partial sum after partial i|). TF32 adds the
operand rounding, the hi/lo three-pass schemes the dropped lo*lo term (`_operand_bound`: random
for rounding to nearest, a bias following |D| plus a random part for truncation). The reference's
own accumulation error (REF_CHAIN, a conservative fp32 chain) is added, as the factor 2 did before.

Each hardware constant (HW) says where it was measured (benchmarks/measure_numerics.py on the
H200, its JSON in benchmarks/results/numerics_h200.json). Where no candidate datapath reproduced
an engine's probes (cuBLAS TF32 over a long K, Triton bf16x3), the model uses conservative
stand-ins marked NOT IDENTIFIED, and tests/cpu/test_measured_numerics.py holds the bound against
what that engine was seen to do.

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

from kernels_ref.dtypes import DTYPES, FP8
from kernels_ref.scales import groups_per_k_block

LAMBDA = 8.0
U32 = 2.0**-23
STATS_MARGIN = 1.01  # L, V, S come from the reference's own fp32 values, not the exact ones
ACTIVATION_SLOPE = {"none": 1.0, "relu": 1.0, "gelu_erf": 1.13, "gelu_tanh": 1.13, "silu": 1.1}
RESULTS = "benchmarks/results/numerics_h200.json"


class ToleranceError(KeyError):
    """No tolerance model for a key: a missing key is an error, never a default."""


# ----------------------------------------------------------------------------------------------
# hardware constants: value, where it came from, and which way a recorded value stays sound
# ----------------------------------------------------------------------------------------------


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
    try:
        return HW[key]
    except KeyError:
        raise ToleranceError(f"no hardware constant {key!r}; known: {', '.join(sorted(HW))}") from None


# ----------------------------------------------------------------------------------------------
# accumulation models
# ----------------------------------------------------------------------------------------------


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

_FLOAT_OPS = ("fp32", "fp16", "bf16", "e4m3", "e5m2")
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
    try:
        return ACC_TABLE[(name, operand)]
    except KeyError:
        raise ToleranceError(f"no accumulation model {name!r} for {operand!r} operands; known: "
                             f"{', '.join(sorted({f'{m}/{d}' for m, d in ACC_TABLE}))}") from None


# ----------------------------------------------------------------------------------------------
# the statistics a bound reads (the reference computes them; kernels_ref.mma_stats.MmaStats)
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# the accumulation bound
# ----------------------------------------------------------------------------------------------


def lookup(stage: str, dtype: str) -> "Model":
    family = stage if stage.startswith("epilogue") or stage == "mma" else stage.split("_")[0]
    try:
        return TABLE[(family, dtype)]
    except KeyError:
        raise ToleranceError(f"no tolerance model for stage {stage!r} with dtype {dtype!r}") from None


def resolved_model(spec) -> AccModel:
    return acc_model(spec.resolved_acc_model, spec.mma_dtype)


def _chain_bound(chain: Chain, st: Stats, s: torch.Tensor, bk: int, passes: int, promotion: Optional[int],
                 n: int):
    g, det, rnd2, _ = chain.step_constants()
    if promotion:
        steps = passes * promotion / g  # per promotion chunk, each step's m_t <= the chunk's sum |a||b|
        narrow = det * steps * STATS_MARGIN * s + LAMBDA * torch.sqrt(rnd2 * steps * st.v)
        master = LAMBDA * torch.sqrt(torch.clamp(st.v, min=0) * (bk / promotion)) * 2.0 ** -24 * STATS_MARGIN
        return narrow * chain.growth(steps) + master
    steps = passes * math.ceil(bk / g)
    x = det * steps * st.l + LAMBDA * torch.sqrt(rnd2 * steps * torch.clamp(st.v, min=0))
    return x * _per_unit(n, lambda k: chain.growth(passes * math.ceil(max(k, 1) / g)), x)


def _operand_bound(model: AccModel, st: Stats, s: torch.Tensor, x_abs: Optional[torch.Tensor],
                   ref: torch.Tensor) -> torch.Tensor:
    """Operand rounding: each product k errs by d_k |a_k b_k|, |d_k| <= c. Deterministically the sum
    errs by at most c S. Rounding to nearest: d_k of mean zero, independent of the data (Higham and
    Mary's model): LAMBDA c sqrt(q) (Azuma-Hoeffding), q = sum (ab)^2. Truncation: d_k in [0, c]
    with the sign of a_k b_k, so the mean mu of d_k biases the sum by mu |X| <= c |X| (X the exact
    sum, within the reference's own bound of |x_abs|), and d_k - mu is a random walk bounded as
    above. The smaller of the deterministic and the probabilistic bound is taken."""
    if not model.operand:
        return torch.zeros_like(s)
    bits = int(hw(f"{model.operand}.operand_bits").value)
    trunc = bool(hw(f"{model.operand}.operand_trunc").value)
    u = 2.0 ** -bits if trunc else 2.0 ** -(bits + 1)
    c = 4 * u * u if model.passes == 3 else 2 * u + u * u  # three passes: the dropped lo*lo, the lo parts' rounding
    det = c * STATS_MARGIN * s
    if st.q is None:
        return det
    walk = LAMBDA * c * torch.sqrt(st.q.double() * STATS_MARGIN)
    if not trunc:
        return torch.minimum(det, walk)
    if x_abs is None:
        return det
    return torch.minimum(det, c * STATS_MARGIN * (x_abs.double() + ref) + walk)


def _engine_bound(spec, model: AccModel, st: Stats, s: torch.Tensor, n: int, x_abs, ref) -> torch.Tensor:
    if model.union:
        names = ("fp16",) if spec.acc_dtype == "fp16" else model.union
        names = [m for m in names if not (acc_model(m, spec.mma_dtype).promoted and not spec.promotion_interval)]
        parts = [_engine_bound(spec, acc_model(m, spec.mma_dtype), st, s, n, x_abs, ref) for m in names]
        out = parts[0]
        for p in parts[1:]:
            out = torch.maximum(out, p)
        return out
    if model.chain is None:
        return torch.zeros_like(s)
    promo = spec.promotion_interval if model.promoted else None
    return _chain_bound(model.chain, st, s, spec.tile.bk, model.passes, promo, n) + \
        _operand_bound(model, st, s, x_abs, ref)


def _reference_bound(spec, st: Stats, s: torch.Tensor, n: int) -> torch.Tensor:
    """The reference's own accumulation error (kernels_ref.mma semantics)."""
    if spec.acc_dtype == "int32":
        return torch.zeros_like(s)
    if spec.promotion_interval:
        return _chain_bound(REF_PROMOTED, st, s, spec.tile.bk, 1, spec.promotion_interval, n)
    if spec.acc_dtype == "fp16":
        return _chain_bound(REF_FP16, st, s, spec.tile.bk, 1, None, n)
    return _chain_bound(REF_CHAIN, st, s, spec.tile.bk, 1, spec.tile.bk, n)  # each block's dot, then an RN add


def _reduction_bound(spec, model: AccModel, st: Stats, s: torch.Tensor, n: int) -> torch.Tensor:
    """Split-K partials P_i (their ends at k-block boundaries) rounded, and each partial sum X_i
    rounded: u (sum |P_i| + sum |X_i|), with sum |P_i| <= S and, as every |X_j| <= m_j,
    sum |X_i| at most both parts * sqrt(V) and L."""
    r_max = torch.sqrt(torch.clamp(st.v, min=0))

    def sums(parts) -> torch.Tensor:  # parts(n): the partials of a span of n products
        return torch.minimum(_per_unit(n, parts, r_max) * r_max, st.l)

    out = torch.zeros_like(s)
    red = spec.reduction
    if red == "fp32":
        out = 2.0 ** -24 * STATS_MARGIN * (s + sums(lambda k: max(1, math.ceil(k / spec.tile.bk))))
    elif red in ("bf16", "fp16"):
        u = DTYPES[red].unit_roundoff
        if st.pabs is None or st.prun is None:
            out = u * STATS_MARGIN * (s + sums(lambda k: math.ceil(k / spec.reduction_chunk)))
        else:
            out = u * STATS_MARGIN * (st.pabs.double() + st.prun.double())
    if model.name == "any" and spec.mma_dtype in ("bf16", "fp16"):
        u = DTYPES[spec.out_dtype].unit_roundoff if spec.out_dtype in ("bf16", "fp16") else 2.0 ** -24
        out = torch.maximum(out, u * STATS_MARGIN * (s + sums(lambda k: math.ceil(k / hw("splitk.chunk_min").value))))
    return out


def _scale_groups_bound(spec, st: Stats):
    """Scale groups narrower than the k-block (block scales, G = tile.bk / gk groups per k-block):
    each group's product is scaled and added into the fp32 accumulator on its own, by the kernel and
    by the reference alike (kernels_ref.mma), so a k-block makes 2G roundings to nearest where the
    chains above count one add. Each is at most 2^-24 of m_j (a group's scaled product is at most
    the block's scaled sum s_j, and the running sum inside the block stays within
    |X_(j-1)| + s_j <= m_j): a random walk of 2G steps per k-block on each side,
    2 LAMBDA 2^-24 sqrt(2 G V). Zero with one group per k-block."""
    g = groups_per_k_block(spec.scale_a.block[1], spec.tile.bk) if spec.block_scaled else 1
    if g <= 1:
        return 0.0
    return 2 * LAMBDA * 2.0 ** -24 * STATS_MARGIN * torch.sqrt(torch.clamp(st.v, min=0) * (2 * g))


def _per_unit(n, fn, like: torch.Tensor):
    """fn(n) for a span of n products; for n a sequence (one span per unit along like's first
    dim), fn of each as a [U, 1, ...] tensor of like's dtype, or the one value they share."""
    if not isinstance(n, (list, tuple)):
        return fn(n)
    vals = [fn(k) for k in n]
    if all(v == vals[0] for v in vals):
        return vals[0]
    return torch.tensor(vals, dtype=like.dtype, device=like.device).reshape((-1,) + (1,) * (like.dim() - 1))


def mma_bound(spec, x0_abs: torch.Tensor, s: torch.Tensor, n, stats=None,
              x_abs: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Bound on |kernel - reference| for an accumulator after a span of `n` products (a sequence:
    each unit's span, the units along the tensors' first dim).

    x0_abs: |accumulator| at the start of the span (exactly known: a tap, or 0); s: sum of |a||b|
    (scaled) over the span; stats: the span's L, V (Stats, kernels_ref.mma_stats.MmaStats or SpanStats);
    without them the bound uses what |x0| and S alone guarantee (looser). x_abs: |the reference's
    sum over the span| (a SpanStats carries its own): truncated operands' bias follows it; without
    it that term falls back to S."""
    model = resolved_model(spec)
    if model.chain is None and not model.union:
        return torch.zeros_like(s, dtype=torch.float64)
    s64 = s.double()
    if stats is None:
        st = Stats.crude(x0_abs, s64, _per_unit(n, lambda k: max(1, math.ceil(k / spec.tile.bk)), s64))
    elif isinstance(stats, SpanStats):
        st = stats.stats()
        x_abs = stats.span_sum_abs() if x_abs is None else x_abs
    elif isinstance(stats, Stats):
        st = stats
    else:
        st = Stats.of(stats)
    st = Stats(st.l.double() * STATS_MARGIN, st.v.double() * STATS_MARGIN ** 2,
               None if st.q is None else st.q.double(), st.pabs, st.prun)
    ref = _reference_bound(spec, st, s64, n)
    bound = _engine_bound(spec, model, st, s64, n, x_abs, ref) + ref + _reduction_bound(spec, model, st, s64, n) + \
        _scale_groups_bound(spec, st)
    return bound.to(s.dtype if s.is_floating_point() else torch.float64)


def describe(spec) -> str:
    """The accumulation model a spec is judged with, its constants and where they came from, and
    what it can and cannot catch (the report prints it)."""
    model = resolved_model(spec)
    names = model.union or (model.name,)
    keys = []
    for n in names:
        keys += list(acc_model(n, spec.mma_dtype).keys())
    if model.name == "any" and spec.mma_dtype in ("bf16", "fp16"):
        keys.append("splitk.chunk_min")
    keys = list(dict.fromkeys(keys))
    consts = "; ".join(f"{k} = {hw(k).describe()}" for k in keys) or "none (exact)"
    red = f", split-K partials reduced in {spec.reduction}" + \
        (f" every {spec.reduction_chunk} k" if spec.reduction_chunk else "") if spec.reduction != "none" else ""
    unmeasured = [k for k in keys if not hw(k).measured and not hw(k).stand_in]
    stand_ins = [k for k in keys if hw(k).stand_in]
    warn = f" UNMEASURED constants: {', '.join(unmeasured)}." if unmeasured else ""
    if stand_ins:
        warn += f" Datapath not identified, conservative stand-ins: {', '.join(stand_ins)}."
    chains = [acc_model(m, spec.mma_dtype) for m in names]
    worst = max((c.chain.growth(c.passes * math.ceil(spec.k / c.chain.values()[0])) for c in chains
                 if c.chain is not None and not c.promoted), default=1.0)
    if worst > 2:
        warn += (f" At K = {spec.k} the accumulator's own drift can reach the size of the sum (growth factor "
                 f"{worst:.3g}): the bound is loose to the point of catching only gross errors.")
    return (f"accumulation model {model.name} ({model.doc}){red}; constants: {consts}. Catches: {model.catches}."
            f"{warn}")


# ----------------------------------------------------------------------------------------------
# stage models (exact / elementwise) and the epilogue steps
# ----------------------------------------------------------------------------------------------


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
    out = torch.where(bound_in > 0, bound_in + ulp(y, out_dtype), torch.zeros_like(bound_in))
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

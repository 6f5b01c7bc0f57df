"""Per-element error bounds of attention, stage by stage and for the output, from one table.

Notation: u = 2^-24 (fp32 unit roundoff), u_p the unit roundoff of P's operand type (bf16 2^-8,
fp16 2^-11, e4m3 2^-4: kernels_ref.dtypes), D = head_dim, n_b the KV blocks of a row, B = block_kv.
Hardware constants (HW, each with its source):
  E_EXP  = 2^-22  relative error of ex2.approx.ftz.f32 (PTX ISA, ex2: "maximum relative error
                  2^-22" on sm_80 / sm_90); Triton's tl.exp lowers to it on the GPU, so the
                  reference carries it too;
  E_TANH = 2^-10.987 relative error of tanh.approx.f32 (PTX ISA, tanh), the soft cap of
                  FlashAttention's kernels;
  E_LOG  = 2^-22  absolute error of lg2.approx.f32 (PTX ISA, lg2: 2^-22.6 for the mantissa), LSE's log.
Derivation (exact values unstarred are the computed ones):
  s        S = sum_d q_d k_d in fp32 over D products, exact products (16-bit and e4m3 operands are
           exact in fp32), at most D additions each within 2u of the running magnitude (covering a
           tensor core that truncates its alignment): |S - S*| <= 2 D u sum_d |q_d||k_d| (descaled).
  mask     x = softcap * tanh(scale * S / softcap): the scale (rounded to fp32) and its multiply
           2u|x|, the tanh either the
           hardware's (E_TANH |x|) or the reference's 1 - 2 / (e^2y + 1) (4u softcap absolute); the
           cap's slope is at most 1, so S's error passes through times scale. Masking is exact.
  softmax  m is a max (exact on given x); alpha = exp(m_old - m_new): relative E_EXP + 2u|m_old -
  _state   m_new| (the subtraction and the log2(e) multiply of the base-2 form); l: each p_j within
           E_EXP + 2u|x_j - m| relative, summed in fp32 over B keys and n_b blocks: (B + n_b) 2u.
  p        P = round(exp(x - m) * p_scale): relative E_EXP + 2u|x - m| + u_p, and below the type's
           normal range half a subnormal step (over p_scale) absolute; plus EXP_FLUSH absolute:
           ex2.approx.ftz returns 0 for a result below fp32's normal range (a bf16 P can hold it).
  o        acc' = alpha acc + P V: (B + 2) 2u (alpha |acc| + sum_j |P_j| |V_j|).
  normalize O = acc / l: 2u|O| (a reciprocal and a multiply); LSE = m + log l: E_LOG + 4u(|LSE| + |m|).
  combine  w_s = exp(LSE_s - M): relative E_EXP + 2u|LSE_s - M| each, one normalisation, S additions;
           its LSE = M + log sum w: E_LOG + 4u|LSE| + S (E_EXP + 2u|LSE_s - M|).
  softmax_state's m is a max of the masked scores it is given: exact (bound 0).
Output. With p_j = exp(x_j - m) the exact weights, L = sum p_j, A_d = sum_j p_j |V_jd| / L (the
reference returns A: kernels_ref.attention.forward Stats), every numerator term of O = N / L carries
a relative error of at most eta + u_p + rho and every denominator term eta + rho, where
  eta = 2 D u scale max_j sum|q||k| + 4u max_j |x_j| + E_EXP (+ E_TANH max|x| + 4u softcap with a cap)
        (S, scale, exp and its argument; max over the row's seen keys),
  rho = n_b (E_EXP + 4u) + (B + n_b) 2u   (the rescales and the fp32 additions of acc and l).
Then |O - O*| <= (|N - N*| + |O*| |L - L*|) / L <= (2 eta + u_p + 2 rho) A / (1 - eta - rho), since
|O*| <= A. P's subnormal steps and exp's flush add at most keys * (step/2 + EXP_FLUSH) * max|V| (L >= 1: the row maximum's own
term is exp(0)). Split-KV adds sigma = 2(eta + rho) + E_EXP + 4u(|LSE| + max|x|) + 2u splits times A
(each partial's weight carries its LSE's error). The kernel and the reference each err by that
much from the exact O, so the bound is twice it, plus the kernel's rounding of O to its output type
(u_o (|O| + that) and half a subnormal step). LSE: eta + rho (+ sigma) + E_LOG + 4u(|LSE| + max|x|)
per side, twice. A fully masked row is exact: O = 0 and LSE = -inf (or the declared +inf).
The statistics are the reference's own fp32 values: STATS_MARGIN covers their rounding.

`TABLE` holds one model per (stage, dtype) (dtype: the operand type of Q, K, V and P); a missing
key raises ToleranceError (oracle.judging.hardware_numerics), never a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kernels_ref.dtypes import DTYPES
from oracle.judging.hardware_numerics import entry

U = 2.0**-24
STATS_MARGIN = 1.01


@dataclass(frozen=True)
class HW:
    value: float
    source: str


E_EXP = HW(2.0**-22, "PTX ISA, ex2.approx.ftz.f32: maximum relative error 2^-22 (sm_80, sm_90)")
E_TANH = HW(2.0**-10.987, "PTX ISA, tanh.approx.f32: maximum relative error 2^-10.987")
E_LOG = HW(2.0**-22, "PTX ISA, lg2.approx.f32: maximum absolute error 2^-22.6 over the mantissa")
# ex2.approx.ftz.f32 flushes a result below fp32's smallest normal to 0 (H100: exp2 of -130 is 0,
# where a bf16 P could hold 2^-130): an absolute error of up to 2^-126 per weight.
EXP_FLUSH = HW(2.0**-126, "PTX ISA, ex2.approx.ftz.f32: subnormal results flushed to sign-preserving zero")


def u_of(dtype: str) -> float:
    return DTYPES[dtype].unit_roundoff


def sub_step(dtype: str) -> float:
    """The smallest positive (subnormal) value of a type: the spacing below its normal range."""
    return {"bf16": 2.0**-133, "fp16": 2.0**-24, "e4m3": 2.0**-9, "fp32": 2.0**-149}[dtype]


@dataclass(frozen=True)
class StageModel:
    stage: str
    dtype: str
    bound: Callable[..., torch.Tensor]
    doc: str


# -- per-stage bounds (float64 tensors of statistics in, float64 bound out) ---------------------
def _scores(qk_abs, head_dim: int):
    return 2 * head_dim * U * qk_abs


def _mask(x_abs, softcap: float):
    b = 2 * U * x_abs  # softmax_scale rounded to fp32, then the multiply
    if softcap > 0:
        b = b + E_TANH.value * x_abs + 4 * U * softcap
    return b


def _alpha(alpha, dm_abs):
    return alpha * (E_EXP.value + 2 * U * dm_abs)


def _row_sum(l, x_abs_max, block_kv: int, n_blocks: int):
    return l * ((block_kv + n_blocks) * 2 * U + E_EXP.value + 2 * U * x_abs_max)


def _p(p_dtype: str):
    def bound(p, xm_abs, p_scale: float = 1.0):
        return p * (E_EXP.value + 2 * U * xm_abs + u_of(p_dtype)) + sub_step(p_dtype) / 2 / p_scale + EXP_FLUSH.value
    return bound


def _o(acc_abs, pv_abs, block_kv: int):
    return (block_kv + 2) * 2 * U * (acc_abs + pv_abs)


def _normalize_o(o_abs):
    return 2 * U * o_abs


def _normalize_lse(lse_abs, m_abs):
    return E_LOG.value + 4 * U * (lse_abs + m_abs)


def _combine(a, lse_abs, splits: int):
    return a * (splits * (E_EXP.value + 2 * U) + 4 * U * lse_abs)


def _max(x):
    return torch.zeros_like(x)  # a running max of given values is exact


def _combine_lse(lse_abs, dl_abs, splits: int):
    return E_LOG.value + 4 * U * lse_abs + splits * (E_EXP.value + 2 * U * dl_abs)


TABLE: dict[tuple[str, str], StageModel] = {}
for _dt in ("bf16", "fp16", "e4m3"):
    for _stage, _fn, _doc in (
            ("s", _scores, "2 D u sum|q||k|"),
            ("mask", _mask, "2u|x| (+ E_TANH|x| + 4u softcap)"),
            ("softmax_state.m", _max, "0: a max of the given masked scores"),
            ("softmax_state.alpha", _alpha, "alpha (E_EXP + 2u|m_old - m_new|)"),
            ("softmax_state.l", _row_sum, "l ((B + n_b) 2u + E_EXP + 2u max|x|)"),
            ("p", _p(_dt), "p (E_EXP + 2u|x - m| + u_p) + step/2 + EXP_FLUSH"),
            ("o", _o, "(B + 2) 2u (|acc| + sum|P||V|)"),
            ("normalize.o", _normalize_o, "2u|O|"),
            ("normalize.lse", _normalize_lse, "E_LOG + 4u(|LSE| + |m|)"),
            ("combine", _combine, "A (S (E_EXP + 2u) + 4u|LSE|)"),
            ("combine.lse", _combine_lse, "E_LOG + 4u|LSE| + S (E_EXP + 2u|LSE_s - M|)")):
        TABLE[(_stage, _dt)] = StageModel(_stage, _dt, _fn, _doc)
    TABLE[("output", _dt)] = StageModel("output", _dt, None, "the module docstring's output model")


def lookup(stage: str, dtype: str) -> StageModel:
    return entry(TABLE, (stage, dtype), lambda: f"no attention bound model for stage {stage!r} and dtype {dtype!r}; "
                 f"the table has {sorted({s for s, _ in TABLE})} x {sorted({d for _, d in TABLE})}")


@dataclass(frozen=True)
class RowTerms:
    """The output model's terms per query row (float64 [rows]): `rel` multiplies A, `absolute` adds."""

    rel: torch.Tensor
    absolute: torch.Tensor
    lse: torch.Tensor


def row_terms(spec, stats, v_abs_max: float) -> RowTerms:
    """The per-row terms of one side (kernel or reference) against the exact attention."""
    lookup("output", spec.v_dtype)
    d, bkv = spec.head_dim, spec.block_kv
    qk = stats.qk_abs.double() * STATS_MARGIN
    xa = stats.s_abs.double() * STATS_MARGIN
    keys = stats.keys.double()
    n_b = torch.ceil(torch.full_like(keys, float(spec.seqlen_k)) / bkv).clamp(min=1)
    eta = spec.softmax_scale * lookup("s", spec.q_dtype).bound(qk, d) + 4 * U * xa + E_EXP.value
    if spec.softcap > 0:
        eta = eta + E_TANH.value * xa + 4 * U * spec.softcap
    rho = n_b * (E_EXP.value + 4 * U) + (bkv + n_b) * 2 * U
    u_p = u_of(spec.v_dtype)
    rel = (2 * eta + u_p + 2 * rho)
    lse = eta + rho + E_LOG.value
    if spec.splits > 1:
        sigma = 2 * (eta + rho) + E_EXP.value + 2 * U * spec.splits
        rel, lse = rel + sigma, lse + sigma
    rel = rel / (1 - eta - rho).clamp(min=0.5)
    # P's subnormal half-step (in P's units once p_scale is divided out) and exp's flush, times |V| descaled, per key
    absolute = keys * (sub_step(spec.v_dtype) / 2 / (spec.p_scale or 1.0) + EXP_FLUSH.value) * v_abs_max \
        * (spec.descale_v or 1.0)
    return RowTerms(rel, absolute, lse + 4 * U * xa)


def output_bound(spec, stats, o_ref: torch.Tensor, lse_ref: torch.Tensor, v_abs_max: float):
    """Bounds of the kernel's O and LSE against the reference's, float64, in the reference's
    [rows, head_dim_v] and [rows] row order (stats' (b, h, i) rows)."""
    t = row_terms(spec, stats, v_abs_max)
    a = stats.av.double() * STATS_MARGIN
    side = t.rel[:, None] * a + t.absolute[:, None]
    u_o, s_o = u_of(spec.o_dtype), sub_step(spec.o_dtype) / 2
    b_o = 2 * side + u_o * (o_ref.double().abs() + 2 * side) + s_o
    lse_abs = lse_ref.double().abs()
    b_lse = 2 * (t.lse + 4 * U * torch.where(torch.isfinite(lse_abs), lse_abs, torch.zeros_like(lse_abs)))
    return b_o, b_lse


def describe(spec) -> str:
    """The model's line for a report."""
    return (f"attention output model (oracle.judging.attention_tolerance): fp32 S over head_dim {spec.head_dim}, "
            f"exp E_EXP = 2^-22 ({E_EXP.source}), P in {spec.v_dtype} (u_p {u_of(spec.v_dtype):.3g}), "
            f"block_kv {spec.block_kv}" + (", softcap E_TANH = 2^-10.987" if spec.softcap else "") +
            (f", {spec.splits} splits merged by LSE" if spec.splits > 1 else "") + ", kernel and reference each")

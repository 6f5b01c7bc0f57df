"""The quantised operand of a problem: which operand (if any) is stored quantised, and its fields
(`<op>_packing`, `<op>_group_size`, `<op>_scales`, `<op>_zeros`, the shared `dequant_precision`)
checked against the dtypes and each other.

Either operand may be the quantised one, never both: B (W4A16 as written, [K, N] stored along K)
or A (the swapped problem of a mixed-input Hopper kernel, whose quantised weight is WGMMA's
register operand: [M, K] stored along K, scales and zero points [M, K / group]). The other operand
is fp16 or bf16, the dtype the MMA reads the dequantised operand in. Every error names the field,
the value and what is allowed (oracle.problem.spec.SpecError).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from kernels_ref.dtypes import ALL_TYPES, PACKED, QUANT_B, SCALE_TYPES

FLOAT_MMA_DTYPES = ("fp16", "bf16")  # the operand beside a quantised one: the MMA reads both in this dtype
# How a packed 4-bit operand sits in its bytes, along K (kernels_ref.dequant): k_pairs_*: a byte holds
# k = 2r and 2r + 1, the even k in the low nibble (low_first) or the high one (high_first);
# k8_interleaved: 4 bytes along K are a little-endian 32-bit word whose nibble i holds k = 8w +
# (0, 2, 4, 6, 1, 3, 5, 7)[i]. All three are defined along K, so they serve A ([M, K / 2]) and B alike.
PACKINGS = ("k_pairs_low_first", "k_pairs_high_first", "k8_interleaved")
# how a zero point enters: none; w = (q - z) * s with z an integer or a float; float_offset:
# w = (q - c) * s + z (c: 8 for uint4, 0 for a signed operand)
ZEROS = ("none", "int", "float", "float_offset")
# The arithmetic of w = (q - z) * s (kernels_ref.dequant): fp32 then one rounding to the MMA's dtype
# (judged bit-exact), or in that dtype itself in any order (sub then mul, or fma with z * s first:
# judged within the bound of oracle.judging.tolerance's dequant entry)
DEQUANT_PRECISIONS = ("fp32", "operand")
OPS = ("a", "b")
FIELDS = ("packing", "group_size", "scales", "zeros")  # <op>_<field> of a quantised operand
NAME = {"a": "A", "b": "B"}

Require = Callable[[bool, str, Any, str], None]


def other(op: str) -> str:
    return "b" if op == "a" else "a"


def stored_quantised(a_dtype: str, b_dtype: str, op: str) -> bool:
    """Is operand `op` stored quantised by its dtype: a packed 4-bit type, or an 8-bit quantised type
    beside an fp16 / bf16 other operand?"""
    d, o = (a_dtype, b_dtype) if op == "a" else (b_dtype, a_dtype)
    return d in PACKED or (d in QUANT_B and o in FLOAT_MMA_DTYPES and d != o)


def quant_operand(spec) -> Optional[str]:
    """The quantised operand of a validated spec: "a", "b" or None (its scales name it)."""
    return next((op for op in OPS if getattr(spec, f"{op}_scales") is not None), None)


def validate(spec, require: Require) -> None:
    """Exactly one operand quantised at most; its fields checked; the other operand's fields absent."""
    a, b = spec.a_dtype, spec.b_dtype
    require(spec.a_scales is None or spec.b_scales is None, "a_scales and b_scales", (spec.a_scales, spec.b_scales),
            "exactly one operand may be quantised: give a_scales (a quantised A) or b_scales (a quantised B)")
    both = stored_quantised(a, b, "a") and stored_quantised(a, b, "b")
    require(not both, "a_dtype", a, f"b_dtype={b!r} is a quantised type too: exactly one of a_dtype and b_dtype may "
                                    f"be quantised, beside an fp16 or bf16 other operand")
    for op in OPS:
        if stored_quantised(a, b, op):
            _validate_op(spec, op, require)
        else:
            _require_absent(spec, op, require)
    if not any(stored_quantised(a, b, op) for op in OPS):
        require(spec.dequant_precision is None, "dequant_precision", spec.dequant_precision,
                f"only a quantised B or A is dequantised (a_dtype is {a!r}, b_dtype {b!r})")


def _require_absent(spec, op: str, require: Require) -> None:
    X = NAME[op]
    why = f"(a_dtype is {spec.a_dtype!r}, b_dtype {spec.b_dtype!r})"
    for f in FIELDS[:3]:
        v = getattr(spec, f"{op}_{f}")
        require(v is None, f"{op}_{f}", v, f"only a quantised {X} ({op}_dtype one of {', '.join(QUANT_B)} beside "
                                           f"{other(op)}_dtype fp16 or bf16) has it {why}")
    require(getattr(spec, f"{op}_zeros") == "none", f"{op}_zeros", getattr(spec, f"{op}_zeros"),
            f"only a quantised {X} has zero points {why}")


def _validate_op(spec, op: str, require: Require) -> None:
    """Operand `op` quantised: its dtype beside the other's, packing, group size, scales, zeros,
    precision, and what a quantised problem leaves out."""
    o = other(op)
    X, d, od = NAME[op], getattr(spec, f"{op}_dtype"), getattr(spec, f"{o}_dtype")
    if op == "a" and d not in PACKED and not any(getattr(spec, f"a_{f}") not in (None, "none") for f in FIELDS):
        # an 8-bit A with no quant field: read as a plain A, whose B must match it (as before a quantised A)
        pair = "e4m3 or e5m2 (an fp8 operand needs the other in fp8 too)" if d in ("e4m3", "e5m2") else f"{d}"
        require(False, "b_dtype", od, f"must be {pair} beside a_dtype {d!r}, unless A is quantised: then give "
                                      f"a_scales (and a_group_size, a_zeros)")
    require(od in FLOAT_MMA_DTYPES, f"{o}_dtype", od,
            f"a quantised {X} ({op}_dtype {d!r}) is dequantised to {NAME[o]}'s dtype for the MMA: one of "
            f"{', '.join(FLOAT_MMA_DTYPES)}")
    packing, k, bk = getattr(spec, f"{op}_packing"), spec.k, spec.tile.bk
    if d in PACKED:
        require(packing in PACKINGS, f"{op}_packing", packing,
                f"{X} of {d} is packed two to a byte along K: one of {', '.join(PACKINGS)}")
        require(k % 2 == 0, "k", k, f"{X} of {d} packs k in pairs: K must be even")
        require(bk % 2 == 0, "tile.bk", bk, f"{X} of {d} packs k in pairs: tile.bk must be even")
        if packing == "k8_interleaved":
            why = f"{X} of {d} packed k8_interleaved holds 8 k in a 32-bit word"
            require(k % 8 == 0, "k", k, f"{why}: K must be a multiple of 8")
            require(bk % 8 == 0, "tile.bk", bk, f"{why}: tile.bk must be a multiple of 8")
    else:
        require(packing is None, f"{op}_packing", packing,
                f"{X} of {d} holds one value per byte: no packing (only {', '.join(PACKED)} are packed)")
    require(k % bk == 0, "k", k, f"a quantised {X} is modelled for whole k-blocks: K must be a multiple of tile.bk "
                                 f"({bk})")
    g = getattr(spec, f"{op}_group_size")
    if g is not None:
        require(isinstance(g, int) and not isinstance(g, bool) and g > 0 and k % g == 0, f"{op}_group_size", g,
                f"a positive number of k elements that divides K = {k} (None: one group of all K)")
        if d in PACKED:
            require(g % 2 == 0, f"{op}_group_size", g, f"a byte of {d} holds two k: the group size must be even")
            require(g % 8 == 0 or packing != "k8_interleaved", f"{op}_group_size", g,
                    f"a 32-bit word of {d} packed k8_interleaved holds 8 k: the group size must be a multiple of 8")
    sc = getattr(spec, f"{op}_scales")
    require(sc in SCALE_TYPES, f"{op}_scales", sc,
            f"a quantised {X} needs its scales' dtype: one of {', '.join(SCALE_TYPES)}")
    if sc in ("e4m3", "e8m0"):
        require(d in ("fp4_e2m1", "e4m3", "e5m2"), f"{op}_scales", sc,
                f"{sc} scales are micro-scaling scales of a float {X} (fp4_e2m1, e4m3, e5m2), not of {d}")
    zeros = getattr(spec, f"{op}_zeros")
    require(zeros in ZEROS, f"{op}_zeros", zeros, f"one of {', '.join(ZEROS)}")
    if zeros != "none":
        require(not ALL_TYPES[d].is_float, f"{op}_zeros", zeros,
                f"zero points are for an integer {X} (int4, uint4, int8), not {d}")
    if zeros in ("float", "float_offset"):
        require(sc in ("fp16", "bf16", "fp32"), f"{op}_zeros", zeros,
                f"float zero points are stored in the scales' dtype, which must be fp16, bf16 or fp32 ({op}_scales "
                f"is {sc!r})")
    p = spec.dequant_precision
    require(p is None or p in DEQUANT_PRECISIONS, "dequant_precision", p,
            f"one of {', '.join(DEQUANT_PRECISIONS)} (None: fp32)")
    mine, theirs = getattr(spec, f"scale_{op}"), getattr(spec, f"scale_{o}")
    require(mine.kind != "block" and theirs.kind != "block", f"scale_{op}.kind",
            mine.kind if mine.kind != "none" else theirs.kind,
            f"a quantised {X} carries its own group scales ({op}_scales); block scales are for fp8 x fp8 problems")
    require(spec.promotion_interval is None, "promotion_interval", spec.promotion_interval,
            f"a quantised {X}'s dequantised operand enters an fp16 / bf16 MMA: no fp8 promotion")
    require(spec.oob_fill == "zero", "oob_fill", spec.oob_fill, f"a quantised {X}'s stored values have no NaN: 'zero'")
    require(spec.groups is None and spec.batch == 1, "groups" if spec.groups is not None else "batch",
            spec.groups if spec.groups is not None else spec.batch,
            f"a quantised {X} is modelled for a single GEMM (no groups, batch 1)")


def config(spec):
    """kernels_ref.dequant.DequantConfig of the quantised operand (None without one)."""
    op = spec.quant_op
    if op is None:
        return None
    from kernels_ref.dequant import DequantConfig

    return DequantConfig(getattr(spec, f"{op}_dtype"), getattr(spec, f"{op}_scales"), spec.mma_dtype, spec.group_k,
                         getattr(spec, f"{op}_packing"), getattr(spec, f"{op}_zeros"), spec.resolved_dequant_precision)


def describe(spec) -> str:
    """The quantised operand's fields for ProblemSpec.describe ("" without one)."""
    op = spec.quant_op
    if op is None:
        return ""
    p = getattr(spec, f"{op}_packing")
    return (f", {NAME[op]} {p + ' ' if p else ''}group {spec.group_k} scales {getattr(spec, f'{op}_scales')} "
            f"zeros {getattr(spec, f'{op}_zeros')} dequant {spec.resolved_dequant_precision}")

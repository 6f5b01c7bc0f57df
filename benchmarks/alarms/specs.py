"""Each case's operands (seeded on the device; a quantised B as its users quantise it, block
scales per block) and the ProblemSpec that says what its engine does, from the measurement (split-K
probes, promotion intervals, tinygemm's dequant arithmetic)."""

from __future__ import annotations

import math
from typing import Optional

import torch

from alarms import engines as E
from alarms.engines import BLOCK_ROWS, EMULATED, ENGINE, TORCH, W4_GROUP, Case
from oracle.problem.spec import ProblemSpec, Scale, Tile
from oracle.run.inputs import Operands


def _w4_operands(c: Case, a: torch.Tensor, g: torch.Generator) -> Operands:
    """A bf16 and a uint4 B quantised from a float W per group and column as tinygemm's users do:
    s = (max - min) / 15, z = min + 8 s (both bf16), q = round((w - min) / s) in 0..15."""
    from kernels_ref import dequant as dq

    group = W4_GROUP[c.engine]
    w = torch.randn(c.k, c.n, generator=g, device=E.DEV)
    if c.kind == "positive":
        w = w.abs()
    wg = w.reshape(c.k // group, group, c.n)
    lo, hi = wg.amin(dim=1), wg.amax(dim=1)
    s = ((hi - lo).clamp(min=1e-6) / 15).to(torch.bfloat16)
    z = (lo + 8 * s.float()).to(torch.bfloat16)
    q = ((wg - lo[:, None]) / s.float()[:, None]).round().clamp(0, 15).reshape(c.k, c.n)
    cfg = dq.DequantConfig("uint4", "bf16", "bf16", group, "k_pairs_high_first", "float_offset")
    return Operands(a=a.to(torch.bfloat16), b=dq.pack_host(q, cfg), b_scales=s, b_zeros=z)


def make_operands(c: Case) -> Operands:
    g = torch.Generator(device=E.DEV).manual_seed(c.seed)
    if c.a_dtype == "int8":
        a = torch.randint(-128, 128, (c.m, c.k), generator=g, device=E.DEV, dtype=torch.int32)
        b = torch.randint(-128, 128, (c.k, c.n), generator=g, device=E.DEV, dtype=torch.int32)
        if c.kind == "positive":
            a, b = a.abs().clamp(max=127), b.abs().clamp(max=127)
        return Operands(a.to(torch.int8), b.to(torch.int8))
    a = torch.randn(c.m, c.k, generator=g, device=E.DEV)
    b = torch.randn(c.k, c.n, generator=g, device=E.DEV)
    if c.kind == "positive":
        a, b = a.abs(), b.abs()
    elif c.kind == "outlier":
        cols = torch.randperm(c.k, generator=g, device=E.DEV)[:max(1, c.k // 256)]
        a[:, cols] *= {"e4m3": 8.0, "fp16": 100.0}.get(c.a_dtype, 1000.0)
    if c.engine in W4_GROUP:
        return _w4_operands(c, a, g)
    if c.a_dtype == "e4m3":
        a, b = a * 4, b * 4
    t = TORCH[c.a_dtype]
    ops = dict(a=a.to(t), b=b.to(t))
    e = ENGINE.get(c.engine)
    if c.engine in ("cublas_addmm", "cublaslt_relu", "cublaslt_gelu"):
        ops["bias"] = torch.randn(c.n, generator=g, device=E.DEV).to(torch.bfloat16)
    if c.engine in EMULATED:  # one scale per 1 x group block, in the format's own values
        ops["scale_a"], ops["scale_b"] = (_format_scales(r, c.k, *EMULATED[c.engine][:2], g) for r in (c.m, c.n))
    elif c.a_dtype == "e4m3":
        rows = BLOCK_ROWS.get(c.engine)
        if rows is not None:  # one scale per block, spread over 2^-2 .. 2^2 so a wrong block's shows
            ga, gb = -(-c.m // rows[0]), -(-c.n // rows[1])
            for name, r in (("scale_a", ga), ("scale_b", gb)):
                u = torch.rand(r, c.k // 128, generator=g, device=E.DEV) + 0.5
                ops[name] = u * torch.exp2(torch.randint(-2, 3, (r, c.k // 128), generator=g, device=E.DEV).float())
        elif e is not None and e.name.endswith("rowwise"):
            ops["scale_a"] = (torch.rand(c.m, generator=g, device=E.DEV) + 0.5)
            ops["scale_b"] = (torch.rand(c.n, generator=g, device=E.DEV) + 0.5)
        else:
            ops["scale_a"] = torch.rand(1, generator=g, device=E.DEV) + 0.5
            ops["scale_b"] = torch.rand(1, generator=g, device=E.DEV) + 0.5
    return Operands(**ops)


def _format_scales(rows: int, k: int, group: int, scale_dtype: str, g: torch.Generator) -> torch.Tensor:
    """[rows, ceil(k / group)] block scales stored as `scale_dtype` holds them: e8m0 powers of two over
    2^-3 .. 2^3, e4m3 values over 2^-2 .. 2^3 (so a wrong block's scale shows)."""
    from kernels_ref.scales import stored

    shape = (rows, -(-k // group))
    power = torch.exp2(torch.randint(-3, 4, shape, generator=g, device=E.DEV).float())
    values = power if scale_dtype == "e8m0" else \
        ((torch.rand(shape, generator=g, device=E.DEV) + 0.5) * power).clamp(2.0 ** -2, 8.0).to(torch.float8_e4m3fn)
    return stored(values.double().cpu(), scale_dtype).to(E.DEV)


_SPLITK: dict = {}


def _splitk(c: Case) -> dict:
    """What cuBLAS's reduced-precision reductions do at this shape and layout (measure_numerics
    probes: cuBLAS picks its kernel by both)."""
    key = (c.a_dtype, c.m, c.n, c.k, c.a_major, c.b_major)
    if key not in _SPLITK:
        if c.m * c.n * c.k > 2 ** 33:
            _SPLITK[key] = {"boundaries": [], "probed": False}
        else:
            import measure_numerics as MN

            row = MN.measure_splitk(c.a_dtype, [(c.m, c.n, c.k)], majors=(c.a_major, c.b_major))["shapes"][0]
            _SPLITK[key] = dict(row, probed=True)
    return _SPLITK[key]


def _promotion(numerics: dict, name: str) -> Optional[int]:
    """The promotion interval measured for an engine, when its fit admits exactly one."""
    fit = numerics.get("engines", {}).get(name, {}).get("fit") or {}
    vals = set(fit.get("promotion") or [])
    return vals.pop() if len(vals) == 1 and None not in vals else None


def _w4_precision(numerics: dict) -> str:
    """tinygemm's dequant arithmetic as measured (benchmarks/numerics/probe_w4a16.py's choice, kept
    under engines.tinygemm_w4 of the numerics JSON); "operand" (the bound) where none was."""
    got = numerics.get("engines", {}).get("tinygemm_w4", {}).get("dequant_precision")
    return got if got in ("fp32", "operand") else "operand"


def spec_for(c: Case, numerics: dict) -> tuple[ProblemSpec, str]:
    """The spec that says what the engine does, and how it was chosen."""
    kw: dict = dict(m=c.m, n=c.n, k=c.k, a_dtype=c.a_dtype, b_dtype=c.a_dtype, out_dtype=c.out, a_major=c.a_major,
                    b_major=c.b_major, tile=Tile(128, 128, 64))
    why = ENGINE[c.engine].note if c.engine in ENGINE else c.engine
    e = c.engine
    if e in W4_GROUP:
        prec = _w4_precision(numerics)
        kw.update(b_dtype="uint4", b_packing="k_pairs_high_first", b_group_size=W4_GROUP[e], b_scales="bf16",
                  b_zeros="float_offset", dequant_precision=prec, reduction="fp32", tile=Tile(128, 128, 64))
        why += ("; dequant (q - 8) * s + z in fp32 then one rounding (measured)" if prec == "fp32" else
                "; dequant (q - 8) * s + z in bf16 arithmetic in any order (the bound: no measurement chose fp32)")
    elif c.a_dtype == "int8":
        kw.update(acc_dtype="int32", acc_model="int32")
    elif e in ("cublas_bf16", "cublas_fp16"):
        sk = _splitk(c)
        b = sk.get("boundaries") or []
        chunk = sk.get("chunk")
        if b and chunk:
            bk = math.gcd(64, chunk)
            kw.update(reduction=c.a_dtype, reduction_chunk=chunk, tile=Tile(128, 128, max(bk, 16)))
            why += f"; split-K probe: partials of {chunk} k rounded to {c.a_dtype}"
        elif b or not sk.get("probed"):
            kw.update(acc_model="any")
            why += f"; split-K probe: uneven partials {b[:4]}...: acc_model any" if b else \
                "; shape too large to probe: acc_model any"
        else:
            kw.update(reduction="fp32")
            why += "; split-K probe: no partial rounded to the output type"
    elif e.startswith("cublas"):
        kw.update(reduction="fp32")
        if e == "cublas_tf32":
            kw.update(acc_model="tf32_rn", tile=Tile(128, 128, 32))
            why += "; operands rounded to nearest TF32 (measured), k-blocks of 32"
    elif e in ("lt_e4m3_fast", "lt_e4m3_fast_rowwise"):
        kw.update(acc_model="fp8_fast", reduction="fp32")
    elif e == "triton_e4m3_fast":
        kw.update(acc_model="fp8_fast")
    elif e in ("lt_e4m3", "lt_e4m3_fp32out", "lt_e4m3_rowwise"):
        p = _promotion(numerics, "lt_e4m3_rowwise" if e.endswith("rowwise") else "lt_e4m3")
        kw.update(reduction="fp32")
        if p and p % 32 == 0:
            kw.update(acc_model="fp8_promoted", promotion_interval=p, tile=Tile(128, 128, max(64, p)))
            why += f"; promotion every {p} (measured)"
        else:
            kw.update(acc_model="any")
            why += "; no single promotion interval measured: acc_model any"
    elif e == "triton_e4m3_promoted":
        kw.update(acc_model="fp8_promoted", promotion_interval=128, tile=Tile(128, 128, 128))
    elif e in BLOCK_ROWS:
        # a block-scaled kernel scales each 128-deep k-block's partial as it adds it to fp32: at the
        # latest every 128 k (a measured interval, where one was, replaces it)
        p = _promotion(numerics, e) or 128
        p = p if p in (32, 64, 128) else 128
        kw.update(acc_model="fp8_promoted", promotion_interval=p, reduction="fp32", tile=Tile(128, 128, 128))
        why += f"; fp8 partials promoted to fp32 every {p} k{' (measured)' if _promotion(numerics, e) else ''}"
    if e in ("cublas_addmm", "cublaslt_relu", "cublaslt_gelu"):
        kw.update(bias="col", bias_dtype="bf16")
        if e == "cublaslt_relu":
            kw.update(activation="relu")
        if e == "cublaslt_gelu":
            # Some of cuBLASLt's GELU_BIAS kernels round the accumulator to bf16 before the bias, others
            # do not (H200: the 257x1000x520 col/col outlier case is 99.96 % bit-exact rounded, 82 %
            # fused; 12 other cases 98.7 % fused, 71 % rounded). The declared rounding's bound (one
            # bf16 ulp of the accumulator) covers both.
            kw.update(activation="gelu_tanh", activation_impl="fast", epilogue=("alpha_beta:bf16", "bias", "activation", "cast"))
            why += "; accumulator rounded to bf16 before the bias or not, as the kernel chosen does (measured)"
    if e in BLOCK_ROWS:
        ra, rb = BLOCK_ROWS[e]
        # the storage order is how torch reads them (alarms.engines._block_scale); the values do not depend on it
        kw.update(scale_a=Scale("block", (ra, 128), "col" if ra == 1 else "row"),
                  scale_b=Scale("block", (rb, 128), "col" if rb == 1 else "row"))
    elif e in EMULATED:
        group, scale_dtype, alpha = EMULATED[e]
        kw.update(scale_a=Scale("block", (1, group), "row", scale_dtype),
                  scale_b=Scale("block", (1, group), "row", scale_dtype), reduction="fp32", alpha=alpha,
                  tile=Tile(128, 128, 64))
        why += f"; {64 // group} scale groups a 64-deep k-block, products exact, fp32 sums in cuBLAS's order"
    elif c.a_dtype == "e4m3":
        rowwise = e.endswith("rowwise")
        kw.update(scale_a=Scale("row" if rowwise else "tensor"), scale_b=Scale("col" if rowwise else "tensor"))
    return ProblemSpec(**kw), why

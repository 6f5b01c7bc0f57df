"""Measure the accumulation numerics of the GEMM engines on this GPU, with controlled inputs.

    python benchmarks/measure_numerics.py [--out benchmarks/results/numerics_h200.json] [--quick]
    python benchmarks/measure_numerics.py --emulate      # CPU: the same probes on emulated engines

Every probe is a set of dot products with chosen products (output element i of an n x n GEMM
reads row i of A and column i of B; the other elements are not looked at), so each probe's exact
sum and every plausible rounding of it are known. An engine is identified by fitting the float64
emulator (kernels_ref.emulate.Engine) to its outputs: every candidate datapath that reproduces
every probe output bit for bit is kept.

Families of probes:
  step      one big product and small ones inside the first MMA instruction (k < 16 / 32 / 8),
            signs mixed, with and without a cancelling term, the small ones at every position and
            in the next instruction: fraction bits kept when aligning (align_bits), truncation or
            rounding of the aligned terms and of the sum (sign-biased pairs), whether the running
            accumulator joins the alignment (fused), the products per step (mma_k), the
            accumulator's width (acc_bits)
  ladder    a big product, then thousands of small ones (and a cancelling one last): where the
            small ones stop being lost, i.e. the k interval of promotion into fp32 (promotion)
  operand   fp32 operands with bits past TF32's: how many operand bits survive, and how they round
  splitk    cuBLAS with reduced-precision reductions, per shape: whether partials are rounded to
            bf16/fp16 (random outlier-channel inputs and +-1024 pairs across every k position),
            where the partial boundaries are, how a partial rounds, in what type partials are summed
  int8      torch._int_mm against the exact integer sum
  act       tanh.approx.f32 GELU and ex2.approx SiLU over a dense sweep of fp32 inputs: the largest
            error in units of 2^-23 (|x| + |y|)
  envelope  random normal / all-positive / outlier-channel GEMMs at several K: the error against the
            exact sum, next to S = sum |a||b| and the partial-sum magnitudes the bounds use

Writes one JSON (environment, per-engine fits, per-family raw observations that did not fit, the
summary constants) and prints a table. Exit 0 when every probe was reproduced by some candidate
datapath; 1 when a probe gave a result no candidate can express (printed with what was seen);
2 on bad usage. Importable: `measure(names, quick=True)` returns the same dict for a GPU test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from kernels_ref import emulate as E  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "numerics_h200.json")
SCHEMA = "oracle.numerics/1"
C_VALUES = (1.0, 1.25, 1.5, 1.75)  # small-mantissa factors every operand type holds

# ----------------------------------------------------------------------------------------------
# operand types: normal exponent range, the unit "big" product, instruction depth
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpType:
    name: str
    torch: torch.dtype
    emin: int  # smallest normal exponent
    emax: int  # largest exponent
    unit: float  # the probes' big product
    instr_k: int  # k of one wgmma instruction
    fraction_bits: int


OPTYPES = {
    "bf16": OpType("bf16", torch.bfloat16, -126, 127, 1.0, 16, 7),
    "fp16": OpType("fp16", torch.float16, -14, 15, 2.0 ** 14, 16, 10),
    "tf32": OpType("tf32", torch.float32, -126, 127, 1.0, 8, 10),
    "fp32": OpType("fp32", torch.float32, -126, 127, 1.0, 8, 23),
    "e4m3": OpType("e4m3", torch.float8_e4m3fn, -6, 8, 2.0 ** 8, 32, 3),
}


def _representable(v: float, t: OpType) -> bool:
    x = torch.tensor([v], dtype=torch.float64)
    return bool(x.to(torch.float32).to(t.torch).to(torch.float64)[0] == x[0])


_SPLIT_CACHE: dict = {}


def split_product(p: float, t: OpType) -> tuple[float, float]:
    """(a, b), both exactly representable in t (normal where possible), with a * b == p exactly."""
    key = (p, t.name)
    if key in _SPLIT_CACHE:
        return _SPLIT_CACHE[key]
    if p == 0:
        return 0.0, 0.0
    m, e = math.frexp(abs(p))  # p = m 2^e, m in [0.5, 1)
    c, e = m * 2, e - 1  # p = c 2^e, c in [1, 2)
    sign = 1.0 if p > 0 else -1.0
    order = sorted(range(t.emin - t.fraction_bits, t.emax + 1), key=lambda ea: abs(ea - e / 2))
    for ea in order:
        a, b = sign * c * 2.0 ** ea, 2.0 ** (e - ea)
        if _representable(a, t) and _representable(b, t) and a * b == p:
            normal = abs(a) >= 2.0 ** t.emin and b >= 2.0 ** t.emin
            if normal or not any(_normal_split(c, e, x, t) for x in order):
                _SPLIT_CACHE[key] = (a, b)
                return a, b
    raise ValueError(f"product {p!r} cannot be formed from two {t.name} values")


def _normal_split(c, e, ea, t) -> bool:
    a, b = c * 2.0 ** ea, 2.0 ** (e - ea)
    return a >= 2.0 ** t.emin and b >= 2.0 ** t.emin and _representable(a, t) and _representable(b, t)


def operands_for(products: torch.Tensor, t: OpType) -> tuple[torch.Tensor, torch.Tensor]:
    """Factor a [n, K] tensor of products into operand rows a, b [n, K] of type t."""
    flat = products.flatten().tolist()
    uniq = {v: split_product(v, t) for v in set(flat)}
    a = torch.tensor([uniq[v][0] for v in flat], dtype=torch.float64).reshape(products.shape)
    b = torch.tensor([uniq[v][1] for v in flat], dtype=torch.float64).reshape(products.shape)
    return a, b


# ----------------------------------------------------------------------------------------------
# probes
# ----------------------------------------------------------------------------------------------


@dataclass
class Probes:
    family: str
    a: torch.Tensor  # [n, K] float64 operand rows
    b: torch.Tensor  # [n, K]
    labels: list

    @property
    def n(self) -> int:
        return self.a.shape[0]

    def cat(self, other: "Probes") -> "Probes":
        K = max(self.a.shape[1], other.a.shape[1])
        pad = (lambda x: torch.nn.functional.pad(x, (0, K - x.shape[1])))
        return Probes(self.family, torch.cat([pad(self.a), pad(other.a)]), torch.cat([pad(self.b), pad(other.b)]),
                      self.labels + other.labels)


def _from_products(family: str, rows: list, labels: list, K: int, t: OpType) -> Probes:
    p = torch.zeros(len(rows), K, dtype=torch.float64)
    for i, row in enumerate(rows):
        for k, v in row:
            p[i, k] = v
    a, b = operands_for(p, t)
    return Probes(family, a, b, labels)


def step_probes(t: OpType, quick: bool = False) -> Probes:
    """Inside and just past the first MMA instruction (module docstring)."""
    B, g = t.unit, t.instr_k
    # e4m3: products stay normal (>= 2^-12), so no probe leans on fp8 subnormals
    js = range(1, 35) if t.name != "e4m3" else range(1, 21)
    if quick:
        js = range(2, 35, 3) if t.name != "e4m3" else range(2, 21, 2)
    rows, labels = [], []

    def add(row, label):
        rows.append(row)
        labels.append(label)

    for j in js:
        for c in (C_VALUES if not quick else (1.0, 1.5)):
            small = c * B * 2.0 ** -j
            for s0 in (1, -1):
                for s1 in (1, -1):
                    add([(0, s0 * B), (1, s0 * s1 * small)], f"pair j={j} c={c} signs={s0},{s0 * s1}")
                add([(0, s0 * B), (1, s0 * small), (2, -s0 * B)], f"pair+cancel j={j} c={c} sign={s0}")
                add([(0, s0 * B), (g, s0 * small), (g + 1, -s0 * B)], f"next-step+cancel j={j} c={c} sign={s0}")
    many_js = [j for j in js if j >= 8]
    for j in many_js:
        for cnt in (2, 3, 7, g - 2):
            for s in (1, -1):
                smalls = [(k, s * B * 2.0 ** -j) for k in range(1, cnt + 1)]
                add([(0, B)] + smalls, f"many n={cnt} j={j} sign={s}")
                add([(0, B)] + smalls + [(cnt + 1, -B)], f"many+cancel n={cnt} j={j} sign={s}")
                add([(0, B)] + [(g + k, s * B * 2.0 ** -j) for k in range(cnt)] + [(2 * g - 1, -B)],
                    f"next-step many+cancel n={cnt} j={j} sign={s}")
                add([(0, B)] + [(k, s * B * 2.0 ** -j) for k in range(g, 2 * g)], f"next-step full j={j} sign={s}")
    for d in range(1, g):
        for j in many_js[::2]:
            add([(0, B), (d, 1.5 * B * 2.0 ** -j), ((d + 1) % g or g, -B)], f"position d={d} j={j}")
            add([(d, B), (0, 1.5 * B * 2.0 ** -j), (g + d, -B)], f"position-before d={d} j={j}")
    return _from_products("step", rows, labels, 2 * g, t)


def ladder_probes(t: OpType, K: int, quick: bool = False) -> Probes:
    """A big product, then small ones at every k (module docstring)."""
    B = t.unit
    js = (11, 13, 15, 17, 19) if t.name == "e4m3" else (22, 24, 26, 28, 31)
    if quick:
        js = js[1::2]
    rows, labels = [], []
    for j in js:
        s = B * 2.0 ** -j
        for q in (0, 37, K // 3 + 5, K - 200):
            smalls = [(k, s) for k in range(K) if k != q and k != K - 1]
            rows.append([(q, B)] + smalls)
            labels.append(f"ladder big@{q} j={j}")
            rows.append([(q, B)] + smalls + [(K - 1, -B)])
            labels.append(f"ladder+cancel big@{q} j={j}")
    return _from_products("ladder", rows, labels, K, t)


def operand_probes(quick: bool = False) -> Probes:
    """fp32 operands with bits past TF32's 10 fraction bits; the other factor 1 (or 2^-j)."""
    rows_a, rows_b, labels = [], [], []
    deltas = []
    for lo in range(9, 24):
        deltas += [2.0 ** -lo, 3 * 2.0 ** -(lo + 1), 2.0 ** -lo + 2.0 ** -23]
    deltas += [2.0 ** -10 + 2.0 ** -11, 2.0 ** -11 + 2.0 ** -12 + 2.0 ** -13, 2.0 ** -9 + 2.0 ** -11]
    if quick:
        deltas = deltas[::3]
    for dlt in deltas:
        for s in (1, -1):
            for side in ("a", "b"):
                v = s * (1 + dlt)
                rows_a.append(v if side == "a" else 1.0)
                rows_b.append(v if side == "b" else 1.0)
                labels.append(f"operand {side}=1+{dlt!r} sign={s}")
            rows_a.append(s * (1 + dlt))
            rows_b.append(1 + dlt)
            labels.append(f"operand both=1+{dlt!r} sign={s}")
    n, K = len(rows_a), 8
    a = torch.zeros(n, K, dtype=torch.float64)
    b = torch.zeros(n, K, dtype=torch.float64)
    a[:, 0] = torch.tensor(rows_a, dtype=torch.float64)
    b[:, 0] = torch.tensor(rows_b, dtype=torch.float64)
    return Probes("operand", a, b, labels)


# ----------------------------------------------------------------------------------------------
# engines on the GPU
# ----------------------------------------------------------------------------------------------


@dataclass
class Adapter:
    """One way to run a GEMM. run(A [M, K], B [K, N]) (float64 values exact in `optype`) -> float64
    output [M, N] as the engine returned it (rounded to `out`)."""

    name: str
    optype: str
    out: str  # fp32 | bf16 | fp16 | int32
    run: Callable
    family: str  # grid key: 16bit | tf32 | fp32 | fp8
    note: str = ""

    def diag(self, pr: Probes, multiple: int = 128) -> torch.Tensor:
        n, K = pr.a.shape
        npad = -(-n // multiple) * multiple
        kpad = -(-K // multiple) * multiple
        A = torch.zeros(npad, kpad, dtype=torch.float64)
        Bm = torch.zeros(kpad, npad, dtype=torch.float64)
        A[:n, :K] = pr.a
        Bm[:K, :n] = pr.b.t()
        out = self.run(A, Bm)
        return out.diagonal()[:n].to(torch.float64).cpu()


def _flags(tf32: Optional[bool] = None, reduced: Optional[bool] = None):
    """Context manager setting torch's matmul knobs, restored on exit."""
    m = torch.backends.cuda.matmul

    class _F:
        def __enter__(self):
            self.saved = {}
            if reduced is not None:
                for k in ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"):
                    self.saved[k] = getattr(m, k)
                    setattr(m, k, reduced)
            if tf32 is not None:
                if hasattr(m, "fp32_precision"):
                    self.saved["fp32_precision"] = m.fp32_precision
                    m.fp32_precision = "tf32" if tf32 else "ieee"
                else:
                    self.saved["allow_tf32"] = m.allow_tf32
                    m.allow_tf32 = tf32

        def __exit__(self, *exc):
            for k, v in self.saved.items():
                setattr(m, k, v)
    return _F()


def _cublas(dtype, out_fp32: bool, reduced: bool = False, tf32: Optional[bool] = None):
    def run(A, B):
        a, b = A.cuda().to(dtype), B.cuda().to(dtype)
        with _flags(tf32=tf32, reduced=reduced):
            out = torch.mm(a, b, out_dtype=torch.float32) if out_fp32 else torch.mm(a, b)
        torch.cuda.synchronize()
        return out.double().cpu()
    return run


def _scaled(fast: bool, rowwise: bool):
    def run(A, B):
        a = A.cuda().to(torch.float32).to(torch.float8_e4m3fn).contiguous()
        b = B.cuda().to(torch.float32).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major
        if rowwise:
            sa = torch.ones(a.shape[0], 1, device="cuda", dtype=torch.float32)
            sb = torch.ones(1, b.shape[1], device="cuda", dtype=torch.float32)
            out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
        else:
            one = torch.ones((), device="cuda", dtype=torch.float32)
            out = torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=fast)
        torch.cuda.synchronize()
        return out.double().cpu()
    return run


_TRITON = {}


def _triton_kernel():
    if "k" in _TRITON:
        return _TRITON["k"]
    import triton
    import triton.language as tl

    @triton.jit
    def probe_mm(a_ptr, b_ptr, c_ptr, K, s_am, s_bn, s_cm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 IP: tl.constexpr, MNI: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * s_am + (k0 + rk)[None, :])
            b = tl.load(b_ptr + rn[None, :] * s_bn + (k0 + rk)[:, None])  # B stored K-major [N, K]
            if MNI >= 0:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=MNI)
            elif IP == "default":
                acc = tl.dot(a, b, acc)
            else:
                acc = tl.dot(a, b, acc, input_precision=IP)
        tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :], acc)

    _TRITON["k"] = probe_mm
    return probe_mm


def _triton(dtype, ip: str = "default", mni: int = -1, bk: int = 64):
    def run(A, B):
        kern = _triton_kernel()
        M, K = A.shape
        N = B.shape[1]
        a = A.cuda().to(torch.float32).to(dtype).contiguous()
        bnk = B.t().cuda().to(torch.float32).to(dtype).contiguous()
        c = torch.empty(M, N, device="cuda", dtype=torch.float32)
        h = kern[(M // 64, N // 64)](a, bnk, c, K, a.stride(0), bnk.stride(0), c.stride(0), BM=64, BN=64, BK=bk,
                                      IP=ip, MNI=mni, num_warps=4)
        torch.cuda.synchronize()
        asm = getattr(h, "asm", None)
        run.wgmma = ("wgmma" in asm.get("ptx", "")) if isinstance(asm, dict) else None
        return c.double().cpu()
    run.wgmma = None
    return run


def _int_mm(A, B):
    a = A.cuda().to(torch.int8).contiguous()
    b = B.cuda().to(torch.int8).t().contiguous().t()
    try:
        out = torch._int_mm(a, b)
    except RuntimeError:
        out = torch._int_mm(a, B.cuda().to(torch.int8).contiguous())
    torch.cuda.synchronize()
    return out.double().cpu()


def gpu_adapters() -> dict[str, Adapter]:
    bf, hf, f32, f8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
    ads = [
        Adapter("cublas_bf16", "bf16", "fp32", _cublas(bf, True), "16bit", "torch.mm(out_dtype=fp32), reductions fp32"),
        Adapter("cublas_bf16_out", "bf16", "bf16", _cublas(bf, False), "16bit", "torch.mm, bf16 out, reductions fp32"),
        Adapter("cublas_fp16", "fp16", "fp32", _cublas(hf, True), "16bit", "torch.mm(out_dtype=fp32)"),
        Adapter("cublas_tf32", "tf32", "fp32", _cublas(f32, False, tf32=True), "tf32", "torch.mm fp32, TF32 on"),
        Adapter("cublas_fp32", "fp32", "fp32", _cublas(f32, False, tf32=False), "fp32", "torch.mm fp32, TF32 off"),
        Adapter("triton_bf16", "bf16", "fp32", _triton(bf), "16bit", "tl.dot, acc fp32"),
        Adapter("triton_fp16", "fp16", "fp32", _triton(hf), "16bit", "tl.dot, acc fp32"),
        Adapter("triton_tf32", "tf32", "fp32", _triton(f32, "tf32"), "tf32", "tl.dot input_precision=tf32"),
        Adapter("triton_tf32x3", "fp32", "fp32", _triton(f32, "tf32x3"), "x3", "tl.dot input_precision=tf32x3"),
        Adapter("triton_bf16x3", "fp32", "fp32", _triton(f32, "bf16x3"), "x3", "tl.dot input_precision=bf16x3"),
        Adapter("triton_ieee", "fp32", "fp32", _triton(f32, "ieee"), "fp32", "tl.dot input_precision=ieee"),
        Adapter("triton_e4m3", "e4m3", "fp32", _triton(f8, bk=128), "fp8", "tl.dot default max_num_imprecise_acc"),
        Adapter("triton_e4m3_mni0", "e4m3", "fp32", _triton(f8, mni=0, bk=128), "fp8", "max_num_imprecise_acc=0"),
        Adapter("triton_e4m3_mni64", "e4m3", "fp32", _triton(f8, mni=64, bk=128), "fp8", "max_num_imprecise_acc=64"),
        Adapter("lt_e4m3_fast", "e4m3", "fp32", _scaled(True, False), "fp8", "_scaled_mm per-tensor, fast accum"),
        Adapter("lt_e4m3", "e4m3", "fp32", _scaled(False, False), "fp8", "_scaled_mm per-tensor"),
        Adapter("lt_e4m3_fast_rowwise", "e4m3", "bf16", _scaled(True, True), "fp8", "_scaled_mm row/col, fast accum"),
        Adapter("lt_e4m3_rowwise", "e4m3", "bf16", _scaled(False, True), "fp8", "_scaled_mm row/col scales"),
    ]
    return {a.name: a for a in ads}


# ----------------------------------------------------------------------------------------------
# emulated engines (CPU dry run of the whole procedure)
# ----------------------------------------------------------------------------------------------

KNOWN = {
    "emu_trunc25": ("bf16", "fp32", "16bit", E.Engine(mma_k=16, align_bits=25, align_round="trunc", acc_round="trunc")),
    "emu_rn24_unfused": ("bf16", "bf16", "16bit", E.Engine(mma_k=8, fused=False, align_bits=24, align_round="rn",
                                                            acc_round="rn")),
    "emu_fp8_13_p128": ("e4m3", "fp32", "fp8", E.Engine(mma_k=32, align_bits=13, acc_bits=13, promotion=128)),
    "emu_fp8_14_fast": ("e4m3", "bf16", "fp8", E.Engine(mma_k=32, align_bits=14, acc_bits=14)),
    "emu_tf32_rna": ("tf32", "fp32", "tf32", E.Engine(mma_k=8, align_bits=24, operand_bits=10, operand_round="rna")),
}


def emulated_adapters() -> dict[str, Adapter]:
    out = {}
    for name, (opt, o, fam, eng) in KNOWN.items():
        def run(A, B, eng=eng, o=o):
            acc = E.gemm(A, B, eng)
            return E.to_dtype(acc, o) if o != "fp32" else E.to_dtype(acc, "fp32")
        out[name] = Adapter(name, opt, o, run, fam, f"emulated: {eng.describe()}")

    for name, ad in out.items():
        eng, o = KNOWN[name][3], ad.out

        def fast_diag(pr, multiple=128, eng=eng, o=o):
            return E.to_dtype(E.dot(pr.a, pr.b, eng), o)
        ad.diag = fast_diag
    return out


# ----------------------------------------------------------------------------------------------
# fitting
# ----------------------------------------------------------------------------------------------

GRIDS = {
    "16bit": dict(mma_k=(4, 8, 16), fused=(True, False), align_bits=tuple(range(21, 31)) + (40,),
                  align_round=("trunc", "rn"), acc_bits=(23,), acc_round=("trunc", "rn")),
    "tf32": dict(mma_k=(4, 8), fused=(True, False), align_bits=tuple(range(21, 31)) + (40,),
                 align_round=("trunc", "rn"), acc_bits=(23,), acc_round=("trunc", "rn")),
    "fp32": dict(mma_k=(1, 4, 8), fused=(True, False), align_bits=tuple(range(21, 31)) + (40,),
                 align_round=("trunc", "rn"), acc_bits=(23,), acc_round=("trunc", "rn")),
    # bf16x3 runs bf16 instructions (k = 16): the recorded outputs of 2026-12-01 fit none of k = 4, 8
    "x3": dict(mma_k=(4, 8, 16), fused=(True,), align_bits=tuple(range(22, 28)) + (40,), align_round=("trunc", "rn"),
               acc_bits=(23,), acc_round=("trunc", "rn")),
    # acc_bits at or above align_bits are indistinguishable on fp8 products (the aligned sum is narrow)
    "fp8": dict(mma_k=(8, 16, 32), fused=(True, False), align_bits=tuple(range(9, 25)) + (40,),
                align_round=("trunc", "rn"), acc_bits=tuple(range(10, 19)) + (23,), acc_round=("trunc", "rn")),
}
QUICK_GRIDS = {
    "16bit": dict(GRIDS["16bit"], mma_k=(8, 16), align_bits=(22, 23, 24, 25, 26, 40)),
    "tf32": dict(GRIDS["tf32"], align_bits=(22, 23, 24, 25, 26, 40)),
    "fp32": dict(GRIDS["fp32"], mma_k=(1, 8), align_bits=(23, 24, 25, 40)),
    "x3": dict(GRIDS["x3"], align_bits=(23, 24, 25, 40)),
    "fp8": dict(GRIDS["fp8"], mma_k=(16, 32), align_bits=tuple(range(11, 17)) + (23, 40),
                acc_bits=tuple(range(11, 17)) + (23,)),
}
PARAMS = ("fused", "align_bits", "align_round", "acc_bits", "acc_round")
# promotion (or restart) intervals the ladders try: powers of two and the multiples of 32 up to 256
# (cuBLAS TF32's recorded ladder outputs of 2026-12-01 fit no power of two)
PROMOTIONS = tuple(sorted({8, 16, 512, 1024, 2048} | set(range(32, 257, 32))))


def _candidates(grid: dict, dev) -> dict[int, dict[str, torch.Tensor]]:
    """Per mma_k, [C, 1] tensors of every combination of the other parameters."""
    import itertools

    out = {}
    for g in grid["mma_k"]:
        combos = list(itertools.product(*(grid[p] for p in PARAMS)))
        cols = list(zip(*combos))
        d = {}
        for p, col in zip(PARAMS, cols):
            if p.endswith("round"):
                d[p] = torch.tensor([E.ROUND_CODE[v] for v in col], device=dev)[:, None]
            elif p == "fused":
                d[p] = torch.tensor(col, device=dev)[:, None]
            else:
                d[p] = torch.tensor(col, dtype=torch.float64, device=dev)[:, None]
        out[g] = d
    return out


def _decode(g: int, d: dict, i: int, promotion=None, operand=None) -> dict:
    rec = {"mma_k": g, "promotion": promotion}
    for p in PARAMS:
        v = d[p][i, 0].item()
        rec[p] = E.ROUNDINGS[int(v)] if p.endswith("round") else (bool(v) if p == "fused" else int(v))
    if operand:
        rec.update(operand)
    return rec


def _engine_of(rec: dict, **over) -> E.Engine:
    kw = {k: rec[k] for k in ("mma_k", "fused", "align_bits", "align_round", "acc_bits", "acc_round", "promotion")}
    for k in ("operand_bits", "operand_round", "passes"):
        if rec.get(k) is not None:
            kw[k] = rec[k]
    kw.update(over)
    return E.Engine(**kw)


def _predict(pr: Probes, out: str, g: int, d: dict, promotion, operand: dict, dev, chunk: int = 384):
    """Predicted outputs [C, n] of every candidate (batched over candidates)."""
    a, b = pr.a.to(dev), pr.b.to(dev)
    C = d["fused"].shape[0]
    res = []
    for c0 in range(0, C, chunk):
        sl = {p: d[p][c0:c0 + chunk] for p in PARAMS}
        eng = E.Engine(mma_k=g, promotion=promotion, **sl, **operand)
        res.append(E.to_dtype(E.dot(a, b, eng), out) if out != "int32" else E.dot(a, b, eng))
    return torch.cat(res)


def fit(ad: Adapter, pr: Probes, observed: torch.Tensor, grid: dict, dev, promotions=(None,),
        operand: Optional[dict] = None, restrict: Optional[list] = None) -> dict:
    """Every candidate datapath reproducing every probe output. `restrict`: candidates (records)
    from an earlier family; only they (times `promotions`) are tried."""
    operand = operand or {}
    obs = observed.to(dev)
    kept, best = [], []
    if restrict is not None:
        groups: dict[int, list] = {}
        for r in restrict:
            groups.setdefault(r["mma_k"], []).append(r)
        cands = {}
        for g, recs in groups.items():
            d = {}
            for p in PARAMS:
                vals = [E.ROUND_CODE[r[p]] if p.endswith("round") else r[p] for r in recs]
                dt = torch.float64 if p in ("align_bits", "acc_bits") else None
                d[p] = torch.tensor(vals, device=dev, dtype=dt)[:, None]
            cands[g] = d
    else:
        cands = _candidates(grid, dev)
    for g, d in cands.items():
        for promo in promotions:
            if promo is not None and promo % g:
                continue
            pred = _predict(pr, ad.out, g, d, promo, operand, dev)
            same = (pred == obs[None, :]) | (pred.isnan() & obs.isnan()[None, :])
            miss = (~same).sum(1)
            for i in torch.nonzero(miss == 0).flatten().tolist():
                kept.append(_decode(g, d, i, promo, operand))
            order = torch.argsort(miss)[:3].tolist()
            for i in order:
                bad_idx = (~same[i]).nonzero().flatten()[:4].tolist()
                best.append((int(miss[i]), _decode(g, d, i, promo, operand), bad_idx, pred[i]))
    best.sort(key=lambda t: t[0])
    seen = []
    for miss, rec, idx, pred in best[:3]:
        seen.append({"mismatches": miss, "of": pr.n, "candidate": rec,
                     "examples": [{"probe": pr.labels[j], "observed": float(observed[j]), "predicted": float(pred[j])}
                                  for j in idx]})
    return {"family": pr.family, "probes": pr.n, "consistent": kept, "nearest": [] if kept else seen}


# ----------------------------------------------------------------------------------------------
# measurements
# ----------------------------------------------------------------------------------------------


def _summarise(cands: list) -> dict:
    """The loosest values over the consistent datapaths (what a sound bound must allow)."""
    if not cands:
        return {}
    return {
        "align_bits_min": min(c["align_bits"] for c in cands),
        "align_bits_max": max(c["align_bits"] for c in cands),
        "acc_bits_min": min(c["acc_bits"] for c in cands),
        "acc_bits_max": max(c["acc_bits"] for c in cands),
        "align_round": sorted({c["align_round"] for c in cands}),
        "acc_round": sorted({c["acc_round"] for c in cands}),
        "fused": sorted({c["fused"] for c in cands}),
        "mma_k_max": max(c["mma_k"] for c in cands),
        "mma_k_min": min(c["mma_k"] for c in cands),
        "promotion": sorted({c["promotion"] for c in cands}, key=lambda v: (v is None, v or 0)),
        "candidates": len(cands),
    }


def measure_engine(ad: Adapter, dev, quick: bool = False) -> dict:
    """Operand rounding (TF32 kinds), then the step family, then the ladder family."""
    t = OPTYPES[ad.optype]
    grid = (QUICK_GRIDS if quick else GRIDS)[ad.family]
    res: dict = {"engine": ad.name, "note": ad.note, "optype": ad.optype, "out": ad.out}
    t0 = time.time()
    operand = {}
    try:
        if ad.family in ("tf32", "x3"):
            pr = operand_probes(quick)
            obs = ad.diag(pr)
            rows = []
            for bits in (7, 8, 9, 10, 11, 12, 13, 23):
                for rnd in E.ROUNDINGS:
                    for passes in ((1, 3) if ad.family == "x3" else (1,)):
                        if bits == 23 and (rnd != "rn" or passes != 1):
                            continue
                        op = {"operand_bits": bits if bits < 23 else None, "operand_round": rnd, "passes": passes}
                        eng = E.Engine(mma_k=8, align_bits=40, acc_round="rn", **{k: v for k, v in op.items()
                                                                                  if v is not None})
                        pred = E.to_dtype(E.dot(pr.a, pr.b, eng), ad.out)
                        miss = int((pred != obs).sum())
                        rows.append((miss, op))
            rows.sort(key=lambda r: r[0])
            good = [op for miss, op in rows if miss == 0]
            res["operand"] = {"probes": pr.n, "consistent": good, "nearest": [] if good else
                              [{"mismatches": m, "of": pr.n, "candidate": op} for m, op in rows[:3]]}
            if good:
                operand = {k: v for k, v in good[0].items() if v is not None and not (k == "passes" and v == 1)}
                if operand.get("operand_bits") is None:
                    operand.pop("operand_round", None)
        pr = step_probes(t, quick)
        obs = ad.diag(pr)
        step = fit(ad, pr, obs, grid, dev, operand=operand)
        res["step"] = step
        K = 1024 if quick else (4096 if ad.family == "fp8" else 2048)
        lad = ladder_probes(t, K, quick)
        obs_l = ad.diag(lad)
        promos = (None,) + tuple(p for p in PROMOTIONS if p < K)
        restrict = step["consistent"] if step["consistent"] else None
        ladder = fit(ad, lad, obs_l, grid, dev, promotions=promos, operand=operand, restrict=restrict)
        if restrict is not None and not ladder["consistent"] and _grid_size(grid) <= 1000:
            ladder = fit(ad, lad, obs_l, grid, dev, promotions=promos, operand=operand)
            ladder["refit_without_step"] = True
        res["ladder"] = ladder
        res["fit"] = _summarise(ladder["consistent"])
        res["ok"] = bool(step["consistent"]) and bool(ladder["consistent"])
        wg = getattr(ad.run, "wgmma", None)
        if wg is not None:
            res["ptx_has_wgmma"] = wg
    except Exception as e:  # an engine this torch/triton lacks: recorded, not fatal
        res["ok"] = None
        res["unavailable"] = f"{type(e).__name__}: {e}"[:400]
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _grid_size(grid: dict) -> int:
    return math.prod(len(grid[p]) for p in ("mma_k",) + PARAMS)


# -- split-K -----------------------------------------------------------------------------------

SPLITK_SHAPES = [(64, 64, 8192), (64, 64, 65536), (128, 128, 16384), (128, 256, 32768), (256, 256, 8192),
                 (16, 2048, 16384), (1, 4096, 16384), (512, 512, 16384), (128, 128, 65536), (1024, 1024, 8192),
                 (32, 32, 4096), (2048, 2048, 2048)]
QUICK_SPLITK = [(64, 64, 8192), (128, 128, 16384)]


DEV = "cuda"  # where the split-K probes run; the CPU test points it and `_mm` at an emulation


def _mm(a: torch.Tensor, b: torch.Tensor, reduced: bool) -> torch.Tensor:
    """torch.mm with reduced-precision reductions allowed or not (cuBLAS)."""
    with _flags(reduced=reduced):
        out = torch.mm(a, b)
    torch.cuda.synchronize()
    return out


def _outlier_inputs(M, N, K, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randn(M, K, device=DEV, generator=g)
    b = torch.randn(K, N, device=DEV, generator=g)
    cols = torch.randperm(K, device=DEV, generator=g)[:max(1, K // 256)]
    a[:, cols] *= 1000.0
    return a.to(dtype), b.to(dtype)


def _major(x: torch.Tensor, major: str) -> torch.Tensor:
    """x stored row-major (its last dimension contiguous) or column-major: cuBLAS picks its kernel
    by the layout too."""
    return x.contiguous() if major == "row" else x.t().contiguous().t()


def _col_probe_run(dtype, M, N, K, probes: list, reduced: bool, majors=("row", "row")) -> torch.Tensor:
    """Probes in columns: A = ones [M, K], B[:, n] = probe n's products, given as lists of (k, value);
    output row 0. Built on the GPU, N probes per GEMM, A and B stored in `majors`."""
    outs = []
    a = _major(torch.ones(M, K, device=DEV, dtype=dtype), majors[0])
    for c0 in range(0, len(probes), N):
        chunk = probes[c0:c0 + N]
        ks, cols, vals = [], [], []
        for j, pr in enumerate(chunk):
            for k, v in pr:
                ks.append(k)
                cols.append(j)
                vals.append(v)
        Bm = torch.zeros(K, N, device=DEV, dtype=torch.float64)
        Bm[torch.tensor(ks, device=DEV), torch.tensor(cols, device=DEV)] = torch.tensor(vals, device=DEV,
                                                                                        dtype=torch.float64)
        out = _mm(a, _major(Bm.to(dtype), majors[1]), reduced)
        outs.append(out[0, :len(chunk)].double().cpu())
    return torch.cat(outs)


def measure_splitk(dtype_name: str, shapes, quick=False, majors=("row", "row")) -> dict:
    """Reduced-precision reductions of cuBLAS, per shape (module docstring), with A and B stored in
    `majors`."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    X = 1024.0 if dtype_name == "bf16" else 2.0 ** 14  # X + 1 is not representable, X is
    ulp_x = 8.0 if dtype_name == "bf16" else 16.0
    rows = []
    for (M, N, K) in shapes:
        row = {"shape": [M, N, K], "majors": list(majors)}
        a, b = (_major(x, mj) for x, mj in zip(_outlier_inputs(M, N, K, dtype), majors))
        on = _mm(a, b, True).double()
        off = _mm(a, b, False).double()
        exact = a.double() @ b.double()
        s = a.double().abs() @ b.double().abs()
        row["outlier_differs"] = int((on != off).sum())
        row["err_on_over_S_max"] = float(((on - exact).abs() / s).max())
        row["err_off_over_S_max"] = float(((off - exact).abs() / s).max())
        step = 16
        pos = list(range(step, K, step))
        # X + 1 just before each candidate boundary, -X at it: 1 when both sit in one partial, 0
        # when a partial holding X + 1 was rounded to the output type first
        probes = [[(kx - step, X), (kx - step + 1, 1.0), (kx, -X)] for kx in pos]
        got = _col_probe_run(dtype, M, N, K, probes, True, majors).tolist()
        bounds = [kx for kx, v in zip(pos, got) if v == 0.0]
        odd = [(kx, v) for kx, v in zip(pos, got) if v not in (0.0, 1.0)]
        row["boundaries"] = bounds
        row["partials"] = len(bounds) + 1
        if odd:
            row["unexpected"] = [{"k": kx, "output": v} for kx, v in odd[:8]]
        if bounds:
            b0 = bounds[0]
            deltas = list(range(1, int(2 * ulp_x) + 1))
            got_r = _col_probe_run(dtype, M, N, K, [[(b0 - 2, X), (b0 - 1, float(d)), (b0, -X)] for d in deltas],
                                   True, majors).tolist()
            rn = [float(torch.tensor(X + d).to(dtype).double() - X) for d in deltas]
            row["partial_rounding"] = "rn" if got_r == rn else {"deltas": deltas, "seen": got_r, "rn_would_be": rn}
            chunks = [b0] + [bb - aa for aa, bb in zip(bounds, bounds[1:])]
            row["chunk"] = b0 if all(c == b0 for c in chunks) else None
            if len(bounds) >= 2:
                big = 256.0 if dtype_name == "bf16" else 4096.0  # big + 1 rounds to big in the output type
                got3 = float(_col_probe_run(dtype, M, N, K, [[(0, big), (bounds[0], 1.0), (bounds[1], -big)]],
                                            True, majors)[0])
                row["partial_sum"] = {1.0: "fp32", 0.0: "output precision"}.get(got3, f"seen {got3}")
        row["explained"] = (row["outlier_differs"] == 0) or bool(bounds)
        rows.append(row)
    return {"dtype": dtype_name, "shapes": rows, "ok": all(r["explained"] and "unexpected" not in r for r in rows)}


# -- int8 --------------------------------------------------------------------------------------

def measure_int8() -> dict:
    res = {"cases": []}
    ok = True
    g = torch.Generator().manual_seed(0)
    for (M, N, K, kind) in ((32, 64, 4096, "random"), (64, 128, 8192, "random"), (32, 32, 8192, "extreme")):
        if kind == "random":
            A = torch.randint(-128, 128, (M, K), generator=g).double()
            B = torch.randint(-128, 128, (K, N), generator=g).double()
        else:
            A = torch.full((M, K), -128.0)
            B = torch.full((K, N), -128.0)
        try:
            out = _int_mm(A, B)
        except Exception as e:
            res["cases"].append({"shape": [M, N, K], "kind": kind, "error": str(e)[:300]})
            ok = False
            continue
        exact = A @ B
        wrapped = torch.remainder(exact + 2.0 ** 31, 2.0 ** 32) - 2.0 ** 31
        same = bool(torch.equal(out, wrapped))
        ok &= same
        res["cases"].append({"shape": [M, N, K], "kind": kind, "exact": same,
                             "max_abs_diff": float((out - wrapped).abs().max())})
    res["ok"] = ok
    return res


# -- activations -------------------------------------------------------------------------------

def _act_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def act_kernel(x_ptr, y_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m, other=0.0)
        if KIND == 0:  # gelu with tanh.approx.f32
            u = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                          pack=1)
            y = 0.5 * x * (1.0 + t)
        elif KIND == 1:  # silu with ex2.approx and an IEEE division
            e = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=f,f", [-x * 1.4426950408889634],
                                          dtype=tl.float32, is_pure=True, pack=1)
            y = tl.math.div_rn(x, 1.0 + e)
        elif KIND == 2:  # silu with ex2.approx.ftz and div.approx (a fast-math build)
            e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [-x * 1.4426950408889634],
                                          dtype=tl.float32, is_pure=True, pack=1)
            y = tl.inline_asm_elementwise("div.approx.f32 $0, $1, $2;", "=f,f,f", [x, 1.0 + e], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:  # gelu with tanh.approx and a fused multiply-add form
            u = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x)
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                          pack=1)
            y = 0.5 * x + 0.5 * x * t
        tl.store(y_ptr + i, y, mask=m)

    return act_kernel


ACT_KINDS = {0: ("gelu_tanh", "tanh.approx.f32"), 1: ("silu", "ex2.approx.f32 + div.rn"),
             2: ("silu", "ex2.approx.ftz.f32 + div.approx"), 3: ("gelu_tanh", "tanh.approx.f32, x(1 + c x^2) form")}


def _exact_act(x64, name):
    if name == "gelu_tanh":
        u = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)
        return x64 * torch.sigmoid(2.0 * u)
    return x64 * torch.sigmoid(x64)


def measure_activations(quick: bool = False) -> dict:
    """Max over a dense sweep of err / (2^-23 (|x| + |y|)), err against float64 on the fp32 input."""
    kern = _act_kernels()
    stride = 61 if quick else 7
    lo_bits, hi_bits = 0x2F800000, 0x43000000  # 2^-32 .. 128
    out = {}
    for kind, (name, impl) in ACT_KINDS.items():
        worst, worst_x, count = 0.0, None, 0
        for sign in (0, 1):
            for c0 in range(lo_bits, hi_bits, stride * (1 << 22)):
                bits = torch.arange(c0, min(c0 + stride * (1 << 22), hi_bits), stride, dtype=torch.int32, device="cuda")
                x = bits.view(torch.float32)
                x = -x if sign else x
                y = torch.empty_like(x)
                kern[(triton_cdiv(x.numel(), 1024),)](x, y, x.numel(), KIND=kind, BLOCK=1024)
                x64 = x.double()
                ye = _exact_act(x64, name)
                ratio = (y.double() - ye).abs() / (2.0 ** -23 * (x64.abs() + ye.abs()))
                ratio = torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, float("inf")))
                m, i = ratio.max(0)
                count += x.numel()
                if float(m) > worst:
                    worst, worst_x = float(m), float(x[i])
        out[f"{name}: {impl}"] = {"activation": name, "impl": impl, "max_err_over_u32_x_plus_y": worst,
                                  "at_x": worst_x, "inputs": count, "range": "|x| in [2^-32, 128), both signs"}
    out["ok"] = all(math.isfinite(v["max_err_over_u32_x_plus_y"]) for k, v in out.items() if isinstance(v, dict))
    return out


def triton_cdiv(a, b):
    return -(-a // b)


# -- envelope ----------------------------------------------------------------------------------

def _inputs(kind, M, N, K, t: OpType, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g, dtype=torch.float64)
    b = torch.randn(K, N, generator=g, dtype=torch.float64)
    if kind == "positive":
        a, b = a.abs(), b.abs()
    if kind == "outlier":
        a[:, torch.randperm(K, generator=g)[:max(1, K // 256)]] *= 1000.0 if t.name != "e4m3" else 8.0
    if t.name == "e4m3":
        a, b = a * 4, b * 4
    return E.to_dtype(a, "fp32").to(torch.float32).to(t.torch).double(), \
        E.to_dtype(b, "fp32").to(torch.float32).to(t.torch).double()


def block_stats(a: torch.Tensor, b: torch.Tensor, bk: int = 64) -> dict:
    """Per element: S, L = sum_j m_j, V = sum_j m_j^2, R = max_j |X_j| with m_j = |X_(j-1)| + s_j."""
    K = a.shape[1]
    X = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    S = torch.zeros_like(X)
    L, V, R = torch.zeros_like(X), torch.zeros_like(X), torch.zeros_like(X)
    for k0 in range(0, K, bk):
        s = a[:, k0:k0 + bk].abs() @ b[k0:k0 + bk].abs()
        m = X.abs() + s
        L += m
        V += m * m
        X = X + a[:, k0:k0 + bk] @ b[k0:k0 + bk]
        S += s
        R = torch.maximum(R, X.abs())
    return {"X": X, "S": S, "L": L, "V": V, "R": R}


def measure_envelope(ads: dict, quick: bool = False) -> dict:
    rows = []
    ks = (256, 4096) if quick else (256, 4096, 16384, 65536)
    for name, ad in ads.items():
        t = OPTYPES[ad.optype]
        for K in ks:
            M = N = 64 if K >= 16384 else 128
            for kind in ("normal", "positive", "outlier"):
                try:
                    A, B = _inputs(kind, M, N, K, t, seed=K + len(kind))
                    out = ad.run(A, B)
                except Exception as e:
                    rows.append({"engine": name, "K": K, "kind": kind, "unavailable": str(e)[:200]})
                    break
                st = block_stats(A.cuda(), B.cuda()) if torch.cuda.is_available() else block_stats(A, B)
                st = {k: v.cpu() for k, v in st.items()}
                err = (out - st["X"]).abs()
                if ad.out != "fp32":
                    err = (err - 0.5 * _ulp(st["X"], ad.out)).clamp(min=0)
                rows.append({"engine": name, "K": K, "kind": kind, "shape": [M, N, K],
                             "max_err_over_S": float((err / st["S"]).max()),
                             "max_err_over_L": float((err / st["L"]).max()),
                             "max_err_over_sqrtV": float((err / st["V"].sqrt()).max()),
                             "max_err_over_R": float((err / st["R"].clamp(min=1e-300)).max())})
    return {"rows": rows}


def _ulp(x, name):
    bits = {"bf16": 7, "fp16": 10, "fp32": 23}[name]
    return E.lead_pow2(x.abs()) * 2.0 ** -bits


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------


def environment() -> dict:
    """The run's versions and device (harness.dump.environment), the date, the GPU's capability,
    SM count and cuBLAS version."""
    from harness.dump import environment as versions

    env = dict(versions(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count, cublas=_cublas_version())
    return env


def _cublas_version():
    try:
        return str(torch.backends.cuda.preferred_blas_library())
    except Exception:
        return None


def summary(res: dict) -> dict:
    """The constants the tolerance models read (oracle.tolerance.HW measure_key names), loosest
    over the engines of each kind; None where nothing was measured. fp8 constants come from the
    engines with a narrow accumulator (acc_bits < 23): max_num_imprecise_acc = 0 fits fp32-wide
    datapaths and is judged with acc_model any."""
    eng = res.get("engines", {})

    def fits(pred):
        return [eng[n]["fit"] for n in eng if eng[n].get("fit") and pred(eng[n])]

    def loosest(fs, key, fn):
        vals = [f[key] for f in fs if f.get(key) is not None]
        return fn(vals) if vals else None

    def truncates(fs):
        if not fs:
            return None
        return int(any("trunc" in f["align_round"] or "trunc" in f["acc_round"] for f in fs))

    tc16 = fits(lambda r: r["optype"] in ("bf16", "fp16"))
    tf32 = fits(lambda r: r["optype"] == "tf32") + [_summarise(eng[n]["step"]["consistent"]) for n in eng
                                                     if eng[n].get("optype") == "tf32" and not eng[n].get("fit")
                                                     and eng[n].get("step", {}).get("consistent")]
    fp8 = fits(lambda r: r["optype"] == "e4m3" and r["fit"]["acc_bits_min"] < 23)
    out = {
        "tc16_mma_k": loosest(tc16, "mma_k_min", min),
        "tc16_align_bits": loosest(tc16, "align_bits_min", min),
        "tc16_truncates": truncates(tc16),
        "tf32_mma_k": loosest(tf32, "mma_k_min", min),
        "tf32_align_bits": loosest(tf32, "align_bits_min", min),
        "tf32_truncates": truncates(tf32),
        "fp8_mma_k": loosest(fp8, "mma_k_min", min),
        "fp8_align_bits": loosest(fp8, "align_bits_min", min),
        "fp8_acc_bits": loosest(fp8, "acc_bits_min", min),
        "fp8_truncates": truncates(fp8),
        "fp8_promotion": {n: eng[n]["fit"].get("promotion") for n in eng
                          if eng[n].get("optype") == "e4m3" and eng[n].get("fit")},
    }
    # the largest value no engine's data contradicts: a recorded constant above it is unsound; one
    # between the *_min above and it is one the data here cannot tell apart from a looser one
    for fam, fs in (("tc16", tc16), ("tf32", tf32), ("fp8", fp8)):
        for param in ("mma_k", "align_bits"):
            out[f"{fam}_{param}_consistent_max"] = loosest(fs, f"{param}_max", min)

    def operand_trunc(names):
        ops = [c for n in names for c in eng[n].get("operand", {}).get("consistent", [])]
        return int(any(o["operand_round"] == "trunc" for o in ops)) if ops else None

    tf32_names = [n for n in eng if eng[n].get("optype") == "tf32"]
    out["tf32_operand"] = {n: eng[n].get("operand", {}).get("consistent") for n in tf32_names}
    out["tf32_operand_trunc"] = operand_trunc(tf32_names)
    out["cublas_tf32_operand_trunc"] = operand_trunc([n for n in tf32_names if n.startswith("cublas")])
    sk = res.get("splitk", {})
    out["splitk"] = {d: [{"shape": r["shape"], "partials": r["partials"], "chunk": r.get("chunk"),
                          "boundaries": r["boundaries"][:8], "partial_sum": r.get("partial_sum")}
                         for r in v.get("shapes", []) if r.get("boundaries")] for d, v in sk.items()}
    chunks = [b for v in sk.values() for r in v.get("shapes", []) for b in
              ([r["boundaries"][0]] + [y - x for x, y in zip(r["boundaries"], r["boundaries"][1:])]
               if r.get("boundaries") else [])]
    out["splitk_chunk_min"] = min(chunks) if chunks else None
    acts = {k: v for k, v in res.get("activations", {}).items() if isinstance(v, dict)}
    for kind in ("gelu_tanh", "silu"):
        vals = [v["max_err_over_u32_x_plus_y"] for v in acts.values() if v["activation"] == kind]
        out[f"act_{kind}_fast"] = max(vals) if vals else None
    out["int8_exact"] = res.get("int8", {}).get("ok")
    return out


def resummarise(res: dict) -> dict:
    """The summary of a stored result, recomputed from its raw fits (the consistent datapaths of
    each engine) with this version's rules, whatever version wrote it."""
    res = dict(res, engines={n: dict(r, fit=_summarise(r["ladder"]["consistent"]) if r.get("ladder") else {})
                             for n, r in res.get("engines", {}).items()})
    return summary(res)


def measure(names=None, quick: bool = False, emulate: bool = False, families=("engines", "splitk", "int8", "act",
                                                                                "envelope")) -> dict:
    dev = torch.device("cuda" if torch.cuda.is_available() and not emulate else "cpu")
    ads = emulated_adapters() if emulate else gpu_adapters()
    if names:
        unknown = sorted(set(names) - set(ads))
        if unknown:
            raise SystemExit(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(ads)}")
        ads = {n: ads[n] for n in names}
    res: dict = {"schema": SCHEMA, "environment": environment(), "quick": quick, "emulated": emulate, "engines": {}}
    t0 = time.time()
    if "engines" in families:
        for n, ad in ads.items():
            res["engines"][n] = measure_engine(ad, dev, quick)
            _progress(res["engines"][n])
    if not emulate:
        shapes = QUICK_SPLITK if quick else SPLITK_SHAPES
        env_ads = {n: a for n, a in ads.items() if n in ("cublas_bf16_out", "triton_bf16", "lt_e4m3_fast", "lt_e4m3",
                                                         "triton_e4m3", "cublas_tf32")}
        steps = (("splitk", "splitk", lambda: {d: measure_splitk(d, shapes, quick) for d in ("bf16", "fp16")}),
                 ("int8", "int8", measure_int8), ("act", "activations", lambda: measure_activations(quick)),
                 ("envelope", "envelope", lambda: measure_envelope(env_ads, quick)))
        for fam, key, fn in steps:
            if fam not in families:
                continue
            t1 = time.time()
            try:
                res[key] = fn()
            except Exception as e:  # one family's failure must not lose the others' measurements
                import traceback

                res.setdefault("family_errors", {})[fam] = traceback.format_exc()[-2000:]
                print(f"  {fam}: FAILED {type(e).__name__}: {e}", flush=True)
            print(f"  {fam} done ({time.time() - t1:.1f} s)", flush=True)
    res["summary"] = summary(res)
    res["failures"] = failures(res)
    res["seconds"] = round(time.time() - t0, 1)
    return res


def failures(res: dict) -> list[str]:
    out = []
    for n, r in res.get("engines", {}).items():
        if r.get("ok") is False:
            fams = [f for f in ("operand", "step", "ladder") if f in r and not r[f]["consistent"]]
            out.append(f"{n}: no candidate datapath reproduces the {', '.join(fams)} probes")
    for d, sk in res.get("splitk", {}).items():
        for row in sk.get("shapes", []):
            if not row["explained"]:
                out.append(f"splitk {d} {row['shape']}: reduced-precision output differs ({row['outlier_differs']} "
                           f"elements) but no partial boundary was found")
            if "unexpected" in row:
                out.append(f"splitk {d} {row['shape']}: boundary probes gave values other than 0 or 1")
    if res.get("int8", {}).get("ok") is False:
        out.append("int8: torch._int_mm differs from the exact integer sum")
    for fam, tb in res.get("family_errors", {}).items():
        out.append(f"{fam}: the measurement itself failed: {tb.strip().splitlines()[-1]}")
    return out


def _progress(r: dict) -> None:
    if r.get("ok") is None:
        print(f"  {r['engine']:<22} unavailable: {r.get('unavailable', '')[:100]}", flush=True)
        return
    f = r.get("fit") or {}
    print(f"  {r['engine']:<22} {'ok ' if r['ok'] else 'FAIL'} align_bits>={f.get('align_bits_min')} "
          f"acc_bits>={f.get('acc_bits_min')} round={f.get('align_round')}/{f.get('acc_round')} "
          f"fused={f.get('fused')} mma_k={f.get('mma_k_min')}..{f.get('mma_k_max')} promotion={f.get('promotion')} "
          f"({f.get('candidates', 0)} fits, {r['seconds']} s)", flush=True)


def print_report(res: dict) -> None:
    s = res["summary"]
    print("\nsummary")
    for k, v in s.items():
        print(f"  {k:<24} {v}")
    for d, sk in res.get("splitk", {}).items():
        for row in sk["shapes"]:
            print(f"  splitk {d} {row['shape']}: outlier diffs {row['outlier_differs']}, partials {row['partials']}, "
                  f"chunk {row.get('chunk')}, rounding {row.get('partial_rounding')}, sum {row.get('partial_sum')}")
    for row in res.get("envelope", {}).get("rows", []):
        if "unavailable" not in row:
            print(f"  envelope {row['engine']:<18} K={row['K']:<6} {row['kind']:<8} err/S {row['max_err_over_S']:.3g} "
                  f"err/sqrtV {row['max_err_over_sqrtV']:.3g}")
    for f in res["failures"]:
        print(f"FAILED: {f}")
    for n, r in res.get("engines", {}).items():
        for fam in ("operand", "step", "ladder"):
            if r.get(fam) and not r[fam]["consistent"]:
                for near in r[fam]["nearest"][:2]:
                    print(f"  seen ({n}, {fam}): nearest candidate {near['candidate']} misses {near['mismatches']} of "
                          f"{near['of']}: {near.get('examples', [])[:2]}")


def constants_snippet(res: dict) -> str:
    """The entries of oracle.tolerance.HW that this run measured, as lines to paste there."""
    from oracle import tolerance as T

    env = res.get("environment", {})
    where = f"{env.get('gpu', '?')}, {env.get('date', '?')[:10]}, benchmarks/measure_numerics.py"
    lines = []
    for key, c in T.HW.items():
        if not c.measure_key:
            continue
        v = res.get("summary", {}).get(c.measure_key)
        if v is None:
            lines.append(f"    # {key}: not measured by this run (summary.{c.measure_key} is empty)")
            continue
        lines.append(f'    "{key}": Constant({v!r}, "measured on {where}: summary.{c.measure_key}", '
                     f'"{c.measure_key}", "{c.sound}"),')
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--quick", action="store_true", help="fewer probes and candidates (a GPU test's slice)")
    p.add_argument("--emulate", action="store_true", help="run the fits on emulated engines on the CPU")
    p.add_argument("--engines", default="", help="comma-separated engine names (default: all)")
    p.add_argument("--families", default="engines,splitk,int8,act,envelope")
    args = p.parse_args(argv)
    if not args.emulate and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU, or pass --emulate for the CPU dry run", file=sys.stderr)
        return 2
    names = [n for n in args.engines.split(",") if n] or None
    res = measure(names, args.quick, args.emulate, tuple(args.families.split(",")))
    res["constants_snippet"] = constants_snippet(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print_report(res)
    print("\noracle/tolerance.py HW entries measured here:\n" + res["constants_snippet"])
    print(f"wrote {args.out} ({res['seconds']} s)")
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

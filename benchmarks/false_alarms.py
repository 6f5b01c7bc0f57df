"""False alarms and planted defects: correct GEMMs from real engines, judged output-only.

First build the zoo's traced cubins here (nvcc, no GPU needed) into an ignored folder:
    ORACLE_CACHE_DIR=$PWD/.carry/cache python benchmarks/false_alarms.py --prebuild-zoo
then on the H200 (one GPU; budgeted to about 5 minutes: no new case after 240 s, then up to 60 s
of zoo cases; --shard 0/2 and 1/2 in two calls, --zoo on one, then --merge, if the budget leaves
cases out),
carrying .carry/cache:
    ORACLE_CACHE_DIR=$PWD/.carry/cache python benchmarks/false_alarms.py --zoo \
        --out $OUT/false_alarms_h200.json > $OUT/false_alarms_h200.log 2>&1
(a cache miss builds there: about 80 s for the Hopper kernel). The slice the GPU test runs
(tests/gpu/test_false_alarms_gpu.py, under a minute, nothing to carry):
    python benchmarks/false_alarms.py --quick --out $OUT/false_alarms_quick.json
Other options: --numerics (the measurement's JSON, default benchmarks/results/numerics_h200.json:
promotion intervals), --w4-probe (benchmarks/probe_w4a16.py's JSON, default
benchmarks/results/w4a16_probe_h200.json where it exists: tinygemm's dequant_precision), --engines, --budget-s (default 240: no new case after that; the zoo then
gets up to 60 s more), --no-planted, --shard i/n, --skip (the cases an earlier run judged) and --merge.

Every case is one correct GEMM computed by an engine (cuBLAS torch.mm / addmm /
_addmm_activation, cuBLASLt torch._scaled_mm fast and not, per-tensor and row/col scales, and
block-scaled e4m3 with both operands' scales 1x128 or both 128x128 (a layout torch refuses is
counted as skipped, with torch's message, never judged), torch's tinygemm W4A16
torch._weight_int4pack_mm (uint4 B, groups of 32, 64 and 128), torch._int_mm, the project's Triton GEMM kernels_ref.gemm_fast, and with --zoo the zoo's correct
kernels, Hopper WGMMA bf16 and e4m3 and the sm80 mma.sync kernel, through oracle.run.live.run_live),
on normal, all-positive or outlier-channel inputs, over M from 1 to 4096, ragged N and K, K up to
65536 and both majors. Cases run in a seeded shuffled order, so a budget cut leaves a uniform
sample. Each is wrapped as an output-only recording (oracle.run.recording.Recording, no taps) and
judged by oracle.judging.differential.analyze (the references cross-checked against the host specs on
one tile for the first case of each engine and K range, unless ORACLE_CROSS_CHECK_TILES is set)
with the spec that says what the engine does, from the measurement
(benchmarks/results/numerics_h200.json):
  cuBLAS bf16 / fp16 with torch's default (reduced-precision reductions allowed): the shape is
    probed first with the case's majors (benchmarks/measure_numerics.py split-K pairs); partials
    found rounded to bf16 / fp16 give reduction = that type with the chunk seen, uneven ones
    acc_model any, none reduction = "fp32";
  cuBLAS / cuBLASLt otherwise: reduction fp32 (it may split K into fp32 partials); TF32 on:
    acc_model tf32_rn (cuBLAS rounds the operands to nearest) with k-blocks of 32 (its recorded
    ladder outputs fit partials restarted every 96 k, which then fall on k-block boundaries);
  cuBLASLt fp8 fast: fp8_fast; not fast: fp8_promoted with the interval measured for it (any
    where none was); int8: int32; Triton fp8: fp8_fast, or fp8_promoted every BLOCK_K (128);
    GELU through cuBLASLt: gelu_tanh, activation_impl "fast"; tinygemm: uint4 B with float_offset
    zero points (w = (q - 8) * s + z), dequant_precision as benchmarks/numerics/probe_w4a16.py chose
    it (engines.tinygemm_w4.dequant_precision of the numerics JSON), else "operand", reduction fp32;
    the zoo: its case file's spec.
A correct case that is not MATCH is a false alarm. Then, in the same run, five defects are
planted in the engine's output, one at a time, in one seeded tile, a full BM x BN one where the
output has one (a zeroed tile, the tile times 1.01, one sign flip at the tile's largest element,
one missing 64-deep k-block in the tile, one NaN) and each is judged against the same reference
and bound (oracle.judging.differential.expected_output, what epilogue_store's chained comparison uses):
detected means its tile fails, right tile means it is the only tile that fails.

Writes JSON with correct_cases, false_diverged, skipped, planted, detected_right_tile, worst_ratio (the
largest err/bound of a correct case) and worst_case, the environment and per-group tables
(`groups` by engine, output dtype, K and inputs; `planted_table` by defect, K and inputs); prints
them. Exit 0 when false_diverged is 0, 1 otherwise, 2 on bad usage.

One job: the false-alarm benchmark, from its cases to its JSON. Its sections (the engines and
the cases, the spec each engine gets, judging and planting, the zoo's live cases, the tables and
the driver) are the steps of that one run; only its tests import them, and the measurement it
reads (split-K probes, promotion intervals) stays in benchmarks/measure_numerics.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

from oracle.judging.compare import compare  # noqa: E402
from oracle.judging.differential import analyze, expected_output  # noqa: E402
from oracle.judging.diagnose import Verdict  # noqa: E402
from oracle.run.inputs import Operands, Provenance  # noqa: E402
from oracle.problem.spec import ProblemSpec, Scale, Tile  # noqa: E402
from oracle.run.recording import Recording  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "false_alarms_h200.json")
DEFAULT_NUMERICS = os.path.join(ROOT, "benchmarks", "results", "numerics_h200.json")
DEFAULT_W4_PROBE = os.path.join(ROOT, "benchmarks", "results", "w4a16_probe_h200.json")
DEFECTS = ("zeroed tile", "tile x 1.01", "one sign flip", "missing k-block", "one NaN")
KINDS = ("normal", "positive", "outlier")
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn,
         "int8": torch.int8, "int32": torch.int32}
DEV = "cuda"


@dataclass(frozen=True)
class Case:
    engine: str
    a_dtype: str
    out: str
    m: int
    n: int
    k: int
    a_major: str
    b_major: str
    kind: str
    seed: int

    def label(self) -> str:
        return (f"{self.engine} {self.a_dtype}->{self.out} {self.m}x{self.n}x{self.k} "
                f"{self.a_major[0]}{self.b_major[0]} {self.kind}")


# ----------------------------------------------------------------------------------------------
# engines: name -> (operand dtype, output dtype, constraints, run)
# ----------------------------------------------------------------------------------------------


def _store(x: torch.Tensor, major: str) -> torch.Tensor:
    return x.contiguous() if major == "row" else x.t().contiguous().t()


class _Flags:
    def __init__(self, reduced: Optional[bool] = None, tf32: Optional[bool] = None):
        self.reduced, self.tf32 = reduced, tf32

    def __enter__(self):
        m = torch.backends.cuda.matmul
        self.saved = {}
        if self.reduced is not None:
            for k in ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"):
                self.saved[k] = getattr(m, k)
                setattr(m, k, self.reduced)
        if self.tf32 is not None:
            k = "fp32_precision" if hasattr(m, "fp32_precision") else "allow_tf32"
            self.saved[k] = getattr(m, k)
            setattr(m, k, ("tf32" if self.tf32 else "ieee") if k == "fp32_precision" else self.tf32)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(torch.backends.cuda.matmul, k, v)


def _mm(reduced, tf32=None):
    def run(c, ops):
        with _Flags(reduced, tf32):
            return torch.mm(_store(ops.a, c.a_major), _store(ops.b, c.b_major))
    return run


def _addmm(c, ops):
    with _Flags(reduced=False):
        return torch.addmm(ops.bias, _store(ops.a, c.a_major), _store(ops.b, c.b_major))


def _addmm_act(gelu):
    def run(c, ops):
        with _Flags(reduced=False):
            return torch._addmm_activation(ops.bias, _store(ops.a, c.a_major), _store(ops.b, c.b_major),
                                           use_gelu=gelu)
    return run


def _scaled(fast, rowwise):
    def run(c, ops):
        a = ops.a.contiguous()
        b = ops.b.t().contiguous().t()
        if rowwise:
            return torch._scaled_mm(a, b, ops.scale_a[:, None].contiguous(), ops.scale_b[None, :].contiguous(),
                                    out_dtype=TORCH[c.out], use_fast_accum=fast)
        return torch._scaled_mm(a, b, ops.scale_a.reshape(()), ops.scale_b.reshape(()), out_dtype=TORCH[c.out],
                                use_fast_accum=fast)
    return run


class EngineSkipped(Exception):
    """The engine refused the case's layout (torch's message): reported as skipped, never as a result."""


# block-scaled fp8 (torch._scaled_mm, scales by ScalingType from their shapes and strides): the
# operands hold the logical [rows / block, K / 128] grids (oracle.run.inputs.Operands); torch reads
# BlockWise1x128 scales of A [M, K / 128] with stride (1, M) and of B as b.t()'s [N, K / 128] with
# stride (1, N), i.e. scale_b [K / 128, N] row-major; BlockWise128x128 scales of A [M / 128, K / 128]
# row-major and of B as b.t()'s [N / 128, K / 128] row-major, i.e. scale_b its transpose.
def _scaled_block(block_rows):
    def run(c, ops):
        a = ops.a.contiguous()
        b = ops.b.t().contiguous().t()
        if block_rows == 1:
            sa, sb = ops.scale_a.t().contiguous().t(), ops.scale_b.t().contiguous()
        else:
            sa, sb = ops.scale_a.contiguous(), ops.scale_b.contiguous().t()
        try:
            return torch._scaled_mm(a, b, sa, sb, out_dtype=TORCH[c.out])
        except (RuntimeError, ValueError, NotImplementedError) as e:
            raise EngineSkipped(f"torch._scaled_mm refused {block_rows}x128 block scales "
                                f"(scale_a {list(sa.shape)} stride {sa.stride()}, scale_b {list(sb.shape)} "
                                f"stride {sb.stride()}): {e}") from None
    return run


# torch's tinygemm W4A16 (bf16 A, uint4 B with bf16 group scales and offsets, w = (q - 8) * s + z):
# its packer reads B as [N, K / 2] bytes, the even k in the high nibble (the oracle's [K / 2, N]
# k_pairs_high_first, transposed), into tiles of 8 columns by 8 inner 16-deep k-tiles (K a multiple
# of 128); the scales and offsets as one [K / group, N, 2] bf16 tensor, scale first.
W4_INNER_K_TILES = 8


def _tinygemm(group):
    def run(c, ops):
        packed = torch._convert_weight_to_int4pack(ops.b.t().contiguous(), W4_INNER_K_TILES)
        scales_and_zeros = torch.stack([ops.b_scales, ops.b_zeros], dim=2).contiguous()
        return torch._weight_int4pack_mm(ops.a.contiguous(), packed, group, scales_and_zeros)
    return run


def _int_mm(c, ops):
    return torch._int_mm(ops.a.contiguous(), ops.b.t().contiguous().t())


def _triton(fp8_acc=None):
    def run(c, ops):
        from kernels_ref.gemm_fast import gemm_fast

        kw = {}
        if ops.scale_a is not None:
            kw = dict(scale_a=ops.scale_a.reshape(1).contiguous(), scale_b=ops.scale_b.reshape(1).contiguous())
        if fp8_acc:
            kw["fp8_acc"] = fp8_acc
        return gemm_fast(ops.a.contiguous(), ops.b.t().contiguous(), out_dtype=TORCH[c.out], **kw)
    return run


@dataclass(frozen=True)
class Engine:
    name: str
    a_dtype: str
    out: str
    run: object
    majors: tuple = (("row", "col"), ("row", "row"), ("col", "col"), ("col", "row"))
    kmult: int = 1
    nmult: int = 1
    mmin: int = 1
    note: str = ""
    mmult: int = 1


ENGINES = [
    Engine("cublas_bf16", "bf16", "bf16", _mm(None), note="torch.mm, torch's default reductions"),
    Engine("cublas_bf16_fp32red", "bf16", "bf16", _mm(False), note="torch.mm, reduced-precision reductions off"),
    Engine("cublas_fp16", "fp16", "fp16", _mm(None), note="torch.mm fp16, torch's default reductions"),
    Engine("cublas_tf32", "fp32", "fp32", _mm(None, True), note="torch.mm fp32, TF32 on"),
    Engine("cublas_fp32", "fp32", "fp32", _mm(None, False), note="torch.mm fp32, TF32 off"),
    Engine("cublas_addmm", "bf16", "bf16", _addmm, note="torch.addmm with a bias row"),
    Engine("cublaslt_relu", "bf16", "bf16", _addmm_act(False), note="torch._addmm_activation relu"),
    Engine("cublaslt_gelu", "bf16", "bf16", _addmm_act(True), note="torch._addmm_activation gelu"),
    Engine("lt_e4m3_fast", "e4m3", "bf16", _scaled(True, False), (("row", "col"),), 16, 16,
           note="_scaled_mm per-tensor, fast accumulation"),
    Engine("lt_e4m3", "e4m3", "bf16", _scaled(False, False), (("row", "col"),), 16, 16, note="_scaled_mm per-tensor"),
    Engine("lt_e4m3_fp32out", "e4m3", "fp32", _scaled(False, False), (("row", "col"),), 16, 16,
           note="_scaled_mm per-tensor, fp32 out"),
    Engine("lt_e4m3_fast_rowwise", "e4m3", "bf16", _scaled(True, True), (("row", "col"),), 16, 16,
           note="_scaled_mm row/col scales, fast accumulation"),
    Engine("lt_e4m3_rowwise", "e4m3", "bf16", _scaled(False, True), (("row", "col"),), 16, 16,
           note="_scaled_mm row/col scales"),
    Engine("int8", "int8", "int32", _int_mm, (("row", "col"),), 8, 8, 17, note="torch._int_mm"),
    Engine("triton_bf16", "bf16", "bf16", _triton(), (("row", "col"),), 8, 8, note="kernels_ref.gemm_fast"),
    Engine("triton_e4m3_fast", "e4m3", "bf16", _triton("fast"), (("row", "col"),), 16, 16,
           note="kernels_ref.gemm_fast fp8, fast"),
    Engine("triton_e4m3_promoted", "e4m3", "bf16", _triton("promoted"), (("row", "col"),), 16, 16,
           note="kernels_ref.gemm_fast fp8, promoted every BLOCK_K"),
    # K whole 128-deep scale blocks (a multiple of 512 for 128x128: ceil(K / 128) then needs no padding
    # to 4, which some torch versions ask of that scale's rows); M a multiple of 4 (the 1x128 scale's
    # leading dimension 16-byte aligned), of 128 with 128-row blocks; N a multiple of 128 there too
    Engine("lt_e4m3_block1x128", "e4m3", "bf16", _scaled_block(1), (("row", "col"),), 128, 16,
           note="_scaled_mm BlockWise1x128 x BlockWise1x128", mmult=4),
    Engine("lt_e4m3_block128x128", "e4m3", "bf16", _scaled_block(128), (("row", "col"),), 512, 128,
           note="_scaled_mm BlockWise128x128 x BlockWise128x128", mmult=128),
    *(Engine(f"tinygemm_w4_g{g}", "bf16", "bf16", _tinygemm(g), (("row", "col"),), 16 * W4_INNER_K_TILES, 8,
             note=f"torch._weight_int4pack_mm, uint4 B, group {g}") for g in (32, 64, 128)),
]
ENGINE = {e.name: e for e in ENGINES}
W4_GROUP = {"tinygemm_w4_g32": 32, "tinygemm_w4_g64": 64, "tinygemm_w4_g128": 128}  # k per scale group
BLOCK_ROWS = {"lt_e4m3_block1x128": 1, "lt_e4m3_block128x128": 128}  # rows (of A's M, B's N) per block scale

SHAPES = [(1, 136, 520), (7, 392, 1000), (64, 8, 4096), (128, 128, 64), (257, 1000, 520), (16, 4096, 16384),
          (4096, 8, 1024), (1024, 392, 4096), (64, 64, 65536), (128, 136, 65536), (1, 1000, 65536),
          (4096, 4096, 512)]
QUICK_SHAPES = [(7, 392, 1000), (128, 128, 64), (64, 64, 65536), (257, 1000, 520)]


def _round_up(x, m):
    return -(-x // m) * m


def make_cases(quick: bool = False, engines=None) -> list[Case]:
    shapes = QUICK_SHAPES if quick else SHAPES
    out = []
    seed = 0
    for e in ENGINES:  # seeds count over every engine: a case is the same case whichever engines run
        for si, (m, n, k) in enumerate(shapes):
            n2, k2, m2 = _round_up(n, e.nmult), _round_up(k, e.kmult), max(_round_up(m, e.mmult), e.mmin)
            kinds = KINDS if not quick else KINDS[si % 3:si % 3 + 1]
            for ki, kind in enumerate(kinds):
                am, bm = e.majors[(si + ki) % len(e.majors)]
                seed += 1
                if not engines or e.name in engines:
                    out.append(Case(e.name, e.a_dtype, e.out, m2, n2, k2, am, bm, kind, seed))
    random.Random(0).shuffle(out)  # a budget cut leaves a uniform sample, not whole engines out
    return out


# ----------------------------------------------------------------------------------------------
# operands and the spec that says what the engine does
# ----------------------------------------------------------------------------------------------


def _w4_operands(c: Case, a: torch.Tensor, g: torch.Generator) -> Operands:
    """A bf16 and a uint4 B quantised from a float W per group and column as tinygemm's users do:
    s = (max - min) / 15, z = min + 8 s (both bf16), q = round((w - min) / s) in 0..15."""
    from kernels_ref import dequant as dq

    group = W4_GROUP[c.engine]
    w = torch.randn(c.k, c.n, generator=g, device=DEV)
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
    g = torch.Generator(device=DEV).manual_seed(c.seed)
    if c.a_dtype == "int8":
        a = torch.randint(-128, 128, (c.m, c.k), generator=g, device=DEV, dtype=torch.int32)
        b = torch.randint(-128, 128, (c.k, c.n), generator=g, device=DEV, dtype=torch.int32)
        if c.kind == "positive":
            a, b = a.abs().clamp(max=127), b.abs().clamp(max=127)
        return Operands(a.to(torch.int8), b.to(torch.int8))
    a = torch.randn(c.m, c.k, generator=g, device=DEV)
    b = torch.randn(c.k, c.n, generator=g, device=DEV)
    if c.kind == "positive":
        a, b = a.abs(), b.abs()
    elif c.kind == "outlier":
        cols = torch.randperm(c.k, generator=g, device=DEV)[:max(1, c.k // 256)]
        a[:, cols] *= {"e4m3": 8.0, "fp16": 100.0}.get(c.a_dtype, 1000.0)
    if c.engine in W4_GROUP:
        return _w4_operands(c, a, g)
    if c.a_dtype == "e4m3":
        a, b = a * 4, b * 4
    t = TORCH[c.a_dtype]
    ops = dict(a=a.to(t), b=b.to(t))
    e = ENGINE.get(c.engine)
    if c.engine in ("cublas_addmm", "cublaslt_relu", "cublaslt_gelu"):
        ops["bias"] = torch.randn(c.n, generator=g, device=DEV).to(torch.bfloat16)
    if c.a_dtype == "e4m3":
        rows = BLOCK_ROWS.get(c.engine)
        if rows is not None:  # one scale per block, spread over 2^-2 .. 2^2 so a wrong block's shows
            ga, gb = -(-c.m // rows), -(-c.n // rows)
            for name, r in (("scale_a", ga), ("scale_b", gb)):
                u = torch.rand(r, c.k // 128, generator=g, device=DEV) + 0.5
                ops[name] = u * torch.exp2(torch.randint(-2, 3, (r, c.k // 128), generator=g, device=DEV).float())
        elif e is not None and e.name.endswith("rowwise"):
            ops["scale_a"] = (torch.rand(c.m, generator=g, device=DEV) + 0.5)
            ops["scale_b"] = (torch.rand(c.n, generator=g, device=DEV) + 0.5)
        else:
            ops["scale_a"] = torch.rand(1, generator=g, device=DEV) + 0.5
            ops["scale_b"] = torch.rand(1, generator=g, device=DEV) + 0.5
    return Operands(**ops)


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
        why += (f"; dequant (q - 8) * s + z {'in fp32 then one rounding (measured)' if prec == 'fp32' else 'in bf16 arithmetic in any order (the bound: no measurement chose fp32)'}")
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
        r = BLOCK_ROWS[e]
        major = "col" if r == 1 else "row"  # how torch reads them (_scaled_block); the values do not depend on it
        kw.update(scale_a=Scale("block", (r, 128), major), scale_b=Scale("block", (r, 128), major))
    elif c.a_dtype == "e4m3":
        rowwise = e.endswith("rowwise")
        kw.update(scale_a=Scale("row" if rowwise else "tensor"), scale_b=Scale("col" if rowwise else "tensor"))
    return ProblemSpec(**kw), why


# ----------------------------------------------------------------------------------------------
# judging: correct output, then the planted defects
# ----------------------------------------------------------------------------------------------


def _tile_slices(spec, tile):
    tm, tn = tile
    return slice(tm * spec.tile.bm, (tm + 1) * spec.tile.bm), slice(tn * spec.tile.bn, (tn + 1) * spec.tile.bn)


def _cast_like(x64: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dtype == torch.int32:
        return torch.round(x64).clamp(-2 ** 31, 2 ** 31 - 1).to(torch.int32)
    return x64.to(torch.float32).to(like.dtype)


def plant(defect: str, out: torch.Tensor, y: torch.Tensor, spec, ops: Operands, tile, rng) -> Optional[torch.Tensor]:
    """The output with one defect in `tile`; None where the defect does not apply."""
    rs, cs = _tile_slices(spec, tile)
    bad = out.clone()
    sub = bad[rs, cs]
    if defect == "zeroed tile":
        sub.zero_()
    elif defect == "tile x 1.01":
        sub.copy_(_cast_like(sub.double() * 1.01, sub))
    elif defect == "one sign flip":
        e = y[rs, cs].double().abs()
        i = int(torch.argmax(e))
        r, cc = divmod(i, e.shape[1])
        sub[r, cc] = -sub[r, cc]
    elif defect == "missing k-block":
        if spec.activation != "none" or spec.k < 128:
            return None
        kb = int(rng.integers(0, spec.k // 64))
        k0 = kb * 64
        if spec.quantised_b:  # the reference's dequantised B of the k-block
            from kernels_ref import dequant as dq

            per = 2 if spec.dequant_config.packed else 1
            b = dq.dequant_host(ops.b[k0 // per:(k0 + 64) // per, cs], ops.b_scales, ops.b_zeros,
                                spec.dequant_config, k0=k0, n0=cs.start).to(out.device)
        else:
            b = ops.b[k0:k0 + 64, cs]
        part = ops.a[rs, k0:k0 + 64].double() @ b.double()
        if spec.scale_a.kind == "tensor":
            part = part * float(ops.scale_a.double().prod() * ops.scale_b.double().prod())
        elif spec.scale_a.kind == "row":
            part = part * ops.scale_a[rs].double()[:, None] * ops.scale_b[cs].double()[None, :]
        elif spec.scale_a.kind == "block":
            kg = k0 // spec.scale_a.block[1]
            rows = torch.arange(spec.m, device=part.device)[rs] // spec.scale_a.block[0]
            cols = torch.arange(spec.n, device=part.device)[cs] // spec.scale_b.block[0]
            part = part * ops.scale_a[rows, kg].double()[:, None] * ops.scale_b[cols, kg].double()[None, :]
        sub.copy_(_cast_like(sub.double() - part, sub))
    elif defect == "one NaN":
        if not out.is_floating_point():
            return None
        r = int(rng.integers(0, sub.shape[0]))
        cc = int(rng.integers(0, sub.shape[1]))
        sub[r, cc] = float("nan")
    return bad


def _planted_tile(spec, rng) -> tuple[int, int]:
    """A seeded tile among the largest ones: full BM x BN where the output has such tiles (a
    ragged edge tile of a few elements shows a 1 % error only by chance)."""
    def full(extent, block, count):
        size = min(extent, block)
        return [i for i in range(count) if min(block, extent - i * block) == size]
    rows, cols = full(spec.m, spec.tile.bm, spec.tiles_m), full(spec.n, spec.tile.bn, spec.tiles_n)
    return int(rows[int(rng.integers(0, len(rows)))]), int(cols[int(rng.integers(0, len(cols)))])


def judge_planted(out, y, bound, spec, tile) -> tuple[bool, bool]:
    exact = bool((bound == 0).all())
    c = compare(out, y.to(out.dtype) if exact else y, bound=None if exact else bound,
                tile_shape=(spec.tile.bm, spec.tile.bn))
    failing = set(c.bad_tiles)
    return tile in failing, failing == {tile}


def _plant_all(res, out, spec, ops, seed, np) -> None:
    """Each defect planted in one seeded tile of the correct output, judged on its own."""
    y, bound = expected_output(spec, ops)
    rng = np.random.default_rng(seed)
    tile = _planted_tile(spec, rng)
    for d in DEFECTS:
        bad = plant(d, out, y, spec, ops, tile, rng)
        if bad is not None:
            res.planted[d] = judge_planted(bad, y, bound, spec, tile)


@dataclass
class Result:
    case: Case
    spec_why: str = ""
    verdict: str = ""
    ratio: float = 0.0
    seconds: float = 0.0
    error: Optional[str] = None
    planted: dict = field(default_factory=dict)  # defect -> (detected, right tile)
    problem: Optional[dict] = None
    skipped: Optional[str] = None  # the engine refused the case's layout: why (no verdict)

    @property
    def judged(self) -> bool:
        return self.error is None and self.skipped is None


_CROSS_CHECKED: set = set()


@contextlib.contextmanager
def _cross_check(c: Case):
    """The references are cross-checked against the float64 host specs (on one tile) for the first
    case of each engine and K range only: on the CPU that costs about a second per tile at
    K = 65536. An ORACLE_CROSS_CHECK_TILES the caller set is kept."""
    name = "ORACLE_CROSS_CHECK_TILES"
    saved = os.environ.get(name)
    key = (c.engine, _kbucket(c.k))
    if saved is None:
        os.environ[name] = "0" if key in _CROSS_CHECKED else "1"
    _CROSS_CHECKED.add(key)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)


def run_case(c: Case, numerics: dict, planted: bool = True, run=None) -> Result:
    import numpy as np

    t0 = time.time()
    res = Result(c)
    try:
        ops = make_operands(c)
        spec, res.spec_why = spec_for(c, numerics)
        res.problem = spec.to_json()
        try:
            out = (run or ENGINE[c.engine].run)(c, ops)
        except EngineSkipped as e:
            res.skipped = str(e)[:500]
            res.seconds = round(time.time() - t0, 3)
            return res
        if DEV == "cuda":
            torch.cuda.synchronize()
        out = out.contiguous()
        rec = Recording(spec=spec, operands=ops, output=out, provenance=Provenance("random", c.seed, generator=DEV),
                        kernel=c.engine)
        with _cross_check(c):
            an = analyze(rec)
        res.verdict = an.verdict.value
        store = next(s for s in an.stages if s.name == "epilogue_store")
        w = store.chained.worst
        res.ratio = float(w.max_ratio) if w else 0.0
        if planted:
            _plant_all(res, out, spec, ops, c.seed, np)
    except Exception as e:  # a case the engine or the oracle cannot run: counted apart, not as a verdict
        res.error = f"{type(e).__name__}: {e}"[:500]
    res.seconds = round(time.time() - t0, 3)
    return res


# ----------------------------------------------------------------------------------------------
# tables and the driver
# ----------------------------------------------------------------------------------------------


def _kbucket(k: int) -> str:
    return "K<=1024" if k <= 1024 else ("K<=16384" if k <= 16384 else "K=65536")


def tables(results: list[Result]) -> dict:
    ok = [r for r in results if r.judged]
    groups: dict = {}
    for r in ok:
        for key in (f"engine={r.case.engine}", f"out={r.case.out}", _kbucket(r.case.k), f"inputs={r.case.kind}"):
            g = groups.setdefault(key, {"cases": 0, "false_diverged": 0, "ratios": []})
            g["cases"] += 1
            g["false_diverged"] += r.verdict != Verdict.MATCH.value
            g["ratios"].append(r.ratio)
    for g in groups.values():
        rs = sorted(x for x in g.pop("ratios") if math.isfinite(x))
        g["worst_ratio"] = rs[-1] if rs else None
        g["median_ratio"] = rs[len(rs) // 2] if rs else None
    planted: dict = {}
    for r in ok:
        for d, (det, right) in r.planted.items():
            for key in (d, f"{d} {_kbucket(r.case.k)}", f"{d} inputs={r.case.kind}"):
                p = planted.setdefault(key, {"planted": 0, "detected": 0, "detected_right_tile": 0})
                p["planted"] += 1
                p["detected"] += det
                p["detected_right_tile"] += right
    for p in planted.values():
        p["rate_right_tile"] = p["detected_right_tile"] / p["planted"] if p["planted"] else None
    return {"groups": groups, "planted_table": planted}


def environment() -> dict:
    """The run's versions and device (harness.dump.environment), the date and the GPU's capability."""
    from harness.dump import environment as versions

    env = dict(versions(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["capability"] = f"{p.major}.{p.minor}"
    env["cross_check_tiles"] = os.environ.get("ORACLE_CROSS_CHECK_TILES",
                                              "1 on the first case of each engine and K range, else 0")
    return env


# the zoo's correct kernels: case file, traced entry, shapes (each case's own epilogue: alpha, beta,
# C, bias and GELU)
ZOO = (("zoo/hopper_gemm/hopper_gemm.toml", "zoo_hopper_bf16_traced",
        ((1, 300, 72), (257, 129, 1000), (300, 392, 520), (128, 256, 16384), (64, 128, 65536))),
       ("zoo/hopper_gemm/hopper_gemm_e4m3.toml", "zoo_hopper_e4m3_tensor_traced",
        ((257, 129, 1008), (128, 256, 16384))),
       ("zoo/sm80_gemm/sm80_gemm.toml", "zoo_sm80_bf16_traced", ((200, 136, 168), (256, 128, 4096), (64, 128, 16384))))


def zoo_results(budget_end: float, planted: bool = True) -> list[Result]:
    """The zoo's correct kernels through live runs (oracle.run.live.run_live: its traced cubin from the
    build cache, one child process each), judged output-only (taps dropped), with the planted
    defects as for the other engines."""
    import numpy as np

    from oracle.run.case import load_case, with_trace
    from oracle.run.inputs import make_operands as ladder_operands
    from oracle.run.live import run_live

    out = []
    seed = 1000
    for path, entry, shapes in ZOO:
        for m, n, k in shapes:
            if time.time() > budget_end:
                return out
            seed += 1
            t0 = time.time()
            case = with_trace(load_case(os.path.join(ROOT, path), dict(m=m, n=n, k=k), entry=entry), [(0, 0)], (0,))
            sp = case.spec
            res = Result(Case(entry, sp.a_dtype, sp.out_dtype, m, n, k, sp.a_major, sp.b_major, "normal", seed),
                         spec_why=f"zoo case {path}, its own spec, output only")
            try:
                ops = ladder_operands(sp, "random", seed, generator="cuda")
                live = run_live(case, ops, Provenance("random", seed, generator="cuda"), timeout_s=120)
                rec = dataclasses.replace(live.recording, taps=(), descriptors=())
                res.problem = rec.spec.to_json()
                with _cross_check(res.case):
                    an = analyze(rec)
                res.verdict = an.verdict.value
                w = next(st for st in an.stages if st.name == "epilogue_store").chained.worst
                res.ratio = float(w.max_ratio) if w else 0.0
                if planted and rec.output is not None:
                    _plant_all(res, rec.output.contiguous(), rec.spec, rec.operands, seed, np)
            except Exception as e:
                res.error = f"{type(e).__name__}: {e}"[:500]
            res.seconds = round(time.time() - t0, 3)
            out.append(res)
    return out


def prebuild_zoo() -> int:
    """Build the zoo's cubins into the build cache (ORACLE_CACHE_DIR) on a machine without a GPU."""
    from harness.build import build_cubin
    from oracle.run.case import load_case

    for path, entry, _ in ZOO:
        k = load_case(os.path.join(ROOT, path), {}, entry=entry).kernel
        br = build_cubin(k.source, arch=k.arch, defines={"ORACLE_TRACE": "1", **k.defines})
        print(f"{entry}: {br.cubin_path} ({'cached' if br.cached else 'built'})")
    return 0


def summarise(results: list[Result], left: int, seconds: float) -> dict:
    ok = [r for r in results if r.judged]
    ratios = sorted((r.ratio for r in ok if math.isfinite(r.ratio)), reverse=True)
    planted = sum(len(r.planted) for r in ok)
    right = sum(right for r in ok for _, right in r.planted.values())
    detected = sum(det for r in ok for det, _ in r.planted.values())
    worst = max(ok, key=lambda r: r.ratio if math.isfinite(r.ratio) else math.inf, default=None)
    return {
        "schema": "oracle.false_alarms/1",
        "environment": environment(),
        "correct_cases": len(ok),
        "false_diverged": sum(r.verdict != Verdict.MATCH.value for r in ok),
        "planted": planted,
        "detected": detected,
        "detected_right_tile": right,
        "detected_right_tile_rate": right / planted if planted else None,
        "worst_ratio": ratios[0] if ratios else None,
        "worst_case": worst.case.label() if worst else None,
        "ratio_quantiles": {q: ratios[min(len(ratios) - 1, int((1 - q) * len(ratios)))] if ratios else None
                            for q in (0.5, 0.9, 0.99)},
        "errors": [{"case": r.case.label(), "error": r.error} for r in results if r.error],
        "skipped": [{"case": r.case.label(), "why": r.skipped} for r in results if r.skipped],
        "cases_left_by_budget": left,
        "seconds": round(seconds, 1),
        **tables(results),
        "false_alarms": [{"case": r.case.label(), "verdict": r.verdict, "ratio": r.ratio, "spec": r.spec_why,
                          "problem": r.problem} for r in ok if r.verdict != Verdict.MATCH.value],
        "cases": [{"case": r.case.label(), "fields": dataclasses.asdict(r.case), "verdict": r.verdict, "ratio": r.ratio,
                   "seconds": r.seconds, "spec": r.spec_why, "error": r.error, "problem": r.problem,
                   "skipped": r.skipped,
                   "planted": {d: list(v) for d, v in r.planted.items()}} for r in results],
    }


def load_results(path: str) -> tuple[list[Result], int, float]:
    """The per-case results of an earlier run (its JSON), to merge shards."""
    with open(path) as f:
        doc = json.load(f)
    out = []
    for c in doc["cases"]:
        r = Result(Case(**c["fields"]), c["spec"], c["verdict"], c["ratio"], c["seconds"], c.get("error"),
                   {d: tuple(v) for d, v in c["planted"].items()}, c.get("problem"), c.get("skipped"))
        out.append(r)
    return out, doc.get("cases_left_by_budget", 0), doc.get("seconds", 0.0)


def _environment_of(path: str) -> dict:
    """A result file's environment: a run's own, or the runs of a merge (flattened)."""
    with open(path) as f:
        env = json.load(f).get("environment", {})
    return {"file": os.path.basename(path), **({"runs": env["runs"]} if "runs" in env else env)}


def not_judged(cases: list, skip_paths) -> list:
    """The cases none of the earlier runs' JSON files judged (a case that could not run is run
    again; one whose layout the engine refused is not), in order."""
    done = {dataclasses.astuple(r.case) for path in skip_paths for r in load_results(path)[0] if r.error is None}
    return [c for c in cases if dataclasses.astuple(c) not in done]


def merged(results: list) -> list:
    """Each case once: its last judged result (runs in the order given: a later run of a case, say
    after its engine's model changed, supersedes the earlier), else its last error."""
    last: dict = {}
    for r in results:
        key = dataclasses.astuple(r.case)
        if r.error is None or key not in last or last[key].error is not None:
            last[key] = r
    return list(last.values())


def write(doc: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--numerics", default=DEFAULT_NUMERICS, help="measure_numerics.py's JSON (promotion intervals)")
    ap.add_argument("--w4-probe", default=DEFAULT_W4_PROBE,
                    help="benchmarks/probe_w4a16.py's JSON (tinygemm's dequant_precision), where it exists")
    ap.add_argument("--quick", action="store_true", help="a slice of the cases (the GPU test)")
    ap.add_argument("--engines", default="", help="comma-separated engine names (default: all)")
    ap.add_argument("--zoo", action="store_true", help="also the zoo's correct kernels through live runs")
    ap.add_argument("--prebuild-zoo", action="store_true", help="only build the zoo's cubins into the cache")
    ap.add_argument("--no-planted", action="store_true")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop taking new cases after this many seconds")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th case from the i-th (merge with --merge)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="merge shard results into --out (a case judged in several: the last file's result)")
    ap.add_argument("--skip", nargs="+", default=(), metavar="JSON",
                    help="leave out the cases an earlier run's JSON already judged (finish a budget-cut run, then --merge)")
    args = ap.parse_args(argv)
    if args.prebuild_zoo:
        return prebuild_zoo()
    if args.merge:
        results, left, secs = [], 0, 0.0
        for path in args.merge:
            r, lf, sc = load_results(path)
            results += r
            left += lf
            secs += sc
        results = merged(results)
        left = len(not_judged(make_cases(False, None), args.merge))  # the benchmark's cases no run judged
        doc = summarise(results, left, secs)
        # where each merged run ran (a merge itself runs anywhere)
        doc["environment"] = {"merged": doc["environment"]["date"], "runs": [_environment_of(p) for p in args.merge]}
        write(doc, args.out)
        print(f"merged {len(args.merge)} run(s): correct cases {doc['correct_cases']}, false DIVERGED "
              f"{doc['false_diverged']}, planted {doc['planted']}, at the right tile {doc['detected_right_tile']}")
        return 0 if doc["false_diverged"] == 0 else 1
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs real engines on the GPU", file=sys.stderr)
        return 2
    numerics = {}
    if args.numerics and os.path.exists(args.numerics):
        with open(args.numerics) as f:
            numerics = json.load(f)
    if args.w4_probe and os.path.exists(args.w4_probe):
        with open(args.w4_probe) as f:
            numerics = {**numerics, "engines": {**numerics.get("engines", {}), **json.load(f).get("engines", {})}}
    names = [n for n in args.engines.split(",") if n] or None
    try:
        si, sn = (int(v) for v in args.shard.split("/"))
        assert 0 <= si < sn
    except (ValueError, AssertionError):
        print(f"--shard {args.shard!r}: expected i/n with 0 <= i < n", file=sys.stderr)
        return 2
    cases = make_cases(args.quick, names)[si::sn]
    cases = not_judged(cases, args.skip)
    t0 = time.time()
    end = t0 + args.budget_s
    results = []
    for i, c in enumerate(cases):
        if time.time() > end:
            break
        r = run_case(c, numerics, planted=not args.no_planted)
        results.append(r)
        flag = "" if r.error is None and r.verdict == "MATCH" else f"  <-- {r.verdict or r.error}"
        if r.skipped:
            flag = f"  <-- {r.skipped}"
        print(f"[{i + 1}/{len(cases)}] {c.label():<58} {r.verdict or ('SKIPPED' if r.skipped else 'ERROR'):<9} err/bound {r.ratio:.3g} "
              f"({r.seconds:.2f} s){flag}", flush=True)
    left = len(cases) - len(results)
    if args.zoo:
        results += zoo_results(max(end, time.time()) + 60, planted=not args.no_planted)
    doc = summarise(results, left, time.time() - t0)
    doc["environment"]["numerics"] = f"{args.numerics} ({numerics.get('environment', {}).get('date', 'absent')})"
    write(doc, args.out)
    print(f"\ncorrect cases {doc['correct_cases']}, false DIVERGED {doc['false_diverged']} "
          f"(worst err/bound {doc['worst_ratio']}, {doc['worst_case']}; quantiles {doc['ratio_quantiles']})")
    print(f"planted {doc['planted']}, detected {doc['detected']}, at the right tile {doc['detected_right_tile']} "
          f"({doc['detected_right_tile_rate']})")
    for k, p in sorted(doc["planted_table"].items()):
        if k.split()[-1].startswith("K"):
            print(f"  {k:<34} {p['detected_right_tile']}/{p['planted']} at the right tile")
    for k, g in sorted(doc["groups"].items()):
        print(f"  {k:<34} {g['false_diverged']}/{g['cases']} false DIVERGED, worst err/bound {g['worst_ratio']}")
    if doc["errors"]:
        print(f"{len(doc['errors'])} case(s) could not run: {doc['errors'][:3]}")
    if doc["skipped"]:
        print(f"{len(doc['skipped'])} case(s) skipped, their layout refused by the engine: {doc['skipped'][:2]}")
    if left:
        print(f"{left} case(s) left: the time budget ran out")
    print(f"wrote {args.out} ({doc['seconds']} s)")
    return 0 if doc["false_diverged"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

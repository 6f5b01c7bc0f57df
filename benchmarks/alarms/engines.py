"""The false-alarm benchmark's cases and the engines that compute them: the Case, each engine's
runner and constraints (ENGINES: operand and output dtype, majors, the multiples of K, N and M its
layout needs), the shapes, and make_cases (seeded over every engine, shuffled). An engine that
refuses a case's layout raises EngineSkipped with its message: counted as skipped, never judged.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import torch

KINDS = ("normal", "positive", "outlier")
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn,
         "int8": torch.int8, "int32": torch.int32}
DEV = "cuda"  # where the operands are made and the engines run (the CPU tests set "cpu")


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


def kbucket(k: int) -> str:
    return "K<=1024" if k <= 1024 else ("K<=16384" if k <= 16384 else "K=65536")


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
# operands hold the logical [rows / block, K / 128] grids (oracle.run.inputs.Operands). torch takes
# three pairs (A, B): 1x128 x 1x128, 1x128 x 128x128 (DeepSeek-V3's activations x weights) and
# 128x128 x 1x128; not 128x128 x 128x128 (its "Invalid scaling configuration"). It reads B's scale
# through b.t() ([N, K]) and scale_b.t(): a 1x128 scale [rows, K / 128] with stride (1, rows), a
# 128x128 one [rows / 128, K / 128] row-major.
def _block_scale(scale: torch.Tensor, block_rows: int, operand: str) -> torch.Tensor:
    """The logical [rows / block_rows, K / 128] scale grid laid out as torch._scaled_mm reads it."""
    grid = scale.t().contiguous().t() if block_rows == 1 else scale.contiguous()  # as A's scale
    return grid if operand == "a" else grid.t()


def _scaled_block(rows_a, rows_b):
    def run(c, ops):
        a = ops.a.contiguous()
        b = ops.b.t().contiguous().t()
        sa, sb = _block_scale(ops.scale_a, rows_a, "a"), _block_scale(ops.scale_b, rows_b, "b")
        try:
            return torch._scaled_mm(a, b, sa, sb, out_dtype=TORCH[c.out])
        except (RuntimeError, ValueError, NotImplementedError) as e:
            raise EngineSkipped(f"torch._scaled_mm refused {rows_a}x128 x {rows_b}x128 block scales (scale_a "
                                f"{list(sa.shape)} stride {sa.stride()}, scale_b {list(sb.shape)} stride "
                                f"{sb.stride()}): {str(e)[:200]}") from None
    return run


# Blackwell's block-scaled formats as Hopper runs them, emulated: each operand dequantised with its
# block's scale in fp32 before the MMA (exact: an e4m3 element times a power of two, or times an e4m3
# scale, keeps at most 8 significant bits), one fp32 GEMM with TF32 off (the products of two such
# values are exact too; the sum is cuBLAS's fp32), then NVFP4's per-tensor scale (alpha, in fp32) and
# the rounding to bf16. MXFP8: OCP MX e8m0 exponents over 1 x 32 blocks; NVFP4-style: e4m3 scales
# over 1 x 16 blocks and a per-tensor fp32 scale. The scale grids are [rows, ceil(K / group)], stored
# as the format stores them (oracle.run.inputs.Operands).
EMULATED = {"emu_mxfp8": (32, "e8m0", 1.0), "emu_nvfp4_scales": (16, "e4m3", 0.5)}  # group, scale dtype, alpha


def _dequantised(x: torch.Tensor, scales: torch.Tensor, scale_dtype: str, group: int) -> torch.Tensor:
    """x [rows, K] in fp32, each element times its block's scale."""
    from kernels_ref.scales import scale_values

    per_k = scale_values(scales, scale_dtype).to(x.device).float().repeat_interleave(group, dim=1)
    return x.float() * per_k[:, :x.shape[1]]


def _emulated_block(group: int, scale_dtype: str, alpha: float):
    def run(c, ops):
        a = _dequantised(ops.a, ops.scale_a, scale_dtype, group)
        b = _dequantised(ops.b.t(), ops.scale_b, scale_dtype, group).t()
        with _Flags(tf32=False):
            acc = torch.mm(_store(a, c.a_major), _store(b, c.b_major))
        return (acc * alpha).to(TORCH[c.out])
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
    # K whole 128-deep scale blocks (a multiple of 512 where a scale is 128x128: ceil(K / 128) then
    # needs no padding to 4, which some torch versions ask of that scale's rows); M a multiple of 4
    # under a 1x128 scale of A (its leading dimension 16-byte aligned), of 128 under a 128x128 one,
    # and N likewise for B
    Engine("lt_e4m3_block1x128", "e4m3", "bf16", _scaled_block(1, 1), (("row", "col"),), 128, 16,
           note="_scaled_mm BlockWise1x128 x BlockWise1x128", mmult=4),
    Engine("lt_e4m3_block1x128_128x128", "e4m3", "bf16", _scaled_block(1, 128), (("row", "col"),), 512, 128,
           note="_scaled_mm BlockWise1x128 x BlockWise128x128 (DeepSeek-V3 activations x weights)", mmult=4),
    Engine("lt_e4m3_block128x128_1x128", "e4m3", "bf16", _scaled_block(128, 1), (("row", "col"),), 512, 16,
           note="_scaled_mm BlockWise128x128 x BlockWise1x128", mmult=128),
    *(Engine(f"tinygemm_w4_g{g}", "bf16", "bf16", _tinygemm(g), (("row", "col"),), 16 * W4_INNER_K_TILES, 8,
             note=f"torch._weight_int4pack_mm, uint4 B, group {g}") for g in (32, 64, 128)),
    Engine("emu_mxfp8", "e4m3", "bf16", _emulated_block(*EMULATED["emu_mxfp8"]), kmult=32, nmult=8,
           note="MXFP8 emulated: e4m3 dequantised by 1x32 e8m0 scales, an fp32 GEMM"),
    Engine("emu_nvfp4_scales", "e4m3", "bf16", _emulated_block(*EMULATED["emu_nvfp4_scales"]), kmult=16, nmult=8,
           note="NVFP4-style emulated: e4m3 dequantised by 1x16 e4m3 scales, an fp32 GEMM, a per-tensor scale 0.5"),
]
ENGINE = {e.name: e for e in ENGINES}
W4_GROUP = {"tinygemm_w4_g32": 32, "tinygemm_w4_g64": 64, "tinygemm_w4_g128": 128}  # k per scale group
# rows of A's M and of B's N under one block scale, per block-scaled engine
BLOCK_ROWS = {"lt_e4m3_block1x128": (1, 1), "lt_e4m3_block1x128_128x128": (1, 128),
              "lt_e4m3_block128x128_1x128": (128, 1)}

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

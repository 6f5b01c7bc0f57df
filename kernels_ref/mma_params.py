"""MMA stage configuration: what can be modelled, and the arguments its kernels take.

Data path: the caller's choice (operand and accumulator types, block shape, promotion interval,
block scales, out-of-bounds fill) -> `check_supported` (the reasons it cannot be modelled) ->
`MmaConfig` (validated once: how a k-block is cut into MMA steps, the launch's warps, and
`MmaConsts`, the kernels' compile-time constants) -> `MainloopParams` (validated operands
A [M, K], B [K, N] and block scales with the config: `MainloopArgs`, the runtime arguments of the
kernels built on `_mainloop`). As a CUTLASS kernel takes one Params struct, every MMA kernel takes
these two tuples as two arguments (`ml`, `MC`) and spells only what it adds; the jit helpers read
their fields (`MC.BMP`, `ml.n_kb`).

Constraints: the accumulator semantics are `kernels_ref.mma`'s (its docstring); errors name the
argument, its value and what is allowed. Each field of an `MmaConsts` is a tl.constexpr
(`_common.constexprs`), so the kernels specialise on it as on a constexpr argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref.dtypes import DTYPES, FP8

ACCS = ("fp32", "fp16", "int32")
_ACC_CODE = {"fp32": 0, "fp16": 1, "int32": 2}
ACC_TORCH = {"fp32": torch.float32, "fp16": torch.float16, "int32": torch.int32}


def mma_k_of(a_dtype: str, b_dtype: str) -> int:
    """k depth of one MMA instruction for this operand pair (the larger of the two)."""
    return max(DTYPES[a_dtype].mma_k, DTYPES[b_dtype].mma_k)


def check_supported(a_dtype: str, b_dtype: str, acc: str = "fp32", block_m: int = 128, block_n: int = 128,
                    block_k: int = 64, promotion_interval: Optional[int] = None,
                    block_scale_group: Optional[Sequence[int]] = None, scaled: bool = False) -> list[str]:
    """Reasons this accumulation cannot be modelled (empty list: supported).

    `scaled` says block scales are used; `block_scale_group` is checked when given: its k extent a
    multiple of block_k (one scale per k-block) or a divisor of it (several scale groups per k-block,
    each promoted into the accumulator with its own scale)."""
    reasons = []
    for nm, d in (("a_dtype", a_dtype), ("b_dtype", b_dtype)):
        if d not in DTYPES:
            reasons.append(f"{nm}={d!r} is unknown; allowed: {', '.join(DTYPES)}")
    if acc not in ACCS:
        reasons.append(f"acc={acc!r} is not allowed; allowed: {', '.join(ACCS)}")
    for nm, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            reasons.append(f"{nm}={v!r} must be a positive int")
    if reasons:
        return reasons
    pair = (a_dtype, b_dtype)
    fp8 = all(d in FP8 for d in pair)
    if acc == "fp32":
        if not (fp8 or (a_dtype == b_dtype and a_dtype in ("fp32", "fp16", "bf16"))):
            reasons.append(f"acc='fp32' takes operands fp32, fp16, bf16 (both the same) or e4m3/e5m2 (mixable); "
                           f"got a_dtype={a_dtype!r}, b_dtype={b_dtype!r}")
    elif acc == "fp16":
        if not (fp8 or pair == ("fp16", "fp16")):
            reasons.append(f"acc='fp16' takes operands fp16 (both) or e4m3/e5m2; got a_dtype={a_dtype!r}, "
                           f"b_dtype={b_dtype!r}")
        elif block_k % mma_k_of(a_dtype, b_dtype):
            reasons.append(f"acc='fp16' rounds after every MMA step of {mma_k_of(a_dtype, b_dtype)} k-elements: "
                           f"block_k={block_k} must be a multiple of it")
    else:
        if pair != ("int8", "int8"):
            reasons.append(f"acc='int32' takes int8 operands; got a_dtype={a_dtype!r}, b_dtype={b_dtype!r}")
    if promotion_interval is not None:
        p = promotion_interval
        if not fp8 or acc != "fp32":
            reasons.append(f"promotion_interval={p!r} models fp8 tensor-core accumulation: it needs e4m3/e5m2 "
                           f"operands and acc='fp32'")
        elif isinstance(p, bool) or not isinstance(p, int) or p <= 0 or p % 32 or block_k % p:
            reasons.append(f"promotion_interval={p!r} must be a positive multiple of 32 that divides "
                           f"block_k={block_k}")
    if scaled and acc != "fp32":
        reasons.append(f"block scales need acc='fp32', got acc={acc!r}")
    if block_scale_group is not None:
        g = tuple(block_scale_group) if isinstance(block_scale_group, (tuple, list)) else block_scale_group
        if not isinstance(g, tuple) or len(g) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                                                           for v in g):
            reasons.append(f"block_scale_group={block_scale_group!r} must be three positive ints (gm, gn, gk)")
        elif g[2] % block_k and block_k % g[2]:
            reasons.append(f"block_scale_group gk={g[2]} must be a multiple of block_k={block_k} (one scale per "
                           f"k-block) or divide it (several scale groups per k-block)")
        elif g[2] < block_k and promotion_interval is not None and g[2] % promotion_interval:
            reasons.append(f"promotion_interval={promotion_interval!r} must divide the scale group gk={g[2]} where "
                           f"the groups are narrower than block_k={block_k}: each group is promoted on its own")
    return reasons


def scale_groups(block_scale_group: Optional[Sequence[int]], block_k: int) -> int:
    """Scale groups one k-block holds: block_k / gk for groups narrower than the k-block, else 1."""
    if block_scale_group is None or block_scale_group[2] >= block_k:
        return 1
    return block_k // block_scale_group[2]


# Under the interpreter the fp16 accumulator's MMA steps are summed by one scan per step (mode 1);
# True here runs the compiled path's k-at-a-time loop instead (mode 2), for the test that holds the
# two to the same bits.
INTERPRET_FP16_STEPS_AS_LOOP = False


def _interp_mode() -> int:
    """The kernels' INTERP: 0 compiled, 1 interpreted, 2 interpreted with the fp16 steps' loop."""
    if not C.interpreting():
        return 0
    return 2 if INTERPRET_FP16_STEPS_AS_LOOP else 1


class MmaConsts(NamedTuple):
    """The compile-time constants of every MMA kernel, one tuple argument (`MC`)."""

    A_DT: tl.constexpr  # operand A's element code (_common.CODES), storage width, quiet-NaN bits
    A_W: tl.constexpr
    A_NAN: tl.constexpr
    B_DT: tl.constexpr
    B_W: tl.constexpr
    B_NAN: tl.constexpr
    FILL_NAN: tl.constexpr  # out-of-bounds boxes read as NaN (else zero)
    ACC: tl.constexpr  # 0 fp32, 1 fp16, 2 int32
    BM: tl.constexpr  # the tile, and its power-of-two padding
    BN: tl.constexpr
    BK: tl.constexpr
    BMP: tl.constexpr
    BNP: tl.constexpr
    KS: tl.constexpr  # k-elements one step sums, and their padding
    KSP: tl.constexpr
    NCHUNK: tl.constexpr  # promotion chunks per k-block, steps per chunk
    NSTEP: tl.constexpr
    PROMO: tl.constexpr
    SCALED: tl.constexpr  # block scales: their group and the two scales' codes and widths
    GM: tl.constexpr
    GN: tl.constexpr
    GK: tl.constexpr
    SA_DT: tl.constexpr
    SA_W: tl.constexpr
    SB_DT: tl.constexpr
    SB_W: tl.constexpr
    SG: tl.constexpr  # scale groups per k-block (scale_groups): each promoted with its own scale
    INTERP: tl.constexpr  # _interp_mode()
    N_KB_I: tl.constexpr  # the k-block count under the interpreter (0 compiled: _mainloop._loop_count)


class Operand(NamedTuple):
    """A matrix in global memory, as a kernel reads it: its bits and its row and column strides."""

    ptr: torch.Tensor
    s_r: int
    s_c: int


class MainloopArgs(NamedTuple):
    """The runtime arguments of the kernels built on `_mainloop`, one tuple argument (`ml`):
    A [M, K], B [K, N], the k-block count and the block scales (sa, sb; A's bits and strides 0
    when there are none)."""

    a: Operand
    b: Operand
    M: int
    N: int
    K: int
    n_kb: int
    sa: Operand
    sb: Operand


def _scale_meta(scale_a: Optional[torch.Tensor], scale_b: Optional[torch.Tensor]) -> dict:
    """The block scales' constants (SCALED and the two scales' codes and widths)."""
    if scale_a is None:
        return dict(SCALED=False, SA_DT=0, SA_W=4, SB_DT=0, SB_W=4)
    return dict(SCALED=True, SA_DT=C.CODES[C.name_of(scale_a.dtype)], SA_W=scale_a.element_size(),
                SB_DT=C.CODES[C.name_of(scale_b.dtype)], SB_W=scale_b.element_size())


@dataclass(frozen=True)
class MmaConfig:
    """One accumulation configuration, checked once (`check_supported`, and a NaN fill needs float
    operands): the engine's constexprs and how a k-block is cut into MMA steps of KS k-elements,
    NSTEP steps per promotion chunk, NCHUNK chunks (a chunk lies inside one scale group)."""

    a_dtype: str
    b_dtype: str
    acc: str
    block_m: int
    block_n: int
    block_k: int
    promotion_interval: Optional[int] = None
    block_scale_group: Optional[Sequence[int]] = None
    scaled: bool = False
    oob_fill: str = "zero"

    def __post_init__(self) -> None:
        reasons = check_supported(self.a_dtype, self.b_dtype, self.acc, self.block_m, self.block_n, self.block_k,
                                  self.promotion_interval, self.block_scale_group, self.scaled)
        known = self.a_dtype in DTYPES and self.b_dtype in DTYPES
        if known and self.oob_fill == "nan" and not (DTYPES[self.a_dtype].is_float and
                                                      DTYPES[self.b_dtype].is_float):
            reasons.append("oob_fill='nan' needs floating-point operands")
        if reasons:
            raise C.reasons_error(reasons)

    @property
    def steps(self) -> tuple[int, int, int]:
        """(KS, NSTEP, NCHUNK): the k-elements one step sums, steps per chunk, chunks per k-block."""
        mk = mma_k_of(self.a_dtype, self.b_dtype)
        if self.promotion_interval is not None:
            return mk, self.promotion_interval // mk, self.block_k // self.promotion_interval
        if self.acc == "fp16":
            return mk, 1, self.block_k // mk
        width = self.block_k // self.scale_groups  # one dot per scale group
        return width, 1, self.block_k // width

    @property
    def scale_groups(self) -> int:
        return scale_groups(self.block_scale_group, self.block_k) if self.scaled else 1

    @property
    def num_warps(self) -> int:
        return 8 if C.pad_dim(self.block_m) * C.pad_dim(self.block_n) >= 128 * 128 else 4

    def consts(self, scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
               n_kb: int = 0) -> MmaConsts:
        """The kernels' constants: this config's, the block scales' codes and widths (scale_a,
        scale_b: the tensors, or None), and under the interpreter the k-block count n_kb. INTERP
        is read here, at the launch."""
        ks, nstep, nchunk = self.steps
        a, b = self.a_dtype, self.b_dtype
        gm, gn, gk = self.block_scale_group if self.block_scale_group is not None else (1, 1, 1)
        return C.constexprs(
            MmaConsts, A_DT=C.CODES[a], A_W=DTYPES[a].itemsize, A_NAN=C.NAN_BITS.get(a, 0), B_DT=C.CODES[b],
            B_W=DTYPES[b].itemsize, B_NAN=C.NAN_BITS.get(b, 0), FILL_NAN=self.oob_fill == "nan",
            ACC=_ACC_CODE[self.acc], BM=self.block_m, BN=self.block_n, BK=self.block_k, BMP=C.pad_dim(self.block_m),
            BNP=C.pad_dim(self.block_n), KS=ks, KSP=C.pad_dim(ks, C.dot_k_min((a, b))), NCHUNK=nchunk, NSTEP=nstep,
            PROMO=self.promotion_interval is not None, GM=gm, GN=gn, GK=gk, SG=self.scale_groups, INTERP=_interp_mode(),
            N_KB_I=n_kb if C.interpreting() else 0, **_scale_meta(scale_a, scale_b))

    def launch_options(self, device: torch.device) -> dict:
        return C.launch_options(device, self.num_warps)


@dataclass(frozen=True)
class MainloopParams:
    """The arguments of a kernel built on `_mainloop` (mma_trajectory, mma_accumulate, the
    statistics, gemm), validated once: A [M, K] and B [K, N] (any strides), block scales
    scale_a [ceil(M/gm), ceil(K/gk)] and scale_b [ceil(N/gn), ceil(K/gk)] with their group, and the
    accumulation config. `kernel_args()` is the keyword arguments those kernels share."""

    a: torch.Tensor
    b: torch.Tensor
    block_m: int
    block_n: int
    block_k: int
    acc: str = "fp32"
    promotion_interval: Optional[int] = None
    scale_a: Optional[torch.Tensor] = None
    scale_b: Optional[torch.Tensor] = None
    block_scale_group: Optional[Sequence[int]] = None
    oob_fill: str = "zero"
    config: MmaConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        a, b = self.a, self.b
        C.require_tensor("a", a, 2)
        C.require_tensor("b", b, 2)
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"a is {tuple(a.shape)} and b is {tuple(b.shape)}: a must be [M, K] and b [K, N]")
        ad, bd = C.dtype_name("a", a), C.dtype_name("b", b)
        C.require_choice("oob_fill", self.oob_fill, C.OOB_FILLS)
        if (self.scale_a is None) != (self.scale_b is None):
            raise ValueError("scale_a and scale_b must be given together (block-scaled) or both be None")
        scaled = self.scale_a is not None
        if scaled and self.block_scale_group is None:
            raise ValueError("block_scale_group=(gm, gn, gk) is required with scale_a/scale_b")
        if not scaled and self.block_scale_group is not None:
            raise ValueError(f"block_scale_group={self.block_scale_group!r} given without scale_a/scale_b")
        object.__setattr__(self, "config", MmaConfig(ad, bd, self.acc, self.block_m, self.block_n, self.block_k,
                                                     self.promotion_interval, self.block_scale_group, scaled,
                                                     self.oob_fill))
        if scaled:
            M, K = a.shape
            N = b.shape[1]
            gm, gn, gk = self.block_scale_group
            for nm, s, rows in (("scale_a", self.scale_a, C.cdiv(M, gm)), ("scale_b", self.scale_b, C.cdiv(N, gn))):
                C.require_tensor(nm, s, 2)
                C.dtype_name(nm, s, C.FLOAT_NAMES[:3])
                if tuple(s.shape) != (rows, C.cdiv(K, gk)):
                    raise ValueError(f"{nm} has shape {tuple(s.shape)}; with block_scale_group="
                                     f"{tuple(self.block_scale_group)} and M={M}, N={N}, K={K} it must be "
                                     f"{(rows, C.cdiv(K, gk))}")

    @property
    def n_kb(self) -> int:
        """The number of k-blocks."""
        return C.cdiv(self.a.shape[1], self.block_k)

    def with_tile(self, block_m: int, block_n: int) -> "MainloopParams":
        """The same accumulation launched on another output tile (each element's arithmetic depends
        on the k-blocks only)."""
        return MainloopParams(self.a, self.b, block_m, block_n, self.block_k, self.acc, self.promotion_interval,
                              self.scale_a, self.scale_b, self.block_scale_group, self.oob_fill)

    def kernel_args(self) -> dict:
        """The two arguments every kernel built on `_mainloop` takes: `ml` (MainloopArgs) and `MC`
        (MmaConsts)."""
        a, b = Operand(*C.strided(self.a)), Operand(*C.strided(self.b))
        M, K = self.a.shape
        if self.scale_a is None:
            sa = sb = Operand(a.ptr, 0, 0)
        else:
            sa, sb = Operand(*C.strided(self.scale_a)), Operand(*C.strided(self.scale_b))
        ml = MainloopArgs(a, b, M, self.b.shape[1], K, self.n_kb, sa, sb)
        return dict(ml=ml, MC=self.config.consts(self.scale_a, self.scale_b, self.n_kb))

    def launch_options(self, device: torch.device) -> dict:
        return self.config.launch_options(device)

"""The problem specification: a validated, frozen description of one GEMM-like problem.

D = cast(activation(alpha * scale(A @ B) + beta * C + bias)), with A [M, K], B [K, N] given
logically (the majors say how they are stored) and block scales, if any, applied per k-block
inside the main loop. `epilogue` may declare the epilogue's steps in another order, with
roundings between them (kernels_ref.epilogue_graph; docs/epilogue.md). Every invalid field raises `SpecError` naming the field, the value and
what is allowed.

A quantised B (`b_dtype` int4, uint4, fp4_e2m1, int8, e4m3 or e5m2 beside an fp16 / bf16 A: W4A16,
W8A16) holds stored values q with per-group scales s (`b_scales`: their dtype, shape [K / b_group_size,
N]) and zero points z (`b_zeros`: none, int or float); the MMA reads w = (q - z) * s in A's dtype,
computed as `dequant_precision` says (kernels_ref.dequant). `b_zeros` "float_offset" is the other
common form, a float z added after the scale: w = (q - c) * s + z, c the centre of an unsigned B's
range (8 for uint4: torch's tinygemm int4 kernel, torch._weight_int4pack_mm) and 0 for a signed
one; it needs an integer B and fp16 / bf16 / fp32 scales, and z is stored in the scales' dtype.
A 4-bit B is packed two values to a byte
along K (`b_packing`), stored as uint8 [K / 2, N] whatever the packing: k_pairs_low_first /
k_pairs_high_first hold k = 2r and 2r + 1 in byte r of a column; k8_interleaved holds k = 8w ..
8w + 7 of a column in the 32-bit little-endian word made of its bytes 4w .. 4w + 3 (byte j = bits
8j .. 8j + 7), nibble i (i = 0 the least significant) holding k = 8w + [0, 2, 4, 6, 1, 3, 5, 7][i]
(the FasterTransformer / Marlin order; in a K-major B the word is four consecutive bytes, one
uint32 in memory); K, tile.bk and b_group_size are then multiples of 8.

A quantised A (`a_dtype` one of the same types beside an fp16 / bf16 B: a mixed-input Hopper kernel
that swaps the problem so the weight is WGMMA's register operand) mirrors it with `a_packing`,
`a_group_size`, `a_scales` ([M, K / a_group_size]) and `a_zeros`: A stored [M, K] (packed: uint8
[M, K / 2], the same packings along K), dequantised to B's dtype. At most one operand is quantised
(oracle.problem.quant checks the fields).

A tile's k-blocks may be accumulated in partials that a reduction sums (`splits`: split-K, each
split a share of the k-blocks; `stream_k_workers`: stream-K, the tiles' k-blocks dealt out to that
many workers; `partition` names the dealing rule, oracle.problem.partition). A problem may be grouped (`groups`: MoE-style
contiguous groups along M of the given sizes, each with its own B; A [M, K] and D [M, N] hold the
groups one after the other) or batched (`batch` entries of one shape, stored the same way).
A problem may instead be grouped along K (`k_groups`: the K of each group, 0 allowed, adding up to k;
a K-grouped GEMM as in an MoE weight gradient): group g owns K_g consecutive columns of A [M, K] and
the same rows of B [K, N] (stored as a plain problem's), and writes its own D_g [M, N]; C and D hold
the groups' outputs one after the other ([G * M, N], as a batched problem's), a column bias is one
per group, a row bias per row of D. Its block scales are the plain problem's ([ceil(M / gm), K / gk]
and [ceil(N / gn), K / gk]), each group's K a multiple of gk so that they split at the groups'
boundaries; it is not split (no split-K or stream-K) and has no quantised operand.
A grouped or batched problem's block scales follow its operands (DeepGEMM's grouped contiguous and
masked layouts, CUTLASS's grouped blockwise GEMMs): A's are per row (1 x gk), [total M, ceil(K / gk)]
logically, stacked with A's rows over the groups; B's are one [ceil(N / gn), ceil(K / gk)] per group
(or batch entry), [groups, ceil(N / gn), ceil(K / gk)], each matrix in scale_b.major. Group g is
judged with its rows of A's scales and B's scales [g].
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from harness.errors import BadInput
from harness.fields import shown
from kernels_ref import epilogue_graph
from kernels_ref.dtypes import ALL_TYPES, FP8, QUANT_B
from oracle.problem import quant as _quant

OPERAND_DTYPES = ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int8")
B_DTYPES = OPERAND_DTYPES + tuple(d for d in QUANT_B if d not in OPERAND_DTYPES)  # with int4, uint4, fp4_e2m1
A_DTYPES = B_DTYPES  # either operand may be the quantised one (oracle.problem.quant)
ACC_DTYPES = ("fp32", "fp16", "int32")
OUT_DTYPES = ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int32")
C_DTYPES = ("fp32", "fp16", "bf16")
MAJORS = ("row", "col")
SWIZZLES = (0, 32, 64, 128)
OOB_FILLS = ("zero", "nan")
ACTIVATIONS = ("none", "relu", "gelu_erf", "gelu_tanh", "silu")
BIAS_AXES = ("none", "row", "col")
SCALE_KINDS_A = ("none", "tensor", "row", "block")
SCALE_KINDS_B = ("none", "tensor", "col", "block")
MAX_TILE_DIM = 65535  # the trace format's limit; a CTA tile is far smaller
MAX_DIM = 2**31 - 1  # m, n, k and the stacked rows of a batch: a launch passes sizes as int32
MAX_GROUPS = 1 << 16  # groups of a grouped problem, entries of a batched one
MAX_STREAM_K_WORKERS = 1 << 20  # far past any persistent grid; the partition is linear in it
MAX_SPLITS = 1 << 20  # split-K splits: far past any kernel's; a tile's partition is linear in it
FP32_MAX = 3.4028234663852886e38  # alpha and beta reach the epilogue as fp32 values
# What the engine's accumulation does (oracle.judging.accumulation_models.ACC_TABLE has each model's bound):
ACC_MODELS = ("fp32", "tf32", "tf32_rn", "tf32x3", "bf16x3", "fp16", "fp8_fast", "fp8_promoted", "int32", "any")
_ACC_MODEL_OPERANDS = {"tf32": ("fp32",), "tf32_rn": ("fp32",), "tf32x3": ("fp32",), "bf16x3": ("fp32",),
                       "fp8_fast": FP8, "fp8_promoted": FP8, "int32": ("int8",), "fp16": ("fp16",) + FP8}
_ACC_MODEL_ACC = {"fp16": "fp16", "int32": "int32"}
# how a split tile's k-blocks are dealt to its partials (oracle.problem.partition documents each rule)
PARTITION_RULES = ("ceil_shares", "floor_shares", "cutlass_stream_k", "stream_k_dp_remainder")
REDUCTIONS = ("none", "fp32", "bf16", "fp16")  # the type split-K partials are stored in before they are summed
ACTIVATION_IMPLS = ("accurate", "fast")


class SpecError(BadInput, ValueError):
    """A problem specification that is not valid."""


def _require(ok: bool, field: str, value: Any, allowed: str) -> None:
    if not ok:
        raise SpecError(f"{field}={shown(value)} is not allowed: {allowed}")


def _positive_int(field: str, value: Any, most: Optional[int] = None) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0 and (most is None or value <= most),
             field, value, "must be a positive integer" + (f" of at most {most}" if most is not None else ""))


def _count_of(g: Any) -> str:
    """How a groups value is named in an error: a long list by its length, not its entries."""
    return f"<a list of {len(g)} entries>" if isinstance(g, (tuple, list)) and len(g) > 8 else g


def _finite(v: Any) -> bool:
    """A finite number (an int too large for a float is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Tile:
    """The CTA output tile (BM x BN) and the k-block depth BK of the kernel's main loop."""

    bm: int = 128
    bn: int = 128
    bk: int = 64

    def __post_init__(self) -> None:
        for f in ("bm", "bn", "bk"):
            _positive_int(f"tile.{f}", getattr(self, f), MAX_TILE_DIM)


@dataclass(frozen=True)
class Scale:
    """How one operand is scaled.

    kind: none | tensor | row (A, per m) | col (B, per n) | block. A block scale covers
    `block` = (rows, k) elements of A's (m, k) or (cols, k) of B's (n, k): DeepSeek-style fp8 uses
    (1, 128) for activations and (128, 128) for weights. Block scales act inside the main loop
    (per k-block); the others act in the epilogue. `major` is how a block scale tensor, logically
    [rows / block rows, K / block k], lies in memory: row (k contiguous, the default) or col (its
    rows contiguous: DeepGEMM's MN-major activation scales). `dtype` is how a block scale is stored
    (kernels_ref.scales): fp32 values, e8m0 exponents (OCP MX: 1 x 32 blocks) or e4m3 values
    (NVFP4-style 1 x 16 blocks; NVFP4's per-tensor fp32 scale is the epilogue's alpha). On a grouped
    or batched problem A's block scales are per row, stacked with A's rows ([total M, K / block k]),
    and B's are one tensor per group ([groups, N / block rows, K / block k]). A block's k
    extent may be narrower than tile.bk (several scale groups per k-block) if it divides it. K need
    be no multiple of either: the tensor holds ceil(K / block k) groups (the last one possibly
    partial), and under a ragged K the last k-block's groups that start at or past K do not exist
    (a kernel may apply anything there; they are not judged).
    """

    kind: str = "none"
    block: Optional[tuple[int, int]] = None
    major: str = "row"
    dtype: str = "fp32"

    def validate(self, operand: str) -> None:
        kinds = SCALE_KINDS_A if operand == "a" else SCALE_KINDS_B
        _require(self.kind in kinds, f"scale_{operand}.kind", self.kind, f"one of {', '.join(kinds)}")
        if self.kind == "block":
            ok = (isinstance(self.block, tuple) and len(self.block) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in self.block))
            _require(ok, f"scale_{operand}.block", self.block,
                     "a block scale needs (rows, k), two positive integers, e.g. (1, 128)")
            _require(self.major in MAJORS, f"scale_{operand}.major", self.major,
                     "'row' (k contiguous) or 'col' (rows contiguous, MN-major)")
            from kernels_ref import scales as _scales

            _require(self.dtype in _scales.SCALE_DTYPES, f"scale_{operand}.dtype", self.dtype,
                     f"one of {', '.join(_scales.SCALE_DTYPES)}")
            for reason in _scales.check_supported(_layout_unchecked(self), operand):
                raise SpecError(f"{reason} is not allowed")
        else:
            _require(self.dtype == "fp32", f"scale_{operand}.dtype", self.dtype,
                     f"only a 'block' scale has a stored dtype other than fp32 (kind is {self.kind!r})")
            _require(self.major == "row", f"scale_{operand}.major", self.major,
                     f"only a 'block' scale is a matrix with a storage order (kind is {self.kind!r})")
            _require(self.block is None, f"scale_{operand}.block", self.block,
                     f"only a 'block' scale has a block shape (kind is {self.kind!r})")


@dataclass(frozen=True)
class ProblemSpec:
    m: int
    n: int
    k: int
    a_dtype: str = "bf16"
    b_dtype: str = "bf16"
    acc_dtype: str = "fp32"
    out_dtype: str = "bf16"
    c_dtype: Optional[str] = None
    a_major: str = "row"
    b_major: str = "col"
    c_major: str = "row"
    d_major: str = "row"
    tile: Tile = Tile()
    swizzle_a: int = 0
    swizzle_b: int = 0
    oob_fill: str = "zero"
    promotion_interval: Optional[int] = None
    scale_a: Scale = Scale()
    scale_b: Scale = Scale()
    alpha: float = 1.0
    beta: float = 0.0
    bias: str = "none"
    bias_dtype: str = "fp32"
    activation: str = "none"
    saturate: bool = False
    batch: int = 1
    splits: int = 1
    stream_k_workers: Optional[int] = None
    partition: Optional[str] = None  # the declared partition rule (oracle.problem.partition); None: the default
    groups: Optional[tuple[int, ...]] = None  # M of each group (0 allowed); m is their sum
    acc_model: Optional[str] = None
    reduction: str = "none"
    reduction_chunk: Optional[int] = None
    activation_impl: str = "accurate"
    epilogue: Optional[tuple[str, ...]] = None  # the declared epilogue graph (kernels_ref.epilogue_graph); None: DEFAULT
    a_packing: Optional[str] = None  # a packed 4-bit A: oracle.problem.quant.PACKINGS (along K, [M, K / 2])
    a_group_size: Optional[int] = None  # a quantised A: k elements per scale; None: all of K
    a_scales: Optional[str] = None  # a quantised A: the scales' dtype (SCALE_TYPES), shape [M, K / group]
    a_zeros: str = "none"  # a quantised A: oracle.problem.quant.ZEROS
    b_packing: Optional[str] = None  # a packed 4-bit B: oracle.problem.quant.PACKINGS
    b_group_size: Optional[int] = None  # a quantised B: k elements per scale (and zero point); None: all of K
    b_scales: Optional[str] = None  # a quantised B: the scales' dtype (SCALE_TYPES), shape [K / group, N]
    b_zeros: str = "none"  # a quantised B: oracle.problem.quant.ZEROS
    dequant_precision: Optional[str] = None  # a quantised operand: oracle.problem.quant.DEQUANT_PRECISIONS (None: fp32)
    k_groups: Optional[tuple[int, ...]] = None  # K of each group along K (0 allowed); k is their sum

    kind = "gemm"  # the problem's kind (oracle.problem.attention.AttentionSpec is "attention"); not a field

    def __post_init__(self) -> None:
        for f in ("m", "n", "k"):
            _positive_int(f, getattr(self, f), MAX_DIM)
        _positive_int("batch", self.batch, MAX_GROUPS)
        _require(self.m * self.batch <= MAX_DIM, "batch", self.batch,
                 f"batch x m = {self.m * self.batch} rows, more than the {MAX_DIM} an int32 size holds")
        _require(isinstance(self.tile, Tile), "tile", self.tile, "must be a Tile(bm, bn, bk)")
        _require(self.a_dtype in A_DTYPES, "a_dtype", self.a_dtype, f"one of {', '.join(A_DTYPES)}")
        _require(self.b_dtype in B_DTYPES, "b_dtype", self.b_dtype, f"one of {', '.join(B_DTYPES)}")
        _require(self.acc_dtype in ACC_DTYPES, "acc_dtype", self.acc_dtype, f"one of {', '.join(ACC_DTYPES)}")
        _require(self.out_dtype in OUT_DTYPES, "out_dtype", self.out_dtype, f"one of {', '.join(OUT_DTYPES)}")
        _quant.validate(self, _require)
        a, b = self.mma_dtype, self.b_dtype  # a: the MMA's A (a quantised A is read dequantised)
        if self.quant_op is not None:
            pass  # checked by oracle.problem.quant: an fp16 / bf16 operand beside a quantised one
        elif a in FP8 or b in FP8:
            _require(a in FP8 and b in FP8, "b_dtype" if a in FP8 else "a_dtype", b if a in FP8 else a,
                     "an fp8 operand needs the other operand in fp8 too (e4m3 or e5m2)")
        else:
            _require(a == b, "b_dtype", b, f"must equal a_dtype ({a}) unless both are fp8")
        if self.acc_dtype == "int32" or a == "int8":
            _require(a == "int8" and self.acc_dtype == "int32", "acc_dtype", self.acc_dtype,
                     "int8 operands accumulate in int32, and int32 accumulation takes int8 operands")
        if self.acc_dtype == "fp16":
            _require(a == "fp16", "acc_dtype", self.acc_dtype, "fp16 accumulation is defined for fp16 operands only")
        if self.out_dtype == "int32":
            _require(self.acc_dtype == "int32" and not self.has_float_epilogue, "out_dtype", self.out_dtype,
                     "an int32 output needs int32 accumulation and no scale, alpha, beta, bias or activation")
        for f in ("a_major", "b_major", "c_major", "d_major"):
            _require(getattr(self, f) in MAJORS, f, getattr(self, f), "'row' or 'col'")
        for op in ("a", "b"):
            sw = getattr(self, f"swizzle_{op}")
            _require(sw in SWIZZLES, f"swizzle_{op}", sw, "0, 32, 64 or 128 (bytes)")
            if sw:
                inner = self.smem_inner_bytes(op)
                _require(inner % sw == 0, f"swizzle_{op}", sw,
                         f"the tile's contiguous extent ({inner} bytes) must be a multiple of the swizzle span")
        _require(self.oob_fill in OOB_FILLS, "oob_fill", self.oob_fill, "'zero' or 'nan'")
        if self.oob_fill == "nan":
            _require(a != "int8", "oob_fill", self.oob_fill, "integer operands have no NaN")
        if self.promotion_interval is not None:
            p = self.promotion_interval
            _require(a in FP8, "promotion_interval", p, "applies to fp8 operands only")
            _require(isinstance(p, int) and p > 0 and p % 32 == 0 and self.tile.bk % p == 0,
                     "promotion_interval", p, f"a multiple of 32 that divides tile.bk ({self.tile.bk})")
        self.scale_a.validate("a")
        self.scale_b.validate("b")
        blocks = [s for s in (self.scale_a, self.scale_b) if s.kind == "block"]
        if blocks:
            _require(a in FP8 and self.acc_dtype == "fp32", "scale_a.kind" if self.scale_a.kind == "block"
                     else "scale_b.kind", "block", "block scales need fp8 operands and fp32 accumulation")
            _require(len(blocks) == 2, "scale_b.kind" if self.scale_a.kind == "block" else "scale_a.kind",
                     (self.scale_b if self.scale_a.kind == "block" else self.scale_a).kind,
                     "block scaling needs block scales on both A and B")
            gk = self.scale_a.block[1]
            _require(self.scale_b.block[1] == gk, "scale_b.block", self.scale_b.block,
                     f"the k extent must equal scale_a's ({gk})")
            _require(gk % self.tile.bk == 0 or self.tile.bk % gk == 0, "scale_a.block", self.scale_a.block,
                     f"the k extent must be a multiple of tile.bk ({self.tile.bk}) or divide it (several scale "
                     f"groups per k-block)")
            if gk < self.tile.bk:
                p = self.promotion_interval
                _require(p is None or gk % p == 0, "promotion_interval", p,
                         f"with scale groups narrower than tile.bk each group ({gk} k) is promoted on its own: "
                         f"the interval must divide {gk}")
        for f in ("alpha", "beta"):
            v = getattr(self, f)
            _require(_finite(v) and abs(v) <= FP32_MAX, f, v,
                     f"must be a finite number of magnitude at most {FP32_MAX:.7g} (the epilogue computes in fp32)")
            object.__setattr__(self, f, float(v))  # an int (2**70, say) is judged as the float it stands for
        if self.beta != 0:
            _require(self.c_dtype in C_DTYPES, "c_dtype", self.c_dtype,
                     f"beta != 0 reads C, so c_dtype must be one of {', '.join(C_DTYPES)}")
        elif self.c_dtype is not None:
            _require(self.c_dtype in C_DTYPES, "c_dtype", self.c_dtype, f"one of {', '.join(C_DTYPES)}")
        _require(self.bias in BIAS_AXES, "bias", self.bias, f"one of {', '.join(BIAS_AXES)}")
        _require(self.bias_dtype in C_DTYPES, "bias_dtype", self.bias_dtype, f"one of {', '.join(C_DTYPES)}")
        _require(self.activation in ACTIVATIONS, "activation", self.activation, f"one of {', '.join(ACTIVATIONS)}")
        _require(isinstance(self.saturate, bool), "saturate", self.saturate, "must be true or false")
        _positive_int("splits", self.splits, MAX_SPLITS)
        _require(self.splits <= self.k_blocks, "splits", self.splits,
                 f"at most the {self.k_blocks} k-blocks (K = {self.k}, tile.bk = {self.tile.bk})")
        if self.stream_k_workers is not None:
            _positive_int("stream_k_workers", self.stream_k_workers, MAX_STREAM_K_WORKERS)
            _require(self.splits == 1, "stream_k_workers", self.stream_k_workers,
                     "stream-K and split-K (splits > 1) are two ways to split k: give one of them")
        if self.partition is not None:
            _require(self.partition in PARTITION_RULES, "partition", self.partition,
                     f"one of {', '.join(PARTITION_RULES)} (oracle.problem.partition)")
            _require(self.partitioned, "partition", self.partition,
                     "a partition rule needs a split problem (splits > 1 or stream_k_workers)")
            _require(self.partition != "stream_k_dp_remainder" or self.stream_k_workers is not None, "partition",
                     self.partition, "a data-parallel remainder is a stream-K rule: give stream_k_workers")
        if self.groups is not None:
            g = self.groups
            _require(isinstance(g, tuple) and 0 < len(g) <= MAX_GROUPS, "groups", _count_of(g),
                     f"a non-empty list of at most {MAX_GROUPS} group sizes along M")
            _require(all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM for v in g),
                     "groups", g, f"a non-empty list of group sizes along M (integers 0..{MAX_DIM})")
            _require(sum(g) == self.m, "groups", g, f"the group sizes must add up to m = {self.m}")
            _require(self.batch == 1, "batch", self.batch, "a grouped problem has no batch (give groups or batch)")
        if self.k_groups is not None:
            self._validate_k_groups()
        if self.group_sizes is not None:
            for op in ("a", "b"):
                kind = getattr(self, f"scale_{op}").kind
                _require(kind in ("none", "tensor", "block"), f"scale_{op}.kind", kind,
                         "a grouped or batched problem takes per-tensor or block scales")
            if self.scale_a.kind == "block" and self.k_groups is None:  # A of a K-grouped problem is not stacked
                _require(self.scale_a.block[0] == 1, "scale_a.block", self.scale_a.block,
                         "a grouped or batched problem's A scales are per row (1 x gk): they stack with A's rows "
                         "over the groups")
        self._validate_numerics()
        self._validate_epilogue()

    def _validate_k_groups(self) -> None:
        """A K-grouped problem: the sizes, what it may not be combined with, and its block scales split at
        the groups' boundaries."""
        g = self.k_groups
        _require(isinstance(g, tuple) and 0 < len(g) <= MAX_GROUPS, "k_groups", _count_of(g),
                 f"a non-empty list of at most {MAX_GROUPS} group sizes along K")
        for i, v in enumerate(g):
            _require(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM, f"k_groups[{i}]", v,
                     f"a group's K: an integer 0..{MAX_DIM} (0: an empty group)")
        _require(sum(g) == self.k, "k_groups", _count_of(g), f"the group sizes must add up to k = {self.k} "
                                                              f"(they add up to {sum(g)})")
        _require(self.groups is None, "k_groups", _count_of(g),
                 "a problem is grouped along M (groups) or along K (k_groups), not both")
        _require(self.batch == 1, "k_groups", _count_of(g), f"a K-grouped problem has no batch (batch is {self.batch})")
        _require(not self.partitioned, "k_groups", _count_of(g),
                 "a K-grouped problem is modelled without split-K or stream-K (splits 1, no stream_k_workers): each "
                 "group's k-blocks are one tile's")
        _require(self.quant_op is None, "k_groups", _count_of(g),
                 "a quantised operand is modelled for a single GEMM (no k_groups)")
        if self.scale_a.kind == "block":
            gk = self.scale_a.block[1]
            for i, v in enumerate(g):
                _require(v % gk == 0, f"k_groups[{i}]", v,
                         f"with block scales every group's K must be a multiple of the scale group's k extent ({gk}), "
                         f"so the scale tensors split at the groups' boundaries")

    def _validate_numerics(self) -> None:
        """acc_model, reduction, reduction_chunk, activation_impl (the engine's numerics)."""
        am, a = self.acc_model, self.mma_dtype
        if am is not None:
            _require(am in ACC_MODELS, "acc_model", am, f"one of {', '.join(ACC_MODELS)} (or absent: from acc_dtype)")
            ops = _ACC_MODEL_OPERANDS.get(am)
            if ops is not None:
                _require(a in ops, "acc_model", am, f"{am} describes {', '.join(ops)} operands, not {a}")
            acc = _ACC_MODEL_ACC.get(am, "fp32" if am != "any" else self.acc_dtype)
            _require(self.acc_dtype == acc, "acc_model", am, f"{am} needs acc_dtype={acc!r} (got {self.acc_dtype!r})")
            if am == "fp8_promoted":
                _require(self.promotion_interval is not None, "promotion_interval", None,
                         "acc_model='fp8_promoted' needs the promotion interval (k elements)")
            elif self.promotion_interval is not None:
                _require(am == "any", "acc_model", am,
                         "a promotion_interval describes fp8_promoted accumulation (or leave acc_model out)")
        _require(self.reduction in REDUCTIONS, "reduction", self.reduction, f"one of {', '.join(REDUCTIONS)}")
        ch = self.reduction_chunk
        if self.reduction == "none":
            _require(ch is None, "reduction_chunk", ch, "a chunk needs a reduction (fp32, bf16 or fp16)")
        else:
            _require(self.acc_dtype == "fp32", "reduction", self.reduction,
                     "split-K partials are modelled for fp32 accumulation")
            if ch is not None or self.reduction != "fp32":
                _require(isinstance(ch, int) and not isinstance(ch, bool) and ch > 0 and ch % self.tile.bk == 0,
                         "reduction_chunk", ch, f"k elements per split-K partial, a positive multiple of tile.bk "
                         f"({self.tile.bk}); required for a {self.reduction} reduction")
        _require(self.activation_impl in ACTIVATION_IMPLS, "activation_impl", self.activation_impl,
                 f"one of {', '.join(ACTIVATION_IMPLS)}")
        if self.activation_impl == "fast":
            _require(self.activation in ("gelu_tanh", "silu"), "activation_impl", "fast",
                     f"approximate implementations are modelled for gelu_tanh and silu, not {self.activation!r}")

    def _validate_epilogue(self) -> None:
        """The declared epilogue graph: its grammar (kernels_ref.epilogue_graph), and a step for every
        operation the problem has, with every step's operand present."""
        if self.epilogue is None:
            return
        if isinstance(self.epilogue, list):
            object.__setattr__(self, "epilogue", tuple(self.epilogue))
        try:
            nodes = epilogue_graph.parse(self.epilogue)
        except epilogue_graph.GraphError as e:
            raise SpecError(str(e)) from None
        steps = [n.step for n in nodes]
        has = {"scale": self.epilogue_scaled, "beta_c": self.beta != 0.0, "bias": self.bias != "none",
               "activation": self.activation != "none"}
        lacks = {"scale": "no epilogue scale (scale_a tensor or row, scale_b tensor or col)",
                 "beta_c": "beta = 0 (C is not read)", "bias": "bias = 'none'", "activation": "activation = 'none'"}
        for i, s in enumerate(steps):
            _require(has.get(s, True), f"epilogue[{i}]", self.epilogue[i],
                     f"the problem has {lacks.get(s)}: leave the step out or give the problem its operand")
        need = [("scale", ("scale",)), ("alpha", ("alpha", "alpha_beta")), ("beta_c", ("beta_c", "alpha_beta")),
                ("bias", ("bias",)), ("activation", ("activation",))]
        for op, covers in need:
            present = has[op] if op in has else self.alpha != 1.0
            _require(not present or any(c in steps for c in covers), "epilogue", list(self.epilogue),
                     f"the problem applies {op} ({_OP_WHY[op](self)}) but the graph has no {' or '.join(covers)} step")

    @property
    def epilogue_nodes(self) -> tuple[epilogue_graph.Node, ...]:
        """The epilogue's steps in order, each with the type its result is rounded to."""
        return epilogue_graph.DEFAULT_NODES if self.epilogue is None else epilogue_graph.parse(self.epilogue)

    @property
    def epilogue_scaled(self) -> bool:
        """Does the epilogue scale (a per-tensor, per-row or per-column scale; block scales act in the main loop)?"""
        return self.scale_a.kind in ("tensor", "row") or self.scale_b.kind in ("tensor", "col")

    # -- derived facts -----------------------------------------------------------------------
    @property
    def has_float_epilogue(self) -> bool:
        return (self.alpha != 1.0 or self.beta != 0.0 or self.bias != "none" or self.activation != "none"
                or self.scale_a.kind != "none" or self.scale_b.kind != "none")

    @property
    def resolved_acc_model(self) -> str:
        """acc_model, or what acc_dtype and promotion_interval mean without it."""
        if self.acc_model is not None:
            return self.acc_model
        if self.acc_dtype in ("fp16", "int32"):
            return self.acc_dtype
        return "fp8_promoted" if self.promotion_interval is not None else "fp32"

    @property
    def quant_op(self) -> Optional[str]:
        """The quantised operand: "a", "b" or None (oracle.problem.quant)."""
        return _quant.quant_operand(self)

    @property
    def quantised_b(self) -> bool:
        """Is B quantised (stored values, group scales, dequantised to A's dtype before the MMA)?"""
        return self.b_scales is not None

    @property
    def quantised_a(self) -> bool:
        """Is A quantised (stored values, group scales, dequantised to B's dtype before the MMA)?"""
        return self.a_scales is not None

    @property
    def mma_dtype(self) -> str:
        """The dtype the MMA reads both operands in where one is quantised (the other's), else a_dtype."""
        return self.b_dtype if self.quantised_a else self.a_dtype

    @property
    def mma_b_dtype(self) -> str:
        """The dtype the MMA reads B in: A's for a quantised B (after dequant_b), else b_dtype."""
        return self.a_dtype if self.quantised_b else self.b_dtype

    @property
    def quant_groups(self) -> int:
        """Scale groups along K of the quantised operand (1 without its group size)."""
        return self.k // self.group_k


    @property
    def group_k(self) -> int:
        """k elements per scale group of the quantised operand."""
        g = getattr(self, f"{self.quant_op}_group_size") if self.quant_op is not None else None
        return g if g is not None else self.k

    @property
    def dequant_config(self):
        """kernels_ref.dequant.DequantConfig of the quantised operand (None without one)."""
        return _quant.config(self)

    @property
    def resolved_dequant_precision(self) -> str:
        return self.dequant_precision or "fp32"

    @property
    def dequant_operands(self) -> tuple[str, ...]:
        """The operands with a dequant stage (harness.taps.pipeline)."""
        return (self.quant_op,) if self.quant_op is not None else ()

    @property
    def block_scaled(self) -> bool:
        return self.scale_a.kind == "block"

    @property
    def partitioned(self) -> bool:
        """Are a tile's k-blocks accumulated in partials (split-K or stream-K)?"""
        return self.splits > 1 or self.stream_k_workers is not None

    @property
    def group_sizes(self) -> Optional[tuple[int, ...]]:
        """Rows of D of every group of a grouped, batched or K-grouped problem (M_g; M each for a
        batch or K groups), None for a single GEMM."""
        if self.groups is not None:
            return self.groups
        if self.k_groups is not None:
            return (self.m,) * len(self.k_groups)
        return (self.m,) * self.batch if self.batch > 1 else None

    @property
    def total_m(self) -> int:
        """Rows of D and C: every group's or batch entry's rows one after the other (A has them too, but
        a K-grouped problem's A, which is [M, K]: a_rows)."""
        sizes = self.group_sizes
        return sum(sizes) if sizes is not None else self.m

    @property
    def a_rows(self) -> int:
        """Rows of A: total_m, but M for a K-grouped problem (its groups share A's rows)."""
        return self.m if self.k_groups is not None else self.total_m

    @property
    def k_offsets(self) -> Optional[tuple[int, ...]]:
        """Where each group of a K-grouped problem begins along K, with K at the end (G + 1 entries);
        None: not K-grouped."""
        if self.k_groups is None:
            return None
        out = [0]
        for v in self.k_groups:
            out.append(out[-1] + v)
        return tuple(out)

    @property
    def tiles_m(self) -> int:
        return -(-self.m // self.tile.bm)

    @property
    def tiles_n(self) -> int:
        return -(-self.n // self.tile.bn)

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.tile.bk)

    def smem_inner_elements(self, operand: str) -> int:
        """Elements along the contiguous dimension of one operand k-block tile in shared memory."""
        t = self.tile
        if operand == "a":
            return t.bk if self.a_major == "row" else t.bm
        return t.bn if self.b_major == "row" else t.bk

    def smem_inner_bytes(self, operand: str) -> int:
        """Bytes along the contiguous dimension of one operand k-block tile in shared memory (a packed B
        along K: half the elements)."""
        d = ALL_TYPES[getattr(self, f"{operand}_dtype")]
        inner = self.smem_inner_elements(operand)
        k_inner = (operand == "a" and self.a_major == "row") or (operand == "b" and self.b_major == "col")
        return inner // d.per_item * d.itemsize if k_inner else inner * d.itemsize

    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def describe(self) -> str:
        t = self.tile
        extra = f", model {self.acc_model}" if self.acc_model else ""
        if self.reduction != "none":
            extra += f", split-K {self.reduction}" + (f"/{self.reduction_chunk}" if self.reduction_chunk else "")
        if self.activation_impl != "accurate":
            extra += f", {self.activation_impl} {self.activation}"
        extra += _quant.describe(self)
        if self.epilogue is not None:
            extra += f", epilogue {' > '.join(self.epilogue)}"
        if self.k_groups is not None:
            shown_k = ", ".join(map(str, self.k_groups)) if len(self.k_groups) <= 8 else f"{len(self.k_groups)} groups"
            extra += f", K groups [{shown_k}]"
        return (f"{self.m}x{self.n}x{self.k} {self.a_dtype}x{self.b_dtype}->{self.out_dtype} "
                f"(acc {self.acc_dtype}{extra}, tile {t.bm}x{t.bn}x{t.bk})")

    # -- JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for s in ("scale_a", "scale_b"):
            if d[s]["block"] is not None:
                d[s]["block"] = list(d[s]["block"])
            if d[s]["major"] == "row":
                del d[s]["major"]  # absent: the default (a recording made before the field reads the same)
            if d[s]["dtype"] == "fp32":
                del d[s]["dtype"]
        if d["groups"] is not None:
            d["groups"] = list(d["groups"])
        if d["k_groups"] is None:
            del d["k_groups"]  # absent: not K-grouped (a recording made before the field reads the same)
        else:
            d["k_groups"] = list(d["k_groups"])
        if d["epilogue"] is None:
            del d["epilogue"]  # absent: the default graph (a recording made before the field reads the same)
        else:
            d["epilogue"] = list(d["epilogue"])
        for f in ("a_packing", "a_group_size", "a_scales", "b_packing", "b_group_size", "b_scales",
                  "dequant_precision"):
            if d[f] is None:
                del d[f]  # absent: not a quantised operand (a recording made before the fields reads the same)
        for f in ("a_zeros", "b_zeros"):
            if d[f] == "none":
                del d[f]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProblemSpec":
        kw = _known_fields(cls, d, "problem")
        if isinstance(kw.get("groups"), list):
            _require(len(kw["groups"]) <= MAX_GROUPS, "groups", _count_of(kw["groups"]),
                     f"a non-empty list of at most {MAX_GROUPS} group sizes along M")
            kw["groups"] = tuple(kw["groups"])
        if isinstance(kw.get("k_groups"), list):
            _require(len(kw["k_groups"]) <= MAX_GROUPS, "k_groups", _count_of(kw["k_groups"]),
                     f"a non-empty list of at most {MAX_GROUPS} group sizes along K")
            kw["k_groups"] = tuple(kw["k_groups"])
        if isinstance(kw.get("epilogue"), list):
            kw["epilogue"] = tuple(kw["epilogue"])
        if "tile" in kw:
            kw["tile"] = _sub(Tile, kw["tile"], "tile")
        for s in ("scale_a", "scale_b"):
            if s in kw:
                sd = kw[s]
                if isinstance(sd, Mapping) and isinstance(sd.get("block"), list):
                    sd = dict(sd, block=tuple(sd["block"]))
                kw[s] = _sub(Scale, sd, s)
        return _built(cls, kw, "problem")


def check_selection(spec: ProblemSpec, plan) -> None:
    """A [trace] selection against a GEMM problem: traced tiles inside its tile grid, traced k-blocks
    inside its K. `plan` is the case's TracePlan; raises ValueError naming the first outside."""
    check_traced_range(plan, (spec.tiles_m, spec.tiles_n), spec.k_blocks,
                       f"the {spec.tiles_m} x {spec.tiles_n} tile grid of {spec.describe()}; tiles are "
                       f"0..{spec.tiles_m - 1}, 0..{spec.tiles_n - 1}",
                       f"is outside 0..{spec.k_blocks - 1} (K = {spec.k} in k-blocks of {spec.tile.bk})")
    sizes = spec.group_sizes
    check_traced_groups(plan, None if sizes is None else len(sizes),
                        "batch entries" if spec.batch > 1 else "groups")


def check_traced_groups(plan, count: Optional[int], what: str) -> None:
    """Every traced group of `plan` (a grouped GEMM's group, a batch entry) below `count`; else a
    ValueError naming it (count None: a problem of one GEMM, none to select)."""
    for g in getattr(plan, "groups", None) or ():
        if count is None:
            raise ValueError(f"trace groups = {list(plan.groups)}: the problem is one GEMM, with no groups or batch "
                             f"entries to select; leave groups out")
        if g >= count:
            raise ValueError(f"trace group {g} is outside the problem's {count} {what} (0..{count - 1})")


def check_traced_range(plan, grid: tuple[int, int], depth: int, grid_is: str, depth_is: str) -> None:
    """Every traced tile of `plan` inside the grid[0] x grid[1] tiles and every traced k-block below
    `depth`, as GEMM and attention problems number them; else a ValueError naming the first outside,
    "trace tile (tm, tn) is outside `grid_is`" or "trace k-block kb `depth_is`"."""
    for tm, tn in plan.tiles or ():
        if tm >= grid[0] or tn >= grid[1]:
            raise ValueError(f"trace tile ({tm}, {tn}) is outside {grid_is}")
    for kb in plan.k_blocks or ():
        if kb >= depth:
            raise ValueError(f"trace k-block {kb} {depth_is}")


_OP_WHY = {"scale": lambda s: f"scale_a {s.scale_a.kind}, scale_b {s.scale_b.kind}",
           "alpha": lambda s: f"alpha = {s.alpha!r}", "beta_c": lambda s: f"beta = {s.beta!r}",
           "bias": lambda s: f"bias = {s.bias!r}", "activation": lambda s: f"activation = {s.activation!r}"}


def _layout_unchecked(scale: Scale):
    """kernels_ref.scales.ScaleLayout of a block Scale, built without its own check (the spec's
    check names the operand)."""
    from kernels_ref.scales import ScaleLayout

    lay = object.__new__(ScaleLayout)
    for f, v in (("block", scale.block), ("dtype", scale.dtype), ("major", scale.major)):
        object.__setattr__(lay, f, v)
    return lay


def _sub(cls, v: Any, field: str):
    if isinstance(v, cls):
        return v
    if isinstance(v, (list, tuple)) and cls is Tile:
        if len(v) != 3:
            raise SpecError(f"tile={list(v)!r} is not allowed: give three sizes [bm, bn, bk]")
        return Tile(*v)
    return _built(cls, _known_fields(cls, v, field), field)


def _known_fields(cls, d: Any, what: str) -> dict:
    """`d` (read from JSON or TOML) as keyword arguments of the frozen spec `cls`: a SpecError naming
    `what` unless it is an object whose keys are all fields of `cls`."""
    if not isinstance(d, Mapping):
        raise SpecError(f"{what} must be an object, got {type(d).__name__} {shown(d)}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise SpecError(f"unknown {what} field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return dict(d)


def _built(cls, kw: dict, what: str):
    """cls(**kw); a required field left out is a SpecError naming `what`."""
    try:
        return cls(**kw)
    except TypeError as e:
        raise SpecError(f"{what}: {e}") from None

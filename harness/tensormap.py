"""TMA tensor maps: a validated description (TensorMapSpec), its encoding by the driver, and the
standard GEMM operand maps.

Data path: TensorMapSpec (checked on the host against the rules below) -> encode(spec, address)
-> cuTensorMapEncodeTiled -> 128 opaque bytes, passed by value to a `__grid_constant__ const
CUtensorMap` kernel parameter. `to_descriptor_record` gives the same fields as the trace's
descriptor stage sees them.

Constraints (the rules of cuTensorMapEncodeTiled, each named; `RULES` lists them):
dimensions and strides are innermost first, strides in bytes without the innermost one; the
encoding is opaque, so only the driver can produce it, but every rule the driver enforces is also
checked here in pure Python, so a bad map is caught without a GPU. fp8 and int8 travel as UINT8 (the
map moves bytes); a NaN out-of-bounds fill is therefore only allowed for fp32/fp16/bf16 maps. Only
non-interleaved tiled maps are supported.

GEMM operand convention (`operand_tensormap`): A is logical (M, K), B is logical (K, N). The
contiguous logical dimension is the map's dimension 0. The box's inner extent is at most the
swizzle span (128B swizzle: 128 bytes = 64 bf16 or 128 fp8 elements), so a tile whose contiguous
extent is wider is loaded with several boxes side by side (`inner_boxes`), each landing in its own
swizzle atom column of shared memory -- the way CUTLASS and DeepGEMM kernels issue their loads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

from harness.errors import BadInput
from kernels_ref.dtypes import ELEMENT_TYPES

# name -> (itemsize, CUtensorMapDataType value, is a floating-point map type), from the one dtype table
MAP_DTYPES: dict[str, tuple[int, int, bool]] = {k: (d.itemsize, d.map_type, d.map_is_float)
                                                for k, d in ELEMENT_TYPES.items()}
SWIZZLE_ENUM = {0: 0, 32: 1, 64: 2, 128: 3}
L2_PROMOTION_ENUM = {0: 0, 64: 1, 128: 2, 256: 3}
OOB_FILL_ENUM = {"zero": 0, "nan": 1}
INTERLEAVE_ENUM = {"none": 0}

MAX_RANK = 5
MAX_GLOBAL_DIM = 2**32
MAX_STRIDE = 2**40  # exclusive
MAX_BOX_DIM = 256
MIN_RANK = 2
MAX_ELEMENT_STRIDE = 8
ADDRESS_ALIGNMENT = 16
STRIDE_MULTIPLE = 16

RULES: dict[str, str] = {
    "dtype": f"dtype is one of {', '.join(MAP_DTYPES)}",
    "rank": f"rank (number of global dims) is {MIN_RANK}..{MAX_RANK} (the H200's driver refused every "
            f"rank-1 map in a 600-map sweep, so they are refused here too)",
    "field_count": "global_strides has rank-1 entries; box_dims and element_strides have rank entries",
    "integer": "every dim, stride, box and element stride is an int",
    "global_dim_range": "every global dim is 1..2^32",
    "stride_multiple_16": f"every global stride (bytes) is a multiple of {STRIDE_MULTIPLE}",
    "stride_max": "every global stride (bytes) is below 2^40",
    "box_dim_range": f"every box dim is 1..{MAX_BOX_DIM}",
    "box_inner_bytes_multiple_16": "box_dims[0] * itemsize is a multiple of 16 bytes",
    "box_inner_within_swizzle": "with a swizzle, box_dims[0] * itemsize is at most the swizzle span",
    "element_stride_range": f"every element stride is 1..{MAX_ELEMENT_STRIDE}",
    "swizzle": "swizzle is 0, 32, 64 or 128 (bytes)",
    "oob_fill": "oob_fill is 'zero' or 'nan'",
    "oob_nan_needs_float": "oob_fill 'nan' needs a floating-point map type (fp32, fp16, bf16; not fp8 or ints)",
    "interleave": "interleave is 'none' (interleaved maps are not supported)",
    "l2_promotion": "l2_promotion is 0, 64, 128 or 256 (bytes)",
    "global_address_alignment": f"the global address is {ADDRESS_ALIGNMENT}-byte aligned (checked at encode)",
    "driver": "the driver accepted the map (a rejection here means a rule missing above)",
}


class TensorMapError(BadInput, ValueError):
    """A tensor map breaks one or more rules; `rules` names them (keys of RULES), first one first."""

    def __init__(self, problems: Sequence[tuple[str, str]]):
        self.rules = tuple(r for r, _ in problems)
        self.rule = self.rules[0]
        self.problems = tuple(problems)
        super().__init__("; ".join(f"[{r}] {m}" for r, m in problems))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def tensormap_problems(dtype: str, global_dims: Sequence[int], global_strides: Sequence[int],
                       box_dims: Sequence[int], element_strides: Sequence[int], swizzle: int = 0,
                       oob_fill: str = "zero", interleave: str = "none",
                       l2_promotion: int = 0) -> list[tuple[str, str]]:
    """Every rule the fields break, as (rule, message) pairs; [] when the map is encodable."""
    p: list[tuple[str, str]] = []
    if dtype not in MAP_DTYPES:
        p.append(("dtype", f"dtype {dtype!r} has no tensor-map type; allowed: {', '.join(MAP_DTYPES)}"))
    rank = len(global_dims)
    if not MIN_RANK <= rank <= MAX_RANK:
        p.append(("rank", f"global_dims has rank {rank}; allowed {MIN_RANK}..{MAX_RANK}"))
    if len(global_strides) != max(rank - 1, 0):
        p.append(("field_count", f"global_strides has {len(global_strides)} entries for rank {rank}; "
                                 f"expected {max(rank - 1, 0)} (the innermost stride is the element size)"))
    for name, seq in (("box_dims", box_dims), ("element_strides", element_strides)):
        if len(seq) != rank:
            p.append(("field_count", f"{name} has {len(seq)} entries for rank {rank}; expected {rank}"))
    for name, seq in (("global_dims", global_dims), ("global_strides", global_strides),
                      ("box_dims", box_dims), ("element_strides", element_strides)):
        bad = [v for v in seq if not _is_int(v)]
        if bad:
            p.append(("integer", f"{name} holds non-integers {bad!r}"))
    if any(r == "integer" for r, _ in p):
        return p
    for i, d in enumerate(global_dims):
        if not 1 <= d <= MAX_GLOBAL_DIM:
            p.append(("global_dim_range", f"global_dims[{i}] = {d}; allowed 1..2^32"))
    for i, s in enumerate(global_strides):
        if s % STRIDE_MULTIPLE != 0:
            p.append(("stride_multiple_16", f"global_strides[{i}] = {s} bytes is not a multiple of "
                                            f"{STRIDE_MULTIPLE}"))
        if not 0 <= s < MAX_STRIDE:
            p.append(("stride_max", f"global_strides[{i}] = {s} bytes; allowed 0 <= stride < 2^40"))
    for i, b in enumerate(box_dims):
        if not 1 <= b <= MAX_BOX_DIM:
            p.append(("box_dim_range", f"box_dims[{i}] = {b}; allowed 1..{MAX_BOX_DIM}"))
    for i, e in enumerate(element_strides):
        if not 1 <= e <= MAX_ELEMENT_STRIDE:
            p.append(("element_stride_range", f"element_strides[{i}] = {e}; allowed 1..{MAX_ELEMENT_STRIDE}"))
    if swizzle not in SWIZZLE_ENUM:
        p.append(("swizzle", f"swizzle {swizzle!r}; allowed 0, 32, 64, 128 (bytes)"))
    if oob_fill not in OOB_FILL_ENUM:
        p.append(("oob_fill", f"oob_fill {oob_fill!r}; allowed 'zero', 'nan'"))
    if interleave not in INTERLEAVE_ENUM:
        p.append(("interleave", f"interleave {interleave!r}; only 'none' is supported"))
    if l2_promotion not in L2_PROMOTION_ENUM:
        p.append(("l2_promotion", f"l2_promotion {l2_promotion!r}; allowed 0, 64, 128, 256 (bytes)"))
    if dtype in MAP_DTYPES and box_dims:
        itemsize, _, is_float = MAP_DTYPES[dtype]
        inner = box_dims[0] * itemsize
        if inner % 16 != 0:
            p.append(("box_inner_bytes_multiple_16", f"box_dims[0] = {box_dims[0]} {dtype} elements = {inner} "
                                                     f"bytes is not a multiple of 16"))
        if swizzle in SWIZZLE_ENUM and swizzle and inner > swizzle:
            p.append(("box_inner_within_swizzle", f"box_dims[0] = {box_dims[0]} {dtype} elements = {inner} "
                                                  f"bytes is wider than the {swizzle}B swizzle span "
                                                  f"(at most {swizzle // itemsize} elements)"))
        if oob_fill == "nan" and not is_float:
            p.append(("oob_nan_needs_float", f"oob_fill 'nan' with dtype {dtype}, whose map type is "
                                             f"{'UINT8' if itemsize == 1 else 'an integer'}: NaN fill needs "
                                             f"fp32, fp16 or bf16"))
    return p


@dataclass(frozen=True)
class TensorMapSpec:
    """What cuTensorMapEncodeTiled is given (besides the address). Innermost dimension first."""

    dtype: str
    global_dims: tuple[int, ...]
    global_strides: tuple[int, ...]  # bytes, rank-1 entries (dimension 1 upward)
    box_dims: tuple[int, ...]
    element_strides: Optional[tuple[int, ...]] = None  # None: all ones
    swizzle: int = 0  # bytes: 0, 32, 64, 128
    oob_fill: str = "zero"  # "zero" or "nan"
    interleave: str = "none"
    l2_promotion: int = 256  # bytes: 0 (none), 64, 128, 256

    def __post_init__(self) -> None:
        for name in ("global_dims", "global_strides", "box_dims", "element_strides"):
            v = getattr(self, name)
            if v is None and name == "element_strides":
                v = (1,) * len(self.global_dims)
            if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
                raise TensorMapError([("integer", f"{name} must be a sequence of ints, got {v!r}")])
            object.__setattr__(self, name, tuple(v))
        problems = tensormap_problems(self.dtype, self.global_dims, self.global_strides, self.box_dims,
                                      self.element_strides, self.swizzle, self.oob_fill, self.interleave,
                                      self.l2_promotion)
        if problems:
            raise TensorMapError(problems)

    @property
    def rank(self) -> int:
        return len(self.global_dims)

    @property
    def itemsize(self) -> int:
        return MAP_DTYPES[self.dtype][0]

    @property
    def box_bytes(self) -> int:
        """Bytes one box load writes to shared memory (the mbarrier transaction count)."""
        n = 1
        for b, e in zip(self.box_dims, self.element_strides):
            n *= math.ceil(b / e)
        return n * self.itemsize

    @property
    def extent_bytes(self) -> int:
        """Bytes from the global address to one past the last element the map can address."""
        strides = (self.itemsize,) + self.global_strides
        return sum((d - 1) * s for d, s in zip(self.global_dims, strides)) + self.itemsize

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TensorMapSpec":
        return cls(**d)

    def to_descriptor_record(self, operand: str, source: str = "host"):
        """The fields as a harness.taps.DescriptorRecord for `operand` ("a" or "b"), made by the host."""
        from harness.taps import DescriptorRecord  # torch is imported there; keep it out of the child

        return DescriptorRecord(operand=operand, dtype=self.dtype, global_dims=self.global_dims,
                                global_strides=self.global_strides, box_dims=self.box_dims,
                                element_strides=self.element_strides, swizzle=self.swizzle,
                                oob_fill=self.oob_fill, source=source)

    def driver_args(self, global_address: int) -> dict:
        """The arguments of cuda_driver.encode_tensor_map_tiled, enums as ints."""
        return dict(data_type=MAP_DTYPES[self.dtype][1], global_address=int(global_address),
                    global_dims=self.global_dims, global_strides=self.global_strides,
                    box_dims=self.box_dims, element_strides=self.element_strides,
                    interleave=INTERLEAVE_ENUM[self.interleave], swizzle=SWIZZLE_ENUM[self.swizzle],
                    l2_promotion=L2_PROMOTION_ENUM[self.l2_promotion], oob_fill=OOB_FILL_ENUM[self.oob_fill])


def check_address(spec: TensorMapSpec, global_address: int) -> None:
    if int(global_address) % ADDRESS_ALIGNMENT != 0:
        raise TensorMapError([("global_address_alignment",
                               f"global address {int(global_address):#x} is not {ADDRESS_ALIGNMENT}-byte aligned "
                               f"(it is {int(global_address) % ADDRESS_ALIGNMENT} bytes past a boundary)")])


def encode(spec: TensorMapSpec, global_address: int) -> bytes:
    """The 128-byte CUtensorMap for `spec` at `global_address` (needs the CUDA driver, not a context).
    Raises TensorMapError for a misaligned address or a driver rejection, CudaError without a driver."""
    from harness import cuda_driver

    check_address(spec, global_address)
    try:
        return cuda_driver.encode_tensor_map_tiled(**spec.driver_args(global_address))
    except cuda_driver.CudaError as exc:
        if exc.code == cuda_driver.DRIVER_UNAVAILABLE:
            raise
        raise TensorMapError([("driver", f"cuTensorMapEncodeTiled rejected {spec} at {int(global_address):#x}: "
                                         f"{exc.name} ({exc.code})")]) from exc


# --------------------------------------------------------------------------- GEMM operands


def swizzle_span_elems(dtype: str, swizzle: int) -> int:
    """Elements of `dtype` in one swizzle row (the widest box inner extent allowed)."""
    if dtype not in MAP_DTYPES:
        raise TensorMapError([("dtype", f"dtype {dtype!r} has no tensor-map type; allowed: {', '.join(MAP_DTYPES)}")])
    if swizzle not in SWIZZLE_ENUM:
        raise TensorMapError([("swizzle", f"swizzle {swizzle!r}; allowed 0, 32, 64, 128 (bytes)")])
    return swizzle // MAP_DTYPES[dtype][0] if swizzle else 0


def operand_tensormap(operand: str, major: str, rows: int, cols: int, dtype: str, block_mn: int,
                      block_k: int, swizzle: int = 128, oob_fill: str = "zero", *, ld: Optional[int] = None,
                      l2_promotion: int = 256) -> TensorMapSpec:
    """The map a GEMM kernel builds for operand `a` (logical rows x cols = M x K, tile BM x BK) or
    `b` (logical K x N, tile BK x BN), stored row-major (cols contiguous) or col-major (rows
    contiguous) with leading dimension `ld` elements (default: the contiguous extent).

    Map dimension 0 is the contiguous logical dimension. The box is (inner, outer) with inner =
    the tile's contiguous extent capped at the swizzle span, outer = the tile's other extent:

    | operand, major | contiguous | dims          | box                               |
    |----------------|------------|---------------|-----------------------------------|
    | a, row (K-major)  | K       | (K, M)        | (min(BK, span), BM)               |
    | a, col (M-major)  | M       | (M, K)        | (min(BM, span), BK)               |
    | b, row (N-major)  | N       | (N, K)        | (min(BN, span), BK)               |
    | b, col (K-major)  | K       | (K, N)        | (min(BK, span), BN)               |

    Without swizzle the inner box is the whole contiguous tile extent.
    """
    if operand not in ("a", "b"):
        raise ValueError(f"operand {operand!r} must be 'a' or 'b'")
    if major not in ("row", "col"):
        raise ValueError(f"major {major!r} must be 'row' (cols contiguous) or 'col' (rows contiguous)")
    for name, v in (("rows", rows), ("cols", cols), ("block_mn", block_mn), ("block_k", block_k)):
        if not _is_int(v) or v < 1:
            raise ValueError(f"{name} = {v!r} must be a positive int")
    block_rows, block_cols = (block_mn, block_k) if operand == "a" else (block_k, block_mn)
    if major == "row":
        inner_extent, outer_extent, inner_block, outer_block = cols, rows, block_cols, block_rows
    else:
        inner_extent, outer_extent, inner_block, outer_block = rows, cols, block_rows, block_cols
    if ld is None:
        ld = inner_extent
    if not _is_int(ld) or ld < inner_extent:
        raise ValueError(f"ld = {ld!r} must be an int >= the contiguous extent {inner_extent}")
    span = swizzle_span_elems(dtype, swizzle)
    inner_box = min(inner_block, span) if span else inner_block
    if inner_block % inner_box != 0:
        raise ValueError(f"the tile's contiguous extent {inner_block} is not a multiple of the box's inner "
                         f"extent {inner_box} (the {swizzle}B swizzle span in {dtype})")
    return TensorMapSpec(dtype=dtype, global_dims=(inner_extent, outer_extent),
                         global_strides=(ld * MAP_DTYPES[dtype][0],), box_dims=(inner_box, outer_block),
                         swizzle=swizzle, oob_fill=oob_fill, l2_promotion=l2_promotion)


def mn_dim(operand: str, major: str) -> int:
    """The dimension of `operand_tensormap`'s map that runs along M (A) or N (B): 1 when K is
    contiguous (A row-major, B col-major), else 0."""
    return 1 if (operand == "a") == (major == "row") else 0


def inner_boxes(spec: TensorMapSpec, tile_inner_extent: int) -> int:
    """How many boxes side by side load a tile whose contiguous extent is `tile_inner_extent`."""
    if tile_inner_extent % spec.box_dims[0] != 0:
        raise ValueError(f"tile extent {tile_inner_extent} is not a multiple of the box's inner extent "
                         f"{spec.box_dims[0]}")
    return tile_inner_extent // spec.box_dims[0]


def swizzle_offset(byte_offset: int, swizzle: int) -> int:
    """Where byte `byte_offset` of a linear (unswizzled) box lands in a 1024-byte-aligned shared tile:
    a ^ (((a >> 7) & M) << 4) with M = 7, 3, 1 for 128B, 64B, 32B swizzle (CuTe Swizzle<3,4,3> etc.)."""
    mask = {0: 0, 32: 1, 64: 3, 128: 7}[swizzle]
    return byte_offset ^ (((byte_offset >> 7) & mask) << 4)

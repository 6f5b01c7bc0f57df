"""Element types, by short name: the one table every layer reads.

Each row: the torch dtype, the unit roundoff of the format (half an ulp at 1.0), the largest
finite value, the MMA instruction depth (k elements one tensor-core instruction sums), the
quiet-NaN bit pattern a TMA "nan" fill writes, and the codes the other layers use for it: the
reference kernels' constexpr code, the trace format's wire code, the CUtensorMapDataType a tensor
map moves it as, the safetensors name and the launch library's element type (oracle_trace/launch.hpp).
`DTYPES` holds the element types of operands and outputs; `ELEMENT_TYPES` adds raw bytes (`uint8`:
scale factors, packed data), which only move. `QUANT_TYPES` holds the types a quantised operand and its
scales are stored in that no MMA reads directly (oracle.problem.spec b_dtype, b_scales): 4-bit integers
and e2m1, packed two to a byte, and e8m0 scales.

`itemsize` is the bytes of one storage element: the torch dtype the tensor is held in. `bits` is the
width of one value; a packed row (bits 4) holds `per_item` = 2 values in each storage byte, so its
torch dtype is uint8 and a tensor of n values along the packed axis has n / 2 bytes there (which
nibble holds which value is the operand's packing, oracle.problem.quant.PACKINGS). e8m0 is held as
its raw byte (the biased exponent; 255 is NaN), as the safetensors this project reads cannot hold
torch.float8_e8m0fnu.
A new element type is one row here. Imports nothing at load (torch on first use of `.torch`),
so every layer can read it, the harness's child process too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# CUtensorMapDataType values (cuda.h)
_MAP_UINT8, _MAP_INT32, _MAP_FLOAT16, _MAP_FLOAT32, _MAP_BFLOAT16 = 0, 3, 6, 7, 9


@dataclass(frozen=True)
class DType:
    name: str
    torch_name: str  # the attribute of the torch module: "float32", "float8_e4m3fn", ...
    itemsize: int  # bytes per element
    unit_roundoff: float  # 0 for integers
    max_finite: float
    mma_k: int  # k depth of one MMA instruction for this operand type
    is_float: bool = True
    nan_bits: Optional[int] = None  # the quiet NaN a TMA "nan" fill writes; None: no NaN
    ref_code: Optional[int] = None  # constexpr code of the reference kernels' codec (kernels_ref._codec)
    trace_code: int = 0  # the trace format's dtype code (harness.trace_format; 0: not traced)
    map_type: int = _MAP_UINT8  # the CUtensorMapDataType a tensor map moves it as
    map_is_float: bool = False  # whether that map type is a floating-point one
    safetensors: str = ""  # the safetensors dtype name
    launch_code: int = 0  # the launch library's ElementType (harness/include/oracle_trace/launch.hpp)
    bits: int = 0  # bits of one value; 0: 8 * itemsize (unpacked)
    min_value: float = 0.0  # the lowest finite value (0 here: -max_finite for a float, 0 for an unsigned type)

    @property
    def value_bits(self) -> int:
        return self.bits or 8 * self.itemsize

    @property
    def per_item(self) -> int:
        """Values in one storage element: 2 for a packed 4-bit type, else 1."""
        return 8 * self.itemsize // self.value_bits

    @property
    def lowest(self) -> float:
        """The most negative finite value."""
        if self.min_value:
            return self.min_value
        return -self.max_finite if self.is_float else 0.0

    @property
    def torch(self):
        import torch

        return getattr(torch, self.torch_name)


ELEMENT_TYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", "float32", 4, 2.0**-24, 3.4028234663852886e38, 8, nan_bits=0x7FC00000, ref_code=0,
              trace_code=1, map_type=_MAP_FLOAT32, map_is_float=True, safetensors="F32", launch_code=1),
        DType("fp16", "float16", 2, 2.0**-11, 65504.0, 16, nan_bits=0x7E00, ref_code=1, trace_code=2,
              map_type=_MAP_FLOAT16, map_is_float=True, safetensors="F16", launch_code=2),
        DType("bf16", "bfloat16", 2, 2.0**-8, 3.3895313892515355e38, 16, nan_bits=0x7FC0, ref_code=2, trace_code=3,
              map_type=_MAP_BFLOAT16, map_is_float=True, safetensors="BF16", launch_code=3),
        # no fp8 tensor-map type on sm_90: the map moves bytes
        DType("e4m3", "float8_e4m3fn", 1, 2.0**-4, 448.0, 32, nan_bits=0x7F, ref_code=3, trace_code=4,
              safetensors="F8_E4M3", launch_code=4),
        DType("e5m2", "float8_e5m2", 1, 2.0**-3, 57344.0, 32, nan_bits=0x7E, ref_code=4, trace_code=5,
              safetensors="F8_E5M2", launch_code=5),
        DType("int8", "int8", 1, 0.0, 127.0, 32, is_float=False, ref_code=5, trace_code=6, safetensors="I8", launch_code=6,
              min_value=-128.0),
        DType("int32", "int32", 4, 0.0, float(2**31 - 1), 8, is_float=False, ref_code=6, trace_code=7,
              map_type=_MAP_INT32, safetensors="I32", launch_code=7, min_value=-float(2**31)),
        DType("uint8", "uint8", 1, 0.0, 255.0, 0, is_float=False, trace_code=8, safetensors="U8",
              launch_code=8),  # raw bytes: moved only (traced: a packed operand's bytes)
    )
}
# stored types of quantised operands and their scales: held in uint8 bytes, decoded by kernels_ref.dequant
QUANT_TYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("int4", "uint8", 1, 0.0, 7.0, 0, is_float=False, safetensors="U8", bits=4, min_value=-8.0),
        DType("uint4", "uint8", 1, 0.0, 15.0, 0, is_float=False, safetensors="U8", bits=4),
        DType("fp4_e2m1", "uint8", 1, 2.0**-2, 6.0, 0, safetensors="U8", bits=4),
        DType("e8m0", "uint8", 1, 2.0**-1, 2.0**127, 0, nan_bits=0xFF, safetensors="U8", min_value=2.0**-127),
    )
}
ALL_TYPES: dict[str, DType] = {**ELEMENT_TYPES, **QUANT_TYPES}
# the element types of operands and outputs (those the reference kernels compute with)
DTYPES: dict[str, DType] = {k: d for k, d in ELEMENT_TYPES.items() if d.ref_code is not None}
FLOAT_NAMES = tuple(k for k, d in DTYPES.items() if d.is_float)
FP8 = ("e4m3", "e5m2")
PACKED = tuple(k for k, d in QUANT_TYPES.items() if d.per_item > 1)  # int4, uint4, fp4_e2m1
# a quantised operand beside a float one (a W4A16 / W8A16 problem, its B or, swapped, its A), and the
# types its scales may have
QUANT_B = ("int4", "uint4", "fp4_e2m1", "int8", "e4m3", "e5m2")
SCALE_TYPES = ("fp16", "bf16", "fp32", "e4m3", "e8m0")


def dtype(name: str) -> DType:
    """Look a dtype up by short name; the error lists what exists."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def lookup(name: str) -> DType:
    """Any row by short name (operand, raw, quantised or scale type); the error lists what exists."""
    try:
        return ALL_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown element type {name!r}; known: {', '.join(ALL_TYPES)}") from None


def name_of(t) -> str:
    """The short name of a torch dtype."""
    for d in DTYPES.values():
        if d.torch == t:
            return d.name
    raise ValueError(f"torch dtype {t} has no short name; known: {', '.join(DTYPES)}")

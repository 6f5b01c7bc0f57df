"""The trace format's numbers: magic, version, sizes, stage and dtype codes, the struct layouts of the
sink header and of every record kind, and the errors a malformed trace raises. Mirrored in
harness/include/oracle_trace/trace.cuh (tests/cpu/test_trace_constants.py checks they agree);
specified in docs/trace-format.md."""

from __future__ import annotations

import enum
import struct
from typing import Optional

import numpy as np
import torch

from harness.errors import BadInput
from harness.taps import ALL_TAP_STAGES
from kernels_ref.dtypes import ELEMENT_TYPES


MAGIC = 0x4352544F  # bytes b"OTRC"
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
HEADER_BYTES = 576  # version 3's; versions 1 and 2 had 512 (HEADER_BYTES_OF_VERSION)
HEADER_BYTES_OF_VERSION = {1: 512, 2: 512, 3: HEADER_BYTES}
MAX_TILES = 32
MAX_GROUPS = 4  # group (batch entry) selectors in the header
KBLOCK_WINDOW = 1024
FLAG_ALL_K_BLOCKS = 1
KNOWN_FLAGS = FLAG_ALL_K_BLOCKS
COMMIT_TAG = 0xC0DE
RECORD_HEAD_BYTES = 48
STAGE_COUNTERS = 32  # dropped_by_stage[] entries in the header, indexed by stage code (version 3)
STAGE_COUNTERS_OF_VERSION = {1: 0, 2: 16, 3: STAGE_COUNTERS}
RECORD_ALIGN = 8
MAX_TILE_DIM = 65535
NONE = -1  # no k-block / no slot / any tile
INT32_MAX = 2**31 - 1

STAGE_CODES: dict[str, int] = {
    "descriptor_a": 1,
    "descriptor_b": 2,
    "load_a": 3,
    "load_b": 4,
    "mma": 5,
    "epilogue_scale": 6,
    "epilogue_alpha_beta": 7,
    "epilogue_bias": 8,
    "epilogue_activation": 9,
    "epilogue_cast": 10,
    "reduce": 11,  # after epilogue_cast in code, between mma and the epilogue in pipeline order
    "epilogue_alpha": 12,  # a declared epilogue's split steps (harness.taps.SPLIT_EPILOGUE_STAGES): codes
    "epilogue_beta_c": 13,  # added without a version change, as no older trace holds them
    "dequant_a": 14,  # a quantised operand's dequantised tile: between load and mma in pipeline order,
    "dequant_b": 15,  # added without a version change, as no older trace holds them
    # attention (harness.taps.ATTENTION_TAP_STAGES), from version 3, in pipeline order
    "load_q": 16,
    "load_k": 17,
    "load_v": 18,
    "s": 19,
    "mask": 20,
    "softmax_state": 21,
    "p": 22,
    "o": 23,
    "normalize": 24,
    "combine": 25,
    # the block scales a k-block applied (harness.taps.SCALE_STAGES): between load / dequant and mma in pipeline
    # order, added without a version change, as no older trace holds them
    "scale_a": 26,
    "scale_b": 27,
}
STAGE_NAMES: dict[int, str] = {v: k for k, v in STAGE_CODES.items()}
if set(STAGE_CODES) != set(ALL_TAP_STAGES):  # one code for every stage a kernel can tap
    raise ImportError(f"trace stage codes {tuple(STAGE_CODES)} do not cover ALL_TAP_STAGES {ALL_TAP_STAGES}")
# the highest stage code a trace of each version may hold (versions 1 and 2: the GEMM codes 1..15)
MAX_STAGE_CODE_OF_VERSION = {1: 15, 2: 15, 3: 31}
ALL_STAGES_MASK = sum(1 << c for c in STAGE_CODES.values())
# the stage_mask bits a header of each version may set
STAGES_MASK_OF_VERSION = {v: sum(1 << c for c in STAGE_CODES.values() if c <= top)
                          for v, top in MAX_STAGE_CODE_OF_VERSION.items()}
assert max(STAGE_CODES.values()) < min(STAGE_COUNTERS, 32)  # every code has a counter and a stage_mask bit

# from the one dtype table (kernels_ref.dtypes)
DTYPE_CODES: dict[str, int] = {k: d.trace_code for k, d in ELEMENT_TYPES.items() if d.trace_code}
DTYPE_NAMES: dict[int, str] = {v: k for k, v in DTYPE_CODES.items()}
DTYPE_TORCH: dict[str, torch.dtype] = {k: ELEMENT_TYPES[k].torch for k in DTYPE_CODES}
DTYPE_SIZE: dict[str, int] = {k: ELEMENT_TYPES[k].itemsize for k in DTYPE_CODES}
# numpy types that hold the raw bits of each element size
_BITS = {1: np.uint8, 2: np.int16, 4: np.int32}
_TORCH_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


class RecordKind(enum.IntEnum):
    ELEMENTS = 1
    BLOCK = 2
    BYTES = 3
    DESCRIPTOR = 4
    PAD = 5


OPERAND_CODES = {"a": 0, "b": 1}
OOB_FILL_CODES = {"zero": 0, "nan": 1}
SWIZZLE_BYTES = (0, 32, 64, 128)

# Struct layouts, little-endian, with the field offsets the header's static_asserts pin.
HEADER_FIXED = struct.Struct("<IHHQQIIIIiI")  # first 48 bytes of the sink header
HEADER_OFFSETS = {
    "magic": 0, "version": 4, "header_bytes": 6, "capacity": 8, "cursor": 16, "dropped": 24,
    "flags": 28, "stage_mask": 32, "n_tiles": 36, "kb_base": 40, "n_groups": 44, "groups": 48, "tiles": 64, "kb_bits": 320,
    "dropped_by_stage": 448,
}
TILE_SELECTOR = struct.Struct("<ii")
GROUP_SELECTORS = struct.Struct(f"<{MAX_GROUPS}i")
RECORD_HEAD = struct.Struct("<IHHBBHIIiiiiHHii")
RECORD_HEAD_V1 = struct.Struct("<IHHBBHIIiiiiHH")  # version 1: no partial, no group
RECORD_HEAD_OFFSETS = {
    "size": 0, "kind": 4, "commit": 6, "stage": 8, "dtype": 9, "thread": 12, "cta": 16, "tile_m": 20,
    "tile_n": 24, "k_block": 28, "slot": 32, "shape_rows": 36, "shape_cols": 38, "partial": 40, "group": 44,
}
HEAD_BYTES_OF_VERSION = {1: RECORD_HEAD_V1.size, 2: RECORD_HEAD.size, 3: RECORD_HEAD.size}
ELEMENTS_BODY = struct.Struct("<II")  # count, reserved; then u32 coords[count], values
BLOCK_BODY = struct.Struct("<HHHH")  # row0, col0, rows, cols; then values row-major
BYTES_BODY = struct.Struct("<IIII")  # offset, nbytes, total_bytes, reserved; then data
DESCRIPTOR_BODY = struct.Struct("<BBHB3x5Q4Q5I5I")
DESCRIPTOR_BODY_OFFSETS = {"dims": 8, "strides": 48, "box": 80, "element_strides": 100}
STRUCT_SIZES = {
    "SinkHeader": HEADER_BYTES, "TileSelector": TILE_SELECTOR.size, "RecordHead": RECORD_HEAD.size,
    "ElementsBody": ELEMENTS_BODY.size, "BlockBody": BLOCK_BODY.size, "BytesBody": BYTES_BODY.size,
    "DescriptorBody": DESCRIPTOR_BODY.size,
}
_TILES_OFFSET = HEADER_OFFSETS["tiles"]
_KB_BITS_OFFSET = HEADER_OFFSETS["kb_bits"]
_DROPPED_BY_STAGE = struct.Struct(f"<{STAGE_COUNTERS}I")
_DROPPED_BY_STAGE_OF_VERSION = {v: struct.Struct(f"<{n}I") for v, n in STAGE_COUNTERS_OF_VERSION.items() if n}
assert HEADER_FIXED.size == 48 and RECORD_HEAD.size == RECORD_HEAD_BYTES and DESCRIPTOR_BODY.size == 120
assert all(HEADER_OFFSETS["dropped_by_stage"] + c.size == HEADER_BYTES_OF_VERSION[v]
           for v, c in _DROPPED_BY_STAGE_OF_VERSION.items())

# A tap is assembled dense (values and a mask over its whole tile) from its records; a record may
# cover a few elements of it. A claim is refused when the dense tap would pass both this floor
# (a 512 x 512 fp32 tile takes 1.25 MiB) and this many times the bytes its records carry.
TAP_DENSE_FLOOR_BYTES = 4 << 20
TAP_SPARSE_RATIO = 64


def _round_up(x: int, a: int = RECORD_ALIGN) -> int:
    return (x + a - 1) // a * a


class TraceFormatError(BadInput, ValueError):
    """A trace buffer that does not follow the format; `offset` is the byte offset, if known."""

    def __init__(self, message: str, offset: Optional[int] = None) -> None:
        self.offset = offset
        where = "" if offset is None else f" (at byte offset {offset})"
        super().__init__(message + where)


class TraceHeaderError(TraceFormatError):
    """Wrong magic, version, header size, capacity or selection fields."""


class TraceTruncatedError(TraceFormatError):
    """The buffer ends before the header or before the records the cursor announces."""


class TraceRecordError(TraceFormatError):
    """A record with a bad size, an uncommitted record, or bytes past the cursor."""


class TraceCodeError(TraceFormatError):
    """An unknown record kind, stage or dtype code, or a kind not allowed for its stage."""


class TraceCoordinateError(TraceFormatError):
    """A record shape that does not match the block sizes, or an element outside its tile."""


class TraceConflictError(TraceFormatError):
    """Records of one tap that disagree: values of the same element, dtype, image size."""


class TraceLimitError(TraceFormatError):
    """A trace whose taps would take more memory than the limit allows (ORACLE_TRACE_MAX_TAPS_MB)."""

"""The binary trace of `oracle_trace/trace.cuh`: constants, the sink header, a strict parser, an encoder.

Data path: the host builds the sink with `sink_init_bytes` (header with the selection of stages,
tiles and k-blocks, then a zeroed record area), points the kernel's `oracle_trace_sink` symbol at
it, launches, copies it back and calls `parse_trace`, which returns `harness.taps.Tap` and
`DescriptorRecord` objects. `TraceWriter` produces the same bytes in pure Python, so the parser
and everything downstream can be tested without a GPU.

Constraints: little-endian; format version 2 is written, versions 1 and 2 are read (version 1 has
40-byte record heads without partial and group, and no per-stage drop counts); tiles up to
65535 x 65535 elements; the k-block selection is a 1024-wide window. Every malformed input raises a `TraceFormatError`
subclass whose message names the field, the value and the byte offset. The format itself is
specified in docs/trace-format.md; tests/cpu/test_trace_constants.py checks that the numbers
here agree with the header.
"""

from __future__ import annotations

import enum
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import torch

from harness import knobs as _knobs
from harness.taps import DESCRIPTOR_STAGES, LOAD_STAGES, TAP_STAGES, DescriptorRecord, Tap, TapError
from kernels_ref.dtypes import ELEMENT_TYPES

# --------------------------------------------------------------------------------------------
# Constants (mirrored in harness/include/oracle_trace/trace.cuh)
# --------------------------------------------------------------------------------------------

MAGIC = 0x4352544F  # bytes b"OTRC"
VERSION = 2
READABLE_VERSIONS = (1, 2)
HEADER_BYTES = 512
MAX_TILES = 32
KBLOCK_WINDOW = 1024
FLAG_ALL_K_BLOCKS = 1
KNOWN_FLAGS = FLAG_ALL_K_BLOCKS
COMMIT_TAG = 0xC0DE
RECORD_HEAD_BYTES = 48
STAGE_COUNTERS = 16  # dropped_by_stage[] entries in the header, indexed by stage code
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
}
STAGE_NAMES: dict[int, str] = {v: k for k, v in STAGE_CODES.items()}
if set(STAGE_CODES) != set(TAP_STAGES):  # one code for every stage a kernel can tap
    raise ImportError(f"trace stage codes {tuple(STAGE_CODES)} do not cover TAP_STAGES {TAP_STAGES}")
ALL_STAGES_MASK = sum(1 << c for c in STAGE_CODES.values())

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
    "flags": 28, "stage_mask": 32, "n_tiles": 36, "kb_base": 40, "tiles": 64, "kb_bits": 320,
    "dropped_by_stage": 448,
}
TILE_SELECTOR = struct.Struct("<ii")
RECORD_HEAD = struct.Struct("<IHHBBHIIiiiiHHii")
RECORD_HEAD_V1 = struct.Struct("<IHHBBHIIiiiiHH")  # version 1: no partial, no group
RECORD_HEAD_OFFSETS = {
    "size": 0, "kind": 4, "commit": 6, "stage": 8, "dtype": 9, "thread": 12, "cta": 16, "tile_m": 20,
    "tile_n": 24, "k_block": 28, "slot": 32, "shape_rows": 36, "shape_cols": 38, "partial": 40, "group": 44,
}
HEAD_BYTES_OF_VERSION = {1: RECORD_HEAD_V1.size, 2: RECORD_HEAD.size}
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
assert HEADER_FIXED.size == 48 and RECORD_HEAD.size == RECORD_HEAD_BYTES and DESCRIPTOR_BODY.size == 120
assert HEADER_OFFSETS["dropped_by_stage"] + _DROPPED_BY_STAGE.size == HEADER_BYTES


def _round_up(x: int, a: int = RECORD_ALIGN) -> int:
    return (x + a - 1) // a * a


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class TraceFormatError(ValueError):
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


# --------------------------------------------------------------------------------------------
# Selection and sink header
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceSelection:
    """What the kernel records: stages, output tiles and k-blocks.

    tiles: None records every tile; else up to 32 (tile_m, tile_n) selectors where -1 (or None)
    matches any index, so (3, -1) is a whole row of tiles. k_blocks: None records every
    k-block; else k-blocks inside one 1024-wide window. Stages without a k-block (epilogue)
    ignore the k-block selection.
    """

    tiles: Optional[tuple[tuple[int, int], ...]] = None
    k_blocks: Optional[tuple[int, ...]] = None
    stages: tuple[str, ...] = TAP_STAGES

    def __post_init__(self) -> None:
        if self.tiles is not None:
            tiles = []
            for t in self.tiles:
                if not isinstance(t, (tuple, list)) or len(t) != 2:
                    raise ValueError(f"selection tile {t!r} must be a pair (tile_m, tile_n)")
                pair = tuple(NONE if v is None else v for v in t)
                if any(isinstance(v, bool) or not isinstance(v, int) or v < NONE or v > INT32_MAX for v in pair):
                    raise ValueError(f"selection tile {t!r}: each index must be an int >= 0, or -1/None for any")
                tiles.append(pair)
            if len(tiles) > MAX_TILES:
                raise ValueError(f"selection has {len(tiles)} tiles; at most {MAX_TILES} fit in the header "
                                 f"(use -1 wildcards for whole rows or columns of tiles)")
            object.__setattr__(self, "tiles", tuple(tiles))
        if self.k_blocks is not None:
            for kb in self.k_blocks:
                if isinstance(kb, bool) or not isinstance(kb, int) or kb < 0 or kb > INT32_MAX:
                    raise ValueError(f"selection k-block {kb!r} must be an int >= 0 (and at most {INT32_MAX})")
            kbs = tuple(sorted(set(self.k_blocks)))
            if kbs and kbs[-1] - kbs[0] >= KBLOCK_WINDOW:
                raise ValueError(f"selection k-blocks span {kbs[0]}..{kbs[-1]}; they must fit in a window of "
                                 f"{KBLOCK_WINDOW} (select fewer, or all with k_blocks=None)")
            object.__setattr__(self, "k_blocks", kbs)
        for s in self.stages:
            if not isinstance(s, str) or s not in STAGE_CODES:
                raise ValueError(f"selection stage {s!r} is unknown; allowed: {', '.join(TAP_STAGES)}")
        object.__setattr__(self, "stages", tuple(s for s in TAP_STAGES if s in set(self.stages)))

    def records_tile(self, tile: tuple[int, int]) -> bool:
        if self.tiles is None:
            return True
        return any((sm < 0 or sm == tile[0]) and (sn < 0 or sn == tile[1]) for sm, sn in self.tiles)

    def records_k_block(self, k_block: Optional[int]) -> bool:
        return k_block is None or k_block < 0 or self.k_blocks is None or k_block in self.k_blocks

    def records(self, stage: str, tile: tuple[int, int], k_block: Optional[int]) -> bool:
        return stage in self.stages and self.records_tile(tile) and self.records_k_block(k_block)


@dataclass(frozen=True)
class SinkHeader:
    """The sink header as the parser read it."""

    version: int
    header_bytes: int
    capacity: int
    cursor: int
    dropped: int
    flags: int
    selection: TraceSelection
    dropped_by_stage: Optional[tuple[tuple[str, int], ...]] = None  # None: a version-1 sink does not say

    @property
    def head_bytes(self) -> int:
        """Bytes of a record head in this version."""
        return HEAD_BYTES_OF_VERSION[self.version]

    @property
    def area(self) -> int:
        """Bytes of the record area."""
        return self.capacity - self.header_bytes

    @property
    def used(self) -> int:
        """Bytes of the record area that hold records (the cursor, clipped to the area)."""
        return min(self.cursor, self.area)

    @property
    def extent(self) -> int:
        """Bytes from the start of the buffer that a reader must copy back: header plus records."""
        return self.header_bytes + self.used


def _encode_header(capacity: int, selection: TraceSelection, cursor: int = 0, dropped: int = 0,
                   magic: int = MAGIC, version: int = VERSION, dropped_by_stage: Sequence[int] = ()) -> bytes:
    flags = 0
    kb_base = 0
    bits = [0] * (KBLOCK_WINDOW // 32)
    if selection.k_blocks is None:
        flags |= FLAG_ALL_K_BLOCKS
    elif selection.k_blocks:
        kb_base = selection.k_blocks[0]
        for kb in selection.k_blocks:
            d = kb - kb_base
            bits[d >> 5] |= 1 << (d & 31)
    tiles = ((NONE, NONE),) if selection.tiles is None else selection.tiles
    stage_mask = sum(1 << STAGE_CODES[s] for s in selection.stages)
    head = bytearray(HEADER_BYTES)
    HEADER_FIXED.pack_into(head, 0, magic, version, HEADER_BYTES, capacity, cursor, dropped, flags, stage_mask,
                           len(tiles), kb_base, 0)
    for i, (tm, tn) in enumerate(tiles):
        TILE_SELECTOR.pack_into(head, _TILES_OFFSET + 8 * i, tm, tn)
    struct.pack_into(f"<{len(bits)}I", head, _KB_BITS_OFFSET, *bits)
    if version >= 2:
        counts = list(dropped_by_stage) + [0] * (STAGE_COUNTERS - len(dropped_by_stage))
        _DROPPED_BY_STAGE.pack_into(head, HEADER_OFFSETS["dropped_by_stage"], *counts)
    return bytes(head)


def _check_capacity(capacity: int) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ValueError(f"sink capacity must be an int, got {type(capacity).__name__}")
    if capacity < HEADER_BYTES + RECORD_ALIGN or capacity % RECORD_ALIGN or capacity >= 2**63:
        raise ValueError(f"sink capacity {capacity} must be a multiple of {RECORD_ALIGN}, at least "
                         f"{HEADER_BYTES + RECORD_ALIGN} (the {HEADER_BYTES}-byte header plus records)")


def sink_prefix(capacity: int, tiles: Optional[Iterable] = None, k_blocks: Optional[Iterable[int]] = None, *,
                stages: Optional[Iterable[str]] = None, descriptors: Sequence[DescriptorRecord] = ()) -> bytes:
    """The start of an initial sink of `capacity` bytes: the header with the selection, then the
    pre-written records. Every byte after it must be zero (harness.runner.SinkRequest zero-fills).
    `descriptors` are TMA descriptor fields known to the host; they are pre-written as records."""
    _check_capacity(capacity)
    selection = TraceSelection(
        tiles=None if tiles is None else tuple(tuple(t) for t in tiles),
        k_blocks=None if k_blocks is None else tuple(k_blocks),
        stages=TAP_STAGES if stages is None else tuple(stages),
    )
    records = b"".join(encode_descriptor(d) for d in descriptors)
    if len(records) > capacity - HEADER_BYTES:
        raise ValueError(f"{len(descriptors)} host descriptor records need {len(records)} bytes, more than the "
                         f"{capacity - HEADER_BYTES}-byte record area of a {capacity}-byte sink")
    return _encode_header(capacity, selection, cursor=len(records)) + records


def sink_init_bytes(capacity: int, tiles: Optional[Iterable] = None, k_blocks: Optional[Iterable[int]] = None, *,
                    stages: Optional[Iterable[str]] = None,
                    descriptors: Sequence[DescriptorRecord] = ()) -> bytes:
    """The whole initial sink, `capacity` bytes: `sink_prefix`, then a zeroed record area.

    Copy all of it to the sink memory before the launch (the record area must be zero)."""
    head = sink_prefix(capacity, tiles, k_blocks, stages=stages, descriptors=descriptors)
    return head + bytes(capacity - len(head))


def _buffer(buf) -> memoryview:
    if isinstance(buf, torch.Tensor):
        if buf.dtype != torch.uint8 or buf.dim() != 1:
            raise TypeError(f"a trace tensor must be 1-D uint8, got {buf.dtype} {tuple(buf.shape)}")
        buf = buf.detach().cpu().contiguous().numpy()
    try:
        mv = memoryview(buf)
    except TypeError:
        raise TypeError(f"a trace buffer must be bytes-like, got {type(buf).__name__}") from None
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def parse_header(buf) -> SinkHeader:
    """Read and check the sink header (the first HEADER_BYTES bytes are enough)."""
    mv = _buffer(buf)
    if len(mv) < HEADER_FIXED.size:
        raise TraceTruncatedError(f"trace buffer has {len(mv)} bytes, fewer than the {HEADER_FIXED.size}-byte "
                                  f"fixed header", 0)
    (magic, version, header_bytes, capacity, cursor, dropped, flags, stage_mask, n_tiles, kb_base,
     _) = HEADER_FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise TraceHeaderError(f"trace magic is 0x{magic:08x}, expected 0x{MAGIC:08x} ('OTRC'): not a trace "
                               f"sink, or the sink was never initialised", 0)
    if version not in READABLE_VERSIONS:
        raise TraceHeaderError(f"trace format version {version} is not supported; this parser reads versions "
                               f"{', '.join(map(str, READABLE_VERSIONS))}", HEADER_OFFSETS["version"])
    if header_bytes != HEADER_BYTES:
        raise TraceHeaderError(f"trace header_bytes is {header_bytes}, expected {HEADER_BYTES}",
                               HEADER_OFFSETS["header_bytes"])
    if len(mv) < HEADER_BYTES:
        raise TraceTruncatedError(f"trace buffer has {len(mv)} bytes, fewer than the {HEADER_BYTES}-byte header", 0)
    if capacity < HEADER_BYTES + RECORD_ALIGN or capacity % RECORD_ALIGN:
        raise TraceHeaderError(f"trace capacity {capacity} must be a multiple of {RECORD_ALIGN} and at least "
                               f"{HEADER_BYTES + RECORD_ALIGN}", HEADER_OFFSETS["capacity"])
    if len(mv) > capacity:
        raise TraceHeaderError(f"trace buffer has {len(mv)} bytes but its header says capacity {capacity}",
                               HEADER_OFFSETS["capacity"])
    if flags & ~KNOWN_FLAGS:
        raise TraceHeaderError(f"trace header flags 0x{flags:x} has unknown bits (known: 0x{KNOWN_FLAGS:x})",
                               HEADER_OFFSETS["flags"])
    if stage_mask & ~ALL_STAGES_MASK:
        raise TraceHeaderError(f"trace stage_mask 0x{stage_mask:x} selects unknown stage codes "
                               f"(known mask 0x{ALL_STAGES_MASK:x})", HEADER_OFFSETS["stage_mask"])
    if n_tiles > MAX_TILES:
        raise TraceHeaderError(f"trace n_tiles {n_tiles} exceeds {MAX_TILES}", HEADER_OFFSETS["n_tiles"])
    if cursor % RECORD_ALIGN:
        raise TraceHeaderError(f"trace cursor {cursor} is not a multiple of {RECORD_ALIGN}", HEADER_OFFSETS["cursor"])
    if cursor > capacity - HEADER_BYTES and dropped == 0:
        raise TraceHeaderError(f"trace cursor {cursor} is past the {capacity - HEADER_BYTES}-byte record area but "
                               f"no record was counted as dropped", HEADER_OFFSETS["cursor"])
    tiles = []
    for i in range(n_tiles):
        off = _TILES_OFFSET + 8 * i
        tm, tn = TILE_SELECTOR.unpack_from(mv, off)
        if tm < NONE or tn < NONE:
            raise TraceHeaderError(f"trace tile selector {i} is ({tm}, {tn}); indices must be >= -1", off)
        tiles.append((tm, tn))
    if flags & FLAG_ALL_K_BLOCKS:
        k_blocks = None
    else:
        if kb_base < 0:
            raise TraceHeaderError(f"trace kb_base {kb_base} is negative", HEADER_OFFSETS["kb_base"])
        words = struct.unpack_from(f"<{KBLOCK_WINDOW // 32}I", mv, _KB_BITS_OFFSET)
        k_blocks = tuple(kb_base + 32 * w + b for w, word in enumerate(words) for b in range(32) if word >> b & 1)
        if k_blocks and k_blocks[-1] > INT32_MAX:
            raise TraceHeaderError(f"trace kb_base {kb_base} with bit {k_blocks[-1] - kb_base} of kb_bits set selects "
                                   f"k-block {k_blocks[-1]}, past the int32 k-blocks of a record "
                                   f"(at most {INT32_MAX})", HEADER_OFFSETS["kb_base"])
    stages = tuple(s for s in TAP_STAGES if stage_mask >> STAGE_CODES[s] & 1)
    all_tiles = any(tm < 0 and tn < 0 for tm, tn in tiles)
    try:
        selection = TraceSelection(tiles=None if all_tiles else tuple(tiles), k_blocks=k_blocks, stages=stages)
    except ValueError as e:  # every field was checked above; this names anything still amiss
        raise TraceHeaderError(f"trace header selection is not valid: {e}", HEADER_OFFSETS["tiles"]) from None
    by_stage = None
    if version >= 2:
        counts = _DROPPED_BY_STAGE.unpack_from(mv, HEADER_OFFSETS["dropped_by_stage"])
        for code, n in enumerate(counts):
            if n and code not in STAGE_NAMES:
                raise TraceHeaderError(f"trace dropped_by_stage[{code}] is {n}, but {code} is no stage code",
                                       HEADER_OFFSETS["dropped_by_stage"] + 4 * code)
        if sum(counts) > dropped:
            raise TraceHeaderError(f"trace dropped_by_stage sums to {sum(counts)}, more than the {dropped} records "
                                   f"counted as dropped", HEADER_OFFSETS["dropped_by_stage"])
        by_stage = tuple((STAGE_NAMES[c], n) for c, n in enumerate(counts) if n)
    return SinkHeader(version=version, header_bytes=header_bytes, capacity=capacity, cursor=cursor,
                      dropped=dropped, flags=flags, selection=selection, dropped_by_stage=by_stage)


def trace_extent(header: bytes) -> int:
    """How many bytes of a sink to copy back, given its first HEADER_BYTES bytes."""
    return parse_header(header[:HEADER_BYTES]).extent


# --------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceResult:
    """What a trace held: assembled taps, descriptor records and the bookkeeping."""

    taps: tuple[Tap, ...]
    descriptors: tuple[DescriptorRecord, ...]
    dropped: int  # records the kernel could not fit
    capacity: int  # bytes of the sink
    used_bytes: int  # bytes of the record area holding records
    records: int  # records read (pad records not counted)
    warnings: tuple[str, ...]
    selection: TraceSelection = field(default_factory=TraceSelection)
    dropped_by_stage: Optional[tuple[tuple[str, int], ...]] = None  # None: the format version does not say
    needed_bytes: int = 0  # bytes the kernel reserved (the cursor), whether or not they fitted
    torn: int = 0  # records reserved but never completed (a kernel that stopped)
    version: int = VERSION

    @property
    def complete(self) -> bool:
        """Nothing dropped and nothing skipped: every tap the kernel made is here."""
        return self.dropped == 0 and self.torn == 0 and not self.warnings

    def get(self, stage: str, tile: tuple[int, int], k_block: Optional[int] = None) -> Optional[Tap]:
        """The tap with this key, or None."""
        key = (stage, tuple(tile), k_block)
        return next((t for t in self.taps if t.key == key), None)

    def of_stage(self, stage: str) -> tuple[Tap, ...]:
        return tuple(t for t in self.taps if t.stage == stage)


@dataclass
class _Piece:
    """The values of one record on their way into a tap: their raw bits (a view of the buffer,
    not a copy) and where they go: a rectangle of the tile (Block records; a Bytes chunk is one
    row of its image) or packed coordinates (Elements records)."""

    offset: int
    dtype: str
    shape: tuple[int, int]  # the tap's shape; a byte image is one row of `total` bytes
    bits: np.ndarray
    slot: int
    cta: int
    rect: Optional[tuple[int, int, int, int]] = None  # row0, col0, rows, cols
    coords: Optional[np.ndarray] = None  # uint32 row | col << 16, one per value
    total: int = 0  # byte images: size of the whole image
    record_bytes: int = 0  # the size of the record it came from

    def covers(self, pos: int) -> bool:
        r, c = divmod(pos, self.shape[1])
        if self.rect is not None:
            r0, c0, nr, nc = self.rect
            return r0 <= r < r0 + nr and c0 <= c < c0 + nc
        return bool(np.any(self.coords == (r | c << 16)))

    @property
    def tap_bytes(self) -> int:
        """Bytes the assembled tap takes: its values and its mask."""
        return self.shape[0] * self.shape[1] * (self.bits.dtype.itemsize + 1)


MAX_WARNINGS_PER_KIND = 8


class _Warnings:
    """The parser's warnings, at most MAX_WARNINGS_PER_KIND of each kind, then one line that counts the rest."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_WARNINGS_PER_KIND:
            self.lines.append(text)

    def result(self) -> tuple[str, ...]:
        more = [f"... and {n - MAX_WARNINGS_PER_KIND} more warning(s) like these: {kind}"
                for kind, n in self.counts.items() if n > MAX_WARNINGS_PER_KIND]
        return tuple(self.lines + more)


def _expected_shape(stage: str, block_m: int, block_n: int, block_k: int) -> tuple[int, int]:
    if stage == "load_a":
        return (block_m, block_k)
    if stage == "load_b":
        return (block_k, block_n)
    return (block_m, block_n)


def _first_nonzero(mv: memoryview, start: int, end: int) -> Optional[int]:
    """The offset of the first non-zero byte in [start, end), read in chunks (no copy of the range)."""
    step = 1 << 20
    for lo in range(start, end, step):
        chunk = np.frombuffer(mv, dtype=np.uint8, offset=lo, count=min(step, end - lo))
        if chunk.any():
            return lo + int(np.argmax(chunk != 0))
    return None


# A tap is assembled dense (values and a mask over its whole tile) from its records; a record may
# cover a few elements of it. A claim is refused when the dense tap would pass both this floor
# (a 512 x 512 fp32 tile takes 1.25 MiB) and this many times the bytes its records carry.
TAP_DENSE_FLOOR_BYTES = 4 << 20
TAP_SPARSE_RATIO = 64


def _tap_byte_limit(max_tap_bytes: Optional[int]) -> tuple[int, str]:
    """The limit on the assembled taps' bytes and how a refusal names it."""
    if max_tap_bytes is None:
        mb = _knobs.get("ORACLE_TRACE_MAX_TAPS_MB")
        return mb << 20, f"the {mb} MiB limit of ORACLE_TRACE_MAX_TAPS_MB"
    if isinstance(max_tap_bytes, bool) or not isinstance(max_tap_bytes, int) or max_tap_bytes <= 0:
        raise ValueError(f"parse_trace: max_tap_bytes={max_tap_bytes!r} must be a positive int or None")
    return max_tap_bytes, f"the limit of {max_tap_bytes} bytes (max_tap_bytes)"


def parse_trace(buf, *, block_m: int, block_n: int, block_k: int, partial: bool = False,
                max_tap_bytes: Optional[int] = None) -> TraceResult:
    """Parse a sink copied back from the device into taps and descriptor records.

    `buf` is bytes-like (or a 1-D uint8 tensor): the whole sink, or at least its header and
    records (`SinkHeader.extent` bytes). Block sizes give the expected tile shapes: load_a
    [block_m, block_k], load_b [block_k, block_n], mma and epilogue [block_m, block_n]; a byte
    image holds at most its operand's tile (block_m or block_n x block_k elements).
    `partial=True` is for a kernel that did not finish (crash, timeout): records that were
    reserved but not committed are skipped with a warning instead of raising.
    Element and block records with the same (stage, tile, k_block, partial, group) become one
    dense Tap whose `mask` marks the recorded elements. The taps together may take at most
    `max_tap_bytes` (default: the ORACLE_TRACE_MAX_TAPS_MB knob); a trace that needs more is
    refused with TraceLimitError before any tap is assembled. Memory beyond the taps stays within
    a small multiple of the largest record.
    """
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TILE_DIM:
            raise ValueError(f"parse_trace: {name}={v!r} must be an int in 1..{MAX_TILE_DIM}")
    tap_limit, limit_name = _tap_byte_limit(max_tap_bytes)
    mv = _buffer(buf)
    header = parse_header(mv)
    hb = header.head_bytes
    head = RECORD_HEAD if header.version >= 2 else RECORD_HEAD_V1
    start, end = header.header_bytes, header.header_bytes + header.used
    if len(mv) < end:
        raise TraceTruncatedError(f"trace buffer ends at byte {len(mv)} but the cursor says records run to byte "
                                  f"{end}", len(mv))
    nz = _first_nonzero(mv, end, len(mv))
    if nz is not None:
        raise TraceRecordError(f"non-zero byte 0x{mv[nz]:02x} past the cursor (end of records at byte {end}): a "
                               f"record written without a reservation, or a sink not zeroed before the launch", nz)

    warnings = _Warnings()
    pieces: dict[tuple, list[_Piece]] = defaultdict(list)
    descriptors: list[DescriptorRecord] = []
    unselected: set[tuple] = set()
    n_records = 0
    torn = 0
    off = start
    while off < end:
        if end - off < 8:
            raise TraceRecordError(f"{end - off} bytes left at the end of the records, too few for a record", off)
        size, kind_code, commit = struct.unpack_from("<IHH", mv, off)
        if size == 0:
            if partial:
                warnings.add("torn", f"record at byte {off} was reserved but never written (the kernel stopped); "
                                     f"the {end - off} bytes after it cannot be read")
                torn += 1
                break
            raise TraceRecordError("record size is 0: a reservation that was never written (pass partial=True for "
                                   "a kernel that did not finish)", off)
        if size % RECORD_ALIGN or size < 8:
            raise TraceRecordError(f"record size {size} is not a positive multiple of {RECORD_ALIGN}", off)
        if off + size > end:
            raise TraceRecordError(f"record of {size} bytes runs to byte {off + size}, past the end of the records "
                                   f"at byte {end} (the cursor)", off)
        if commit != COMMIT_TAG:
            if partial:
                warnings.add("torn", f"record at byte {off} ({size} bytes) was not committed (the kernel stopped "
                                     f"while writing it); skipped")
                torn += 1
                off += size
                continue
            raise TraceRecordError(f"record commit tag is 0x{commit:04x}, expected 0x{COMMIT_TAG:04x}: the record "
                                   f"was not completed (pass partial=True for a kernel that did not finish)", off + 6)
        try:
            kind = RecordKind(kind_code)
        except ValueError:
            raise TraceCodeError(f"record kind {kind_code} is unknown; known: "
                                 f"{', '.join(f'{k.value}={k.name}' for k in RecordKind)}", off + 4) from None
        if kind is RecordKind.PAD:
            if off + size != header.header_bytes + header.area or header.cursor <= header.area:
                raise TraceRecordError("pad record that does not close an overflowed record area", off)
            off += size
            continue
        if size < hb:
            raise TraceRecordError(f"record size {size} is smaller than the {hb}-byte record head", off)
        fields = head.unpack_from(mv, off)
        _, _, _, stage_code, dtype_code, _, thread, cta, tile_m, tile_n, k_block, slot, rows, cols = fields[:14]
        part, group = fields[14:] if header.version >= 2 else (NONE, NONE)
        stage = STAGE_NAMES.get(stage_code)
        if stage is None:
            raise TraceCodeError(f"record stage code {stage_code} is unknown; known: "
                                 f"{', '.join(f'{c}={s}' for s, c in STAGE_CODES.items())}", off + 8)
        dtype = DTYPE_NAMES.get(dtype_code)
        if dtype is None:
            raise TraceCodeError(f"record dtype code {dtype_code} is unknown; known: "
                                 f"{', '.join(f'{c}={d}' for d, c in DTYPE_CODES.items())}", off + 9)
        rec = mv[off:off + size]
        n_records += 1
        if kind is RecordKind.DESCRIPTOR:
            descriptors.append(_parse_descriptor(rec, off, stage, dtype, hb))
            off += size
            continue
        # tile-bound records
        if tile_m < 0 or tile_n < 0:
            raise TraceCoordinateError(f"{stage} record tile ({tile_m}, {tile_n}) is negative", off + 20)
        if k_block < NONE or slot < NONE:
            raise TraceCoordinateError(f"{stage} record k_block {k_block} / slot {slot} must be >= -1", off + 28)
        if part < NONE or group < NONE:
            raise TraceCoordinateError(f"{stage} record partial {part} / group {group} must be >= -1", off + 40)
        if (stage in DESCRIPTOR_STAGES or stage in LOAD_STAGES) and k_block < 0:
            raise TraceCoordinateError(f"{stage} record tile ({tile_m}, {tile_n}) has no k-block; the stage needs one",
                                       off + 28)
        kb = None if k_block < 0 else k_block
        key = (stage, (tile_m, tile_n), kb, None if part < 0 else part, None if group < 0 else group)
        if not header.selection.records(stage, (tile_m, tile_n), kb) and key not in unselected:
            unselected.add(key)
            warnings.add("records of taps the sink header did not select",
                         f"record at byte {off}: {stage} tile ({tile_m}, {tile_n}) k-block {kb} was not selected "
                         f"by the sink header (the kernel ignored the selection)")
        if kind is RecordKind.BYTES:
            if stage not in DESCRIPTOR_STAGES:
                raise TraceCodeError(f"a byte-image record must have stage descriptor_a or descriptor_b, not {stage}",
                                     off + 8)
            rows_mn = block_m if stage == "descriptor_a" else block_n
            pieces[key].append(_parse_bytes(rec, off, stage, dtype, slot, cta, hb, (rows_mn, block_k)))
        else:
            if stage in DESCRIPTOR_STAGES:
                raise TraceCodeError(f"{kind.name.lower()} record for {stage}: descriptor stages hold byte images "
                                     f"(Bytes records) only", off + 8)
            shape = _expected_shape(stage, block_m, block_n, block_k)
            if (rows, cols) != shape:
                raise TraceCoordinateError(
                    f"{stage} record tile ({tile_m}, {tile_n}) says the tile is {rows}x{cols}, but block sizes "
                    f"(block_m={block_m}, block_n={block_n}, block_k={block_k}) make it {shape[0]}x{shape[1]}",
                    off + 36)
            if kind is RecordKind.ELEMENTS:
                pieces[key].append(_parse_elements(rec, off, stage, dtype, shape, slot, cta, hb))
            else:
                pieces[key].append(_parse_block(rec, off, stage, dtype, shape, slot, cta, hb))
        if pieces.get(key):
            pieces[key][-1].record_bytes = size
        off += size

    need = 0
    for key, parts in pieces.items():  # each tap's claim against the bytes its records carry
        dense, carried = parts[0].tap_bytes, sum(p.record_bytes for p in parts)
        if dense > max(TAP_DENSE_FLOOR_BYTES, TAP_SPARSE_RATIO * carried):
            p = parts[0]
            raise TraceLimitError(f"{key[0]} tile {key[1]}: its records carry {carried} bytes but claim a "
                                  f"{p.shape[0]}x{p.shape[1]} tap of {dense} bytes in memory, more than "
                                  f"{TAP_SPARSE_RATIO} times what they hold (and more than the "
                                  f"{TAP_DENSE_FLOOR_BYTES >> 20} MiB any tap may take): the block sizes or the "
                                  f"records are wrong", p.offset)
        need += dense
    if need > tap_limit:
        raise TraceLimitError(f"the trace's {len(pieces)} taps would take {need} bytes in memory (values and masks), "
                              f"more than {limit_name}: raise it, or trace fewer tiles, k-blocks or stages")
    from harness import budget

    budget.require(need, f"the trace's {len(pieces)} taps (values and masks)", TraceLimitError,
                   advice="trace fewer tiles, k-blocks or stages")
    taps = []
    order = {s: i for i, s in enumerate(TAP_STAGES)}
    none_first = (lambda v: -1 if v is None else v)  # noqa: E731
    for key in sorted(pieces, key=lambda k: (order[k[0]], k[1], none_first(k[2]), none_first(k[3]),
                                             none_first(k[4]))):
        taps.append(_assemble(key, pieces[key], warnings, hb))
    unique_descriptors = tuple(dict.fromkeys(descriptors))
    return TraceResult(taps=tuple(taps), descriptors=unique_descriptors, dropped=header.dropped,
                       capacity=header.capacity, used_bytes=header.used, records=n_records,
                       warnings=warnings.result(), selection=header.selection,
                       dropped_by_stage=header.dropped_by_stage, needed_bytes=header.cursor, torn=torn,
                       version=header.version)


def _expect_size(rec: memoryview, off: int, want: int, what: str) -> None:
    if len(rec) != _round_up(want):
        raise TraceRecordError(f"{what} record is {len(rec)} bytes, but its contents need {want} "
                               f"(= {_round_up(want)} with padding)", off)


def _bits(rec, isz: int, count: int, offset: int) -> np.ndarray:
    """`count` little-endian values of `isz` bytes at `offset` of the record, as a view."""
    return np.frombuffer(rec, dtype=np.dtype(_BITS[isz]).newbyteorder("<"), count=count, offset=offset)


def _parse_elements(rec, off, stage, dtype, shape, slot, cta, hb) -> _Piece:
    if len(rec) < hb + ELEMENTS_BODY.size:
        raise TraceRecordError(f"element record of {len(rec)} bytes has no room for its count", off)
    count, _ = ELEMENTS_BODY.unpack_from(rec, hb)
    isz = DTYPE_SIZE[dtype]
    base = hb + ELEMENTS_BODY.size
    _expect_size(rec, off, base + count * (4 + isz), f"{stage} element ({count} elements of {dtype})")
    coords = np.frombuffer(rec, dtype="<u4", count=count, offset=base)
    rows, cols = coords & 0xFFFF, coords >> 16
    bad = (rows >= shape[0]) | (cols >= shape[1])
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceCoordinateError(f"{stage} element {i} at (row {rows[i]}, col {cols[i]}) is outside the "
                                   f"{shape[0]}x{shape[1]} tile", off + base + 4 * i)
    return _Piece(off, dtype, shape, _bits(rec, isz, count, base + 4 * count), slot, cta, coords=coords)


def _parse_block(rec, off, stage, dtype, shape, slot, cta, hb) -> _Piece:
    if len(rec) < hb + BLOCK_BODY.size:
        raise TraceRecordError(f"block record of {len(rec)} bytes has no room for its rectangle", off)
    row0, col0, nrows, ncols = BLOCK_BODY.unpack_from(rec, hb)
    isz = DTYPE_SIZE[dtype]
    base = hb + BLOCK_BODY.size
    _expect_size(rec, off, base + nrows * ncols * isz, f"{stage} block ({nrows}x{ncols} of {dtype})")
    if row0 + nrows > shape[0] or col0 + ncols > shape[1]:
        raise TraceCoordinateError(f"{stage} block rows {row0}..{row0 + nrows - 1}, cols {col0}..{col0 + ncols - 1} "
                                   f"is outside the {shape[0]}x{shape[1]} tile", off + hb)
    return _Piece(off, dtype, shape, _bits(rec, isz, nrows * ncols, base), slot, cta, rect=(row0, col0, nrows, ncols))


def _parse_bytes(rec, off, stage, dtype, slot, cta, hb, tile: tuple[int, int]) -> _Piece:
    if len(rec) < hb + BYTES_BODY.size:
        raise TraceRecordError(f"byte-image record of {len(rec)} bytes has no room for its chunk header", off)
    offset, nbytes, total, _ = BYTES_BODY.unpack_from(rec, hb)
    base = hb + BYTES_BODY.size
    _expect_size(rec, off, base + nbytes, f"byte-image ({nbytes} bytes)")
    if total == 0 or offset + nbytes > total:
        raise TraceCoordinateError(f"byte-image chunk {offset}..{offset + nbytes} does not fit the {total}-byte image",
                                   off + hb)
    most = tile[0] * tile[1] * DTYPE_SIZE[dtype]
    if total > most:
        raise TraceCoordinateError(f"{stage} byte image says total_bytes {total}, more than the operand's tile holds: "
                                   f"{tile[0]} x {tile[1]} elements of {dtype} = {most} bytes", off + hb + 8)
    return _Piece(off, dtype, (1, total), _bits(rec, 1, nbytes, base), slot, cta, rect=(0, offset, 1, nbytes),
                  total=total)


def _parse_descriptor(rec, off, stage, dtype, hb) -> DescriptorRecord:
    _expect_size(rec, off, hb + DESCRIPTOR_BODY.size, "descriptor")
    if stage not in DESCRIPTOR_STAGES:
        raise TraceCodeError(f"descriptor record with stage {stage}; it must be descriptor_a or descriptor_b", off + 8)
    v = DESCRIPTOR_BODY.unpack_from(rec, hb)
    operand_code, rank, swizzle, oob = v[0], v[1], v[2], v[3]
    dims, strides, box, estr = v[4:9], v[9:13], v[13:18], v[18:23]
    body = off + hb
    operand = {c: n for n, c in OPERAND_CODES.items()}.get(operand_code)
    if operand is None or f"descriptor_{operand}" != stage:
        raise TraceCodeError(f"descriptor operand code {operand_code} does not match its stage {stage}", body)
    if not 1 <= rank <= 5:
        raise TraceCodeError(f"descriptor rank {rank} must be 1..5", body + 1)
    if swizzle not in SWIZZLE_BYTES:
        raise TraceCodeError(f"descriptor swizzle {swizzle} must be one of {SWIZZLE_BYTES} bytes", body + 2)
    fill = {c: n for n, c in OOB_FILL_CODES.items()}.get(oob)
    if fill is None:
        raise TraceCodeError(f"descriptor oob_fill code {oob} is unknown; known: {OOB_FILL_CODES}", body + 4)
    try:
        return DescriptorRecord(operand=operand, dtype=dtype, global_dims=tuple(dims[:rank]),
                                global_strides=tuple(strides[:rank - 1]), box_dims=tuple(box[:rank]),
                                element_strides=tuple(estr[:rank]), swizzle=swizzle, oob_fill=fill)
    except TapError as e:
        raise TraceCodeError(f"descriptor record is not valid: {e}", off) from None


def _assemble(key: tuple, parts: list[_Piece], warnings: _Warnings, hb: int) -> Tap:
    stage, tile, kb, part, group = key
    first = parts[0]
    where = f"{stage} tile {tile} k-block {kb}" + (f" partial {part}" if part is not None else "") + \
        (f" group {group}" if group is not None else "")
    for p in parts[1:]:
        if p.dtype != first.dtype:
            raise TraceConflictError(f"{where}: record has dtype {p.dtype} but the record at byte {first.offset} "
                                     f"has {first.dtype}", p.offset + 9)
        if p.total != first.total:
            raise TraceConflictError(f"{where}: byte image is {p.total} bytes here but {first.total} in the record "
                                     f"at byte {first.offset}", p.offset + hb)
    slots = sorted({p.slot for p in parts})
    ctas = sorted({p.cta for p in parts})
    if len(slots) > 1:
        warnings.add("taps whose records disagree on the slot",
                     f"{where}: records disagree on the pipeline slot {slots}; the tap keeps {first.slot}")
    if len(ctas) > 1:
        warnings.add("taps written by several CTAs", f"{where}: written by several CTAs {ctas}; the tap keeps CTA "
                                                     f"{first.cta}")
    image = stage in DESCRIPTOR_STAGES
    rows, cols = first.shape
    dense = np.zeros((rows, cols), dtype=_BITS[first.bits.dtype.itemsize])
    mask = np.zeros((rows, cols), dtype=bool)
    flat_dense, flat_mask = dense.reshape(-1), mask.reshape(-1)

    def conflict(i: int, pos: int, new_bits: int, earlier: Optional[_Piece] = None) -> TraceConflictError:
        p = parts[i]
        if earlier is None:  # the earlier record that holds the element
            earlier = next((q for q in reversed(parts[:i]) if q.covers(pos)), p)
        what = f"byte {pos}" if image else f"element (row {pos // cols}, col {pos % cols})"
        m = (1 << 8 * dense.itemsize) - 1
        return TraceConflictError(f"{where}: {what} recorded twice with different values (bits "
                                  f"0x{int(flat_dense[pos]) & m:x} in the record at byte {earlier.offset}, "
                                  f"0x{new_bits & m:x} in the record at byte {p.offset})", p.offset)

    for i, p in enumerate(parts):
        if p.rect is not None:
            r0, c0, nr, nc = p.rect
            vals = p.bits.reshape(nr, nc)
            d, m = dense[r0:r0 + nr, c0:c0 + nc], mask[r0:r0 + nr, c0:c0 + nc]
            clash = m & (d != vals)
            if clash.any():
                r, c = divmod(int(np.argmax(clash)), nc)
                raise conflict(i, (r0 + r) * cols + c0 + c, int(vals[r, c]))
            d[...] = vals
            m[...] = True
        else:
            pos = (p.coords & 0xFFFF).astype(np.intp) * cols + (p.coords >> 16).astype(np.intp)
            clash = flat_mask[pos] & (flat_dense[pos] != p.bits)
            if clash.any():
                j = int(np.argmax(clash))
                raise conflict(i, int(pos[j]), int(p.bits[j]))
            flat_dense[pos] = p.bits
            flat_mask[pos] = True
            clash = flat_dense[pos] != p.bits  # one record that holds an element twice, with different values
            if clash.any():
                j = int(np.argmax(clash))
                raise conflict(i, int(pos[j]), int(p.bits[j]), earlier=p)
    if image:
        values, mask = torch.from_numpy(flat_dense), flat_mask
    else:
        values = torch.from_numpy(dense).view(DTYPE_TORCH[first.dtype])
    tmask = None if mask.all() else torch.from_numpy(mask)
    try:
        return Tap(stage=stage, tile=tile, values=values, k_block=kb, slot=None if first.slot < 0 else first.slot,
                   cta=first.cta, mask=tmask, partial=part, group=group)
    except TapError as e:
        raise TraceFormatError(f"{where}: the records do not make a valid tap: {e}", first.offset) from None


# --------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------

ValuesLike = Union[torch.Tensor, np.ndarray, Sequence[float]]


def _dtype_name(values, dtype: Optional[str]) -> str:
    if dtype is not None:
        if dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {dtype!r} is unknown; known: {', '.join(DTYPE_CODES)}")
        return dtype
    if isinstance(values, torch.Tensor):
        for name, t in DTYPE_TORCH.items():
            if values.dtype == t:
                return name
        raise ValueError(f"torch dtype {values.dtype} has no trace dtype; known: {', '.join(DTYPE_CODES)}")
    raise ValueError("dtype is required when values are not a torch tensor")


def _value_bytes(values: ValuesLike, dtype: str) -> bytes:
    """Raw little-endian bits of `values` in `dtype`."""
    if not isinstance(values, torch.Tensor):
        values = torch.as_tensor(np.asarray(values, dtype=np.float64 if dtype not in ("int8", "int32") else np.int64))
    t = values.detach().cpu().reshape(-1)
    if t.dtype != DTYPE_TORCH[dtype]:
        t = t.to(DTYPE_TORCH[dtype])
    return t.contiguous().view(_TORCH_BITS[DTYPE_SIZE[dtype]]).numpy().astype(
        np.dtype(_BITS[DTYPE_SIZE[dtype]]).newbyteorder("<")).tobytes()


def encode_record(kind: int, body: bytes, *, stage: str, dtype: str, tile: tuple[int, int] = (NONE, NONE),
                  k_block: int = NONE, slot: int = NONE, cta: int = 0, thread: int = 0,
                  shape: tuple[int, int] = (0, 0), commit: bool = True, stage_code: Optional[int] = None,
                  dtype_code: Optional[int] = None, partial: Optional[int] = None, group: Optional[int] = None,
                  version: int = VERSION) -> bytes:
    """One record: head + body, padded to RECORD_ALIGN. The *_code overrides write raw codes (for tests);
    `version` 1 writes the old 40-byte head (no partial, no group)."""
    fields = (int(kind), COMMIT_TAG if commit else 0, STAGE_CODES[stage] if stage_code is None else stage_code,
              DTYPE_CODES[dtype] if dtype_code is None else dtype_code, 0, thread, cta, tile[0], tile[1],
              NONE if k_block is None else k_block, NONE if slot is None else slot, shape[0], shape[1])
    if version >= 2:
        head_struct = RECORD_HEAD
        fields += (NONE if partial is None else partial, NONE if group is None else group)
    else:
        if partial is not None or group is not None:
            raise ValueError("a version-1 record head has no partial or group")
        head_struct = RECORD_HEAD_V1
    size = _round_up(head_struct.size + len(body))
    return (head_struct.pack(size, *fields) + body).ljust(size, b"\0")


def encode_descriptor(d: DescriptorRecord, *, cta: int = 0, thread: int = 0, version: int = VERSION) -> bytes:
    """A Descriptor record for the fields of `d`."""
    rank = len(d.global_dims)
    pad = lambda xs, n: tuple(xs) + (0,) * (n - len(xs))  # noqa: E731
    body = DESCRIPTOR_BODY.pack(OPERAND_CODES[d.operand], rank, d.swizzle, OOB_FILL_CODES[d.oob_fill],
                                *pad(d.global_dims, 5), *pad(d.global_strides, 4), *pad(d.box_dims, 5),
                                *pad(d.element_strides, 5))
    return encode_record(RecordKind.DESCRIPTOR, body, stage=d.stage, dtype=d.dtype, cta=cta, thread=thread,
                         version=version)


class TraceWriter:
    """Builds trace buffers in pure Python, record by record, as a kernel would.

    Each method appends one record and returns its byte offset in the buffer. `to_bytes()`
    lays them out after the header; records that do not fit are dropped and the area is
    closed with a pad record, exactly as the device does. `raw()` appends arbitrary bytes,
    for building corrupt buffers.
    """

    def __init__(self, capacity: int = 1 << 20, *, tiles: Optional[Iterable] = None,
                 k_blocks: Optional[Iterable[int]] = None, stages: Optional[Iterable[str]] = None,
                 version: int = VERSION) -> None:
        _check_capacity(capacity)
        if version not in READABLE_VERSIONS:
            raise ValueError(f"version {version} is not a trace format version ({READABLE_VERSIONS})")
        self.capacity = capacity
        self.version = version
        self.selection = TraceSelection(
            tiles=None if tiles is None else tuple(tuple(t) for t in tiles),
            k_blocks=None if k_blocks is None else tuple(k_blocks),
            stages=TAP_STAGES if stages is None else tuple(stages))
        self._records: list[bytes] = []

    def _offset(self) -> int:
        return HEADER_BYTES + sum(len(r) for r in self._records)

    def raw(self, data: bytes) -> int:
        off = self._offset()
        self._records.append(bytes(data))
        return off

    def elements(self, stage: str, tile: tuple[int, int], rows: Sequence[int], cols: Sequence[int],
                 values: ValuesLike, *, shape: tuple[int, int], k_block: Optional[int] = None,
                 slot: Optional[int] = None, dtype: Optional[str] = None, cta: int = 0, thread: int = 0,
                 commit: bool = True, partial: Optional[int] = None, group: Optional[int] = None) -> int:
        """An element record: values[i] sits at (rows[i], cols[i]) of a tile of `shape`."""
        dtype = _dtype_name(values, dtype)
        rows = [int(r) for r in rows]
        cols = [int(c) for c in cols]
        if len(rows) != len(cols):
            raise ValueError(f"{len(rows)} rows but {len(cols)} cols")
        vb = _value_bytes(values, dtype)
        if len(vb) != len(rows) * DTYPE_SIZE[dtype]:
            raise ValueError(f"{len(vb) // DTYPE_SIZE[dtype]} values for {len(rows)} coordinates")
        coords = struct.pack(f"<{len(rows)}I", *((r & 0xFFFF) | (c & 0xFFFF) << 16 for r, c in zip(rows, cols)))
        body = ELEMENTS_BODY.pack(len(rows), 0) + coords + vb
        return self.raw(encode_record(RecordKind.ELEMENTS, body, stage=stage, dtype=dtype, tile=tile,
                                      k_block=k_block, slot=slot, cta=cta, thread=thread, shape=shape, commit=commit,
                                      partial=partial, group=group, version=self.version))

    def block(self, stage: str, tile: tuple[int, int], values: ValuesLike, *, shape: tuple[int, int],
              row0: int = 0, col0: int = 0, k_block: Optional[int] = None, slot: Optional[int] = None,
              dtype: Optional[str] = None, cta: int = 0, thread: int = 0, commit: bool = True,
              partial: Optional[int] = None, group: Optional[int] = None) -> int:
        """A block record: the 2-D `values` sit at rows row0.., cols col0.. of a tile of `shape`."""
        dtype = _dtype_name(values, dtype)
        arr = values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
        if arr.dim() != 2:
            raise ValueError(f"block values must be 2-D, got shape {tuple(arr.shape)}")
        body = BLOCK_BODY.pack(row0, col0, arr.shape[0], arr.shape[1]) + _value_bytes(arr, dtype)
        return self.raw(encode_record(RecordKind.BLOCK, body, stage=stage, dtype=dtype, tile=tile, k_block=k_block,
                                      slot=slot, cta=cta, thread=thread, shape=shape, commit=commit, partial=partial,
                                      group=group, version=self.version))

    def image(self, stage: str, tile: tuple[int, int], data: bytes, *, k_block: int, offset: int = 0,
              total_bytes: Optional[int] = None, dtype: str = "bf16", shape: tuple[int, int] = (0, 0),
              slot: Optional[int] = None, cta: int = 0, thread: int = 0, commit: bool = True,
              partial: Optional[int] = None, group: Optional[int] = None) -> int:
        """A byte-image chunk: `data` at `offset` of a `total_bytes` shared-memory image."""
        data = bytes(data)
        total = offset + len(data) if total_bytes is None else total_bytes
        body = BYTES_BODY.pack(offset, len(data), total, 0) + data
        return self.raw(encode_record(RecordKind.BYTES, body, stage=stage, dtype=dtype, tile=tile, k_block=k_block,
                                      slot=slot, cta=cta, thread=thread, shape=shape, commit=commit, partial=partial,
                                      group=group, version=self.version))

    def descriptor(self, d: DescriptorRecord, *, cta: int = 0, thread: int = 0) -> int:
        return self.raw(encode_descriptor(d, cta=cta, thread=thread, version=self.version))

    def tap(self, tap: Tap, *, dtype: Optional[str] = None, shape: Optional[tuple[int, int]] = None,
            records: int = 1) -> list[int]:
        """Encode a whole Tap: byte images as Bytes chunks, dense tiles as Block bands, masked
        tiles as Element records; split into `records` records."""
        if tap.stage in DESCRIPTOR_STAGES:
            data = tap.values.contiguous().numpy().tobytes()
            keep = np.ones(len(data), bool) if tap.mask is None else tap.mask.numpy()
            idx = np.flatnonzero(keep)
            offs = []
            for part in np.array_split(idx, records):
                if part.size == 0:
                    continue
                # contiguous runs only
                runs = np.split(part, np.flatnonzero(np.diff(part) != 1) + 1)
                for run in runs:
                    lo, hi = int(run[0]), int(run[-1]) + 1
                    offs.append(self.image(tap.stage, tap.tile, data[lo:hi], k_block=tap.k_block, offset=lo,
                                           total_bytes=len(data), dtype=dtype or "bf16", slot=tap.slot,
                                           cta=tap.cta or 0, partial=tap.partial, group=tap.group))
            return offs
        shape = tuple(tap.values.shape) if shape is None else shape
        if tap.mask is None:
            bands = np.array_split(np.arange(tap.values.shape[0]), records)
            return [self.block(tap.stage, tap.tile, tap.values[int(b[0]):int(b[-1]) + 1], shape=shape, row0=int(b[0]),
                               k_block=tap.k_block, slot=tap.slot, dtype=dtype, cta=tap.cta or 0,
                               partial=tap.partial, group=tap.group)
                    for b in bands if b.size]
        idx = np.flatnonzero(tap.mask.reshape(-1).numpy())
        flat = tap.values.reshape(-1)
        cols = tap.values.shape[1]
        return [self.elements(tap.stage, tap.tile, (part // cols).tolist(), (part % cols).tolist(),
                              flat[torch.from_numpy(part)], shape=shape, k_block=tap.k_block, slot=tap.slot,
                              dtype=dtype or _dtype_name(flat, None), cta=tap.cta or 0,
                              partial=tap.partial, group=tap.group)
                for part in np.array_split(idx, records) if part.size]

    def to_bytes(self, *, cursor: Optional[int] = None, dropped: Optional[int] = None, magic: int = MAGIC,
                 version: Optional[int] = None, length: Optional[int] = None) -> bytes:
        """The sink as the device would leave it. Overrides write corrupt header fields; `length`
        cuts (or must not exceed) the returned buffer."""
        area = self.capacity - HEADER_BYTES
        body = bytearray(area)
        pos = 0
        n_dropped = 0
        by_stage = [0] * STAGE_COUNTERS
        for r in self._records:
            if pos + len(r) > area:
                n_dropped += 1
                if len(r) > 8:
                    by_stage[r[8] % STAGE_COUNTERS] += 1
                if pos < area:  # the straddling reservation closes the area
                    body[pos:pos + 8] = struct.pack("<IHH", area - pos, RecordKind.PAD, COMMIT_TAG)
            else:
                body[pos:pos + len(r)] = r
            pos += len(r)
        head = _encode_header(self.capacity, self.selection, cursor=pos if cursor is None else cursor,
                              dropped=n_dropped if dropped is None else dropped, magic=magic,
                              version=self.version if version is None else version,
                              dropped_by_stage=by_stage)
        out = head + bytes(body)
        return out if length is None else out[:length]


# --------------------------------------------------------------------------------------------
# Accounting: what a run's trace covered and lost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceAccount:
    """The selection a run recorded under, the records it lost (dropped because the sink was
    full, in total and by stage; torn by a kernel that stopped), the bytes the kernel reserved and
    the bytes the sink had. `relaunched`: the first launch overflowed its sink and this trace is
    from a second launch with a sink of the measured size (`first_capacity` bytes before)."""

    selection: TraceSelection = field(default_factory=TraceSelection)
    dropped: int = 0
    dropped_by_stage: Optional[tuple[tuple[str, int], ...]] = None  # None: the sink's version does not say
    needed_bytes: int = 0
    capacity: int = 0
    torn: int = 0
    relaunched: bool = False
    first_capacity: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("dropped", "needed_bytes", "capacity", "torn"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"trace account {name}={v!r} must be a non-negative int")
        if self.dropped_by_stage is not None:
            for item in self.dropped_by_stage:
                if (not isinstance(item, (tuple, list)) or len(item) != 2 or item[0] not in STAGE_CODES
                        or isinstance(item[1], bool) or not isinstance(item[1], int) or item[1] < 0):
                    raise ValueError(f"trace account dropped_by_stage entry {item!r} must be [stage, count]")
            object.__setattr__(self, "dropped_by_stage", tuple((s, n) for s, n in self.dropped_by_stage))

    @property
    def complete(self) -> bool:
        return self.dropped == 0 and self.torn == 0

    def to_json(self) -> dict:
        sel = self.selection
        return {"tiles": None if sel.tiles is None else [list(t) for t in sel.tiles],
                "k_blocks": None if sel.k_blocks is None else list(sel.k_blocks), "stages": list(sel.stages),
                "dropped": self.dropped,
                "dropped_by_stage": None if self.dropped_by_stage is None else dict(self.dropped_by_stage),
                "needed_bytes": self.needed_bytes, "capacity": self.capacity, "torn": self.torn,
                "relaunched": self.relaunched, "first_capacity": self.first_capacity}

    @classmethod
    def from_json(cls, d) -> "TraceAccount":
        """Raises ValueError naming the field for anything malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"a trace account must be a JSON object, got {type(d).__name__}")
        known = {"tiles", "k_blocks", "stages", "dropped", "dropped_by_stage", "needed_bytes", "capacity", "torn",
                 "relaunched", "first_capacity"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"trace account has unknown field(s) {', '.join(unknown)}")
        tiles, kbs, stages = d.get("tiles"), d.get("k_blocks"), d.get("stages", list(TAP_STAGES))
        for name, v in (("tiles", tiles), ("k_blocks", kbs)):
            if v is not None and not isinstance(v, list):
                raise ValueError(f"trace account {name} must be a list or null, got {v!r}")
        if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
            raise ValueError(f"trace account stages must be a list of stage names, got {stages!r}")
        by_stage = d.get("dropped_by_stage")
        if by_stage is not None and not isinstance(by_stage, dict):
            raise ValueError(f"trace account dropped_by_stage must be an object or null, got {by_stage!r}")
        first = d.get("first_capacity")
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 0):
            raise ValueError(f"trace account first_capacity={first!r} must be a non-negative int or null")
        relaunched = d.get("relaunched", False)
        if not isinstance(relaunched, bool):
            raise ValueError(f"trace account relaunched={relaunched!r} must be true or false")
        selection = TraceSelection(tiles=None if tiles is None else tuple(tuple(t) if isinstance(t, list) else t
                                                                          for t in tiles),
                                   k_blocks=None if kbs is None else tuple(kbs), stages=tuple(stages))
        return cls(selection=selection, dropped=d.get("dropped", 0),
                   dropped_by_stage=None if by_stage is None else tuple(by_stage.items()),
                   needed_bytes=d.get("needed_bytes", 0), capacity=d.get("capacity", 0), torn=d.get("torn", 0),
                   relaunched=relaunched, first_capacity=first)


def account_of(result: TraceResult, *, relaunched: bool = False,
               first_capacity: Optional[int] = None) -> TraceAccount:
    """The accounting of a parsed trace."""
    return TraceAccount(selection=result.selection, dropped=result.dropped, dropped_by_stage=result.dropped_by_stage,
                        needed_bytes=result.needed_bytes, capacity=result.capacity, torn=result.torn,
                        relaunched=relaunched, first_capacity=first_capacity)

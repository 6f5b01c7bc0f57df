"""The sink's header: the selection of stages, tiles and k-blocks a run records (TraceSelection), the
bytes the host initialises a sink with, and the strict reader of a header (parse_header)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch

from harness.taps import ALL_TAP_STAGES, TAP_STAGES, DescriptorRecord
from harness.trace_format.format import (
    FLAG_ALL_K_BLOCKS, GROUP_SELECTORS, HEADER_BYTES, HEADER_BYTES_OF_VERSION, HEADER_FIXED, HEADER_OFFSETS,
    HEAD_BYTES_OF_VERSION, INT32_MAX, KBLOCK_WINDOW, KNOWN_FLAGS, MAGIC, MAX_GROUPS, MAX_STAGE_CODE_OF_VERSION, MAX_TILES, NONE,
    READABLE_VERSIONS, RECORD_ALIGN, STAGE_CODES, STAGE_COUNTERS_OF_VERSION, STAGE_NAMES, STAGES_MASK_OF_VERSION,
    TILE_SELECTOR, TraceHeaderError, TraceTruncatedError, VERSION, _DROPPED_BY_STAGE_OF_VERSION, _KB_BITS_OFFSET,
    _TILES_OFFSET)
from harness.trace_format.records import encode_descriptor


@dataclass(frozen=True)
class TraceSelection:
    """What the kernel records: stages, output tiles, k-blocks and groups.

    tiles: None records every tile; else up to 32 (tile_m, tile_n) selectors where -1 (or None)
    matches any index, so (3, -1) is a whole row of tiles. k_blocks: None records every
    k-block; else k-blocks inside one 1024-wide window. Stages without a k-block (epilogue)
    ignore the k-block selection. `stages` may name any stage the format has a code for
    (harness.taps.ALL_TAP_STAGES: GEMM's and attention's); the default is GEMM's. For attention a
    tile is (query block, query head) and a k-block a KV block. groups: None records every group
    (of a grouped GEMM), batch entry (of a batched GEMM or an attention batch); else up to 4 of
    them; a tap that names no group is always recorded.
    """

    tiles: Optional[tuple[tuple[int, int], ...]] = None
    k_blocks: Optional[tuple[int, ...]] = None
    stages: tuple[str, ...] = TAP_STAGES
    groups: Optional[tuple[int, ...]] = None

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
        if self.groups is not None:
            groups = tuple(self.groups) if isinstance(self.groups, (tuple, list)) else None
            if not groups or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 or g > INT32_MAX
                                 for g in groups):
                raise ValueError(f"selection groups {self.groups!r} must be a non-empty list of ints >= 0")
            groups = tuple(sorted(set(groups)))
            if len(groups) > MAX_GROUPS:
                raise ValueError(f"selection has {len(groups)} groups; at most {MAX_GROUPS} fit in the header")
            object.__setattr__(self, "groups", groups)
        for s in self.stages:
            if not isinstance(s, str) or s not in STAGE_CODES:
                raise ValueError(f"selection stage {s!r} is unknown; allowed: {', '.join(ALL_TAP_STAGES)}")
        object.__setattr__(self, "stages", tuple(s for s in ALL_TAP_STAGES if s in set(self.stages)))

    def records_tile(self, tile: tuple[int, int]) -> bool:
        if self.tiles is None:
            return True
        return any((sm < 0 or sm == tile[0]) and (sn < 0 or sn == tile[1]) for sm, sn in self.tiles)

    def records_k_block(self, k_block: Optional[int]) -> bool:
        return k_block is None or k_block < 0 or self.k_blocks is None or k_block in self.k_blocks

    def records_group(self, group: Optional[int]) -> bool:
        return group is None or group < 0 or self.groups is None or group in self.groups

    def records(self, stage: str, tile: tuple[int, int], k_block: Optional[int], group: Optional[int] = None) -> bool:
        return (stage in self.stages and self.records_tile(tile) and self.records_k_block(k_block)
                and self.records_group(group))


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
    # an unknown `version` (a test's corrupt header) gets the current layout
    too_new = [s for s in selection.stages if STAGE_CODES[s] > MAX_STAGE_CODE_OF_VERSION.get(version, 255)]
    if too_new:
        raise ValueError(f"a version-{version} header cannot select the stages {', '.join(too_new)} "
                         f"(codes above {MAX_STAGE_CODE_OF_VERSION[version]})")
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
    head = bytearray(HEADER_BYTES_OF_VERSION.get(version, HEADER_BYTES))
    groups = selection.groups or ()
    HEADER_FIXED.pack_into(head, 0, magic, version, len(head), capacity, cursor, dropped, flags, stage_mask,
                           len(tiles), kb_base, len(groups))
    GROUP_SELECTORS.pack_into(head, HEADER_OFFSETS["groups"], *groups, *[0] * (MAX_GROUPS - len(groups)))
    for i, (tm, tn) in enumerate(tiles):
        TILE_SELECTOR.pack_into(head, _TILES_OFFSET + 8 * i, tm, tn)
    struct.pack_into(f"<{len(bits)}I", head, _KB_BITS_OFFSET, *bits)
    layout = version if version in HEADER_BYTES_OF_VERSION else VERSION
    n_counters = STAGE_COUNTERS_OF_VERSION[layout]
    if n_counters:
        counts = list(dropped_by_stage)[:n_counters]
        counts += [0] * (n_counters - len(counts))
        _DROPPED_BY_STAGE_OF_VERSION[layout].pack_into(head, HEADER_OFFSETS["dropped_by_stage"], *counts)
    return bytes(head)


def _check_capacity(capacity: int, version: int = VERSION) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ValueError(f"sink capacity must be an int, got {type(capacity).__name__}")
    hb = HEADER_BYTES_OF_VERSION.get(version, HEADER_BYTES)
    if capacity < hb + RECORD_ALIGN or capacity % RECORD_ALIGN or capacity >= 2**63:
        raise ValueError(f"sink capacity {capacity} must be a multiple of {RECORD_ALIGN}, at least "
                         f"{hb + RECORD_ALIGN} (the {hb}-byte header plus records)")


def sink_prefix(capacity: int, tiles: Optional[Iterable] = None, k_blocks: Optional[Iterable[int]] = None, *,
                stages: Optional[Iterable[str]] = None, descriptors: Sequence[DescriptorRecord] = (),
                groups: Optional[Iterable[int]] = None) -> bytes:
    """The start of an initial sink of `capacity` bytes: the header with the selection, then the
    pre-written records. Every byte after it must be zero (harness.runner.SinkRequest zero-fills).
    `descriptors` are TMA descriptor fields known to the host; they are pre-written as records."""
    _check_capacity(capacity)
    selection = TraceSelection(
        tiles=None if tiles is None else tuple(tuple(t) for t in tiles),
        k_blocks=None if k_blocks is None else tuple(k_blocks),
        stages=TAP_STAGES if stages is None else tuple(stages),
        groups=None if groups is None else tuple(groups),
    )
    records = b"".join(encode_descriptor(d) for d in descriptors)
    if len(records) > capacity - HEADER_BYTES:
        raise ValueError(f"{len(descriptors)} host descriptor records need {len(records)} bytes, more than the "
                         f"{capacity - HEADER_BYTES}-byte record area of a {capacity}-byte sink")
    return _encode_header(capacity, selection, cursor=len(records)) + records


def sink_init_bytes(capacity: int, tiles: Optional[Iterable] = None, k_blocks: Optional[Iterable[int]] = None, *,
                    stages: Optional[Iterable[str]] = None, descriptors: Sequence[DescriptorRecord] = (),
                    groups: Optional[Iterable[int]] = None) -> bytes:
    """The whole initial sink, `capacity` bytes: `sink_prefix`, then a zeroed record area.

    Copy all of it to the sink memory before the launch (the record area must be zero)."""
    head = sink_prefix(capacity, tiles, k_blocks, stages=stages, descriptors=descriptors, groups=groups)
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
     n_groups) = HEADER_FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise TraceHeaderError(f"trace magic is 0x{magic:08x}, expected 0x{MAGIC:08x} ('OTRC'): not a trace "
                               f"sink, or the sink was never initialised", 0)
    if version not in READABLE_VERSIONS:
        raise TraceHeaderError(f"trace format version {version} is not supported; this parser reads versions "
                               f"{', '.join(map(str, READABLE_VERSIONS))}", HEADER_OFFSETS["version"])
    want_header = HEADER_BYTES_OF_VERSION[version]
    if header_bytes != want_header:
        raise TraceHeaderError(f"trace header_bytes is {header_bytes}, expected {want_header}"
                               + (f" (version {version})" if version != VERSION else ""),
                               HEADER_OFFSETS["header_bytes"])
    if len(mv) < want_header:
        raise TraceTruncatedError(f"trace buffer has {len(mv)} bytes, fewer than the {want_header}-byte header", 0)
    if capacity < want_header + RECORD_ALIGN or capacity % RECORD_ALIGN:
        raise TraceHeaderError(f"trace capacity {capacity} must be a multiple of {RECORD_ALIGN} and at least "
                               f"{want_header + RECORD_ALIGN}", HEADER_OFFSETS["capacity"])
    if len(mv) > capacity:
        raise TraceHeaderError(f"trace buffer has {len(mv)} bytes but its header says capacity {capacity}",
                               HEADER_OFFSETS["capacity"])
    if flags & ~KNOWN_FLAGS:
        raise TraceHeaderError(f"trace header flags 0x{flags:x} has unknown bits (known: 0x{KNOWN_FLAGS:x})",
                               HEADER_OFFSETS["flags"])
    known_mask = STAGES_MASK_OF_VERSION[version]
    if stage_mask & ~known_mask:
        raise TraceHeaderError(f"trace stage_mask 0x{stage_mask:x} selects unknown stage codes "
                               f"(known mask 0x{known_mask:x})", HEADER_OFFSETS["stage_mask"])
    if n_tiles > MAX_TILES:
        raise TraceHeaderError(f"trace n_tiles {n_tiles} exceeds {MAX_TILES}", HEADER_OFFSETS["n_tiles"])
    if n_groups > MAX_GROUPS:
        raise TraceHeaderError(f"trace n_groups {n_groups} exceeds {MAX_GROUPS}", HEADER_OFFSETS["n_groups"])
    groups = GROUP_SELECTORS.unpack_from(mv, HEADER_OFFSETS["groups"])[:n_groups]
    if any(g < 0 for g in groups):
        raise TraceHeaderError(f"trace group selectors {list(groups)}: each must be >= 0", HEADER_OFFSETS["groups"])
    if cursor % RECORD_ALIGN:
        raise TraceHeaderError(f"trace cursor {cursor} is not a multiple of {RECORD_ALIGN}", HEADER_OFFSETS["cursor"])
    if cursor > capacity - want_header and dropped == 0:
        raise TraceHeaderError(f"trace cursor {cursor} is past the {capacity - want_header}-byte record area but "
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
    stages = tuple(s for s in ALL_TAP_STAGES if stage_mask >> STAGE_CODES[s] & 1)
    all_tiles = any(tm < 0 and tn < 0 for tm, tn in tiles)
    try:
        selection = TraceSelection(tiles=None if all_tiles else tuple(tiles), k_blocks=k_blocks, stages=stages,
                                   groups=tuple(groups) or None)
    except ValueError as e:  # every field was checked above; this names anything still amiss
        raise TraceHeaderError(f"trace header selection is not valid: {e}", HEADER_OFFSETS["tiles"]) from None
    by_stage = None
    if STAGE_COUNTERS_OF_VERSION[version]:
        counts = _DROPPED_BY_STAGE_OF_VERSION[version].unpack_from(mv, HEADER_OFFSETS["dropped_by_stage"])
        for code, n in enumerate(counts):
            if n and (code not in STAGE_NAMES or code > MAX_STAGE_CODE_OF_VERSION[version]):
                raise TraceHeaderError(f"trace dropped_by_stage[{code}] is {n}, but {code} is no stage code",
                                       HEADER_OFFSETS["dropped_by_stage"] + 4 * code)
        if sum(counts) > dropped:
            raise TraceHeaderError(f"trace dropped_by_stage sums to {sum(counts)}, more than the {dropped} records "
                                   f"counted as dropped", HEADER_OFFSETS["dropped_by_stage"])
        by_stage = tuple((STAGE_NAMES[c], n) for c, n in enumerate(counts) if n)
    return SinkHeader(version=version, header_bytes=header_bytes, capacity=capacity, cursor=cursor,
                      dropped=dropped, flags=flags, selection=selection, dropped_by_stage=by_stage)


def trace_extent(header: bytes) -> int:
    """How many bytes of a sink to copy back, given its first HEADER_BYTES bytes (or the whole
    buffer, where it is shorter: an older version's header is smaller)."""
    return parse_header(header[:HEADER_BYTES]).extent

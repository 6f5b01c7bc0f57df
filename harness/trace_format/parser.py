"""The strict parser: a sink's records, read once, assembled into `harness.taps.Tap` and
`DescriptorRecord` objects (parse_trace -> TraceResult). A well-formed sink is read by the bulk
reader (harness.trace_format.bulk); any other record by record here. Every malformed input raises
a `TraceFormatError` subclass whose message names the field, the value and the byte offset."""

from __future__ import annotations

import struct
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from harness import knobs as _knobs
from harness.taps import (
    ALL_TAP_STAGES, DESCRIPTOR_STAGES, K_BLOCK_STAGES, LOAD_STAGES, DescriptorRecord, Tap, TapError)
from harness.trace_format.format import (
    BLOCK_BODY, BYTES_BODY, COMMIT_TAG, DESCRIPTOR_BODY, DTYPE_CODES, DTYPE_NAMES, DTYPE_SIZE, DTYPE_TORCH,
    ELEMENTS_BODY, MAX_STAGE_CODE_OF_VERSION, MAX_TILE_DIM, NONE, OOB_FILL_CODES, OPERAND_CODES, RECORD_ALIGN, RECORD_HEAD,
    RECORD_HEAD_V1, RecordKind, STAGE_CODES, STAGE_NAMES, SWIZZLE_BYTES, TAP_DENSE_FLOOR_BYTES, TAP_SPARSE_RATIO,
    TraceCodeError, TraceConflictError, TraceCoordinateError, TraceFormatError, TraceLimitError, TraceRecordError,
    TraceTruncatedError, VERSION, _BITS, _round_up)
from harness.trace_format.bulk import read_bulk
from harness.trace_format.header import TraceSelection, _buffer, parse_header


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
    warning_kinds: tuple[str, ...] = ()  # the kind (WARNING_KINDS) of each line of `warnings`, in order
    warning_counts: tuple[tuple[str, int], ...] = ()  # (kind, how many) of each kind that occurred

    def warnings_of(self, kind: str) -> tuple[str, ...]:
        """The warning lines of one kind (WARNING_KINDS), the line that counts the rest included."""
        if kind not in WARNING_KINDS:
            raise ValueError(f"warning kind {kind!r} is unknown; known: {', '.join(WARNING_KINDS)}")
        return tuple(w for w, k in zip(self.warnings, self.warning_kinds) if k == kind)

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
# the kinds of warning the parser gives
WARN_TORN = "torn"  # a record reserved and never completed (partial=True): also counted in `torn`
WARN_UNSELECTED = "records of taps the sink header did not select"
WARN_SLOT = "taps whose records disagree on the slot"
WARN_CTAS = "taps written by several CTAs"
WARNING_KINDS = (WARN_TORN, WARN_UNSELECTED, WARN_SLOT, WARN_CTAS)


class _Warnings:
    """The parser's warnings, at most MAX_WARNINGS_PER_KIND of each kind, then one line that counts the rest."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []  # (kind, text)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_WARNINGS_PER_KIND:
            self.lines.append((kind, text))

    def result(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, int], ...]]:
        """The lines, the kind of each, and the count of each kind."""
        more = [(kind, f"... and {n - MAX_WARNINGS_PER_KIND} more warning(s) like these: {kind}")
                for kind, n in self.counts.items() if n > MAX_WARNINGS_PER_KIND]
        lines = self.lines + more
        return tuple(t for _, t in lines), tuple(k for k, _ in lines), tuple(self.counts.items())


def _expected_shape(stage: str, block_m: int, block_n: int, block_k: int, dtype: str = "",
                    head_dim_v: Optional[int] = None, scale_groups: int = 1) -> tuple[int, int]:
    """A tap's tile shape; a load of a packed operand (uint8 bytes) holds two k per byte. Attention:
    block_m query rows, block_n keys (a KV block), block_k the head dim of Q and K, head_dim_v
    (default block_k) that of V (harness.taps' table). A scale tap holds `scale_groups` columns (the
    scale groups of one k-block)."""
    dv = block_k if head_dim_v is None else head_dim_v
    if stage == "scale_a":
        return (block_m, scale_groups)
    if stage == "scale_b":
        return (block_n, scale_groups)
    if stage == "load_q":
        return (block_m, block_k)
    if stage == "load_k":
        return (block_n, block_k)
    if stage == "load_v":
        return (block_n, dv)
    if stage == "softmax_state":
        return (block_m, 3)
    if stage == "o":
        return (block_m, dv)
    if stage in ("normalize", "combine"):
        return (block_m, dv + 1)
    packed_k = block_k // 2 if dtype == "uint8" and stage in LOAD_STAGES else block_k
    if stage in ("load_a", "dequant_a"):
        return (block_m, packed_k)
    if stage in ("load_b", "dequant_b"):
        return (packed_k, block_n)
    return (block_m, block_n)


def _first_nonzero(mv: memoryview, start: int, end: int) -> Optional[int]:
    """The offset of the first non-zero byte in [start, end), read in chunks of 8-byte words (no
    copy of the range); the bytes before the first word and after the last one by themselves."""
    lo, hi = min(end, -(-start // 8) * 8), max(start, end // 8 * 8)
    edges = [o for o in [*range(start, lo), *range(max(hi, lo), end)] if mv[o]]
    if edges and edges[0] < lo:
        return edges[0]
    step = 1 << 22
    for at in range(lo, hi, step):
        words = np.frombuffer(mv, dtype=np.uint64, offset=at, count=min(step, hi - at) // 8)
        if words.max():
            return at + int(np.argmax(np.frombuffer(mv, dtype=np.uint8, offset=at, count=words.size * 8) != 0))
    return edges[0] if edges else None


def _tap_byte_limit(max_tap_bytes: Optional[int]) -> tuple[int, str]:
    """The limit on the assembled taps' bytes and how a refusal names it."""
    if max_tap_bytes is None:
        mb = _knobs.get("ORACLE_TRACE_MAX_TAPS_MB")
        return mb << 20, f"the {mb} MiB limit of ORACLE_TRACE_MAX_TAPS_MB"
    if isinstance(max_tap_bytes, bool) or not isinstance(max_tap_bytes, int) or max_tap_bytes <= 0:
        raise ValueError(f"parse_trace: max_tap_bytes={max_tap_bytes!r} must be a positive int or None")
    return max_tap_bytes, f"the limit of {max_tap_bytes} bytes (max_tap_bytes)"


def parse_trace(buf, *, block_m: int, block_n: int, block_k: int, partial: bool = False,
                max_tap_bytes: Optional[int] = None, head_dim_v: Optional[int] = None,
                scale_groups: int = 1) -> TraceResult:
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
    a small multiple of the largest record, and a few hundred bytes per record (the bulk reader's
    columns).
    A well-formed trace is read in bulk (harness.trace_format.bulk); one the bulk reader does not
    take (a warning, an error, an element held twice) is read record by record, with the same result.
    An attention trace (version 3) is read with block_m = the query block's rows, block_n = the KV
    block's keys, block_k = the head dim of Q and K and `head_dim_v` that of V (default block_k).
    A block-scaled GEMM's scale_a / scale_b taps are [block_m, scale_groups] / [block_n, scale_groups]
    (kernels_ref.scales.groups_per_k_block: the scale groups of one k-block).
    """
    return _parse(buf, block_m=block_m, block_n=block_n, block_k=block_k, partial=partial,
                  max_tap_bytes=max_tap_bytes, head_dim_v=head_dim_v, scale_groups=scale_groups)


def _parse(buf, *, block_m: int, block_n: int, block_k: int, partial: bool = False,
           max_tap_bytes: Optional[int] = None, bulk: bool = True, head_dim_v: Optional[int] = None,
           scale_groups: int = 1) -> TraceResult:
    """parse_trace; `bulk=False` reads record by record whatever the trace holds."""
    if isinstance(scale_groups, bool) or not isinstance(scale_groups, int) or not 1 <= scale_groups <= MAX_TILE_DIM:
        raise ValueError(f"parse_trace: scale_groups={scale_groups!r} must be an int in 1..{MAX_TILE_DIM}")
    for name, v in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TILE_DIM:
            raise ValueError(f"parse_trace: {name}={v!r} must be an int in 1..{MAX_TILE_DIM}")
    if head_dim_v is not None and (isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int)
                                   or not 1 <= head_dim_v < MAX_TILE_DIM):
        raise ValueError(f"parse_trace: head_dim_v={head_dim_v!r} must be an int in 1..{MAX_TILE_DIM - 1}")
    def shape_of(stage, bm, bn, bk, dtype=""):
        return _expected_shape(stage, bm, bn, bk, dtype, head_dim_v, scale_groups)
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

    if bulk:
        got = read_bulk(mv, header, block_m=block_m, block_n=block_n, block_k=block_k, tap_limit=tap_limit,
                        expected_shape=shape_of, parse_descriptor=_parse_descriptor)
        if got is not None:
            taps, descriptors, n_records = got
            return TraceResult(taps=taps, descriptors=tuple(dict.fromkeys(descriptors)), dropped=header.dropped,
                               capacity=header.capacity, used_bytes=header.used, records=n_records, warnings=(),
                               selection=header.selection, dropped_by_stage=header.dropped_by_stage,
                               needed_bytes=header.cursor, torn=0, version=header.version)
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
                warnings.add(WARN_TORN, f"record at byte {off} was reserved but never written (the kernel stopped); "
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
                warnings.add(WARN_TORN, f"record at byte {off} ({size} bytes) was not committed (the kernel stopped "
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
        stage = STAGE_NAMES.get(stage_code) if stage_code <= MAX_STAGE_CODE_OF_VERSION[header.version] else None
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
        if stage in K_BLOCK_STAGES and k_block < 0:
            raise TraceCoordinateError(f"{stage} record tile ({tile_m}, {tile_n}) has no k-block; the stage needs one",
                                       off + 28)
        kb = None if k_block < 0 else k_block
        key = (stage, (tile_m, tile_n), kb, None if part < 0 else part, None if group < 0 else group)
        if not header.selection.records(stage, (tile_m, tile_n), kb, key[4]) and key not in unselected:
            unselected.add(key)
            warnings.add(WARN_UNSELECTED,
                         f"record at byte {off}: {stage} tile ({tile_m}, {tile_n}) k-block {kb}"
                         f"{'' if group < 0 else f' group {group}'} was not selected "
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
            shape = shape_of(stage, block_m, block_n, block_k, dtype)
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
    order = {s: i for i, s in enumerate(ALL_TAP_STAGES)}
    none_first = (lambda v: -1 if v is None else v)  # noqa: E731
    for key in sorted(pieces, key=lambda k: (order[k[0]], k[1], none_first(k[2]), none_first(k[3]),
                                             none_first(k[4]))):
        taps.append(_assemble(key, pieces[key], warnings, hb))
    unique_descriptors = tuple(dict.fromkeys(descriptors))
    lines, kinds, counts = warnings.result()
    return TraceResult(taps=tuple(taps), descriptors=unique_descriptors, dropped=header.dropped,
                       capacity=header.capacity, used_bytes=header.used, records=n_records,
                       warnings=lines, warning_kinds=kinds, warning_counts=counts, selection=header.selection,
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
        warnings.add(WARN_SLOT,
                     f"{where}: records disagree on the pipeline slot {slots}; the tap keeps {first.slot}")
    if len(ctas) > 1:
        warnings.add(WARN_CTAS, f"{where}: written by several CTAs {ctas}; the tap keeps CTA "
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

"""TraceWriter: whole trace buffers made in pure Python, record by record, as a kernel would, so the
parser and everything downstream can be tested without a GPU."""

from __future__ import annotations

import struct
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from harness.taps import DESCRIPTOR_STAGES, TAP_STAGES, DescriptorRecord, Tap
from harness.trace_format.format import (
    BLOCK_BODY, BYTES_BODY, COMMIT_TAG, DTYPE_SIZE, ELEMENTS_BODY, HEADER_BYTES_OF_VERSION, MAGIC,
    MAX_STAGE_CODE_OF_VERSION, READABLE_VERSIONS, RecordKind, STAGE_CODES, STAGE_COUNTERS_OF_VERSION, VERSION)
from harness.trace_format.records import ValuesLike, _dtype_name, _value_bytes, encode_descriptor, encode_record
from harness.trace_format.header import TraceSelection, _check_capacity, _encode_header


class TraceWriter:
    """Builds trace buffers in pure Python, record by record, as a kernel would.

    Each method appends one record and returns its byte offset in the buffer. `to_bytes()`
    lays them out after the header; records that do not fit are dropped and the area is
    closed with a pad record, exactly as the device does. `raw()` appends arbitrary bytes,
    for building corrupt buffers.
    """

    def __init__(self, capacity: int = 1 << 20, *, tiles: Optional[Iterable] = None,
                 k_blocks: Optional[Iterable[int]] = None, stages: Optional[Iterable[str]] = None,
                 version: int = VERSION, groups: Optional[Iterable[int]] = None) -> None:
        if version not in READABLE_VERSIONS:
            raise ValueError(f"version {version} is not a trace format version ({READABLE_VERSIONS})")
        _check_capacity(capacity, version)
        self.capacity = capacity
        self.version = version
        self.header_bytes = HEADER_BYTES_OF_VERSION[version]
        self.selection = TraceSelection(
            tiles=None if tiles is None else tuple(tuple(t) for t in tiles),
            k_blocks=None if k_blocks is None else tuple(k_blocks),
            stages=tuple(s for s in TAP_STAGES if STAGE_CODES[s] <= MAX_STAGE_CODE_OF_VERSION[version])
            if stages is None else tuple(stages),  # default: every GEMM stage the version has a code for
            groups=None if groups is None else tuple(groups))
        newer = [s for s in self.selection.stages if STAGE_CODES[s] > MAX_STAGE_CODE_OF_VERSION[version]]
        if newer:
            raise ValueError(f"a version-{version} trace cannot hold the stages {', '.join(newer)}")
        self._records: list[bytes] = []

    def _offset(self) -> int:
        return self.header_bytes + sum(len(r) for r in self._records)

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
        area = self.capacity - self.header_bytes
        body = bytearray(area)
        pos = 0
        n_dropped = 0
        n_counters = max(STAGE_COUNTERS_OF_VERSION[self.version], 1)
        by_stage = [0] * n_counters
        for r in self._records:
            if pos + len(r) > area:
                n_dropped += 1
                if len(r) > 8:
                    by_stage[r[8] % n_counters] += 1
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

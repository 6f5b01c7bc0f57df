"""The bulk reader: a well-formed sink read in whole-array passes instead of record by record
(read_bulk -> taps, descriptor records, record count), for parser.parse_trace.

Data path: the record chain is walked once for its offsets (one 4-byte read per record); every
record head is decoded at once through one structured dtype over a gather of the heads; each check
the strict parser makes of a record is made on whole columns; element records are gathered per
(count, element size) into 2-D arrays of coordinates and values (one row copy per record, no
per-element index); each tap is then assembled into its own arrays: one scatter per tap for its
element records, one slice assignment per block or byte-image record.

Constraints: reads only what the strict parser reads without a warning or an error. A record that
is torn, a pad record, a record the header did not select, a bad code, size, shape or coordinate,
a tap whose records disagree on dtype, image size, slot or CTA or hold an element twice, and a
trace over the taps' memory limits: read_bulk returns None and the caller parses record by record
(parser.py), which raises the error or gives the warnings. A little-endian host only (None
otherwise). Its result equals the strict parser's (tests/cpu/test_trace_bulk.py).
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import numpy as np
import torch

from harness.taps import ALL_TAP_STAGES, DESCRIPTOR_STAGES, K_BLOCK_STAGES, Tap, TapError
from harness.trace_format.format import (
    COMMIT_TAG, DTYPE_NAMES, DTYPE_SIZE, DTYPE_TORCH, MAX_STAGE_CODE_OF_VERSION, NONE, RECORD_ALIGN, RecordKind,
    STAGE_NAMES,
    TAP_DENSE_FLOOR_BYTES, TAP_SPARSE_RATIO, TraceFormatError, TraceLimitError, _BITS)
from harness.trace_format.header import SinkHeader

_HEAD_FIELDS = [("size", "<u4"), ("kind", "<u2"), ("commit", "<u2"), ("stage", "u1"), ("dtype", "u1"),
                ("reserved", "<u2"), ("thread", "<u4"), ("cta", "<u4"), ("tile_m", "<i4"), ("tile_n", "<i4"),
                ("k_block", "<i4"), ("slot", "<i4"), ("rows", "<u2"), ("cols", "<u2")]
HEAD_DTYPES = {1: np.dtype(_HEAD_FIELDS), 2: np.dtype(_HEAD_FIELDS + [("partial", "<i4"), ("group", "<i4")])}
HEAD_DTYPES[3] = HEAD_DTYPES[2]
_ELEMENTS, _BLOCK, _BYTES, _DESCRIPTOR = (int(k) for k in (RecordKind.ELEMENTS, RecordKind.BLOCK, RecordKind.BYTES,
                                                          RecordKind.DESCRIPTOR))


def _table(pairs, fill=0, dtype=np.int64) -> np.ndarray:
    """A 256-entry lookup table indexed by a one-byte code."""
    t = np.full(256, fill, dtype)
    for code, v in pairs:
        t[code] = v
    return t


_STAGE_KNOWN = _table(((c, True) for c in STAGE_NAMES), False, bool)
_DTYPE_KNOWN = _table(((c, True) for c in DTYPE_NAMES), False, bool)
_ITEMSIZE = _table((c, DTYPE_SIZE[d]) for c, d in DTYPE_NAMES.items())
_RANK = _table((c, ALL_TAP_STAGES.index(s)) for c, s in STAGE_NAMES.items())  # the strict parser's tap order
_IMAGE = _table(((c, s in DESCRIPTOR_STAGES) for c, s in STAGE_NAMES.items()), False, bool)
_NEEDS_KB = _table(((c, s in K_BLOCK_STAGES) for c, s in STAGE_NAMES.items()), False, bool)


def _walk(mv: memoryview, start: int, n: int, hb: int) -> Optional[np.ndarray]:
    """Byte offsets (from `start`) of the records in the `n` bytes of the record area, or None
    where a size is zero, unaligned, smaller than a head or runs past the end. A run of records of
    one size (a stage's records, from every thread) is measured in numpy, through a strided view of
    the sizes it would have."""
    words = mv[start:start + n].cast("I")
    u32 = np.frombuffer(mv, np.uint32, count=n >> 2, offset=start)
    at, step, many = [], [], []  # each run: first word, words per record, records
    o, end, least, prev = 0, n >> 2, hb >> 2, -1
    while o < end:
        size = words[o]
        if size & (RECORD_ALIGN - 1) or size == 0 or ((size >> 2) < least and o + (size >> 2) != end):
            return None  # (the last record may be a pad record, smaller than a head)
        w = size >> 2
        k = 1
        if size == prev:  # the second of its size in a row: how many follow, in growing looks
            seen, chunk = u32[o:end:w], 16
            k = 0
            while k < len(seen):
                differ = np.flatnonzero(seen[k:k + chunk] != size)
                if differ.size:
                    k += int(differ[0])
                    break
                k += len(seen[k:k + chunk])
                chunk *= 4
        at.append(o)
        step.append(w)
        many.append(k)
        prev = size
        o += k * w
    if o != end:
        return None
    many = np.asarray(many, np.int64)
    first = np.cumsum(many) - many
    i = np.arange(int(many.sum()), dtype=np.int64) - np.repeat(first, many)
    return (np.repeat(np.asarray(at, np.int64), many) + i * np.repeat(np.asarray(step, np.int64), many)) << 2


def _rows(view: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """view[s:s + width] for each s in `starts`, as one [len(starts), width] array."""
    if width == 0:
        return np.zeros((len(starts), 0), view.dtype)
    return np.lib.stride_tricks.sliding_window_view(view, width)[np.minimum(starts, len(view) - width)]


def _round_up(x: np.ndarray) -> np.ndarray:
    return (x + (RECORD_ALIGN - 1)) // RECORD_ALIGN * RECORD_ALIGN


def read_bulk(mv: memoryview, header: SinkHeader, *, block_m: int, block_n: int, block_k: int, tap_limit: int,
              expected_shape: Callable, parse_descriptor: Callable) -> Optional[tuple]:
    """(taps in the strict parser's order, descriptor records in record order, records read), or None
    for a trace the strict parser must read (see the module docstring). `expected_shape` and
    `parse_descriptor` are the strict parser's own (parser._expected_shape, parser._parse_descriptor).
    Raises nothing of its own: every refusal is the strict parser's, in its order."""
    if sys.byteorder != "little":
        return None
    hb = header.head_bytes
    start, n = header.header_bytes, header.used
    if n % RECORD_ALIGN:
        return None
    if n == 0:
        return (), [], 0
    offs = _walk(mv, start, n, hb)
    if offs is None:
        return None
    last = start + int(offs[-1])
    if int.from_bytes(mv[last + 4:last + 6], "little") == RecordKind.PAD:  # it must close an overflowed area
        if header.cursor <= header.area or int.from_bytes(mv[last + 6:last + 8], "little") != COMMIT_TAG:
            return None
        offs = offs[:-1]
        if len(offs) == 0:
            return (), [], 0
    if n - int(offs[-1]) < hb:  # a last record smaller than a head, and no pad record
        return None
    area = np.frombuffer(mv, np.uint8, count=n, offset=start)
    u16, u32 = area.view("<u2"), area.view("<u4")
    typed = {1: area, 2: area.view("<i2"), 4: area.view("<i4")}  # value bits as the taps hold them
    head = _rows(area, offs, hb).view(HEAD_DTYPES[header.version])[:, 0]
    kind, stage, dtype = head["kind"].astype(np.int64), head["stage"], head["dtype"]
    size = head["size"].astype(np.int64)
    if not ((head["commit"] == COMMIT_TAG).all() and _STAGE_KNOWN[stage].all() and _DTYPE_KNOWN[dtype].all()
            and (stage <= MAX_STAGE_CODE_OF_VERSION[header.version]).all()
            and ((kind >= _ELEMENTS) & (kind <= _DESCRIPTOR)).all()):
        return None

    # descriptor records: the strict parser's own reader (one it refuses: the strict parser raises
    # the first error in record order)
    n_records = len(offs)
    descriptors = []
    for i in np.flatnonzero(kind == _DESCRIPTOR).tolist():
        o = start + int(offs[i])
        try:
            descriptors.append(parse_descriptor(mv[o:o + int(size[i])], o, STAGE_NAMES[int(stage[i])],
                                                DTYPE_NAMES[int(dtype[i])], hb))
        except TraceFormatError:
            return None
    tr = np.flatnonzero(kind != _DESCRIPTOR)
    if len(tr) == 0:
        return (), descriptors, n_records
    h, offs, kind, stage, size = head[tr], offs[tr], kind[tr], stage[tr], size[tr]
    tm, tn, kb, slot = (h[f].astype(np.int64) for f in ("tile_m", "tile_n", "k_block", "slot"))
    part, group = ((h["partial"].astype(np.int64), h["group"].astype(np.int64)) if header.version >= 2
                   else (np.full(len(tr), NONE), np.full(len(tr), NONE)))
    isz = _ITEMSIZE[h["dtype"]]
    image = _IMAGE[stage]
    ok = (tm >= 0) & (tn >= 0) & (kb >= NONE) & (slot >= NONE) & (part >= NONE) & (group >= NONE)
    ok &= ~_NEEDS_KB[stage] | (kb >= 0)
    ok &= image == (kind == _BYTES)
    if not ok.all() or not _selected(header, stage, tm, tn, kb, group).all():
        return None

    # each record's tap shape, and its body against its size
    rows, cols = np.zeros(len(tr), np.int64), np.zeros(len(tr), np.int64)
    body = offs + hb
    for code in np.unique(stage.astype(np.int64) << 8 | h["dtype"]).tolist():
        s, d = code >> 8, code & 0xFF
        at = (stage == s) & (h["dtype"] == d)
        name = STAGE_NAMES[s]
        if name in DESCRIPTOR_STAGES:
            continue
        rows[at], cols[at] = expected_shape(name, block_m, block_n, block_k, DTYPE_NAMES[d])
    tiled = ~image
    if not ((h["rows"][tiled] == rows[tiled]).all() and (h["cols"][tiled] == cols[tiled]).all()):
        return None
    count = np.where(kind == _ELEMENTS, u32[np.minimum(body >> 2, len(u32) - 1)], 0).astype(np.int64)
    b16 = _rows(u16, np.where(kind == _BLOCK, body >> 1, 0), 4).astype(np.int64)  # row0, col0, rows, cols
    b32 = _rows(u32, np.where(kind == _BYTES, body >> 2, 0), 3).astype(np.int64)  # offset, nbytes, total
    r0, c0, nr, nc = (np.where(kind == _BLOCK, b16[:, i], 0) for i in range(4))
    ioff, nbytes, total = (np.where(kind == _BYTES, b32[:, i], 0) for i in range(3))
    want = np.select([kind == _ELEMENTS, kind == _BLOCK], [hb + 8 + count * (4 + isz), hb + 8 + nr * nc * isz],
                     hb + 16 + nbytes)
    most = np.where(_table((c, s == "descriptor_a") for c, s in STAGE_NAMES.items())[stage], block_m, block_n) \
        * block_k * isz
    ok = _round_up(want) == size
    ok &= (kind != _BLOCK) | ((r0 + nr <= rows) & (c0 + nc <= cols))
    ok &= (kind != _BYTES) | ((total > 0) & (ioff + nbytes <= total) & (total <= most))
    if not ok.all():
        return None
    rows = np.where(image, 1, rows)
    cols = np.where(image, total, cols)
    isz = np.where(image, 1, isz)  # from here: the size of a value as the tap holds it (an image's: bytes)

    # taps: records grouped by (stage, tile, k-block, partial, group), in the strict parser's order
    order = np.lexsort((group, part, kb, tn, tm, _RANK[stage]))
    keys = np.stack([stage, tm, tn, kb, part, group])[:, order]
    new = np.empty(len(order), bool)
    new[0] = True
    new[1:] = (keys[:, 1:] != keys[:, :-1]).any(axis=0)
    first = np.flatnonzero(new)  # positions in `order` of each tap's first record
    tap_of = np.cumsum(new) - 1  # the tap of each position in `order`
    lead = order[first]
    for col in (h["dtype"], slot, h["cta"], total):  # one dtype, image size, slot and CTA per tap
        if (col[order] != col[lead][tap_of]).any():
            return None
    dense = rows[lead] * cols[lead] * (isz[lead] + 1)
    carried = np.add.reduceat(size[order], first)
    need = int(dense.sum())
    if (dense > np.maximum(TAP_DENSE_FLOOR_BYTES, TAP_SPARSE_RATIO * carried)).any() or need > tap_limit:
        return None
    from harness import budget

    try:  # refused: by the strict parser, after every record was read
        budget.require(need, f"the trace's {len(first)} taps (values and masks)", TraceLimitError,
                       advice="trace fewer tiles, k-blocks or stages")
    except TraceLimitError:
        return None

    # each tap's records by kind, in record order: element records, and rectangles (block, byte image)
    taps_ix = np.arange(len(first))
    kind_o = kind[order]
    el = order[kind_o == _ELEMENTS]
    el_first = np.searchsorted(tap_of[kind_o == _ELEMENTS], taps_ix).tolist() + [len(el)]
    el_c = count[el]
    el_same = np.ones(len(first), bool)  # one count for all of a tap's element records
    if len(el):
        lo = np.minimum(np.asarray(el_first[:-1]), len(el) - 1)
        el_same = np.minimum.reduceat(el_c, lo) == np.maximum.reduceat(el_c, lo)
    el_coords = ((body[el] + 8) >> 2)
    el_values = (body[el] + 8 + 4 * el_c) // isz[el]
    el_c = el_c.tolist()
    rect = order[kind_o != _ELEMENTS]
    rect_first = np.searchsorted(tap_of[kind_o != _ELEMENTS], taps_ix).tolist() + [len(rect)]
    r0, c0 = np.where(kind == _BYTES, 0, r0), np.where(kind == _BYTES, ioff, c0)
    nr, nc = np.where(kind == _BYTES, 1, nr), np.where(kind == _BYTES, nbytes, nc)
    vstart = np.where(kind == _BYTES, body + 16, body + 8) // isz
    rect_rows = np.stack([r0, c0, nr, nc, vstart, isz])[:, rect].T.tolist()
    windows: dict = {}

    def window(z: int, c: int) -> np.ndarray:
        """Every run of c values of size z in the area (a view): rows of it are a record's values."""
        if (z, c) not in windows:
            windows[z, c] = np.lib.stride_tricks.sliding_window_view(typed[z], c)
        return windows[z, c]

    taps = []
    rows_l, cols_l = rows[lead].tolist(), cols[lead].tolist()
    isz_l, dtype_l = isz[lead].tolist(), h["dtype"][lead].tolist()
    key_l = keys[:, first].T.tolist()
    slot_l, cta_l, same_l = slot[lead].tolist(), h["cta"][lead].tolist(), el_same.tolist()
    for t in range(len(first)):
        nrow, ncol, z = rows_l[t], cols_l[t], isz_l[t]
        values = np.zeros((nrow, ncol), _BITS[z])
        mask = np.zeros((nrow, ncol), bool)
        flat_v, flat_m = values.reshape(-1), mask.reshape(-1)
        written = 0
        a, b = el_first[t], el_first[t + 1]
        if b > a:
            for i, j in ((a, b),) if same_l[t] else ((i, i + 1) for i in range(a, b)):
                c = el_c[i]
                coords = window(4, c)[el_coords[i:j]].view(np.uint16)  # row, col of each value
                r, cc = coords[:, 0::2], coords[:, 1::2]
                if c and (int(r.max()) >= nrow or int(cc.max()) >= ncol):
                    return None
                pos = r.astype(np.intp)
                pos *= ncol
                pos += cc
                flat_v[pos] = window(z, c)[el_values[i:j]]
                flat_m[pos] = True
                written += pos.size
        for i in range(rect_first[t], rect_first[t + 1]):
            ra, ca, na, nb, vs, zz = rect_rows[i]
            values[ra:ra + na, ca:ca + nb] = typed[zz][vs:vs + na * nb].reshape(na, nb)
            mask[ra:ra + na, ca:ca + nb] = True
            written += na * nb
        held = int(np.count_nonzero(flat_m))
        if held != written:  # an element held twice: the strict parser compares the values
            return None
        s, tile_m, tile_n, k, p_, g = key_l[t]
        name = STAGE_NAMES[s]
        if name in DESCRIPTOR_STAGES:
            tv = torch.from_numpy(flat_v)
            tmask = None if held == flat_m.size else torch.from_numpy(flat_m)
        else:
            tv = torch.from_numpy(values).view(DTYPE_TORCH[DTYPE_NAMES[dtype_l[t]]])
            tmask = None if held == flat_m.size else torch.from_numpy(mask)
        try:
            taps.append(Tap(stage=name, tile=(tile_m, tile_n), values=tv, k_block=None if k < 0 else k,
                            slot=None if slot_l[t] < 0 else slot_l[t], cta=cta_l[t], mask=tmask,
                            partial=None if p_ < 0 else p_, group=None if g < 0 else g))
        except TapError:
            return None
    return tuple(taps), descriptors, n_records


def _selected(header: SinkHeader, stage: np.ndarray, tm: np.ndarray, tn: np.ndarray, kb: np.ndarray,
              group: np.ndarray) -> np.ndarray:
    """TraceSelection.records for every record at once."""
    sel = header.selection
    ok = _table(((c, STAGE_NAMES[c] in sel.stages) for c in STAGE_NAMES), False, bool)[stage]
    if sel.tiles is not None:
        tile_ok = np.zeros(len(tm), bool)
        for sm, sn in sel.tiles:
            tile_ok |= ((sm < 0) | (tm == sm)) & ((sn < 0) | (tn == sn))
        ok &= tile_ok
    if sel.k_blocks is not None:
        ok &= (kb < 0) | np.isin(kb, np.asarray(sel.k_blocks, np.int64))
    if sel.groups is not None:
        ok &= (group < 0) | np.isin(group, np.asarray(sel.groups, np.int64))
    return ok

"""The bulk trace reader (harness.trace_format.bulk) against the strict record-by-record parser:
the same traces, well-formed and not, give equal results or the same error, and the bulk reader
takes the well-formed ones itself."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from harness.taps import DescriptorRecord, Tap
from harness.trace_format import HEADER_BYTES, RECORD_HEAD_OFFSETS, TraceWriter, parse_header, parse_trace
from harness.trace_format.bulk import read_bulk
from harness.trace_format.header import _buffer
from harness.trace_format.parser import _expected_shape, _parse, _parse_descriptor

BM, BN, BK = 16, 8, 4
BLOCKS = dict(block_m=BM, block_n=BN, block_k=BK)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _summary(res) -> tuple:
    """Every field of a TraceResult, tap values and masks as bytes (dtype and shape beside them)."""
    taps = tuple((t.stage, t.tile, t.k_block, t.slot, t.cta, t.partial, t.group, t.values.dtype,
                  tuple(t.values.shape), _bits(t.values), None if t.mask is None else _bits(t.mask))
                 for t in res.taps)
    return (taps, res.descriptors, res.dropped, res.capacity, res.used_bytes, res.records, res.warnings,
            res.selection, res.dropped_by_stage, res.needed_bytes, res.torn, res.version, res.warning_kinds,
            res.warning_counts)


def _outcome(buf, bulk: bool, **kw):
    try:
        return "ok", _summary(_parse(buf, bulk=bulk, **{**BLOCKS, **kw}))
    except Exception as e:  # the strict parser's error, compared by class and message
        return type(e).__name__, str(e)


def _same(buf, **kw):
    """Bulk and strict agree on `buf`; returns whether the bulk reader read it itself."""
    got, want = _outcome(buf, True, **kw), _outcome(buf, False, **kw)
    assert got == want
    mv = _buffer(buf)
    try:
        header = parse_header(mv)
        kw2 = dict(BLOCKS)
        return read_bulk(mv, header, tap_limit=1 << 40, expected_shape=_expected_shape,
                         parse_descriptor=_parse_descriptor, **kw2) is not None
    except Exception:
        return False


def _rand(shape, dtype, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype in (torch.int8, torch.int32, torch.uint8):
        return torch.randint(0, 100, shape, generator=g).to(dtype)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


def _fragments(w: TraceWriter, stage, tile, values, *, threads=4, k_block=None, partial=None, group=None,
               keep=None, order=None, slot=None, cta=0):
    """A tile tapped as the threads that hold it do: one element record per thread, scattered
    coordinates (thread i holds every threads-th element); `keep` leaves out elements (a mask)."""
    rows, cols = values.shape
    flat = values.reshape(-1)
    for i in (range(threads) if order is None else order):
        idx = np.arange(i, rows * cols, threads)
        if keep is not None:
            idx = idx[keep[idx]]
        w.elements(stage, tile, (idx // cols).tolist(), (idx % cols).tolist(), flat[torch.from_numpy(idx)],
                   shape=(rows, cols), k_block=k_block, partial=partial, group=group, slot=slot, cta=cta)


def _kernel_like(version=2, tiles=((0, 0), (1, 2), (3, 1)), k_blocks=3, capacity=1 << 20) -> TraceWriter:
    """A trace as a pipelined kernel writes it: byte images, load bands, mma fragments of every
    traced tile and k-block, interleaved across tiles, then the epilogue; with descriptor records."""
    w = TraceWriter(capacity, version=version)
    w.descriptor(DescriptorRecord(operand="a", dtype="bf16", global_dims=(64, 32), global_strides=(128,),
                                  box_dims=(BK, BM), element_strides=(1, 1), swizzle=0, oob_fill="zero"))
    rng = np.random.default_rng(0)
    for kb in range(k_blocks):
        for n, t in enumerate(tiles):
            slot = (n + kb) % 2
            w.tap(Tap("descriptor_a", t, torch.from_numpy(rng.integers(0, 256, BM * BK * 2, dtype=np.uint8)),
                      k_block=kb, slot=slot, cta=n), records=3)
            w.tap(Tap("load_a", t, _rand((BM, BK), torch.bfloat16, kb), k_block=kb, slot=slot, cta=n), records=4)
            w.tap(Tap("load_b", t, _rand((BK, BN), torch.bfloat16, kb + 9), k_block=kb, slot=slot, cta=n), records=2)
            _fragments(w, "mma", t, _rand((BM, BN), torch.float32, kb), k_block=kb, order=rng.permutation(4), cta=n)
    for n, t in enumerate(tiles):
        _fragments(w, "epilogue_alpha_beta", t, _rand((BM, BN), torch.float32, 5), cta=n)
        _fragments(w, "epilogue_cast", t, _rand((BM, BN), torch.bfloat16, 6), threads=8, cta=n)
    return w


def test_a_kernel_like_trace_is_read_in_bulk_with_the_strict_result():
    for version in (1, 2):
        buf = _kernel_like(version).to_bytes()
        assert _same(buf)
        res = parse_trace(buf, **BLOCKS)
        assert len(res.taps) == 3 * 3 * 4 + 6 and len(res.descriptors) == 1 and not res.warnings
        mma = res.get("mma", (1, 2), 2)
        assert mma.mask is None and mma.cta == 1 and mma.values.dtype == torch.float32
        assert torch.equal(mma.values, _rand((BM, BN), torch.float32, 2))


def test_the_bulk_reader_takes_masks_partials_groups_dtypes_and_mixed_records():
    w = TraceWriter(1 << 20)
    keep = np.random.default_rng(1).random(BM * BN) < 0.6
    _fragments(w, "epilogue_bias", (0, 0), _rand((BM, BN), torch.float32, 1), keep=keep)  # a fragment: a mask
    for p in range(3):  # a split tile: partials, then the reduce
        _fragments(w, "mma", (1, 1), _rand((BM, BN), torch.float32, p), k_block=p, partial=p)
    _fragments(w, "reduce", (1, 1), _rand((BM, BN), torch.float32, 7))
    _fragments(w, "mma", (0, 1), _rand((BM, BN), torch.float32, 8), k_block=0, group=2)
    for i, dt in enumerate((torch.float16, torch.int8, torch.float8_e4m3fn, torch.int32)):
        w.tap(Tap("load_a", (2, i), _rand((BM, BK), dt, i), k_block=1), records=3)
    v = _rand((BM, BN), torch.float32, 9)  # one tap from a block band and element records of different counts
    w.block("epilogue_activation", (2, 2), v[:5], shape=(BM, BN))
    rest = np.arange(5 * BN, BM * BN)
    for part in np.array_split(rest, 4):
        w.elements("epilogue_activation", (2, 2), (part // BN).tolist(), (part % BN).tolist(),
                   v.reshape(-1)[torch.from_numpy(part)], shape=(BM, BN))
    packed = torch.randint(0, 256, (BK // 2, BN), generator=torch.Generator().manual_seed(3)).to(torch.uint8)
    w.tap(Tap("load_b", (0, 1), packed, k_block=2))  # a packed 4-bit B's bytes
    w.tap(Tap("dequant_b", (0, 1), _rand((BK, BN), torch.bfloat16, 4), k_block=2), records=2)
    w.image("descriptor_b", (0, 0), bytes(range(40)), k_block=0, offset=8, total_bytes=64)  # part of an image
    assert _same(w.to_bytes())
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert res.get("epilogue_bias", (0, 0)).mask is not None
    assert res.get("descriptor_b", (0, 0), 0).mask.sum() == 40
    assert torch.equal(res.get("epilogue_activation", (2, 2)).values, v)


def test_an_empty_trace_and_one_of_descriptors_only():
    assert _same(TraceWriter(1 << 12).to_bytes())
    w = TraceWriter(1 << 12)
    w.descriptor(DescriptorRecord(operand="b", dtype="fp16", global_dims=(8, 8), global_strides=(16,),
                                  box_dims=(8, 8), element_strides=(1, 1), swizzle=0, oob_fill="nan"))
    assert _same(w.to_bytes())


def test_warnings_go_to_the_strict_parser_with_the_same_result():
    w = TraceWriter(1 << 16, tiles=[(0, 0)], k_blocks=[0])
    _fragments(w, "mma", (0, 0), _rand((BM, BN), torch.float32), k_block=0)
    _fragments(w, "mma", (0, 1), _rand((BM, BN), torch.float32), k_block=0)  # a tile not selected
    assert not _same(w.to_bytes())
    w = TraceWriter(1 << 16)
    _fragments(w, "mma", (0, 0), _rand((BM, BN), torch.float32), k_block=0, slot=1)
    w.elements("mma", (0, 0), [0], [0], _rand((BM, BN), torch.float32).reshape(-1)[:1], shape=(BM, BN),
               k_block=0, slot=2, cta=3)  # the same value again, from another slot and CTA
    assert not _same(w.to_bytes())
    assert len(parse_trace(w.to_bytes(), **BLOCKS).warnings) == 2
    w = TraceWriter(1 << 16)
    _fragments(w, "mma", (0, 0), _rand((BM, BN), torch.float32), k_block=0)
    _fragments(w, "mma", (0, 0), _rand((BM, BN), torch.float32), k_block=1, threads=2)
    w.raw(bytes(64))  # torn: reserved, never written
    assert not _same(w.to_bytes(), partial=True)
    assert not _same(w.to_bytes())


def test_elements_held_twice_go_to_the_strict_parser():
    v = _rand((BM, BN), torch.float32)
    w = TraceWriter(1 << 16)
    _fragments(w, "mma", (0, 0), v, k_block=0)
    w.elements("mma", (0, 0), [3], [5], v[3:4, 5], shape=(BM, BN), k_block=0)  # the same value: accepted
    assert not _same(w.to_bytes())
    w.elements("mma", (0, 0), [3], [5], v[3:4, 5] + 1, shape=(BM, BN), k_block=0)  # another value: refused
    assert _outcome(w.to_bytes(), True)[0] == "TraceConflictError"
    _same(w.to_bytes())


def test_an_overflowed_sink_and_the_limits_give_the_strict_result():
    w = _kernel_like(tiles=((0, 0),), k_blocks=2)
    full = w.to_bytes()
    used = parse_header(full).used
    small = _kernel_like(tiles=((0, 0),), k_blocks=2, capacity=512 + used // 16 * 8)  # dropped: a pad record
    assert _same(small.to_bytes())  # read in bulk, the pad record skipped
    assert parse_trace(small.to_bytes(), **BLOCKS).dropped > 0
    w = TraceWriter(1 << 12)
    _fragments(w, "mma", (0, 0), _rand((BM, BN), torch.float32), k_block=0)
    w.raw(struct.pack("<IHH", 8, 5, 0xC0DE))  # a pad record that closes nothing
    assert not _same(w.to_bytes())
    for limit in (1, 1000, 10 ** 9):
        _same(full, max_tap_bytes=limit)


# the fields of a record head, and values that break them
_FIELDS = [(name, off, fmt) for name, off, fmt in (
    ("size", 0, "<I"), ("kind", 4, "<H"), ("commit", 6, "<H"), ("stage", 8, "<B"), ("dtype", 9, "<B"),
    ("cta", 16, "<I"), ("tile_m", 20, "<i"), ("tile_n", 24, "<i"), ("k_block", 28, "<i"), ("slot", 32, "<i"),
    ("shape_rows", 36, "<H"), ("shape_cols", 38, "<H"), ("partial", 40, "<i"), ("group", 44, "<i"))]
assert all(RECORD_HEAD_OFFSETS[n] == o for n, o, _ in _FIELDS)
_VALUES = {"<I": (0, 8, 16, 1 << 20, 0xC0DE, 7), "<H": (0, 1, 2, 3, 4, 5, 9, 0xC0DE, 0xFFFF),
           "<B": (0, 1, 3, 5, 10, 14, 15, 16, 99, 255), "<i": (-2, -1, 0, 1, 2, 3, 7, 1 << 20)}


@pytest.mark.parametrize("seed", range(6))
def test_corrupted_records_give_the_same_error_or_result(seed):
    """Record heads and bodies of a kernel-like trace overwritten one field at a time: bulk and
    strict give the same error (class and message) or the same result, partial or not."""
    base = bytearray(_kernel_like(tiles=((0, 0), (1, 1)), k_blocks=2).to_bytes())
    header = parse_header(bytes(base))
    offs, off = [], header.header_bytes
    while off < header.header_bytes + header.used:
        offs.append(off)
        off += struct.unpack_from("<I", base, off)[0]
    rng = np.random.default_rng(seed)
    for _ in range(40):
        buf = bytearray(base)
        rec = int(rng.choice(offs))
        if rng.random() < 0.75:
            name, at, fmt = _FIELDS[rng.integers(len(_FIELDS))]
            vals = _VALUES[fmt]
            struct.pack_into(fmt, buf, rec + at, vals[rng.integers(len(vals))])
        else:  # a body byte: counts, rectangles, coordinates
            at = rec + 48 + int(rng.integers(0, 24))
            buf[at] = int(rng.integers(0, 256))
        for partial in (False, True):
            _same(bytes(buf), partial=partial)


def test_bad_codes_and_coordinates_give_the_strict_errors():
    w = TraceWriter(1 << 16)
    _fragments(w, "mma", (0, 0), _rand((BM, BN), torch.float32), k_block=0)
    good = w.to_bytes()
    first = HEADER_BYTES
    cases = {"stage": (first + 8, "<B", 99), "dtype": (first + 9, "<B", 99), "kind": (first + 4, "<H", 9),
             "commit": (first + 6, "<H", 0), "coordinate": (first + 56, "<I", 0xFFFF)}
    for name, (at, fmt, v) in cases.items():
        buf = bytearray(good)
        struct.pack_into(fmt, buf, at, v)
        kind, msg = _outcome(bytes(buf), True)
        assert kind != "ok", name
        assert (kind, msg) == _outcome(bytes(buf), False)


def test_the_first_error_in_record_order_wins_as_in_the_strict_parser():
    """A bad element record before a bad descriptor record: the element's error; a trace over the
    host's memory with a bad record: the record's error (the limits come after every record)."""
    bad_descriptor = DescriptorRecord(operand="a", dtype="bf16", global_dims=(64, 32), global_strides=(128,),
                                      box_dims=(BK, BM), element_strides=(1, 1), swizzle=0, oob_fill="zero")
    w = TraceWriter(1 << 16)
    w.elements("mma", (0, 0), [0], [BN], torch.tensor([1.0]), shape=(BM, BN), k_block=0)  # outside the tile
    at = w.descriptor(bad_descriptor)
    buf = bytearray(w.to_bytes())
    buf[at + 48 + 2] = 7  # swizzle 7
    assert _outcome(bytes(buf), True)[0] == "TraceCoordinateError"
    assert _same(bytes(buf)) is False
    w = TraceWriter(1 << 16)
    w.elements("mma", (0, 0), [0], [BN], torch.tensor([1.0]), shape=(BM, BN), k_block=0)
    assert _outcome(w.to_bytes(), True, max_tap_bytes=1)[0] == "TraceCoordinateError"
    _same(w.to_bytes(), max_tap_bytes=1)


def test_element_records_of_no_elements():
    w = TraceWriter(1 << 16)
    w.elements("mma", (0, 0), [], [], torch.tensor([]), shape=(BM, BN), k_block=0, dtype="fp32")
    _fragments(w, "mma", (0, 1), _rand((BM, BN), torch.float32), k_block=0)
    w.elements("mma", (0, 1), [], [], torch.tensor([]), shape=(BM, BN), k_block=0, dtype="fp32")
    assert _same(w.to_bytes())
    assert parse_trace(w.to_bytes(), **BLOCKS).get("mma", (0, 0), 0).mask.sum() == 0

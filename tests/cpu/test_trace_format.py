"""Trace format: round trips through TraceWriter and parse_trace, and every error path."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from harness import trace_format as tf
from harness.taps import DescriptorRecord, Tap
from harness.trace_format import (
    TraceCodeError,
    TraceConflictError,
    TraceCoordinateError,
    TraceFormatError,
    TraceHeaderError,
    TraceLimitError,
    TraceRecordError,
    TraceSelection,
    TraceTruncatedError,
    TraceWriter,
    parse_header,
    parse_trace,
    sink_init_bytes,
)

BM, BN, BK = 16, 8, 4
BLOCKS = dict(block_m=BM, block_n=BN, block_k=BK)


def _rand(shape, dtype: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype in ("int8", "int32"):
        return torch.randint(-100, 100, shape, generator=g).to(tf.DTYPE_TORCH[dtype])
    return (torch.randn(shape, generator=g) * 3).to(tf.DTYPE_TORCH[dtype])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _one_mma(w: TraceWriter, **kw) -> int:
    args = dict(shape=(BM, BN), k_block=0)
    args.update(kw)
    return w.elements("mma", (0, 0), [1, 2], [3, 4], torch.tensor([1.0, 2.0]), **args)


# ------------------------------------------------------------------------------------------
# round trips
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [d for d in tf.DTYPE_CODES if d != "uint8"])
@pytest.mark.parametrize("stage,shape", [("load_a", (BM, BK)), ("load_b", (BK, BN)), ("dequant_b", (BK, BN)),
                                         ("mma", (BM, BN)), ("epilogue_cast", (BM, BN))])
def test_dense_tap_round_trip_is_bit_exact(dtype, stage, shape):
    values = _rand(shape, dtype, seed=list(tf.DTYPE_CODES).index(dtype) * 10 + len(stage))
    if dtype not in ("int8", "int32"):
        values.view(-1)[0] = float("nan")  # NaN bits survive
    kb = None if stage.startswith("epilogue") else 3
    tap = Tap(stage=stage, tile=(2, 5), values=values, k_block=kb, slot=1 if kb is not None else None, cta=7)
    w = TraceWriter(1 << 16)
    w.tap(tap, records=3)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert res.complete and res.records == 3
    (got,) = res.taps
    assert got.key == tap.key and got.slot == tap.slot and got.cta == 7
    assert got.mask is None
    assert _same_bits(got.values, values)


def test_packed_load_tap_holds_two_k_per_byte():
    """load_b of a packed 4-bit B: uint8 bytes [BK/2, BN]; its dequant_b tap is [BK, BN]."""
    packed = torch.randint(0, 256, (BK // 2, BN), generator=torch.Generator().manual_seed(3)).to(torch.uint8)
    deq = _rand((BK, BN), "fp16", seed=4)
    w = TraceWriter(1 << 16)
    w.tap(Tap("load_b", (0, 1), packed, k_block=2))
    w.tap(Tap("dequant_b", (0, 1), deq, k_block=2))
    res = parse_trace(w.to_bytes(), **BLOCKS)
    got = {t.stage: t for t in res.taps}
    assert _same_bits(got["load_b"].values, packed) and _same_bits(got["dequant_b"].values, deq)
    assert got["dequant_b"].k_block == 2
    w = TraceWriter(1 << 16)
    w.tap(Tap("load_b", (0, 1), torch.zeros(BK, BN, dtype=torch.uint8), k_block=2))  # unpacked bytes: wrong shape
    with pytest.raises(TraceCoordinateError, match="load_b record"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_masked_element_taps_assemble_with_mask():
    acc = _rand((BM, BN), "fp32")
    w = TraceWriter(1 << 16)
    # four "threads" each hold a strided fragment; one fragment is missing
    for t in range(3):
        rows = [r for r in range(BM) for c in range(BN) if (r * BN + c) % 4 == t]
        cols = [c for r in range(BM) for c in range(BN) if (r * BN + c) % 4 == t]
        w.elements("mma", (1, 1), rows, cols, acc[rows, cols], shape=(BM, BN), k_block=0, thread=t)
    (tap,) = parse_trace(w.to_bytes(), **BLOCKS).taps
    want_mask = (torch.arange(BM * BN).reshape(BM, BN) % 4) != 3
    assert torch.equal(tap.mask, want_mask)
    assert torch.equal(tap.values[want_mask], acc[want_mask])
    assert (tap.values[~want_mask] == 0).all()


def test_all_fragments_give_a_full_tap_without_mask():
    acc = _rand((BM, BN), "bf16")
    w = TraceWriter(1 << 16)
    for t in range(4):
        idx = [i for i in range(BM * BN) if i % 4 == t]
        w.elements("epilogue_cast", (0, 3), [i // BN for i in idx], [i % BN for i in idx], acc.view(-1)[idx],
                   shape=(BM, BN))
    (tap,) = parse_trace(w.to_bytes(), **BLOCKS).taps
    assert tap.mask is None and tap.k_block is None and _same_bits(tap.values, acc)


def test_identical_duplicates_are_accepted():
    w = TraceWriter(1 << 16)
    _one_mma(w)
    _one_mma(w, thread=5)  # a replicated fragment
    (tap,) = parse_trace(w.to_bytes(), **BLOCKS).taps
    assert int(tap.mask.sum()) == 2 and tap.values[1, 3] == 1.0


def test_conflicting_duplicates_are_an_error():
    w = TraceWriter(1 << 16)
    _one_mma(w)
    second = w.elements("mma", (0, 0), [2], [4], torch.tensor([2.5]), shape=(BM, BN), k_block=0)
    with pytest.raises(TraceConflictError, match=r"row 2, col 4.*twice") as e:
        parse_trace(w.to_bytes(), **BLOCKS)
    assert e.value.offset == second


def test_byte_images_assemble_from_chunks():
    image = bytes(np.random.default_rng(1).integers(0, 256, 512, dtype=np.uint8))
    w = TraceWriter(1 << 16)
    w.image("descriptor_b", (0, 1), image[256:], k_block=2, offset=256, total_bytes=512, dtype="e4m3")
    w.image("descriptor_b", (0, 1), image[:256], k_block=2, offset=0, total_bytes=512, dtype="e4m3")
    (tap,) = parse_trace(w.to_bytes(), block_m=BM, block_n=64, block_k=8).taps  # a 64 x 8 e4m3 tile: 512 bytes
    assert tap.stage == "descriptor_b" and tap.values.dtype == torch.uint8 and tap.mask is None
    assert tap.values.numpy().tobytes() == image


def test_byte_image_with_a_hole_has_a_mask():
    w = TraceWriter(1 << 16)
    w.image("descriptor_a", (0, 0), b"\x01" * 16, k_block=0, offset=16, total_bytes=64)
    (tap,) = parse_trace(w.to_bytes(), **BLOCKS).taps
    assert tap.mask.tolist() == [False] * 16 + [True] * 16 + [False] * 32


def test_byte_image_conflicts_are_errors():
    w = TraceWriter(1 << 16)
    w.image("descriptor_a", (0, 0), b"\x01" * 16, k_block=0, offset=0, total_bytes=64)
    w.image("descriptor_a", (0, 0), b"\x02" * 16, k_block=0, offset=8, total_bytes=64)
    with pytest.raises(TraceConflictError, match="byte 8 recorded twice"):
        parse_trace(w.to_bytes(), **BLOCKS)
    w = TraceWriter(1 << 16)
    w.image("descriptor_a", (0, 0), b"\x01" * 16, k_block=0, offset=0, total_bytes=64)
    w.image("descriptor_a", (0, 0), b"\x01" * 16, k_block=0, offset=16, total_bytes=128)
    with pytest.raises(TraceConflictError, match="128 bytes here but 64"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_dtype_disagreement_between_records_is_an_error():
    w = TraceWriter(1 << 16)
    _one_mma(w)
    w.elements("mma", (0, 0), [5], [5], torch.tensor([1.0], dtype=torch.float16), shape=(BM, BN), k_block=0)
    with pytest.raises(TraceConflictError, match="dtype fp16"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_slot_and_cta_disagreement_are_warnings():
    w = TraceWriter(1 << 16)
    w.elements("load_a", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BK), k_block=1, slot=0, cta=3)
    w.elements("load_a", (0, 0), [0], [1], torch.tensor([1.0]), shape=(BM, BK), k_block=1, slot=1, cta=4)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    (tap,) = res.taps
    assert tap.slot == 0 and tap.cta == 3
    assert any("pipeline slot" in m for m in res.warnings) and any("several CTAs" in m for m in res.warnings)
    assert not res.complete
    assert res.warning_kinds == (tf.WARN_SLOT, tf.WARN_CTAS) and dict(res.warning_counts) == {tf.WARN_SLOT: 1,
                                                                                            tf.WARN_CTAS: 1}
    assert res.warnings_of(tf.WARN_CTAS) == res.warnings[1:] and res.warnings_of(tf.WARN_UNSELECTED) == ()
    with pytest.raises(ValueError, match="warning kind 'slots' is unknown"):
        res.warnings_of("slots")


def test_taps_come_in_pipeline_order():
    w = TraceWriter(1 << 16)
    w.elements("epilogue_bias", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN))
    for kb in (2, 0, 1):
        w.elements("mma", (0, 0), [0], [0], torch.tensor([float(kb)]), shape=(BM, BN), k_block=kb)
    w.elements("load_b", (1, 0), [0], [0], torch.tensor([1.0]), shape=(BK, BN), k_block=0)
    w.elements("load_b", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BK, BN), k_block=0)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert [t.key for t in res.taps] == [("load_b", (0, 0), 0), ("load_b", (1, 0), 0), ("mma", (0, 0), 0),
                                         ("mma", (0, 0), 1), ("mma", (0, 0), 2), ("epilogue_bias", (0, 0), None)]
    assert res.get("mma", (0, 0), 2).values[0, 0] == 2.0
    assert res.get("mma", (0, 0), 9) is None
    assert len(res.of_stage("mma")) == 3


def test_descriptor_records_round_trip_and_deduplicate():
    d = DescriptorRecord(operand="b", dtype="e4m3", global_dims=(4096, 1024, 3), global_strides=(4096, 4096 * 1024),
                         box_dims=(128, 64, 1), element_strides=(1, 1, 1), swizzle=128, oob_fill="nan")
    w = TraceWriter(1 << 16)
    w.descriptor(d)
    w.descriptor(d, cta=1)  # every CTA wrote the same
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert res.descriptors == (d,) and res.taps == ()


def test_host_descriptors_in_the_initial_sink():
    d = DescriptorRecord(operand="a", dtype="bf16", global_dims=(64, 32), global_strides=(128,), box_dims=(64, 16),
                         element_strides=(1, 1), swizzle=128, oob_fill="zero")
    buf = sink_init_bytes(4096, descriptors=[d])
    assert len(buf) == 4096
    res = parse_trace(buf, **BLOCKS)
    assert res.descriptors == (d,) and res.used_bytes == tf.RECORD_HEAD_BYTES + tf.DESCRIPTOR_BODY.size
    with pytest.raises(ValueError, match="host descriptor records"):
        sink_init_bytes(tf.HEADER_BYTES + 8, descriptors=[d])


def test_parser_accepts_buffer_types_and_the_extent_only():
    w = TraceWriter(1 << 16)
    _one_mma(w)
    full = w.to_bytes()
    extent = tf.trace_extent(full[:tf.HEADER_BYTES])
    assert extent == tf.HEADER_BYTES + tf._round_up(tf.RECORD_HEAD_BYTES + 8 + 2 * 8)
    for buf in (full, bytearray(full), memoryview(full), np.frombuffer(full, np.uint8),
                torch.frombuffer(bytearray(full), dtype=torch.uint8), full[:extent]):
        (tap,) = parse_trace(buf, **BLOCKS).taps
        assert tap.values[2, 4] == 2.0


def test_empty_sink_parses_to_nothing():
    res = parse_trace(sink_init_bytes(1024), **BLOCKS)
    assert res.taps == () and res.descriptors == () and res.records == 0 and res.complete and res.capacity == 1024


# ------------------------------------------------------------------------------------------
# selection and header
# ------------------------------------------------------------------------------------------


def test_selection_round_trips_through_the_header():
    buf = sink_init_bytes(2048, tiles=[(1, 2), (3, None), (-1, 0)], k_blocks=range(100, 104),
                          stages=["mma", "load_a"])
    h = parse_header(buf)
    assert h.capacity == 2048 and h.cursor == 0 and h.dropped == 0
    assert h.selection.tiles == ((1, 2), (3, -1), (-1, 0))
    assert h.selection.k_blocks == (100, 101, 102, 103)
    assert h.selection.stages == ("load_a", "mma")
    s = h.selection
    assert s.records("mma", (3, 9), 101) and s.records("mma", (7, 0), 100) and not s.records("mma", (1, 3), 100)
    assert not s.records("mma", (1, 2), 99) and not s.records("epilogue_cast", (1, 2), None)
    # raw bits: the window starts at the smallest k-block
    assert struct.unpack_from("<i", buf, tf.HEADER_OFFSETS["kb_base"])[0] == 100
    assert struct.unpack_from("<I", buf, tf.HEADER_OFFSETS["kb_bits"])[0] == 0b1111


def test_default_selection_is_everything():
    h = parse_header(sink_init_bytes(1024))
    assert h.selection == TraceSelection()
    assert h.flags == tf.FLAG_ALL_K_BLOCKS
    assert struct.unpack_from("<ii", sink_init_bytes(1024), tf.HEADER_OFFSETS["tiles"]) == (-1, -1)
    assert h.selection.records("descriptor_a", (123, 456), 10**6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(tiles=[(i, 0) for i in range(33)]), "at most 32"),
    (dict(tiles=[(0, -2)]), "-1/None for any"),
    (dict(tiles=[(0,)]), "pair"),
    (dict(k_blocks=[0, 1024]), "window of 1024"),
    (dict(k_blocks=[-1]), ">= 0"),
    (dict(stages=["mma", "epilogue_store"]), "unknown"),
])
def test_bad_selections_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sink_init_bytes(1024, **kwargs)


@pytest.mark.parametrize("capacity", [0, 512, 1023, 1 << 63, 12.0])
def test_bad_capacities_are_refused(capacity):
    with pytest.raises(ValueError, match="capacity"):
        sink_init_bytes(capacity)


def test_unselected_records_are_reported():
    w = TraceWriter(1 << 16, tiles=[(0, 0)], k_blocks=[0], stages=["mma"])
    _one_mma(w)
    w.elements("mma", (0, 1), [0], [0], torch.tensor([1.0]), shape=(BM, BN), k_block=0)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert len(res.taps) == 2
    assert len(res.warnings) == 1 and "tile (0, 1)" in res.warnings[0] and "not selected" in res.warnings[0]


# ------------------------------------------------------------------------------------------
# overflow
# ------------------------------------------------------------------------------------------


MMA_REC = tf._round_up(tf.RECORD_HEAD_BYTES + 8 + 2 * (4 + 4))  # _one_mma: two fp32 elements


def test_overflow_counts_dropped_records_and_keeps_the_rest():
    w = TraceWriter(tf.HEADER_BYTES + 3 * MMA_REC + 8)
    for t in range(6):  # 3 fit, 1 straddles the end, 2 lie beyond
        _one_mma(w, thread=t)
    buf = w.to_bytes()
    h = parse_header(buf)
    assert h.cursor == 6 * MMA_REC and h.dropped == 3 and h.used == 3 * MMA_REC + 8
    assert h.dropped_by_stage == (("mma", 3),)
    # the straddling record closed the area with a pad
    assert struct.unpack_from("<IHH", buf, tf.HEADER_BYTES + 3 * MMA_REC) == (8, tf.RecordKind.PAD, tf.COMMIT_TAG)
    res = parse_trace(buf, **BLOCKS)
    assert res.dropped == 3 and res.records == 3 and not res.complete
    assert res.used_bytes == 3 * MMA_REC + 8 and res.needed_bytes == 6 * MMA_REC
    assert res.dropped_by_stage == (("mma", 3),)


def test_exact_fit_overflow_needs_no_pad():
    w = TraceWriter(tf.HEADER_BYTES + 2 * MMA_REC)
    for t in range(3):
        _one_mma(w, thread=t)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert res.dropped == 1 and res.records == 2


def test_drops_are_counted_per_stage():
    w = TraceWriter(tf.HEADER_BYTES + MMA_REC)
    _one_mma(w)
    w.elements("epilogue_cast", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN))
    w.elements("epilogue_bias", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN))
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert dict(res.dropped_by_stage) == {"epilogue_cast": 1, "epilogue_bias": 1}


def test_drop_counts_that_exceed_the_total_are_rejected():
    w = TraceWriter(1024)
    _one_mma(w)
    buf = bytearray(w.to_bytes())
    struct.pack_into("<I", buf, tf.HEADER_OFFSETS["dropped_by_stage"] + 4 * tf.STAGE_CODES["mma"], 5)
    with pytest.raises(tf.TraceHeaderError, match="dropped_by_stage"):
        parse_trace(bytes(buf), **BLOCKS)


def test_version_1_buffers_still_parse():
    w = TraceWriter(1 << 16, version=1)
    _one_mma(w)
    w.block("load_a", (0, 0), torch.ones(BM, BK), shape=(BM, BK), k_block=0)
    buf = w.to_bytes()
    assert parse_header(buf).version == 1 and parse_header(buf).dropped_by_stage is None
    res = parse_trace(buf, **BLOCKS)
    assert res.version == 1 and {t.stage for t in res.taps} == {"mma", "load_a"}
    assert res.get("load_a", (0, 0), 0).values.float().sum() == BM * BK


def test_partials_and_groups_are_kept_apart():
    # two split-K partials of one tile tap the same k-block with different values: two taps
    w = TraceWriter(1 << 16)
    w.elements("mma", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN), k_block=2, partial=0)
    w.elements("mma", (0, 0), [0], [0], torch.tensor([5.0]), shape=(BM, BN), k_block=2, partial=1)
    w.elements("mma", (0, 0), [0], [0], torch.tensor([7.0]), shape=(BM, BN), k_block=2, group=3)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    got = {(t.partial, t.group): float(t.values[0, 0]) for t in res.taps}
    assert got == {(0, None): 1.0, (1, None): 5.0, (None, 3): 7.0}


# ------------------------------------------------------------------------------------------
# header errors
# ------------------------------------------------------------------------------------------


def _valid() -> bytearray:
    w = TraceWriter(1024)
    _one_mma(w)
    return bytearray(w.to_bytes())


def _put(buf: bytearray, fmt: str, off: int, *v) -> bytearray:
    struct.pack_into(fmt, buf, off, *v)
    return buf


def test_wrong_magic():
    with pytest.raises(TraceHeaderError, match="magic is 0x00000000") as e:
        parse_trace(bytes(1024), **BLOCKS)
    assert e.value.offset == 0 and isinstance(e.value, TraceFormatError) and isinstance(e.value, ValueError)


def test_wrong_version():
    with pytest.raises(TraceHeaderError, match="version 4 is not supported") as e:
        parse_trace(_put(_valid(), "<H", 4, 4), **BLOCKS)
    assert "byte offset 4" in str(e.value)


def test_wrong_header_size():
    with pytest.raises(TraceHeaderError, match="header_bytes is 256"):
        parse_trace(_put(_valid(), "<H", 6, 256), **BLOCKS)


@pytest.mark.parametrize("n", [0, 10, 47, 48, 511])
def test_truncated_header(n):
    with pytest.raises(TraceTruncatedError, match="fewer than"):
        parse_trace(bytes(_valid()[:n]), **BLOCKS)


def test_truncated_records():
    buf = bytes(_valid())
    with pytest.raises(TraceTruncatedError, match=f"cursor says records run to byte {tf.HEADER_BYTES + MMA_REC}") as e:
        parse_trace(buf[:tf.HEADER_BYTES + 48], **BLOCKS)
    assert e.value.offset == tf.HEADER_BYTES + 48


def test_buffer_longer_than_capacity():
    with pytest.raises(TraceHeaderError, match="capacity 1024"):
        parse_trace(bytes(_valid()) + b"\0" * 8, **BLOCKS)


@pytest.mark.parametrize("field,fmt,value,match", [
    ("capacity", "<Q", 100, "capacity 100"),
    ("capacity", "<Q", 1028, "multiple of 8"),
    ("flags", "<I", 6, "unknown bits"),
    ("stage_mask", "<I", 1, "unknown stage codes"),
    ("stage_mask", "<I", 1 << 28, "unknown stage codes"),  # 26, 27: the scale stages
    ("n_tiles", "<I", 33, "exceeds 32"),
    ("cursor", "<Q", 12, "not a multiple of 8"),
    ("cursor", "<Q", 1024, "no record was counted as dropped"),
])
def test_bad_header_fields(field, fmt, value, match):
    buf = _put(_valid(), fmt, tf.HEADER_OFFSETS[field], value)
    with pytest.raises(TraceHeaderError, match=match) as e:
        parse_trace(buf, **BLOCKS)
    assert e.value.offset == tf.HEADER_OFFSETS[field]


def test_bad_tile_selector():
    buf = _put(_valid(), "<ii", tf.HEADER_OFFSETS["tiles"], 0, -5)
    with pytest.raises(TraceHeaderError, match=r"\(0, -5\)"):
        parse_trace(buf, **BLOCKS)


def test_bad_block_sizes_are_refused():
    with pytest.raises(ValueError, match="block_k"):
        parse_trace(bytes(_valid()), block_m=16, block_n=8, block_k=0)


# ------------------------------------------------------------------------------------------
# record errors
# ------------------------------------------------------------------------------------------

REC = tf.HEADER_BYTES  # offset of the first record


def test_nonzero_bytes_past_the_cursor():
    buf = _valid()
    buf[700] = 0x5A
    with pytest.raises(TraceRecordError, match="past the cursor") as e:
        parse_trace(buf, **BLOCKS)
    assert e.value.offset == 700


def test_record_running_past_the_cursor():
    buf = _put(_valid(), "<Q", tf.HEADER_OFFSETS["cursor"], MMA_REC - 8)
    buf[REC + MMA_REC - 8:REC + MMA_REC] = bytes(8)
    with pytest.raises(TraceRecordError, match="past the end of the records") as e:
        parse_trace(buf, **BLOCKS)
    assert e.value.offset == REC


def test_record_size_not_aligned():
    with pytest.raises(TraceRecordError, match="not a positive multiple of 8"):
        parse_trace(_put(_valid(), "<I", REC, 60), **BLOCKS)


def test_record_smaller_than_its_head():
    buf = _put(_valid(), "<I", REC, 32)
    buf = _put(buf, "<Q", tf.HEADER_OFFSETS["cursor"], 32)
    buf[REC + 32:REC + MMA_REC] = bytes(MMA_REC - 32)
    with pytest.raises(TraceRecordError, match=f"smaller than the {tf.RECORD_HEAD_BYTES}-byte record head"):
        parse_trace(buf, **BLOCKS)


def test_record_size_disagrees_with_contents():
    buf = _put(_valid(), "<I", REC + tf.RECORD_HEAD_BYTES, 3)  # count 3 instead of 2
    with pytest.raises(TraceRecordError, match="3 elements"):
        parse_trace(buf, **BLOCKS)


def test_unwritten_reservation_strict_and_partial():
    w = TraceWriter(1024)
    _one_mma(w)
    w.raw(bytes(64))  # reserved, never written (the kernel died)
    buf = w.to_bytes()
    with pytest.raises(TraceRecordError, match="size is 0") as e:
        parse_trace(buf, **BLOCKS)
    assert e.value.offset == REC + MMA_REC
    res = parse_trace(buf, **BLOCKS, partial=True)
    assert len(res.taps) == 1 and "never written" in res.warnings[0] and not res.complete


def test_uncommitted_record_strict_and_partial():
    w = TraceWriter(1024)
    _one_mma(w, commit=False)
    w.elements("mma", (0, 0), [0], [0], torch.tensor([9.0]), shape=(BM, BN), k_block=0)
    buf = w.to_bytes()
    with pytest.raises(TraceRecordError, match="commit tag is 0x0000") as e:
        parse_trace(buf, **BLOCKS)
    assert e.value.offset == REC + 6
    res = parse_trace(buf, **BLOCKS, partial=True)
    (tap,) = res.taps
    assert int(tap.mask.sum()) == 1 and tap.values[0, 0] == 9.0
    assert "not committed" in res.warnings[0]


def test_misplaced_pad_record():
    w = TraceWriter(1024)
    w.raw(struct.pack("<IHH", 8, tf.RecordKind.PAD, tf.COMMIT_TAG))
    with pytest.raises(TraceRecordError, match="pad record"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_unknown_kind():
    with pytest.raises(TraceCodeError, match="record kind 9 is unknown") as e:
        parse_trace(_put(_valid(), "<H", REC + 4, 9), **BLOCKS)
    assert e.value.offset == REC + 4


def test_unknown_stage():
    with pytest.raises(TraceCodeError, match="stage code 28 is unknown") as e:
        parse_trace(_put(_valid(), "<B", REC + 8, 28), **BLOCKS)
    assert e.value.offset == REC + 8
    with pytest.raises(TraceCodeError, match="stage code 0 is unknown"):
        parse_trace(_put(_valid(), "<B", REC + 8, 0), **BLOCKS)


def test_unknown_dtype():
    with pytest.raises(TraceCodeError, match="dtype code 9 is unknown") as e:
        parse_trace(_put(_valid(), "<B", REC + 9, 9), **BLOCKS)
    assert e.value.offset == REC + 9


def test_element_outside_the_tile():
    w = TraceWriter(1024)
    w.elements("mma", (0, 0), [0, BM], [0, 0], torch.tensor([1.0, 2.0]), shape=(BM, BN), k_block=0)
    with pytest.raises(TraceCoordinateError, match=rf"element 1 at \(row {BM}, col 0\) is outside") as e:
        parse_trace(w.to_bytes(), **BLOCKS)
    assert e.value.offset == REC + tf.RECORD_HEAD_BYTES + 8 + 4
    w = TraceWriter(1024)
    w.elements("mma", (0, 0), [0], [-1], torch.tensor([1.0]), shape=(BM, BN), k_block=0)  # -1 -> 65535
    with pytest.raises(TraceCoordinateError, match="col 65535"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_block_outside_the_tile():
    w = TraceWriter(1024)
    w.block("load_a", (0, 0), torch.zeros(4, BK), shape=(BM, BK), row0=BM - 2, k_block=0)
    with pytest.raises(TraceCoordinateError, match="outside the 16x4 tile"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_tile_shape_must_match_the_block_sizes():
    w = TraceWriter(1024)
    w.block("load_b", (0, 0), torch.zeros(BN, BK), shape=(BN, BK), k_block=0)  # transposed B tile
    with pytest.raises(TraceCoordinateError, match=r"says the tile is 8x4.*make it 4x8") as e:
        parse_trace(w.to_bytes(), **BLOCKS)
    assert e.value.offset == REC + 36


def test_negative_tile_and_missing_k_block():
    w = TraceWriter(1024)
    w.elements("mma", (-1, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN), k_block=0)
    with pytest.raises(TraceCoordinateError, match="negative"):
        parse_trace(w.to_bytes(), **BLOCKS)
    w = TraceWriter(1024)
    w.elements("load_a", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BK))
    with pytest.raises(TraceCoordinateError, match="load_a record tile \\(0, 0\\) has no k-block"):
        parse_trace(w.to_bytes(), **BLOCKS)
    w = TraceWriter(1024)
    w.elements("mma", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN), k_block=-3)
    with pytest.raises(TraceCoordinateError, match="k_block -3"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_record_kind_must_fit_the_stage():
    w = TraceWriter(1024)
    w.elements("descriptor_a", (0, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BK), k_block=0)
    with pytest.raises(TraceCodeError, match="descriptor stages hold byte images"):
        parse_trace(w.to_bytes(), **BLOCKS)
    w = TraceWriter(1024)
    w.image("load_a", (0, 0), b"\0" * 8, k_block=0)
    with pytest.raises(TraceCodeError, match="byte-image record must have stage descriptor"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_byte_chunk_outside_its_image():
    w = TraceWriter(1024)
    w.image("descriptor_a", (0, 0), b"\0" * 16, k_block=0, offset=56, total_bytes=64)
    with pytest.raises(TraceCoordinateError, match="does not fit the 64-byte image"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_an_image_larger_than_its_tile_is_refused_before_anything_is_allocated():
    # a 2 KB buffer that declares a 2 GiB image: refused from the block sizes, not allocated
    w = TraceWriter(2048)
    w.image("descriptor_a", (0, 0), b"\1" * 8, k_block=0, total_bytes=0x7FFFFFFF)
    with pytest.raises(TraceCoordinateError, match=r"total_bytes 2147483647, more than .* 16 x 4 elements of bf16 "
                                                   r"= 128 bytes"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_a_k_block_window_past_int32_is_a_header_error():
    buf = bytearray(TraceWriter(1024, k_blocks=[0]).to_bytes())
    struct.pack_into("<i", buf, tf.HEADER_OFFSETS["kb_base"], 2**31 - 1)
    struct.pack_into("<I", buf, tf.HEADER_OFFSETS["kb_bits"], 0b11)
    with pytest.raises(TraceHeaderError, match="selects k-block 2147483648, past the int32"):
        parse_header(bytes(buf))


def test_taps_beyond_the_memory_limit_are_refused_before_assembly(monkeypatch):
    # one element per tile: tiny records, each of which would assemble a whole tile
    w = TraceWriter(1 << 16)
    for t in range(40):
        w.elements("mma", (t, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN), k_block=0)
    buf = w.to_bytes()
    per_tap = BM * BN * 5  # fp32 values and a bool mask
    assert len(parse_trace(buf, **BLOCKS, max_tap_bytes=40 * per_tap).taps) == 40
    with pytest.raises(TraceLimitError, match=rf"40 taps would take {40 * per_tap} bytes .*max_tap_bytes"):
        parse_trace(buf, **BLOCKS, max_tap_bytes=40 * per_tap - 1)
    w = TraceWriter(1 << 16)
    for t in range(4):  # 4 x 256 x 256 x 5 bytes: more than 1 MiB
        w.elements("mma", (t, 0), [0], [0], torch.tensor([1.0]), shape=(256, 256), k_block=0)
    monkeypatch.setenv("ORACLE_TRACE_MAX_TAPS_MB", "1")
    assert len(parse_trace(w.to_bytes(), block_m=256, block_n=256, block_k=BK, max_tap_bytes=1 << 30).taps) == 4
    with pytest.raises(TraceLimitError, match="1 MiB limit of ORACLE_TRACE_MAX_TAPS_MB"):
        parse_trace(w.to_bytes(), block_m=256, block_n=256, block_k=BK)


def test_warnings_of_one_kind_are_counted_past_a_few():
    w = TraceWriter(1 << 16, tiles=[(0, 0)])
    for t in range(1, 21):
        w.elements("mma", (t, 0), [0], [0], torch.tensor([1.0]), shape=(BM, BN), k_block=0)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert len(res.taps) == 20 and not res.complete
    assert len(res.warnings) == tf.MAX_WARNINGS_PER_KIND + 1
    assert res.warnings[-1].startswith(f"... and {20 - tf.MAX_WARNINGS_PER_KIND} more warning(s)")
    assert res.warnings_of(tf.WARN_UNSELECTED) == res.warnings and dict(res.warning_counts) == {tf.WARN_UNSELECTED: 20}


def _descriptor_buf(**overrides) -> bytearray:
    d = DescriptorRecord(operand="a", dtype="fp16", global_dims=(64, 32), global_strides=(128,), box_dims=(64, 16),
                         element_strides=(1, 1), swizzle=64, oob_fill="zero")
    w = TraceWriter(1024)
    w.descriptor(d)
    buf = bytearray(w.to_bytes())
    body = REC + tf.RECORD_HEAD_BYTES
    for name, (fmt, off, value) in overrides.items():
        struct.pack_into(fmt, buf, (REC if name in ("stage",) else body) + off, value)
    return buf


@pytest.mark.parametrize("name,fmt,off,value,match", [
    ("operand", "<B", 0, 1, "does not match its stage"),
    ("rank", "<B", 1, 0, "rank 0"),
    ("rank", "<B", 1, 6, "rank 6"),
    ("swizzle", "<H", 2, 16, "swizzle 16"),
    ("oob_fill", "<B", 4, 2, "oob_fill code 2"),
    ("stage", "<B", 8, tf.STAGE_CODES["mma"], "descriptor record with stage mma"),
])
def test_bad_descriptor_fields(name, fmt, off, value, match):
    with pytest.raises(TraceCodeError, match=match):
        parse_trace(_descriptor_buf(**{name: (fmt, off, value)}), **BLOCKS)


def test_every_error_is_a_trace_format_error_and_a_value_error():
    for cls in (TraceHeaderError, TraceTruncatedError, TraceRecordError, TraceCodeError, TraceCoordinateError,
                TraceConflictError, TraceLimitError):
        assert issubclass(cls, TraceFormatError) and issubclass(cls, ValueError)

"""Attention taps in the trace format (version 3): stage codes 16..25, the 576-byte header with
32 per-stage drop counts, the writer -> parser round trip of every attention stage, the older
versions read as before, and oracle_trace/attention.cuh compiled with and without tracing."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import trace_format as tf
from harness.taps import ATTENTION_STAGES, ATTENTION_TAP_STAGES, Tap, TapError, attention_pipeline
from harness.trace_format import TraceCodeError, TraceHeaderError, TraceWriter, parse_header, parse_trace
from harness.trace_format.parser import _parse

ROOT = Path(__file__).resolve().parents[2]
BQ, BKV, D, DV = 8, 4, 16, 12
BLOCKS = dict(block_m=BQ, block_n=BKV, block_k=D, head_dim_v=DV)
SHAPES = {"load_q": (BQ, D), "load_k": (BKV, D), "load_v": (BKV, DV), "s": (BQ, BKV), "mask": (BQ, BKV),
          "softmax_state": (BQ, 3), "p": (BQ, BKV), "o": (BQ, DV), "normalize": (BQ, DV + 1),
          "combine": (BQ, DV + 1)}
DTYPES = {"load_q": torch.bfloat16, "load_k": torch.bfloat16, "load_v": torch.bfloat16, "p": torch.bfloat16}
KV = {"load_k", "load_v", "s", "mask", "softmax_state", "p", "o"}


def _values(stage: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPES[stage], generator=g).to(DTYPES.get(stage, torch.float32))


def _site(stage: str) -> dict:
    """(q_block 2, head 3), KV block 1, split 1, batch 5; normalize has no KV block, combine no split."""
    return dict(tile=(2, 3), k_block=1 if stage in KV else None, partial=None if stage == "combine" else 1, group=5)


def test_stage_codes_and_order():
    assert ATTENTION_TAP_STAGES == ("load_q", "load_k", "load_v", "s", "mask", "softmax_state", "p", "o",
                                    "normalize", "combine")
    assert [tf.STAGE_CODES[s] for s in ATTENTION_TAP_STAGES] == list(range(16, 26))
    assert attention_pipeline(split=True) == ATTENTION_STAGES and "combine" not in attention_pipeline()
    assert tf.VERSION == 3 and tf.HEADER_BYTES == 576 and tf.STAGE_COUNTERS == 32


@pytest.mark.parametrize("records", ["block", "elements"])
def test_every_attention_stage_round_trips(records):
    w = TraceWriter(1 << 16, stages=ATTENTION_TAP_STAGES)
    for i, stage in enumerate(ATTENTION_TAP_STAGES):
        tap = Tap(stage=stage, values=_values(stage, i), **_site(stage))
        if records == "elements":  # a thread's fragment: every other element, two records
            mask = torch.zeros(SHAPES[stage], dtype=torch.bool)
            mask.view(-1)[::2] = True
            tap = Tap(stage=stage, values=tap.values, mask=mask, **_site(stage))
        w.tap(tap, records=2)
    res = parse_trace(w.to_bytes(), **BLOCKS)
    assert [t.stage for t in res.taps] == list(ATTENTION_TAP_STAGES) and res.complete and res.version == 3
    for i, t in enumerate(res.taps):
        site = _site(t.stage)
        assert (t.tile, t.k_block, t.partial, t.group) == (site["tile"], site["k_block"], site["partial"],
                                                            site["group"])
        assert tuple(t.values.shape) == SHAPES[t.stage] and t.values.dtype == DTYPES.get(t.stage, torch.float32)
        want = _values(t.stage, i)
        if records == "elements":
            assert t.mask is not None and torch.equal(t.values[t.mask], want[t.mask])
        else:
            assert t.mask is None and torch.equal(t.values, want)
    assert res.get("softmax_state", (2, 3), 1).values.shape == (BQ, 3)
    # the bulk reader gives the strict parser's result
    strict = _parse(w.to_bytes(), **{k: v for k, v in BLOCKS.items()}, bulk=False)
    assert [(t.key, t.partial, t.group) for t in strict.taps] == [(t.key, t.partial, t.group) for t in res.taps]
    assert all(torch.equal(a.values, b.values) for a, b in zip(strict.taps, res.taps))


def test_attention_tap_shapes_are_checked():
    w = TraceWriter(1 << 16, stages=ATTENTION_TAP_STAGES)
    w.block("softmax_state", (0, 0), torch.zeros(BQ, 4), shape=(BQ, 4), k_block=0)
    with pytest.raises(tf.TraceCoordinateError, match="softmax_state record .* says the tile is 8x4"):
        parse_trace(w.to_bytes(), **BLOCKS)
    w = TraceWriter(1 << 16, stages=ATTENTION_TAP_STAGES)
    w.block("o", (0, 0), torch.zeros(BQ, DV), shape=(BQ, DV), k_block=0)
    assert parse_trace(w.to_bytes(), **BLOCKS).taps[0].values.shape == (BQ, DV)
    with pytest.raises(tf.TraceCoordinateError):  # without head_dim_v, o is [BQ, D]
        parse_trace(w.to_bytes(), block_m=BQ, block_n=BKV, block_k=D)


@pytest.mark.parametrize("stage", sorted(KV))
def test_kv_block_stages_need_a_kv_block(stage):
    with pytest.raises(TapError, match="k_block is required"):
        Tap(stage=stage, tile=(0, 0), values=_values(stage, 0))
    w = TraceWriter(1 << 16, stages=ATTENTION_TAP_STAGES)
    w.block(stage, (0, 0), _values(stage, 0), shape=SHAPES[stage])
    with pytest.raises(tf.TraceCoordinateError, match="has no k-block"):
        parse_trace(w.to_bytes(), **BLOCKS)


def test_version_3_header_counts_attention_drops_by_stage():
    rec = tf._round_up(tf.RECORD_HEAD_BYTES + 8 + BQ * (DV + 1) * 4)
    w = TraceWriter(tf.HEADER_BYTES + rec + 8, stages=ATTENTION_TAP_STAGES)
    for stage in ("normalize", "combine", "combine"):
        w.block(stage, (0, 0), torch.zeros(BQ, DV + 1), shape=(BQ, DV + 1))
    buf = w.to_bytes()
    head = parse_header(buf)
    assert head.version == 3 and head.header_bytes == 576 and head.dropped == 2
    assert dict(head.dropped_by_stage) == {"combine": 2}  # code 25: its own counter, not code 25 % 16
    assert struct.unpack_from("<I", buf, 448 + 4 * 25) == (2,)
    assert set(head.selection.stages) == set(ATTENTION_TAP_STAGES)
    assert struct.unpack_from("<I", buf, 32)[0] == sum(1 << c for c in range(16, 26))
    res = parse_trace(buf, **BLOCKS)
    assert not res.complete and [t.stage for t in res.taps] == ["normalize"]


def test_a_version_3_header_refuses_a_drop_count_of_no_stage():
    buf = bytearray(TraceWriter(1 << 12).to_bytes())
    struct.pack_into("<II", buf, 24, 1, 0)
    struct.pack_into("<I", buf, 448 + 4 * 30, 1)
    with pytest.raises(TraceHeaderError, match=r"dropped_by_stage\[30\]"):
        parse_header(bytes(buf))


@pytest.mark.parametrize("version", [1, 2])
def test_older_versions_read_as_before(version):
    w = TraceWriter(1 << 12, version=version)
    w.block("mma", (0, 1), torch.ones(BQ, BKV), shape=(BQ, BKV), k_block=0)
    buf = w.to_bytes()
    head = parse_header(buf)
    assert head.header_bytes == 512 and head.version == version
    assert struct.unpack_from("<H", buf, 6) == (512,) and struct.unpack_from("<I", buf, 512)[0] > 0
    (tap,) = parse_trace(buf, block_m=BQ, block_n=BKV, block_k=D).taps
    assert tap.stage == "mma" and torch.equal(tap.values, torch.ones(BQ, BKV))
    # an attention code in an old trace is unknown, in the strict and the bulk reader alike
    bad = bytearray(buf)
    bad[512 + 8] = tf.STAGE_CODES["s"]
    for bulk in (True, False):
        with pytest.raises(TraceCodeError, match="stage code 19 is unknown"):
            _parse(bytes(bad), block_m=BQ, block_n=BKV, block_k=D, bulk=bulk)
    bad = bytearray(buf)
    struct.pack_into("<I", bad, 32, 1 << 16)
    with pytest.raises(TraceHeaderError, match="unknown stage codes"):
        parse_header(bytes(bad))
    with pytest.raises(ValueError, match=f"version-{version} trace cannot hold the stages load_q"):
        TraceWriter(1 << 12, version=version, stages=("load_q",))


def test_the_extent_of_a_version_2_sink_counts_its_512_byte_header():
    w = TraceWriter(1 << 12, version=2)
    w.block("mma", (0, 0), torch.full((BQ, BKV), 3.0), shape=(BQ, BKV), k_block=2)
    buf = w.to_bytes()
    assert tf.trace_extent(buf[:tf.HEADER_BYTES]) == 512 + tf._round_up(tf.RECORD_HEAD_BYTES + 8 + BQ * BKV * 4)


# --- the header compiled: oracle_trace/attention.cuh in tests/cuda/attention_taps.cu -----------

SRC = ROOT / "tests" / "cuda" / "attention_taps.cu"
ARCHS = {"sm_90a": "-gencode=arch=compute_90a,code=sm_90a", "sm_80": "-gencode=arch=compute_80,code=sm_80"}
BUILDS = {"none": (), "off": ("ATTENTION_TAPS_WITH_HEADER",), "on": ("ATTENTION_TAPS_WITH_HEADER", "ORACLE_TRACE")}


@pytest.fixture(scope="module")
def cubins(tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    from cuda_tools import cuobjdump

    from harness.build import build_slot

    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    tmp = tmp_path_factory.mktemp("attention_cubins")

    def build(arch: str, name: str) -> Path:
        out = tmp / f"{arch}_{name}.cubin"
        cmd = ["nvcc", ARCHS[arch], "-cubin", "-std=c++17", f"-I{ROOT / 'harness' / 'include'}",
               *(f"-D{d}" for d in BUILDS[name]), "-o", str(out), str(SRC)]
        with build_slot():
            proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr}"
        return out

    jobs = [(a, n) for a in ARCHS for n in BUILDS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(lambda j: build(*j), jobs)))


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_attention_header_adds_nothing_untraced_and_taps_traced(cubins, arch):
    from cuda_tools import all_symbols, sass_by_function

    none, off, on = (sass_by_function(cubins[(arch, n)]) for n in BUILDS)
    assert set(none) == {"attention_taps_fwd", "attention_taps_fwd_untraced"}
    assert off == none  # header included, tracing off: the same SASS as no header and no taps
    assert "oracle_trace_sink" not in all_symbols(cubins[(arch, "off")])
    assert on["attention_taps_fwd_untraced"] == none["attention_taps_fwd_untraced"]
    assert len(on["attention_taps_fwd"]) > len(none["attention_taps_fwd"])
    assert "oracle_trace_sink" in all_symbols(cubins[(arch, "on")])


def test_the_header_names_every_attention_stage():
    text = (ROOT / "harness" / "include" / "oracle_trace" / "attention.cuh").read_text()
    for call in ("tap_q", "tap_k", "tap_v", "tap_scores", "tap_softmax_state", "tap_o", "tap_out", "tap_lse"):
        assert f"static void {call}(" in text, call
    assert np.array_equal(sorted(tf.STAGE_CODES[s] for s in ATTENTION_TAP_STAGES), np.arange(16, 26))

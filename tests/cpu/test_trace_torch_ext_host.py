"""The host side of harness.torch_ext, on CPU tensors (the GPU tier runs the extension)."""

from __future__ import annotations

import re

import pytest
import torch

from harness import torch_ext
from harness.trace_format import HEADER_BYTES, TraceHeaderError, TraceWriter, parse_header


def test_make_sink_holds_the_initial_bytes():
    sink = torch_ext.make_sink(4096, tiles=[(0, 1)], k_blocks=[3], stages=["mma"], device="cpu")
    assert sink.dtype == torch.uint8 and sink.shape == (4096,)
    h = parse_header(sink.numpy())
    assert h.capacity == 4096 and h.selection.tiles == ((0, 1),) and h.selection.k_blocks == (3,)
    assert int(sink[HEADER_BYTES:].sum()) == 0


def test_read_sink_copies_only_the_extent_and_parses():
    w = TraceWriter(1 << 16)
    w.elements("mma", (0, 0), [0], [1], torch.tensor([5.0]), shape=(16, 16), k_block=0)
    sink = torch.frombuffer(bytearray(w.to_bytes()), dtype=torch.uint8)
    res = torch_ext.read_sink(sink, block_m=16, block_n=16, block_k=16)
    assert res.get("mma", (0, 0), 0).values[0, 1] == 5.0


def test_reset_sink_rewrites_in_place():
    sink = torch_ext.make_sink(4096, device="cpu")
    sink[HEADER_BYTES + 5] = 7
    ptr = sink.data_ptr()
    torch_ext.reset_sink(sink, stages=["load_a"])
    assert sink.data_ptr() == ptr and int(sink[HEADER_BYTES:].sum()) == 0
    assert parse_header(sink.numpy()).selection.stages == ("load_a",)


def test_bad_sinks_are_refused():
    with pytest.raises(TypeError, match="1-D uint8"):
        torch_ext.read_sink(torch.zeros(1024), block_m=1, block_n=1, block_k=1)
    with pytest.raises(ValueError, match="smaller than its 576-byte header"):
        torch_ext.read_sink(torch.zeros(100, dtype=torch.uint8), block_m=1, block_n=1, block_k=1)
    with pytest.raises(TraceHeaderError, match="magic"):
        torch_ext.read_sink(torch.zeros(1024, dtype=torch.uint8), block_m=1, block_n=1, block_k=1)


def test_flags_and_example_source_agree():
    assert torch_ext.extension_cuda_flags() == [f"-I{torch_ext.INCLUDE_DIR}", "-DORACLE_TRACE"]
    assert "-DORACLE_TRACE" not in torch_ext.extension_cuda_flags(trace=False)
    assert (torch_ext.INCLUDE_DIR / "oracle_trace" / "trace.cuh").exists()
    src = torch_ext.EXAMPLE_SOURCE.read_text()
    for name in torch_ext.EXAMPLE_FUNCTIONS:
        assert re.search(rf"^\S.*\b{name}\(", src, re.M), name
        assert re.search(rf"\b{name}\(", torch_ext.EXAMPLE_DECLARATIONS), name
    assert "oracle_trace::set_sink(" in src

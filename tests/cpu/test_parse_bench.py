"""The parse benchmark's plumbing at a small size: the sink it synthesises is the one a traced run of
the zoo's Hopper GEMM leaves (the header of the trace format's current version, the cursor at the
records' end), so the parser reads every record and the live path's recording takes every tap."""

import json

import bench_scripts  # tests/ is on sys.path


def test_the_synthesised_sink_parses_whole(tmp_path):
    bench = bench_scripts.load("parse_bench")
    out = tmp_path / "parse.json"
    assert bench.main(["--size", "512", "--runs", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    # 4 x 4 tiles (the 8 tiles folded in: 4 distinct), 8 k-blocks: per tile and k-block two descriptor
    # images of 4 chunks, two loads of 4 bands and 128 mma records, then 4 epilogue steps of 128
    tiles, k_blocks = 4, 8
    assert doc["records"] == tiles * (k_blocks * (8 + 8 + 128) + 4 * 128)
    assert doc["taps"] == tiles * (k_blocks * 5 + 4)
    assert doc["record_bytes"] > 0 and doc["parse_s_median"] > 0 and doc["recording_s_median"] > 0

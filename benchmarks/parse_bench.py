"""The host side of a live run, timed without a GPU: the sink of a traced run of the zoo's Hopper
GEMM (zoo/hopper_gemm, bf16, 128 x 128 x 64 tiles) is synthesised record by record as its kernel
taps them, then parsed (`harness.trace_format.parse_trace`) and turned into a Recording
(`oracle.run.live._recording`, the function a live run calls), each phase timed.

    python benchmarks/parse_bench.py --out benchmarks/results/parse_bench_cpu.json

The records, per traced tile and k-block, as the kernel writes them (one consumer warpgroup of 128
threads, group of 4 warps for the shared-memory taps): descriptor_a and descriptor_b, each 4 Bytes
chunks of the 16 KiB swizzled image; load_a (128 x 64) and load_b (64 x 128), each 4 Block bands;
mma, 128 Elements records of the 128 accumulator elements each thread holds (the wgmma fragment
layout). After the last k-block, epilogue_alpha_beta, _bias and _activation (fp32) and
epilogue_cast (bf16), 128 Elements records each. The tiles' records interleave as concurrent CTAs
write them. At 4096^3 with 8 tiles: about 78 000 records, 109 MB, in a sink of the size the live
path gives that selection (the header's cursor marks the end; the rest is zero).

Phases reported (seconds, median and all runs): `parse` (parse_trace of the sink bytes) and
`recording` (the whole of `_recording`: parse, trace account, warnings and the Recording, i.e.
what a live run reports as its 'parse' phase), wall clock, and the medians of the process's CPU
time beside them (on a shared machine the wall clock also counts the time others held the cores;
the load average is recorded). The values are random bits: parsing does not read them. Runs on
any machine; no GPU is used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import provenance  # noqa: E402

CASE = ROOT / "zoo" / "hopper_gemm" / "hopper_gemm.toml"
TILES = ((0, 0), (31, 31), (0, 31), (31, 0), (15, 16), (16, 15), (7, 23), (23, 7))  # as benchmarks/warm_path.py
THREADS = 128  # the consumer warpgroup
WARPS = 4  # the group that taps shared memory
SLOTS = 4  # the kernel's pipeline depth


def fragment_coords(bm: int, bn: int) -> np.ndarray:
    """Packed (row | col << 16) of each accumulator element of each of the 128 threads, [128, bm*bn/128],
    in the wgmma m64nNk16 layout: thread t of warp w holds rows w*16 + t/4 (+8), columns 2*(t%4) (+1)
    of every 8-column group, for each 64-row half of the tile."""
    per = bm * bn // THREADS
    i = np.arange(per)
    out = np.empty((THREADS, per), np.uint32)
    for t in range(THREADS):
        w, lane = divmod(t, 32)
        v, j, nb, mb = i % 2, (i // 2) % 2, (i // 4) % (bn // 8), i // (2 * bn // 4)
        rows = mb * 64 + w * 16 + lane // 4 + 8 * j
        cols = nb * 8 + (lane % 4) * 2 + v
        out[t] = rows.astype(np.uint32) | cols.astype(np.uint32) << 16
    return out


def synth_sink(case, capacity: int, seed: int = 0) -> bytes:
    """The sink a traced run of `case` leaves behind (see the module docstring)."""
    from harness.trace_format import (BLOCK_BODY, BYTES_BODY, ELEMENTS_BODY, HEADER_BYTES, HEADER_OFFSETS, RecordKind,
                                      encode_record, sink_prefix)

    s = case.spec
    bm, bn, bk = s.tile.bm, s.tile.bn, s.tile.bk
    sel = case.trace
    tiles = sel.tiles
    rng = np.random.default_rng(seed)
    coords = fragment_coords(bm, bn)
    per = coords.shape[1]
    coord_bytes = [c.tobytes() for c in coords]
    pool = rng.integers(0, 2**32, size=1 << 20, dtype=np.uint32).tobytes()  # random value bits to slice from

    def bits(n: int) -> bytes:
        o = int(rng.integers(0, len(pool) - n)) & ~7
        return pool[o:o + n]

    def elements(stage, tile, kb, dtype, isz, order):
        return [encode_record(RecordKind.ELEMENTS, ELEMENTS_BODY.pack(per, 0) + coord_bytes[t] + bits(per * isz),
                              stage=stage, dtype=dtype, tile=tile, k_block=kb, cta=cta_of[tile], thread=128 + t,
                              shape=(bm, bn)) for t in order]

    def image(stage, tile, kb, slot, rows):
        total = rows * bk * 2
        per_warp = total // WARPS
        return [encode_record(RecordKind.BYTES, BYTES_BODY.pack(w * per_warp, per_warp, total, 0) + bits(per_warp),
                              stage=stage, dtype="bf16", tile=tile, k_block=kb, slot=slot, cta=cta_of[tile],
                              thread=128 + 32 * w, shape=(rows, bk) if stage == "descriptor_a" else (bk, rows))
                for w in range(WARPS)]

    def band(stage, tile, kb, slot, shape):
        rows = shape[0] // WARPS
        return [encode_record(RecordKind.BLOCK, BLOCK_BODY.pack(w * rows, 0, rows, shape[1]) +
                              bits(rows * shape[1] * 2), stage=stage, dtype="bf16", tile=tile, k_block=kb,
                              slot=slot, cta=cta_of[tile], thread=128 + 32 * w, shape=shape)
                for w in range(WARPS)]

    tiles_n = s.tiles_n
    grid = -(-s.tiles_m * tiles_n // 2)
    cta_of = {t: (t[0] * tiles_n + t[1]) % grid for t in tiles}
    it_of = {t: ((t[0] * tiles_n + t[1]) // grid) * s.k_blocks for t in tiles}  # tiles the CTA ran before
    kbs = range(s.k_blocks) if sel.k_blocks is None else sel.k_blocks
    records: list[bytes] = []
    for kb in kbs:
        taps = []
        for t in tiles:
            slot = (it_of[t] + kb) % SLOTS
            taps += [image("descriptor_a", t, kb, slot, bm), image("descriptor_b", t, kb, slot, bn),
                     band("load_a", t, kb, slot, (bm, bk)), band("load_b", t, kb, slot, (bk, bn)),
                     elements("mma", t, kb, "fp32", 4, rng.permutation(THREADS))]
        for i in rng.permutation(len(taps)):  # concurrent CTAs: their taps interleave
            records += taps[i]
    for stage, dtype, isz in (("epilogue_alpha_beta", "fp32", 4), ("epilogue_bias", "fp32", 4),
                              ("epilogue_activation", "fp32", 4), ("epilogue_cast", "bf16", 2)):
        for t in tiles:
            records += elements(stage, t, None, dtype, isz, rng.permutation(THREADS))
    prefix = sink_prefix(capacity, tiles=tiles, k_blocks=sel.k_blocks, stages=sel.stages)
    body = b"".join(records)
    sink = bytearray(capacity)
    sink[:len(prefix)] = prefix
    used = len(prefix) - HEADER_BYTES + len(body)
    if HEADER_BYTES + used > capacity:  # the live path launches again with a sink of the size the kernel needed
        return synth_sink(case, HEADER_BYTES + used + 4096, seed)
    sink[len(prefix):len(prefix) + len(body)] = body
    struct.pack_into("<Q", sink, HEADER_OFFSETS["cursor"], used)
    return bytes(sink)


def load_case(size: int, k_blocks):
    from oracle.run.case import load_case as load
    from oracle.run.case_types import with_trace

    case = load(str(CASE), {"m": size, "n": size, "k": size})
    s = case.spec  # a smaller problem: the same tiles folded into its grid
    tiles = tuple(dict.fromkeys((tm % s.tiles_m, tn % s.tiles_n) for tm, tn in TILES))
    return with_trace(case, tiles, k_blocks, None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="m = n = k (default 4096)")
    ap.add_argument("--k-blocks", type=int, default=None, help="trace the first N k-blocks (default: all)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", default=None, help="write a cProfile of one parse to this file")
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args(argv)

    from harness import trace_format
    from harness.runner import KernelRun, RunStatus
    from oracle.run import live, sink
    from oracle.run.inputs import Provenance, make_operands

    case = load_case(args.size, None if args.k_blocks is None else tuple(range(args.k_blocks)))
    s = case.spec
    budget, ceiling = sink.sink_budget(case)
    capacity = sink.initial_sink_bytes(budget, ceiling)
    t0 = time.perf_counter()
    sink = synth_sink(case, capacity)
    synth_s = time.perf_counter() - t0
    header = trace_format.parse_header(sink)
    ops = make_operands(s, "ones")
    d = torch.ones(s.total_m, s.n, dtype=torch.bfloat16)  # the output's values are not read here
    run = KernelRun(status=RunStatus.OK, outputs={"d": d}, sink=sink, sink_source="synthetic", device={},
                    function={})
    prov = Provenance("random", 1)

    parse, recording, parse_cpu, recording_cpu, taps = [], [], [], [], 0
    for _ in range(args.runs):
        t0, c0 = time.perf_counter(), time.process_time()
        tr = trace_format.parse_trace(sink, block_m=s.tile.bm, block_n=s.tile.bn, block_k=s.tile.bk)
        parse.append(time.perf_counter() - t0)
        parse_cpu.append(time.process_time() - c0)
        taps, n_records = len(tr.taps), tr.records
        del tr
        t, c0 = time.perf_counter(), time.process_time()
        lr = live._recording(case, ops, prov, run, budget, ceiling, (), True, (t, t, t), ())
        recording.append(lr.phases_s["parse"])
        recording_cpu.append(time.process_time() - c0)
        del lr
    if args.profile:
        import cProfile

        cProfile.runctx("trace_format.parse_trace(sink, block_m=s.tile.bm, block_n=s.tile.bn, block_k=s.tile.bk)",
                        globals(), {"trace_format": trace_format, "sink": sink, "s": s}, args.profile)
    doc = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "problem": f"{s.m}x{s.n}x{s.k} bf16, {len(case.trace.tiles)} traced tiles, k-blocks "
                      f"{'all' if args.k_blocks is None else args.k_blocks}",
           "sink_bytes": capacity, "record_bytes": header.used, "records": n_records, "taps": taps,
           "synthesis_s": round(synth_s, 3),
           "parse_s_median": round(statistics.median(parse), 4), "parse_s": [round(x, 4) for x in parse],
           "recording_s_median": round(statistics.median(recording), 4),
           "recording_s": [round(x, 4) for x in recording],
           "parse_cpu_s_median": round(statistics.median(parse_cpu), 4),
           "recording_cpu_s_median": round(statistics.median(recording_cpu), 4),
           "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    print(json.dumps(doc, indent=1))
    if args.out:
        doc[provenance.KEY] = provenance.stamp(
            __file__, argv, seeds={"sink_values": 0},  # synth_sink's: the values are random bits nobody reads
            peer=provenance.NotApplicable("the host side alone: nothing is timed beside it"),
            timing=provenance.Timing(clock="the host's wall clock and the process's CPU time around each parse",
                                     warmup="none: the sink is made once, then parsed --runs times",
                                     reps=f"{args.runs} parses, each followed by one Recording made from the sink",
                                     statistic="median (every run kept)"))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The one-pass comparator (oracle.judging.compare_fast) against torch.testing.assert_close and against the
read-bandwidth ceiling, on this GPU, in one run.

    python benchmarks/compare_bench.py --out benchmarks/results/compare_h200.json

Inputs: two 16384 x 16384 bf16 tensors (2^28 elements each, 1 GiB together: far past the L2, so
no flush is needed), fresh random data from a seed recorded in the JSON; `received` is `expected`
times (1 + u), |u| <= 4e-3, so it passes assert_close's bf16 tolerances (rtol 1.6e-2, atol 1e-5).

Measured, with CUDA events around every rep (a device sleep first, so that the host has queued
the rep before the GPU starts it), after warm-up, reporting the median:
  1. read ceiling      a read-only Triton kernel summing both tensors (a few block shapes) and
                       torch's `.sum()` of each; the fastest gives read_bw_TBps.
  2. assert_close      torch.testing.assert_close(received, expected, rtol, atol) (it passes).
  3. compare_fast      the device pass (`tile_stats`: the statistics kernels and the per-tile fold;
                       what assert_close's kernels compare with) for every candidate launch config,
                       with 128 x 128 tiles and the same rtol/atol; the fastest is chosen in this
                       run. The whole `compare_fast` call (the pass, the summary kernels that pick
                       the units a report reads, one copy to the host, TileMetrics for those only)
                       is timed too, with CUDA events and with the host clock (20 reps each).
Also: the float64 pass alone (`fast_pass=False`, the cost when every tile fails), and the extra
device memory (torch.cuda.max_memory_allocated above the inputs) of compare_fast, per 128 x 128 tile
and for one tile, each at two sizes, and of assert_close.

Verified before and after timing: assert_close passes; compare_fast says MATCH (how many programs
the fast pass vouched for is logged); on a 2048 x 2048 block it agrees with compare_reference
(identical counts and maxima); a tile scaled by 2 is found, alone, with the reference's first bad
elements.

Writes JSON with the keys machine, elements, dtype, oracle_ms, assert_close_ms, read_bw_TBps,
effective_TBps (bytes of both inputs / oracle_ms), speedup_vs_assert_close, fraction_of_read_bw,
extra_memory_bytes, and details (every config, every timing, the goals). Goals, reported (not
enforced): effective >= 3.4 TB/s, >= 0.8 of the read ceiling, >= 20x assert_close (reported with the
ceiling any comparator reading both inputs has: assert_close time / read-floor time), extra memory
independent of the size (the same bytes per tile, and for one tile, at both sizes), the whole call
<= 1.3x the device pass in every round (compare_fast_total / oracle_ms, CUDA events). Exit code 0
when everything was measured and verified, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import provenance  # noqa: E402
from oracle.judging.compare import Status, compare_reference  # noqa: E402
from oracle.judging.compare_fast import (CANDIDATE_CONFIGS, DEFAULT_CONFIG, S_GENERAL, FastConfig,  # noqa: E402
                                 compare_fast, inline_bound, tile_stats)

GOALS = {"effective_TBps": 3.4, "fraction_of_read_bw": 0.8, "speedup_vs_assert_close": 20.0,
         "whole_call_over_pass": 1.3}
TILE = (128, 128)
ROUNDS = 5  # alternating rounds of the pass and the whole call (their ratio: the median round's)
SLEEP_CYCLES = 1_000_000  # about 0.5 ms: the host queues a rep while the GPU sleeps
READ_CONFIGS = ((1024, 8, 4), (2048, 4, 4), (2048, 8, 8), (4096, 4, 8), (8192, 2, 8), (4096, 8, 16))


class VerificationError(RuntimeError):
    pass


@triton.jit
def _read_kernel(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Reads both tensors once (the sum keeps the loads alive): the read ceiling."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * (BLOCK * UNROLL)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in tl.static_range(UNROLL):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(a_ptr + offs).to(tl.float32) + tl.load(b_ptr + offs).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def time_ms(fn, reps: int, warmup: int = 3) -> dict:
    """CUDA events around each rep, after warm-up; a device sleep before each rep."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    samples.sort()
    return {"median_ms": statistics.median(samples), "min_ms": samples[0], "max_ms": samples[-1],
            "p10_ms": samples[len(samples) // 10], "p90_ms": samples[(9 * len(samples)) // 10], "reps": reps}


def extra_memory(fn) -> int:
    """Peak device memory allocated while fn runs, above what was allocated before."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _inputs(rows: int, cols: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    expected = torch.randn(rows, cols, device="cuda", generator=g)
    u = torch.rand(rows, cols, device="cuda", generator=g).mul_(8e-3).sub_(4e-3)
    received = (expected * (1 + u)).to(torch.bfloat16)
    del u
    return received, expected.to(torch.bfloat16)


def _check(cond: bool, what: str, log: list):
    log.append(("ok   " if cond else "FAIL ") + what)
    if not cond:
        raise VerificationError(what)


def verify(received, expected, rtol, atol, config, log: list) -> None:
    torch.testing.assert_close(received, expected, rtol=rtol, atol=atol)
    log.append("ok   assert_close passes")
    c = compare_fast(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=config)
    _check(c.status is Status.MATCH, f"compare_fast says {c.status.value} on the passing pair", log)
    st = tile_stats(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=config)
    general = int(st.rows[..., S_GENERAL].sum())
    log.append(("ok   " if general == 0 else "note ") + f"{st.programs - general} of {st.programs} programs "
               f"vouched for on the fast pass ({general} took the float64 pass)")
    # against the reference on a block
    r, e = received[:2048, :2048], expected[:2048, :2048]
    fast = compare_fast(r, e, rtol=rtol, atol=atol, tile_shape=TILE, config=config)
    ref = compare_reference(r, e, bound=inline_bound(e, rtol, atol), tile_shape=TILE)
    fast_units, ref_units = fast.all_units(), ref.all_units()
    same = fast.status is ref.status and len(fast_units) == len(ref_units) and all(
        (a.tile, a.compared, a.mismatches, a.max_abs_err, a.trivial, a.first_bad)
        == (b.tile, b.compared, b.mismatches, b.max_abs_err, b.trivial, b.first_bad)
        and abs(a.max_ratio - b.max_ratio) <= 2e-6 * b.max_ratio
        and abs(a.rel_l2 - b.rel_l2) <= 1e-5 * b.rel_l2 for a, b in zip(fast_units, ref_units))
    _check(same, "compare_fast agrees with compare_reference on a 2048 x 2048 block", log)
    # a bad tile is found, alone
    i, j = min(37, received.shape[0] // TILE[0] - 1), min(91, received.shape[1] // TILE[1] - 1)
    rs, cs = slice(i * TILE[0], (i + 1) * TILE[0]), slice(j * TILE[1], (j + 1) * TILE[1])
    saved = received[rs, cs].clone()
    received[rs, cs] *= 2
    try:
        c = compare_fast(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=config)
        bad = [t for t in c.tiles if not t.passed]
        ref = compare_reference(received[rs, cs], expected[rs, cs], bound=inline_bound(expected[rs, cs], rtol, atol),
                                origin=(i * TILE[0], j * TILE[1]))
        _check(c.status is Status.MISMATCH and [t.tile for t in bad] == [(i, j)]
               and bad[0].first_bad == ref.tiles[0].first_bad and bad[0].mismatches == ref.tiles[0].mismatches,
               f"a tile scaled by 2 is found alone at {(i, j)} with the reference's first bad elements", log)
    finally:
        received[rs, cs] = saved
    _check(torch.equal(received[rs, cs], saved), "the received tensor is restored", log)


def _provenance(argv, args, seed: int) -> dict:
    return provenance.stamp(
        __file__, argv, seeds={"inputs": seed},
        peer=provenance.Peer("torch.testing.assert_close(received, expected, rtol, atol) on the same tensors; "
                             "and the read ceiling (the fastest read-only kernel)",
                             "speedup_vs_assert_close = assert_close median ms / device pass median ms (higher is "
                             "better); fraction_of_read_bw = effective TB/s / read ceiling TB/s"),
        timing=provenance.Timing(
            clock=f"CUDA events around each rep, a device sleep of {SLEEP_CYCLES} cycles before each; no flush: "
                  f"the two inputs are {4 * args.rows * args.cols / 2**30:.3g} GiB; the whole call also by the host's "
                  "wall clock",
            warmup="3 reps (2 for assert_close, the rounds and the float64 pass)",
            reps=f"{args.reps} per read kernel and config, {max(5, args.reps // 3)} of assert_close, {ROUNDS} "
                 "alternating rounds of 20 of the pass and the whole call",
            statistic="median (min, max, p10, p90 kept); the whole call over the pass: the median round's"),
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "compare_h200.json"))
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--cols", type=int, default=16384)
    p.add_argument("--rtol", type=float, default=1.6e-2)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--reps", type=int, default=30, help="timed reps of each device pass")
    p.add_argument("--seed", type=int, default=None, help="default: from the clock (recorded in the JSON)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("compare_bench needs a CUDA GPU; none is visible.", file=sys.stderr)
        return 1
    t_start = time.time()
    seed = args.seed if args.seed is not None else int(time.time()) % 2**31
    rows, cols, rtol, atol = args.rows, args.cols, args.rtol, args.atol
    n = rows * cols
    nbytes = 2 * n * 2  # both bf16 inputs
    received, expected = _inputs(rows, cols, seed)
    log: list[str] = []
    result: dict = {}
    status = 0
    try:
        verify(received, expected, rtol, atol, DEFAULT_CONFIG, log)

        # 1. the read ceiling
        reads = []
        for block, unroll, warps in READ_CONFIGS:
            if n % (block * unroll):
                continue
            grid = (n // (block * unroll),)
            part = torch.empty(grid[0], device="cuda", dtype=torch.float32)
            t = time_ms(lambda: _read_kernel[grid](received, expected, part, BLOCK=block, UNROLL=unroll,
                                                   num_warps=warps), args.reps)
            reads.append({"kernel": f"triton read block={block} unroll={unroll} warps={warps}", **t,
                          "TBps": nbytes / (t["median_ms"] * 1e-3) / 1e12})
        t = time_ms(lambda: (received.sum(), expected.sum()), args.reps)
        reads.append({"kernel": "torch .sum() of each", **t, "TBps": nbytes / (t["median_ms"] * 1e-3) / 1e12})
        best_read = max(reads, key=lambda x: x["TBps"])

        # 2. assert_close
        assert_close = time_ms(lambda: torch.testing.assert_close(received, expected, rtol=rtol, atol=atol),
                               max(5, args.reps // 3), warmup=2)
        assert_close_mem = extra_memory(lambda: torch.testing.assert_close(received, expected, rtol=rtol, atol=atol))

        # 3. compare_fast: the device pass, every candidate config
        configs = []
        for cfg in dict.fromkeys((DEFAULT_CONFIG,) + tuple(CANDIDATE_CONFIGS)):
            st = tile_stats(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=cfg)
            general = int(st.rows[..., S_GENERAL].sum())
            t = time_ms(lambda: tile_stats(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=cfg),
                        args.reps)
            configs.append({"config": asdict(cfg), "programs": st.programs, "float64_pass_programs": general, **t,
                            "effective_TBps": nbytes / (t["median_ms"] * 1e-3) / 1e12})
        valid = [c for c in configs if c["float64_pass_programs"] == 0]
        best = min(valid or configs, key=lambda c: c["median_ms"])
        best_cfg = FastConfig(**best["config"])

        # the whole call (the pass, the units a report reads picked on the device) against the pass, timed
        # in alternating rounds so that a slow spell of the host falls on both; then the float64 pass alone
        whole_fn = lambda: compare_fast(received, expected, rtol=rtol, atol=atol, tile_shape=TILE,  # noqa: E731
                                        config=best_cfg)
        pass_fn = lambda: tile_stats(received, expected, rtol=rtol, atol=atol, tile_shape=TILE,  # noqa: E731
                                     config=best_cfg)
        rounds = [(time_ms(pass_fn, 20, warmup=2), time_ms(whole_fn, 20, warmup=2)) for _ in range(ROUNDS)]
        # the device time the host has to queue a rep in (the whole call's host side before its wait)
        sleep = time_ms(lambda: torch.cuda._sleep(SLEEP_CYCLES), 10, warmup=1)
        ratios = [w["median_ms"] / p["median_ms"] for p, w in rounds]
        total = sorted(rounds, key=lambda pw: pw[1]["median_ms"] / pw[0]["median_ms"])[ROUNDS // 2][1]  # median round
        wall = []
        for _ in range(20):
            t0 = time.perf_counter()
            compare_fast(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=best_cfg)
            wall.append((time.perf_counter() - t0) * 1e3)
        f64 = time_ms(lambda: tile_stats(received, expected, rtol=rtol, atol=atol, tile_shape=TILE, config=best_cfg,
                                         fast_pass=False), 5, warmup=1)

        # extra memory: per 128 x 128 tile, and for one tile, each at two sizes
        mem_per_tile, mem_one = {}, {}
        for frac in (1, 2):
            r, e = received[: rows // frac, : cols // frac], expected[: rows // frac, : cols // frac]
            key = f"{rows // frac}x{cols // frac}"
            n_tiles = -(-(rows // frac) // TILE[0]) * -(-(cols // frac) // TILE[1])
            compare_fast(r, e, rtol=rtol, atol=atol, config=best_cfg)  # compile outside the measurement
            mem_per_tile[key] = extra_memory(
                lambda: compare_fast(r, e, rtol=rtol, atol=atol, tile_shape=TILE, config=best_cfg)) / n_tiles
            mem_one[key] = extra_memory(lambda: compare_fast(r, e, rtol=rtol, atol=atol, config=best_cfg))
        tiles = -(-rows // TILE[0]) * -(-cols // TILE[1])
        mem_tiles = int(mem_per_tile[f"{rows}x{cols}"] * tiles)

        verify(received, expected, rtol, atol, best_cfg, log)

        oracle_ms = best["median_ms"]
        effective = nbytes / (oracle_ms * 1e-3) / 1e12
        read_bw = best_read["TBps"]
        one_vals, tile_vals = list(mem_one.values()), list(mem_per_tile.values())
        # no pass that reads both inputs beats the read floor: the speedup any comparator can reach
        speedup_ceiling = assert_close["median_ms"] / best_read["median_ms"]
        goals = {
            "effective_TBps >= 3.4": {"value": effective, "met": effective >= GOALS["effective_TBps"]},
            "fraction_of_read_bw >= 0.8": {"value": effective / read_bw,
                                           "met": effective / read_bw >= GOALS["fraction_of_read_bw"]},
            "speedup_vs_assert_close >= 20": {"value": assert_close["median_ms"] / oracle_ms,
                                              "met": assert_close["median_ms"] / oracle_ms
                                              >= GOALS["speedup_vs_assert_close"],
                                              "ceiling_at_read_floor": speedup_ceiling},
            "extra memory independent of size": {
                "value": {"one_tile_bytes": mem_one, "bytes_per_128x128_tile": mem_per_tile},
                "met": max(one_vals) == min(one_vals) and max(tile_vals) == min(tile_vals)},
            "whole_call_over_pass <= 1.3 in every round": {"value": max(ratios),
                                                           "met": max(ratios) <= GOALS["whole_call_over_pass"],
                                            "per_round": ratios, "host_wall_median_ms": statistics.median(wall)},
        }
        props = torch.cuda.get_device_properties(0)
        result = {
            "machine": torch.cuda.get_device_name(),
            "elements": n,
            "dtype": "bfloat16",
            "oracle_ms": oracle_ms,
            "assert_close_ms": assert_close["median_ms"],
            "read_bw_TBps": read_bw,
            "effective_TBps": effective,
            "speedup_vs_assert_close": assert_close["median_ms"] / oracle_ms,
            "fraction_of_read_bw": effective / read_bw,
            "extra_memory_bytes": mem_tiles,
            "details": {
                "shape": [rows, cols], "tile_shape": list(TILE), "rtol": rtol, "atol": atol, "seed": seed,
                "input_bytes": nbytes, "oracle_ms_means": "device pass: tile_stats (statistics kernels + fold)",
                "best_config": best["config"], "configs": configs, "read": reads, "assert_close": assert_close,
                "assert_close_extra_memory_bytes": assert_close_mem,
                "sleep_before_each_rep_ms": sleep["median_ms"],
                "compare_fast_total": {**total, "host_wall_ms": wall,
                                       "means": "the whole call: device pass, the summary kernels, one copy, "
                                                "TileMetrics of the shown units"},
                "float64_pass_only": f64, "extra_memory_one_tile_bytes": mem_one,
                "extra_memory_per_tile_bytes": mem_per_tile, "tiles": tiles, "goals": goals,
                "read_floor_ms": best_read["median_ms"], "speedup_ceiling_at_read_floor": speedup_ceiling,
                "verification": log,
                "gpu": {"name": props.name, "sms": props.multi_processor_count,
                        "l2_MiB": round(getattr(props, "L2_cache_size", 0) / 2**20, 1)},
                "versions": {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                             "python": platform.python_version()},
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "elapsed_s": round(time.time() - t_start, 1),
            },
        }
    except (VerificationError, AssertionError) as ex:
        print(f"verification failed: {ex}", file=sys.stderr)
        status = 1
        result = {"machine": torch.cuda.get_device_name(), "error": str(ex), "verification": log, "seed": seed}

    result[provenance.KEY] = _provenance(argv, args, seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print("\n".join(log))
    if status == 0:
        d = result["details"]
        print(f"\n{result['machine']}: two {rows}x{cols} bf16 tensors ({nbytes / 2**30:.2f} GiB), tiles {TILE}")
        print(f"{'what':58s} {'median ms':>10s} {'TB/s':>7s}")
        for r in d["read"]:
            print(f"{r['kernel']:58s} {r['median_ms']:10.3f} {r['TBps']:7.2f}")
        print(f"{'torch.testing.assert_close':58s} {result['assert_close_ms']:10.3f} "
              f"{nbytes / (result['assert_close_ms'] * 1e-3) / 1e12:7.2f}")
        for c in d["configs"]:
            cfg = c["config"]
            name = (f"compare_fast pass rows={cfg['rows_per_program']} block_m={cfg['block_m']} "
                    f"warps={cfg['num_warps']} stages={cfg['num_stages']}")
            mark = " *" if c["config"] == d["best_config"] else ""
            print(f"{name:58s} {c['median_ms']:10.3f} {c['effective_TBps']:7.2f}{mark}")
        whole = f"compare_fast, whole call ({d['tiles']} tiles on the device)"
        print(f"{whole:58s} "
              f"{d['compare_fast_total']['median_ms']:10.3f}")
        print(f"{'whole call / pass, by round (every round counts)':58s} "
              f"{' '.join(f'{x:.2f}' for x in d['goals']['whole_call_over_pass <= 1.3 in every round']['per_round'])}")
        print(f"{'compare_fast, whole call, host clock (median of 20)':58s} "
              f"{statistics.median(d['compare_fast_total']['host_wall_ms']):10.3f}")
        print(f"{'float64 pass only (every tile failing)':58s} {d['float64_pass_only']['median_ms']:10.3f} "
              f"{nbytes / (d['float64_pass_only']['median_ms'] * 1e-3) / 1e12:7.2f}")
        print(f"\nextra memory: {result['extra_memory_bytes']} B with {TILE} tiles "
              f"(B per tile: {d['extra_memory_per_tile_bytes']}); one tile: {d['extra_memory_one_tile_bytes']}; "
              f"assert_close: {d['assert_close_extra_memory_bytes']} B")
        print(f"oracle {result['oracle_ms']:.3f} ms = {result['effective_TBps']:.2f} TB/s = "
              f"{result['fraction_of_read_bw']:.2f} of the read ceiling ({result['read_bw_TBps']:.2f} TB/s), "
              f"{result['speedup_vs_assert_close']:.1f}x assert_close (at most {speedup_ceiling:.1f}x at the read "
              f"floor, {best_read['median_ms']:.3f} ms)")
        for k, v in d["goals"].items():
            print(f"goal {k}: {'met' if v['met'] else 'NOT met'}")
    print(f"wrote {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())

"""`oracle.check(a, b, d)` on a cuBLAS output, beside the GEMM that made it, in one run.

    python benchmarks/check_bench.py --out benchmarks/results/check_h200.json [--profile DIR]

For each size n (default 4096 and 8192): A [n, n] and B [n, n] bf16 from a recorded seed, D = A @ B
by torch.matmul (cuBLAS) with reduced-precision bf16 reductions off. Measured:
  first     the first oracle.check at this size (the first size's is the first in the process:
            Triton compiles or loads its disk cache);
  warm      --warm more checks, each synchronised and timed by the wall clock: median, min, max,
            and the median of every phase the report carries (Analysis.phases: context, reference_gemm,
            reference_chain, cross_check, descriptor_load, mma_reduce, epilogue_store, cross_check_host, findings,
            and the comparisons inside them);
  gemm      the torch.matmul that made D, timed in the same run with device events (median of
            --gemm-reps after warm-up), and the ratio warm median / GEMM median;
  reference the differential's reference GEMM with its bound statistics (kernels_ref.mma
            .mma_accumulate with_stats, as reference_accumulation runs it), timed alone the same way.
Every warm check must give the first one's verdict and worst tile (else exit 1). With --profile DIR,
two more warm checks per size run under cProfile and DIR/check_<n>.txt holds the statistics sorted
by cumulative and by own time; with --device-profile DIR, DIR/check_device_<n>.txt holds torch.profiler's
device time per kernel (and host time per operator) of two more; with --stats-tiles 64x32 64x64x4x3 ...
and --stats-fast 64x32x4x3 128x32x8x4 ..., the reference GEMM with statistics on each launch of its general
and of its fast kernel, and whether each gives the default path's bits. With --timeline DIR,
DIR/check_timeline_<n>.json is a Chrome trace of one more (host and device on one clock). With
--syncs, one more check runs under torch.cuda.set_sync_debug_mode and the size's `syncs` lists
where it made the host wait for the GPU. Goals (reported, not enforced): 4096^3 <= 25 ms,
8192^3 <= 60 ms, and (the next ones) the warm check within 10x the GEMM at 4096^3, 5x at 8192^3.

--device cpu runs the same plumbing without a GPU (Triton interpreted; for the tests, tiny sizes).
JSON keys: machine, device, seed, sizes (one entry per size: n, verdict, worst_tile, first_ms,
warm_ms {median, min, max, all}, phases_ms (medians), gemm_ms, ratio_to_gemm, reference_gemm_ms,
goal_ms, meets_goal, goal_ratio, meets_goal_ratio; with the options, profile, device_profile (paths) and
reference_gemm_by_launch_ms {"general|fast BMxBNxWxS": {median, min, max, same_bits}}, timeline, syncs
[{where, count}]),
versions, host (CPUs, those this process may use, torch's intra-op threads), date, elapsed_s.
Exit code 0 when every size was measured and its verdicts agree.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import oracle  # noqa: E402
from benchmarks import provenance  # noqa: E402

GOALS_MS = {4096: 25.0, 8192: 60.0}
GOALS_RATIO = {4096: 10.0, 8192: 5.0}  # warm check / the GEMM beside it (the next goals; GOALS_MS were met)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _inputs(n: int, seed: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(seed + n)
    a = torch.randn(n, n, device=dev, generator=g).bfloat16()
    b = torch.randn(n, n, device=dev, generator=g).bfloat16()
    return a, b


def _check(a, b, d):
    t0 = time.perf_counter()
    rep = oracle.check(a, b, d)
    _sync(d.device)
    return rep, (time.perf_counter() - t0) * 1e3


def _worst(rep) -> dict:
    """The report's worst tile of the output stage (what must not change between calls)."""
    st = rep.stages[-1]
    w = st.chained.worst
    return None if w is None else {"stage": st.name, "tile": list(w.tile), "max_ratio": w.max_ratio,
                                   "mismatches": w.mismatches}


def time_ms(fn, dev: torch.device, reps: int, warmup: int = 3) -> dict:
    """Device events around each rep after warm-up (the wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    _sync(dev)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def stats_params(a, b, d):
    """The reference chain's GEMM with statistics for this check's problem: its validated parameters
    and split-K chunk (kernels_ref.mma_stats.accumulate_stats's first two arguments)."""
    from kernels_ref.mma_params import MainloopParams
    from oracle.judging.differential.context import Context
    from oracle.judging.differential.mma import mma_kwargs
    from oracle.tools.api import recording_of

    ctx = Context.of(recording_of(a, b, d), d.device)
    p = MainloopParams(ctx.ops.a, ctx.ops.b, ctx.geo.bm, ctx.geo.bn, ctx.geo.bk, **mma_kwargs(ctx.ops))
    return p, ctx.geo.spec.reduction_chunk


def stats_call(p, chunk, dev, **launch):
    """That GEMM as a callable (`launch`: accumulate_stats's launch and fast)."""
    from kernels_ref import mma_stats

    return lambda: mma_stats.accumulate_stats(p, chunk, dev, **launch)


def reference_gemm(a, b, d):
    """The reference GEMM with statistics of this check, on its default path, as a callable."""
    return stats_call(*stats_params(a, b, d), d.device)


def stats_launches(a, b, d, dev, general, fast, reps: int) -> dict:
    """The reference GEMM with statistics timed on each launch of the general kernel (`general`) and of
    the fast one (`fast`), kernels_ref.mma_stats.StatsLaunch labels. Each element's arithmetic depends on
    the k-blocks only, so every launch must give the default path's bits, which is checked here.
    {"general BMxBNxWxS" | "fast BMxBNxWxS": {"median", "min", "max", "same_bits"} or {"skipped": why}}."""
    from kernels_ref import mma_stats

    p, chunk = stats_params(a, b, d)

    def run_of(**launch):
        return stats_call(p, chunk, d.device, **launch)

    def bits(run):
        acc, s, st = run()
        return torch.cat([x.reshape(-1).view(torch.int32) for x in (acc, s, st.l, st.v, st.pabs, st.prun)])

    want = bits(run_of())
    applies = mma_stats.fast_path_applies(p)
    out = {}
    for kind, labels in (("general", general), ("fast", fast)):
        for label in labels:
            launch = mma_stats.StatsLaunch.parse(label)
            if kind == "fast" and not applies:
                out[f"{kind} {launch.label()}"] = {"skipped": "the fast kernel does not apply here (fast_path_applies)"}
                continue
            run = run_of(launch=launch, fast=kind == "fast")
            same = bool(torch.equal(bits(run), want))
            row = time_ms(run, dev, reps, warmup=1)
            row["same_bits"] = same
            out[f"{kind} {launch.label()}"] = row
    return out


def profile_text(fn, calls: int = 2) -> str:
    """cProfile of `calls` calls of fn, by cumulative and by own time (warm_path's --profile too)."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("cumulative").print_stats(60)
    out.write("\n\n==== tottime ====\n")
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(40)
    return out.getvalue()


def device_profile_text(fn, calls: int = 2) -> str:
    """torch.profiler over `calls` warm checks: the device's own time per kernel and the host's per
    operator, sorted by device time (what the phases' wall clock is made of on the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
    avg = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in avg) / calls
    head = f"per check: device busy {device_us / 1e3:.2f} ms (sum of kernel times), {calls} checks profiled\n\n"
    return head + avg.table(sort_by="self_device_time_total", row_limit=60, max_name_column_width=70)


def sync_sites(fn) -> list[dict]:
    """Where one call of fn makes the host wait for the GPU (torch.cuda.set_sync_debug_mode: a
    scalar read, a copy to the host, a copy from pageable memory): each place as the innermost
    frames of this project that led there, with how many times, in the order first met."""
    import traceback
    import warnings

    seen: dict[str, int] = {}

    def note(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        ours = [f for f in traceback.extract_stack()[:-1]
                if f.filename.startswith(ROOT) and not f.filename.endswith("check_bench.py")]
        where = " < ".join(f"{os.path.relpath(f.filename, ROOT)}:{f.lineno}" for f in reversed(ours[-5:]))
        seen[where] = seen.get(where, 0) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [{"where": w, "count": c} for w, c in seen.items()]


def timeline(fn, path: str) -> str:
    """A Chrome trace (chrome://tracing, Perfetto) of one call of fn: every host operator on its
    thread and every kernel on the device, on one clock, so what the host waits on is visible."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    prof.export_chrome_trace(path)
    return path


def bench_size(n: int, seed: int, dev: torch.device, args) -> dict:
    a, b = _inputs(n, seed, dev)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    d = torch.matmul(a, b)
    _sync(dev)
    first, first_ms = _check(a, b, d)
    want = (first.verdict, _worst(first))
    warm, phases, agree = [], {}, True
    for _ in range(args.warm):
        rep, ms = _check(a, b, d)
        warm.append(ms)
        agree &= (rep.verdict, _worst(rep)) == want
        for name, v in rep.analysis.phases:
            phases.setdefault(name, []).append(v)
    g = time_ms(lambda: torch.matmul(a, b), dev, args.gemm_reps)
    ref = time_ms(reference_gemm(a, b, d), dev, max(1, min(args.gemm_reps, 10)), warmup=1)
    row = {"n": n, "verdict": first.verdict, "worst_tile": want[1], "verdicts_agree": agree,
           "first_ms": first_ms,
           "warm_ms": {"median": statistics.median(warm), "min": min(warm), "max": max(warm), "all": warm},
           "phases_ms": {k: statistics.median(v) for k, v in phases.items()},
           "gemm_ms": g, "ratio_to_gemm": statistics.median(warm) / g["median"], "reference_gemm_ms": ref,
           "goal_ms": GOALS_MS.get(n), "goal_ratio": GOALS_RATIO.get(n)}
    row["meets_goal"] = None if row["goal_ms"] is None else row["warm_ms"]["median"] <= row["goal_ms"]
    row["meets_goal_ratio"] = None if row["goal_ratio"] is None else row["ratio_to_gemm"] <= row["goal_ratio"]
    if args.profile:
        row["profile"] = _write(args.profile, f"check_{n}.txt", profile_text(lambda: _check(a, b, d)))
    if args.stats_tiles or args.stats_fast:
        row["reference_gemm_by_launch_ms"] = stats_launches(a, b, d, dev, args.stats_tiles or [], args.stats_fast or [],
                                                            max(1, min(args.gemm_reps, 10)))
    if args.syncs and dev.type == "cuda":
        row["syncs"] = sync_sites(lambda: oracle.check(a, b, d))
    if args.timeline and dev.type == "cuda":
        row["timeline"] = timeline(lambda: _check(a, b, d), os.path.join(args.timeline, f"check_timeline_{n}.json"))
    if args.device_profile:
        row["device_profile"] = _write(args.device_profile, f"check_device_{n}.txt",
                                       device_profile_text(lambda: _check(a, b, d)))
    return row


def _write(folder: str, name: str, text: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def _provenance(argv, args, seed: int, dev: torch.device) -> dict:
    clock = "CUDA events around each rep" if dev.type == "cuda" else "the host's wall clock around each rep"
    return provenance.stamp(
        __file__, argv, seeds={"inputs": seed, "per_size": [seed + n for n in args.sizes]},
        peer=provenance.Peer("cuBLAS: torch.matmul(a, b) of the same inputs (the GEMM that made the output checked)",
                             "ratio_to_gemm = warm check median ms / GEMM median ms (lower is better); "
                             "goal_ms per size"),
        timing=provenance.Timing(
            clock=f"the check: the host's wall clock around each oracle.check call, device synchronised; "
                  f"the GEMM: {clock}",
            warmup="the check: the first call (timed apart as first_ms); the GEMM: 3 reps",
            reps=f"the check: {args.warm} warm calls per size; the GEMM: {args.gemm_reps} reps",
            statistic="median (min and max kept)"))


def _table(rows) -> str:
    lines = [f"{'n':>6s} {'verdict':>9s} {'first ms':>9s} {'warm ms':>9s} {'gemm ms':>8s} {'ratio':>7s} {'goal':>6s} "
             f"{'ref gemm ms':>11s}"]
    for r in rows:
        goal = "-" if r["meets_goal"] is None else ("met" if r["meets_goal"] else "NOT")
        lines.append(f"{r['n']:6d} {r['verdict']:>9s} {r['first_ms']:9.1f} {r['warm_ms']['median']:9.2f} "
                     f"{r['gemm_ms']['median']:8.3f} {r['ratio_to_gemm']:7.1f} {goal:>6s} "
                     f"{r['reference_gemm_ms']['median']:11.3f}")
        lines.append("       phases (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_ms"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "check_h200.json"))
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--warm", type=int, default=10, help="timed warm checks per size")
    p.add_argument("--gemm-reps", type=int, default=50)
    p.add_argument("--seed", type=int, default=None, help="default: from the clock (recorded in the JSON)")
    p.add_argument("--profile", default=None, metavar="DIR", help="write cProfile statistics of two warm checks")
    p.add_argument("--device-profile", default=None, metavar="DIR",
                   help="write torch.profiler's device time per kernel of two warm checks")
    p.add_argument("--stats-tiles", nargs="+", default=None, metavar="BMxBN[xWxS]",
                   help="also time the general kernel of the reference GEMM with statistics on these launches")
    p.add_argument("--stats-fast", nargs="+", default=None, metavar="BMxBN[xWxS]",
                   help="also time its fast kernel (bf16 / fp16 operands) on these launches")
    p.add_argument("--timeline", default=None, metavar="DIR",
                   help="write a Chrome trace of one more warm check (host operators and device kernels)")
    p.add_argument("--syncs", action="store_true",
                   help="list where one more warm check makes the host wait for the GPU (key syncs)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_bench needs a CUDA GPU; none is visible (--device cpu runs the plumbing).", file=sys.stderr)
        return 2
    if any(n <= 0 for n in args.sizes) or args.warm <= 0 or args.gemm_reps <= 0:
        print(f"--sizes, --warm and --gemm-reps must be positive, got {args.sizes}, {args.warm}, {args.gemm_reps}",
              file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    seed = args.seed if args.seed is not None else int(time.time()) % 2**31
    t0 = time.time()
    rows = [bench_size(n, seed, dev, args) for n in args.sizes]
    result = {
        "machine": torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or "cpu",
        "device": str(dev), "seed": seed, "sizes": rows,
        "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__,
                     "python": platform.python_version(), "cuda": torch.version.cuda},
        "host": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                 "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "elapsed_s": round(time.time() - t0, 1),
        provenance.KEY: _provenance(argv, args, seed, dev),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(_table(rows))
    print(f"wrote {args.out}")
    return 0 if all(r["verdicts_agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where the time of one `compare_fast` call goes, beside its device pass (H200, one run).

    python benchmarks/profile_compare_fast.py > benchmarks/results/compare_fast_profile_h200.txt

A 16384 x 16384 bf16 pair that matches (rtol 0.016, atol 1e-5, 128 x 128 tiles), warmed up. Prints:
the pass alone (tile_stats, its launch included) and the whole call, each timed by device events
around one synchronised call (median of 50); the whole call's host wall time; the host time from
the summary's copy to the call's return; the host time of tile_stats's launches without a
synchronisation; then torch.profiler's table (the kernels each call
runs and the host operations) and cProfile of 200 whole calls by own time.
"""

import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from oracle.judging.compare_fast import compare_fast  # noqa: E402
from oracle.judging.compare_fast.launch import tile_stats  # noqa: E402


def _median_ms(f, reps=50):
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start.record()
        f()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return sorted(out)[len(out) // 2]


def _after_copy_ms(r, e, kw, reps=50):
    """Host time from the summary's first object (made right after its copy is read) to the call's
    return, with the GPU busy before each call (a device sleep) so that the host waits for it."""
    from oracle.judging.compare_fast import summary

    real, mark = summary.Summary, {}

    def made(*args, **kwargs):
        mark["t"] = time.perf_counter()
        return real(*args, **kwargs)

    summary.Summary = made
    try:
        out = []
        for _ in range(reps):
            torch.cuda._sleep(1_000_000)
            compare_fast(r, e, **kw)
            out.append((time.perf_counter() - mark["t"]) * 1e3)
    finally:
        summary.Summary = real
    return sorted(out)[len(out) // 2]


def main() -> int:
    if not torch.cuda.is_available():
        sys.exit("profile_compare_fast needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(1)
    e = torch.randn(16384, 16384, device="cuda", generator=g).bfloat16()
    r = e.clone()
    kw = dict(rtol=0.016, atol=1e-5, tile_shape=(128, 128))
    for _ in range(5):
        compare_fast(r, e, **kw)
        tile_stats(r, e, **kw)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("pass (tile_stats) ms", _median_ms(lambda: tile_stats(r, e, **kw)))
    print("whole ms", _median_ms(lambda: compare_fast(r, e, **kw)))
    wall = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        compare_fast(r, e, **kw)
        wall.append((time.perf_counter() - t0) * 1e3)
    print("whole host wall ms", sorted(wall)[25])
    print("host after the summary's copy ms", _after_copy_ms(r, e, kw))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        tile_stats(r, e, **kw)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print("tile_stats launch host ms/call", (t1 - t0) / 20 * 1e3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            compare_fast(r, e, **kw)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        compare_fast(r, e, **kw)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Triton's fast GEMM (kernels_ref.gemm_fast) against cuBLAS on this GPU, in one harness.

    python benchmarks/gemm_bench.py --out benchmarks/results/gemm_h200.json

Rows: bf16 4096^3 and 8192^3 against cuBLAS (`torch.matmul(a, b_nk.t())`, the same TN layout),
and fp8 e4m3 8192^3 with per-tensor scales and a bf16 output against cuBLASLt fast accumulation
(`torch._scaled_mm(a, b_nk.t(), scale_a, scale_b, out_dtype=bf16, use_fast_accum=True)`; Triton
runs its sm_90 default, also fast accumulation: like for like, see the kernel's docstring).

For every row: fresh random inputs (seeded per row, never zeros); cuBLAS's output checked against
the float64 product; an autotune over the kernel's short candidate list (each config checked
against the float64 product, then timed briefly; none is hard-coded as the winner); then the
chosen config and cuBLAS timed in interleaved runs (T C C T T C C T ...) by oracle.run.timing
(warm-up, cold L2 by a flush before every rep, device events, median, adaptive stop), with both
outputs verified before the first and after the last run. TFLOP/s = 2 M N K / median time.

Writes JSON {"machine": {...}, "rows": [{"dtype", "M", "N", "K", "triton_TFLOPs",
"cublas_TFLOPs", "ratio", ...}]} (ratio = triton / cublas; extra keys: the config, timing spread,
verification, autotune table) and prints a table. Goal reported per row: ratio >= 0.95.
Exit code 0 when every row was measured (whatever the ratios), 1 when a row could not be.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks import provenance  # noqa: E402
from kernels_ref.gemm_fast import CANDIDATES, error_report, gemm_fast  # noqa: E402
from oracle.run.timing import gemm_flops, tflops, time_gpu, time_interleaved  # noqa: E402

GOAL = 0.95
ROWS = (("bf16", 4096), ("bf16", 8192), ("e4m3", 8192))
DTYPES = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}


def _machine(elapsed_s: float, args) -> dict:
    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
        "l2_MiB": round(getattr(p, "L2_cache_size", 0) / 2**20, 1), "memory_GiB": round(p.total_memory / 2**30, 1),
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
        "python": platform.python_version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "harness": (f"oracle.run.timing: events, cold L2 (flush), {args.rounds} interleaved rounds of at most "
                    f"{args.max_ms:g} ms each, rse target {args.rse:g}"),
        "elapsed_s": round(elapsed_s, 1),
    }


def _provenance(argv, args, rows) -> dict:
    graph = {False: "CUDA events", "auto": "CUDA graphs where they help, else CUDA events", True: "CUDA graphs"}
    return provenance.stamp(
        __file__, argv, seeds={"rows": [r["seed"] for r in rows]},
        peer=provenance.Peer("cuBLAS: torch.matmul(a, b_nk.t()) for bf16, torch._scaled_mm (cuBLASLt) for e4m3; "
                             "each row's cublas_path", "ratio = cuBLAS median ms / Triton median ms (above 1: "
                             "Triton is faster); goal_ratio per row"),
        timing=provenance.Timing(
            clock=f"{graph[args.graph]}, cold L2 (a flush before every rep), oracle.run.timing",
            warmup="10 ms of each path before each timed run",
            reps=f"{args.rounds} interleaved rounds per path, each 20-2000 reps, at most {args.max_ms:g} ms, "
                 f"stopping at a relative standard error of {args.rse:g}",
            statistic="median of the reps of every round pooled (p10, p90 and the spread kept per row)"))


def _inputs(name: str, n: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(n, n, device="cuda", generator=g)
    b = torch.randn(n, n, device="cuda", generator=g)  # b is [N, K]
    if name == "e4m3":
        a, b = (a * 2).to(torch.float8_e4m3fn), (b * 2).to(torch.float8_e4m3fn)
        sa = (0.5 + torch.rand((), device="cuda", generator=g)).float()
        sb = (0.5 + torch.rand((), device="cuda", generator=g)).float()
        return a, b, sa, sb
    return a.to(torch.bfloat16), b.to(torch.bfloat16), None, None


def _cublas(name, a, b, sa, sb, fp8_acc):
    if name == "e4m3":
        fast = fp8_acc == "fast"
        return lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast)
    return lambda: torch.matmul(a, b.t())


def _autotune(name, a, b, sa, sb, fp8_acc, args, deadline):
    """[(config, median_ms or None, note)] for every candidate; each is checked before timing."""
    table = []
    for cfg in CANDIDATES[name][: args.configs]:
        if table and time.perf_counter() > deadline:
            table.append((cfg, None, "skipped: autotune time budget spent"))
            continue
        fn = (lambda c=cfg: gemm_fast(a, b, scale_a=sa, scale_b=sb, config=c, fp8_acc=fp8_acc))
        try:
            rep = error_report(fn(), a, b, scale_a=sa, scale_b=sb, fp8_acc=fp8_acc)
            if not rep.ok:
                table.append((cfg, None, "wrong result: " + rep.describe()))
                continue
            t = time_gpu(fn, warmup_ms=5, min_reps=5, max_reps=200, rse_target=0.01, max_ms=args.tune_ms,
                         use_graph=False)
            table.append((cfg, t.median_ms, f"p10..p90 {t.p10_ms:.4g}..{t.p90_ms:.4g} ms, {t.reps} reps"))
        except Exception as e:  # a config that does not compile or launch is reported and skipped
            msg = str(e).strip().splitlines()
            table.append((cfg, None, f"failed: {type(e).__name__}: {msg[0][:300] if msg else ''}"))
            torch.cuda.synchronize()
    return table


def bench_row(name: str, n: int, seed: int, args, deadline: float, fp8_acc: str = "fast") -> dict:
    M = N = K = n
    row = {"dtype": name, "M": M, "N": N, "K": K, "triton_TFLOPs": None, "cublas_TFLOPs": None, "ratio": None,
           "goal_ratio": GOAL, "meets_goal": None, "seed": seed}
    if name == "e4m3":
        row["fp8_acc"] = fp8_acc
        row["cublas_path"] = (f"torch._scaled_mm(a, b_nk.t(), per-tensor scales, out_dtype=bf16, "
                              f"use_fast_accum={fp8_acc == 'fast'})")
    else:
        row["cublas_path"] = "torch.matmul(a, b_nk.t())"
    try:
        a, b, sa, sb = _inputs(name, n, seed)
        cublas = _cublas(name, a, b, sa, sb, fp8_acc)
        rep_c = error_report(cublas(), a, b, scale_a=sa, scale_b=sb, fp8_acc=fp8_acc)
        row["verify_cublas"] = rep_c.describe()
        if not rep_c.ok:
            row["note"] = "cuBLAS itself is outside the error envelope (the envelope may be too tight)"

        table = _autotune(name, a, b, sa, sb, fp8_acc, args, deadline)
        row["autotune"] = [{"config": c.label(), "median_ms": ms,
                            "TFLOPs": round(tflops(gemm_flops(M, N, K), ms), 1) if ms else None, "note": note}
                           for c, ms, note in table]
        timed = [(c, ms) for c, ms, _ in table if ms is not None]
        if not timed:
            raise RuntimeError("no candidate config compiled and passed the check: "
                               + " | ".join(f"{c.label()}: {note}" for c, _, note in table))
        cfg = min(timed, key=lambda x: x[1])[0]
        row["config"] = cfg.as_dict()
        row["config_label"] = cfg.label()

        def triton_fn():
            return gemm_fast(a, b, scale_a=sa, scale_b=sb, config=cfg, fp8_acc=fp8_acc)

        def check(fn, who):
            def verify():
                rep = error_report(fn(), a, b, scale_a=sa, scale_b=sb, fp8_acc=fp8_acc)
                row.setdefault("verify_" + who + "_runs", []).append(rep.describe())
                return rep.ok or (who == "cublas")  # cuBLAS is the peer, not on trial
            return verify

        res = time_interleaved({"triton": triton_fn, "cublas": cublas}, rounds=args.rounds,
                               verify={"triton": check(triton_fn, "triton"), "cublas": check(cublas, "cublas")},
                               warmup_ms=10, min_reps=20, max_reps=2000, rse_target=args.rse, max_ms=args.max_ms,
                               use_graph=args.graph)
        flops = gemm_flops(M, N, K)
        t_tri, t_cub = res["triton"], res["cublas"]
        row["triton_TFLOPs"] = round(tflops(flops, t_tri.median_ms), 1)
        row["cublas_TFLOPs"] = round(tflops(flops, t_cub.median_ms), 1)
        row["ratio"] = round(t_cub.median_ms / t_tri.median_ms, 4)
        row["meets_goal"] = row["ratio"] >= GOAL
        row["triton_timing"] = t_tri.as_dict()
        row["cublas_timing"] = t_cub.as_dict()
        # a conservative range of the ratio: cuBLAS's p10/p90 over Triton's p90/p10
        row["ratio_range"] = [round(t_cub.p10_ms / t_tri.p90_ms, 4), round(t_cub.p90_ms / t_tri.p10_ms, 4)]
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    finally:
        torch.cuda.empty_cache()
    return row


def _table(rows) -> str:
    head = ["dtype", "M=N=K", "triton TFLOP/s", "cuBLAS TFLOP/s", "ratio", ">= 0.95", "config", "note"]
    body = []
    for r in rows:
        name = r["dtype"] + (f" ({r['fp8_acc']})" if "fp8_acc" in r else "")
        fmt = (lambda v, f: "-" if v is None else format(v, f))
        body.append([name, r["M"], fmt(r["triton_TFLOPs"], ".1f"), fmt(r["cublas_TFLOPs"], ".1f"),
                     fmt(r["ratio"], ".3f"), "-" if r["meets_goal"] is None else ("yes" if r["meets_goal"] else "NO"),
                     r.get("config_label", "-"), (r.get("error") or r.get("note") or "")[:80]])
    try:
        from tabulate import tabulate
        return tabulate(body, headers=head)
    except ImportError:
        lines = [" | ".join(head)] + [" | ".join(str(c) for c in row) for row in body]
        return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "gemm_h200.json"),
                    help="where to write the JSON results")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved runs per implementation and row")
    ap.add_argument("--max-ms", type=float, default=150.0, help="host-time budget of one timing run (ms)")
    ap.add_argument("--tune-ms", type=float, default=40.0, help="host-time budget of timing one candidate (ms)")
    ap.add_argument("--rse", type=float, default=0.005, help="target relative standard error of the median")
    ap.add_argument("--configs", type=int, default=None, help="try only the first N candidate configs")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="after this many seconds, autotuning tries no further configs (the rows still finish)")
    ap.add_argument("--graph", choices=["off", "auto", "on"], default="off",
                    help="time with CUDA graphs: off (events for both paths), auto, on")
    ap.add_argument("--with-promoted-fp8", action="store_true",
                    help="add a row: fp8 with promoted accumulation against cuBLASLt without fast accumulation")
    args = ap.parse_args(argv)
    args.graph = {"off": False, "auto": "auto", "on": True}[args.graph]
    if not torch.cuda.is_available():
        print("gemm_bench needs a CUDA GPU, and none is visible on this machine.", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    plan = [(name, n, "fast") for name, n in ROWS]
    if args.with_promoted_fp8:
        plan.append(("e4m3", 8192, "promoted"))
    rows = []
    for i, (name, n, acc) in enumerate(plan):
        r = bench_row(name, n, seed=1000 + i, args=args, deadline=deadline, fp8_acc=acc)
        rows.append(r)
        print(f"[{time.perf_counter() - t0:6.1f} s] {name} {n}^3 ({acc}): triton {r['triton_TFLOPs']} / "
              f"cublas {r['cublas_TFLOPs']} TFLOP/s, ratio {r['ratio']}"
              + (f"  ERROR {r['error'][:200]}" if "error" in r else ""), flush=True)

    out = {"machine": _machine(time.perf_counter() - t0, args), "rows": rows,
           provenance.KEY: _provenance(argv, args, rows)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print()
    print(_table(rows))
    met = [r["meets_goal"] for r in rows[:len(ROWS)]]
    print(f"\ngoal ratio >= {GOAL} on all {len(ROWS)} rows: "
          + ("met" if all(m is True for m in met) else "NOT met") + f"; wrote {args.out} in "
          f"{time.perf_counter() - t0:.1f} s")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

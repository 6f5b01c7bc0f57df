"""The zoo's correct kernels at realistic sizes: one `python -m oracle compare` each, its verdict and wall.

    ORACLE_CACHE_DIR=$PWD/.carry/cache python benchmarks/prebuild.py --no-base --at-size   # here, nvcc only
    python benchmarks/zoo_at_size.py --out benchmarks/results/zoo_at_size_h100.json         # on the GPU

Every run is a plain command line, as a user types it (RUNS below: the case, its size, the inputs and
the trace selection); each must MATCH. GEMMs at 4096^3 (a grouped GEMM as three groups of 4096 rows
and an empty one), attention at batch 4 x 32 query heads (8 KV heads) x 8192 queries and keys with
head_dim 128, decode (split-KV and paged KV) at batch 64 or 8 with 32,768 keys, where only two
batch entries are traced (all of them would not fit a sink). Options: --only NAME... (a part of a
run's name), --list, --timeout-s per run, --budget-s (no run is started after it). Writes one JSON
(each run's command, exit code, verdict, summary and wall) with the provenance stamp, and prints a
line per run. Exit 0 when every run that was started MATCHed, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GEMM = ("--set", "m=4096", "--set", "n=4096", "--set", "k=4096")
GROUPS = ("--set", "m=12288", "--set", "groups=[4096,4096,0,4096]", "--set", "n=4096", "--set", "k=4096")
HEADS = ("--set", "batch=4", "--set", "heads_q=32", "--set", "heads_kv=8", "--set", "seqlen_q=8192",
         "--set", "seqlen_k=8192", "--trace-groups", "0,3")
DECODE = ("--set", "batch=64", "--set", "seqlen_k=32768", "--trace-groups", "0,63")
PAGED = ("--set", "batch=8", "--set", "seqlen_q=1", "--set", "seqlen_k=32768", "--set", "max_pages=2048",
         "--set", "num_pages=16384", "--trace-groups", "0,7")
RANDOM = ("--inputs", "random:1")
SCALES = ("--inputs", "scales")

# (name, the command line after `python -m oracle compare`); every one must MATCH
RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("hopper_gemm", ("zoo/hopper_gemm/hopper_gemm.toml",) + GEMM + RANDOM),
    ("sm80_gemm", ("zoo/sm80_gemm/sm80_gemm.toml",) + GEMM + RANDOM),
    ("deepgemm_scales", ("zoo/deepgemm_sm90/deepgemm_sm90.toml",) + GEMM + SCALES),
    ("deepgemm_random", ("zoo/deepgemm_sm90/deepgemm_sm90.toml",) + GEMM + RANDOM),
    ("mx_sm80_scales", ("zoo/mx_sm80/mx_sm80.toml",) + GEMM + SCALES),
    ("mx_sm80_random", ("zoo/mx_sm80/mx_sm80.toml",) + GEMM + RANDOM),
    ("cutlass_coop", ("zoo/cutlass_sm90/cutlass_sm90.toml",) + GEMM + RANDOM),
    ("cutlass_pingpong", ("zoo/cutlass_sm90/pingpong.toml",) + GEMM + RANDOM),
    ("cutlass_cluster", ("zoo/cutlass_sm90/cluster.toml",) + GEMM + RANDOM),
    ("cutlass_host", ("zoo/cutlass_sm90/host.toml",) + GEMM + RANDOM),
    ("cutlass_evt", ("zoo/cutlass_sm90/evt.toml",) + GEMM + RANDOM),
    ("cutlass_bias_gelu", ("zoo/cutlass_sm90/bias_gelu.toml",) + GEMM + RANDOM),
    ("cutlass_batched", ("zoo/cutlass_sm90/batched.toml",) + GEMM + RANDOM),
    ("cutlass_grouped", ("zoo/cutlass_sm90/grouped.toml",) + GROUPS + RANDOM),
    ("cutlass_grouped_cluster", ("zoo/cutlass_sm90/grouped_cluster.toml",) + GROUPS + RANDOM),
    ("cutlass_streamk", ("zoo/cutlass_sm90/streamk.toml",) + GEMM + RANDOM),
    ("cutlass_streamk_dp", ("zoo/cutlass_sm90/streamk_dp.toml",) + GEMM + RANDOM),
    ("cutlass_splitk", ("zoo/cutlass_sm90/splitk.toml",) + GEMM + RANDOM),
    ("cutlass_blockwise_scales", ("zoo/cutlass_sm90/blockwise.toml",) + GEMM + SCALES),
    ("cutlass_blockwise_random", ("zoo/cutlass_sm90/blockwise.toml",) + GEMM + RANDOM),
    ("fa2_d128", ("zoo/fa2_sm80/gqa_d128.toml",) + HEADS + RANDOM),
    ("fa3_d128", ("zoo/fa3_sm90/d128.toml",) + HEADS + RANDOM),
    ("fa2_split_decode", ("zoo/fa2_sm80/split.toml",) + DECODE + RANDOM),
    ("fa3_split_decode", ("zoo/fa3_sm90/split.toml",) + DECODE + RANDOM),
    ("fa2_paged_decode", ("zoo/fa2_sm80/paged.toml",) + PAGED + RANDOM),
    ("fa3_paged_decode", ("zoo/fa3_sm90/paged.toml",) + PAGED + RANDOM),
)
LIBRARY = "--allow-library"  # the CUTLASS cases are launch libraries: host code the user opts into


def command(args: tuple[str, ...]) -> list[str]:
    """The whole command line of one run (its report written by --json, appended by the caller)."""
    return [sys.executable, "-m", "oracle", "compare", *args, LIBRARY, "--quiet"]


def case_of(args: tuple[str, ...]):
    """The live case a run's command line resolves to, through the command line's own parser (no GPU needed):
    what the run builds and launches."""
    from oracle.tools import cli

    return cli._request(cli.build_parser().parse_args(["compare", *args, LIBRARY])).case


def selected(only: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    return [(n, a) for n, a in RUNS if not only or any(o in n for o in only)]


def run_one(name: str, args: tuple[str, ...], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="zoo_at_size.") as tmp:
        report = Path(tmp) / "report.json"
        argv = command(args) + ["--json", str(report)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
            code, tail = proc.returncode, (proc.stdout + proc.stderr)[-600:]
        except subprocess.TimeoutExpired:
            code, tail = None, f"timed out after {timeout_s:.0f} s"
        wall = round(time.perf_counter() - t0, 1)
        doc = json.loads(report.read_text()) if report.exists() else {}
    return {"name": name, "command": ["python", "-m", "oracle", "compare", *args, LIBRARY], "exit": code,
            "wall_s": wall, "verdict": doc.get("verdict"), "summary": doc.get("summary"),
            "unobserved": doc.get("unobserved", []), "tail": None if doc else tail}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="the results JSON (default: print only)")
    p.add_argument("--only", nargs="+", default=[], help="runs whose name holds one of these")
    p.add_argument("--list", action="store_true", help="print the runs' command lines and stop")
    p.add_argument("--timeout-s", type=float, default=240.0, help="per run")
    p.add_argument("--budget-s", type=float, default=540.0, help="no run is started after this many seconds")
    args = p.parse_args(argv)
    runs = selected(args.only)
    if args.list:
        for name, a in runs:
            print(f"{name}: python -m oracle compare {' '.join(a)} {LIBRARY}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("zoo_at_size: no CUDA GPU is visible: these are live runs", file=sys.stderr)
        return 2
    t0, results = time.perf_counter(), []
    for name, a in runs:
        if time.perf_counter() - t0 > args.budget_s:
            results.append({"name": name, "command": ["python", "-m", "oracle", "compare", *a, LIBRARY],
                            "exit": None, "wall_s": None, "verdict": None, "summary": "not started: budget spent",
                            "unobserved": [], "tail": None})
            continue
        r = run_one(name, a, args.timeout_s)
        results.append(r)
        print(f"{name:26s} {r['verdict'] or 'no report':9s} exit {r['exit']}  {r['wall_s']:6.1f} s"
              + (f"  {r['tail']}" if r["tail"] else ""), flush=True)
    started = [r for r in results if r["wall_s"] is not None]
    doc = {"schema": "zoo_at_size/1", "runs": results, "started": len(started),
           "matched": sum(r["verdict"] == "MATCH" for r in started),
           "all_match": bool(started) and all(r["verdict"] == "MATCH" for r in started),
           "seconds": round(time.perf_counter() - t0, 1)}
    from benchmarks import provenance

    doc[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"inputs": "random:1 (or the scales ladder) in each run's command"},
        peer=provenance.NotApplicable("verdicts of correct kernels at realistic sizes, not a speed comparison"),
        timing=provenance.NotApplicable("each run's wall is the whole command's, for scale only"))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{doc['matched']} of {doc['started']} runs MATCH ({len(results) - len(started)} not started), "
          f"{doc['seconds']} s")
    return 0 if doc["all_match"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The warm path: `python -m oracle compare` of the zoo's 4096^3 bf16 Hopper GEMM with 8 traced
tiles, wall time with warm caches, and proof that nothing was recompiled.

    python benchmarks/warm_path.py --out benchmarks/results/warm_path_h200.json

Runs the same command `--runs` + 1 times, each in a fresh process as a user would: the first warms
the caches (the nvcc cubin cache, Triton's kernel cache), the others are timed (wall clock of the
whole process, start to exit). Between the warm runs the cubin cache and the Triton cache must not
gain a file (nothing recompiled), and every run must report the build as cached. Each run's own
phase split (inputs, build, the kernel's child process, trace parsing, the differential, the
report) comes from its --json report.

The same command is then timed through a warm server (`python -m oracle serve`, ORACLE_SERVER
set: the command's own process imports no torch and hands the command line to the server), and
inside one Python process (`oracle.tools.cli.main`, as from a notebook or a script that imports the
oracle): one warming call, then `--runs` timed calls each (with --profile FILE, one more in-process
call under cProfile, its statistics in FILE and the path under "profile"). And, as the peer measured in the same
run, right before each warm run of the plain command, the wall time of a bare
`python -c "import torch"`: every process that uses torch pays it before the oracle does anything
(the plain command's own part: each warm run less the import before it). The oracle's bytecode is
compiled first, as `pip install` compiles a package's: an environment with PYTHONDONTWRITEBYTECODE
set would otherwise recompile its sources in every process.

Every run's report also says whether its trace was complete: records dropped, the sink's size,
what the kernel needed, and whether the sink had to be measured and the kernel launched again.

Goal (reported, not enforced): <= 1 s warm through the server (`goal_met_served`) and in process
(`goal_met_in_process`); for the plain command, <= 1.5 s of its own part (`goal_met_cli`: the run less
the import of torch). --attention times the same for the zoo's FlashAttention-3-style kernel. Exit code 0 when every run succeeded with the expected verdict (MATCH)
and nothing was recompiled, 1 otherwise.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import provenance  # noqa: E402

CASE = ROOT / "zoo" / "hopper_gemm" / "hopper_gemm.toml"
# first, last, the other two corners and four inside: 8 of the 32 x 32 output tiles
TILES = "0,0 31,31 0,31 31,0 15,16 16,15 7,23 23,7"
# --attention: the zoo's FlashAttention-3-style kernel at batch 4, 32 query heads, 8 KV heads, 8192
# queries and keys, head_dim 128, one traced query block with every KV block
ATTENTION_CASE = ROOT / "zoo" / "fa3_sm90" / "d128.toml"
ATTENTION_SET = ("batch=4", "heads_q=32", "heads_kv=8", "seqlen_q=8192", "seqlen_k=8192")
ATTENTION_TILES = "2,5"
GOAL_S = 1.0  # through the server and in process
GOAL_CLI_OWN_S = 1.5  # the plain command less the import of torch


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()} if d.is_dir() else set()


def _triton_cache() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))


def _provenance(argv, args, others: int) -> dict:
    return provenance.stamp(
        __file__, argv, seeds={"inputs": 1},  # the command's --inputs random:1
        peer=provenance.Peer("a bare `python -c \"import torch\"`, timed right before each warm run of the plain "
                             "command", "cli_own_s = each warm run's wall time - the import's before it (no ratio); "
                             "goal_s on cli_own_s, served and in-process"),
        timing=provenance.Timing(
            clock="the host's wall clock of each whole process, start to exit (in-process: around each call)",
            warmup="one run each way first (the plain command's: cold_wall_s), the oracle's bytecode compiled ahead",
            reps=f"{args.runs} warm runs of the plain command, {others} in-process and {others} through the server",
            statistic="median (every run kept)"))


def _phases(doc: dict) -> dict:
    """A report's phases: the command's, its kernel child's, and whether that child was started
    ahead (ready before the run: waited_s > 0)."""
    run = doc.get("run") or {}
    return {"phases_s": {k: round(v, 3) for k, v in doc.get("phases_s", {}).items()},
            "child_phases_s": {k: round(v, 3) for k, v in (run.get("phases_s") or {}).items()},
            "started_ahead": run.get("started_ahead")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=5, help="timed warm runs of the plain command (after one warming run)")
    ap.add_argument("--other-runs", type=int, default=None,
                    help="timed runs in-process and through the server (default: --runs)")
    ap.add_argument("--trace-k-blocks", default=None, help="k-blocks to trace (default: all)")
    ap.add_argument("--attention", action="store_true",
                    help="the FlashAttention-3-style zoo kernel (4 x 32 heads (8 KV) x 8192 x d128) instead of the GEMM")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="write cProfile statistics of one more warm in-process call to FILE")
    ap.add_argument("--device-profile", default=None, metavar="FILE",
                    help="write torch.profiler's device and host time per operator of one more in-process call")
    args = ap.parse_args(argv)

    from harness.build import default_cache_dir

    # the oracle's bytecode, compiled as `pip install` compiles a package's (torch's came so): a
    # process then reads it even where PYTHONDONTWRITEBYTECODE keeps it from writing its own
    compiled = compileall.compile_dir(str(ROOT / "oracle"), quiet=1) and all(
        compileall.compile_dir(str(ROOT / d), quiet=1) for d in ("harness", "kernels_ref"))

    n = args.size
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        if args.attention:
            sets = [a for kv in ATTENTION_SET for a in ("--set", kv)]
            cmd = [sys.executable, "-m", "oracle", "compare", "--problem", str(ATTENTION_CASE), *sets,
                   "--inputs", "random:1", "--trace-tiles", ATTENTION_TILES, "--json", str(report), "--quiet"]
        else:
            cmd = [sys.executable, "-m", "oracle", "compare", "--problem", str(CASE), "--set", f"m={n},n={n},k={n}",
                   "--inputs", "random:1", "--trace-tiles", TILES, "--json", str(report), "--quiet"]
        if args.trace_k_blocks:
            cmd += ["--trace-k-blocks", args.trace_k_blocks]
        runs, ok, torch_import = [], True, []
        caches = {"cubin": Path(default_cache_dir()), "triton": _triton_cache()}
        before = None
        for i in range(args.runs + 1):
            if i:  # the peer, right before each warm run: a bare import of torch
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", "import torch"], check=True)
                torch_import.append(round(time.perf_counter() - t0, 3))
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            doc = json.loads(report.read_text()) if report.is_file() else {}
            trace = doc.get("trace") or {}
            row = {"run": i, "warm": i > 0, "wall_s": round(wall, 3), "exit": proc.returncode,
                   "verdict": doc.get("verdict"), "build_cached": doc.get("run", {}).get("build_cached"),
                   "dropped": trace.get("dropped"), "sink_bytes": trace.get("capacity"),
                   "needed_bytes": trace.get("needed_bytes"), "relaunched": trace.get("relaunched"),
                   **_phases(doc)}
            if proc.returncode != 0 or doc.get("verdict") != "MATCH" or trace.get("dropped") != 0:
                ok = False
                row["stderr"] = proc.stderr[-2000:]
            snapshot = {k: _files(d) for k, d in caches.items()}
            if before is not None:
                new = {k: sorted(snapshot[k] - before[k]) for k in caches}
                row["new_cache_files"] = {k: v for k, v in new.items() if v}
                if any(new.values()) or row["build_cached"] is not True:
                    ok = False
            before = snapshot
            runs.append(row)
            print(json.dumps(row), flush=True)
            report.unlink(missing_ok=True)

    from oracle.tools.cli import main as oracle_main

    others = args.runs if args.other_runs is None else args.other_runs
    in_process, in_process_phases = [], []
    with tempfile.TemporaryDirectory() as tmp:
        argv = cmd[3:]  # without "python -m oracle"
        argv[argv.index("--json") + 1] = str(Path(tmp) / "r.json")
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            for i in range(others + 1):
                t0 = time.perf_counter()
                code = oracle_main(argv)
                if i:
                    in_process.append(round(time.perf_counter() - t0, 3))
                    doc = json.loads(Path(argv[argv.index("--json") + 1]).read_text())
                    in_process_phases.append(_phases(doc))
                ok = ok and code == 0
            if args.profile:
                from benchmarks.check_bench import profile_text

                profiled = profile_text(lambda: oracle_main(argv), calls=1)
            if args.device_profile:
                from benchmarks.check_bench import device_profile_text

                Path(args.device_profile).write_text(device_profile_text(lambda: oracle_main(argv), calls=1))
        finally:
            os.chdir(cwd)

    # the same command through a warm server (oracle.tools.server): the client process imports no torch
    served, served_phases = [], []
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "oracle.sock")
        srv = subprocess.Popen([sys.executable, "-m", "oracle", "serve", "--socket", sock], cwd=ROOT,
                               stderr=subprocess.PIPE, text=True)
        try:
            srv.stderr.readline()  # "listening on ..."
            env = {**os.environ, "ORACLE_SERVER": sock}
            cmd_s = list(cmd)
            cmd_s[cmd_s.index("--json") + 1] = str(Path(tmp) / "r.json")
            for i in range(others + 1):
                t0 = time.perf_counter()
                proc = subprocess.run(cmd_s, cwd=ROOT, capture_output=True, text=True, env=env)
                wall = time.perf_counter() - t0
                ok = ok and proc.returncode == 0 and "no oracle server" not in proc.stderr
                if i:
                    served.append(round(wall, 3))
                    report_s = Path(cmd_s[cmd_s.index("--json") + 1])
                    if report_s.is_file():
                        served_phases.append(_phases(json.loads(report_s.read_text())))
        finally:
            srv.terminate()
            srv.wait(30)

    warm = [r["wall_s"] for r in runs if r["warm"]]
    own = [round(w - t, 3) for w, t in zip(warm, torch_import)]  # each warm run less the import before it
    import torch

    result = {
        "machine": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
        "problem": ("attention " + " ".join(ATTENTION_SET) + f" d128 bf16, query block {ATTENTION_TILES} traced"
                    if args.attention else f"{n}x{n}x{n} bf16, 8 traced tiles") +
                   f", k-blocks {args.trace_k_blocks or 'all'}",
        "cold_wall_s": runs[0]["wall_s"],
        "warm_wall_s_median": statistics.median(warm) if warm else None,
        "warm_wall_s": warm,
        "import_torch_wall_s": torch_import,
        "cli_own_s": own,
        "cli_own_s_median": statistics.median(own) if own else None,
        "bytecode_compiled_ahead": bool(compiled),
        "environment": {k: os.environ[k] for k in ("PYTHONDONTWRITEBYTECODE", "ORACLE_CHILD_AHEAD_S")
                        if k in os.environ},
        "in_process_warm_s_median": statistics.median(in_process),
        "in_process_warm_s": in_process,
        "in_process_phases": in_process_phases,
        "served_warm_s_median": statistics.median(served),
        "served_warm_s": served,
        "served_phases": served_phases,
        "goal_s": GOAL_S,
        "goal_cli_own_s": GOAL_CLI_OWN_S,
        "goal_met_cli": bool(own) and statistics.median(own) <= GOAL_CLI_OWN_S,
        "goal_met_served": statistics.median(served) <= GOAL_S,
        "goal_met_in_process": statistics.median(in_process) <= GOAL_S,
        "nothing_recompiled": all(not r.get("new_cache_files") and r["build_cached"] for r in runs[1:]),
        "all_match_nothing_dropped": all(r["verdict"] == "MATCH" and r["dropped"] == 0 for r in runs),
        "runs": runs,
        provenance.KEY: _provenance(argv, args, others),
    }
    if args.profile:
        Path(args.profile).write_text(profiled)
        result["profile"] = args.profile
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

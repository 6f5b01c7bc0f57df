"""Where the README's test command spends its time: the compiles in its build cache and pytest's slowest tests.

    python benchmarks/ci_time.py --cache HOME/.cache/oracle --wall-s 1235 --pytest-s 1171 \\
        [--durations dur.log] --out benchmarks/results/ci_time_2core.json

Run after the test command (`.ci/run`, a cold build cache in a fresh HOME): every compile the tests
made is an entry of the cache (harness/build.py writes nvcc's seconds, the source and the defines
beside each built file); the walls are the run's own (`time`). With --durations, the text of a
pytest `--durations=N` report (a warm run: no compile in it) gives the slowest tests by file.
Prints the compiles longest first, their sum by source file, and the share of the run's cores they
took; writes one JSON (provenance stamped) that benchmarks/perf_table.py reads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import provenance  # noqa: E402

GOAL_S = 600.0  # issue 39, goal 4: the test command under 10 minutes on a cold 2-core machine
DURATION_LINE = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+(\S+?)::")


def compiles(cache: Path) -> list[dict]:
    """One row per entry of the build cache that ran nvcc: source file, defines, seconds, ok."""
    rows = []
    for meta in sorted(cache.glob("*/*/*.json")):
        try:
            doc = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or "command" not in doc or doc.get("seconds") is None:
            continue
        defines = sorted(w[2:] for w in doc["command"] if w.startswith("-D") and not w.startswith("-DORACLE_CASE_"))
        source = str(doc.get("source") or "")
        rows.append({"source": Path(source).name if source.startswith("/") else source or "<source text>",
                     "kind": meta.parent.parent.name, "defines": defines, "seconds": float(doc["seconds"]),
                     "ok": bool(doc.get("ok"))})
    return sorted(rows, key=lambda r: -r["seconds"])


def durations(text: str) -> dict[str, float]:
    """Seconds by test file from a pytest --durations report."""
    by_file: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = DURATION_LINE.match(line)
        if m:
            by_file[m.group(3)] += float(m.group(1))
    return dict(sorted(by_file.items(), key=lambda kv: -kv[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, help="the build cache the test command filled (HOME/.cache/oracle)")
    ap.add_argument("--wall-s", type=float, required=True, help="the whole command's wall seconds (installs included)")
    ap.add_argument("--pytest-s", type=float, required=True, help="pytest's own wall seconds (its last line)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--durations", default=None, help="a pytest --durations report of a warm run (text file)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    rows = compiles(Path(args.cache))
    if not rows:
        raise SystemExit(f"{args.cache}: no compile recorded there (is it the build cache the tests filled?)")
    by_source: dict[str, float] = defaultdict(float)
    for r in rows:
        by_source[r["source"]] += r["seconds"]
    total = sum(r["seconds"] for r in rows)
    core_s = args.pytest_s * args.cores
    print(f"{len(rows)} compiles, {total:.0f} s of nvcc ({total / core_s:.0%} of pytest's {args.pytest_s:.0f} s "
          f"x {args.cores} cores); the command {args.wall_s:.0f} s, goal {GOAL_S:.0f} s")
    for source, secs in sorted(by_source.items(), key=lambda kv: -kv[1]):
        n = sum(1 for r in rows if r["source"] == source)
        print(f"  {secs:7.1f} s  {n:3d} x {source}")
    slow_files = durations(Path(args.durations).read_text()) if args.durations else {}
    for name, secs in list(slow_files.items())[:15]:
        print(f"  {secs:7.1f} s  {name} (warm)")
    if args.out:
        doc = {"goal_s": GOAL_S, "wall_s": args.wall_s, "pytest_s": args.pytest_s, "cores": args.cores,
               "compiles": len(rows), "compile_s": round(total, 1),
               "compile_s_by_source": {k: round(v, 1) for k, v in sorted(by_source.items(), key=lambda kv: -kv[1])},
               "longest_compiles": rows[:25], "warm_test_s_by_file": {k: round(v, 2) for k, v in slow_files.items()},
               provenance.KEY: provenance.stamp(
                   __file__, None, seeds=provenance.NotApplicable("nothing random: the compiles and the tests' times"),
                   peer=provenance.NotApplicable("the goal is an absolute wall time, not a ratio"),
                   timing=provenance.Timing(clock="nvcc's seconds as the build cache recorded them; the run's wall "
                                                  "clock", warmup="none: a cold build cache",
                                            reps="one run", statistic="sums"))}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""False alarms and planted defects: correct GEMMs from real engines, judged output-only.

First build the zoo's traced cubins here (nvcc, no GPU needed) into an ignored folder:
    ORACLE_CACHE_DIR=$PWD/.carry/cache python benchmarks/false_alarms.py --prebuild-zoo
then on the H200 (one GPU; budgeted to about 5 minutes: no new case after 240 s, then up to 60 s
of zoo cases; --shard 0/2 and 1/2 in two calls, --zoo on one, then --merge, if the budget leaves
cases out),
carrying .carry/cache:
    ORACLE_CACHE_DIR=$PWD/.carry/cache python benchmarks/false_alarms.py --zoo \
        --out $OUT/false_alarms_h200.json > $OUT/false_alarms_h200.log 2>&1
(a cache miss builds there: about 80 s for the Hopper kernel). The slice the GPU test runs
(tests/gpu/test_false_alarms_gpu.py, under a minute, nothing to carry):
    python benchmarks/false_alarms.py --quick --out $OUT/false_alarms_quick.json
Other options: --numerics (the measurement's JSON, default benchmarks/results/numerics_h200.json:
promotion intervals), --w4-probe (benchmarks/probe_w4a16.py's JSON, default
benchmarks/results/w4a16_probe_h200.json where it exists: tinygemm's dequant_precision),
--engines, --budget-s (default 240: no new case after that; the zoo then gets up to 60 s more),
--no-planted, --shard i/n, --skip (the cases an earlier run judged) and --merge.

Every case is one correct GEMM computed by an engine (cuBLAS torch.mm / addmm /
_addmm_activation, cuBLASLt torch._scaled_mm fast and not, per-tensor and row/col scales, and
block-scaled e4m3 with both operands' scales 1x128 or both 128x128 (a layout torch refuses is
counted as skipped, with torch's message, never judged), torch's tinygemm W4A16
torch._weight_int4pack_mm (uint4 B, groups of 32, 64 and 128), torch._int_mm, the project's
Triton GEMM kernels_ref.gemm_fast, and with --zoo the zoo's correct kernels, Hopper WGMMA bf16 and e4m3 and the sm80 mma.sync kernel, through oracle.run.live.run_live),
on normal, all-positive or outlier-channel inputs, over M from 1 to 4096, ragged N and K, K up to
65536 and both majors. Cases run in a seeded shuffled order, so a budget cut leaves a uniform
sample. Each is wrapped as an output-only recording (oracle.run.recording.Recording, no taps) and
judged by oracle.judging.differential.analyze (the references cross-checked against the host specs on
one tile for the first case of each engine and K range, unless ORACLE_CROSS_CHECK_TILES is set)
with the spec that says what the engine does, from the measurement
(benchmarks/results/numerics_h200.json):
  cuBLAS bf16 / fp16 with torch's default (reduced-precision reductions allowed): the shape is
    probed first with the case's majors (benchmarks/measure_numerics.py split-K pairs); partials
    found rounded to bf16 / fp16 give reduction = that type with the chunk seen, uneven ones
    acc_model any, none reduction = "fp32";
  cuBLAS / cuBLASLt otherwise: reduction fp32 (it may split K into fp32 partials); TF32 on:
    acc_model tf32_rn (cuBLAS rounds the operands to nearest) with k-blocks of 32 (its recorded
    ladder outputs fit partials restarted every 96 k, which then fall on k-block boundaries);
  cuBLASLt fp8 fast: fp8_fast; not fast: fp8_promoted with the interval measured for it (any
    where none was); int8: int32; Triton fp8: fp8_fast, or fp8_promoted every BLOCK_K (128);
    GELU through cuBLASLt: gelu_tanh, activation_impl "fast"; tinygemm: uint4 B with float_offset
    zero points (w = (q - 8) * s + z), dequant_precision as benchmarks/numerics/probe_w4a16.py chose
    it (engines.tinygemm_w4.dequant_precision of the numerics JSON), else "operand", reduction fp32;
    the zoo: its case file's spec.
A correct case that is not MATCH is a false alarm. Then, in the same run, five defects are
planted in the engine's output, one at a time, in one seeded tile, a full BM x BN one where the
output has one (a zeroed tile, the tile times 1.01, one sign flip at the tile's largest element,
one missing 64-deep k-block in the tile, one NaN; with block scales a sixth, one 128-deep k-block
scaled with the next k-block's scales) and each is judged against the same reference
and bound (oracle.judging.differential.expected_output, what epilogue_store's chained comparison uses):
detected means its tile fails, right tile means it is the only tile that fails.

Writes JSON with correct_cases, false_diverged, skipped, planted, detected_right_tile, worst_ratio (the
largest err/bound of a correct case) and worst_case, the environment and per-group tables
(`groups` by engine, output dtype, K and inputs; `planted_table` by defect, K and inputs); prints
them. Exit 0 when false_diverged is 0, 1 otherwise, 2 on bad usage.

One job: the false-alarm benchmark's driver (its command line and the run); its steps are the
modules of benchmarks/alarms (engines and cases, specs, planting, judging, results), and the
measurement it reads (split-K probes, promotion intervals) stays in benchmarks/measure_numerics.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

from alarms import engines, specs  # noqa: E402,F401  (the tests set engines.DEV and specs._SPLITK)
from alarms.engines import (BLOCK_ROWS, ENGINE, ENGINES, KINDS, TORCH, W4_GROUP, W4_INNER_K_TILES,  # noqa: E402,F401
                            Case, Engine, EngineSkipped, make_cases)
from alarms.judging import ZOO, Result, prebuild_zoo, run_case, zoo_results  # noqa: E402,F401
from alarms.planting import DEFECTS, _planted_tile, judge_planted, plant  # noqa: E402,F401
from alarms.results import (load_results, merged, not_judged, summarise, tables, write,  # noqa: E402,F401
                            _environment_of)
from alarms.specs import _promotion, _w4_precision, make_operands, spec_for  # noqa: E402,F401
from benchmarks import provenance  # noqa: E402
from oracle.run.inputs import Operands  # noqa: E402,F401

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "false_alarms_h200.json")
DEFAULT_NUMERICS = os.path.join(ROOT, "benchmarks", "results", "numerics_h200.json")
DEFAULT_W4_PROBE = os.path.join(ROOT, "benchmarks", "results", "w4a16_probe_h200.json")


def _provenance(argv) -> dict:
    """The stamp of a run, or of a merge (its machine is the merging one; each part's is in environment.runs)."""
    seeds = ("each case's own, cases[].fields.seed (make_cases numbers them over every engine and shuffles them "
             "with random.Random(0)); it also picks the tile each planted defect goes in")
    return provenance.stamp(
        __file__, argv, seeds={"cases": seeds},
        peer=provenance.NotApplicable("counts of verdicts on correct outputs and planted defects, not a speed "
                                      "comparison"),
        timing=provenance.NotApplicable("nothing is timed: each case's seconds are its wall time, for the budget"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--numerics", default=DEFAULT_NUMERICS, help="measure_numerics.py's JSON (promotion intervals)")
    ap.add_argument("--w4-probe", default=DEFAULT_W4_PROBE,
                    help="benchmarks/probe_w4a16.py's JSON (tinygemm's dequant_precision), where it exists")
    ap.add_argument("--quick", action="store_true", help="a slice of the cases (the GPU test)")
    ap.add_argument("--engines", default="", help="comma-separated engine names (default: all)")
    ap.add_argument("--zoo", action="store_true", help="also the zoo's correct kernels through live runs")
    ap.add_argument("--prebuild-zoo", action="store_true", help="only build the zoo's cubins into the cache")
    ap.add_argument("--no-planted", action="store_true")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop taking new cases after this many seconds")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th case from the i-th (merge with --merge)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="merge shard results into --out (a case judged in several: the last file's result)")
    ap.add_argument("--skip", nargs="+", default=(), metavar="JSON",
                    help="leave out the cases an earlier run's JSON already judged (finish a budget-cut run, then --merge)")
    args = ap.parse_args(argv)
    if args.prebuild_zoo:
        return prebuild_zoo()
    if args.merge:
        results, left, secs = [], 0, 0.0
        for path in args.merge:
            r, lf, sc = load_results(path)
            results += r
            left += lf
            secs += sc
        results = merged(results)
        left = len(not_judged(make_cases(False, None), args.merge))  # the benchmark's cases no run judged
        doc = summarise(results, left, secs)
        # where each merged run ran (a merge itself runs anywhere)
        doc["environment"] = {"merged": doc["environment"]["date"], "runs": [_environment_of(p) for p in args.merge]}
        doc[provenance.KEY] = _provenance(argv)
        write(doc, args.out)
        print(f"merged {len(args.merge)} run(s): correct cases {doc['correct_cases']}, false DIVERGED "
              f"{doc['false_diverged']}, planted {doc['planted']}, at the right tile {doc['detected_right_tile']}")
        return 0 if doc["false_diverged"] == 0 else 1
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs real engines on the GPU", file=sys.stderr)
        return 2
    numerics = {}
    if args.numerics and os.path.exists(args.numerics):
        with open(args.numerics) as f:
            numerics = json.load(f)
    if args.w4_probe and os.path.exists(args.w4_probe):
        with open(args.w4_probe) as f:
            numerics = {**numerics, "engines": {**numerics.get("engines", {}), **json.load(f).get("engines", {})}}
    names = [n for n in args.engines.split(",") if n] or None
    try:
        si, sn = (int(v) for v in args.shard.split("/"))
        assert 0 <= si < sn
    except (ValueError, AssertionError):
        print(f"--shard {args.shard!r}: expected i/n with 0 <= i < n", file=sys.stderr)
        return 2
    cases = make_cases(args.quick, names)[si::sn]
    cases = not_judged(cases, args.skip)
    t0 = time.time()
    end = t0 + args.budget_s
    results = []
    for i, c in enumerate(cases):
        if time.time() > end:
            break
        r = run_case(c, numerics, planted=not args.no_planted)
        results.append(r)
        flag = "" if r.error is None and r.verdict == "MATCH" else f"  <-- {r.verdict or r.error}"
        if r.skipped:
            flag = f"  <-- {r.skipped}"
        shown = r.verdict or ("SKIPPED" if r.skipped else "ERROR")
        print(f"[{i + 1}/{len(cases)}] {c.label():<58} {shown:<9} err/bound {r.ratio:.3g} "
              f"({r.seconds:.2f} s){flag}", flush=True)
    left = len(cases) - len(results)
    if args.zoo:
        results += zoo_results(max(end, time.time()) + 60, planted=not args.no_planted)
    doc = summarise(results, left, time.time() - t0)
    doc["environment"]["numerics"] = f"{args.numerics} ({numerics.get('environment', {}).get('date', 'absent')})"
    doc[provenance.KEY] = _provenance(argv)
    write(doc, args.out)
    print(f"\ncorrect cases {doc['correct_cases']}, false DIVERGED {doc['false_diverged']} "
          f"(worst err/bound {doc['worst_ratio']}, {doc['worst_case']}; quantiles {doc['ratio_quantiles']})")
    print(f"planted {doc['planted']}, detected {doc['detected']}, at the right tile {doc['detected_right_tile']} "
          f"({doc['detected_right_tile_rate']})")
    for k, p in sorted(doc["planted_table"].items()):
        if k.split()[-1].startswith("K"):
            print(f"  {k:<34} {p['detected_right_tile']}/{p['planted']} at the right tile")
    for k, g in sorted(doc["groups"].items()):
        print(f"  {k:<34} {g['false_diverged']}/{g['cases']} false DIVERGED, worst err/bound {g['worst_ratio']}")
    if doc["errors"]:
        print(f"{len(doc['errors'])} case(s) could not run: {doc['errors'][:3]}")
    if doc["skipped"]:
        print(f"{len(doc['skipped'])} case(s) skipped, their layout refused by the engine: {doc['skipped'][:2]}")
    if left:
        print(f"{left} case(s) left: the time budget ran out")
    print(f"wrote {args.out} ({doc['seconds']} s)")
    return 0 if doc["false_diverged"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Measure attention's numerics on this GPU against the constants and bounds the oracle judges by.

    python benchmarks/measure_attention_numerics.py [--out benchmarks/results/attention_numerics_h100.json] [--quick]

Families (benchmarks/numerics/attention.py): the approximate exp2 / tanh / lg2 over dense fp32 sweeps,
P in FlashAttention-2's fused form against the p stage's reference and bound, and the online softmax
chain (rescale every block, large logits, 32k keys) against the float64 specification. Prints one
line per measurement and writes one JSON. Exit 0 when every measured error lies within its constant
or bound, 1 when one does not (the table says which), 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import provenance  # noqa: E402


def measure(quick: bool = False) -> dict:
    from benchmarks.numerics.attention import measure_chain, measure_p_form, measure_primitives

    t0 = time.time()
    res = {}
    for name, family in (("primitives", measure_primitives), ("p_form", measure_p_form), ("chain", measure_chain)):
        t = time.time()
        res[name] = family(quick)
        print(f"{name}: {time.time() - t:.1f} s", file=sys.stderr, flush=True)  # where a long run spends its time
    res["ok"] = all(res[k]["ok"] for k in ("primitives", "p_form", "chain"))
    res["seconds"] = round(time.time() - t0, 1)
    return res


def print_report(res: dict) -> None:
    for name, row in res["primitives"].items():
        if isinstance(row, dict):
            print(f"{name:22s} max {row['error']} error 2^{row['max_log2']:.2f} (constant 2^"
                  f"{math.log2(row['constant']):.2f}) over {row['inputs']} inputs: "
                  f"{'within' if row['within'] else 'EXCEEDS'}")
    for name, row in res["p_form"].items():
        if isinstance(row, dict):
            print(f"p {name:30s} max |P - P_ref| / bound {row['max_err_over_bound']:.3f}")
    for row in res["chain"]["cases"]:
        print(f"chain {row['inputs']:13s} {row['dtype']} b,hq,hk,sq,sk,d={row['shape']} max|s| {row['max_score']:.1f}: "
              f"O err / one side {row['o_err_over_one_side_bound']:.3f}, LSE {row['lse_err_over_bound']:.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "attention_numerics.json"))
    p.add_argument("--quick", action="store_true", help="sparser sweeps, fewer cases (a GPU test's slice)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this measures the GPU's approximate functions; run it on the GPU", file=sys.stderr)
        return 2
    res = measure(args.quick)
    res[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"inputs": "fixed in benchmarks/numerics/attention.py: 5 (P's form), 11 (the chain)"},
        peer=provenance.NotApplicable("a measurement of numerics against float64, not a comparison of speed"),
        timing=provenance.NotApplicable("nothing is timed"))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print_report(res)
    print(f"wrote {args.out} ({res['seconds']} s): {'every error within its bound' if res['ok'] else 'A BOUND EXCEEDED'}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Measure the accumulation numerics of the GEMM engines on this GPU, with controlled inputs.

    python benchmarks/measure_numerics.py [--out benchmarks/results/numerics_h200.json] [--quick]
    python benchmarks/measure_numerics.py --emulate      # CPU: the same probes on emulated engines

Every probe is a set of dot products with chosen products (output element i of an n x n GEMM
reads row i of A and column i of B; the other elements are not looked at), so each probe's exact
sum and every plausible rounding of it are known. An engine is identified by fitting the float64
emulator (kernels_ref.emulate.Engine) to its outputs: every candidate datapath that reproduces
every probe output bit for bit is kept.

Families of probes:
  step      one big product and small ones inside the first MMA instruction (k < 16 / 32 / 8),
            signs mixed, with and without a cancelling term, the small ones at every position and
            in the next instruction: fraction bits kept when aligning (align_bits), truncation or
            rounding of the aligned terms and of the sum (sign-biased pairs), whether the running
            accumulator joins the alignment (fused), the products per step (mma_k), the
            accumulator's width (acc_bits)
  ladder    a big product, then thousands of small ones (and a cancelling one last): where the
            small ones stop being lost, i.e. the k interval of promotion into fp32 (promotion)
  operand   fp32 operands with bits past TF32's: how many operand bits survive, and how they round
  splitk    cuBLAS with reduced-precision reductions, per shape: whether partials are rounded to
            bf16/fp16 (random outlier-channel inputs and +-1024 pairs across every k position),
            where the partial boundaries are, how a partial rounds, in what type partials are summed
  int8      torch._int_mm against the exact integer sum
  act       tanh.approx.f32 GELU and ex2.approx SiLU over a dense sweep of fp32 inputs: the largest
            error in units of 2^-23 (|x| + |y|)
  envelope  random normal / all-positive / outlier-channel GEMMs at several K: the error against the
            exact sum, next to S = sum |a||b| and the partial-sum magnitudes the bounds use

Writes one JSON (environment, per-engine fits, per-family raw observations that did not fit, the
summary constants) and prints a table. Exit 0 when every probe was reproduced by some candidate
datapath; 1 when a probe gave a result no candidate can express (printed with what was seen);
2 on bad usage. Importable: `measure(names, quick=True)` returns the same dict for a GPU test.

The parts live in benchmarks/numerics/ (probes, engines, fits, families, summary); this script is
the driver: the command line, `measure` and the JSON it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from benchmarks import provenance  # noqa: E402

# The parts, and the names this script has always offered to the tests and to false_alarms.py.
from benchmarks.numerics.engines import KNOWN, Adapter, emulated_adapters, gpu_adapters  # noqa: E402,F401
from benchmarks.numerics.families import (ACT_KINDS, QUICK_SPLITK, SPLITK_SHAPES, _inputs,  # noqa: E402,F401
                                          block_stats, cublas_mm, measure_activations, measure_envelope,
                                          measure_int8, measure_splitk_on, triton_cdiv)
from benchmarks.numerics.fits import (GRIDS, PARAMS, PROMOTIONS, QUICK_GRIDS, _engine_of, fit,  # noqa: E402,F401
                                      measure_engine)
from benchmarks.numerics.probes import (C_VALUES, OPTYPES, OpType, Probes, ladder_probes,  # noqa: E402,F401
                                        operand_probes, operands_for, split_product, step_probes)
from benchmarks.numerics.summary import (_progress, constants_snippet, failures, print_report,  # noqa: E402,F401
                                         resummarise, summary)

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "numerics_h200.json")
SCHEMA = "oracle.numerics/1"

DEV = "cuda"  # where the split-K probes run; the CPU test points it and `_mm` at an emulation
_mm = cublas_mm  # the GEMM the split-K probes run (torch.mm, reductions allowed or not)


def measure_splitk(dtype_name: str, shapes, quick=False, majors=("row", "row")) -> dict:
    """The split-K family (benchmarks.numerics.families.measure_splitk_on) run by `_mm` on `DEV`."""
    return measure_splitk_on(dtype_name, shapes, quick, majors, dev=DEV, mm=_mm)


def environment() -> dict:
    """The run's versions and device (harness.dump.environment), the date, the GPU's capability,
    SM count and cuBLAS version."""
    from harness.dump import environment as versions

    env = dict(versions(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count, cublas=_cublas_version())
    return env


def _cublas_version():
    try:
        return str(torch.backends.cuda.preferred_blas_library())
    except Exception:
        return None


def measure(names=None, quick: bool = False, emulate: bool = False, families=("engines", "splitk", "int8", "act",
                                                                                "envelope")) -> dict:
    dev = torch.device("cuda" if torch.cuda.is_available() and not emulate else "cpu")
    ads = emulated_adapters() if emulate else gpu_adapters()
    if names:
        unknown = sorted(set(names) - set(ads))
        if unknown:
            raise SystemExit(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(ads)}")
        ads = {n: ads[n] for n in names}
    res: dict = {"schema": SCHEMA, "environment": environment(), "quick": quick, "emulated": emulate, "engines": {}}
    t0 = time.time()
    if "engines" in families:
        for n, ad in ads.items():
            res["engines"][n] = measure_engine(ad, dev, quick)
            _progress(res["engines"][n])
    if not emulate:
        shapes = QUICK_SPLITK if quick else SPLITK_SHAPES
        env_ads = {n: a for n, a in ads.items() if n in ("cublas_bf16_out", "triton_bf16", "lt_e4m3_fast", "lt_e4m3",
                                                         "triton_e4m3", "cublas_tf32")}
        steps = (("splitk", "splitk", lambda: {d: measure_splitk(d, shapes, quick) for d in ("bf16", "fp16")}),
                 ("int8", "int8", measure_int8), ("act", "activations", lambda: measure_activations(quick)),
                 ("envelope", "envelope", lambda: measure_envelope(env_ads, quick)))
        for fam, key, fn in steps:
            if fam not in families:
                continue
            t1 = time.time()
            try:
                res[key] = fn()
            except Exception as e:  # one family's failure must not lose the others' measurements
                import traceback

                res.setdefault("family_errors", {})[fam] = traceback.format_exc()[-2000:]
                print(f"  {fam}: FAILED {type(e).__name__}: {e}", flush=True)
            print(f"  {fam} done ({time.time() - t1:.1f} s)", flush=True)
    res["summary"] = summary(res)
    res["failures"] = failures(res)
    res["seconds"] = round(time.time() - t0, 1)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--quick", action="store_true", help="fewer probes and candidates (a GPU test's slice)")
    p.add_argument("--emulate", action="store_true", help="run the fits on emulated engines on the CPU")
    p.add_argument("--engines", default="", help="comma-separated engine names (default: all)")
    p.add_argument("--families", default="engines,splitk,int8,act,envelope")
    args = p.parse_args(argv)
    if not args.emulate and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU, or pass --emulate for the CPU dry run", file=sys.stderr)
        return 2
    names = [n for n in args.engines.split(",") if n] or None
    res = measure(names, args.quick, args.emulate, tuple(args.families.split(",")))
    res["constants_snippet"] = constants_snippet(res)
    res[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"inputs": "fixed in benchmarks/numerics/families.py: 0 for the split-K and int8 "
                                         "inputs, K + len(kind) for each envelope row; the probes are constructed"},
        peer=provenance.NotApplicable("a measurement of each engine's numerics, not a comparison of speed"),
        timing=provenance.NotApplicable("nothing is timed: it fits datapath models to probe results"))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print_report(res)
    print("\noracle/tolerance.py HW entries measured here:\n" + res["constants_snippet"])
    print(f"wrote {args.out} ({res['seconds']} s)")
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Which dequant arithmetic torch's tinygemm W4A16 kernel (torch._weight_int4pack_mm) follows: the
measurement that chooses the false-alarm benchmark's dequant_precision for its tinygemm engines.

On the H200 (one GPU, under a minute, nothing to carry):
    python benchmarks/probe_w4a16.py --out $OUT/w4a16_probe_h200.json
then keep the JSON as benchmarks/results/w4a16_probe_h200.json: benchmarks/false_alarms.py reads
its `engines` block (--w4-probe).

B is uint4 quantised per group and column as the benchmark quantises it (benchmarks/false_alarms.py
_w4_operands: bf16 scales s and offsets z, w = (q - 8) * s + z). Two measurements per group size
(32, 64, 128) and shape:
- dequant: A = the identity (M = K), so the output is the kernel's dequantised w itself (one
  product of 1 and w, exact in fp32, and w's own bf16 rounding). Each element is compared bit for
  bit with three candidates: "fp32" (fp32(fp32((q - 8) * s) + z), one rounding to bf16: the
  reference's dequant_precision "fp32"), "operand" (the product rounded to bf16, then the add:
  the reference's "operand") and "fma_bf16" (one rounding of the exact (q - 8) * s + z, a bf16 fma);
  and the fraction within oracle.judging.tolerance's operand dequant bound of the fp32 candidate.
- gemm: random normal A (M = 1, 16 and 257) through oracle.check with each declared precision:
  the verdict and the worst err/bound.
The choice: "fp32" where the fp32 candidate is bit-exact on every element of every shape and every
GEMM with "fp32" declared is MATCH; else "operand" where every element is within the bound and
every GEMM with "operand" is MATCH; else "none" (exit 1: neither model describes the kernel).
Writes JSON (rows, choice, and engines.tinygemm_w4.dequant_precision) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

import false_alarms as FA  # noqa: E402
from benchmarks import provenance  # noqa: E402
from kernels_ref import dequant as dq  # noqa: E402
from oracle.judging import tolerance  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "w4a16_probe_h200.json")
SHAPES = ((1024, 256), (4096, 1000), (512, 8))  # (K, N) of B; N a multiple of 8 for tinygemm
GEMM_M = (1, 16, 257)
GROUPS = (32, 64, 128)
CANDIDATES = ("fp32", "operand", "fma_bf16")


def round_bf16_once(x: torch.Tensor) -> torch.Tensor:
    """float64 values rounded once (to nearest, ties to even) to bf16's 8 significant bits, returned
    in float64 (normal range; torch's float64 -> bf16 goes through fp32, a double rounding)."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.round(torch.ldexp(m, torch.full_like(e, 8))), e - 8)


def candidates(ops, group: int) -> dict[str, torch.Tensor]:
    """Each candidate's dequantised B [K, N] (float64, CPU)."""
    out = {}
    for prec in ("fp32", "operand"):
        cfg = dq.DequantConfig("uint4", "bf16", "bf16", group, "k_pairs_high_first", "float_offset", prec)
        out[prec] = dq.dequant_operand_host(ops.b.cpu(), ops.b_scales.cpu(), ops.b_zeros.cpu(), cfg).double()
    cfg = dq.DequantConfig("uint4", "bf16", "bf16", group, "k_pairs_high_first", "float_offset")
    q = dq.values_of_codes(dq.unpack_host(ops.b.cpu(), cfg), "uint4")
    g = torch.arange(q.shape[0]) // group
    out["fma_bf16"] = round_bf16_once((q - 8) * ops.b_scales.cpu().double()[g] + ops.b_zeros.cpu().double()[g])
    return out


def _case(engine: str, m: int, n: int, k: int, seed: int) -> FA.Case:
    return FA.Case(engine, "bf16", "bf16", m, n, k, "row", "col", "normal", seed)


def dequant_row(group: int, k: int, n: int, seed: int, run) -> dict:
    engine = f"tinygemm_w4_g{group}"
    c = _case(engine, k, n, k, seed)
    ops = FA.make_operands(c)
    eye = torch.eye(k, dtype=torch.bfloat16, device=ops.a.device)
    got = run(c, FA.Operands(a=eye, b=ops.b, b_scales=ops.b_scales, b_zeros=ops.b_zeros)).double().cpu()
    cand = candidates(ops, group)
    cfg = dq.DequantConfig("uint4", "bf16", "bf16", group, "k_pairs_high_first", "float_offset", "operand")
    q = dq.values_of_codes(dq.unpack_host(ops.b.cpu(), cfg), "uint4")
    gi = torch.arange(k) // group
    bound = tolerance.dequant_bound(q, ops.b_zeros.cpu().double()[gi], ops.b_scales.cpu().double()[gi],
                                    out_dtype="bf16", precision="operand", zeros="float_offset", scale_dtype="bf16",
                                    centre=8.0)
    row = {"measure": "dequant", "group": group, "k": k, "n": n, "elements": got.numel()}
    for name, w in cand.items():
        row[f"bit_exact_{name}"] = float((got == w).double().mean())
    row["within_operand_bound"] = float(((got - cand["fp32"]).abs() <= bound).double().mean())
    return row


def gemm_row(group: int, m: int, k: int, n: int, seed: int, run) -> dict:
    import oracle

    engine = f"tinygemm_w4_g{group}"
    c = _case(engine, m, n, k, seed)
    ops = FA.make_operands(c)
    d = run(c, ops)
    row = {"measure": "gemm", "group": group, "m": m, "k": k, "n": n}
    for prec in ("fp32", "operand"):
        rep = oracle.check(ops.a, ops.b, d, b_scales=ops.b_scales, b_zeros=ops.b_zeros, b_zeros_kind="float_offset",
                           b_dtype="uint4", b_packing="k_pairs_high_first", dequant_precision=prec, reduction="fp32")
        store = next(s for s in rep.stages if s.name == "epilogue_store")
        w = store.chained.worst
        row[f"verdict_{prec}"] = rep.verdict
        row[f"ratio_{prec}"] = float(w.max_ratio) if w else 0.0
    return row


def choose(rows: list[dict]) -> str:
    deq = [r for r in rows if r["measure"] == "dequant"]
    gemm = [r for r in rows if r["measure"] == "gemm"]
    if not deq or not gemm:
        return "none"
    if all(r["bit_exact_fp32"] == 1.0 for r in deq) and all(r["verdict_fp32"] == "MATCH" for r in gemm):
        return "fp32"
    if all(r["within_operand_bound"] == 1.0 for r in deq) and all(r["verdict_operand"] == "MATCH" for r in gemm):
        return "operand"
    return "none"


def measure(run=None, shapes=SHAPES, groups=GROUPS, gemm_m=GEMM_M) -> dict:
    rows = []
    seed = 0
    for group in groups:
        run_g = run or FA.ENGINE[f"tinygemm_w4_g{group}"].run
        for k, n in shapes:
            if k % group or k % (16 * FA.W4_INNER_K_TILES) or n % 8:
                continue
            seed += 1
            rows.append(dequant_row(group, k, n, seed, run_g))
            for m in gemm_m:
                seed += 1
                rows.append(gemm_row(group, m, k, n, seed, run_g))
    choice = choose(rows)
    env = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return {"schema": "oracle.probe_w4a16/1", "environment": env, "rows": rows, "choice": choice,
            "engines": {"tinygemm_w4": {"dequant_precision": choice}} if choice != "none" else {}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the probe runs torch's tinygemm kernel on the GPU", file=sys.stderr)
        return 2
    doc = measure()
    doc[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"rows": list(range(1, len(doc["rows"]) + 1))},  # measure(): one per row, in order
        peer=provenance.NotApplicable("a probe of tinygemm's dequantisation against models of it, not a speed "
                                      "comparison"),
        timing=provenance.NotApplicable("nothing is timed"))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for r in doc["rows"]:
        if r["measure"] == "dequant":
            print(f"dequant g{r['group']:<3} {r['k']}x{r['n']}: bit-exact fp32 {r['bit_exact_fp32']:.6f}, operand "
                  f"{r['bit_exact_operand']:.6f}, fma_bf16 {r['bit_exact_fma_bf16']:.6f}; within the operand bound "
                  f"{r['within_operand_bound']:.6f}")
        else:
            print(f"gemm    g{r['group']:<3} {r['m']}x{r['n']}x{r['k']}: fp32 {r['verdict_fp32']} "
                  f"({r['ratio_fp32']:.3g}), operand {r['verdict_operand']} ({r['ratio_operand']:.3g})")
    print(f"choice: dequant_precision {doc['choice']!r}; wrote {args.out}")
    return 0 if doc["choice"] != "none" else 1


if __name__ == "__main__":
    sys.exit(main())

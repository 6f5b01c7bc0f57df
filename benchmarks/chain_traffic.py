"""Where `oracle.check`'s reference chain spends its memory traffic: every torch operation it runs on a
tensor of D's size, counted, with the bytes each reads and writes, per element of D.

    python benchmarks/chain_traffic.py [--size 256] [--out benchmarks/results/chain_traffic_cpu.json]

Runs `oracle.check` on a correct bf16 GEMM of size^3 (CPU or GPU) and logs, through a torch dispatch
mode around oracle.judging.differential.epilogue.reference_chain, each aten operation whose inputs or
output have D's element count (views and storage plumbing are free and left out, and so is everything inside
the reference GEMM, kernels_ref.mma.mma_accumulate: on a GPU one Triton kernel that writes the accumulator,
S and the statistics once, where the CPU's interpreter copies them about; the analysis runs it before the
chain, reference_accumulation, and hands the chain its result). The accumulation bound is counted
as a GPU evaluates it, in one pass (oracle.judging.bound_pass: one operation, what it reads and writes; the
interpreter runs it here), or with --torch-bound as its torch definition, which the CPU runs. The count and
the bytes per element do not depend on the size, so a small run on the CPU says what the chain moves at 4096^3 on a GPU: the JSON gives that
traffic over a read bandwidth (--bandwidth-tbps, default 3.0, an H100's streaming rate), beside
check_bench's measured `reference_chain` phase, less its reference GEMM, to compare with.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FREE = ("new_empty", "set_", "detach", "view", "select", "empty", "slice", "as_strided", "_unsafe_view", "expand",
        "aten.t.default", "alias")  # no data moved


def traffic(size: int, device: str, one_pass: bool = True) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import oracle
    from kernels_ref import mma as ref_mma
    from oracle.judging import bound_pass
    from oracle.judging.differential import analysis

    numel = size * size

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[tuple[str, int, int]] = []

            self.paused = False
            self.inside = False  # in the reference chain (the cross-check's host side runs its own bound on the CPU)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            if not self.paused and not any(f in name for f in FREE):
                full = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                        if isinstance(t, torch.Tensor) and t.numel() >= numel]
                read = [a for a in args if isinstance(a, torch.Tensor) and a.numel() >= numel]
                if full or read:
                    self.ops.append((name, sum(t.numel() * t.element_size() for t in read),
                                     sum(t.numel() * t.element_size() for t in full)))
            return out

    log, chain, gemm = Log(), analysis.reference_chain, ref_mma.mma_accumulate
    applies, evaluate = bound_pass.applies, bound_pass.evaluate

    def logged(ctx, accumulation=None):
        log.inside = True
        try:
            with log:
                return chain(ctx, accumulation)
        finally:
            log.inside = False

    def gemm_unlogged(*a, **kw):  # the reference GEMM, where the chain runs it itself
        log.paused = True
        try:
            return gemm(*a, **kw)
        finally:
            log.paused = False

    def pass_logged(form, l, v, s):  # one kernel: what it reads and writes, counted as one operation
        log.paused = True
        try:
            out = evaluate(form, l, v, s)
        finally:
            log.paused = False
        log.ops.append(("oracle.judging.bound_pass (one Triton kernel)",
                        sum(t.numel() * t.element_size() for t in (l, v, s)), out.numel() * out.element_size()))
        return out

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(torch.bfloat16).to(device)
    b = torch.randn(size, size, generator=gen).to(torch.bfloat16).to(device)
    d = (a.float() @ b.float()).to(torch.bfloat16)
    analysis.reference_chain, ref_mma.mma_accumulate = logged, gemm_unlogged
    bound_pass.evaluate = pass_logged
    bound_pass.applies = lambda *t: one_pass and log.inside  # the chain on the GPU's path, or on torch's
    try:
        verdict = oracle.check(a, b, d).verdict
    finally:
        analysis.reference_chain, ref_mma.mma_accumulate = chain, gemm
        bound_pass.applies, bound_pass.evaluate = applies, evaluate
    moved = sum(r + w for _, r, w in log.ops)
    return {"size": size, "device": device, "bound": "one pass" if one_pass else "torch", "verdict": getattr(verdict, "value", str(verdict)),
            "operations": len(log.ops), "bytes_per_element": moved / numel,
            "by_operation": dict(collections.Counter(n for n, _, _ in log.ops).most_common())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--device", default="cpu")
    p.add_argument("--torch-bound", action="store_true",
                   help="count the accumulation bound's torch definition instead of its one pass (which a GPU takes)")
    p.add_argument("--bandwidth-tbps", type=float, default=3.0, help="for the estimate at 4096^3")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    doc = {"schema": "chain_traffic/1", **traffic(args.size, args.device, not args.torch_bound), "bandwidth_tbps": args.bandwidth_tbps}
    doc["estimate_ms_4096"] = round(doc["bytes_per_element"] * 4096 * 4096 / (args.bandwidth_tbps * 1e12) * 1e3, 2)
    from benchmarks import provenance

    doc[provenance.KEY] = provenance.stamp(
        __file__, argv, seeds={"inputs": 0},
        peer=provenance.NotApplicable("a count of operations and bytes, not a timing"),
        timing=provenance.NotApplicable("nothing is timed: the estimate is bytes over the given bandwidth"))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{doc['verdict']}: {doc['operations']} torch operations on D-sized tensors, "
          f"{doc['bytes_per_element']:.0f} bytes per element of D; at 4096^2 and {args.bandwidth_tbps} TB/s: "
          f"{doc['estimate_ms_4096']} ms")
    for name, n in list(doc["by_operation"].items())[:12]:
        print(f"  {n:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The differential's own cost: `analyze` of one recording, its phases, and how many reference
launches, host reads and torch ops it makes.

    python benchmarks/analyze_bench.py                 # CUDA: 4096^3 bf16, 128x128x64 tiles, 8 tiles x 64 k-blocks
    python benchmarks/analyze_bench.py --count         # also count launches, host reads, aten ops (slower)
    python benchmarks/analyze_bench.py --size 512 --tile 64 --k 1024 --tiles 2   # what the CPU can run

The recording is the kernel model's (oracle.run.simulate) on the traced tiles' rows of A and
columns of B only (a window problem; its taps are renamed to the tiles of the full problem), with
the output of the full problem: the window's tiles as the model wrote them, every other tile
torch's product rounded to the output dtype (correct, and never compared to a tap). One warming
`analyze` (compiles), then `--runs` timed ones; each prints its phases (Analysis.phases, ms).

Counting (--count) wraps every Triton launch (JITFunction.run, and the interpreter's), the host
reads (Tensor.cpu, .item, .tolist, bool / int / float of a tensor: each a device synchronisation
on CUDA) and, through a TorchDispatchMode, every aten op, during one `analyze`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks import provenance  # noqa: E402
from oracle.judging.differential import analyze  # noqa: E402
from oracle.problem.spec import ProblemSpec, Tile  # noqa: E402
from oracle.run.inputs import Operands, Provenance, make_operands  # noqa: E402
from oracle.run.recording import Recording  # noqa: E402
from oracle.run.simulate import Injection, simulate  # noqa: E402

# first, last, the other two corners and four inside (as benchmarks/warm_path.py traces), on a 32 x 32 grid
HOPPER_TILES = ((0, 0), (31, 31), (0, 31), (31, 0), (15, 16), (16, 15), (7, 23), (23, 7))


def recording(spec: ProblemSpec, tiles, defect=None, seed: int = 3) -> Recording:
    """The model's recording of `spec` with `tiles` traced (see the module docstring)."""
    import dataclasses

    bm, bn = spec.tile.bm, spec.tile.bn
    ops = make_operands(spec, "random", seed=seed)
    tms = sorted({t[0] for t in tiles})
    tns = sorted({t[1] for t in tiles})
    rows = torch.cat([torch.arange(tm * bm, min((tm + 1) * bm, spec.m)) for tm in tms])
    cols = torch.cat([torch.arange(tn * bn, min((tn + 1) * bn, spec.n)) for tn in tns])
    wspec = dataclasses.replace(spec, m=len(rows), n=len(cols))
    wops = Operands(a=ops.a[rows].contiguous(), b=ops.b[:, cols].contiguous())
    wtiles = [(tms.index(tm), tns.index(tn)) for tm, tn in tiles]
    inj = Injection(defect, wtiles[0], 1) if defect else None
    wrec = simulate(wspec, wops, Provenance("random", seed), injection=inj, tap_tiles=wtiles)
    back = {(i, j): (tm, tn) for i, tm in enumerate(tms) for j, tn in enumerate(tns)}
    taps = tuple(dataclasses.replace(t, tile=back[t.tile]) for t in wrec.taps)
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    out = (ops.a.to(dev).float() @ ops.b.to(dev).float()).to(wrec.output.dtype).cpu()
    for (i, j), (tm, tn) in back.items():
        out[tm * bm:(tm + 1) * bm, tn * bn:(tn + 1) * bn] = wrec.output[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
    return Recording(spec=spec, operands=ops, output=out, provenance=Provenance("random", seed), taps=taps,
                     kernel=wrec.kernel, synthetic=True)


class Counts:
    """Triton launches, host reads and aten ops made while `active()` is entered."""

    READS = ("cpu", "item", "tolist", "__bool__", "__int__", "__float__")

    def __init__(self):
        self.launches = collections.Counter()
        self.reads = collections.Counter()
        self.ops = 0

    @property
    def summary(self) -> dict:
        return {"launches": sum(self.launches.values()), "host_reads": sum(self.reads.values()),
                "aten_ops": self.ops, "launches_by_kernel": dict(self.launches), "reads_by_kind": dict(self.reads)}

    @contextlib.contextmanager
    def active(self, ops: bool = True):
        from torch.utils._python_dispatch import TorchDispatchMode
        from triton.runtime import interpreter, jit

        saved = []
        counts = self

        def wrap_run(cls):
            orig = cls.run

            def run(fn, *a, **kw):
                counts.launches[getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?")] += 1
                return orig(fn, *a, **kw)
            saved.append((cls, "run", orig))
            cls.run = run

        def wrap_read(name):
            orig = getattr(torch.Tensor, name)

            def read(t, *a, **kw):
                if not (name == "cpu" and t.device.type == "cpu"):
                    counts.reads[name] += 1
                return orig(t, *a, **kw)
            saved.append((torch.Tensor, name, orig))
            setattr(torch.Tensor, name, read)

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counts.ops += 1
                return func(*args, **(kwargs or {}))

        wrap_run(jit.JITFunction)
        wrap_run(interpreter.InterpretedFunction)
        for name in self.READS:
            wrap_read(name)
        mode = Ops() if ops else contextlib.nullcontext()
        try:
            with mode:
                yield self
        finally:
            for obj, name, orig in reversed(saved):
                setattr(obj, name, orig)


def counted(rec: Recording, ops: bool = True) -> tuple[object, dict]:
    c = Counts()
    with c.active(ops):
        an = analyze(rec)
    return an, c.summary


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096 if cuda else 256, help="M = N")
    ap.add_argument("--k", type=int, default=None, help="K (default: --size)")
    ap.add_argument("--tile", type=int, default=128 if cuda else 64, help="BM = BN (BK is 64)")
    ap.add_argument("--tiles", type=int, default=8 if cuda else 2, help="traced tiles")
    ap.add_argument("--runs", type=int, default=3 if cuda else 1)
    ap.add_argument("--defect", default=None, help="a planted defect of the model (oracle.run.simulate.Injection)")
    ap.add_argument("--count", action="store_true", help="count launches, host reads and aten ops of one analyze")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--report", default=None,
                    help="write the analysis' report JSON here, its phase times left out (to compare two versions)")
    args = ap.parse_args(argv)
    k = args.k or args.size
    spec = ProblemSpec(m=args.size, n=args.size, k=k, tile=Tile(args.tile, args.tile, 64),
                       swizzle_a=128, swizzle_b=128)
    grid = spec.tiles_m
    pool = HOPPER_TILES if grid == 32 else tuple(
        dict.fromkeys([(0, 0), (grid - 1, grid - 1), (0, grid - 1), (grid - 1, 0)] +
                      [(i, (i + 1) % grid) for i in range(grid)]))
    tiles = pool[:args.tiles]
    t0 = time.perf_counter()
    rec = recording(spec, tiles, args.defect)
    print(f"recording: {spec.describe()}, {len(tiles)} traced tiles x {spec.k_blocks} k-blocks, {len(rec.taps)} taps "
          f"({time.perf_counter() - t0:.1f} s to build)", flush=True)
    t0 = time.perf_counter()
    an = analyze(rec)
    print(f"warming analyze: {time.perf_counter() - t0:.2f} s, verdict {an.verdict.value}", flush=True)
    walls, runs = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        an = analyze(rec)
        walls.append(time.perf_counter() - t0)
        runs.append(dict(an.phases))
        print(f"analyze {walls[-1] * 1e3:9.1f} ms  " + "  ".join(f"{n} {ms:.1f}" for n, ms in an.phases), flush=True)
    res = {"problem": spec.describe(), "tiles": [list(t) for t in tiles], "k_blocks": spec.k_blocks,
           "device": "cuda" if cuda else "cpu", "verdict": an.verdict.value,
           "first": None if an.first is None else an.first.stage,
           "analyze_ms": [round(w * 1e3, 2) for w in walls], "median_ms": round(statistics.median(walls) * 1e3, 2),
           "phases_ms": runs}
    if args.count:
        _, c = counted(rec)
        res["counts"] = c
        print(json.dumps({k: v for k, v in c.items()}, indent=1))
    if args.report:
        from oracle.report import table as report

        doc = report.to_json(an)
        doc.pop("phases_ms", None)
        with open(args.report, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True, default=str)
    if args.out:
        res[provenance.KEY] = provenance.stamp(
            __file__, argv, seeds={"operands": 3},  # recording()'s seed
            peer=provenance.NotApplicable("the differential's own cost: nothing is timed beside it"),
            timing=provenance.Timing(clock="the host's wall clock around each analyze (it ends reading the device)",
                                     warmup="one analyze (it compiles)", reps=f"{args.runs} analyze calls",
                                     statistic="median (every run and its phases kept)"))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(f"median analyze {res['median_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

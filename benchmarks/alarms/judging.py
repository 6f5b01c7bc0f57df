"""One case judged: the engine's output wrapped as an output-only recording and judged by the
differential (the references cross-checked against the host specs on one tile for the first case
of each engine and K range), then the planted defects; the zoo's correct kernels through live runs
the same way."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from alarms import engines as E
from alarms.engines import ENGINE, Case, EngineSkipped, kbucket
from alarms.planting import plant_all
from alarms.specs import make_operands, spec_for
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance
from oracle.run.recording import Recording

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Result:
    case: Case
    spec_why: str = ""
    verdict: str = ""
    ratio: float = 0.0
    seconds: float = 0.0
    error: Optional[str] = None
    planted: dict = field(default_factory=dict)  # defect -> (detected, right tile)
    problem: Optional[dict] = None
    skipped: Optional[str] = None  # the engine refused the case's layout: why (no verdict)

    @property
    def judged(self) -> bool:
        return self.error is None and self.skipped is None


_CROSS_CHECKED: set = set()


@contextlib.contextmanager
def _cross_check(c: Case):
    """The references are cross-checked against the float64 host specs (on one tile) for the first
    case of each engine and K range only: on the CPU that costs about a second per tile at
    K = 65536. An ORACLE_CROSS_CHECK_TILES the caller set is kept."""
    name = "ORACLE_CROSS_CHECK_TILES"
    saved = os.environ.get(name)
    key = (c.engine, kbucket(c.k))
    if saved is None:
        os.environ[name] = "0" if key in _CROSS_CHECKED else "1"
    _CROSS_CHECKED.add(key)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)


def run_case(c: Case, numerics: dict, planted: bool = True, run=None) -> Result:
    t0 = time.time()
    res = Result(c)
    try:
        ops = make_operands(c)
        spec, res.spec_why = spec_for(c, numerics)
        res.problem = spec.to_json()
        try:
            out = (run or ENGINE[c.engine].run)(c, ops)
        except EngineSkipped as e:
            res.skipped = str(e)[:500]
            res.seconds = round(time.time() - t0, 3)
            return res
        if E.DEV == "cuda":
            torch.cuda.synchronize()
        out = out.contiguous()
        rec = Recording(spec=spec, operands=ops, output=out, provenance=Provenance("random", c.seed, generator=E.DEV),
                        kernel=c.engine)
        with _cross_check(c):
            an = analyze(rec)
        res.verdict = an.verdict.value
        store = next(s for s in an.stages if s.name == "epilogue_store")
        w = store.chained.worst
        res.ratio = float(w.max_ratio) if w else 0.0
        if planted:
            plant_all(res, out, spec, ops, c.seed)
    except Exception as e:  # a case the engine or the oracle cannot run: counted apart, not as a verdict
        res.error = f"{type(e).__name__}: {e}"[:500]
    res.seconds = round(time.time() - t0, 3)
    return res


# the zoo's correct kernels: case file, traced entry, shapes (each case's own epilogue: alpha, beta,
# C, bias and GELU)
ZOO = (("zoo/hopper_gemm/hopper_gemm.toml", "zoo_hopper_bf16_traced",
        ((1, 300, 72), (257, 129, 1000), (300, 392, 520), (128, 256, 16384), (64, 128, 65536))),
       ("zoo/hopper_gemm/hopper_gemm_e4m3.toml", "zoo_hopper_e4m3_tensor_traced",
        ((257, 129, 1008), (128, 256, 16384))),
       ("zoo/sm80_gemm/sm80_gemm.toml", "zoo_sm80_bf16_traced", ((200, 136, 168), (256, 128, 4096), (64, 128, 16384))))


def zoo_results(budget_end: float, planted: bool = True) -> list[Result]:
    """The zoo's correct kernels through live runs (oracle.run.live.run_live: its traced cubin from the
    build cache, one child process each), judged output-only (taps dropped), with the planted
    defects as for the other engines."""
    from oracle.run.case import load_case
    from oracle.run.case_types import with_trace
    from oracle.run.inputs import make_operands as ladder_operands
    from oracle.run.live import run_live

    out = []
    seed = 1000
    for path, entry, shapes in ZOO:
        for m, n, k in shapes:
            if time.time() > budget_end:
                return out
            seed += 1
            t0 = time.time()
            case = with_trace(load_case(os.path.join(ROOT, path), dict(m=m, n=n, k=k), entry=entry), [(0, 0)], (0,))
            sp = case.spec
            res = Result(Case(entry, sp.a_dtype, sp.out_dtype, m, n, k, sp.a_major, sp.b_major, "normal", seed),
                         spec_why=f"zoo case {path}, its own spec, output only")
            try:
                ops = ladder_operands(sp, "random", seed, generator="cuda")
                live = run_live(case, ops, Provenance("random", seed, generator="cuda"), timeout_s=120)
                rec = dataclasses.replace(live.recording, taps=(), descriptors=())
                res.problem = rec.spec.to_json()
                with _cross_check(res.case):
                    an = analyze(rec)
                res.verdict = an.verdict.value
                w = next(st for st in an.stages if st.name == "epilogue_store").chained.worst
                res.ratio = float(w.max_ratio) if w else 0.0
                if planted and rec.output is not None:
                    plant_all(res, rec.output.contiguous(), rec.spec, rec.operands, seed)
            except Exception as e:
                res.error = f"{type(e).__name__}: {e}"[:500]
            res.seconds = round(time.time() - t0, 3)
            out.append(res)
    return out


def prebuild_zoo() -> int:
    """Build the zoo's cubins into the build cache (ORACLE_CACHE_DIR) on a machine without a GPU."""
    from harness.build import build_cubin
    from oracle.run.case import load_case

    for path, entry, _ in ZOO:
        k = load_case(os.path.join(ROOT, path), {}, entry=entry).kernel
        br = build_cubin(k.source, arch=k.arch, defines={"ORACLE_TRACE": "1", **k.defines})
        print(f"{entry}: {br.cubin_path} ({'cached' if br.cached else 'built'})")
    return 0

"""Fitting the float64 emulator (kernels_ref.emulate.Engine) to an engine's probe outputs: the grids
of candidate datapaths, `fit` (every candidate that reproduces every output bit for bit, or the
nearest ones) and `measure_engine` (operand rounding, then the step family, then the ladder).
"""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from kernels_ref import emulate as E
from benchmarks.numerics.engines import Adapter
from benchmarks.numerics.probes import OPTYPES, Probes, ladder_probes, operand_probes, step_probes


GRIDS = {
    "16bit": dict(mma_k=(4, 8, 16), fused=(True, False), align_bits=tuple(range(21, 31)) + (40,),
                  align_round=("trunc", "rn"), acc_bits=(23,), acc_round=("trunc", "rn")),
    "tf32": dict(mma_k=(4, 8), fused=(True, False), align_bits=tuple(range(21, 31)) + (40,),
                 align_round=("trunc", "rn"), acc_bits=(23,), acc_round=("trunc", "rn")),
    "fp32": dict(mma_k=(1, 4, 8), fused=(True, False), align_bits=tuple(range(21, 31)) + (40,),
                 align_round=("trunc", "rn"), acc_bits=(23,), acc_round=("trunc", "rn")),
    # bf16x3 runs bf16 instructions (k = 16): the recorded outputs of 2026-12-01 fit none of k = 4, 8
    "x3": dict(mma_k=(4, 8, 16), fused=(True,), align_bits=tuple(range(22, 28)) + (40,), align_round=("trunc", "rn"),
               acc_bits=(23,), acc_round=("trunc", "rn")),
    # acc_bits at or above align_bits are indistinguishable on fp8 products (the aligned sum is narrow)
    "fp8": dict(mma_k=(8, 16, 32), fused=(True, False), align_bits=tuple(range(9, 25)) + (40,),
                align_round=("trunc", "rn"), acc_bits=tuple(range(10, 19)) + (23,), acc_round=("trunc", "rn")),
}
QUICK_GRIDS = {
    "16bit": dict(GRIDS["16bit"], mma_k=(8, 16), align_bits=(22, 23, 24, 25, 26, 40)),
    "tf32": dict(GRIDS["tf32"], align_bits=(22, 23, 24, 25, 26, 40)),
    "fp32": dict(GRIDS["fp32"], mma_k=(1, 8), align_bits=(23, 24, 25, 40)),
    "x3": dict(GRIDS["x3"], align_bits=(23, 24, 25, 40)),
    "fp8": dict(GRIDS["fp8"], mma_k=(16, 32), align_bits=tuple(range(11, 17)) + (23, 40),
                acc_bits=tuple(range(11, 17)) + (23,)),
}
PARAMS = ("fused", "align_bits", "align_round", "acc_bits", "acc_round")
# promotion (or restart) intervals the ladders try: powers of two and the multiples of 32 up to 256
# (cuBLAS TF32's recorded ladder outputs of 2026-12-01 fit no power of two)
PROMOTIONS = tuple(sorted({8, 16, 512, 1024, 2048} | set(range(32, 257, 32))))


def _candidates(grid: dict, dev) -> dict[int, dict[str, torch.Tensor]]:
    """Per mma_k, [C, 1] tensors of every combination of the other parameters."""
    import itertools

    out = {}
    for g in grid["mma_k"]:
        combos = list(itertools.product(*(grid[p] for p in PARAMS)))
        cols = list(zip(*combos))
        d = {}
        for p, col in zip(PARAMS, cols):
            if p.endswith("round"):
                d[p] = torch.tensor([E.ROUND_CODE[v] for v in col], device=dev)[:, None]
            elif p == "fused":
                d[p] = torch.tensor(col, device=dev)[:, None]
            else:
                d[p] = torch.tensor(col, dtype=torch.float64, device=dev)[:, None]
        out[g] = d
    return out


def _decode(g: int, d: dict, i: int, promotion=None, operand=None) -> dict:
    rec = {"mma_k": g, "promotion": promotion}
    for p in PARAMS:
        v = d[p][i, 0].item()
        rec[p] = E.ROUNDINGS[int(v)] if p.endswith("round") else (bool(v) if p == "fused" else int(v))
    if operand:
        rec.update(operand)
    return rec


def _engine_of(rec: dict, **over) -> E.Engine:
    kw = {k: rec[k] for k in ("mma_k", "fused", "align_bits", "align_round", "acc_bits", "acc_round", "promotion")}
    for k in ("operand_bits", "operand_round", "passes"):
        if rec.get(k) is not None:
            kw[k] = rec[k]
    kw.update(over)
    return E.Engine(**kw)


def _predict(pr: Probes, out: str, g: int, d: dict, promotion, operand: dict, dev, chunk: int = 384):
    """Predicted outputs [C, n] of every candidate (batched over candidates)."""
    a, b = pr.a.to(dev), pr.b.to(dev)
    C = d["fused"].shape[0]
    res = []
    for c0 in range(0, C, chunk):
        sl = {p: d[p][c0:c0 + chunk] for p in PARAMS}
        eng = E.Engine(mma_k=g, promotion=promotion, **sl, **operand)
        res.append(E.to_dtype(E.dot(a, b, eng), out) if out != "int32" else E.dot(a, b, eng))
    return torch.cat(res)


def fit(ad: Adapter, pr: Probes, observed: torch.Tensor, grid: dict, dev, promotions=(None,),
        operand: Optional[dict] = None, restrict: Optional[list] = None) -> dict:
    """Every candidate datapath reproducing every probe output. `restrict`: candidates (records)
    from an earlier family; only they (times `promotions`) are tried."""
    operand = operand or {}
    obs = observed.to(dev)
    kept, best = [], []
    if restrict is not None:
        groups: dict[int, list] = {}
        for r in restrict:
            groups.setdefault(r["mma_k"], []).append(r)
        cands = {}
        for g, recs in groups.items():
            d = {}
            for p in PARAMS:
                vals = [E.ROUND_CODE[r[p]] if p.endswith("round") else r[p] for r in recs]
                dt = torch.float64 if p in ("align_bits", "acc_bits") else None
                d[p] = torch.tensor(vals, device=dev, dtype=dt)[:, None]
            cands[g] = d
    else:
        cands = _candidates(grid, dev)
    for g, d in cands.items():
        for promo in promotions:
            if promo is not None and promo % g:
                continue
            pred = _predict(pr, ad.out, g, d, promo, operand, dev)
            same = (pred == obs[None, :]) | (pred.isnan() & obs.isnan()[None, :])
            miss = (~same).sum(1)
            for i in torch.nonzero(miss == 0).flatten().tolist():
                kept.append(_decode(g, d, i, promo, operand))
            order = torch.argsort(miss)[:3].tolist()
            for i in order:
                bad_idx = (~same[i]).nonzero().flatten()[:4].tolist()
                best.append((int(miss[i]), _decode(g, d, i, promo, operand), bad_idx, pred[i]))
    best.sort(key=lambda t: t[0])
    seen = []
    for miss, rec, idx, pred in best[:3]:
        seen.append({"mismatches": miss, "of": pr.n, "candidate": rec,
                     "examples": [{"probe": pr.labels[j], "observed": float(observed[j]), "predicted": float(pred[j])}
                                  for j in idx]})
    return {"family": pr.family, "probes": pr.n, "consistent": kept, "nearest": [] if kept else seen}


def _summarise(cands: list) -> dict:
    """The loosest values over the consistent datapaths (what a sound bound must allow)."""
    if not cands:
        return {}
    return {
        "align_bits_min": min(c["align_bits"] for c in cands),
        "align_bits_max": max(c["align_bits"] for c in cands),
        "acc_bits_min": min(c["acc_bits"] for c in cands),
        "acc_bits_max": max(c["acc_bits"] for c in cands),
        "align_round": sorted({c["align_round"] for c in cands}),
        "acc_round": sorted({c["acc_round"] for c in cands}),
        "fused": sorted({c["fused"] for c in cands}),
        "mma_k_max": max(c["mma_k"] for c in cands),
        "mma_k_min": min(c["mma_k"] for c in cands),
        "promotion": sorted({c["promotion"] for c in cands}, key=lambda v: (v is None, v or 0)),
        "candidates": len(cands),
    }


def measure_engine(ad: Adapter, dev, quick: bool = False) -> dict:
    """Operand rounding (TF32 kinds), then the step family, then the ladder family."""
    t = OPTYPES[ad.optype]
    grid = (QUICK_GRIDS if quick else GRIDS)[ad.family]
    res: dict = {"engine": ad.name, "note": ad.note, "optype": ad.optype, "out": ad.out}
    t0 = time.time()
    operand = {}
    try:
        if ad.family in ("tf32", "x3"):
            pr = operand_probes(quick)
            obs = ad.diag(pr)
            rows = []
            for bits in (7, 8, 9, 10, 11, 12, 13, 23):
                for rnd in E.ROUNDINGS:
                    for passes in ((1, 3) if ad.family == "x3" else (1,)):
                        if bits == 23 and (rnd != "rn" or passes != 1):
                            continue
                        op = {"operand_bits": bits if bits < 23 else None, "operand_round": rnd, "passes": passes}
                        eng = E.Engine(mma_k=8, align_bits=40, acc_round="rn", **{k: v for k, v in op.items()
                                                                                  if v is not None})
                        pred = E.to_dtype(E.dot(pr.a, pr.b, eng), ad.out)
                        miss = int((pred != obs).sum())
                        rows.append((miss, op))
            rows.sort(key=lambda r: r[0])
            good = [op for miss, op in rows if miss == 0]
            res["operand"] = {"probes": pr.n, "consistent": good, "nearest": [] if good else
                              [{"mismatches": m, "of": pr.n, "candidate": op} for m, op in rows[:3]]}
            if good:
                operand = {k: v for k, v in good[0].items() if v is not None and not (k == "passes" and v == 1)}
                if operand.get("operand_bits") is None:
                    operand.pop("operand_round", None)
        pr = step_probes(t, quick)
        obs = ad.diag(pr)
        step = fit(ad, pr, obs, grid, dev, operand=operand)
        res["step"] = step
        K = 1024 if quick else (4096 if ad.family == "fp8" else 2048)
        lad = ladder_probes(t, K, quick)
        obs_l = ad.diag(lad)
        promos = (None,) + tuple(p for p in PROMOTIONS if p < K)
        restrict = step["consistent"] if step["consistent"] else None
        ladder = fit(ad, lad, obs_l, grid, dev, promotions=promos, operand=operand, restrict=restrict)
        if restrict is not None and not ladder["consistent"] and _grid_size(grid) <= 1000:
            ladder = fit(ad, lad, obs_l, grid, dev, promotions=promos, operand=operand)
            ladder["refit_without_step"] = True
        res["ladder"] = ladder
        res["fit"] = _summarise(ladder["consistent"])
        res["ok"] = bool(step["consistent"]) and bool(ladder["consistent"])
        wg = getattr(ad.run, "wgmma", None)
        if wg is not None:
            res["ptx_has_wgmma"] = wg
    except Exception as e:  # an engine this torch/triton lacks: recorded, not fatal
        res["ok"] = None
        res["unavailable"] = f"{type(e).__name__}: {e}"[:400]
    res["seconds"] = round(time.time() - t0, 2)
    return res


def _grid_size(grid: dict) -> int:
    return math.prod(len(grid[p]) for p in ("mma_k",) + PARAMS)

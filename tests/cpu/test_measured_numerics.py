"""The tolerance models against what the H200 measurement recorded
(benchmarks/results/numerics_h200.json, benchmarks/measure_numerics.py):

- every hardware constant of oracle.judging.hardware_numerics.HW that names a measurement is sound against it,
  recomputed from the stored fits by this version's rules;
- every datapath that reproduced an engine's probes, emulated (kernels_ref.emulate), stays below
  the bound of the model that engine is judged with, and below `any`'s;
- the random GEMMs of the envelope (inputs regenerated from their seeds): the error each engine
  showed, per element at most the recorded max of err/S, err/L, err/sqrt(V) and err/R times that
  element's statistic, stays below the bound by MARGIN;
- the engines no candidate reproduced (cuBLAS TF32 over a long K, Triton bf16x3): each recorded
  output is within the bound of its probe."""

import functools
import json
import os

import pytest
import torch

from kernels_ref import emulate as E
from oracle.judging import accumulation_bound, accumulation_models, bound_stats, hardware_numerics
from oracle.problem.spec import ProblemSpec, Tile
import bench_scripts  # tests/ is on sys.path
from benchmarks.numerics.inputs import gemm_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, hardware_numerics.RESULTS)
# The largest measured error may reach 1 / MARGIN of the bound. The bounds are reached closest
# where they are deterministic: one product dominating a sum (outlier channels) errs by nearly
# its whole TF32 rounding (cuBLAS TF32 on outliers, K = 256 and 4096: 0.76 and 0.37 of the
# bound), and truncation biases all-positive sums in one direction (tensor-core truncation at
# K = 16384 and 65536: 0.25 and 0.30; truncated TF32 operands: 0.36). Every other envelope row
# stays below 0.19 of its bound.
MARGIN = 1.25


def _script():
    return bench_scripts.load("measure_numerics")


M = _script()
DOC = json.load(open(RESULTS))

# the spec each measured engine is judged with (benchmarks/false_alarms.py judges them so too);
# cuBLAS and cuBLASLt may split K into fp32 partials
JUDGED = {
    "cublas_bf16": dict(acc_model="fp32", reduction="fp32"),
    "cublas_bf16_out": dict(acc_model="fp32", reduction="fp32"),
    "cublas_fp16": dict(acc_model="fp32", reduction="fp32"),
    "triton_bf16": dict(acc_model="fp32"),
    "triton_fp16": dict(acc_model="fp32"),
    "cublas_fp32": dict(acc_model="fp32", reduction="fp32"),
    "triton_ieee": dict(acc_model="fp32"),
    "cublas_tf32": dict(acc_model="tf32_rn", reduction="fp32"),
    "triton_tf32": dict(acc_model="tf32"),
    "triton_tf32x3": dict(acc_model="tf32x3"),
    "triton_bf16x3": dict(acc_model="bf16x3"),
    "triton_e4m3": dict(acc_model="fp8_fast"),
    "triton_e4m3_mni0": dict(acc_model="any"),  # fits from fp32-wide to promoted every 8: not one model
    "triton_e4m3_mni64": dict(acc_model="fp8_promoted", promotion_interval=64),
    "lt_e4m3_fast": dict(acc_model="fp8_fast", reduction="fp32"),
    "lt_e4m3": dict(acc_model="fp8_promoted", promotion_interval=128, reduction="fp32"),
    "lt_e4m3_fast_rowwise": dict(acc_model="fp8_fast", reduction="fp32"),
    "lt_e4m3_rowwise": dict(acc_model="fp8_promoted", promotion_interval=128, reduction="fp32"),
}
OPERAND = {"bf16": "bf16", "fp16": "fp16", "tf32": "fp32", "fp32": "fp32", "e4m3": "e4m3"}


def _spec(engine: str, k: int, any_model: bool = False, bk: int = 64) -> ProblemSpec:
    kw = dict(JUDGED[engine])
    if any_model:
        kw.update(acc_model="any", reduction=kw.get("reduction", "none"))
    p = kw.get("promotion_interval")
    d = OPERAND[DOC["engines"][engine]["optype"]]
    return ProblemSpec(m=8, n=8, k=k, a_dtype=d, b_dtype=d, tile=Tile(128, 128, max(bk, p or 0)), **kw)


def _blocks(a64: torch.Tensor, b64: torch.Tensor, bk: int):
    """Each k-block's dot and sum |a||b| ([n_kb, M, N], float64, one batched product each)."""
    k = a64.shape[1]
    pad = -k % bk
    a = torch.nn.functional.pad(a64, (0, pad)).reshape(a64.shape[0], -1, bk).transpose(0, 1)
    b = torch.nn.functional.pad(b64, (0, 0, 0, pad)).reshape(-1, bk, b64.shape[1])
    return torch.bmm(a, b), torch.bmm(a.abs(), b.abs())


def _stats(a64: torch.Tensor, b64: torch.Tensor, bk: int):
    """Exact float64 S, the span statistics (oracle.judging.tolerance's definition) and q."""
    p, sb = _blocks(a64, b64, bk)
    x = p.cumsum(0)
    prev = torch.cat([torch.zeros_like(x[:1]), x[:-1]])
    lo = torch.cummin(prev.clamp(max=0), 0).values
    hi = torch.cummax(prev.clamp(min=0), 0).values
    m = torch.maximum(prev - lo, hi - prev) + sb
    q = (a64 * a64) @ (b64 * b64)
    return x[-1], sb.sum(0), bound_stats.Stats(m.sum(0), (m * m).sum(0), q)


def _measured_stats(a64: torch.Tensor, b64: torch.Tensor) -> dict:
    """S, L, V, R as benchmarks/measure_numerics.py's block_stats defines them (m_j = |X_(j-1)| + s_j)."""
    p, sb = _blocks(a64, b64, 64)
    x = p.cumsum(0)
    m = torch.cat([torch.zeros_like(x[:1]), x[:-1]]).abs() + sb
    return {"X": x[-1], "S": sb.sum(0), "L": m.sum(0), "V": (m * m).sum(0), "R": x.abs().amax(0)}


def _bound(spec: ProblemSpec, a64, b64) -> tuple[torch.Tensor, torch.Tensor]:
    x, s, st = _stats(a64, b64, spec.tile.bk)
    return x, accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, spec.k, st, x_abs=x.abs())


# -- the constants -----------------------------------------------------------------------------

SUMMARY = M.resummarise(DOC)


@pytest.mark.parametrize("key", sorted(k for k, c in hardware_numerics.HW.items() if c.measure_key))
def test_recorded_constant_is_sound_against_the_measurement(key):
    c = hardware_numerics.HW[key]
    results = hardware_numerics.RESULTS
    got = SUMMARY.get(c.measure_key)
    if got is None:
        assert not c.measured, f"{key} claims a measurement, but {c.measure_key} is empty in {results}"
        return
    assert c.measured, f"{key} = {c.value} is a placeholder, but {results} measured {c.measure_key} = {got}"
    got = float(got)
    if c.sound == "le":
        assert c.value <= got, f"{key}: recorded {c.value}, measured {got} (the bound would assume more)"
    else:
        assert c.value >= got, f"{key}: recorded {c.value}, measured {got}"
    assert hardware_numerics.MEASURED in c.source


def test_every_measured_engine_has_a_model_and_the_failures_are_the_stand_ins():
    assert set(DOC["engines"]) == set(JUDGED)
    failed = {f.split(":")[0] for f in DOC["failures"]}
    assert failed == {"cublas_tf32", "triton_bf16x3"}
    stand_in = {k for k, c in hardware_numerics.HW.items() if c.stand_in}
    assert stand_in == {"bf16x3.operand_trunc"}
    assert "not identified" in accumulation_models.acc_model("tf32_rn", "fp32").doc and "not identified" in \
        accumulation_models.acc_model("bf16x3", "fp32").doc


# -- the fitted datapaths, emulated --------------------------------------------------------------


def _loosest(cands: list, n: int = 2) -> list:
    """The consistent datapaths with the fewest bits kept and the fewest products per step."""
    seen, out = set(), []
    for c in sorted(cands, key=lambda c: (c["align_bits"] + c["acc_bits"], c["mma_k"], c["align_round"] != "trunc",
                                          c["acc_round"] != "trunc", c["fused"])):
        key = tuple(c[f] for f in ("mma_k", "fused", "align_bits", "align_round", "acc_bits", "acc_round",
                                   "promotion"))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out[:n]


FITTED = [(n, i) for n, r in DOC["engines"].items() for i, _ in enumerate(_loosest(r["ladder"]["consistent"]))]


@pytest.mark.parametrize("engine,i", FITTED, ids=[f"{n}-{i}" for n, i in FITTED])
def test_fitted_datapath_stays_below_its_models_bound(engine, i):
    r = DOC["engines"][engine]
    cand = dict(_loosest(r["ladder"]["consistent"])[i])
    op = (r.get("operand") or {}).get("consistent") or []
    if op:
        cand.update({k: v for k, v in op[0].items() if k != "passes" or v != 1})
    eng = M._engine_of(cand)
    k = 1024
    worst = {}
    for kind in ("normal", "positive", "outlier", "cancel"):
        a, b = (x.double() for x in gemm_inputs(kind, OPERAND[r["optype"]], 8, 8, k, seed=len(engine) + i))
        got = E.gemm(a, b, eng)
        for any_model in (False, True):
            spec = _spec(engine, k, any_model)
            x, bound = _bound(spec, a, b)
            worst[(kind, any_model)] = float(((got - x).abs() / bound).max())
    assert max(worst.values()) < 1 / MARGIN, sorted(worst.items(), key=lambda kv: -kv[1])[:2]


# -- the envelope ------------------------------------------------------------------------------

def _row_inputs(row) -> tuple:
    """What a row's inputs are made of: the engines of one operand type share them (one seed)."""
    m, n, k = row["shape"]
    return row["kind"], m, n, k, DOC["engines"][row["engine"]]["optype"]


# rows with the same inputs side by side, so that the two caches below hold each input once
ROWS = sorted((r for r in DOC["envelope"]["rows"] if "unavailable" not in r), key=_row_inputs)


@functools.lru_cache(maxsize=1)
def _inputs_and_measured_stats(kind: str, m: int, n: int, k: int, optype: str) -> tuple:
    a, b = M._inputs(kind, m, n, k, M.OPTYPES[optype], seed=k + len(kind))
    return a, b, _measured_stats(a, b)


@functools.lru_cache(maxsize=2)
def _stats_of_inputs(kind: str, m: int, n: int, k: int, optype: str, bk: int) -> tuple:
    a, b, _ = _inputs_and_measured_stats(kind, m, n, k, optype)
    return _stats(a, b, bk)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['engine']}-{r['K']}-{r['kind']}" for r in ROWS])
def test_measured_envelope_is_well_below_the_bound(row):
    engine = row["engine"]
    k = row["shape"][2]
    _, _, st = _inputs_and_measured_stats(*_row_inputs(row))  # the statistics the recorded ratios are relative to
    err = torch.stack([row["max_err_over_S"] * st["S"], row["max_err_over_L"] * st["L"],
                       row["max_err_over_sqrtV"] * st["V"].sqrt(), row["max_err_over_R"] * st["R"]]).amin(0)
    # a bf16 output's recorded error is what exceeds half an output ulp: the accumulation's own
    for any_model in (False, True):
        spec = _spec(engine, k, any_model)
        x, s, st = _stats_of_inputs(*_row_inputs(row), spec.tile.bk)
        bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, spec.k, st, x_abs=x.abs())
        ratio = float((err / bound).max())
        assert ratio < 1 / MARGIN, (spec.acc_model, ratio)


# -- what the unidentified engines were seen to do ------------------------------------------------

def _examples(engine: str) -> list:
    out = {}
    for fam in ("step", "ladder"):
        for near in DOC["engines"][engine][fam]["nearest"]:
            for ex in near.get("examples", []):
                out[(fam, ex["probe"])] = ex["observed"]
    return sorted(out.items())


@pytest.mark.parametrize("engine", ["cublas_tf32", "triton_bf16x3"])
def test_unidentified_engine_outputs_are_within_their_probes_bounds(engine):
    r = DOC["engines"][engine]
    t = M.OPTYPES[r["optype"]]
    exs = _examples(engine)
    assert len(exs) >= 4
    probes = {"step": M.step_probes(t), "ladder": M.ladder_probes(t, 2048)}
    worst = 0.0
    for (fam, label), observed in exs:
        pr = probes[fam]
        i = pr.labels.index(label)
        a, b = pr.a[i:i + 1], pr.b[i:i + 1].t()
        k = a.shape[1]
        for any_model in (False, True):
            x, bound = _bound(_spec(engine, k, any_model), a, b)
            worst = max(worst, abs(observed - float(x)) / float(bound))
    assert worst < 1 / MARGIN, worst


def test_unidentified_engines_fit_nearby_datapaths_outside_the_grid():
    """What the recorded outputs suggest (not used by the models): cuBLAS TF32 restarting its
    partials every 96 k, Triton bf16x3 in steps of 16 with each k-block's dot added apart."""
    for engine, eng in (("cublas_tf32", E.Engine(mma_k=8, align_bits=25, promotion=96, operand_bits=10)),
                        ("triton_bf16x3", E.Engine(mma_k=16, align_bits=25, promotion=64, operand_bits=7,
                                                   passes=3))):
        t = M.OPTYPES[DOC["engines"][engine]["optype"]]
        probes = {"step": M.step_probes(t), "ladder": M.ladder_probes(t, 2048)}
        for (fam, label), observed in _examples(engine):
            pr = probes[fam]
            i = pr.labels.index(label)
            got = float(E.to_dtype(E.dot(pr.a[i:i + 1], pr.b[i:i + 1], eng), "fp32"))
            assert got == observed, (engine, label, got, observed)

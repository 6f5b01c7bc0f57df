"""The false-alarm benchmark's plumbing on the CPU: cases, the spec each engine gets, planted
defects and the JSON, with the engines replaced by exact float64 GEMMs cast to the output type."""

import os

import pytest
import torch
import bench_scripts  # tests/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    return bench_scripts.load("false_alarms")


F = _module()


def _exact(c, ops):
    """A correct engine: the exact product, the spec's epilogue (bias, scales), one rounding."""
    a, b = ops.a.double(), ops.b.double()
    d = a @ b
    if ops.scale_a is not None:
        d = d * ops.scale_a.double()[:, None] * ops.scale_b.double()[None, :] if ops.scale_a.numel() > 1 else \
            d * float(ops.scale_a.double() * ops.scale_b.double())
    if ops.bias is not None:
        d = d + ops.bias.double()[None, :]
    if c.engine == "cublaslt_relu":
        d = d.clamp(min=0)
    if c.out == "int32":
        return d.to(torch.int32)
    return d.to(torch.float32).to(F.TORCH[c.out])


def test_every_engine_has_cases_and_specs_that_validate():
    cases = F.make_cases()
    assert len(cases) >= 500
    assert {c.engine for c in cases} == set(F.ENGINE)
    assert {c.kind for c in cases} == set(F.KINDS)
    assert max(c.k for c in cases) == 65536 and min(c.m for c in cases) == 1
    assert {(c.a_major, c.b_major) for c in cases} >= {("row", "col"), ("col", "row")}
    F._SPLITK.update({(c.a_dtype, c.m, c.n, c.k, c.a_major, c.b_major): {"boundaries": [], "probed": True}
                      for c in cases})
    for c in cases:
        spec, why = F.spec_for(c, {})
        assert spec.m == c.m and why


def test_a_case_is_the_same_whichever_engines_run():
    every = set(F.make_cases())
    some = F.make_cases(engines={"cublaslt_gelu", "int8"})
    assert some and set(some) <= every and {c.engine for c in some} == {"cublaslt_gelu", "int8"}


@pytest.mark.parametrize("engine", ["cublas_bf16_fp32red", "lt_e4m3_rowwise", "int8", "cublas_addmm"])
def test_correct_case_matches_and_planted_defects_are_found(monkeypatch, engine):
    monkeypatch.setattr(F, "DEV", "cpu")
    e = F.ENGINE[engine]
    c = F.Case(engine, e.a_dtype, e.out, max(40, e.mmin), 144, 256, "row", "col", "normal", 5)
    r = F.run_case(c, {}, run=_exact)
    assert r.error is None, r.error
    assert r.verdict == "MATCH" and r.ratio < 1
    # fp8's narrow accumulator leaves a bound of several % of |D| at K = 256: a 1% tile is below it
    expect = [d for d in r.planted if not (e.a_dtype == "e4m3" and d == "tile x 1.01")]
    assert expect and all(r.planted[d][1] for d in expect), r.planted
    doc = F.summarise([r], 0, 1.0)
    for key in ("correct_cases", "false_diverged", "planted", "detected_right_tile", "environment", "worst_ratio",
                "groups", "planted_table"):
        assert key in doc
    assert doc["false_diverged"] == 0 and doc["planted"] == len(r.planted)


def test_a_wrong_engine_is_a_false_alarm_in_the_counts(monkeypatch):
    monkeypatch.setattr(F, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    c = F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", 6)
    r = F.run_case(c, {}, planted=False, run=lambda c, ops: (_exact(c, ops).float() * 1.05).to(torch.bfloat16))
    doc = F.summarise([r], 0, 1.0)
    assert doc["false_diverged"] == 1 and doc["false_alarms"][0]["verdict"] == "DIVERGED"


def test_shards_merge_into_one_result(monkeypatch, tmp_path):
    monkeypatch.setattr(F, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    paths = []
    for i, seed in enumerate((7, 8)):
        c = F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", seed)
        r = F.run_case(c, {}, planted=False, run=_exact)
        paths.append(str(tmp_path / f"s{i}.json"))
        F.write(F.summarise([r], 0, 1.0), paths[-1])
    out = tmp_path / "all.json"
    assert F.main(["--merge", *paths, "--out", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["correct_cases"] == 2 and doc["false_diverged"] == 0


def test_a_later_run_of_a_case_supersedes_the_earlier_in_a_merge(monkeypatch, tmp_path):
    monkeypatch.setattr(F, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    c = F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", 7)
    wrong = F.run_case(c, {}, planted=False, run=lambda c, ops: (_exact(c, ops).float() * 1.05).to(torch.bfloat16))
    right = F.run_case(c, {}, planted=False, run=_exact)
    failed = F.Result(c, "", "", 0.0, 0.1, "RuntimeError: the engine refused")
    assert (wrong.verdict, right.verdict) == ("DIVERGED", "MATCH")
    for name, r in (("old", wrong), ("new", right), ("failed", failed)):
        F.write(F.summarise([r], 0, 1.0), str(tmp_path / f"{name}.json"))
    out = tmp_path / "all.json"
    assert F.main(["--merge", *(str(tmp_path / f"{n}.json") for n in ("old", "new", "failed")), "--out", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["correct_cases"] == 1 and doc["false_diverged"] == 0 and not doc["errors"]
    assert F.main(["--merge", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--out", str(out)]) == 1


def test_the_gelu_engine_rounds_its_accumulator_before_the_bias():
    e = F.ENGINE["cublaslt_gelu"]
    spec, why = F.spec_for(F.Case(e.name, e.a_dtype, e.out, 64, 128, 256, "col", "col", "outlier", 1), {})
    assert spec.epilogue == ("alpha_beta:bf16", "bias", "activation", "cast") and "measured" in why
    assert (spec.activation, spec.activation_impl) == ("gelu_tanh", "fast")


def test_a_finished_run_skips_what_an_earlier_run_judged(monkeypatch, tmp_path):
    monkeypatch.setattr(F, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    cases = [F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", s) for s in (7, 8, 9)]
    r = F.run_case(cases[1], {}, planted=False, run=_exact)
    F.write(F.summarise([r], 2, 1.0), str(tmp_path / "cut.json"))
    assert F.not_judged(cases, [str(tmp_path / "cut.json")]) == [cases[0], cases[2]]
    assert F.not_judged(cases, []) == cases
    failed = F.Result(cases[0], "", "", 0.0, 0.1, "RuntimeError: the engine refused")
    F.write(F.summarise([failed], 0, 1.0), str(tmp_path / "failed.json"))
    assert F.not_judged(cases, [str(tmp_path / "cut.json"), str(tmp_path / "failed.json")]) == [cases[0], cases[2]]


def test_specs_follow_what_was_measured(monkeypatch):
    import json

    monkeypatch.setattr(F, "_SPLITK", {})
    numerics = json.load(open(os.path.join(ROOT, "benchmarks", "results", "numerics_h200.json")))

    def spec(engine, probe=None, m=64, n=128, k=4096, doc=numerics):
        e = F.ENGINE[engine]
        c = F.Case(engine, e.a_dtype, e.out, m, n, k, "row", "col", "normal", 1)
        if probe is not None:
            F._SPLITK[(c.a_dtype, m, n, k, "row", "col")] = probe
        return F.spec_for(c, doc)[0]

    tf32 = spec("cublas_tf32")
    assert (tf32.acc_model, tf32.reduction, tf32.tile.bk) == ("tf32_rn", "fp32", 32)
    lt = spec("lt_e4m3")
    assert (lt.acc_model, lt.promotion_interval, lt.tile.bk) == ("fp8_promoted", 128, 128)
    assert spec("lt_e4m3", doc={}).acc_model == "any"
    assert spec("lt_e4m3_fast").acc_model == "fp8_fast"
    assert spec("cublas_bf16", {"boundaries": [], "probed": True}).reduction == "fp32"
    assert spec("cublas_bf16", {"boundaries": [], "probed": False}, k=8192).acc_model == "any"
    split = spec("cublas_bf16", {"boundaries": [1024, 2048, 3072], "chunk": 1024, "probed": True})
    assert (split.reduction, split.reduction_chunk) == ("bf16", 1024)
    assert spec("cublas_fp16", {"boundaries": [1000, 2100], "chunk": None, "probed": True}).acc_model == "any"
    assert F._promotion({"engines": {"x": {"fit": {"promotion": [128, None]}}}}, "x") is None


def test_planted_tile_is_a_full_tile_where_there_is_one():
    import numpy as np

    rng = np.random.default_rng(0)
    spec = F.spec_for(F.Case("int8", "int8", "int32", 300, 136, 512, "row", "col", "normal", 1), {})[0]
    tiles = {F._planted_tile(spec, rng) for _ in range(50)}
    assert tiles == {(0, 0), (1, 0)}  # rows 256..299 and columns 128..135 are partial
    one_row = F.spec_for(F.Case("int8", "int8", "int32", 1, 1000, 512, "row", "col", "normal", 1), {})[0]
    assert {F._planted_tile(one_row, rng)[1] for _ in range(50)} <= set(range(7))


def test_cases_run_in_a_seeded_mixed_order():
    cases = F.make_cases()
    assert cases == F.make_cases()
    assert len({c.engine for c in cases[:len(cases) // 10]}) == len(F.ENGINES)


def test_zoo_cases_load_with_their_specs():
    from oracle.run.case import load_case, with_trace

    for path, entry, shapes in F.ZOO:
        for m, n, k in shapes:
            case = with_trace(load_case(os.path.join(ROOT, path), dict(m=m, n=n, k=k), entry=entry), [(0, 0)], (0,))
            assert (case.spec.m, case.spec.n, case.spec.k) == (m, n, k) and case.kernel.entry == entry

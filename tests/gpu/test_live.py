"""Live runs on the GPU: the traced example GEMM judged stage by stage, faults survived, and a
saved live run replayed offline to the same verdict."""

import json
import os
import subprocess
import sys

import pytest

from oracle.run.case import load_case
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.run.live import run_live
from oracle.run.confounds import ConfoundKind

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE = os.path.join(ROOT, "harness", "examples", "simple_gemm.toml")
TRAP = os.path.join(ROOT, "harness", "examples", "fault_trap.toml")


def _live(dtype, m, n, k, ladder="random", seed=1, **extra):
    over = dict(m=m, n=n, k=k, a_dtype=dtype, b_dtype=dtype, out_dtype=dtype, bias_dtype=dtype, **extra)
    case = load_case(CASE, over, entry=f"simple_gemm_{dtype}_traced")
    ops = make_operands(case.spec, ladder, seed)
    live = run_live(case, ops, Provenance(ladder, seed if ladder == "random" else None), timeout_s=120)
    assert live.run.ok, live.run.describe() + live.run.stderr_tail
    return live, analyze(live.recording)


def _stages(an):
    return {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("mnk", [(64, 64, 64), (200, 136, 72), (1, 300, 17), (257, 129, 1000), (8, 1024, 6144)])
def test_correct_kernel_matches_on_every_stage(dtype, mnk):
    live, an = _live(dtype, *mnk)
    assert an.verdict is Verdict.MATCH, _stages(an)
    forced = {s.name for s in an.stages if s.teacher_forced.status.value == "MATCH"}
    chained = {s.name for s in an.stages if s.chained.status.value == "MATCH"}
    # this kernel has no TMA stage: its loads are teacher-forced against global memory
    assert {"load_a", "load_b", "mma", "epilogue_alpha_beta", "epilogue_bias", "epilogue_activation",
            "epilogue_cast", "epilogue_store"} <= forced, _stages(an)
    assert live.recording.trace.complete and not live.recording.trace.relaunched
    assert {"load_a", "load_b", "mma", "epilogue_store"} <= chained, _stages(an)
    assert not an.cross_check


@pytest.mark.parametrize("ladder", ["ones", "index", "ktag"])
def test_controlled_ladders_match(ladder):
    live, an = _live("bf16", 130, 70, 96, ladder=ladder)
    assert an.verdict is Verdict.MATCH, _stages(an)
    if ladder == "ones":
        assert any("holds everywhere" in n for n in live.recording.notes)


def test_a_wrong_alpha_is_localised_to_the_alpha_beta_step(tmp_path):
    case = tmp_path / "alpha.toml"
    text = open(CASE).read().replace('"alpha", "beta"', '{ f32 = 1.5 }, "beta"')
    case.write_text(text.replace('source = "simple_gemm.cu"',
                                 f'source = "{os.path.join(ROOT, "harness", "examples", "simple_gemm.cu")}"'))
    c = load_case(str(case), allow_outside_case_dir=True)
    ops = make_operands(c.spec, "random", 2)
    an = analyze(run_live(c, ops, Provenance("random", 2)).recording)
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "epilogue_alpha_beta"
    assert an.first.kind.value == "VERDICT"


def _cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "oracle", "compare", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cli_live_then_replay_offline_gives_the_same_verdict(tmp_path):
    dump, j1, j2 = tmp_path / "live.safetensors", tmp_path / "live.json", tmp_path / "replay.json"
    r = _cli("--problem", CASE, "--set", "m=77", "--inputs", "random:5", "--save-dump", str(dump), "--json", str(j1))
    assert r.returncode == 0, r.stdout + r.stderr
    r2 = _cli("--dump", str(dump), "--json", str(j2))
    assert r2.returncode == 0, r2.stdout + r2.stderr
    a, b = json.load(open(j1)), json.load(open(j2))
    assert a["verdict"] == b["verdict"] == "MATCH"
    assert [s["teacher_forced"] for s in a["stages"]] == [s["teacher_forced"] for s in b["stages"]]
    assert [s["chained"] for s in a["stages"]] == [s["chained"] for s in b["stages"]]


@pytest.mark.parametrize("entry, code", [("fault_trap", None), ("fault_illegal_address", None),
                                         ("fault_hang", None)])
def test_cli_survives_crashing_and_hanging_kernels(tmp_path, entry, code):
    j = tmp_path / "fault.json"
    r = _cli("--problem", TRAP, "--entry", entry, "--timeout", "15", "--json", str(j))
    assert r.returncode == 3, r.stdout + r.stderr
    doc = json.load(open(j))
    assert doc["verdict"] == "KERNEL_ERROR"
    assert doc["kernel"]["error"]
    assert any("taps from" in n for n in doc["notes"]), doc["notes"]  # taps recovered before the fault


def test_cli_times_both_paths(tmp_path):
    j = tmp_path / "timed.json"
    r = _cli("--problem", CASE, "--set", "m=1024", "--set", "n=1024", "--set", "k=1024", "--time", "--json", str(j))
    assert r.returncode == 0, r.stdout + r.stderr
    perf = json.load(open(j))["performance"]
    names = [p["name"] for p in perf["paths"]]
    assert names[0] == "kernel" and "triton" in names and "cublas" in names, perf
    for p in perf["paths"]:
        assert p["median_ms"] > 0 and p["reps"] >= 10 and p["TFLOPs"] > 0
    assert "OUTPUT CHANGED" not in perf["paths"][0]["note"]
    assert "kernel speed vs" in r.stdout


def test_bench_verifies_then_times_every_case(tmp_path):
    out = tmp_path / "bench.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "oracle", "bench", "--cases", "benchmarks/cases_simple_gemm.toml",
                        "--jsonl", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all(row["verdict"] == "MATCH" for row in rows)
    assert all({"kernel", "triton", "cublas"} <= {p["name"] for p in row["performance"]["paths"]} for row in rows)
    assert all(row["environment"]["gpu"] for row in rows)


def test_a_sink_sized_too_small_is_measured_and_the_kernel_run_again(monkeypatch):
    # an estimate far too small: the first launch overflows, its cursor says what every record
    # needs, and the second launch with a sink of that size records everything
    import dataclasses

    from oracle.run import sink

    real = sink.trace_budget
    monkeypatch.setattr(sink, "trace_budget", lambda *a, **k: dataclasses.replace(real(*a, **k), estimate=1))
    monkeypatch.setattr(sink, "MIN_SINK_BYTES", 64 << 10)
    live, an = _live("bf16", 200, 136, 720)
    rec = live.recording
    assert rec.trace.relaunched and rec.trace.complete, rec.notes
    assert rec.trace.first_capacity == 64 << 10 and rec.trace.capacity >= rec.trace.needed_bytes
    assert an.verdict is Verdict.MATCH and not an.incomplete_trace
    assert any("launched again" in n for n in rec.notes)


def test_a_ceiling_below_the_need_leaves_an_incomplete_trace_and_drafts(monkeypatch):
    import dataclasses

    from oracle.run import sink

    real = sink.trace_budget
    monkeypatch.setattr(sink, "trace_budget",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), estimate=1, least=1))
    monkeypatch.setattr(sink, "MIN_SINK_BYTES", 64 << 10)
    over = dict(m=200, n=136, k=720, a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", bias_dtype="bf16")
    case = load_case(CASE, over, entry="simple_gemm_bf16_traced")
    case = dataclasses.replace(case, trace=dataclasses.replace(case.trace, capacity_mb=1))
    ops = make_operands(case.spec, "random", 1)
    live = run_live(case, ops, Provenance("random", 1), timeout_s=120)
    rec = live.recording
    assert not rec.trace.complete and not rec.trace.relaunched and rec.trace.dropped > 0
    an = analyze(rec)
    assert any(c.kind is ConfoundKind.DROPPED_RECORDS for c in an.open_confounds)
    assert an.verdict is not Verdict.DIVERGED or an.first.kind.value == "DRAFT"

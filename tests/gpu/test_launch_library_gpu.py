"""Launch libraries on the GPU: the simple example brought as a library is judged as its cubin case
is (same output, same stage verdicts); a library that refuses, traps or hangs is KERNEL_ERROR with
its code or the taps recovered; its standalone reproducer runs it through dlopen and judges D."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.run.case import load_case
from oracle.run.inputs import Provenance, make_operands
from oracle.run.live import run_live

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "harness" / "examples"
CUBIN_CASE = EXAMPLES / "simple_gemm.toml"
LIB_CASE = EXAMPLES / "simple_gemm_lib.toml"
TRAP_LIB = EXAMPLES / "fault_trap_lib.toml"


def _stages(an):
    return {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("mnk", [(200, 136, 72), (1, 300, 17), (257, 129, 1000)])
def test_the_library_example_is_judged_as_the_cubin_case_is(dtype, mnk):
    m, n, k = mnk
    over = dict(m=m, n=n, k=k, a_dtype=dtype, b_dtype=dtype, out_dtype=dtype, bias_dtype=dtype)
    cubin_case = load_case(str(CUBIN_CASE), over, entry=f"simple_gemm_{dtype}_traced")
    lib_case = load_case(str(LIB_CASE), over, allow_library=True)
    ops = make_operands(cubin_case.spec, "random", 1)
    prov = Provenance("random", 1)
    by_cubin = run_live(cubin_case, ops, prov, timeout_s=120)
    by_lib = run_live(lib_case, ops, prov, timeout_s=120)
    assert by_lib.run.ok, by_lib.run.describe() + by_lib.run.stderr_tail
    assert by_lib.run.launch_return == 0
    assert torch.equal(by_lib.recording.output.view(torch.uint8), by_cubin.recording.output.view(torch.uint8))
    a_cubin, a_lib = analyze(by_cubin.recording), analyze(by_lib.recording)
    assert a_lib.verdict is a_cubin.verdict is Verdict.MATCH, _stages(a_lib)
    assert _stages(a_lib) == _stages(a_cubin)
    assert len(by_lib.recording.taps) == len(by_cubin.recording.taps)
    assert any("not tapped, so unobserved: descriptor_a, descriptor_b" in n for n in by_lib.recording.notes)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # the examples' own library cases, and fault cases in tmp_path extending them: both opt-ins
    return subprocess.run([sys.executable, "-m", "oracle", "compare", "--allow-library", "--allow-outside-case-dir",
                           *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_compare_of_the_library_example_gives_the_cubin_cases_judgement(tmp_path):
    docs = []
    for case in (CUBIN_CASE, LIB_CASE):
        j = tmp_path / f"{case.stem}.json"
        r = _cli("--problem", str(case), "--inputs", "random:1", "--json", str(j))
        assert r.returncode == 0, r.stdout + r.stderr
        docs.append(json.loads(j.read_text()))
    cubin, lib = docs
    assert lib["verdict"] == cubin["verdict"] == "MATCH"
    assert [(s["name"], s["teacher_forced"], s["chained"]) for s in lib["stages"]] == \
        [(s["name"], s["teacher_forced"], s["chained"]) for s in cubin["stages"]]
    assert any("launch library" in n for n in lib["notes"]), lib["notes"]


def _fault_case(tmp_path: Path, kind: int) -> Path:
    p = tmp_path / f"fault{kind}.toml"
    p.write_text(f'extends = "{TRAP_LIB}"\n[kernel]\ndefines = {{ FAULT_KIND = {kind} }}\n')
    return p


def test_a_library_that_returns_non_zero_is_kernel_error_with_its_code(tmp_path):
    j = tmp_path / "refused.json"
    r = _cli("--problem", str(_fault_case(tmp_path, 2)), "--json", str(j))
    assert r.returncode == 3, r.stdout + r.stderr
    doc = json.loads(j.read_text())
    assert doc["verdict"] == "KERNEL_ERROR"
    assert "oracle_launch returned 7 (this library refuses every problem (FAULT_KIND 2))" in doc["kernel"]["error"]


@pytest.mark.parametrize("kind", [1, 3])
def test_a_library_kernel_that_faults_is_kernel_error_with_the_taps_recovered(tmp_path, kind):
    j = tmp_path / "fault.json"
    r = _cli("--problem", str(_fault_case(tmp_path, kind)), "--timeout", "60", "--json", str(j))
    assert r.returncode == 3, r.stdout + r.stderr
    doc = json.loads(j.read_text())
    assert doc["verdict"] == "KERNEL_ERROR"
    assert ("CUDA_ERROR_LAUNCH_FAILED" if kind == 1 else "CUDA_ERROR_ILLEGAL_ADDRESS") in doc["kernel"]["error"]
    assert any(re.match(r"trace: [1-9]\d* taps from 256 records", n) for n in doc["notes"]), doc["notes"]


def test_a_library_kernel_that_hangs_hits_the_time_limit(tmp_path):
    j = tmp_path / "hang.json"
    r = _cli("--problem", str(_fault_case(tmp_path, 4)), "--timeout", "15", "--json", str(j))
    assert r.returncode == 3, r.stdout + r.stderr
    doc = json.loads(j.read_text())
    assert doc["verdict"] == "KERNEL_ERROR" and "TIMEOUT" in doc["kernel"]["error"]
    assert any("taps from" in n for n in doc["notes"]), doc["notes"]


def test_the_untraced_library_repeats_the_traced_one_and_is_timed(tmp_path):
    j = tmp_path / "repeat.json"
    r = _cli("--problem", str(LIB_CASE), "--repeat", "2", "--json", str(j))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(j.read_text())["verdict"] == "MATCH"
    t = tmp_path / "timed.json"
    r = _cli("--problem", str(LIB_CASE), "--set", "m=1024", "--set", "n=1024", "--set", "k=1024", "--time",
             "--json", str(t))
    assert r.returncode == 0, r.stdout + r.stderr
    kernel = json.loads(t.read_text())["performance"]["paths"][0]
    assert kernel["name"] == "kernel" and kernel["median_ms"] > 0 and "OUTPUT CHANGED" not in kernel["note"]


def test_the_library_reproducer_runs_the_library_and_matches(tmp_path):
    if shutil.which("make") is None or shutil.which("nvcc") is None:
        pytest.skip("The reproducer is built with make and nvcc, which this machine lacks.")
    d = tmp_path / "repro"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "oracle", "repro", "--problem", str(LIB_CASE), "--inputs", "random:1",
                        "--out", str(d), "--allow-library"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for target, exe in (([], "repro"), (["TRACE=1"], "repro_traced")):
        built = subprocess.run(["make", "-C", str(d), *target], capture_output=True, text=True, timeout=1800)
        assert built.returncode == 0, built.stdout + built.stderr
        ran = subprocess.run([str(d / exe)], capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "MATCH" in ran.stdout
    j = tmp_path / "replay.json"
    r = _cli("--repro-dir", str(d), "--json", str(j))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(j.read_text())
    assert doc["verdict"] == "MATCH"
    assert {s["name"]: s["teacher_forced"] for s in doc["stages"]}["mma"] == "MATCH"

"""The oracle from Python: oracle.check / assert_gemm_close / judge / load, the report schema, the
pytest plugin as a foreign project uses it, `python -m oracle env` and `verify`."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import oracle
from foreign_project import run_foreign_tests  # tests/ is on sys.path
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter
from oracle.report import table as report
from oracle.problem.spec import SpecError

pytest_plugins = ["pytester"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gemm(m=100, n=72, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    return a, b, (a.float() @ b.float()).bfloat16()


def test_check_passes_a_correct_result_and_names_a_wrong_tile():
    a, b, d = _gemm()
    rep = oracle.check(a, b, d, tile=(64, 64, 32))
    assert rep.verdict == "MATCH" and rep.ok and rep.first_divergence is None
    bad = d.clone()
    bad[64:, 64:] *= 1.01 ** 40  # one tile wrong
    rep = oracle.check(a, b, bad, tile=(64, 64, 32))
    assert rep.verdict == "DIVERGED" and rep.first_divergence.tile == (1, 1)
    assert rep.first_divergence.stage == "epilogue_store" and "First divergence" in str(rep)
    assert [s.name for s in rep.stages][-1] == "epilogue_store"


def test_check_takes_the_epilogue_from_keywords():
    a, b, _ = _gemm()
    bias = torch.randn(72).bfloat16()
    want = (0.5 * (a.float() @ b.float()) + bias.float()).relu().bfloat16()
    assert oracle.check(a, b, want, bias=bias, alpha=0.5, activation="relu").ok
    assert not oracle.check(a, b, want, bias=bias, alpha=0.75, activation="relu").ok


def test_assert_gemm_close_raises_with_the_report(tmp_path, monkeypatch):
    a, b, d = _gemm()
    oracle.assert_gemm_close(a, b, d)
    monkeypatch.setenv("ORACLE_DUMP_DIR", str(tmp_path))
    with pytest.raises(AssertionError, match="First divergence: epilogue_store") as e:
        oracle.assert_gemm_close(a, b, -d)
    dumps = list(tmp_path.glob("*.safetensors"))
    assert len(dumps) == 1 and str(dumps[0]) in str(e.value)
    again = oracle.judge(oracle.load(str(dumps[0])))
    assert again.verdict == "DIVERGED"


@pytest.mark.parametrize("args, match", [((torch.zeros(4, 5), torch.zeros(6, 3), torch.zeros(4, 3)), "b has 6 rows"),
                                         ((torch.zeros(4, 5), torch.zeros(5, 3), torch.zeros(3, 4)), "d has shape"),
                                         ((torch.zeros(4), torch.zeros(4, 3), torch.zeros(1, 3)), "2-D")])
def test_check_names_tensors_that_make_no_problem(args, match):
    with pytest.raises(SpecError, match=match):
        oracle.check(*args)


def test_reports_follow_the_shipped_schema():
    import jsonschema

    a, b, d = _gemm()
    doc = json.loads(json.dumps(oracle.check(a, b, d * 2).to_json(), default=str))
    report.validate(doc)
    assert report.schema()["$id"] == "oracle.report.table/2"
    broken = dict(doc, verdict="MAYBE")
    with pytest.raises(jsonschema.ValidationError):
        report.validate(broken)
    del broken["verdict"]
    with pytest.raises(jsonschema.ValidationError):
        report.validate(broken)


def test_the_pytest_plugin_reports_and_dumps_in_a_foreign_project(pytester):
    dump_dir = pytester.path / "dumps"
    result = run_foreign_tests(pytester, f"--oracle-dump-dir={dump_dir}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*First divergence: epilogue_store*", "*saved the recording to*"])
    (dump,) = list(dump_dir.glob("*.safetensors"))
    proc = warm_python.run([sys.executable, "-m", "oracle", "compare", "--dump", str(dump), "--quiet"], cwd=ROOT,
                           env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 1  # DIVERGED, replayed offline


def test_env_says_what_a_bug_report_needs():
    proc = warm_python.run([sys.executable, "-m", "oracle", "env", "--json"], cwd=ROOT, capture_output=True,
                           text=True, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    assert {"oracle", "torch", "triton", "cuda_bindings", "nvidia_cutlass", "nvcc", "gpus", "knobs"} <= set(env)
    assert "ORACLE_TRACE_MAX_MB" in env["knobs"]


def test_verify_judges_an_op_over_shapes(tmp_path):
    out = tmp_path / "v.jsonl"
    proc = warm_python.run([sys.executable, "-m", "oracle", "verify", "--op", "torch:matmul", "--shape", "40x24x64",
                            "--shape", "1x130x300", "--dtype", "fp32", "--jsonl", str(out)], cwd=ROOT,
                           capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["verdict"] for r in rows] == ["MATCH", "MATCH"] and [r["index"] for r in rows] == [0, 1]
    assert "[####################] 2/2" in proc.stderr


def test_verify_finds_a_wrong_op(tmp_path):
    mod = tmp_path / "badops.py"
    mod.write_text("import torch\ndef gemm(a, b):\n    d = a @ b\n    d[:1] = 0\n    return d\n")
    proc = warm_python.run([sys.executable, "-m", "oracle", "verify", "--op", "badops:gemm", "--shape", "40x24x64",
                            "--dtype", "fp32"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(tmp_path)))
    assert proc.returncode == 1 and "DIVERGED" in proc.stdout, proc.stdout + proc.stderr
    bad = warm_python.run([sys.executable, "-m", "oracle", "verify", "--op", "nosuchmodule:f", "--shape", "4x4x4"],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


def test_plots_of_a_zoo_defect(tmp_path):
    pytest.importorskip("matplotlib")
    proc = warm_python.run([sys.executable, "-m", "oracle", "compare", "--demo", "--quiet", "--plots", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 1, proc.stderr
    names = {p.name for p in tmp_path.iterdir()}
    assert {"mma_tiles.png", "mma_worst_tile.png", "mma_k_blocks.png", "epilogue_store_tiles.png"} <= names
    assert not any(n.startswith(("load_", "descriptor_")) for n in names)  # those stages match
    assert all((tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_verify_judges_with_a_model_the_dispatched_engine_follows(monkeypatch):
    # torch's cuBLAS flags are patched through oracle.tools.verify.cublas_flags, not on torch's module:
    # pytest >= 9.2 undoes a setattr on it with a delattr, which that module refuses.
    from oracle.tools import verify
    from oracle.tools.verify import CublasFlags, VerifyCase, default_numerics

    monkeypatch.setattr(verify, "cublas_flags", lambda: CublasFlags(False, True, True))
    assert default_numerics(VerifyCase("x", 8, 8, 8, "bf16")) == {"acc_model": "any"}
    assert default_numerics(VerifyCase("x", 8, 8, 8, "fp32")) == {"reduction": "fp32"}
    monkeypatch.setattr(verify, "cublas_flags", lambda: CublasFlags(True, False, False))
    assert default_numerics(VerifyCase("x", 8, 8, 8, "bf16")) == {"reduction": "fp32"}
    assert default_numerics(VerifyCase("x", 8, 8, 8, "fp16")) == {"reduction": "fp32"}
    assert default_numerics(VerifyCase("x", 8, 8, 8, "fp32")) == {"acc_model": "tf32_rn"}
    assert default_numerics(VerifyCase("x", 8, 8, 8, "e4m3", call="scaled_mm", fast_accum=True)) == \
        {"acc_model": "fp8_fast"}
    assert default_numerics(VerifyCase("x", 8, 8, 8, "e4m3", call="scaled_mm")) == {"acc_model": "any"}
    assert default_numerics(VerifyCase("x", 8, 8, 8, "int8")) == {"acc_dtype": "int32"}


def test_a_verify_case_refuses_a_call_its_dtype_cannot_make():
    from oracle.run.case_types import CaseError
    from oracle.tools.verify import VerifyCase

    assert VerifyCase("x", 128, 128, 128, "e4m3", call="scaled_mm_block").call == "scaled_mm_block"
    with pytest.raises(CaseError, match="a block-scaled call takes e4m3 operands, not 'bf16'"):
        VerifyCase("x", 128, 128, 128, "bf16", call="scaled_mm_block")
    with pytest.raises(CaseError, match="a w4a16 call takes an fp16 or bf16 float operand, not 'fp32'"):
        VerifyCase("x", 128, 128, 128, "fp32", call="w4a16", quant={"b_dtype": "int4"})


def test_cublas_flags_follow_torch_through_the_api_it_has():
    """oracle.tools.verify.cublas_flags reads TF32 and the reduced-precision reductions as torch sets them
    (torch >= 2.9: fp32_precision, which refuses a legacy allow_tf32 read once it was set)."""
    import torch

    from oracle.tools.verify import cublas_flags

    m = torch.backends.cuda.matmul
    try:
        before, new_api = m.fp32_precision, True
    except AttributeError:  # torch < 2.9
        before, new_api = m.allow_tf32, False
    before = (before, m.allow_bf16_reduced_precision_reduction)
    try:
        for tf32 in (True, False):
            if new_api:
                m.fp32_precision = "tf32" if tf32 else "ieee"
            else:
                m.allow_tf32 = tf32
            m.allow_bf16_reduced_precision_reduction = not tf32
            flags = cublas_flags()
            assert (flags.tf32, flags.bf16_reduced) == (tf32, not tf32)
    finally:
        if new_api:
            m.fp32_precision = before[0]
        else:
            m.allow_tf32 = before[0]
        m.allow_bf16_reduced_precision_reduction = before[1]


SUMMARY_TEST = '''
import torch

def test_bad(gemm_oracle):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(100, 64, generator=g).bfloat16(); b = torch.randn(64, 72, generator=g).bfloat16()
    d = (a.float() @ b.float()).bfloat16()
    d[69, 17] += 8  # tile (1, 0) of 64 x 64 tiles, element (5, 17) in it
    gemm_oracle.assert_close(a, b, d, tile=(64, 64, 32))
'''


def test_the_pytest_short_summary_names_verdict_stage_tile_and_element(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # pytest cuts the summary line at the terminal's width
    pytester.makepyfile(test_summary=SUMMARY_TEST)
    result = pytester.runpytest_subprocess("-rf", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["FAILED test_summary.py::test_bad - AssertionError: DIVERGED at epilogue_store, "
                                 "tile (1, 0), element (69, 17) (DRAFT)"])

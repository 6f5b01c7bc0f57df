"""GPU tier: a slice of the false-alarm benchmark (benchmarks/false_alarms.py --quick): correct
GEMMs from cuBLAS, cuBLASLt, torch._int_mm and the Triton GEMM are MATCH, and planted defects are
found at their tile."""

import importlib.util
import json
import os
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINES = "cublas_bf16,cublas_bf16_fp32red,cublas_tf32,lt_e4m3,lt_e4m3_fast,int8,triton_bf16"


def _module():
    spec = importlib.util.spec_from_file_location("false_alarms", os.path.join(ROOT, "benchmarks", "false_alarms.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["false_alarms"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_quick_slice_has_no_false_alarm(tmp_path):
    out = tmp_path / "fa.json"
    rc = _module().main(["--quick", "--engines", ENGINES, "--out", str(out), "--budget-s", "50"])
    doc = json.loads(out.read_text())
    assert doc["correct_cases"] > 0 and not doc["errors"], doc["errors"]
    assert doc["false_diverged"] == 0, doc["false_alarms"]
    assert rc == 0
    assert doc["planted"] > 0 and doc["detected"] >= 0.9 * doc["planted"], doc["planted_table"]

"""GPU tier: a slice of the false-alarm benchmark (benchmarks/false_alarms.py --quick, under a
minute): correct GEMMs from cuBLAS, cuBLASLt, torch._int_mm and the Triton GEMM are MATCH, and
planted defects are found at their tile wherever the model can see them (fp8 fast accumulation
over a long K leaves only gross errors catchable: oracle.tolerance.describe says so)."""

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
    rc = _module().main(["--quick", "--engines", ENGINES, "--out", str(out), "--budget-s", "45"])
    doc = json.loads(out.read_text())
    for key in ("correct_cases", "false_diverged", "planted", "detected_right_tile", "environment", "worst_ratio",
                "groups", "planted_table"):
        assert key in doc
    assert doc["correct_cases"] > 0 and not doc["errors"], doc["errors"]
    assert doc["false_diverged"] == 0, doc["false_alarms"]
    assert rc == 0
    seen = [(d, v) for c in doc["cases"] if not (c["problem"]["acc_model"] == "fp8_fast" and c["fields"]["k"] > 4096)
            for d, v in c["planted"].items()]
    assert seen and sum(right for _, (_, right) in seen) >= 0.95 * len(seen), doc["planted_table"]

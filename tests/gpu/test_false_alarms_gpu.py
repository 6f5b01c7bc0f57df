"""GPU tier: a slice of the false-alarm benchmark (benchmarks/false_alarms.py --quick, under a
minute): correct GEMMs from cuBLAS, cuBLASLt, torch._int_mm and the Triton GEMM are MATCH, and
planted defects are found at their tile wherever the model can see them (fp8 fast accumulation
over a long K leaves only gross errors catchable: oracle.judging.accumulation_bound.describe says so)."""

import json
import os

import pytest
import bench_scripts  # tests/ is on sys.path

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINES = "cublas_bf16,cublas_bf16_fp32red,cublas_tf32,lt_e4m3,lt_e4m3_fast,int8,triton_bf16"


def _module():
    return bench_scripts.load("false_alarms")


def test_quick_slice_has_no_false_alarm(tmp_path):
    out = tmp_path / "fa.json"
    rc = _module().main(["--quick", "--engines", ENGINES, "--out", str(out), "--budget-s", "35"])
    doc = json.loads(out.read_text())
    for key in ("correct_cases", "false_diverged", "planted", "detected_right_tile", "environment", "worst_ratio",
                "groups", "planted_table"):
        assert key in doc
    assert doc["correct_cases"] > 0 and not doc["errors"], doc["errors"]
    assert doc["false_diverged"] == 0, doc["false_alarms"]
    assert rc == 0
    gross = [right for c in doc["cases"] if not (c["problem"]["acc_model"] == "fp8_fast" and c["fields"]["k"] > 4096)
             for d, (_, right) in c["planted"].items() if d in ("zeroed tile", "one sign flip", "one NaN")]
    assert gross and sum(gross) >= 0.95 * len(gross), doc["planted_table"]
    # a 1 % tile and a missing 64-deep k-block, on random normal inputs, with the models that see them
    fine = [right for c in doc["cases"] if c["fields"]["kind"] == "normal"
            and c["problem"]["acc_model"] in (None, "fp32", "tf32_rn", "int32")
            for d, (_, right) in c["planted"].items() if d in ("tile x 1.01", "missing k-block")]
    assert fine and sum(fine) >= 0.95 * len(fine), doc["planted_table"]


def test_block_scaled_and_w4a16_engines_have_no_false_alarm(tmp_path):
    """torch._scaled_mm with the three block-scale pairs it takes (1x128 x 1x128, DeepSeek-V3's
    1x128 x 128x128, and 128x128 x 1x128) and torch's tinygemm W4A16, on the quick shapes: each
    judged on every case, none skipped."""
    out = tmp_path / "fa_new.json"
    module = _module()
    block = sorted(module.BLOCK_ROWS)
    engines = ",".join([*block, "tinygemm_w4_g32", "tinygemm_w4_g64", "tinygemm_w4_g128"])
    rc = module.main(["--quick", "--engines", engines, "--out", str(out), "--budget-s", "90", "--w4-probe", ""])
    doc = json.loads(out.read_text())
    assert not doc["errors"], doc["errors"]
    assert doc["false_diverged"] == 0, doc["false_alarms"]
    assert rc == 0
    judged = {c["fields"]["engine"] for c in doc["cases"] if c["verdict"]}
    assert {"tinygemm_w4_g32", "tinygemm_w4_g64", "tinygemm_w4_g128"} <= judged, judged
    assert set(block) <= judged and not doc["skipped"], doc["skipped"]

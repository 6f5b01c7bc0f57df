"""GPU tier: benchmarks/probe_w4a16.py on torch's tinygemm kernel (a few seconds): one of the two
dequant models describes it, and the benchmark's spec follows the choice."""

import pytest
import bench_scripts  # tests/ is on sys.path

pytestmark = pytest.mark.gpu


def test_tinygemm_follows_a_declared_dequant_model():
    probe = bench_scripts.load("probe_w4a16")
    doc = probe.measure(shapes=((1024, 256),), groups=(32, 128), gemm_m=(16,))
    assert doc["choice"] in ("fp32", "operand"), doc["rows"]
    deq = [r for r in doc["rows"] if r["measure"] == "dequant"]
    assert deq and all(r["within_operand_bound"] == 1.0 for r in deq), deq

"""The GEMM benchmark script imports, declares the rows the brief asks for, formats its table, and
says so in a full sentence when no GPU is visible (its measurements are the GPU tier's job)."""

import pytest
import torch

import bench_scripts  # tests/ is on sys.path


def _bench():
    return bench_scripts.load("gemm_bench")


def test_rows_and_table():
    b = _bench()
    assert b.ROWS == (("bf16", 4096), ("bf16", 8192), ("e4m3", 8192)) and b.GOAL == 0.95
    row = {"dtype": "e4m3", "M": 8192, "N": 8192, "K": 8192, "triton_TFLOPs": 1200.0, "cublas_TFLOPs": 1250.0,
           "ratio": 0.96, "meets_goal": True, "fp8_acc": "fast", "config_label": "128x256x128 g8 s3 w8"}
    failed = {"dtype": "bf16", "M": 4096, "N": 4096, "K": 4096, "triton_TFLOPs": None, "cublas_TFLOPs": None,
              "ratio": None, "meets_goal": None, "error": "RuntimeError: no candidate config compiled"}
    text = b._table([row, failed])
    assert "e4m3 (fast)" in text and "0.960" in text and "yes" in text
    assert "RuntimeError: no candidate" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="This test checks the message printed without a GPU.")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert _bench().main(["--out", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err

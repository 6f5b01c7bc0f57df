"""The check benchmark's plumbing at a tiny size on the CPU: every warm check timed and agreeing,
the GEMM beside it, the phases from the report, the profile and the JSON (its measurements are
the GPU tier's job: benchmarks/check_bench.py on the H200)."""

import json

import pytest
import torch

import bench_scripts  # tests/ is on sys.path


def _bench():
    return bench_scripts.load("check_bench")


def test_a_tiny_run_on_the_cpu_writes_every_key(tmp_path, capsys):
    out, prof = tmp_path / "check.json", tmp_path / "prof"
    code = _bench().main(["--device", "cpu", "--sizes", "32", "--warm", "2", "--gemm-reps", "3", "--seed", "7",
                          "--profile", str(prof), "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["seed"] == 7 and len(doc["sizes"]) == 1
    row = doc["sizes"][0]
    assert row["n"] == 32 and row["verdicts_agree"] and row["verdict"] in ("MATCH", "DIVERGED", "MISTRUSTED")
    assert len(row["warm_ms"]["all"]) == 2 and row["warm_ms"]["min"] <= row["warm_ms"]["median"] > 0
    assert row["ratio_to_gemm"] == pytest.approx(row["warm_ms"]["median"] / row["gemm_ms"]["median"])
    assert {"context", "cross_check", "reference_chain", "epilogue_store", "compare"} <= set(row["phases_ms"])
    assert row["goal_ms"] is None and row["meets_goal"] is None and row["reference_gemm_ms"]["median"] > 0
    text = (prof / "check_32.txt").read_text()
    assert "cumulative" in text and "tottime" in text and "check" in text
    assert "phases (ms)" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="This test checks the message printed without a GPU.")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert _bench().main(["--out", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_bad_counts_are_refused(capsys, tmp_path):
    assert _bench().main(["--device", "cpu", "--warm", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert "must be positive" in capsys.readouterr().err

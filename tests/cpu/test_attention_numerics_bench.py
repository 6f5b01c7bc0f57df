"""The attention numerics benchmark's chain family on the CPU (the reference under Triton's
interpreter, exact exp): it measures the error against the float64 specification over one side of the
output model, and says when a bound is not kept."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.numerics import attention as bench

CASES = [("rising_max", 1, 2, 1, 16, 256, 32, "bf16"), ("large_logits", 1, 2, 2, 16, 128, 32, "fp16")]


def test_the_chain_stays_within_one_side_of_the_output_model():
    res = bench.measure_chain(cases=CASES, device="cpu")
    assert res["ok"], res
    rows = res["cases"]
    assert [r["inputs"] for r in rows] == ["rising_max", "large_logits"]
    assert rows[1]["max_score"] > 50  # the large logits reached the scores
    assert all(0 < r["o_err_over_one_side_bound"] <= 1 for r in rows), rows


def test_a_bound_too_tight_for_the_chain_is_reported(monkeypatch):
    real = bench.row_terms

    def tight(*a, **k):
        t = real(*a, **k)
        return dataclasses.replace(t, rel=t.rel * 1e-6, absolute=t.absolute * 1e-6)

    monkeypatch.setattr(bench, "row_terms", tight)
    res = bench.measure_chain(cases=CASES[:1], device="cpu")
    assert not res["ok"] and res["cases"][0]["o_err_over_one_side_bound"] > 1, res


def test_the_script_refuses_to_measure_without_a_gpu(capsys, monkeypatch):
    from benchmarks import measure_attention_numerics as script

    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", "/nonexistent/x.json"]) == 2
    assert "no CUDA device" in capsys.readouterr().err

"""verify without a GPU: the sweep's CPU time is estimated from its sizes and said before the first
case, each case says its own estimate as it starts, and a sweep estimated past ORACLE_CPU_MAX_S is
refused before any case runs, with the reason and how to go past it."""

from __future__ import annotations

import io
import re

import pytest
import torch

from oracle.run.case import CaseError
from oracle.tools import cli, verify
from oracle.tools.verify import VerifyCase, cpu_estimate_s, run_verify


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("ORACLE_CPU_MAX_S", raising=False)


CASES = [VerifyCase("small", 40, 24, 64, "fp32"), VerifyCase("smaller", 8, 8, 32, "fp32")]


def test_a_cpu_sweep_says_its_estimate_first_and_each_case_as_it_starts(cpu):
    out = io.StringIO()
    rows, code = run_verify("torch:matmul", CASES, workers=1, stream=out)
    assert code == 0 and [r["verdict"] for r in rows] == ["MATCH", "MATCH"]
    lines = out.getvalue().splitlines()
    total = sum(cpu_estimate_s(vc) for vc in CASES)
    assert lines[0] == f"no GPU is visible: 2 case(s) judged on the CPU by the Triton interpreter, about {total:.0f} s"
    assert lines[1] == f"1/2 small: 40x24x64, about {cpu_estimate_s(CASES[0]):.0f} s on the CPU"
    assert lines[2].endswith("1/2 small: MATCH")
    assert lines[3].startswith("2/2 smaller: 8x8x32, about")


def test_a_sweep_estimated_past_the_limit_is_refused_before_any_case(cpu, monkeypatch, capsys):
    monkeypatch.setattr(verify, "CPU_MACS_PER_S", 1.0)  # 40 * 24 * 64 multiply-adds: 61440 s
    monkeypatch.setattr(verify, "run_case", lambda *a: pytest.fail("a case ran"))
    with pytest.raises(CaseError, match=r"case 'small', 40x24x64: about 61443 s\), past ORACLE_CPU_MAX_S = 900 s.*"
                                        r"set ORACLE_CPU_MAX_S=\d+ to wait"):
        run_verify("torch:matmul", CASES, workers=1, stream=io.StringIO())
    assert cli.main(["verify", "--op", "torch:matmul", "--shape", "40x24x64", "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: verify: no GPU is visible") and err.count("\n") == 1, err
    need = re.search(r"ORACLE_CPU_MAX_S=(\d+)", err).group(1)
    monkeypatch.setenv("ORACLE_CPU_MAX_S", need)  # the override the message names lets it run
    monkeypatch.setattr(verify, "run_case", lambda op, vc, *_page: {"name": vc.name, "shape": [vc.m, vc.n, vc.k],
                                                          "dtype": vc.dtype, "verdict": "MATCH"})
    rows, code = run_verify("torch:matmul", CASES[:1], workers=1, stream=io.StringIO())
    assert code == 0 and rows[0]["verdict"] == "MATCH"

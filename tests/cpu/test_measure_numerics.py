"""The measurement's probes and fits, run on emulated engines whose datapaths are known: every fit
must contain the true datapath, and a datapath the probes tell apart must not survive."""

import os

import pytest
import torch

from kernels_ref import emulate as E
import bench_scripts  # tests/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    return bench_scripts.load("measure_numerics")


M = _script()


def _true(name):
    return M.KNOWN[name][3]


@pytest.mark.parametrize("name", ["emu_trunc25", "emu_rn24_unfused", "emu_fp8_14_fast", "emu_tf32_rna"])
def test_fit_recovers_the_emulated_datapath(name):
    res = M.measure([name], quick=True, emulate=True, families=("engines",))
    r = res["engines"][name]
    assert r["ok"], r
    eng = _true(name)
    fits = r["ladder"]["consistent"]
    key = (eng.mma_k, eng.fused, eng.align_bits, eng.align_round, eng.acc_bits, eng.acc_round)
    assert key in {(c["mma_k"], c["fused"], c["align_bits"], c["align_round"], c["acc_bits"], c["acc_round"])
                   for c in fits}
    assert r["fit"]["align_bits_min"] <= eng.align_bits
    assert res["failures"] == []
    if name == "emu_tf32_rna":
        assert r["operand"]["consistent"] == [{"operand_bits": 10, "operand_round": "rna", "passes": 1}]


def test_promotion_interval_is_found():
    res = M.measure(["emu_fp8_13_p128"], quick=True, emulate=True, families=("engines",))
    assert res["engines"]["emu_fp8_13_p128"]["fit"]["promotion"] == [128]


def test_an_inexpressible_engine_fails_loudly():
    """Outputs no candidate reproduces (a datapath outside the grid) are reported, not fitted."""
    ad = M.emulated_adapters()["emu_trunc25"]
    wild = E.Engine(mma_k=16, align_bits=19, align_round="rna", acc_bits=19, acc_round="rna")
    ad.diag = lambda pr, multiple=128: E.to_dtype(E.dot(pr.a, pr.b, wild), "fp32")
    r = M.measure_engine(ad, torch.device("cpu"), quick=True)
    assert r["ok"] is False
    assert r["step"]["nearest"] and r["step"]["nearest"][0]["mismatches"] > 0
    assert M.failures({"engines": {"x": r}})


def test_probe_operands_are_exact_in_their_type():
    for t in M.OPTYPES.values():
        pr = M.step_probes(t, quick=True)
        for x in (pr.a, pr.b):
            assert torch.equal(x.to(torch.float32).to(t.torch).double(), x), t.name
        assert torch.all((pr.a * pr.b).abs().max(1).values > 0)


def _splitk_mm(chunk, dtype_name, sum_dtype):
    """torch.mm as a split-K engine: partials over `chunk` k rounded to the output type."""
    def mm(a, b, reduced):
        a64, b64 = a.double(), b.double()
        K = a.shape[1]
        if not reduced or chunk >= K:
            return (a64 @ b64).to(torch.float32).to(a.dtype)
        total = None
        for c0 in range(0, K, chunk):
            part = E.to_dtype(a64[:, c0:c0 + chunk] @ b64[c0:c0 + chunk], dtype_name)
            total = part if total is None else E.to_dtype(total + part, sum_dtype)
        return total.to(torch.float32).to(a.dtype)
    return mm


@pytest.mark.parametrize("dtype_name,sum_dtype", [("bf16", "fp32"), ("fp16", "fp16")])
def test_splitk_boundaries_rounding_and_sum_type(monkeypatch, dtype_name, sum_dtype):
    monkeypatch.setattr(M, "DEV", "cpu")
    monkeypatch.setattr(M, "_mm", _splitk_mm(1024, dtype_name, sum_dtype))
    res = M.measure_splitk(dtype_name, [(32, 64, 4096), (16, 32, 512)])
    big, small = res["shapes"]
    assert big["boundaries"] == [1024, 2048, 3072] and big["partials"] == 4 and big["chunk"] == 1024
    assert big["partial_rounding"] == "rn"
    assert big["partial_sum"] == ("fp32" if sum_dtype == "fp32" else "output precision")
    assert big["outlier_differs"] > 0 and big["explained"]
    assert small["boundaries"] == [] and small["outlier_differs"] == 0 and small["explained"]
    assert res["ok"]

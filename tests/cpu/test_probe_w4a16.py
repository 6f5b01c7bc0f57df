"""benchmarks/probe_w4a16.py on the CPU, with emulated tinygemm kernels: the candidates it compares,
and the dequant_precision it chooses from what it measures."""

import pytest
import torch
import bench_scripts  # tests/ is on sys.path

F = bench_scripts.load("false_alarms")
P = bench_scripts.load("probe_w4a16")


def _kernel(dequant):
    def run(c, ops):
        from kernels_ref import dequant as dq

        cfg = dq.DequantConfig("uint4", "bf16", "bf16", F.W4_GROUP[c.engine], "k_pairs_high_first", "float_offset")
        q = dq.values_of_codes(dq.unpack_host(ops.b, cfg), "uint4")
        g = torch.arange(c.k) // cfg.group_size
        w = dequant(q - 8, ops.b_scales.double()[g], ops.b_zeros.double()[g])
        return (ops.a.double() @ w.double()).to(torch.bfloat16)
    return run


FP32 = _kernel(lambda t, s, z: ((t * s).float() + z.float()).to(torch.bfloat16))
BF16_STEPS = _kernel(lambda t, s, z: ((t * s).to(torch.bfloat16).float() + z.float()).to(torch.bfloat16))
NO_OFFSET = _kernel(lambda t, s, z: (t * s).to(torch.bfloat16))


def test_one_rounding_in_float64_is_not_torch_s_double_rounding():
    x = torch.tensor([1 + 2.0**-8 + 2.0**-30, 3.0, 0.0, -(1 + 2.0**-8)], dtype=torch.float64)
    assert P.round_bf16_once(x).tolist() == [1 + 2.0**-7, 3.0, 0.0, -1.0]  # the last: a tie, to even


@pytest.mark.parametrize("kernel,choice", [(FP32, "fp32"), (BF16_STEPS, "operand"), (NO_OFFSET, "none")])
def test_the_choice_follows_the_measurement(monkeypatch, kernel, choice):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    doc = P.measure(run=kernel, shapes=((256, 16),), groups=(32,), gemm_m=(4,))
    deq = next(r for r in doc["rows"] if r["measure"] == "dequant")
    if choice == "fp32":
        assert deq["bit_exact_fp32"] == 1.0
    if choice == "operand":
        assert deq["bit_exact_operand"] == 1.0 and deq["bit_exact_fp32"] < 1.0
    assert doc["choice"] == choice, doc["rows"]
    spec_numerics = {"engines": doc["engines"]}
    c = F.Case("tinygemm_w4_g32", "bf16", "bf16", 4, 16, 256, "row", "col", "normal", 1)
    assert F.spec_for(c, spec_numerics)[0].dequant_precision == (choice if choice != "none" else "operand")

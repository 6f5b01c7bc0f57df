"""The engine emulator's rules, each against an independent statement on hand-made sums."""

import pytest
import torch

from kernels_ref import emulate as E


def _dot(products, eng):
    p = torch.tensor([products], dtype=torch.float64)
    return float(E.dot(p, torch.ones_like(p), eng)[0])


U = 2.0 ** -23


def test_alignment_truncates_below_the_kept_bits():
    # one big product and a small one in the same step: the small one keeps align_bits - j bits
    assert _dot([1.0, 1.5 * 2.0 ** -24], E.Engine(align_bits=23)) == 1.0
    assert _dot([1.0, 1.5 * 2.0 ** -24], E.Engine(align_bits=25, acc_round="rn")) == 1.0 + U
    assert _dot([1.0, 1.5 * 2.0 ** -24], E.Engine(align_bits=25)) == 1.0  # the sum truncates to fp32
    assert _dot([1.0] + [2.0 ** -25] * 8, E.Engine(align_bits=25)) == 1.0 + 2 * U
    assert _dot([1.0] + [2.0 ** -25] * 8, E.Engine(align_bits=24)) == 1.0


def test_truncation_is_toward_zero_for_both_signs():
    eng = E.Engine(align_bits=40)
    assert _dot([1.0, 0.75 * U], eng) == 1.0
    assert _dot([-1.0, -0.75 * U], eng) == -1.0
    assert _dot([1.0, -0.25 * U], eng) == 1.0 - U / 2  # below 1 the spacing halves
    rn = E.Engine(align_bits=40, acc_round="rn")
    assert _dot([1.0, 0.75 * U], rn) == 1.0 + U and _dot([-1.0, -0.75 * U], rn) == -1.0 - U


def test_fused_accumulator_joins_the_next_steps_alignment():
    prods = [1.0] + [0.0] * 15 + [2.0 ** -25] * 4 + [0.0] * 12
    assert _dot(prods, E.Engine(align_bits=24)) == 1.0  # aligned against the accumulator: lost
    assert _dot(prods, E.Engine(align_bits=24, fused=False, acc_round="rn")) == 1.0 + U  # summed first


def test_promotion_restarts_the_narrow_accumulator():
    prods = [256.0] + [2.0 ** -6] * 63  # 2^-6 is below 13 bits of 256
    narrow = E.Engine(mma_k=32, align_bits=13, acc_bits=13)
    assert _dot(prods, narrow) == 256.0
    assert _dot(prods, narrow.with_(promotion=32)) == 256.0 + 32 * 2.0 ** -6  # the second chunk survives


def test_operand_rounding_and_three_passes():
    a = torch.tensor([[1.0 + 2.0 ** -11 + 2.0 ** -20]], dtype=torch.float64)
    b = torch.ones_like(a)
    assert float(E.dot(a, b, E.Engine(operand_bits=10, operand_round="trunc", align_bits=40))[0]) == 1.0
    assert float(E.dot(a, b, E.Engine(operand_bits=10, operand_round="rn", align_bits=40))[0]) == 1.0 + 2.0 ** -10
    x3 = E.Engine(operand_bits=10, operand_round="rn", passes=3, align_bits=40, acc_round="rn")
    assert float(E.dot(a, b, x3)[0]) == float(a[0, 0].to(torch.float32))
    tie = torch.tensor([[1.0 + 2.0 ** -11]], dtype=torch.float64)
    assert float(E.dot(tie, torch.ones_like(tie), E.Engine(operand_bits=10, operand_round="rna", align_bits=40))[0]) \
        == 1.0 + 2.0 ** -10
    assert float(E.dot(tie, torch.ones_like(tie), E.Engine(operand_bits=10, operand_round="rn", align_bits=40))[0]) \
        == 1.0


def test_split_k_partials_round_to_the_reduction_type():
    prods = [1024.0, 1.0] + [0.0] * 14 + [-1024.0] + [0.0] * 15
    eng = E.Engine(align_bits=40, acc_round="rn", reduction=E.Reduction("bf16", 16, "fp32"))
    assert _dot(prods, eng) == 0.0  # 1025 rounds to 1024 in bf16
    assert _dot(prods, eng.with_(reduction=E.Reduction("fp32", 16))) == 1.0


def test_gemm_equals_rowwise_dots():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 100, generator=g, dtype=torch.float64).to(torch.bfloat16).double()
    b = torch.randn(100, 3, generator=g, dtype=torch.float64).to(torch.bfloat16).double()
    eng = E.Engine(mma_k=16, align_bits=24)
    rows = E.dot(a[:, None, :].expand(5, 3, 100), b.t()[None].expand(5, 3, 100), eng)
    assert torch.equal(E.gemm(a, b, eng), rows)


def test_invalid_engines_name_the_field():
    with pytest.raises(E.EngineError, match="promotion=48 is not allowed"):
        E.Engine(mma_k=32, promotion=48)
    with pytest.raises(E.EngineError, match="align_round='up'"):
        E.Engine(align_round="up")
    with pytest.raises(E.EngineError, match="passes=3 is not allowed"):
        E.Engine(passes=3)


def _operand_sets():
    g = torch.Generator().manual_seed(5)
    normal = torch.randn(6, 256, generator=g, dtype=torch.float64)
    wide = normal * torch.exp2(torch.randint(-40, 40, (6, 256), generator=g).double())  # magnitudes 2^-40..2^40
    cancel = torch.cat([normal[:, :128], -normal[:, :128]], 1)  # sums that return to zero, or nearly
    zeros = normal.clone()
    zeros[:, ::3] = 0.0
    zeros[:, 1::7] = -0.0
    fp8 = normal.to(torch.float8_e4m3fn).double()
    return {"normal": (normal, normal.flip(1)), "wide": (wide, normal), "cancel": (cancel, normal),
            "zeros": (zeros, normal), "fp8": (fp8, fp8.flip(0))}


ENGINES = [E.Engine(), E.Engine(fused=False, align_round="rn", acc_round="rn"),
           E.Engine(mma_k=4, align_bits=25, align_round="rna", acc_bits=24, acc_round="rna"),
           E.Engine(mma_k=32, align_bits=13, acc_bits=13, promotion=128),
           E.Engine(operand_bits=7, passes=3, acc_round="rn"),
           E.Engine(mma_k=16, reduction=E.Reduction("bf16", 64, "fp32"))]


@pytest.mark.parametrize("eng", ENGINES, ids=lambda e: e.describe()[:60])
def test_the_plain_parameter_step_is_bit_identical_to_the_general_one(eng, monkeypatch):
    """Engines of plain parameters take a faster step (kernels_ref.emulate._step_scalar) when the
    operands are finite and of normal magnitude; every output is the general step's, bit for bit."""
    sets = _operand_sets()
    fast = {k: E.dot(a, b, eng) for k, (a, b) in sets.items()}
    assert all(E._fast_path(a, b, eng) for a, b in sets.values())
    monkeypatch.setattr(E, "_fast_path", lambda a, b, eng: False)
    for k, (a, b) in sets.items():
        slow = E.dot(a, b, eng)
        assert torch.equal(fast[k].view(torch.int64), slow.view(torch.int64)), (k, eng.describe())


def test_the_fast_step_is_not_taken_outside_its_range():
    a = torch.ones(2, 32, dtype=torch.float64)
    eng = E.Engine()
    assert E._fast_path(a, a, eng)
    for bad in (float("nan"), float("inf"), 2.0 ** -1060, 2.0 ** 400):  # NaN, Inf, subnormal, huge
        b = a.clone()
        b[1, 3] = bad
        assert not E._fast_path(a, b, eng), bad
    assert not E._fast_path(a, a, eng.with_(acc_bits=torch.tensor([23, 10])))  # batched parameters

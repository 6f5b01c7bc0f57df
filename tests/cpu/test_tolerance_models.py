"""Each accumulation model's bound against float64 emulations of the engines it describes
(kernels_ref.emulate, with the model's own constants): correct engines stay below the bound on
random, all-positive, outlier-channel and cancelling inputs up to K = 65536; a datapath narrower
than the model exceeds it; planted output defects at K = 65536 with bf16 output exceed it in the
tile that holds them, and only there."""

import math

import pytest
import torch

from kernels_ref import emulate as E
from kernels_ref import mma as X
from oracle.judging import accumulation_bound, accumulation_models, bound_stats, hardware_numerics, tolerance as T
from oracle.judging.compare import Status, compare
from oracle.problem.spec import ACC_MODELS, ProblemSpec, Tile
from benchmarks.numerics.inputs import gemm_inputs

BK = 64


def _hwv(key):
    return int(hardware_numerics.hw(key).value)


def _tc16(**kw):
    base = dict(mma_k=_hwv("tc16.mma_k"), align_bits=_hwv("tc16.align_bits"),
                align_round="trunc" if _hwv("tc16.align_trunc") else "rn",
                acc_round="trunc" if _hwv("tc16.acc_trunc") else "rn")
    base.update(kw)
    return E.Engine(**base)


def _fp8(**kw):
    base = dict(mma_k=_hwv("fp8.mma_k"), align_bits=_hwv("fp8.align_bits"), acc_bits=_hwv("fp8.acc_bits"),
                align_round="trunc", acc_round="trunc")
    base.update(kw)
    return E.Engine(**base)


def _tf32(**kw):
    base = dict(mma_k=_hwv("tf32.mma_k"), align_bits=_hwv("tf32.align_bits"), operand_bits=10,
                operand_round="trunc" if _hwv("tf32.operand_trunc") else "rn")
    base.update(kw)
    return E.Engine(**base)


FMA = E.Engine(mma_k=1, align_bits=40, align_round="rn", acc_round="rn")


def _stats(a, b, bk=BK, chunk=None):
    """Exact float64 statistics and S (the reference computes the same in fp32)."""
    a64, b64 = a.double(), b.double()
    k = a.shape[1]
    x = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    sp = bound_stats.SpanStats(x)
    s = torch.zeros_like(x)
    pabs, prun, mark = torch.zeros_like(x), torch.zeros_like(x), torch.zeros_like(x)
    for j, k0 in enumerate(range(0, k, bk)):
        sb = a64[:, k0:k0 + bk].abs() @ b64[k0:k0 + bk].abs()
        x = x + a64[:, k0:k0 + bk] @ b64[k0:k0 + bk]
        sp.add(sb, x)
        s += sb
        if chunk and ((k0 + bk) % chunk == 0 or k0 + bk >= k):
            pabs += (x - mark).abs()
            prun += x.abs()
            mark = x
    q = (a64 * a64) @ (b64 * b64)
    return x, s, bound_stats.Stats(sp.l, sp.v, q, pabs if chunk else None, prun if chunk else None)


def _spec(dtype, k, **kw):
    kw.setdefault("acc_model", None)
    return ProblemSpec(m=8, n=8, k=k, a_dtype=dtype, b_dtype=dtype, tile=Tile(128, 128, kw.pop("bk", BK)), **kw)


def _ratio(spec, got, a, b, chunk=None):
    """max |engine - reference| / bound, the reference being the oracle's own host spec."""
    ref = X.mma_accumulate_host(a, b, 8, 8, spec.tile.bk, acc=spec.acc_dtype,
                                promotion_interval=spec.promotion_interval)
    _, s, st = _stats(a, b, spec.tile.bk, chunk)
    bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, spec.k, st, x_abs=ref.abs())
    return float(((got - ref).abs() / bound).max())


CASES = [
    # (dtype, spec kwargs, engine, what)
    ("bf16", {}, _tc16(), "tensor core at the model's constants"),
    ("bf16", {}, _tc16(fused=False, mma_k=8), "unfused, 8 per step"),
    ("bf16", {}, _tc16(align_round="rn", acc_round="rn"), "rounding to nearest"),
    ("bf16", {}, _tc16(reduction=E.Reduction("fp32", 1024)), "split-K in fp32"),
    ("fp16", {}, _tc16(), "fp16 operands"),
    ("fp32", {}, FMA, "fma chain"),
    ("fp32", dict(acc_model="tf32"), _tf32(), "TF32"),
    ("fp32", dict(acc_model="tf32"), _tf32(operand_round="rna"), "TF32, operands to nearest away"),
    ("fp32", dict(acc_model="tf32"), _tf32(operand_round="rn"), "TF32 to nearest judged as tf32"),
    ("fp32", dict(acc_model="tf32_rn"), _tf32(operand_round="rn"), "TF32 to nearest (cuBLAS)"),
    ("fp32", dict(acc_model="tf32_rn", bk=32), _tf32(operand_round="rn", promotion=96),
     "TF32 to nearest, partials restarted every 96 k (what cuBLAS's ladders fit)"),
    ("fp32", dict(acc_model="tf32x3"), _tf32(passes=3, operand_round="rn"), "tf32x3"),
    ("fp32", dict(acc_model="bf16x3"), _tc16(operand_bits=7, passes=3, operand_round="rn"), "bf16x3"),
    ("fp32", dict(acc_model="bf16x3"), _tc16(operand_bits=7, passes=3, operand_round="trunc", promotion=64),
     "bf16x3 in steps of 16, each k-block added apart (what its recorded outputs fit)"),
    ("e4m3", dict(acc_model="fp8_fast"), _fp8(), "fp8 without promotion"),
    ("e4m3", dict(acc_model="fp8_promoted", promotion_interval=64), _fp8(promotion=64), "fp8 promoted every 64"),
    ("e4m3", dict(acc_model="fp8_promoted", promotion_interval=128, bk=128), _fp8(promotion=128), "every 128"),
    ("bf16", dict(reduction="bf16", reduction_chunk=1024), _tc16(reduction=E.Reduction("bf16", 1024, "bf16")),
     "split-K partials and sums in bf16"),
    ("fp16", dict(reduction="fp16", reduction_chunk=512), _tc16(reduction=E.Reduction("fp16", 512, "fp32")),
     "split-K partials in fp16"),
    ("fp16", dict(acc_dtype="fp16"), _tc16(fused=False, acc_bits=10, acc_round="rn"), "fp16 accumulator"),
]


@pytest.mark.parametrize("dtype,kw,eng,what", CASES, ids=[c[3] for c in CASES])
@pytest.mark.parametrize("kind", ["normal", "positive", "outlier", "cancel"])
def test_correct_engine_stays_below_the_bound(dtype, kw, eng, what, kind):
    k = 4096
    a, b = gemm_inputs(kind, dtype, 8, 8, k, seed=hash(what) % 1000)
    spec = _spec(dtype, k, **kw)
    got = E.gemm(a.double(), b.double(), eng)
    assert _ratio(spec, got, a, b, spec.reduction_chunk) < 1.0
    if dtype != "int8":
        anyspec = _spec(dtype, k, **dict(kw, acc_model="any"))
        assert _ratio(anyspec, got, a, b, spec.reduction_chunk) < 1.0, "the loosest model must hold too"


@pytest.mark.parametrize("dtype,kw,eng", [
    ("bf16", {}, _tc16()),
    ("e4m3", dict(acc_model="fp8_fast"), _fp8()),
    ("bf16", dict(reduction="bf16", reduction_chunk=8192), _tc16(reduction=E.Reduction("bf16", 8192, "bf16"))),
])
@pytest.mark.parametrize("kind", ["normal", "positive"])
def test_correct_engine_at_k_65536(dtype, kw, eng, kind):
    k = 65536
    a, b = gemm_inputs(kind, dtype, 4, 4, k, seed=7)
    spec = _spec(dtype, k, **kw)
    got = E.gemm(a.double(), b.double(), eng)
    assert _ratio(spec, got, a, b, spec.reduction_chunk) < 1.0


def test_a_narrower_datapath_than_declared_exceeds_the_bound():
    """fp8's narrow accumulator judged as fp32, bf16 partials judged as fp32 accumulation, fp16
    accumulation judged as fp32: the bound must not cover them."""
    k = 4096
    a, b = gemm_inputs("positive", "e4m3", 8, 8, k, 1)
    assert _ratio(_spec("e4m3", k), E.gemm(a.double(), b.double(), _fp8()), a, b) > 2
    a, b = gemm_inputs("outlier", "bf16", 8, 8, k, 2)
    got = E.gemm(a.double(), b.double(), _tc16(reduction=E.Reduction("bf16", 1024, "bf16")))
    assert _ratio(_spec("bf16", k), got, a, b) > 2
    a, b = gemm_inputs("positive", "fp16", 8, 8, k, 3)
    got = E.gemm(a.double(), b.double(), _tc16(fused=False, acc_bits=10, acc_round="rn"))
    assert _ratio(_spec("fp16", k), got, a, b) > 2


def test_promotion_bound_is_tighter_than_fast():
    k = 4096
    a, b = gemm_inputs("normal", "e4m3", 8, 8, k, 4)
    _, s, st = _stats(a, b)
    fast = accumulation_bound.mma_bound(_spec("e4m3", k, acc_model="fp8_fast"), torch.zeros_like(s), s, k, st)
    promoted = _spec("e4m3", k, acc_model="fp8_promoted", promotion_interval=64)
    prom = accumulation_bound.mma_bound(promoted, torch.zeros_like(s), s, k, st)
    assert torch.all(prom < fast)


def test_int32_model_is_exact():
    s = torch.ones(4, 4)
    spec = ProblemSpec(m=4, n=4, k=64, a_dtype="int8", b_dtype="int8", acc_dtype="int32", out_dtype="int32")
    bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, 64)
    assert torch.equal(bound, torch.zeros(4, 4, dtype=torch.float64))
    y = torch.tensor([3.0, 2.0**24 + 2, -(2.0**30)])
    assert T.cast_bound(torch.zeros(3, dtype=torch.float64), y, "int32").tolist() == [0.0, 2.0, 128.0]


def test_every_model_the_spec_allows_has_a_table_entry_and_sourced_constants():
    from oracle.problem.spec import OPERAND_DTYPES, SpecError

    for name in ACC_MODELS:
        for d in OPERAND_DTYPES:
            acc = {"fp16": "fp16", "int32": "int32"}.get(name, "int32" if d == "int8" else "fp32")
            kw = dict(promotion_interval=32) if name == "fp8_promoted" else {}
            try:
                spec = ProblemSpec(m=4, n=4, k=64, a_dtype=d, b_dtype=d, acc_dtype=acc, acc_model=name,
                                   out_dtype="int32" if d == "int8" else "bf16", **kw)
            except SpecError:
                continue
            model = accumulation_models.resolved_model(spec)
            for key in model.keys():
                c = hardware_numerics.hw(key)
                assert c.measured or c.stand_in or c.measure_key, \
                    f"{key}: an UNMEASURED constant must name its measurement"
            assert "accumulation model" in accumulation_bound.describe(spec)
    with pytest.raises(hardware_numerics.ToleranceError):
        accumulation_models.acc_model("tf32", "bf16")
    with pytest.raises(hardware_numerics.ToleranceError):
        hardware_numerics.hw("tc16.nothing")


def test_fast_activation_constant():
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    y = x * torch.sigmoid(x)
    own, _ = T.activation_step(x, y, "silu", "fast")
    acc, _ = T.activation_step(x, y, "silu")
    assert torch.all(own >= acc)
    with pytest.raises(hardware_numerics.ToleranceError):
        T.activation_ulps("silu", "approx")


# -- planted output defects at K = 65536, bf16 output ------------------------------------------

TILE = 128


def _output_case(kind, seed=11, m=256, n=256, k=65536):
    """A correct blocked fp32 engine's bf16 output, the reference's bf16 output and the bound
    epilogue_store holds the output to."""
    a, b = gemm_inputs(kind, "bf16", m, n, k, seed)
    a32, b32 = a.float(), b.float()
    acc = torch.zeros(m, n, dtype=torch.float32)
    blocks = []
    for k0 in range(0, k, BK):
        p = a32[:, k0:k0 + BK] @ b32[k0:k0 + BK]
        blocks.append(p[:TILE, :TILE].clone() if k0 // BK == 517 else None)
        acc = acc + p
    x, s, st = _stats(a, b)
    spec = _spec("bf16", k)
    bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, k, st)
    own, gain = T.alpha_beta_step(x, None, 1.0, 0.0)
    bound = gain * bound + own
    y = x.float().to(torch.bfloat16)
    bound = T.cast_bound(bound, y.double(), "bf16")
    block = next(bl for bl in blocks if bl is not None)
    return acc, y, bound, block


@pytest.fixture(scope="module")
def normal_case():
    return _output_case("normal")


def _judge(out_fp32, y, bound):
    return compare(out_fp32.to(torch.bfloat16), y, bound=bound, tile_shape=(TILE, TILE))


def _plant(acc, block, defect):
    """The accumulator with one planted defect, and the tile that holds it."""
    out = acc.clone()
    if defect == "zeroed tile":
        out[TILE:2 * TILE, :TILE] = 0
        return out, (1, 0)
    if defect == "tile x 1.01":
        out[:TILE, TILE:2 * TILE] *= 1.01
        return out, (0, 1)
    if defect == "one sign flip":
        out[TILE + 5, TILE + 9] *= -1
        return out, (1, 1)
    if defect == "missing k-block":
        out[:TILE, :TILE] -= block
        return out, (0, 0)
    out[3, TILE + 4] = float("nan")
    return out, (0, 1)


def test_correct_output_matches_at_k_65536(normal_case):
    acc, y, bound, _ = normal_case
    c = _judge(acc, y, bound)
    assert c.status is Status.MATCH, c.worst.max_ratio
    assert c.worst.max_ratio <= 1.0


@pytest.mark.parametrize("defect", ["zeroed tile", "tile x 1.01", "one sign flip", "missing k-block", "one NaN"])
def test_planted_defect_is_found_in_its_tile_at_k_65536(normal_case, defect):
    acc, y, bound, block = normal_case
    out, tile = _plant(acc, block, defect)
    c = _judge(out, y, bound)
    assert c.status is Status.MISMATCH
    assert {t.tile for t in c.tiles if not t.passed} == {tile}


def test_all_positive_k_65536_tile_scaled_is_found_and_correct_matches():
    """All-positive inputs: the truncation bias grows linearly, and a missing 64-deep k-block
    (64/65536 of the sum) is below bf16's resolution: only the defects the output can show."""
    acc, y, bound, block = _output_case("positive", m=128, n=256)
    assert _judge(acc, y, bound).status is Status.MATCH
    out, tile = _plant(acc, block, "tile x 1.01")
    c = _judge(out, y, bound)
    assert {t.tile for t in c.tiles if not t.passed} == {tile}
    rel = float((block.double().abs() / y[:TILE, :TILE].double().abs()).max())
    assert rel < 2.0 ** -8  # why the missing block cannot be seen here


def test_the_old_sqrt_k_bound_would_miss_what_this_one_finds(normal_case):
    """The motivating case: 2 * 8 * 2^-23 sqrt(K) S, the bound this replaces."""
    acc, y, bound, block = normal_case
    a, b = gemm_inputs("normal", "bf16", 256, 256, 65536, 11)
    s = (a.double().abs() @ b.double().abs())
    old = T.cast_bound(2 * 8 * 2.0 ** -23 * math.sqrt(65537) * s, y.double(), "bf16")
    out, _ = _plant(acc, block, "tile x 1.01")
    assert _judge(out, y, old).status is Status.MATCH
    assert _judge(out, y, bound).status is Status.MISMATCH


def test_a_narrow_accumulator_over_a_long_k_is_said_to_catch_only_gross_errors():
    long = _spec("e4m3", 65536, acc_model="fp8_fast")
    assert "catching only gross errors" in accumulation_bound.describe(long)
    promoted = _spec("e4m3", 65536, acc_model="fp8_promoted", promotion_interval=64)
    assert "catching only gross errors" not in accumulation_bound.describe(promoted)
    assert "catching only gross errors" not in accumulation_bound.describe(_spec("bf16", 65536))
    assert accumulation_models.TC16.growth(65536 / _hwv("tc16.mma_k")) < 1.02


def test_operand_rounding_terms():
    """TF32 operands: rounding to nearest is a random walk over the products; truncation adds a
    bias that follows |D| (without the reference's sum the bound falls back to c S, the
    deterministic bound)."""
    k = 4096
    a, b = gemm_inputs("normal", "fp32", 8, 8, k, 21)
    x, s, st = _stats(a, b)
    z = torch.zeros_like(s)

    def bound(model, **kw):
        return accumulation_bound.mma_bound(_spec("fp32", k, acc_model=model), z, s, k, st, **kw)

    trunc, trunc_s, rn = bound("tf32", x_abs=x.abs()), bound("tf32"), bound("tf32_rn", x_abs=x.abs())
    assert torch.all(rn < trunc) and torch.all(trunc < trunc_s)
    assert torch.all(trunc_s <= 1.1 * (2 * 2.0 ** -10 + 2.0 ** -20) * s)  # c S and the far smaller chain terms
    assert float((trunc / s).median()) < 0.25 * 2 * 2.0 ** -10  # random signs: far below c S

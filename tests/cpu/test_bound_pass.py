"""The accumulation bound's one pass (oracle.judging.bound_pass) against BoundForm.evaluate, its
definition in torch, for every accumulation model and problem whose bound is linear in the
statistics, on statistics that hold zeros, huge values, infinities and NaN: the same values, exact
zeros, infinities and NaN in the same places. Within a few ulps here: torch's float64 sqrt on the CPU is
not always correctly rounded (numpy's, under the interpreter, is); on a GPU both are, and
tests/gpu/test_bound_pass_gpu.py holds them to the same bits. And the forms it must leave to torch
(operand rounding, per-unit spans, split-K partial statistics)."""

import math

import pytest
import torch

from kernels_ref.mma_stats import MmaStats
from oracle.judging import accumulation_bound as AB
from oracle.judging import bound_pass
from oracle.judging.accumulation_models import STATS_MARGIN
from oracle.judging.bound_stats import Stats
from oracle.problem.spec import ProblemSpec, Tile

M, N = 24, 40


def _spec(dtype, acc_model=None, **kw):
    return ProblemSpec(m=M, n=N, k=kw.pop("k", 4096), a_dtype=dtype, b_dtype=dtype, tile=Tile(128, 128, 64),
                       acc_model=acc_model, **kw)


def _stats(seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(M, N, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-30, 30, (M, N), generator=g)
    l = (s * (1 + torch.rand(M, N, generator=g, dtype=torch.float64))).float()
    v = (l.double() ** 2 / 7).float()
    s[0, :4] = 0.0
    l[0, :4] = 0.0
    v[0, :4] = 0.0
    l[1, 0], v[1, 1], s[1, 2] = math.inf, math.inf, math.inf
    l[2, 0], v[2, 1], s[2, 2] = math.nan, math.nan, math.nan
    v[3, 0] = 3.0e38  # its square root in float64 is finite; the margin's square keeps it below inf
    return l, v, s


def same_values(got, want, ulps: int = 0) -> bool:
    """Equal where finite (within `ulps` units in the last place; 0: the same bits), and zero, inf and
    NaN in the same places."""
    if not (torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
            and torch.equal(got == 0, want == 0)):
        return False
    fin = want.isfinite()
    if ulps == 0:
        return bool((got[fin] == want[fin]).all())
    eps = torch.finfo(torch.float64).eps
    return bool(((got[fin] - want[fin]).abs() <= ulps * eps * want[fin].abs()).all())


def _definition(spec, l, v, s):
    st = Stats(l.double() * STATS_MARGIN, v.double() * STATS_MARGIN ** 2)
    return AB.bound_form(spec, st, spec.k, s).evaluate(st, s, None)


FUSED = [
    ("bf16", None, {}), ("fp16", None, {}), ("fp32", "fp32", {}), ("bf16", "any", {}), ("fp16", "any", {}),
    ("fp16", "fp16", {"acc_dtype": "fp16"}), ("e4m3", "fp8_fast", {}),
    ("e4m3", "fp8_promoted", {"promotion_interval": 64}), ("e4m3", "any", {"promotion_interval": 64}),
    ("e4m3", "any", {}), ("bf16", None, {"reduction": "fp32"}), ("bf16", "any", {"reduction": "fp32"}),
    ("bf16", None, {"k": 100}),
]


@pytest.mark.parametrize("dtype,model,kw", FUSED, ids=[f"{d}-{m}-{kw}" for d, m, kw in FUSED])
def test_one_pass_is_the_definition_bit_for_bit(dtype, model, kw):
    spec = _spec(dtype, model, **kw)
    l, v, s = _stats()
    form = AB.bound_form(spec, Stats(l, v), spec.k, s)
    assert form.fused(), form
    want = _definition(spec, l, v, s)
    got = bound_pass.evaluate(form, l, v, s)
    assert got.dtype == torch.float64 and got.shape == s.shape
    assert same_values(got, want, ulps=4)
    assert bool(want[2].isnan().any()) and bool((want[0, :4] == 0).all())  # NaN and exact zeros went through


@pytest.mark.parametrize("s_dtype", [torch.float64, torch.float32])
def test_mma_bound_on_a_gpu_reads_the_statistics_in_one_pass(monkeypatch, s_dtype):
    """mma_bound takes the pass where it applies (a GPU; here the interpreter stands in) and gives what
    the torch path gives, S in float64 or float32 as the reference wrote it."""
    spec = _spec("bf16")
    l, v, s = _stats(1)
    s = s.to(s_dtype)
    stats = MmaStats(l, v, torch.zeros_like(l), torch.zeros_like(l), torch.zeros_like(l))
    zero = torch.zeros((), dtype=torch.float64)
    plain = AB.mma_bound(spec, zero, s, spec.k, stats, dtype=torch.float64)
    calls = []
    real = bound_pass.evaluate
    monkeypatch.setattr(bound_pass, "applies", lambda *t: True)
    monkeypatch.setattr(bound_pass, "evaluate", lambda *a: calls.append(1) or real(*a))
    fused = AB.mma_bound(spec, zero, s, spec.k, stats, dtype=torch.float64)
    assert calls == [1]
    assert same_values(fused, plain, ulps=4)


@pytest.mark.parametrize("dtype,model,kw,why", [
    ("fp32", "tf32", {}, "operand rounding reads q and |X|"),
    ("fp32", "any", {}, "its tf32 and bf16x3 members round operands"),
    ("bf16", None, {"reduction": "bf16", "reduction_chunk": 1024}, "the partials' own statistics"),
])
def test_forms_with_other_terms_stay_with_torch(dtype, model, kw, why):
    spec = _spec(dtype, model, **kw)
    l, v, s = _stats()
    z = torch.zeros_like(l)
    form = AB.bound_form(spec, Stats(l, v, z, z, z), spec.k, s)
    assert not form.fused(), why
    with pytest.raises(ValueError, match="fused BoundForm"):
        bound_pass.evaluate(form, l, v, s)


def test_per_unit_spans_stay_with_torch():
    """Units of different span lengths (the mma stage) have per-unit growth: tensors, not one pass."""
    spec = _spec("fp16", "fp16", acc_dtype="fp16")
    s = torch.ones(2, 4, 4, dtype=torch.float64)
    form = AB.bound_form(spec, Stats(s, s), [64, 4096], s)
    assert not form.fused()


def test_the_pass_is_only_taken_on_a_gpu():
    l, v, s = _stats()
    assert not bound_pass.applies(l, v, s)


def test_a_pass_triton_cannot_build_leaves_the_bound_to_its_definition(monkeypatch):
    """The compiler's refusal becomes PassUnavailable, and mma_bound evaluates the torch definition with a
    warning that names it: the same values, no failed check."""
    import ast

    from triton.compiler.errors import CompilationError

    class Refusing:
        def __getitem__(self, grid):
            def launch(*a, **k):
                raise CompilationError("src", ast.parse("x"), "what the compiler said")
            return launch

    spec = _spec("bf16", "any")
    l, v, s = _stats(2)
    form = AB.bound_form(spec, Stats(l, v), spec.k, s)
    monkeypatch.setattr(bound_pass, "_bound_kernel", Refusing())
    with pytest.raises(bound_pass.PassUnavailable, match="CompilationError"):
        bound_pass.evaluate(form, l, v, s)
    stats = MmaStats(l, v, torch.zeros_like(l), torch.zeros_like(l), torch.zeros_like(l))
    zero = torch.zeros((), dtype=torch.float64)
    monkeypatch.setattr(bound_pass, "applies", lambda *t: True)
    with pytest.warns(RuntimeWarning, match="one pass could not be built"):
        got = AB.mma_bound(spec, zero, s, spec.k, stats)
    assert same_values(got, _definition(spec, l, v, s))


def test_check_with_the_pass_is_check_without_it_on_hostile_calls(monkeypatch):
    """The fuzzer's oracle.check calls (huge and non-finite alpha, beta, scales and operands, every
    operand type) judged with the bound's torch definition and with its one pass (the interpreter in
    the GPU's place): the same verdict, worst tile, mismatches and ratio (to 12 digits: torch's CPU sqrt),
    or the same refusal."""
    import fuzz_inputs as F  # tests/ is on sys.path
    import oracle

    def outcome(args, kw):
        try:
            rep = oracle.check(*args, **kw)
        except Exception as e:  # a documented refusal: the same one both ways
            return ("refused", type(e).__name__)
        w = rep.stages[-1].chained.worst
        return str(rep.verdict), None if w is None else (w.tile, w.mismatches, f"{w.max_ratio:.12g}")  # CPU sqrt

    used = []
    for seed in range(120):
        args, kw, how = F.make_check_call(seed)
        monkeypatch.setattr(bound_pass, "applies", lambda *t: False)
        plain = outcome(args, kw)
        monkeypatch.setattr(bound_pass, "applies", lambda *t: used.append(seed) or True)
        assert outcome(args, kw) == plain, (seed, how)
    assert len(set(used)) >= 15  # the pass judged a good share of them

"""The reference chain carries a step that changes nothing for the problem (alpha 1 with beta 0 or no C, no
bias, no activation, no scales) without a pass over the output: that is only sound if the step's value is
its input bit for bit and its bound step is an own error of 0 and a gain of 1, which this holds each such
step's own functions to, and the chain's values and bounds to what running every step gives."""

import pytest
import torch

from oracle.judging.differential.analysis import reference_device
from oracle.judging.differential.context import Context
from oracle.judging.differential.epilogue import (Vectors, _step_values, reference_chain, run_epilogue, step_acts,
                                                  steps_of)
from oracle.problem.spec import ProblemSpec, Scale, Tile
from oracle.run.inputs import Provenance, make_operands
from oracle.run.recording import Recording

CASES = {
    "plain": {},
    "beta 0 with C": dict(beta=0.0, c_dtype="bf16"),
    "alpha, beta, C": dict(alpha=0.75, beta=0.5, c_dtype="bf16"),
    "bias and GELU": dict(bias="col", activation="gelu_tanh"),
    "row and col scales": dict(a_dtype="e4m3", b_dtype="e4m3", scale_a=Scale("row"), scale_b=Scale("col")),
}


def _ctx(kw, ladder="random"):
    spec = ProblemSpec(m=64, n=48, k=64, tile=Tile(32, 16, 32), **kw)
    rec = Recording(spec=spec, operands=make_operands(spec, ladder, 2), output=None, provenance=Provenance(ladder, 2),
                    kernel_error="none: a reference-only recording")
    return Context.of(rec, reference_device())


@pytest.mark.parametrize("name", CASES)
def test_a_step_passed_through_is_what_running_it_gives(name):
    ctx = _ctx(CASES[name])
    spec, vec = ctx.geo.spec, Vectors(ctx, None)
    x = torch.randn(spec.m, spec.n) * 3
    x[0, 0], x[0, 1], x[1, 0] = float("inf"), float("nan"), -0.0
    through = [s for s in steps_of(spec) if s != "cast" and not step_acts(spec, s)]
    assert through, name  # each case leaves some step doing nothing
    for step in through:
        y, own, gain = _step_values(spec, step, x, vec)
        assert torch.equal(y.view(torch.int32).masked_fill(y.isnan(), 0), x.view(torch.int32).masked_fill(x.isnan(), 0))
        assert bool((own == 0).all()) and bool((gain == 1).all()), step


@pytest.mark.parametrize("name", CASES)
def test_the_chain_equals_the_chain_that_runs_every_step(name, monkeypatch):
    ctx = _ctx(CASES[name], "ktag")
    fast = reference_chain(ctx)
    import oracle.judging.differential.epilogue as epilogue

    monkeypatch.setattr(epilogue, "step_acts", lambda spec, step: True)
    slow = reference_chain(ctx)
    assert list(fast) == list(slow)
    for step in fast:
        (yf, bf), (ys, bs) = fast[step], slow[step]
        assert yf.dtype == ys.dtype and torch.equal(yf, ys) and torch.equal(bf, bs), step
    # and teacher-forced from a tap, as the epilogue stages run it
    x = torch.randn(ctx.geo.bm, ctx.geo.bn)
    b = torch.zeros(x.shape, dtype=torch.float64)
    tf = [(s, y.clone(), bd.clone()) for s, y, bd in run_epilogue(ctx, x, b, 0, Vectors(ctx, (1, 1)))]
    monkeypatch.undo()
    rerun = list(run_epilogue(ctx, x, b, 0, Vectors(ctx, (1, 1))))
    assert [s for s, _, _ in tf] == [s for s, _, _ in rerun]
    for (s, y0, b0), (_, y1, b1) in zip(tf, rerun):
        assert torch.equal(y0, y1) and torch.equal(b0, b1), s


def test_scales_whose_product_overflows_leave_an_exact_zero_exact():
    """Per-tensor and per-column scales of fp32's largest value: their product is inf, and a zero accumulator
    (a zero row of A, the tile's padding) times it must keep a bound of 0, not inf * 0 = NaN (which made the
    references look untrustworthy: found by tests/fuzz_inputs.py, seed 8000490)."""
    import oracle

    big = torch.finfo(torch.float32).max
    a = torch.zeros(2, 4)
    a[0] = torch.tensor([1.0, -2.0, 0.5, 4.0])
    b = torch.tensor([[1.0, -1.0, 0.5, 2.0, 0.0, 1.0, -0.5, 0.25]] * 4)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    acc = a8.float() @ b8.float()
    d = torch.where(acc == 0, torch.zeros_like(acc), torch.sign(acc) * float("inf")).to(torch.float16)
    rep = oracle.check(a8, b8, d, tile=(16, 16, 16), scale_a=torch.tensor([big]), scale_b=torch.full((8,), big))
    assert rep.verdict == "MATCH" and rep.analysis.cross_check == (), (rep.verdict, rep.analysis.cross_check)
    wrong = d.clone()
    wrong[1, 3] = 1.0  # a zero row's element: its bound is 0, so any other value is named
    assert oracle.check(a8, b8, wrong, tile=(16, 16, 16), scale_a=torch.tensor([big]),
                        scale_b=torch.full((8,), big)).verdict == "DIVERGED"

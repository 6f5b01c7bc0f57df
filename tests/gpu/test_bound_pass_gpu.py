"""The accumulation bound's one pass on a GPU: the same float64 bits as its torch definition
(tests/cpu/test_bound_pass.py runs every form under the interpreter), and what oracle.check gives
with it, the same verdict and bound as the torch path on the same statistics."""

import pytest
import torch

from oracle.judging import accumulation_bound as AB
from oracle.judging import bound_pass
from oracle.judging.bound_stats import Stats

from tests.cpu.test_bound_pass import FUSED, _definition, _spec, _stats, same_values

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype,model,kw", FUSED, ids=[f"{d}-{m}-{kw}" for d, m, kw in FUSED])
def test_one_pass_is_the_definition_bit_for_bit_on_the_gpu(dtype, model, kw):
    spec = _spec(dtype, model, **kw)
    l, v, s = (t.cuda() for t in _stats())
    form = AB.bound_form(spec, Stats(l, v), spec.k, s)
    assert bound_pass.applies(l, v, s)
    assert same_values(bound_pass.evaluate(form, l, v, s), _definition(spec, l, v, s))


def test_check_is_the_same_with_and_without_the_pass(monkeypatch):
    import oracle

    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(512, 768, device="cuda", generator=g).bfloat16()
    b = torch.randn(768, 384, device="cuda", generator=g).bfloat16()
    d = (a.float() @ b.float()).bfloat16()
    fused = oracle.check(a, b, d)
    monkeypatch.setattr(bound_pass, "applies", lambda *t: False)
    plain = oracle.check(a, b, d)
    assert fused.verdict == plain.verdict == "MATCH"
    wf, wp = fused.stages[-1].chained.worst, plain.stages[-1].chained.worst
    assert (wf.tile, wf.max_ratio) == (wp.tile, wp.max_ratio)


def test_ulp_on_the_gpu_is_the_cpus():
    """The cast bound's ulp from exponent bits on the GPU gives the CPU's float64 frexp values, for every bf16."""
    from oracle.judging import tolerance

    y = torch.arange(2 ** 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    assert torch.equal(tolerance.ulp(y.cuda(), "bf16").cpu(), tolerance.ulp(y.double(), "bf16"))

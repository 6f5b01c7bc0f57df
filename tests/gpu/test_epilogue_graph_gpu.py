"""GPU tier for declared epilogue graphs: the compiled Triton references (not the interpreter)
against their float64 host specs for each graph shape at a realistic size, the reference GEMM in a
declared order against its host spec, and the differential with a CUDA reference device on
recordings of kernels whose epilogue is not the default one."""

import dataclasses

import pytest
import torch

from kernels_ref import epilogue as E
from kernels_ref.gemm import gemm, gemm_host
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, Scale, Tile
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate

pytestmark = pytest.mark.gpu

DEV = "cuda"
SIZE = (2048, 1536)  # rows, columns of the epilogue's input
GRAPHS = {
    "lincomb_per_col_bias": ("alpha", "bias", "beta_c", "activation", "cast"),
    "activation_after_second_scale": ("bias", "scale", "alpha", "beta_c", "activation", "cast"),
    "rounded_between_steps": ("scale", "alpha_beta:bf16", "bias:bf16", "activation", "cast"),
}


def _gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_compiled_graph_matches_host_spec(name):
    r, c = SIZE
    acc = torch.randn(r, c, generator=_gen(1), device=DEV) * 40
    cc = torch.randn(r, c, generator=_gen(2), device=DEV).bfloat16()
    bias = torch.randn(c, generator=_gen(3), device=DEV)
    cs = torch.rand(c, generator=_gen(4), device=DEV) + 0.5
    ep = E.Epilogue(alpha=1.5, beta=0.75, bias_axis="col", activation="silu", out_dtype="bf16", graph=GRAPHS[name])
    got = E.epilogue(acc, ep, c=cc, bias=bias, col_scale=cs, return_steps=True)
    want = E.epilogue_host(acc, ep, c=cc, bias=bias, col_scale=cs, return_steps=True)
    seen_act = False
    for step in got.steps:
        g, w = got[step].cpu().double(), want[step].double()
        seen_act |= step == "activation"
        if seen_act:  # exp: a few fp32 ulps between the GPU and the host
            rtol = 2**-7 if step == "cast" else 2**-18  # the bf16 cast of values a few ulps apart: one bf16 ulp
            assert torch.allclose(g, w, rtol=rtol, atol=2**-20), step
        else:
            assert torch.equal(g, w), step


def test_reference_gemm_in_a_declared_order_matches_its_host_spec():
    m, n, k = 1024, 768, 512
    a = torch.randn(m, k, generator=_gen(5), device=DEV).bfloat16()
    b = torch.randn(k, n, generator=_gen(6), device=DEV).bfloat16()
    cc = torch.randn(m, n, generator=_gen(7), device=DEV).bfloat16()
    bias = torch.randn(n, generator=_gen(8), device=DEV)
    ep = E.Epilogue(alpha=1.25, beta=0.5, bias_axis="col", activation="relu", out_dtype="fp32",
                    graph=GRAPHS["lincomb_per_col_bias"])
    got = gemm(a, b, block_m=128, block_n=128, block_k=64, ep=ep, c=cc, bias=bias).cpu().double()
    want = gemm_host(a.cpu(), b.cpu(), block_m=128, block_n=128, block_k=64, ep=ep, c=cc.cpu(),
                     bias=bias.cpu()).double()
    s = (a.double().abs() @ b.double().abs()).cpu()
    assert ((got - want).abs() <= 4 * (64 + 8 + 2) * 2**-24 * s + 2**-18 * (want.abs() + 1)).all()


SPEC = ProblemSpec(m=512, n=512, k=512, tile=Tile(128, 128, 64), alpha=1.5, beta=0.75, c_dtype="bf16", bias="col",
                   activation="relu", scale_b=Scale("col"))
LINCOMB = ("scale", "alpha", "bias", "beta_c", "activation", "cast")


def _analyze(spec, kernel_epilogue=None, defect=None):
    ops = make_operands(spec, "random", seed=11)
    inj = Injection(defect, (2, 1), 1) if defect else None
    rec = simulate(spec, ops, Provenance("random", 11), injection=inj, tap_tiles=[(0, 0), (2, 1)],
                   kernel_epilogue=kernel_epilogue)
    return analyze(rec, torch.device(DEV))


def test_differential_on_cuda_follows_the_declaration():
    right = _analyze(dataclasses.replace(SPEC, epilogue=LINCOMB))
    assert right.verdict is Verdict.MATCH and not right.cross_check
    default = _analyze(SPEC, kernel_epilogue=LINCOMB)
    assert default.verdict is Verdict.DIVERGED and default.first.stage == "epilogue_bias"
    bad = _analyze(dataclasses.replace(SPEC, epilogue=LINCOMB), defect="epilogue_beta_c_twice")
    assert bad.first.stage == "epilogue_beta_c" and bad.first.tile == (2, 1) and bad.kind is Kind.VERDICT

"""Quantised operands on the H200: kernels_ref.dequant compiled against its float64 host spec, the
W4A16 model kernel through the differential on the device, and oracle.check on torch's block-scaled
fp8 GEMM (DeepSeek-style 1 x 128 activation and 128 x 128 weight scales) and on a torch W4A16 op at a
decode shape and at 4096^3. Each test seeds its own inputs."""

import pytest
import torch

import oracle
from kernels_ref import dequant as dq
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, Tile
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("dtype,scale,out,zeros,precision,packing", [
    ("int4", "fp16", "fp16", "int", "fp32", "k_pairs_low_first"),
    ("uint4", "bf16", "bf16", "float", "operand", "k_pairs_high_first"),
    ("fp4_e2m1", "e8m0", "bf16", "none", "fp32", "k_pairs_low_first"),
    ("int4", "fp16", "fp16", "int", "operand", "k8_interleaved"),
    ("e4m3", "fp32", "fp16", "none", "operand", None),
])
def test_compiled_dequant_matches_the_host_spec(dtype, scale, out, zeros, precision, packing):
    cfg = dq.DequantConfig(dtype, scale, out, 128, packing, zeros, precision)
    spec = ProblemSpec(16, 512, 1024, a_dtype=out, b_dtype=dtype, out_dtype=out, b_packing=packing,
                       b_group_size=128, b_scales=scale, b_zeros=zeros, dequant_precision=precision)
    ops = make_operands(spec, "random", 3)
    host = dq.dequant_operand_host(ops.b, ops.b_scales, ops.b_zeros, cfg)
    dev = dq.dequant_operand(ops.b.to(DEV), ops.b_scales.to(DEV), None if ops.b_zeros is None else ops.b_zeros.to(DEV),
                             cfg)
    assert torch.equal(host.view(torch.int16), dev.cpu().view(torch.int16))


@pytest.mark.parametrize("packing,defect", [
    ("k_pairs_low_first", None), ("k_pairs_low_first", "dequant_nibble_order"),
    ("k_pairs_low_first", "dequant_group_index"), ("k_pairs_low_first", "dequant_zero_twice"),
    ("k_pairs_low_first", "dequant_scale_group"), ("k8_interleaved", None), ("k8_interleaved", "dequant_plain_pairs"),
])
def test_the_w4a16_model_kernel_judged_on_the_device(packing, defect):
    spec = ProblemSpec(16, 256, 512, a_dtype="fp16", b_dtype="int4", out_dtype="fp16", b_packing=packing,
                       b_group_size=128, b_scales="fp16", b_zeros="int", tile=Tile(16, 128, 64))
    ops = make_operands(spec, "index")
    inj = None if defect is None else Injection(defect, (0, 1), 3)
    an = analyze(simulate(spec, ops, Provenance("index"), injection=inj, tap_tiles=[(0, 1)]), torch.device(DEV))
    if defect is None:
        assert an.verdict is Verdict.MATCH
    else:
        assert an.verdict is Verdict.DIVERGED and an.first.stage == "dequant_b" and an.kind is Kind.VERDICT
        assert (an.first.tile, an.first.k_block) == ((0, 1), 3) and "scale group 1" in (an.first.hint or "")


def _w4a16(a, b, b_scales, b_zeros):
    lo, hi = (b & 0xF).to(torch.int32), (b >> 4).to(torch.int32)
    q = torch.stack([lo, hi], dim=1).reshape(2 * b.shape[0], b.shape[1])
    q = torch.where(q >= 8, q - 16, q).to(torch.float32)
    g = torch.arange(q.shape[0], device=b.device) // (q.shape[0] // b_scales.shape[0])
    w = ((q - b_zeros.float()[g]) * b_scales.float()[g]).to(a.dtype)
    return a @ w  # cuBLAS on the dequantised operand


@pytest.mark.parametrize("m,n,k", [(8, 4096, 4096), (4096, 4096, 4096)])
def test_check_a_torch_w4a16_op(m, n, k):
    spec = ProblemSpec(m, n, k, a_dtype="fp16", b_dtype="int4", out_dtype="fp16", b_packing="k_pairs_low_first",
                       b_group_size=128, b_scales="fp16", b_zeros="int")
    ops = make_operands(spec, "random", 7, generator="cuda").to(DEV)
    d = _w4a16(ops.a, ops.b, ops.b_scales, ops.b_zeros)
    kw = dict(b_scales=ops.b_scales, b_zeros=ops.b_zeros, b_dtype="int4", b_packing="k_pairs_low_first")
    assert oracle.check(ops.a, ops.b, d, acc_model="any", **kw).verdict == "MATCH"
    d_bad = d.clone()
    wrong = _w4a16(ops.a, ops.b, ops.b_scales.roll(1, 0), ops.b_zeros)  # every column with the scales of another group
    d_bad[:, 128:256] = wrong[:, 128:256]
    assert oracle.check(ops.a, ops.b, d_bad, acc_model="any", **kw).verdict == "DIVERGED"


@pytest.mark.parametrize("m,n,k", [(16, 4096, 4096), (4096, 4096, 4096)])
def test_check_torch_scaled_mm_with_block_scales(m, n, k):
    """torch._scaled_mm with 1 x 128 / 128 x 128 scales (CUDA only in torch 2.13: its CPU build takes
    tensor-wise and row-wise scales only). torch reads scale_a [M, K/128] M-major and scale_b through
    its transpose, [N/128, K/128] row-major: the oracle's grids are [M, K/128] and [N/128, K/128]."""
    g = torch.Generator(device=DEV).manual_seed(11)
    a = torch.randn(m, k, device=DEV, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device=DEV, generator=g).to(torch.float8_e4m3fn).t()  # [K, N], column-major
    sa = torch.rand(m, k // 128, device=DEV, generator=g) + 0.5
    sb = torch.rand(n // 128, k // 128, device=DEV, generator=g) + 0.5
    try:
        d = torch._scaled_mm(a, b, scale_a=sa.t().contiguous().t(), scale_b=sb.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        if "Invalid scaling configuration" in str(e):
            raise  # torch has block scales and refused these layouts: the test's, not torch's, fault
        pytest.skip(f"This torch build has no block-scaled _scaled_mm on this GPU: {e}")
    rep = oracle.check(a, b, d, scale_a=sa, scale_b=sb, acc_model="fp8_promoted", promotion_interval=128,
                       reduction="fp32", tile=(128, 128, 128))
    assert rep.recording.spec.scale_a.block == (1, 128) and rep.recording.spec.scale_b.block == (128, 128)
    assert rep.verdict == "MATCH", str(rep)

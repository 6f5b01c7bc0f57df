"""Epilogue stage: every sub-step on its own and composed, against the host spec and against
independent torch statements; the cast is checked bit for bit on boundary values."""

import pytest
import torch

from kernels_ref import epilogue as E
from kernels_ref.dtypes import DTYPES

# numpy (under the Triton interpreter) warns where exp overflows or inf * 0 makes a NaN: both are intended
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _same(got, want):
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    return g.shape == w.shape and torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(0), w.nan_to_num(0))


def _x(R=70, C=90, seed=0, scale=3.0):
    return torch.randn(R, C, generator=_gen(seed)) * scale


def test_scale_each_factor_and_axis():
    x = _x()
    r = torch.rand(70, generator=_gen(1)) + 0.5
    c = (torch.rand(90, generator=_gen(2)) + 0.5).to(torch.bfloat16)
    t = torch.tensor(0.7)
    for rs, cs, ts in ((r, None, None), (None, c, None), (None, None, t), (r, c, t), (None, None, None)):
        got = E.apply_scale(x, rs, cs, ts)
        assert got.dtype == torch.float32
        want = x.clone()
        if rs is not None:
            want = want * rs.float()[:, None]
        if cs is not None:
            want = want * cs.float()[None, :]
        if ts is not None:
            want = want * ts.float()
        assert _same(got, want)  # fp32 torch, same order: bit-exact
        assert _same(E.apply_scale_host(x, rs, cs, ts), want)
    with pytest.raises(ValueError, match="row_scale has length 90; expected 70"):
        E.apply_scale(x, row_scale=torch.ones(90))
    with pytest.raises(ValueError, match="tensor_scale must hold one element"):
        E.apply_scale(x, tensor_scale=torch.ones(2))


def test_alpha_beta():
    x = _x()
    c = torch.randn(70, 90, generator=_gen(3)).to(torch.float16)
    got = E.apply_alpha_beta(x, 0.3, -1.7, c)
    a32, b32 = torch.tensor(0.3, dtype=torch.float32), torch.tensor(-1.7, dtype=torch.float32)
    want = a32 * x + b32 * c.float()
    assert _same(got, want)
    assert _same(E.apply_alpha_beta_host(x, 0.3, -1.7, c), want)
    # beta == 0 does not read c (BLAS): a NaN c cannot leak in
    nan_c = torch.full((70, 90), float("nan"))
    assert _same(E.apply_alpha_beta(x, 2.0, 0.0, nan_c), 2 * x)
    with pytest.raises(ValueError, match="c .* is required"):
        E.apply_alpha_beta(x, 1.0, 0.5)
    with pytest.raises(ValueError, match="c has shape"):
        E.apply_alpha_beta(x, 1.0, 0.5, c.t())


def test_bias_axes():
    x = _x()
    br = torch.randn(70, generator=_gen(4))
    bc = torch.randn(90, generator=_gen(5)).to(torch.bfloat16)
    assert _same(E.apply_bias(x, br, "row"), x + br[:, None])
    assert _same(E.apply_bias(x, bc, "col"), x + bc.float()[None, :])
    assert _same(E.apply_bias_host(x, bc, "col"), x + bc.float()[None, :])
    with pytest.raises(ValueError, match="bias has length 70; expected 90"):
        E.apply_bias(x, br, "col")
    with pytest.raises(ValueError, match="axis"):
        E.apply_bias(x, br, "diag")


def _act_torch(x64, kind):
    """Independent float64 statements of the activations."""
    if kind == "none":
        return x64
    if kind == "relu":
        return torch.relu(x64)
    if kind == "gelu_erf":
        return torch.nn.functional.gelu(x64)
    if kind == "gelu_tanh":
        return torch.nn.functional.gelu(x64, approximate="tanh")
    return torch.nn.functional.silu(x64)


@pytest.mark.parametrize("kind", E.ACTIVATIONS)
def test_activation(kind):
    x = torch.cat([_x(64, 64, seed=6).flatten(), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 90.0, -90.0,
                                                               1e30, -1e30, float("inf"), -float("inf")])])
    x = torch.cat([x, torch.zeros(64 * 65 - x.numel())]).reshape(64, 65)
    got = E.apply_activation(x, kind).double()
    host = E.apply_activation_host(x, kind)
    ref = _act_torch(x.double(), kind)
    fin = torch.isfinite(ref)
    assert torch.equal(got.isnan(), host.isnan())
    assert _same(got[~fin], host[~fin])
    # fp32 formula: relative error of a few ulps, plus the cancellation in 1 + erf for x << 0
    tol = 8 * 2.0 ** -24 * ref.abs() + 4 * 2.0 ** -24 * x.double().abs()
    assert torch.all((got - ref).abs()[fin] <= tol[fin] + 1e-38)
    assert torch.all((host - ref).abs()[fin] <= tol[fin] + 1e-38)
    if kind in ("none", "relu"):
        assert _same(got, host)
    nan_in = torch.full((2, 2), float("nan"))
    assert torch.isnan(E.apply_activation(nan_in, kind)).all()


def test_gelu_variants_differ():
    x = torch.linspace(-3, 3, 64 * 64).reshape(64, 64)
    assert not torch.equal(E.apply_activation(x, "gelu_erf"), E.apply_activation(x, "gelu_tanh"))


def _boundary_values(name):
    """All finite values of the format, their midpoints and neighbours, specials, random fp32."""
    dt = DTYPES[name].torch
    if name in ("e4m3", "e5m2"):
        vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt).float()
    else:
        vals = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dt).float()[::7]
    vals = vals[torch.isfinite(vals)]
    s = vals.unique()
    mids = ((s[:-1].double() + s[1:].double()) / 2)
    mids = mids[mids.float().double() == mids].float()
    up = torch.nextafter(mids, torch.tensor(float("inf")))
    dn = torch.nextafter(mids, torch.tensor(-float("inf")))
    mx = DTYPES[name].max_finite
    spec = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-45, -1e-45, mx, -mx, mx * 1.001,
                         -mx * 1.001, mx * 1.5, 3.4e38, -3.4e38])
    rnd = torch.randn(20000, generator=_gen(7)) * 10.0 ** torch.randint(-8, 8, (20000,), generator=_gen(8))
    out = torch.cat([vals, mids, up, dn, spec, rnd])
    n = out.numel()
    cols = 128
    return torch.cat([out, torch.zeros((-n) % cols)]).reshape(-1, cols)


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16", "e4m3", "e5m2"])
@pytest.mark.parametrize("saturate", [False, True])
def test_cast_bit_exact(name, saturate):
    x = _boundary_values(name)
    got = E.apply_cast(x, name, saturate)
    host = E.apply_cast_host(x, name, saturate)
    assert got.dtype == DTYPES[name].torch and host.dtype == got.dtype
    assert _same(got.float(), host.float())
    # independent statement: torch RNE in range; overflow per the format
    mx = DTYPES[name].max_finite
    xs = x.clamp(-mx, mx) if saturate else x
    want = xs.to(DTYPES[name].torch).float()
    if name == "e4m3" and not saturate:
        want[x.abs() > 464] = float("nan")
    assert _same(got.float(), want)


def test_cast_overflow_and_saturation_rules():
    x = torch.tensor([[500.0, -1e6, float("inf"), float("nan"), 460.0, 464.0, 465.0, 70000.0]] * 1)
    e4 = E.apply_cast(x, "e4m3").float()[0]
    assert torch.isnan(e4[[0, 1, 2, 3, 6]]).all() and e4[4] == 448 and e4[5] == 448  # 464 ties to even (448)
    e4s = E.apply_cast(x, "e4m3", saturate=True).float()[0]
    assert e4s[0] == 448 and e4s[1] == -448 and e4s[2] == 448 and torch.isnan(e4s[3])
    e5 = E.apply_cast(x, "e5m2").float()[0]
    assert e5[7] == float("inf") and e5[1] == -float("inf") and torch.isnan(e5[3])
    assert E.apply_cast(x, "e5m2", saturate=True).float()[0, 7] == 57344
    f16 = E.apply_cast(x, "fp16").float()[0]
    assert f16[7] == float("inf") and E.apply_cast(x, "fp16", saturate=True).float()[0, 7] == 65504
    bf = E.apply_cast(torch.tensor([[3.4e38, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8]]), "bf16").float()[0]
    assert bf[0] == float("inf") and bf[1] == 1.0 and bf[2] == 1.0 + 2.0 ** -6  # RNE, not truncation


def test_epilogue_dataclass_validates():
    assert E.Epilogue().out_dtype == "bf16"
    with pytest.raises(ValueError, match="Epilogue.activation='gelu'"):
        E.Epilogue(activation="gelu")
    with pytest.raises(ValueError, match="Epilogue.out_dtype='fp64'"):
        E.Epilogue(out_dtype="fp64")
    with pytest.raises(ValueError, match="Epilogue.bias_axis='x'"):
        E.Epilogue(bias_axis="x")
    with pytest.raises(ValueError, match="Epilogue.alpha"):
        E.Epilogue(alpha=float("nan"))
    with pytest.raises(ValueError, match="Epilogue.saturate"):
        E.Epilogue(saturate=1)
    with pytest.raises(Exception):
        E.Epilogue().alpha = 2.0  # frozen


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_epilogue_composition(x_dtype):
    R, C = 50, 75
    if x_dtype == torch.int32:
        acc = torch.randint(-(1 << 26), 1 << 26, (R, C), generator=_gen(9), dtype=torch.int32)
    else:
        acc = (torch.randn(R, C, generator=_gen(9)) * 8).to(x_dtype)
    c = torch.randn(R, C, generator=_gen(10)).to(torch.bfloat16)
    bias = torch.randn(R, generator=_gen(11))
    rs = torch.rand(R, generator=_gen(12)) + 0.5
    cs = torch.rand(C, generator=_gen(13)) + 0.5
    ts = torch.tensor([1.25])
    ep = E.Epilogue(alpha=0.75, beta=-0.5, bias_axis="row", activation="relu", out_dtype="e4m3", saturate=True)
    kw = dict(c=c, bias=bias, row_scale=rs, col_scale=cs, tensor_scale=ts)
    steps = E.epilogue(acc, ep, return_steps=True, **kw)
    host = E.epilogue_host(acc, ep, return_steps=True, **kw)
    assert isinstance(steps, E.EpilogueSteps)
    for f in E.STEPS:
        assert _same(getattr(steps, f).float(), getattr(host, f).float()), f
    # the composed kernel equals the sub-step launchers chained
    s1 = E.apply_scale(acc, rs, cs, ts)
    s2 = E.apply_alpha_beta(s1, 0.75, -0.5, c)
    s3 = E.apply_bias(s2, bias, "row")
    s4 = E.apply_activation(s3, "relu")
    s5 = E.apply_cast(s4, "e4m3", saturate=True)
    for f, v in zip(E.STEPS, (s1, s2, s3, s4, s5)):
        assert _same(getattr(steps, f).float(), v.float()), f
    out = E.epilogue(acc, ep, **kw)
    assert out.dtype == torch.float8_e4m3fn and _same(out.float(), s5.float())


def test_epilogue_with_transcendental_activation_is_close():
    acc = _x(40, 40, seed=14)
    ep = E.Epilogue(alpha=1.5, activation="gelu_tanh", out_dtype="fp32")
    got = E.epilogue(acc, ep)
    host = E.epilogue_host(acc, ep)
    assert torch.allclose(got.double(), host.double(), rtol=1e-6, atol=1e-7)


def test_epilogue_argument_errors():
    acc = _x(8, 8)
    with pytest.raises(ValueError, match="bias_axis='row' needs a bias"):
        E.epilogue(acc, E.Epilogue(bias_axis="row"))
    with pytest.raises(ValueError, match="bias given but bias_axis is None"):
        E.epilogue(acc, E.Epilogue(), bias=torch.ones(8))
    with pytest.raises(ValueError, match="ep must be an Epilogue"):
        E.epilogue(acc, "bf16")
    with pytest.raises(ValueError, match="x has dtype"):
        E.apply_cast(acc.double(), "bf16")
    with pytest.raises(ValueError, match="out_dtype_name"):
        E.apply_cast(acc, "int8")
    assert E.check_supported("e4m3", "silu", "col") == []
    assert len(E.check_supported("fp64", "gelu", "z", "int8")) == 4

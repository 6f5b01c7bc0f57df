"""Epilogue stage: accumulator tile -> output values, one sub-step at a time.

Data path (elementwise on x [R, C], a tile or the whole output, computing in fp32):
  scale       y = x * row_scale[:, None] * col_scale[None, :] * tensor_scale   (left to right,
              each factor optional, each product rounded to fp32)
  alpha_beta  y = fp32(alpha * x) + fp32(beta * c)   (alpha, beta rounded to fp32 first; beta == 0
              means c is not read, as in BLAS)
  bias        y = x + bias[:, None] ("row": one value per row) or x + bias[None, :] ("col")
  activation  none | relu (x < 0 -> 0, NaN kept) | gelu_erf 0.5 x (1 + erf(x / sqrt 2)) |
              gelu_tanh 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as the identical
              x * sigmoid(2 u) | silu x * sigmoid(x)
  cast        round to nearest even into fp32 / fp16 / bf16 / e4m3 / e5m2; saturate=True clamps to
              +-max finite first (NaN stays NaN); without it overflow follows the format: e4m3
              (e4m3fn, no infinity) gives NaN, e5m2 / fp16 / bf16 give infinity. Every NaN comes
              out as the format's positive quiet NaN (`_common.NAN_BITS`). int32: what a CUDA
              epilogue's __float2int_rn (PTX cvt.rni.s32.f32) does: the nearest integer, ties to
              even, values past the range and +-inf clamped to INT32_MIN / INT32_MAX, NaN -> 0
              (saturate changes nothing: PTX clamps float -> int by default).
`epilogue` composes them in that order (the fused gemm calls the same jit helpers), unless
`Epilogue.graph` declares another (kernels_ref.epilogue_graph): then it runs the declared steps
one launch each, in the declared order, where
  alpha       y = fp32(alpha * x)               (alpha_beta with beta = 0)
  beta_c      y = x + fp32(beta * c)            (alpha_beta with alpha = 1: fp32(1 * x) is x)
  step:DT     the step's result rounded (RNE, as the cast) to DT (fp16, bf16) and carried on
so alpha then beta_c without rounding between is alpha_beta bit for bit.

Constraints: inputs x and c may be fp32, fp16, bf16 (x also int32, converted RNE to fp32); scale
and bias vectors fp32, fp16 or bf16. The cast is integer arithmetic on the fp32 bit pattern, so it
is bit-exact between the GPU, the interpreter and the host; the host's cast is torch's RNE
`.to()` with its special values set explicitly (e4m3 overflow without saturation is NaN, as
torch's own e4m3 overflow behaviour differs between versions; NaN bits canonical; int32 by
`torch.round`, clamped, NaN -> 0, as the reproducer's host GEMM does). Transcendental
activations agree with the float64 host to a few fp32 ulps (erf/exp implementations differ),
the other steps bit for bit. On the GPU, fp-contraction is off, so
alpha * x + beta * c rounds twice as specified.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from typing import NamedTuple, Optional

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref import epilogue_graph as G
from kernels_ref._codec import _decode_f32, _encode, _encode_int, _to_storage, _unsigned
from kernels_ref.dtypes import DTYPES

ACTIVATIONS = ("none", "relu", "gelu_erf", "gelu_tanh", "silu")
OUT_DTYPES = ("fp32", "fp16", "bf16", "e4m3", "e5m2", "int32")
INT_RANGES = {"int32": (-2**31, 2**31 - 1)}  # where an integer cast clamps
BIAS_AXES = (None, "row", "col")
STEPS = ("scale", "alpha_beta", "bias", "activation", "cast")
_ACT_CODE = {a: i for i, a in enumerate(ACTIVATIONS)}
_AXIS_CODE = {None: 0, "row": 1, "col": 2}
_IN_NAMES = ("fp32", "fp16", "bf16", "int32")
_VEC_NAMES = ("fp32", "fp16", "bf16")
E4M3_OVERFLOW = 464.0  # |x| above this rounds past 448, the largest finite e4m3fn value


@dataclass(frozen=True)
class Epilogue:
    """Epilogue configuration; validates itself."""

    alpha: float = 1.0
    beta: float = 0.0
    bias_axis: Optional[str] = None
    activation: str = "none"
    out_dtype: str = "bf16"
    saturate: bool = False
    graph: tuple[str, ...] = G.DEFAULT  # the steps in order (kernels_ref.epilogue_graph tokens)

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"Epilogue.{name}={v!r} must be a finite real number")
        if self.bias_axis not in BIAS_AXES:
            raise ValueError(f"Epilogue.bias_axis={self.bias_axis!r} is not allowed; allowed: None, 'row', 'col'")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Epilogue.activation={self.activation!r} is not allowed; "
                             f"allowed: {', '.join(ACTIVATIONS)}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"Epilogue.out_dtype={self.out_dtype!r} is not allowed; allowed: {', '.join(OUT_DTYPES)}")
        if not isinstance(self.saturate, bool):
            raise ValueError(f"Epilogue.saturate={self.saturate!r} must be a bool")
        if isinstance(self.graph, list):
            object.__setattr__(self, "graph", tuple(self.graph))
        G.parse(self.graph, "Epilogue.graph")  # a GraphError (a ValueError) names the token

    @property
    def nodes(self) -> tuple[G.Node, ...]:
        return G.parse(self.graph, "Epilogue.graph")

    @property
    def fused(self) -> bool:
        """Is this the default order that the fused kernel (and gemm) computes?"""
        return self.nodes == G.DEFAULT_NODES


@dataclass(frozen=True)
class EpilogueSteps:
    """The tile after every epilogue sub-step (fp32 values, then the cast in the output dtype)."""

    scale: torch.Tensor
    alpha_beta: torch.Tensor
    bias: torch.Tensor
    activation: torch.Tensor
    cast: torch.Tensor


@dataclass(frozen=True)
class GraphSteps:
    """The tile after every node of a declared graph, in its order: `values[i]` is node `steps[i]`'s
    result (fp32 holding any rounding the node declares; the cast's in the output dtype)."""

    steps: tuple[str, ...]
    values: tuple[torch.Tensor, ...]

    def __getitem__(self, step: str) -> torch.Tensor:
        if step not in self.steps:
            raise KeyError(f"step {step!r} is not in this graph; its steps: {', '.join(self.steps)}")
        return self.values[self.steps.index(step)]


# ----------------------------------------------------------------------------------------------
# jit helpers (shared with gemm)
# ----------------------------------------------------------------------------------------------


@triton.jit
def _load_vec(ptr, idx, stride, mask, DT: tl.constexpr, W: tl.constexpr):
    return _decode_f32(_unsigned(tl.load(ptr + idx * stride, mask=mask, other=0), W), DT)


@triton.jit
def _ep_scale(x, rows, cols, rmask, cmask, rs_ptr, rs_s, cs_ptr, cs_s, ts_ptr,
              HAS_RS: tl.constexpr, RS_DT: tl.constexpr, RS_W: tl.constexpr,
              HAS_CS: tl.constexpr, CS_DT: tl.constexpr, CS_W: tl.constexpr,
              HAS_TS: tl.constexpr, TS_DT: tl.constexpr, TS_W: tl.constexpr):
    if HAS_RS:
        x = x * _load_vec(rs_ptr, rows, rs_s, rmask, RS_DT, RS_W)[:, None]
    if HAS_CS:
        x = x * _load_vec(cs_ptr, cols, cs_s, cmask, CS_DT, CS_W)[None, :]
    if HAS_TS:
        x = x * _decode_f32(_unsigned(tl.load(ts_ptr), TS_W), TS_DT)
    return x


@triton.jit
def _ep_alpha_beta(x, alpha, beta, c_ptr, c_r, c_c, rows, cols, mask,
                   HAS_C: tl.constexpr, C_DT: tl.constexpr, C_W: tl.constexpr):
    x = alpha * x
    if HAS_C:
        c = _decode_f32(_unsigned(tl.load(c_ptr + rows[:, None] * c_r + cols[None, :] * c_c, mask=mask, other=0),
                                  C_W), C_DT)
        x = x + beta * c
    return x


@triton.jit
def _ep_bias(x, b_ptr, b_s, rows, cols, rmask, cmask, AXIS: tl.constexpr, B_DT: tl.constexpr, B_W: tl.constexpr):
    if AXIS == 1:
        x = x + _load_vec(b_ptr, rows, b_s, rmask, B_DT, B_W)[:, None]
    elif AXIS == 2:
        x = x + _load_vec(b_ptr, cols, b_s, cmask, B_DT, B_W)[None, :]
    return x


@triton.jit
def _ep_activation(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.where(x < 0.0, 0.0, x)
    elif ACT == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == 3:
        u = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        x = x / (1.0 + tl.exp(-2.0 * u))
    elif ACT == 4:
        x = x / (1.0 + tl.exp(-x))
    return x


@triton.jit
def _ep_cast(x, OUT: tl.constexpr, SAT: tl.constexpr):
    """fp32 values -> bit patterns of the output format (int32 holding them). An int32 output is
    __float2int_rn's: nearest even integer, clamped to int32's range, NaN -> 0."""
    if OUT == 6:
        return _encode_int(x, -2147483648, 2147483647)
    return _encode(x, OUT, SAT)


@triton.jit
def _epilogue_tile(x, rows, cols, R, Cn, ep, EP):
    """scale -> alpha_beta -> bias -> activation -> cast on an fp32 tile at global (rows, cols) of
    an [R, Cn] output; ep: EpArgs, EP: EpConsts. Returns the four fp32 intermediates and the
    output bit patterns."""
    rs_ptr, rs_s, cs_ptr, cs_s, ts_ptr, alpha, beta, c_ptr, c_r, c_c, b_ptr, b_s = ep
    rmask = rows < R
    cmask = cols < Cn
    mask = rmask[:, None] & cmask[None, :]
    x1 = _ep_scale(x, rows, cols, rmask, cmask, rs_ptr, rs_s, cs_ptr, cs_s, ts_ptr,
                   EP.HAS_RS, EP.RS_DT, EP.RS_W, EP.HAS_CS, EP.CS_DT, EP.CS_W, EP.HAS_TS, EP.TS_DT, EP.TS_W)
    x2 = _ep_alpha_beta(x1, alpha, beta, c_ptr, c_r, c_c, rows, cols, mask, EP.HAS_C, EP.C_DT, EP.C_W)
    x3 = _ep_bias(x2, b_ptr, b_s, rows, cols, rmask, cmask, EP.AXIS, EP.B_DT, EP.B_W)
    x4 = _ep_activation(x3, EP.ACT)
    return x1, x2, x3, x4, _ep_cast(x4, EP.OUT, EP.SAT)


@triton.jit
def _epilogue_kernel(x, R, Cn, out, st, ep, EP, X_DT: tl.constexpr, X_W: tl.constexpr, OUT_W: tl.constexpr,
                     STEPS: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Block (program_id 0, 1) of x [R, Cn] into out, and with STEPS the four intermediates into
    st [4, R, Cn]; x, out (ptr, stride_r, stride_c), st (ptr, stride_step, stride_r)."""
    x_ptr, sx_r, sx_c = x
    out_ptr, so_r, so_c = out
    st_ptr, st_s, st_r = st
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    mask = (rows < R)[:, None] & (cols < Cn)[None, :]
    raw = tl.load(x_ptr + rows[:, None] * sx_r + cols[None, :] * sx_c, mask=mask, other=0)
    x = _decode_f32(_unsigned(raw, X_W), X_DT)
    x1, x2, x3, x4, bits = _epilogue_tile(x, rows, cols, R, Cn, ep, EP)
    tl.store(out_ptr + rows[:, None] * so_r + cols[None, :] * so_c, _to_storage(bits, OUT_W), mask=mask)
    if STEPS:
        off = rows[:, None] * st_r + cols[None, :]
        tl.store(st_ptr + off, x1, mask=mask)
        tl.store(st_ptr + st_s + off, x2, mask=mask)
        tl.store(st_ptr + 2 * st_s + off, x3, mask=mask)
        tl.store(st_ptr + 3 * st_s + off, x4, mask=mask)


# ----------------------------------------------------------------------------------------------
# argument handling
# ----------------------------------------------------------------------------------------------


def check_supported(out_dtype: str = "bf16", activation: str = "none", bias_axis: Optional[str] = None,
                    x_dtype: str = "fp32") -> list[str]:
    """Reasons this epilogue cannot be modelled (empty list: supported)."""
    reasons = []
    if out_dtype not in OUT_DTYPES:
        reasons.append(f"out_dtype={out_dtype!r} is not allowed; allowed: {', '.join(OUT_DTYPES)}")
    if activation not in ACTIVATIONS:
        reasons.append(f"activation={activation!r} is not allowed; allowed: {', '.join(ACTIVATIONS)}")
    if bias_axis not in BIAS_AXES:
        reasons.append(f"bias_axis={bias_axis!r} is not allowed; allowed: None, 'row', 'col'")
    if x_dtype not in _IN_NAMES:
        reasons.append(f"x_dtype={x_dtype!r} is not allowed; allowed: {', '.join(_IN_NAMES)}")
    return reasons


def _vec(name, v, n):
    if v is None:
        return None
    C.require_tensor(name, v, 1)
    C.dtype_name(name, v, _VEC_NAMES)
    if v.shape[0] != n:
        raise ValueError(f"{name} has length {v.shape[0]}; expected {n}")
    return v


def _tensor_scale(t):
    if t is None:
        return None
    C.require_tensor("tensor_scale", t)
    C.dtype_name("tensor_scale", t, _VEC_NAMES)
    if t.numel() != 1:
        raise ValueError(f"tensor_scale must hold one element (0-d or 1-element), got shape {tuple(t.shape)}")
    return t.reshape(1)


class EpArgs(NamedTuple):
    """The epilogue's runtime arguments, one tuple argument (`ep`) of the kernels that run it: the
    scale vectors (bits, stride), the tensor scale, alpha and beta, C (bits, strides), the bias."""

    rs_ptr: torch.Tensor
    rs_s: int
    cs_ptr: torch.Tensor
    cs_s: int
    ts_ptr: torch.Tensor
    alpha: float
    beta: float
    c_ptr: torch.Tensor
    c_r: int
    c_c: int
    b_ptr: torch.Tensor
    b_s: int


class EpConsts(NamedTuple):
    """The epilogue's compile-time constants, one tuple argument (`EP`): for each optional input
    whether it is there, its element code and width; the bias axis (0 none, 1 row, 2 col), the
    activation, the output format and saturation."""

    HAS_RS: tl.constexpr
    RS_DT: tl.constexpr
    RS_W: tl.constexpr
    HAS_CS: tl.constexpr
    CS_DT: tl.constexpr
    CS_W: tl.constexpr
    HAS_TS: tl.constexpr
    TS_DT: tl.constexpr
    TS_W: tl.constexpr
    HAS_C: tl.constexpr
    C_DT: tl.constexpr
    C_W: tl.constexpr
    AXIS: tl.constexpr
    B_DT: tl.constexpr
    B_W: tl.constexpr
    ACT: tl.constexpr
    OUT: tl.constexpr
    SAT: tl.constexpr


class _Operands:
    """Validated epilogue inputs for an output of shape [R, Cn]."""

    def __init__(self, R, Cn, ep: Epilogue, c, bias, row_scale, col_scale, tensor_scale):
        self.row_scale = _vec("row_scale", row_scale, R)
        self.col_scale = _vec("col_scale", col_scale, Cn)
        self.tensor_scale = _tensor_scale(tensor_scale)
        if ep.beta != 0:
            if c is None:
                raise ValueError(f"beta={ep.beta!r} is non-zero, so c (an [R, C] = [{R}, {Cn}] tensor) is required")
            C.require_tensor("c", c, 2)
            C.dtype_name("c", c, _VEC_NAMES)
            if tuple(c.shape) != (R, Cn):
                raise ValueError(f"c has shape {tuple(c.shape)}; expected {(R, Cn)}")
        self.c = c if ep.beta != 0 else None
        if ep.bias_axis is None:
            if bias is not None:
                raise ValueError("bias given but bias_axis is None; set bias_axis='row' or 'col'")
            self.bias = None
        else:
            self.bias = _vec("bias", bias, R if ep.bias_axis == "row" else Cn)
            if self.bias is None:
                raise ValueError(f"bias_axis={ep.bias_axis!r} needs a bias tensor")
        self.ep = ep

    def tensors(self):
        return (("c", self.c), ("bias", self.bias), ("row_scale", self.row_scale), ("col_scale", self.col_scale),
                ("tensor_scale", self.tensor_scale))

    def kernel_args(self, dummy: torch.Tensor) -> dict:
        """The two arguments of `_epilogue_tile`: `ep` (EpArgs) and `EP` (EpConsts); `dummy` stands
        for the inputs that are not there."""
        def vec(v):
            if v is None:
                return (dummy, 0), (False, 0, 4)
            vb = C.bits_view(v)
            return (vb, vb.stride(0)), (True, C.CODES[C.name_of(v.dtype)], v.element_size())

        (rs, rs_s), (has_rs, rs_dt, rs_w) = vec(self.row_scale)
        (cs, cs_s), (has_cs, cs_dt, cs_w) = vec(self.col_scale)
        (ts, _), (has_ts, ts_dt, ts_w) = vec(self.tensor_scale)
        (bb, b_s), (has_b, b_dt, b_w) = vec(self.bias)
        if self.c is not None:
            cb = C.bits_view(self.c)
            c_ptr, c_r, c_c = cb, cb.stride(0), cb.stride(1)
            has_c, c_dt, c_w = True, C.CODES[C.name_of(self.c.dtype)], self.c.element_size()
        else:
            c_ptr, c_r, c_c, has_c, c_dt, c_w = dummy, 0, 0, False, 0, 4
        ep = self.ep
        args = EpArgs(rs, rs_s, cs, cs_s, ts, float(ep.alpha), float(ep.beta), c_ptr, c_r, c_c, bb, b_s)
        consts = C.constexprs(EpConsts, HAS_RS=has_rs, RS_DT=rs_dt, RS_W=rs_w, HAS_CS=has_cs, CS_DT=cs_dt, CS_W=cs_w,
                              HAS_TS=has_ts, TS_DT=ts_dt, TS_W=ts_w, HAS_C=has_c, C_DT=c_dt, C_W=c_w,
                              AXIS=_AXIS_CODE[ep.bias_axis] if has_b else 0, B_DT=b_dt, B_W=b_w,
                              ACT=_ACT_CODE[ep.activation], OUT=C.CODES[ep.out_dtype], SAT=ep.saturate)
        return dict(ep=args, EP=consts)


def _check_x(x):
    C.require_tensor("x", x, 2)
    return C.dtype_name("x", x, _IN_NAMES)


def _run(x: torch.Tensor, ep: Epilogue, ops: _Operands, steps: bool):
    xd = C.dtype_name("x", x, _IN_NAMES)
    dev = C.check_device(("x", x), *ops.tensors())
    R, Cn = x.shape
    out = torch.empty((R, Cn), dtype=DTYPES[ep.out_dtype].torch, device=dev)
    st = torch.empty((4, R, Cn), dtype=torch.float32, device=dev) if steps else out
    BR, BC = 64, 64
    if R and Cn:
        _epilogue_kernel[(C.cdiv(R, BR), C.cdiv(Cn, BC))](
            C.strided(x), R, Cn, C.strided(out), (st, R * Cn if steps else 0, Cn if steps else 0),
            X_DT=C.CODES[xd], X_W=x.element_size(), OUT_W=out.element_size(), STEPS=steps, BR=BR, BC=BC,
            **ops.kernel_args(C.bits_view(x)), **C.launch_options(dev))
    if steps:
        return EpilogueSteps(st[0], st[1], st[2], st[3], out)
    return out


_FP32_OUT = dict(out_dtype="fp32")

# ----------------------------------------------------------------------------------------------
# public launchers
# ----------------------------------------------------------------------------------------------


def apply_scale(x: torch.Tensor, row_scale: Optional[torch.Tensor] = None, col_scale: Optional[torch.Tensor] = None,
                tensor_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x * row_scale[:, None] * col_scale[None, :] * tensor_scale in fp32 (each optional)."""
    _check_x(x)
    ep = Epilogue(**_FP32_OUT)
    return _run(x, ep, _Operands(*x.shape, ep, None, None, row_scale, col_scale, tensor_scale), False)


def apply_alpha_beta(x: torch.Tensor, alpha: float, beta: float = 0.0,
                     c: Optional[torch.Tensor] = None) -> torch.Tensor:
    """alpha * x + beta * c in fp32 (c any float dtype; beta == 0 does not read c)."""
    _check_x(x)
    ep = Epilogue(alpha=alpha, beta=beta, **_FP32_OUT)
    return _run(x, ep, _Operands(*x.shape, ep, c, None, None, None, None), False)


def apply_bias(x: torch.Tensor, bias: torch.Tensor, axis: str) -> torch.Tensor:
    """x + bias[:, None] (axis "row", bias length R) or x + bias[None, :] (axis "col", length C)."""
    _check_x(x)
    C.require_choice("axis", axis, ("row", "col"))
    ep = Epilogue(bias_axis=axis, **_FP32_OUT)
    return _run(x, ep, _Operands(*x.shape, ep, None, bias, None, None, None), False)


def apply_activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Activation `kind` (none, relu, gelu_erf, gelu_tanh, silu) in fp32."""
    _check_x(x)
    C.require_choice("kind", kind, ACTIVATIONS)
    ep = Epilogue(activation=kind, **_FP32_OUT)
    return _run(x, ep, _Operands(*x.shape, ep, None, None, None, None, None), False)


def apply_cast(x: torch.Tensor, out_dtype_name: str, saturate: bool = False) -> torch.Tensor:
    """Round (RNE) into out_dtype_name; saturate clamps to +-max finite first."""
    _check_x(x)
    C.require_choice("out_dtype_name", out_dtype_name, OUT_DTYPES)
    if not isinstance(saturate, bool):
        raise ValueError(f"saturate={saturate!r} must be a bool")
    ep = Epilogue(out_dtype=out_dtype_name, saturate=saturate)
    return _run(x, ep, _Operands(*x.shape, ep, None, None, None, None, None), False)


def apply_alpha(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """fp32(alpha * x): the alpha step of a graph that adds beta * C apart."""
    return apply_alpha_beta(x, alpha, 0.0)


def apply_beta_c(x: torch.Tensor, beta: float, c: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x + fp32(beta * c) in fp32 (beta == 0 does not read c)."""
    return apply_alpha_beta(x, 1.0, beta, c)


def apply_round(x: torch.Tensor, dtype_name: str) -> torch.Tensor:
    """x rounded (RNE) to dtype_name (fp32, fp16, bf16), returned as fp32 values."""
    C.require_choice("dtype_name", dtype_name, G.ROUND_DTYPES)
    return x.float() if dtype_name == "fp32" else apply_cast(x, dtype_name).float()


def _graph(acc, ep: Epilogue, ops: "_Operands", fns: dict, return_steps: bool):
    """The declared graph's nodes in order, each by its launcher in `fns` (Triton or host)."""
    x, names, values = acc, [], []
    for node in ep.nodes:
        st = node.step
        if st == "scale":
            y = fns["scale"](x, ops.row_scale, ops.col_scale, ops.tensor_scale)
        elif st == "alpha_beta":
            y = fns["alpha_beta"](x, ep.alpha, ep.beta, ops.c)
        elif st == "alpha":
            y = fns["alpha_beta"](x, ep.alpha, 0.0, None)
        elif st == "beta_c":
            y = fns["alpha_beta"](x, 1.0, ep.beta, ops.c)
        elif st == "bias":
            y = x if ops.bias is None else fns["bias"](x, ops.bias, ep.bias_axis)
        elif st == "activation":
            y = fns["activation"](x, ep.activation)
        else:
            y = fns["cast"](x, ep.out_dtype, ep.saturate)
        if node.rounds:
            y = fns["round"](y, node.round)
        names.append(st)
        values.append(y)
        x = y
    return GraphSteps(tuple(names), tuple(values)) if return_steps else x


def epilogue(acc: torch.Tensor, ep: Epilogue = Epilogue(), *, c: Optional[torch.Tensor] = None,
             bias: Optional[torch.Tensor] = None, row_scale: Optional[torch.Tensor] = None,
             col_scale: Optional[torch.Tensor] = None, tensor_scale: Optional[torch.Tensor] = None,
             return_steps: bool = False):
    """scale -> alpha_beta -> bias -> activation -> cast in one kernel. Returns the output in
    ep.out_dtype, or with return_steps an EpilogueSteps of every intermediate. A declared graph
    (ep.graph other than the default) runs its nodes in its order, one launch each; with
    return_steps it returns a GraphSteps."""
    if not isinstance(ep, Epilogue):
        raise ValueError(f"ep must be an Epilogue, got {type(ep).__name__}")
    C.require_tensor("acc", acc, 2)
    C.dtype_name("acc", acc, _IN_NAMES)
    ops = _Operands(*acc.shape, ep, c, bias, row_scale, col_scale, tensor_scale)
    if ep.fused:
        return _run(acc, ep, ops, return_steps)
    C.check_device(("acc", acc), *ops.tensors())
    return _graph(acc, ep, ops, _TRITON_STEPS, return_steps)


_TRITON_STEPS = {"scale": lambda x, r, c, t: x.float() if r is None and c is None and t is None else
                 apply_scale(x, r, c, t), "alpha_beta": apply_alpha_beta, "bias": apply_bias,
                 "activation": apply_activation, "cast": apply_cast, "round": apply_round}


# ----------------------------------------------------------------------------------------------
# host specifications (CPU float64 holding fp32-rounded values; the cast returns its dtype)
# ----------------------------------------------------------------------------------------------


def _h(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().cpu().to(torch.float64)


def _x_host(x: torch.Tensor) -> torch.Tensor:
    """Host input: a kernel-side dtype, or float64 (a previous host step's output)."""
    C.require_tensor("x", x, 2)
    if x.dtype != torch.float64:
        _check_x(x)
    return C.f32(_h(x))


def apply_scale_host(x, row_scale=None, col_scale=None, tensor_scale=None) -> torch.Tensor:
    y = _x_host(x)
    R, Cn = y.shape
    if row_scale is not None:
        y = C.f32(y * _h(_vec("row_scale", row_scale, R))[:, None])
    if col_scale is not None:
        y = C.f32(y * _h(_vec("col_scale", col_scale, Cn))[None, :])
    if tensor_scale is not None:
        y = C.f32(y * _h(_tensor_scale(tensor_scale))[0])
    return y


def _fp32_scalar(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def apply_alpha_beta_host(x, alpha, beta=0.0, c=None) -> torch.Tensor:
    y = _x_host(x)
    ep = Epilogue(alpha=alpha, beta=beta, out_dtype="fp32")
    ops = _Operands(*y.shape, ep, c, None, None, None, None)
    y = C.f32(_fp32_scalar(alpha) * y)
    if ops.c is not None:
        y = C.f32(y + C.f32(_fp32_scalar(beta) * _h(ops.c)))
    return y


def apply_bias_host(x, bias, axis) -> torch.Tensor:
    y = _x_host(x)
    C.require_choice("axis", axis, ("row", "col"))
    b = _h(_vec("bias", bias, y.shape[0] if axis == "row" else y.shape[1]))
    return C.f32(y + (b[:, None] if axis == "row" else b[None, :]))


def apply_activation_host(x, kind) -> torch.Tensor:
    y = _x_host(x)
    C.require_choice("kind", kind, ACTIVATIONS)
    if kind == "relu":
        y = torch.where(y < 0, torch.zeros_like(y), y)
    elif kind == "gelu_erf":
        y = 0.5 * y * (1.0 + torch.erf(y / math.sqrt(2.0)))
    elif kind == "gelu_tanh":
        u = math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)
        y = y * torch.sigmoid(2.0 * u)  # = 0.5 y (1 + tanh u), without cancellation for y << 0
    elif kind == "silu":
        y = y * torch.sigmoid(y)
    return C.f32(y)


def apply_cast_host(x, out_dtype_name, saturate=False) -> torch.Tensor:
    """Host spec of `apply_cast`, in out_dtype_name: torch's RNE `.to()` for the float formats
    (e4m3 overflow -> NaN, every NaN the format's positive quiet NaN); for int32 the nearest
    even integer (`torch.round` in float64, exact), clamped to the range, NaN -> 0."""
    y = _x_host(x)
    C.require_choice("out_dtype_name", out_dtype_name, OUT_DTYPES)
    dt = DTYPES[out_dtype_name]
    nan = torch.isnan(y)
    if out_dtype_name in INT_RANGES:
        lo, hi = INT_RANGES[out_dtype_name]
        r = torch.clamp(torch.round(torch.where(nan, torch.zeros_like(y), y)), lo, hi)
        return r.to(dt.torch)
    y = y.to(torch.float32)  # exact: _x_host holds fp32 values
    if saturate:
        y = torch.clamp(y, -dt.max_finite, dt.max_finite)
    out = y.to(dt.torch).clone()
    bits = C.bits_view(out)
    if out_dtype_name == "e4m3" and not saturate:
        bits[y.abs() > E4M3_OVERFLOW] = C.NAN_BITS["e4m3"]  # includes +-inf
    bits[nan] = C.NAN_BITS[out_dtype_name]  # every pattern there is below the sign bit
    return out


def epilogue_host(acc: torch.Tensor, ep: Epilogue = Epilogue(), *, c=None, bias=None, row_scale=None, col_scale=None,
                  tensor_scale=None, return_steps: bool = False):
    """Host spec of `epilogue`: the composition of the host sub-steps."""
    if not isinstance(ep, Epilogue):
        raise ValueError(f"ep must be an Epilogue, got {type(ep).__name__}")
    a64 = _x_host(acc)
    ops = _Operands(*acc.shape, ep, c, bias, row_scale, col_scale, tensor_scale)
    if not ep.fused:
        return _graph(a64, ep, ops, _HOST_STEPS, return_steps)
    s1 = apply_scale_host(a64, ops.row_scale, ops.col_scale, ops.tensor_scale)
    s2 = apply_alpha_beta_host(s1, ep.alpha, ep.beta, ops.c)
    s3 = apply_bias_host(s2, ops.bias, ep.bias_axis) if ep.bias_axis is not None else s2
    s4 = apply_activation_host(s3, ep.activation)
    s5 = apply_cast_host(s4, ep.out_dtype, ep.saturate)
    if return_steps:
        return EpilogueSteps(s1, s2, s3, s4, s5)
    return s5


def apply_alpha_host(x, alpha) -> torch.Tensor:
    return apply_alpha_beta_host(x, alpha, 0.0)


def apply_beta_c_host(x, beta, c=None) -> torch.Tensor:
    return apply_alpha_beta_host(x, 1.0, beta, c)


def apply_round_host(x, dtype_name) -> torch.Tensor:
    """Host spec of `apply_round`: the cast's host spec, as float64 holding the rounded values."""
    C.require_choice("dtype_name", dtype_name, G.ROUND_DTYPES)
    return _x_host(x) if dtype_name == "fp32" else apply_cast_host(x, dtype_name).to(torch.float64)


_HOST_STEPS = {"scale": apply_scale_host, "alpha_beta": apply_alpha_beta_host, "bias": apply_bias_host,
               "activation": apply_activation_host, "cast": apply_cast_host, "round": apply_round_host}


class _CallableModule(types.ModuleType):
    """`kernels_ref.epilogue` is this module and, called, the `epilogue` function."""

    def __call__(self, *args, **kwargs):
        return epilogue(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

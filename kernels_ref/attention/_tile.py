"""Plumbing of the attention stages: stacked-tile launches and in-kernel tile loads.

Every stage launcher takes tiles stacked along a first "unit" axis ([U, rows, cols]) and runs one
program per unit; tiles are padded in-kernel to powers of two of at least 16 (tl.dot's minimum).
Operands are read as raw bits and decoded to fp32 (kernels_ref._codec), so the interpreter (whose
tl.dot on bf16 multiplies raw bits) and the GPU (an fp32 dot with input_precision="ieee") see the
same exact operand values.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._codec import _decode_f32, _unsigned


def pad(n: int) -> int:
    return C.pad_dim(n, 16)


def code(name: str) -> int:
    return C.CODES[name]


def dtype_of(x: torch.Tensor):
    """The short dtype name of a tensor, or None for a type the table does not know."""
    try:
        return C.name_of(x.dtype)
    except ValueError:
        return None


def tiles_reasons(named, allowed, ndim: int = 3) -> list[str]:
    """Reasons these tensors are not [U, ...] stacks of tiles (ndim dims) of an allowed dtype."""
    out = []
    for name, x in named:
        if not isinstance(x, torch.Tensor) or x.dim() != ndim:
            out.append(f"{name} must be a {ndim}-D tensor of tiles stacked along units")
        elif dtype_of(x) not in allowed:
            out.append(f"{name} has dtype {x.dtype}; allowed: {', '.join(allowed)}")
    return out


@triton.jit
def _load_f32(ptr, s_r, s_c, R, Cn, RP: tl.constexpr, CP: tl.constexpr, DT: tl.constexpr, W: tl.constexpr):
    """A [RP, CP] fp32 tile of an [R, Cn] matrix of element type DT (storage width W), 0 outside."""
    r = tl.arange(0, RP)[:, None]
    c = tl.arange(0, CP)[None, :]
    ok = (r < R) & (c < Cn)
    raw = tl.load(ptr + r * s_r + c * s_c, mask=ok, other=0)
    return tl.where(ok, _decode_f32(_unsigned(raw, W), DT), 0.0)


@triton.jit
def _unit_rows(t_ptr, m_ptr, l_ptr, u, BQ, C, OTHER: tl.constexpr, BQP: tl.constexpr, CP: tl.constexpr):
    """Unit u's tile [BQ, C] (OTHER outside, in a [BQP, CP] block) and its rows' running max m
    (-inf outside) and sum l (0 outside), of contiguous fp32 stacks; with the row index r [BQP] and
    the tile's mask ok."""
    r = tl.arange(0, BQP)
    c = tl.arange(0, CP)
    ok = (r[:, None] < BQ) & (c[None, :] < C)
    t = tl.load(t_ptr + u * BQ * C + r[:, None] * C + c[None, :], mask=ok, other=OTHER)
    m = tl.load(m_ptr + u * BQ + r, mask=r < BQ, other=float("-inf"))
    l = tl.load(l_ptr + u * BQ + r, mask=r < BQ, other=0.0)
    return t, m, l, r, c, ok


@triton.jit
def _dot32(a, b, INTERP: tl.constexpr):
    """a @ b of fp32 tiles, fp32 products and sums (ieee on the GPU: no TF32)."""
    if INTERP:
        return tl.dot(a, b)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _dot_carried(a, b, DT: tl.constexpr, INTERP: tl.constexpr):
    """a @ b of fp32 tiles whose every value is one of DT's: on the GPU through the tensor cores in a
    16-bit carrier that holds DT exactly (fp16 for fp16; bf16 for bf16, e4m3 and e5m2), the products
    exact and the sums in fp32, as the kernel's own MMA sums them (within the 2u an addition the
    output model allows each side); fp32 and other types, and the interpreter, as _dot32."""
    if INTERP:
        return tl.dot(a, b)
    elif DT == 1:
        return tl.dot(a.to(tl.float16), b.to(tl.float16), out_dtype=tl.float32)
    elif DT == 2 or DT == 3 or DT == 4:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
    else:
        return tl.dot(a, b, input_precision="ieee")


def row_state_reasons(name: str, tiles, m, l) -> list[str]:
    """Reasons `tiles` ([U, BQ, C] fp32) and its rows' running max m and sum l ([U, BQ] fp32 each)
    do not go together."""
    reasons = tiles_reasons(((name, tiles),), ("fp32",)) + tiles_reasons((("m", m), ("l", l)), ("fp32",), 2)
    if not reasons and (tuple(m.shape) != tuple(tiles.shape[:2]) or tuple(l.shape) != tuple(tiles.shape[:2])):
        reasons.append(f"m {list(m.shape)} and l {list(l.shape)} must be [units, rows] of {name} "
                       f"{list(tiles.shape)}")
    return reasons


def row_state_inputs(name: str, tiles, m, l) -> tuple:
    """(device, tiles, m, l), each contiguous, of a stage that reads a tile stack and its rows'
    running max and sum; `row_state_reasons` raised as one error."""
    reasons = row_state_reasons(name, tiles, m, l)
    if reasons:
        raise C.reasons_error(reasons)
    dev = C.check_device((name, tiles), ("m", m), ("l", l))
    return dev, tiles.contiguous(), m.contiguous(), l.contiguous()

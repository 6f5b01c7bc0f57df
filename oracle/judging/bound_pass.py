"""The accumulation bound of the whole output in one pass over its statistics, where the bound is
linear in them (oracle.judging.accumulation_bound.BoundForm.fused): one Triton program per block of
elements reads L, V (float32, as the reference wrote them) and S, and writes the float64 bound,
with the operations of `BoundForm.evaluate` in its order and no fused multiply-add, so the values
are the same bits. The float64 passes it replaces moved about 30 times the bytes.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

from kernels_ref._common import device_tensor, refusal

BLOCK = 1024
MAX_MEMBERS = 8


class PassUnavailable(Exception):
    """Triton could not build the pass for this form (its compiler's error inside): the caller evaluates
    the form's torch definition instead, and says so."""


@triton.jit
def _term(out, started: tl.constexpr, k, x):
    """out + k x, or k x where no term came before (as torch adds a Linear's terms)."""
    if started:
        out = out + k * x
    else:
        out = k * x
    return out


@triton.jit
def _linear(coef_ptr, at: tl.constexpr, mask: tl.constexpr, l, r, s):
    """a l + b r + c s, the terms in mask (bit 0 a, 1 b, 2 c) added in that order."""
    out = tl.zeros_like(l)
    if mask & 1:
        out = _term(out, False, tl.load(coef_ptr + at), l)
    if mask & 2:
        out = _term(out, mask & 1, tl.load(coef_ptr + at + 1), r)
    if mask & 4:
        out = _term(out, mask & 3, tl.load(coef_ptr + at + 2), s)
    return out


@triton.jit
def _cover(coef_ptr, at: tl.constexpr, l, r, s):
    """e (s + min(k r, l)), torch.minimum's NaN kept."""
    least = tl.minimum(tl.load(coef_ptr + at + 1) * r, l, propagate_nan=tl.PropagateNan.ALL)
    return tl.load(coef_ptr + at) * (s + least)


@triton.jit
def _bound_kernel(l_ptr, v_ptr, s_ptr, out_ptr, coef_ptr, n, N_MEMBERS: tl.constexpr, MASKS: tl.constexpr,
                  REF_MASK: tl.constexpr, N_COVERS: tl.constexpr, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    margin, margin2 = tl.load(coef_ptr), tl.load(coef_ptr + 1)
    l = tl.load(l_ptr + offs, mask=keep).to(tl.float64) * margin
    v = tl.load(v_ptr + offs, mask=keep).to(tl.float64) * margin2
    s = tl.load(s_ptr + offs, mask=keep).to(tl.float64)
    r = tl.sqrt(tl.where(v < 0, 0.0, v))  # float64: IEEE, rounded to nearest
    at: tl.constexpr = 2 + 3 * N_MEMBERS
    ref = _linear(coef_ptr, at, REF_MASK, l, r, s)
    engine = _linear(coef_ptr, 2, MASKS & 7, l, r, s)
    for i in tl.static_range(1, N_MEMBERS):  # torch.maximum: NaN wins
        member = _linear(coef_ptr, 2 + 3 * i, (MASKS >> (3 * i)) & 7, l, r, s)
        engine = tl.maximum(engine, member, propagate_nan=tl.PropagateNan.ALL)
    bound = engine + ref
    if N_COVERS > 0:
        red = _cover(coef_ptr, at + 3, l, r, s)
        for j in tl.static_range(1, N_COVERS):
            red = tl.maximum(red, _cover(coef_ptr, at + 3 + 2 * j, l, r, s), propagate_nan=tl.PropagateNan.ALL)
        bound = bound + red
    if GROUPS:
        bound = bound + tl.load(coef_ptr + at + 3 + 2 * N_COVERS) * r
    tl.store(out_ptr + offs, bound, mask=keep)


def applies(l: torch.Tensor, v: torch.Tensor, s: torch.Tensor) -> bool:
    """Statistics the pass reads: on a GPU, contiguous, of one shape, float."""
    return (s.device.type == "cuda" and l.device == s.device and v.device == s.device
            and l.shape == s.shape and v.shape == s.shape
            and all(t.is_contiguous() and t.dtype in (torch.float32, torch.float64) for t in (l, v, s)))


def _mask(lin) -> int:
    return (lin.a is not None) | (lin.b is not None) << 1 | (lin.c is not None) << 2


def evaluate(form, l: torch.Tensor, v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """BoundForm.evaluate of a fused form (`form.fused()`) on statistics that `applies` (or any, under
    the interpreter): l, v as the reference wrote them (STATS_MARGIN is applied here, as mma_bound
    applies it), float64 out."""
    from oracle.judging.accumulation_models import STATS_MARGIN

    members = [lin for lin, _ in form.members]
    if not form.fused() or not 1 <= len(members) <= MAX_MEMBERS:
        raise ValueError("bound_pass evaluates a fused BoundForm of 1 to 8 members")
    coef = [STATS_MARGIN, STATS_MARGIN ** 2]
    for lin in members + [form.reference]:
        coef += [0.0 if x is None else x for x in (lin.a, lin.b, lin.c)]
    for cover in form.reduction:
        coef += [cover.e, cover.k]
    if form.groups is not None:
        coef.append(form.groups.b)
    coef_t = device_tensor(coef, s.device, torch.float64)
    out = torch.empty(s.shape, dtype=torch.float64, device=s.device)
    n = s.numel()
    if n:
        masks = 0
        for i, lin in enumerate(members):
            masks |= _mask(lin) << (3 * i)
        try:
            _bound_kernel[(triton.cdiv(n, BLOCK),)](
                l, v, s, out, coef_t, n, N_MEMBERS=len(members), MASKS=masks, REF_MASK=_mask(form.reference),
                N_COVERS=len(form.reduction), GROUPS=form.groups is not None, BLOCK=BLOCK, enable_fp_fusion=False)
        except CompilationError as e:  # the compiler's refusal, before anything ran
            raise PassUnavailable(refusal(e)) from e
    return out

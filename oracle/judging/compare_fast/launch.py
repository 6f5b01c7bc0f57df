"""`tile_stats`: the one pass and the fold, on the device with no host synchronisation. It checks
the inputs, plans the launch, picks the kernels' modes (bound, exact-difference proof, bf16 pairs)
and launches the fast pass and the float64 pass (oracle.judging.compare_fast.kernels).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from typing import Optional

import torch

from oracle.judging.compare_fast.fold import _fold
from oracle.judging.compare_fast.kernels import _fast_kernel, _general_kernel
from oracle.judging.compare_fast.kinds import (B_EXACT, B_INLINE, B_TENSOR, K_BF16, K_F32, K_F64, K_LUT, K_WIDE_INT,
                                       SUB_ALWAYS, _kind, _lut, _sub_mode, check_supported)
from oracle.judging.compare_fast.plan import DEFAULT_CONFIG, FastConfig, _next_pow2, _plan
from oracle.judging.compare_fast.stats import NSTAT, S_GENERAL, TileStats

# The GPU's fma chains and single combined reduction are slow under the interpreter (nested calls,
# a tuple reduced element by element); tests switch them on there to check their arithmetic.
_FUSED_IN_INTERPRETER = False

_B_MIN = 2.0 ** -100  # bounds below this only pass exact zeros on the fast pass (quotients stay exact)


@functools.lru_cache(maxsize=None)
def _sm_count(index: Optional[int]) -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index) \
        .multi_processor_count


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _validate(received, expected, bound, rtol, atol, mask):
    if received.shape != expected.shape:
        raise ValueError(f"received shape {tuple(received.shape)} != expected shape {tuple(expected.shape)}")
    if received.dim() != 2:
        raise ValueError(f"compare takes 2-D tensors, got {received.dim()}-D")
    exact = bound is None and rtol is None and atol is None
    if exact and received.dtype != expected.dtype:
        raise ValueError(f"bit-exact compare needs one dtype, got {received.dtype} and {expected.dtype}")
    reasons = check_supported(received, expected, bound=bound, mask=mask, rtol=rtol, atol=atol)
    if reasons:
        raise ValueError("compare_fast cannot take these inputs: " + "; ".join(reasons))
    return exact


def tile_stats(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
               rtol: Optional[float] = None, atol: Optional[float] = None, mask: Optional[torch.Tensor] = None,
               tile_shape: Optional[tuple[int, int]] = None, config: Optional[FastConfig] = None,
               fast_pass: bool = True) -> TileStats:
    """The one pass and the fold: per-tile statistics on the device, no host synchronisation.
    `fast_pass=False` makes every program take the float64 pass (a cross-check of the fast one)."""
    exact = _validate(received, expected, bound, rtol, atol, mask)
    cfg = config or DEFAULT_CONFIG
    dev = received.device
    h, w = received.shape
    nbytes = received.element_size() + expected.element_size() + (mask is not None)
    nbytes += bound.element_size() if bound is not None else 0
    plan = _plan(h, w, None if tile_shape is None else tuple(tile_shape), cfg, nbytes)
    if config is None and _interpreting():  # the interpreter pays per step, not per register
        plan = replace(plan, bm=_next_pow2(plan.pm), even=plan.even and plan.pm == _next_pow2(plan.pm))
    if h == 0 or w == 0:
        return TileStats(torch.zeros(plan.tiles_h, plan.tiles_w, NSTAT, dtype=torch.float64, device=dev),
                         (h, w), (plan.th, plan.tw), 0)
    if plan.programs >= 2 ** 31:
        raise ValueError(f"{plan.programs} programs for shape {(h, w)} and tiles {(plan.th, plan.tw)}: "
                         "expected fewer than 2^31 (use larger tiles)")
    expected = expected.to(dev)
    kr, ke = _kind(received.dtype), _kind(expected.dtype)
    rv, ev = received.view(kr.view), expected.view(ke.view)
    out = torch.empty(plan.programs, NSTAT, dtype=torch.float64, device=dev)
    lut_r = _lut(received.dtype, dev) if kr.kind == K_LUT else out
    lut_e = _lut(expected.dtype, dev) if ke.kind == K_LUT else out
    if exact:
        b_mode, kb, bv = B_EXACT, K_F32, out
        s_bh = s_bw = 0
    elif bound is None:
        b_mode, kb, bv = B_INLINE, K_F32, out
        s_bh = s_bw = 0
    else:
        b = bound.to(dev).expand(h, w)
        k = _kind(b.dtype)
        b_mode, kb, bv = B_TENSOR, k.kind, b.view(k.view)
        s_bh, s_bw = bv.stride()
    if mask is not None:
        mv = mask.to(dev).expand(h, w).view(torch.uint8)
        s_mh, s_mw = mv.stride()
    else:
        mv, s_mh, s_mw = out, 0, 0
    sub_mode, sub_k = _sub_mode(kr, ke)
    fast = fast_pass and kr.kind not in (K_F64, K_WIDE_INT) and ke.kind not in (K_F64, K_WIDE_INT)
    rt = float(rtol) if rtol is not None else 0.0
    at = float(atol) if atol is not None else 0.0
    check_sub, t0 = True, 0.0
    if b_mode == B_INLINE and sub_mode != SUB_ALWAYS and at >= _B_MIN:
        # An inexact float32 difference |r - e| within atol + rtol |e| is at most t0 (module notes),
        # so when the largest difference exceeds t0 it is exact, and no per-element check is needed.
        k = 2.0 ** (24 - max(kr.bits, ke.bits))
        c = k / (k + 1) * (1 - 2.0 ** -20)
        if rt < c * 0.5:
            check_sub, t0 = False, at * c / (c - rt) * (1 + 2.0 ** -18)
    on_gpu = not _interpreting()
    vec = max(1, min(plan.bn, 16 // max(received.element_size(), expected.element_size())))
    # bf16 pairs read as int32 words: one integer op per value to widen it
    pairs = (kr.kind == ke.kind == K_BF16 and plan.even and mask is None and plan.tw % 2 == 0
             and plan.pn % 2 == 0 and plan.bn >= 2 and w % 2 == 0)
    rp, ep = rv, ev
    if pairs:
        try:
            rp, ep = received.view(torch.int32), expected.view(torch.int32)
        except RuntimeError:  # not viewable as pairs (odd strides or offsets)
            pairs, rp, ep = False, rv, ev
    # the float64 pass: one vector of at most 8 elements per thread and step (its registers); the
    # interpreter takes big steps
    gvec = max(1, min(4 if K_LUT in (kr.kind, ke.kind) else 8, vec))
    gbm = max(1, min(_next_pow2(plan.pm), (32 * gvec * cfg.num_warps if on_gpu else 4096) // plan.bn))
    geo = (h, w, plan.th, plan.tw, plan.pm, plan.pn, plan.nsub_n, plan.strips, plan.per_tile, plan.tiles_w)
    strides = (rv.stride(0), rv.stride(1), ev.stride(0), ev.stride(1), s_bh, s_bw, s_mh, s_mw)
    kinds = dict(R_KIND=kr.kind, E_KIND=ke.kind, B_KIND=kb, B_MODE=b_mode, HAS_MASK=mask is not None,
                 ON_GPU=on_gpu, BN=plan.bn, num_warps=cfg.num_warps)
    if fast:
        _fast_kernel[(plan.programs,)](
            out, rv, ev, bv, mv, lut_r, lut_e, rp, ep, *geo, *strides, rp.stride(0), ep.stride(0), rt, at, t0,
            EVEN=plan.even, SUB_MODE=sub_mode, SUB_K=sub_k, CHECK_SUB=check_sub, PAIRS=pairs,
            FUSED=on_gpu or _FUSED_IN_INTERPRETER, BM=plan.bm, VEC=vec, num_stages=cfg.num_stages, **kinds)
    else:
        out[:, S_GENERAL] = -1.0
    # chunks of 16 marks: when every program is marked, the float64 pass still spreads over the GPU
    ch = 16
    most = 8 * _sm_count(dev.index) if dev.type == "cuda" else 2
    _general_kernel[(max(1, min(-(-plan.programs // ch), most)),)](
        out, rv, ev, bv, mv, lut_r, lut_e, *geo, plan.programs, *strides, rt, at, EVEN=plan.even and gbm <= plan.pm
        and plan.pm % gbm == 0, GBM=gbm, GVEC=gvec, CH=ch, **kinds)
    return TileStats(_fold(out, plan), (h, w), (plan.th, plan.tw), plan.programs)

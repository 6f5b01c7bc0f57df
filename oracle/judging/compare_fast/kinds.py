"""The codes the compare_fast kernels branch on (element kinds, bound modes, how the fast pass proves
a difference exact), each dtype's element kind, and what the pass accepts: `check_supported` says
why it cannot take some inputs, `inline_bound` is the bound tensor that rtol/atol stand for.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

# Element kinds: how a kernel turns the raw bits it loads into a value.
K_F32, K_F16, K_BF16, K_LUT, K_INT, K_F64, K_WIDE_INT = 0, 1, 2, 3, 4, 5, 6
# Bound modes.
B_EXACT, B_INLINE, B_TENSOR = 0, 1, 2
# How the fast pass proves that r - e is exact in float32: always exact (0), by the magnitudes
# (1: |r - e| <= 2^(23-P) min(|r|, |e|) for types of at most P significant bits), by TwoSum (2).
SUB_ALWAYS, SUB_SCALED, SUB_TWOSUM = 0, 1, 2


@dataclass(frozen=True)
class _Kind:
    kind: int
    view: torch.dtype  # the integer dtype the kernel loads the raw bits as
    bits: int  # significant bits P: |x| * 2^-P < ulp(x) for every value x of the dtype
    quantum: float  # every value is a multiple of this
    max: float  # largest magnitude


@functools.lru_cache(maxsize=None)
def _kind(dt: torch.dtype) -> Optional[_Kind]:
    if dt == torch.float32:
        return _Kind(K_F32, torch.int32, 24, 2.0 ** -149, float(torch.finfo(dt).max))
    if dt == torch.float16:
        return _Kind(K_F16, torch.uint16, 11, 2.0 ** -24, 65504.0)
    if dt == torch.bfloat16:
        return _Kind(K_BF16, torch.uint16, 8, 2.0 ** -133, float(torch.finfo(dt).max))
    if dt == torch.float64:
        return _Kind(K_F64, torch.int64, 53, 0.0, math.inf)
    if dt.is_floating_point and dt.itemsize == 1 and not dt.is_complex:
        fi = torch.finfo(dt)
        p = 1 - int(round(math.log2(fi.eps)))
        return _Kind(K_LUT, torch.uint8, p, fi.tiny * fi.eps, float(fi.max))
    if dt == torch.bool:
        return _Kind(K_INT, torch.uint8, 1, 1.0, 1.0)
    if dt in (torch.int8, torch.uint8):
        return _Kind(K_INT, dt, 8, 1.0, 255.0)
    if dt == torch.int16:
        return _Kind(K_INT, dt, 16, 1.0, 32768.0)
    if dt in (torch.int32, torch.int64):
        return _Kind(K_WIDE_INT, dt, 64, 1.0, math.inf)
    return None


def check_supported(received: torch.Tensor, expected: torch.Tensor, *, bound: Optional[torch.Tensor] = None,
                    mask: Optional[torch.Tensor] = None, rtol: Optional[float] = None,
                    atol: Optional[float] = None) -> list[str]:
    """Reasons why compare_fast cannot take these inputs (empty: it can)."""
    reasons = []
    if received.shape != expected.shape:
        reasons.append(f"received shape {tuple(received.shape)} != expected shape {tuple(expected.shape)}")
    if received.dim() != 2:
        reasons.append(f"compare takes 2-D tensors, got {received.dim()}-D")
    for name, t in (("received", received), ("expected", expected)):
        if _kind(t.dtype) is None:
            reasons.append(f"{name} dtype {t.dtype} is not supported (float, bool or integer expected)")
    if bound is not None:
        if not bound.dtype.is_floating_point or _kind(bound.dtype) is None:
            reasons.append(f"bound dtype {bound.dtype} is not supported (a float dtype expected)")
        if rtol is not None or atol is not None:
            reasons.append("give either a bound tensor or rtol/atol, not both")
    if (rtol is None) != (atol is None):
        reasons.append("rtol and atol go together (give both or neither)")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            reasons.append(f"{name} = {v!r}: expected a finite number >= 0")
    if mask is not None and mask.dtype != torch.bool:
        reasons.append(f"mask dtype {mask.dtype} is not supported (bool expected)")
    if received.device.type not in ("cuda", "cpu"):
        reasons.append(f"device {received.device} is not supported (cuda, or cpu under TRITON_INTERPRET=1)")
    elif received.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        reasons.append("CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
    return reasons


def inline_bound(expected: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """The bound tensor that rtol/atol stand for: atol + rtol * |expected|, evaluated in float32
    (expected rounded to float32, a product and a sum, each rounded once), exactly as the kernel
    computes it inline."""
    e = expected.to(torch.float32).abs()
    r = torch.full((), float(rtol), dtype=torch.float32, device=e.device)
    a = torch.full((), float(atol), dtype=torch.float32, device=e.device)
    return e.mul(r).add(a)


def _lut(dt: torch.dtype, device) -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8).view(dt).to(torch.float32)


@functools.lru_cache(maxsize=None)
def _sub_mode(kr: _Kind, ke: _Kind) -> tuple[int, float]:
    if kr.quantum > 0 and ke.quantum > 0 and (kr.max + ke.max) / min(kr.quantum, ke.quantum) < 2.0 ** 24:
        return SUB_ALWAYS, 1.0
    p = max(kr.bits, ke.bits)
    if p < 24:
        return SUB_SCALED, 2.0 ** (23 - p)
    return SUB_TWOSUM, 1.0

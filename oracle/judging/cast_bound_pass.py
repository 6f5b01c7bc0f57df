"""The cast's bound over the whole output in one pass (oracle.judging.tolerance.cast_bound for a
float output type, its value held in float32, float16 or bfloat16): one Triton program per block
of elements reads the input bound (float64) and the cast's value y, and writes bound + ulp(y) where
the bound is positive, else 0, with ulp(y) from the exponent bits of |y| in float32 as
tolerance.ulp takes it, so the values are the same bits. The torch definition ran a dozen
elementwise passes over D-sized tensors.
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _cast_bound_kernel(bound_ptr, y_ptr, out_ptr, n, tiny, step, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    bound = tl.load(bound_ptr + offs, mask=keep, other=0.0)
    a = tl.abs(tl.load(y_ptr + offs, mask=keep, other=0.0).to(tl.float32))
    a = tl.where(a != a, a, tl.maximum(a, tiny))  # torch's clamp keeps NaN
    top = a.to(tl.int32, bitcast=True) & 0x7F800000
    top = tl.where(top == 0x7F800000, 0x3F000000, top)  # inf, NaN: 2^-1, as frexp's e = 0 gives
    ulp = (top.to(tl.float32, bitcast=True) * step).to(tl.float64)  # a power of two >= 2^-149: exact
    tl.store(out_ptr + offs, tl.where(bound > 0, bound + ulp, 0.0), mask=keep)


def applies(bound_in: torch.Tensor, y: torch.Tensor) -> bool:
    """A bound and a value the pass reads: on a GPU, contiguous, of one shape, the bound float64 and y
    float32, float16 or bfloat16."""
    return (y.device.type == "cuda" and bound_in.device == y.device and bound_in.shape == y.shape
            and bound_in.dtype == torch.float64 and y.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and bound_in.is_contiguous() and y.is_contiguous())


def cast_bound(bound_in: torch.Tensor, y: torch.Tensor, tiny: float, mantissa_bits: int) -> torch.Tensor:
    """where(bound_in > 0, bound_in + ulp(y), 0) in float64, ulp(y) = 2^(e - 1 - mantissa_bits) of the
    output type whose smallest normal is `tiny` (tensors that `applies`, or any under the interpreter)."""
    out = torch.empty(y.shape, dtype=torch.float64, device=y.device)
    n = y.numel()
    if n:
        _cast_bound_kernel[(triton.cdiv(n, BLOCK),)](bound_in, y, out, n, tiny, 2.0 ** -mantissa_bits, BLOCK=BLOCK,
                                                     enable_fp_fusion=False)
    return out

"""Full reference GEMM: descriptor -> load -> mma -> epilogue in one fused kernel.

Data path: for each output tile (tm, tn) and each k-block, the operand boxes are read with the
descriptor's out-of-bounds fill (`descriptor._box_bits`, the same helper `load_tile` uses; the
swizzled shared-memory image is not materialised because `tile_from_image(operand_image(.))` is the
identity on the tile), accumulated by `_mainloop._mma_kblock` in the declared precision (via
`_mainloop._mainloop`, with the arguments `mma_params.MainloopParams` builds), then passed
through `epilogue._epilogue_tile` (scale -> alpha_beta -> bias -> activation -> cast) and
stored as D [M, N] in ep.out_dtype. So
  gemm(a, b, ...) == epilogue(mma_accumulate(a, b, ...), ep, ...)   bit for bit.
An epilogue declared in another order (ep.graph) is not fused: gemm is then literally
mma_accumulate followed by epilogue.

Constraints: those of the mma and epilogue stages (see their docstrings). The default tile
(128 x 128 x 64) suits the GPU; under the interpreter pass small tiles. An int32 accumulator
enters the epilogue converted to fp32 (RNE), an fp16 accumulator exactly.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Optional, Sequence

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._codec import _to_storage
from kernels_ref.dtypes import DTYPES
from kernels_ref.epilogue import Epilogue, _epilogue_tile, _Operands, epilogue, epilogue_host
from kernels_ref.epilogue import check_supported as _epilogue_check_supported
from kernels_ref._mainloop import _mainloop
from kernels_ref.mma import mma_accumulate, mma_accumulate_host
from kernels_ref.mma_params import MainloopParams
from kernels_ref.mma_params import check_supported as _mma_check_supported


@triton.jit
def _gemm_kernel(ml, out, ep, MC, EP, OUT_W: tl.constexpr, GROUP_M: tl.constexpr):
    """D's tile number program_id(0) in grouped order: the mainloop (ml: MainloopArgs, MC:
    MmaConsts), then the epilogue (ep: EpArgs, EP: EpConsts), into out (ptr, stride_r, stride_c)."""
    out_ptr, so_r, so_c = out
    # Grouped tile order (L2 reuse on the GPU); the result does not depend on it.
    pid = tl.program_id(0)
    n_tm = tl.cdiv(ml.M, MC.BM)
    n_tn = tl.cdiv(ml.N, MC.BN)
    per_group = GROUP_M * n_tn
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(n_tm - first_m, GROUP_M)
    tm = first_m + (pid % per_group) % group_size
    tn = (pid % per_group) // group_size
    m0 = tm * MC.BM
    n0 = tn * MC.BN
    acc, _unused = _mainloop(ml, m0, n0, (out_ptr, 0, 0, 0), (out_ptr, 0, 0, 0), MC, False, False)
    x = acc.to(tl.float32)
    i = tl.arange(0, MC.BMP)
    j = tl.arange(0, MC.BNP)
    rows = m0 + i
    cols = n0 + j
    x1, x2, x3, x4, bits = _epilogue_tile(x, rows, cols, ml.M, ml.N, ep, EP)
    mask = ((rows < ml.M) & (i < MC.BM))[:, None] & ((cols < ml.N) & (j < MC.BN))[None, :]
    tl.store(out_ptr + rows[:, None] * so_r + cols[None, :] * so_c, _to_storage(bits, OUT_W), mask=mask)


def check_supported(a_dtype: str, b_dtype: str, acc: str = "fp32", block_m: int = 128, block_n: int = 128,
                    block_k: int = 64, promotion_interval: Optional[int] = None,
                    block_scale_group: Optional[Sequence[int]] = None, scaled: bool = False,
                    ep: Epilogue = Epilogue()) -> list[str]:
    """Reasons this GEMM cannot be modelled (empty list: supported): the mma stage's and the
    epilogue stage's reasons together."""
    return (_mma_check_supported(a_dtype, b_dtype, acc, block_m, block_n, block_k, promotion_interval,
                              block_scale_group, scaled)
            + _epilogue_check_supported(ep.out_dtype, ep.activation, ep.bias_axis))


def gemm(a: torch.Tensor, b: torch.Tensor, *, block_m: int = 128, block_n: int = 128, block_k: int = 64,
         acc: str = "fp32", promotion_interval: Optional[int] = None, ep: Epilogue = Epilogue(),
         c: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
         row_scale: Optional[torch.Tensor] = None, col_scale: Optional[torch.Tensor] = None,
         tensor_scale: Optional[torch.Tensor] = None, scale_a_block: Optional[torch.Tensor] = None,
         scale_b_block: Optional[torch.Tensor] = None, block_scale_group: Optional[Sequence[int]] = None,
         oob_fill: str = "zero") -> torch.Tensor:
    """D = epilogue(A @ B) [M, N] in ep.out_dtype, in one fused kernel (module docstring)."""
    if not isinstance(ep, Epilogue):
        raise ValueError(f"ep must be an Epilogue, got {type(ep).__name__}")
    p = MainloopParams(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a_block, scale_b_block,
                       block_scale_group, oob_fill)
    M, N = a.shape[0], b.shape[1]
    ops = _Operands(M, N, ep, c, bias, row_scale, col_scale, tensor_scale)
    if not ep.fused:  # a declared order: the stages one after the other
        acc_v = mma_accumulate(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a_block,
                               scale_b_block, block_scale_group, oob_fill=oob_fill)
        return epilogue(acc_v, ep, c=c, bias=bias, row_scale=row_scale, col_scale=col_scale,
                        tensor_scale=tensor_scale)
    dev = C.check_device(("a", a), ("b", b), ("scale_a_block", scale_a_block), ("scale_b_block", scale_b_block),
                         *ops.tensors())
    out = torch.empty((M, N), dtype=DTYPES[ep.out_dtype].torch, device=dev)
    if M == 0 or N == 0:
        return out
    grid = (C.cdiv(M, block_m) * C.cdiv(N, block_n),)
    _gemm_kernel[grid](out=C.strided(out), OUT_W=out.element_size(), GROUP_M=8, **p.kernel_args(),
                       **ops.kernel_args(C.bits_view(a)), **p.launch_options(dev))
    return out


def gemm_host(a: torch.Tensor, b: torch.Tensor, **kw) -> torch.Tensor:
    """Host spec of `gemm`, with its keywords: mma_accumulate_host then epilogue_host (CPU,
    ep.out_dtype)."""
    bound = inspect.signature(gemm).bind(a, b, **kw)  # a TypeError names a keyword gemm does not take
    bound.apply_defaults()
    k = bound.arguments
    acc_v = mma_accumulate_host(a, b, k["block_m"], k["block_n"], k["block_k"], k["acc"], k["promotion_interval"],
                                k["scale_a_block"], k["scale_b_block"], k["block_scale_group"], oob_fill=k["oob_fill"])
    return epilogue_host(acc_v, k["ep"], c=k["c"], bias=k["bias"], row_scale=k["row_scale"],
                         col_scale=k["col_scale"], tensor_scale=k["tensor_scale"])


gemm_host.__signature__ = inspect.signature(gemm)  # help() shows gemm's keywords


def _check_groups(a: torch.Tensor, b: torch.Tensor, offsets) -> list[int]:
    offs = [int(o) for o in offsets]
    if b.dim() != 3 or len(offs) != b.shape[0] + 1 or offs[0] != 0 or offs[-1] != a.shape[0] or \
            any(x > y for x, y in zip(offs, offs[1:])):
        raise ValueError(f"grouped gemm: B must be [groups, K, N] and offsets {offs} the groups' first rows in A "
                         f"(groups + 1 non-decreasing entries from 0 to M = {a.shape[0]})")
    return offs


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, offsets, *, bias: Optional[torch.Tensor] = None, **kw):
    """A grouped (MoE) GEMM: rows [offsets[g], offsets[g + 1]) of A times B[g] (B [groups, K, N]), with
    the group's bias row (bias [groups, N]); a batched GEMM is groups of one size. Each group is
    `gemm` with the same keywords; D [M, N] holds the groups' rows in order."""
    offs = _check_groups(a, b, offsets)
    ep = kw.get("ep", Epilogue())
    out = torch.empty((a.shape[0], b.shape[2]), dtype=DTYPES[ep.out_dtype].torch, device=a.device)
    for g in range(b.shape[0]):
        if offs[g + 1] > offs[g]:
            out[offs[g]:offs[g + 1]] = gemm(a[offs[g]:offs[g + 1]], b[g], bias=None if bias is None else bias[g],
                                            **kw)
    return out


def grouped_gemm_host(a: torch.Tensor, b: torch.Tensor, offsets, *, bias: Optional[torch.Tensor] = None, **kw):
    """Host spec of `grouped_gemm` (CPU)."""
    offs = _check_groups(a, b, offsets)
    parts = [gemm_host(a[offs[g]:offs[g + 1]].cpu(), b[g].cpu(), bias=None if bias is None else bias[g].cpu(), **kw)
             for g in range(b.shape[0]) if offs[g + 1] > offs[g]]
    return torch.cat(parts) if parts else torch.empty((0, b.shape[2]))


class _CallableModule(types.ModuleType):
    """`kernels_ref.gemm` is this module and, called, the `gemm` function."""

    def __call__(self, *args, **kwargs):
        return gemm(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

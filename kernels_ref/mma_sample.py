"""The accumulator's host spec on sampled elements, vectorised over k-blocks (the cross-check's).

Data path: A [M, K], B [K, N] and the sampled global rows [T, R] and columns [T, C] ->
`mma_sample_products` on the operands' device (torch, not Triton): every k-block's (or MMA
step's) product of the sampled elements in one batched float64 matmul, rounded as the accumulator
receives it -> `SampleProducts` (crosses to the host in one copy) -> `mma_sample_finish` on the
CPU: the roundings the accumulator makes, in order. `mma_sample_host` is the two together, and
equals `kernels_ref.mma.mma_trajectory_host`'s last k-block at those elements.

Constraints: the accumulator semantics of `kernels_ref.mma` (its docstring); past M / N the
elements hold products of the out-of-bounds fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from kernels_ref import _common as C
from kernels_ref.mma import _wrap_i32, truncate_mantissa_host
from kernels_ref.mma_params import MainloopParams, mma_k_of


@dataclass(frozen=True)
class SampleProducts:
    """The device half of `mma_sample_host`: every accumulation step's products of the sampled
    elements, rounded as the accumulator receives them, for `mma_sample_finish` on the CPU.
    p float32 [T, steps, R, C] (int32: already summed and wrapped, [T, R, C]); s the float64 sum |a||b|
    (times |scales|) [T, R, C]; scale the fp32 block scales of each promotion chunk (or each step
    without promotion: a k-block, or a scale group where several lie in one) [T, units, R, C] or None."""

    p: torch.Tensor
    s: torch.Tensor
    scale: Optional[torch.Tensor]
    acc: str
    promotion_interval: Optional[int]
    mma_k: int
    block_k: int

    def tensors(self) -> list[torch.Tensor]:
        return [self.p, self.s] + ([self.scale] if self.scale is not None else [])

    def with_tensors(self, tensors: Sequence[torch.Tensor]) -> "SampleProducts":
        """The same products held by `tensors` (as `tensors()` lists them: moved to the host, say)."""
        return SampleProducts(tensors[0], tensors[1], tensors[2] if self.scale is not None else None, self.acc,
                              self.promotion_interval, self.mma_k, self.block_k)


def mma_sample_products(a: torch.Tensor, b: torch.Tensor, rows, cols, block_m: int, block_n: int, block_k: int,
                        acc: str = "fp32", promotion_interval: Optional[int] = None,
                        scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                        block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero") -> SampleProducts:
    """`mma_sample_host`'s products on the operands' device (batched float64 torch matmuls), with
    no host round trip: `mma_sample_finish` of them, on the CPU, is the host spec."""
    cfg = MainloopParams(a, b, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                         block_scale_group, oob_fill).config
    dev = a.device
    rows, cols = torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)
    M, K = a.shape
    N = b.shape[1]
    T, R = rows.shape
    Cn = cols.shape[1]
    n_kb = C.cdiv(K, block_k)
    kp = n_kb * block_k
    mk = mma_k_of(cfg.a_dtype, cfg.b_dtype)
    if kp == K and _all_below(rows, M) and _all_below(cols, N):  # no fill: the elements' rows and columns, as read
        both = C.to_device(torch.cat([rows.reshape(-1), cols.reshape(-1)]), dev)  # one copy of the indices
        rows, cols = both[:T * R].view(T, R), both[T * R:].view(T, Cn)
        A = a.detach()[rows].double()  # [T, R, K]
        B = b.detach().to(dev)[:, cols].permute(1, 0, 2).double()  # [T, K, C]
    else:
        rows, cols = C.to_device(rows, dev), C.to_device(cols, dev)
        A, B = _filled_operands(a, b, rows, cols, kp, oob_fill)
    step = kp if acc == "int32" else (mk if acc == "fp16" or promotion_interval is not None else
                                      block_k // cfg.scale_groups)
    n_steps = kp // step

    def per_step(x, y, k):  # [T, R, kp] x [T, kp, C] -> [T, kp // k, R, C], one product per k-slice
        n = kp // k
        return torch.matmul(x.view(T, R, n, k).transpose(1, 2), y.view(T, n, k, Cn))

    unit = promotion_interval or step  # the products one scale multiplies: a promotion chunk or a step
    scale = scale_abs = None
    if scale_a is not None:  # fp32(sa * sb) per unit, 0 past M / N: [T, kp / unit, R, C]
        gm, gn, gk = block_scale_group
        sa, sb = scale_a.detach().to(dev).double(), scale_b.detach().to(dev).double()

        def per_unit(u):  # the scale of the group each u-wide run of k lies in (0 for a group wholly past K)
            kc = torch.arange(kp // u, device=dev) * u // gk
            live = kc < sa.shape[1]
            kc = kc.clamp(max=sa.shape[1] - 1)
            ra = torch.where((rows < M)[..., None] & live, sa[(rows // gm).clamp(max=sa.shape[0] - 1)][..., kc], 0.0)
            cb = torch.where((cols < N)[..., None] & live, sb[(cols // gn).clamp(max=sb.shape[0] - 1)][..., kc], 0.0)
            return C.f32(ra.transpose(1, 2)[..., :, None] * cb.transpose(1, 2)[..., None, :])

        scale = per_unit(unit)
        scale_abs = per_unit(min(block_k, gk))
    if scale_abs is None:
        s = torch.matmul(A.abs(), B.abs())
    else:  # one S term per scale group
        s = (per_step(A.abs(), B.abs(), min(block_k, block_scale_group[2])) * scale_abs.abs()).sum(1)
    p = per_step(A, B, step) if n_steps else A.new_zeros((T, 0, R, Cn))
    p = _wrap_i32(p.sum(1)) if acc == "int32" else p.float()  # as the accumulator receives it
    return SampleProducts(p, s, scale, acc, promotion_interval, mk, block_k)


def _all_below(index: torch.Tensor, extent: int) -> bool:
    """Every index of a CPU tensor is below `extent` (read in numpy: no device round trip); False for
    indices on a GPU, which the caller then treats as possibly past it."""
    return index.device.type == "cpu" and (index.numel() == 0 or int(index.numpy().max()) < extent)


def _filled_operands(a, b, rows, cols, kp: int, oob_fill: str):
    """The sampled rows of A [T, R, kp] and columns of B [T, kp, C] in float64, the out-of-bounds
    fill past M, N and K (indices on the operands' device)."""
    dev = a.device
    M, K = a.shape
    N = b.shape[1]
    fill = float("nan") if oob_fill == "nan" else 0.0
    A = torch.full((*rows.shape, kp), fill, dtype=torch.float64, device=dev)
    A[:, :, :K] = torch.where((rows < M)[..., None], a.detach()[rows.clamp(max=M - 1)].double(), fill)
    B = torch.full((cols.shape[0], kp, cols.shape[1]), fill, dtype=torch.float64, device=dev)
    B[:, :K, :] = torch.where((cols < N)[:, None, :], b.detach().to(dev)[:, cols.clamp(max=N - 1)].permute(1, 0, 2)
                              .double(), fill)
    return A, B


def mma_sample_finish(products: SampleProducts):
    """The roundings the accumulator makes, in order, on the products of `mma_sample_products`
    (CPU tensors): fp32 sums in k order in numpy float32, every sampled element at once (each
    addition rounded to nearest, as acc = fp32(acc + p)), the fp16 and promotion chains step by step on [T, R, C].
    Returns CPU float64 (acc, S) [T, R, C]."""
    p, s, scale = products.p, products.s, products.scale
    if products.acc == "int32":
        return p, s
    T, n_steps, R, Cn = p.shape
    if products.acc == "fp16":
        out = np.zeros((T, R, Cn), dtype=np.float16)
        for j in range(n_steps):  # acc = fp16(fp32(acc + s)) after every MMA step
            out = (out.astype(np.float32) + p[:, j].float().numpy()).astype(np.float16)
        return torch.from_numpy(out.astype(np.float64)), s
    if products.promotion_interval is not None:  # q = trunc13(fp32(q + s)) inside each chunk, from zero
        per = products.promotion_interval // products.mma_k
        steps = p.view(T, n_steps // per, per, R, Cn)
        q = torch.zeros_like(steps[:, :, 0], dtype=torch.float64)
        for j in range(per):
            q = truncate_mantissa_host(C.f32(q + steps[:, :, j]))
        p = q
    if scale is not None:
        p = C.f32(p * scale)
    if p.shape[1] == 0:
        return torch.zeros((T, R, Cn), dtype=torch.float64), s
    # in k order, each addition rounded to float32: one float32 add of every sampled element per step
    # (numpy's accumulate along a middle axis took 15-25 times longer); + 0.0 makes a zero sum +0, as a
    # sum started from +0 would end
    steps = p.float().numpy().reshape(T, p.shape[1], R * Cn)
    summed = steps[:, 0].copy()
    for j in range(1, steps.shape[1]):
        np.add(summed, steps[:, j], out=summed)
    return torch.from_numpy(summed.reshape(T, R, Cn).astype(np.float64)) + 0.0, s


def mma_sample_host(a: torch.Tensor, b: torch.Tensor, rows, cols, block_m: int, block_n: int, block_k: int,
                    acc: str = "fp32", promotion_interval: Optional[int] = None,
                    scale_a: Optional[torch.Tensor] = None, scale_b: Optional[torch.Tensor] = None,
                    block_scale_group: Optional[Sequence[int]] = None, oob_fill: str = "zero"):
    """Host spec of the accumulator after the last k-block at the elements rows[t] x cols[t] of
    each sample t (global indices [T, R] and [T, C]; past M / N the out-of-bounds fill), and S.

    The same semantics as `mma_trajectory_host`, vectorised over k-blocks: every k-block's (or MMA
    step's) product is one batched float64 matmul on the operands' device (torch, not Triton,
    `mma_sample_products`), then the roundings the accumulator makes, in order, on the CPU
    (`mma_sample_finish`). Returns CPU float64 (acc, S) [T, R, C]."""
    sp = mma_sample_products(a, b, rows, cols, block_m, block_n, block_k, acc, promotion_interval, scale_a, scale_b,
                             block_scale_group, oob_fill)
    parts = sp.tensors()
    host = torch.cat([x.reshape(-1) for x in parts]).cpu().split([x.numel() for x in parts])  # one copy
    return mma_sample_finish(sp.with_tensors([h.view(x.shape) for h, x in zip(host, parts)]))

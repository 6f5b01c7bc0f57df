"""The recording's tensors on the reference device: the operands, the epilogue's vectors, block
scales, the kernel's D, and the reference operand tiles fetched from them so far (a cache: a tile is
loaded once, whichever stage asks first).

A quantised operand (oracle.problem.spec b_scales or a_scales; Geometry.quant_op names it): `a` or
`b` is the reference's dequantised operand (the one the MMA reads, in the other operand's dtype,
kernels_ref.dequant); `q_stored`, `q_scales` and `q_zeros` are what the problem stores (codes,
packed two a byte for a 4-bit type), held with K along the rows as kernels_ref.dequant reads them
(B's as stored, A's transposed: Geometry.orient turns a tile between the two); `stored_tile` is the
load stage's reference in that orientation, `ref_tiles(op, ...)` the MMA's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from kernels_ref._common import device_tensor
from kernels_ref import load as ref_load
from kernels_ref.scales import groups_per_k_block, scale_values
from oracle.judging.differential.geometry import Geometry
from oracle.run.recording import Recording


@dataclass(frozen=True, eq=False)
class DeviceOperands:
    geo: Geometry
    a: torch.Tensor
    b: torch.Tensor
    c: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]  # float32
    row_scale: Optional[torch.Tensor]  # float32, a "row" scale of A
    col_scale: Optional[torch.Tensor]  # float32, a "col" scale of B
    tensor_scale: Optional[torch.Tensor]  # float32 scalar: the product of the "tensor" scales
    block_a: Optional[torch.Tensor]  # float32 block scales of a block-scaled problem
    block_b: Optional[torch.Tensor]
    group: Optional[tuple[int, int, int]]  # the block scales' group (rows of A, columns of B, k)
    q_stored: Optional[torch.Tensor]  # the quantised operand as stored, K along the rows
    q_scales: Optional[torch.Tensor]
    q_zeros: Optional[torch.Tensor]
    output: Optional[torch.Tensor]  # the kernel's D
    poison: Optional[int]  # the byte the harness wrote into D before the launch (Recording.output_poison)
    _ref_tiles: dict = field(default_factory=dict, repr=False)  # (op, tile index, k-block) -> tile

    @classmethod
    def of(cls, rec: Recording, geo: Geometry) -> "DeviceOperands":
        spec, dev = rec.spec, geo.dev
        ops = rec.operands.to(dev)
        a, b = ops.a, ops.b
        q_stored = q_scales = q_zeros = None
        if geo.quant is not None:
            from kernels_ref import dequant as ref_dequant

            q_stored, q_scales, q_zeros = ops.quant_kn(geo.quant_op)
            w = geo.orient(ref_dequant.dequant_operand(q_stored, q_scales, q_zeros, geo.quant))
            if geo.quant_op == "a":
                a = w.contiguous()
            else:
                b = w
        tensor_scales = [s.float().reshape(()) for s, k in ((ops.scale_a, spec.scale_a.kind),
                                                             (ops.scale_b, spec.scale_b.kind)) if k == "tensor"]
        tensor_scale = None
        if tensor_scales:
            tensor_scale = tensor_scales[0] if len(tensor_scales) == 1 else tensor_scales[0] * tensor_scales[1]
        block = spec.block_scaled
        return cls(geo, a, b, ops.c, ops.bias.float() if ops.bias is not None else None,
                   ops.scale_a.float() if spec.scale_a.kind == "row" else None,
                   ops.scale_b.float() if spec.scale_b.kind == "col" else None, tensor_scale,
                   _block_values(ops.scale_a, spec.scale_a, dev) if block else None,
                   _block_values(ops.scale_b, spec.scale_b, dev) if block else None,
                   (spec.scale_a.block[0], spec.scale_b.block[0], spec.scale_a.block[1]) if block else None,
                   q_stored, q_scales, q_zeros, rec.output.to(dev) if rec.output is not None else None,
                   rec.output_poison)

    def operand(self, op: str) -> torch.Tensor:
        return self.a if op == "a" else self.b

    # -- reference operand tiles ---------------------------------------------------------------
    def ref_tile(self, op: str, tile: tuple[int, int], kb: int) -> torch.Tensor:
        idx = tile[0] if op == "a" else tile[1]
        key = (op, idx, kb)
        if key not in self._ref_tiles:
            self.prefetch_ref_tiles(op, [(tile, kb)])
        return self._ref_tiles[key]

    def ref_tiles(self, op: str, sites) -> torch.Tensor:
        """The reference operand tiles of (tile, k-block) sites, stacked: [len(sites), ...]."""
        self.prefetch_ref_tiles(op, sites)
        return torch.stack([self.ref_tile(op, t, kb) for t, kb in sites])

    def prefetch_ref_tiles(self, op: str, sites) -> None:
        """Load the reference operand tiles of many (tile, k-block) sites in one launch."""
        geo = self.geo
        pairs = sorted({((t[0] if op == "a" else t[1]), kb) for t, kb in sites} -
                       {(i, kb) for o, i, kb in self._ref_tiles if o == op})
        if not pairs:
            return
        tiles = ref_load.load_tiles(self.operand(op), op, pairs, geo.bm if op == "a" else geo.bn, geo.bk,
                                    geo.spec.oob_fill)
        for (idx, kb), t in zip(pairs, tiles):
            self._ref_tiles[(op, idx, kb)] = t

    def stored_tile(self, tile: tuple[int, int], kb: int) -> torch.Tensor:
        """The quantised operand's stored tile as the problem holds it, K along the rows ([BK / per_byte,
        BN] of B, or A's [BM, BK / per_byte] transposed; zero past K and the operand's rows or
        columns): what a correct load tap holds, oriented (Geometry.orient)."""
        geo = self.geo
        per = 2 if geo.quant.packed else 1
        rows = geo.bk // per
        width = geo.bm if geo.quant_op == "a" else geo.bn
        r0, c0 = kb * rows, tile[0 if geo.quant_op == "a" else 1] * width
        src = self.q_stored
        out = torch.zeros(rows, width, dtype=src.dtype, device=geo.dev)
        part = src[r0:r0 + rows, c0:c0 + width]
        out[:part.shape[0], :part.shape[1]] = part
        return out

    def block_scales_units(self, tiles, kbs):
        """The block scales of many (tile, k-block) sites: [U, BM] of A, [U, BN] of B, or [U, BM, G] and
        [U, BN, G] where G > 1 scale groups lie in one k-block (None, None unscaled); 0 for a group
        wholly past a ragged K, as the reference mainloop holds it (kernels_ref.mma)."""
        geo = self.geo
        spec, dev = geo.spec, geo.dev
        if not spec.block_scaled:
            return None, None
        gm, gn, gk = self.group
        s = groups_per_k_block(gk, geo.bk)
        tt = device_tensor([list(t) for t in tiles], dev, torch.int64).reshape(-1, 2)
        g = device_tensor([(kb * geo.bk) // gk for kb in kbs], dev, torch.int64)[:, None, None]
        g = g + torch.arange(s, device=dev)[None, None, :]  # [U, 1, G]
        rows = (tt[:, 0:1] * geo.bm + torch.arange(geo.bm, device=dev)[None, :]).clamp(max=spec.m - 1) // gm
        cols = (tt[:, 1:2] * geo.bn + torch.arange(geo.bn, device=dev)[None, :]).clamp(max=spec.n - 1) // gn
        live = g < self.block_a.shape[1]  # a ragged K's last k-block: its groups past K are not in the tensor
        g = g.clamp(max=self.block_a.shape[1] - 1)
        sa = torch.where(live, self.block_a[rows[:, :, None], g], 0.0)
        sb = torch.where(live, self.block_b[cols[:, :, None], g], 0.0)
        return (sa[..., 0], sb[..., 0]) if s == 1 else (sa, sb)


def _block_values(t: torch.Tensor, scale, dev) -> torch.Tensor:
    """A block scale tensor's values in fp32 on `dev` (e8m0 bytes decoded: kernels_ref.scales)."""
    return scale_values(t, scale.dtype).float().to(dev)

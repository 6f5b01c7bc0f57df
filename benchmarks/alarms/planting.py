"""Planted defects: one at a time in one seeded tile of a correct output (a full BM x BN tile where
the output has one), each judged against the reference and bound epilogue_store's chained
comparison uses (oracle.judging.differential.expected_output): detected means its tile fails, right
tile means it is the only tile that fails."""

from __future__ import annotations

from typing import Optional

import torch

from oracle.judging.compare import compare
from oracle.judging.differential import expected_output
from kernels_ref.scales import scale_values
from oracle.run.inputs import Operands

# the last only where the problem has block scales: one 128-deep k-block of the tile scaled with the
# next k-block's scales (a wrong scale index)
DEFECTS = ("zeroed tile", "tile x 1.01", "one sign flip", "missing k-block", "one NaN", "wrong block scale")


def _tile_slices(spec, tile):
    tm, tn = tile
    return slice(tm * spec.tile.bm, (tm + 1) * spec.tile.bm), slice(tn * spec.tile.bn, (tn + 1) * spec.tile.bn)


def _cast_like(x64: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dtype == torch.int32:
        return torch.round(x64).clamp(-2 ** 31, 2 ** 31 - 1).to(torch.int32)
    return x64.to(torch.float32).to(like.dtype)


def plant(defect: str, out: torch.Tensor, y: torch.Tensor, spec, ops: Operands, tile, rng) -> Optional[torch.Tensor]:
    """The output with one defect in `tile`; None where the defect does not apply."""
    rs, cs = _tile_slices(spec, tile)
    bad = out.clone()
    sub = bad[rs, cs]
    if defect == "zeroed tile":
        sub.zero_()
    elif defect == "tile x 1.01":
        sub.copy_(_cast_like(sub.double() * 1.01, sub))
    elif defect == "one sign flip":
        e = y[rs, cs].double().abs()
        i = int(torch.argmax(e))
        r, cc = divmod(i, e.shape[1])
        sub[r, cc] = -sub[r, cc]
    elif defect == "missing k-block":
        if spec.activation != "none" or spec.k < 128:
            return None
        kb = int(rng.integers(0, spec.k // 64))
        k0 = kb * 64
        if spec.quantised_b:  # the reference's dequantised B of the k-block
            from kernels_ref import dequant as dq

            per = 2 if spec.dequant_config.packed else 1
            b = dq.dequant_host(ops.b[k0 // per:(k0 + 64) // per, cs], ops.b_scales, ops.b_zeros,
                                spec.dequant_config, k0=k0, n0=cs.start).to(out.device)
        else:
            b = ops.b[k0:k0 + 64, cs]
        part = ops.a[rs, k0:k0 + 64].double() @ b.double()
        if spec.scale_a.kind == "tensor":
            part = part * float(ops.scale_a.double().prod() * ops.scale_b.double().prod())
        elif spec.scale_a.kind == "row":
            part = part * ops.scale_a[rs].double()[:, None] * ops.scale_b[cs].double()[None, :]
        elif spec.scale_a.kind == "block":
            kg = k0 // spec.scale_a.block[1]
            rows = torch.arange(spec.m, device=part.device)[rs] // spec.scale_a.block[0]
            cols = torch.arange(spec.n, device=part.device)[cs] // spec.scale_b.block[0]
            part = part * ops.scale_a[rows, kg].double()[:, None] * ops.scale_b[cols, kg].double()[None, :]
        sub.copy_(_cast_like(sub.double() - part, sub))
    elif defect == "one NaN":
        if not out.is_floating_point():
            return None
        r = int(rng.integers(0, sub.shape[0]))
        cc = int(rng.integers(0, sub.shape[1]))
        sub[r, cc] = float("nan")
    elif defect == "wrong block scale":
        gk = spec.scale_a.block[1] if spec.scale_a.kind == "block" else 0
        if not gk or spec.k < 2 * gk:
            return None
        j = int(rng.integers(0, spec.k // gk))
        j2 = (j + 1) % (spec.k // gk)
        part = ops.a[rs, j * gk:(j + 1) * gk].double() @ ops.b[j * gk:(j + 1) * gk, cs].double()
        rows = torch.arange(spec.m, device=part.device)[rs] // spec.scale_a.block[0]
        cols = torch.arange(spec.n, device=part.device)[cs] // spec.scale_b.block[0]
        sa, sb = (scale_values(t, s.dtype).to(part.device) for t, s in ((ops.scale_a, spec.scale_a),
                                                                          (ops.scale_b, spec.scale_b)))
        change = sa[rows, j2][:, None] * sb[cols, j2][None, :] - sa[rows, j][:, None] * sb[cols, j][None, :]
        sub.copy_(_cast_like(sub.double() + spec.alpha * part * change, sub))
    return bad


def _planted_tile(spec, rng) -> tuple[int, int]:
    """A seeded tile among the largest ones: full BM x BN where the output has such tiles (a
    ragged edge tile of a few elements shows a 1 % error only by chance)."""
    def full(extent, block, count):
        size = min(extent, block)
        return [i for i in range(count) if min(block, extent - i * block) == size]
    rows, cols = full(spec.m, spec.tile.bm, spec.tiles_m), full(spec.n, spec.tile.bn, spec.tiles_n)
    return int(rows[int(rng.integers(0, len(rows)))]), int(cols[int(rng.integers(0, len(cols)))])


def judge_planted(out, y, bound, spec, tile) -> tuple[bool, bool]:
    exact = bool((bound == 0).all())
    c = compare(out, y.to(out.dtype) if exact else y, bound=None if exact else bound,
                tile_shape=(spec.tile.bm, spec.tile.bn))
    failing = set(c.bad_tiles)
    return tile in failing, failing == {tile}


def plant_all(res, out, spec, ops, seed) -> None:
    """Each defect planted in one seeded tile of the correct output, judged on its own."""
    import numpy as np

    y, bound = expected_output(spec, ops)
    rng = np.random.default_rng(seed)
    tile = _planted_tile(spec, rng)
    for d in DEFECTS:
        bad = plant(d, out, y, spec, ops, tile, rng)
        if bad is not None:
            res.planted[d] = judge_planted(bad, y, bound, spec, tile)

"""The dequant stage of the quantised operand (dequant_b of a quantised B, dequant_a of a quantised
A): the tile the MMA reads, (q - z) * s in the other operand's dtype (or the float_offset form
(q - c) * s + z), per k-block.

- teacher-forced: against the reference dequant (kernels_ref.dequant) of the kernel's own load tap
  of the same k-block (its stored bytes); where the load was not tapped, the input's stored tile stands
  in for it (named: its finding is a draft). An element is compared only if the kernel recorded the
  byte that holds it.
- chained: against the reference dequant of the input's stored tile.
Bit-exact where the declared arithmetic is exact, else within oracle.judging.tolerance's dequant
bound. `hint` names the scale group of a bad element and the single-field mistake (nibble order,
the bytes read as another packing, group index, a zero point twice, a scale or zero point of another group) its value matches, the
first of them in that order (a value can fit more than one: the others are named beside it).
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels_ref import dequant as ref_dequant
from oracle.judging import tolerance
from oracle.judging.compare import combine
from oracle.judging.differential.context import Context, StageResult
from oracle.judging.differential.judge import Notebook, per_operand
from oracle.judging.evidence import Feed


def _dequant_stage(ctx: Context, nb: Notebook, op: str) -> StageResult:
    geo, tapped, ops = ctx.geo, ctx.taps, ctx.ops
    stage = f"dequant_{op}"
    taps = tapped.taps_of(stage)
    if not taps:
        return StageResult.not_run(stage)
    cfg, o = geo.quant, geo.orient
    per = 2 if cfg.packed else 1
    tf, ch = [], []
    for tap in taps:
        received = tap.values.to(geo.dev)
        recorded = tapped.recorded(tap)
        valid = geo.valid_mask(stage, tap.tile, tuple(received.shape))
        nb.note_padding(stage, valid, recorded)
        k0, n0 = tap.k_block * geo.bk, (tap.tile[0] * geo.bm if op == "a" else tap.tile[1] * geo.bn)
        where = dict(origin=geo.origin(stage, tap.tile, tap.k_block), tile_index=tap.tile, k_block=tap.k_block)
        stored = ops.stored_tile(tap.tile, tap.k_block)
        ref = o(ref_dequant.dequant(stored, ops.q_scales, ops.q_zeros, cfg, k0=k0, n0=n0))
        ch.append(nb.judge(received, ref, feed=Feed.REFERENCE, valid=valid, recorded=recorded,
                           bound=o(_bound(ctx, stored, k0, n0)), **where))
        up = tapped.tap(f"load_{op}", tap.tile, tap.k_block, tap.partial)
        if up is not None:
            own = o(up.values.to(geo.dev))
            if own.dtype != stored.dtype:
                own = own.view(stored.dtype)
            fed = o(ref_dequant.dequant(own, ops.q_scales, ops.q_zeros, cfg, k0=k0, n0=n0))
            marks = o(tapped.recorded(up))  # the load's recorded bytes, K along the rows
            if cfg.packed:  # a byte's mark covers the k it holds
                marks = marks[_byte_rows(marks.shape[0] * per, cfg.packing).to(marks.device)]
            tf.append(nb.judge(received, fed, feed=Feed.KERNEL, valid=valid, recorded=recorded, upstream=o(marks),
                               bound=o(_bound(ctx, own, k0, n0)), **where))
        else:
            tf.append(nb.judge(received, ref, feed=Feed.STAND_IN, valid=valid, recorded=recorded,
                               bound=o(_bound(ctx, stored, k0, n0)),
                               stand_ins=((f"load_{op}", tap.tile, tap.k_block),), **where))
    return StageResult(stage, combine(tf), combine(ch))



dequant_stage = per_operand(_dequant_stage, "dequant_stage(ctx, op): the dequant stage of the quantised operand "
                            "`op`, and what it noted.")

def _byte_rows(tk: int, packing: str) -> torch.Tensor:
    """The stored row holding each k of a packed tile (k 0..tk-1)."""
    return torch.tensor([ref_dequant.nibble_of(k, packing)[0] for k in range(tk)], dtype=torch.long)


def _fields(ctx: Context, stored: torch.Tensor, k0: int, n0: int):
    """q, z, s (float64, CPU) of every element of a stored tile (K along the rows) whose first element
    is (k0, n0)."""
    geo, ops = ctx.geo, ctx.ops
    cfg = geo.quant
    q = ref_dequant.values_of_codes(ref_dequant.unpack_host(stored.cpu(), cfg), cfg.dtype)
    tk, tn = q.shape
    g = ((k0 + torch.arange(tk)) // cfg.group_size).clamp(max=ops.q_scales.shape[0] - 1)
    col = (n0 + torch.arange(tn)).clamp(max=ops.q_scales.shape[1] - 1)
    s = ref_dequant.scale_values_host(ops.q_scales.cpu(), cfg.scale_dtype)[g[:, None], col[None, :]]
    z = torch.zeros_like(s) if cfg.zeros == "none" else ops.q_zeros.cpu().double()[g[:, None], col[None, :]]
    return q, z, s  # q as stored: the float_offset form's centre is the bound's to subtract


def _bound(ctx: Context, stored: torch.Tensor, k0: int, n0: int) -> Optional[torch.Tensor]:
    geo = ctx.geo
    cfg = geo.quant
    kw = dict(out_dtype=cfg.out_dtype, precision=cfg.precision, zeros=cfg.zeros, scale_dtype=cfg.scale_dtype,
              centre=cfg.centre)
    if tolerance.dequant_bound(torch.zeros(1), torch.zeros(1), torch.zeros(1), **kw) is None:
        return None
    q, z, s = _fields(ctx, stored, k0, n0)
    return tolerance.dequant_bound(q, z, s, **kw).to(geo.dev)


def operand_bound(ctx: Context) -> Optional[torch.Tensor]:
    """The dequant bound of the whole quantised operand in its own orientation (B [K, N], A [M, K];
    float64; None where the declared dequant is exact)."""
    geo, ops = ctx.geo, ctx.ops
    return geo.orient(_bound(ctx, ops.q_stored, 0, 0))


def group_of(ctx: Context, k: int) -> int:
    return k // ctx.geo.quant.group_size


def hint(ctx: Context, row: int, col: int, received: float) -> Optional[str]:
    """The scale group of element (row, col) of the quantised operand (B's (k, n), A's (m, k)) and the
    single-field mistakes its received value matches, read from the problem's stored operand, scales
    and zero points."""
    geo, ops = ctx.geo, ctx.ops
    cfg, spec, op = geo.quant, geo.spec, geo.quant_op
    k, n = (col, row) if op == "a" else (row, col)  # n: B's column, or A's row
    if not (0 <= k < spec.k and 0 <= n < ops.q_stored.shape[1]):
        return None
    X, line = op.upper(), ("row m" if op == "a" else "column n")
    gs = cfg.group_size
    g = k // gs
    n_groups = ops.q_scales.shape[0]
    codes = ref_dequant.unpack_host(ops.q_stored[:, n:n + 1].cpu(), cfg)
    qs = ref_dequant.values_of_codes(codes[:, 0], cfg.dtype)
    s_all = ref_dequant.scale_values_host(ops.q_scales.cpu(), cfg.scale_dtype)[:, n]
    z_all = torch.zeros_like(s_all) if cfg.zeros == "none" else ops.q_zeros.cpu().double()[:, n]

    def w(q, z, s) -> float:
        one = [torch.tensor([[v]], dtype=torch.float64) for v in (q, z, s)]
        return float(ref_dequant.dequant_values(*one, cfg).to(ref_dequant.ALL_TYPES[cfg.out_dtype].torch))

    q, z, s = float(qs[k]), float(z_all[g]), float(s_all[g])
    found = []
    if cfg.packed:
        row, high = ref_dequant.nibble_of(k, cfg.packing)
        partner = ref_dequant.k_of_nibble(row, 1 - high, cfg.packing)
        if w(float(qs[partner]), z, s) == received and qs[partner] != qs[k]:
            found.append(f"the other nibble of its byte (k = {partner}): the nibble order is swapped")
        for other in ref_dequant.PACKINGS:  # the stored bytes read as another packing
            src = ref_dequant.k_of_nibble(*ref_dequant.nibble_of(k, other), cfg.packing)
            if src not in (k, partner) and w(float(qs[src]), z, s) == received and qs[src] != qs[k]:
                found.append(f"the value stored for k = {src}: {X}'s bytes read as {other}, not {cfg.packing} (the "
                             f"packing / nibble order is wrong)")
    if cfg.zeros != "none" and z != 0 and w(q, 2 * z, s) == received:
        found.append("the zero point applied twice")
    for g2 in range(n_groups):
        if g2 == g:
            continue
        z2, s2 = float(z_all[g2]), float(s_all[g2])
        if w(q, z2, s2) == received and (z2, s2) != (z, s):
            found.append(f"the scale and zero point of group {g2}: a wrong group index")
        elif s2 != s and w(q, z, s2) == received:
            found.append(f"the scale of group {g2}")
        elif cfg.zeros != "none" and z2 != z and w(q, z2, s) == received:
            found.append(f"the zero point of group {g2}")
    where = f"k = {k} lies in scale group {g} (k {g * gs}..{(g + 1) * gs - 1}) of {line} = {n}"
    if not found:
        return f"{where}; the received value matches no single-field mistake (nibble order, group index, zero " \
               f"point, scale)"
    also = f" (it also fits {'; '.join(found[1:3])})" if len(found) > 1 else ""
    return f"{where}; the received value is (q - z) * s with {found[0]}{also}"

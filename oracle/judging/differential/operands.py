"""The operand stages: the TMA's shared-memory image (descriptor_a/b) and the tile the MMA reads
(load_a/b), each against what global memory and the problem say it must be.

- descriptor: the image the kernel's TMA wrote against the image a TMA with the right descriptor
  writes from global memory, both read back through the declared swizzle so the comparison is
  bit-exact and speaks in logical (row, col); plus every recorded tensor-map field against the
  field the problem implies (a wrong field fails the stage, with or without an image).
- load, teacher-forced: against the kernel's own image of the same k-block when it was tapped;
  against global memory when the operand has no TMA stage at all (a cp.async / ldmatrix kernel:
  global memory is then the load's real input, known exactly); against global memory as a
  stand-in for the untapped image otherwise. Chained: always against global memory.
  A quantised operand's load holds its stored values (packed 4-bit: bytes, two k in each), judged
  bit for bit against the stored tile; its TMA image (descriptor_a / descriptor_b) is not judged:
  a tap of it is an open confound, named.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.tensormap import mn_dim, operand_tensormap
from kernels_ref._common import device_tensor
from kernels_ref import descriptor as ref_descriptor
from kernels_ref import load as ref_load
from oracle.judging.compare import Comparison, Status, combine
from oracle.judging.differential.context import Context, StageResult
from oracle.judging.differential.judge import Notebook, Unit, per_operand
from oracle.judging.evidence import Evidence, Feed, FieldCheck
from oracle.run.confounds import Confound, ConfoundKind

FIELDS = ("dtype", "global_dims", "global_strides", "box_dims", "element_strides", "swizzle", "oob_fill")


def _descriptor_stage(ctx: Context, nb: Notebook, op: str) -> StageResult:
    geo, tapped, ops = ctx.geo, ctx.taps, ctx.ops
    spec = geo.spec
    stage = f"descriptor_{op}"
    if op == geo.quant_op:
        if tapped.taps_of(stage) or any(d.operand == op for d in tapped.descriptors):
            nb.confound(Confound.of(ConfoundKind.QUANTISED_DESCRIPTOR, stage, operand=op,
                                    dtype=getattr(spec, f"{op}_dtype")))
        return StageResult.not_run(stage)
    taps = tapped.taps_of(stage)
    parts = []
    if taps:  # every image at once: the references in one launch, one comparison pass
        idx = [tap.tile[0] if op == "a" else tap.tile[1] for tap in taps]
        want = ref_descriptor.operand_images(ops.operand(op), op, getattr(spec, f"{op}_major"),
                                             list(zip(idx, [t.k_block for t in taps])), _block_mn(geo, op), geo.bk,
                                             getattr(spec, f"swizzle_{op}"), spec.oob_fill)
        expected = _tile_from_image(geo, op, want)
        received = _tile_from_image(geo, op, torch.stack([t.values for t in taps]).to(geo.dev))
        valid = geo.valid_units(stage, [t.tile for t in taps], tuple(expected.shape[1:]))
        units = [Unit(Feed.GLOBAL, geo.origin(stage, t.tile, t.k_block), t.tile, t.k_block) for t in taps]
        parts = nb.judge_units(units, received, expected, valid=valid, recorded=tapped.image_elements_units(taps, op),
                               padding=stage)
    fields, map_rows = descriptor_fields(ctx, op)
    if fields is not None:
        parts.append(fields)
    nb.count_padding(f"descriptor_{op} map rows", map_rows)
    if not parts:
        return StageResult.not_run(stage)
    cmp = combine(parts)
    return StageResult(stage, cmp, cmp)  # the first stage: its input is the kernel's own global memory


descriptor_stage = per_operand(_descriptor_stage, "descriptor_stage(ctx, op): the descriptor stage of operand `op`, "
                               "and what it noted.")


def descriptor_fields(ctx: Context, op: str) -> tuple[Optional[Comparison], int]:
    """Recorded tensor-map fields against the ones the problem implies (None: none recorded), and
    the padding rows past M / N the last padded map covers (0: none)."""
    geo, tapped = ctx.geo, ctx.taps
    recs = [d for d in tapped.descriptors if d.operand == op]
    if not recs:
        return None, 0
    spec = geo.spec
    rows, cols = (spec.m, spec.k) if op == "a" else (spec.k, spec.n)
    want = operand_tensormap(op, getattr(spec, f"{op}_major"), rows, cols, getattr(spec, f"{op}_dtype"),
                             _block_mn(geo, op), geo.bk, getattr(spec, f"swizzle_{op}"),
                             spec.oob_fill).to_descriptor_record(op)
    mn_axis = mn_dim(op, getattr(spec, f"{op}_major"))
    checks, notes, map_rows = [], [], 0
    for got in recs:
        for f in FIELDS:
            g, w = getattr(got, f), getattr(want, f)
            note = ""
            if g != w and f == "global_dims" and _padded_only(g, w, mn_axis):
                # a buffer padded past M / N: those rows feed only outputs past M / N
                extra = g[mn_axis] - w[mn_axis]
                note = (f"descriptor {op}: the map covers {extra} padding row(s) past "
                        f"{'M' if op == 'a' else 'N'} = {w[mn_axis]} (global_dims {g!r})")
                notes.append(note)
                map_rows = extra
            checks.append(FieldCheck(op, got.source, f, repr(g), repr(w), note))
    sources = sorted({d.source for d in recs})
    who = {"kernel": "tapped by the kernel", "host": "encoded by the harness from the case (they check the case "
           "file, not the kernel)", "unknown": "of unknown origin (an older recording)"}
    if all(c.ok for c in checks):
        notes.append(f"descriptor_{op} fields match the problem ({len(recs)} record(s), "
                     f"{'; '.join(who[s] for s in sources)})")
    status = Status.MATCH if all(c.ok for c in checks) else Status.MISMATCH
    return Comparison(status, (), tuple(notes), tuple(checks), Evidence((Feed.FIELDS,))), map_rows


def _block_mn(geo, op: str) -> int:
    """The tile's extent along operand `op`'s M or N."""
    return geo.bm if op == "a" else geo.bn


def _tile_from_image(geo, op: str, images: torch.Tensor) -> torch.Tensor:
    """Shared-memory images of operand `op` read back as its tiles, through the problem's layout and swizzle."""
    spec = geo.spec
    return ref_load.tile_from_image(images, op, getattr(spec, f"{op}_major"), _block_mn(geo, op), geo.bk,
                                    getattr(spec, f"{op}_dtype"), getattr(spec, f"swizzle_{op}"))


def _padded_only(got: tuple, want: tuple, mn_axis: int) -> bool:
    return (len(got) == len(want) and got[mn_axis] > want[mn_axis]
            and all(g == w for i, (g, w) in enumerate(zip(got, want)) if i != mn_axis))


def _load_stage(ctx: Context, nb: Notebook, op: str) -> StageResult:
    geo, tapped, ops = ctx.geo, ctx.taps, ctx.ops
    stage = f"load_{op}"
    tma = geo.has_tma(op)
    taps = tapped.taps_of(stage)
    if not taps:
        return StageResult.not_run(stage)
    if op == geo.quant_op:
        return _stored_load_stage(ctx, nb, taps, op)
    received, recorded = tapped.stack_taps(taps)
    ref = ops.ref_tiles(op, [(t.tile, t.k_block) for t in taps])
    valid = geo.valid_units(stage, [t.tile for t in taps], tuple(received.shape[1:]))
    where = [(geo.origin(stage, t.tile, t.k_block), t.tile, t.k_block) for t in taps]
    ch = nb.judge_units([Unit(Feed.REFERENCE, *w) for w in where], received, ref, valid=valid, recorded=recorded,
                        padding=stage)
    ups = [tapped.tap(f"descriptor_{op}", t.tile, t.k_block, t.partial) for t in taps]
    fed = [i for i, up in enumerate(ups) if up is not None]
    expected, upstream = ref, None
    if fed:  # the kernel's own images, read back through the swizzle
        rows = device_tensor(fed, geo.dev)
        images = torch.stack([ups[i].values for i in fed]).to(geo.dev)
        expected = ref.index_put((rows,), _tile_from_image(geo, op, images))
        upstream = torch.ones_like(recorded).index_put((rows,), tapped.image_elements_units([ups[i] for i in fed], op))
    units = []
    for tap, up, w in zip(taps, ups, where):
        if up is not None:
            units.append(Unit(Feed.KERNEL, *w))
        elif not tma:
            units.append(Unit(Feed.GLOBAL, *w))
        else:
            units.append(Unit(Feed.STAND_IN, *w, stand_ins=((f"descriptor_{op}", tap.tile, tap.k_block),)))
    tf = nb.judge_units(units, received, expected, valid=valid, recorded=recorded, upstream=upstream)
    return StageResult(stage, combine(tf), combine(ch))


load_stage = per_operand(_load_stage, "load_stage(ctx, op): the load stage of operand `op`, and what it noted.")


def _stored_load_stage(ctx: Context, nb: Notebook, taps, op: str) -> StageResult:
    """The load of the quantised operand: the stored tile, bit for bit, against the problem's stored
    operand (the load's real input when no TMA image was judged; a packed byte's mask covers both its k)."""
    geo, tapped, ops = ctx.geo, ctx.taps, ctx.ops
    stage = f"load_{op}"
    tf, ch = [], []
    for tap in taps:
        received = tap.values.to(geo.dev)
        ref = geo.orient(ops.stored_tile(tap.tile, tap.k_block))
        if received.dtype != ref.dtype or received.shape != ref.shape:
            received = received.view(ref.dtype) if received.element_size() == 1 else received
        recorded = tapped.recorded(tap)
        valid = geo.valid_mask(stage, tap.tile, tuple(received.shape))
        nb.note_padding(stage, valid, recorded)
        where = dict(origin=geo.origin(stage, tap.tile, tap.k_block), tile_index=tap.tile, k_block=tap.k_block)
        ch.append(nb.judge(received, ref, feed=Feed.REFERENCE, valid=valid, recorded=recorded, **where))
        tf.append(nb.judge(received, ref, feed=Feed.GLOBAL, valid=valid, recorded=recorded, **where))
    return StageResult(stage, combine(tf), combine(ch))

"""A Python model of a tiled GEMM kernel that taps every stage, with injectable defects.

It stands in for a real instrumented kernel where none is at hand (the embedded demo, and tests
of the differential on the CPU). It is written in plain torch, independently of the Triton
references, and walks the tiles the way a kernel does: per output tile, per k-block, a TMA
image into shared memory, the MMA's view of it, an fp32 accumulator, then the epilogue.
Recordings it makes are marked synthetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from harness.taps import Tap
from kernels_ref import epilogue_graph
from kernels_ref.dtypes import DTYPES
from oracle.run.inputs import Operands, Provenance
from oracle.problem.partition import group_offsets, tile_partials
from oracle.problem.spec import ProblemSpec
from oracle.run.recording import Recording

DEFECTS = {
    "descriptor_swizzle": "the TMA writes with 128B swizzle while the MMA reads the declared layout",
    "load_stale_slot": "at the defect k-block the MMA reads the previous k-block's pipeline slot",
    "load_transposed": "the MMA reads the A tile transposed (square tiles only)",
    "mma_kblock_twice": "the defect k-block is accumulated twice",
    "mma_no_reset": "the accumulator is not reset before the defect tile",
    "mma_fp16_acc": "the accumulator is held in fp16 although fp32 is declared",
    "epilogue_scale_twice": "the column scale is applied twice",
    "epilogue_bias_axis": "the bias is added per row instead of per column",
    "epilogue_gelu_tanh": "gelu uses the tanh approximation instead of erf",
    "epilogue_cast_nosat": "the fp8 cast does not saturate",
    "epilogue_beta_c_twice": "beta * C is added twice",
    "store_swapped": "the defect tile is stored at swapped (m, n) tile coordinates",
    "reduce_partial_twice": "the reduction adds the first partial of the defect tile twice",
    "reduce_partial_missing": "the reduction leaves out the last partial of the defect tile",
    "partial_overlap": "the defect tile's partial 1 starts one k-block early (it overlaps partial 0)",
    "partial_gap": "the defect tile's partial 1 starts one k-block late (the k-block before it is summed by none)",
    "reduce_wrong_partial": "the reduction reads partial 0 in place of the defect tile's last partial",
    "group_wrong_b": "the defect group is multiplied by the next group's B",
    "group_offset": "the defect group reads A from one row past its first row",
    "k_group_offset": "the defect group of a K-grouped problem reads A's columns and B's rows from group 0's first k "
                      "(its K offset not advanced)",
    "k_group_empty_skipped": "an empty group of a K-grouped problem (K = 0) is skipped: its D is left unwritten "
                             "(zeros)",
    "dequant_nibble_order": "at the defect k-block the packed operand's nibbles are read in the other order",
    "dequant_plain_pairs": "at the defect k-block a k8_interleaved operand's words are read in plain pair order "
                           "(k_pairs_low_first)",
    "dequant_group_index": "at the defect k-block the quantised operand's scale and zero point come from the next "
                           "group",
    "dequant_zero_twice": "at the defect k-block the quantised operand's zero point is subtracted twice",
    "dequant_scale_group": "at the defect k-block the quantised operand's scale comes from the next group (its zero "
                           "point is right)",
}
DEQUANT_DEFECTS = ("dequant_nibble_order", "dequant_plain_pairs", "dequant_group_index", "dequant_zero_twice",
                   "dequant_scale_group")
SPLIT_DEFECTS = ("reduce_partial_twice", "reduce_partial_missing", "partial_overlap", "partial_gap",
                 "reduce_wrong_partial")
GROUP_DEFECTS = ("group_wrong_b", "group_offset")
K_GROUP_DEFECTS = ("k_group_offset", "k_group_empty_skipped")


@dataclass(frozen=True)
class Injection:
    defect: str
    tile: tuple[int, int] = (0, 0)
    k_block: int = 1
    group: Optional[int] = None  # a grouped problem: the group the defect is in (default 0)

    def __post_init__(self):
        if self.defect not in DEFECTS:
            raise ValueError(f"defect {self.defect!r} is unknown; known: {', '.join(DEFECTS)}")

    def problems(self, spec: ProblemSpec) -> list[str]:
        """Why this defect would have no effect on `spec` (empty: it will show)."""
        d, (tm, tn), kb = self.defect, self.tile, self.k_block
        out = []
        if d in SPLIT_DEFECTS and not spec.partitioned:
            out.append(f"{d} needs a split problem (splits > 1 or stream_k_workers)")
        if d in GROUP_DEFECTS and (spec.groups is None and spec.batch == 1 or len(spec.group_sizes) < 2):
            out.append(f"{d} needs a grouped problem with at least two groups")
        if d in K_GROUP_DEFECTS:
            kg, g = spec.k_groups, self.group or 0
            if kg is None:
                out.append(f"{d} needs a K-grouped problem (k_groups)")
            elif d == "k_group_offset" and not (0 < g < len(kg) and kg[g] and spec.k_offsets[g]):
                out.append(f"{d} needs its group (group={self.group}) a non-empty group after group 0 that begins "
                           f"past k 0")
            elif d == "k_group_empty_skipped" and not (g < len(kg) and kg[g] == 0):
                out.append(f"{d} needs its group (group={self.group}) an empty group (K = 0)")
        if d in DEQUANT_DEFECTS:
            cfg = spec.dequant_config
            packing, zeros = (cfg.packing, cfg.zeros) if cfg is not None else (None, "none")
            grouped = cfg is not None and spec.quant_groups > 1
            X = (spec.quant_op or "b").upper()
            need_q = {"dequant_nibble_order": (packing is not None, f"a packed 4-bit {X}"),
                      "dequant_plain_pairs": (packing == "k8_interleaved", f"a k8_interleaved {X}"),
                      "dequant_group_index": (grouped, f"a quantised {X} of 2+ groups"),
                      "dequant_zero_twice": (zeros != "none", f"a {X} with zero points"),
                      "dequant_scale_group": (grouped, f"a quantised {X} of 2+ groups")}[d]
            if not need_q[0]:
                out.append(f"{d} needs {need_q[1]}")
        if spec.group_sizes is not None:
            return out
        if not (tm < spec.tiles_m and tn < spec.tiles_n):
            out.append(f"tile {self.tile} is outside the {spec.tiles_m}x{spec.tiles_n} tile grid")
        if d in ("descriptor_swizzle", "load_stale_slot", "load_transposed", "mma_kblock_twice") + DEQUANT_DEFECTS \
                and not 0 <= kb < spec.k_blocks:
            out.append(f"k-block {kb} is outside 0..{spec.k_blocks - 1}")
        need = {
            "descriptor_swizzle": (spec.swizzle_a in (64, 128), "swizzle_a of 64 or 128"),
            "load_stale_slot": (kb >= 1, "a k-block >= 1 (slot 0 has no previous one)"),
            "load_transposed": (spec.tile.bm == spec.tile.bk, "a square A tile (bm == bk)"),
            "mma_no_reset": ((tm, tn) != (0, 0), "a tile after the first (its predecessor leaves the stale sum)"),
            "epilogue_scale_twice": (spec.scale_b.kind == "col", "a per-column scale (scale_b col)"),
            "epilogue_bias_axis": (spec.bias == "col", "a per-column bias"),
            "epilogue_gelu_tanh": (spec.activation == "gelu_erf", "activation gelu_erf"),
            "epilogue_cast_nosat": (spec.out_dtype == "e4m3" and spec.saturate, "a saturating e4m3 output"),
            "epilogue_beta_c_twice": (spec.beta != 0, "beta != 0 (C is read)"),
            "store_swapped": (tm != tn and tn < spec.tiles_m and tm < spec.tiles_n, "an off-diagonal tile whose "
                              "swapped coordinates exist"),
        }.get(d)
        if need and not need[0]:
            out.append(f"{d} needs {need[1]}")
        return out


def _pad(x: torch.Tensor, rows: int, cols: int, fill: float) -> torch.Tensor:
    out = torch.full((rows, cols), fill, dtype=torch.float32).to(x.dtype) if x.is_floating_point() else \
        torch.zeros(rows, cols, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _swizzle_bytes(img: torch.Tensor, span: int) -> torch.Tensor:
    """Apply the TMA swizzle (its own inverse) to a byte image made of `span`-byte rows."""
    if span == 0:
        return img
    mask = {32: 1, 64: 3, 128: 7}[span]
    a = torch.arange(img.numel())
    src = a ^ (((a >> 7) & mask) << 4)
    return img[src]


def _smem_image(tile_storage: torch.Tensor, span: int) -> torch.Tensor:
    """Bytes of a storage-order tile [outer, inner] as TMA boxes of `span` bytes, swizzled."""
    raw = tile_storage.contiguous().view(torch.uint8)  # [outer, inner * itemsize]
    if span == 0:
        return raw.reshape(-1).clone()
    boxes = raw.reshape(raw.shape[0], -1, span).permute(1, 0, 2)  # [n_box, outer, span]
    return torch.cat([_swizzle_bytes(b.reshape(-1), span) for b in boxes])


def _storage(tile_logical: torch.Tensor, operand: str, major: str) -> torch.Tensor:
    """A tile [BM,BK] (A) or [BK,BN] (B) in its shared-memory storage order."""
    k_inner = (operand == "a" and major == "row") or (operand == "b" and major == "col")
    if operand == "a":
        return tile_logical if k_inner else tile_logical.t()
    return tile_logical.t() if k_inner else tile_logical


def simulate(spec: ProblemSpec, ops: Operands, provenance: Provenance, *, injection: Optional[Injection] = None,
             tap_tiles: Optional[Sequence[tuple[int, int]]] = None, partial_mma: bool = False,
             stale_padding: bool = False, kernel: str = "simulated_gemm", partition: Optional[str] = None,
             whole_untagged: bool = False, kernel_epilogue: Optional[Sequence[str]] = None) -> Recording:
    """Run the model. `stale_padding` fills A's rows past M with leftovers of another problem, as a
    kernel whose batch is smaller than its MMA tile does: correct, but the taps hold garbage there.
    A split problem accumulates each tile in its partials, each from zero, and taps them and their
    reduction; the model deals k-blocks by `partition` (an oracle.problem.partition rule; default: the
    problem's own). With `whole_untagged`, a tile of a split problem that one partial covers is done
    as a whole tile: its taps name no partial (-1 in the trace) and it has no reduction. A grouped
    problem runs every group as its own GEMM. `kernel_epilogue` is the epilogue graph the model's
    kernel follows (kernels_ref.epilogue_graph tokens; default: the problem's declared one), so a
    recording can be made of a kernel whose epilogue is not the declared one."""
    graph = spec.epilogue_nodes if kernel_epilogue is None else epilogue_graph.parse(kernel_epilogue,
                                                                                      "kernel_epilogue")
    if spec.k_groups is not None:
        return _simulate_k_groups(spec, ops, provenance, injection, tap_tiles, kernel)
    if spec.group_sizes is not None:
        return _simulate_groups(spec, ops, provenance, injection, tap_tiles, kernel)
    t = spec.tile
    bm, bn, bk = t.bm, t.bn, t.bk
    m, n = spec.m, spec.n
    kb_n = spec.k_blocks
    fill = math.nan if spec.oob_fill == "nan" else 0.0
    per = 2 if spec.dequant_config is not None and spec.dequant_config.packed else 1
    if spec.quantised_a:  # the stored A: its bytes (two k a byte when packed), zero past M
        a_pad = torch.zeros(spec.tiles_m * bm, kb_n * bk // per, dtype=ops.a.dtype)
        a_pad[:m, :] = ops.a
    else:
        a_pad = _pad(ops.a, spec.tiles_m * bm, kb_n * bk, fill)
    if spec.quantised_b:  # the stored B: its bytes (two k a byte when packed), zero past N
        b_pad = torch.zeros(kb_n * bk // per, spec.tiles_n * bn, dtype=ops.b.dtype)
        b_pad[:, :n] = ops.b
    else:
        b_pad = _pad(ops.b, kb_n * bk, spec.tiles_n * bn, fill)
    a_pad[m:, :] = 0  # rows past M: a real kernel's OOB fill there never reaches a valid output
    b_pad[:, n:] = 0
    if stale_padding:
        g = torch.Generator().manual_seed(1234)
        a_pad[m:, :] = (torch.randn(a_pad.shape[0] - m, a_pad.shape[1], generator=g) * 50).to(a_pad.dtype)
    inj = injection
    if inj is not None and inj.problems(spec):
        raise ValueError(f"defect {inj.defect} cannot show on {spec.describe()}: {'; '.join(inj.problems(spec))}")
    tap_set = set(tap_tiles) if tap_tiles is not None else {(0, 0)}
    taps: list[Tap] = []
    d_full = torch.zeros(spec.tiles_m * bm, spec.tiles_n * bn, dtype=DTYPES[spec.out_dtype].torch)
    stale_acc = None
    for tm in range(spec.tiles_m):
        for tn in range(spec.tiles_n):
            here = (tm, tn)
            tapped = here in tap_set
            bad = inj is not None and inj.tile == here
            fp16 = bad and inj.defect == "mma_fp16_acc"
            acc = torch.zeros(bm, bn, dtype=torch.float16 if fp16 else torch.float32)
            if bad and inj.defect == "mma_no_reset" and stale_acc is not None:
                acc = stale_acc.clone()
            finals = []
            pieces = tile_partials(spec, here, partition)
            whole = whole_untagged and len(pieces) == 1
            for piece in pieces:
                pidx = piece.index if spec.partitioned and not whole else None
                begin = piece.kb_begin
                if bad and inj.defect == "partial_overlap" and piece.index == 1:
                    begin -= 1
                if bad and inj.defect == "partial_gap" and piece.index == 1:
                    begin += 1
                if spec.partitioned and not (bad and inj.defect == "mma_no_reset"):
                    acc = torch.zeros_like(acc)
                acc = _run_partial(spec, ops, here, range(begin, piece.kb_end), pidx, acc, a_pad, b_pad, inj, bad,
                                   tapped, taps, partial_mma, m, n)
                finals.append(acc.float())
            if spec.partitioned and not whole:
                parts = list(finals)
                if bad and inj.defect == "reduce_partial_twice":
                    parts.append(parts[0])
                if bad and inj.defect == "reduce_partial_missing":
                    parts = parts[:-1]
                if bad and inj.defect == "reduce_wrong_partial":
                    parts[-1] = parts[0]
                acc = torch.zeros(bm, bn)
                for x in parts:
                    acc = acc + x
                if tapped:
                    taps.append(Tap("reduce", here, acc.clone()))
            stale_acc = acc.float()
            y = acc.float()
            steps = {}
            r0, c0 = tm * bm, tn * bn
            for node in graph:  # the kernel's epilogue, in its order (default: scale, alpha_beta, bias, ...)
                y = _epilogue_node(spec, ops, node.step, y, r0, c0, bad and inj.defect)
                if node.rounds:
                    y = y.to(DTYPES[node.round].torch).float()
                steps[node.step] = y
            out = y
            if tapped:
                for name, v in steps.items():
                    taps.append(Tap(f"epilogue_{name}", here, v.clone()))
            dst = (tn, tm) if bad and inj.defect == "store_swapped" and tn < spec.tiles_m and tm < spec.tiles_n \
                else here
            d_full[dst[0] * bm:dst[0] * bm + bm, dst[1] * bn:dst[1] * bn + bn] = out
    return Recording(spec=spec, operands=ops, output=d_full[:m, :n].contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=kernel if inj is None else f"{kernel}[{inj.defect}]", synthetic=True)


def _epilogue_node(spec, ops, step, y, r0, c0, defect):
    """One epilogue step of the tile at (r0, c0) in fp32 (the cast: in the output dtype); `defect`
    is the planted defect of this tile, or False."""
    bm, bn = spec.tile.bm, spec.tile.bn
    if step == "scale":
        if spec.scale_a.kind == "row":
            y = y * _vec(ops.scale_a, r0, bm)[:, None]
        if spec.scale_a.kind == "tensor":
            y = y * ops.scale_a.reshape(())
        if spec.scale_b.kind == "col":
            cs = _vec(ops.scale_b, c0, bn)[None, :]
            y = y * cs
            if defect == "epilogue_scale_twice":
                y = y * cs
        if spec.scale_b.kind == "tensor":
            y = y * ops.scale_b.reshape(())
        return y
    if step in ("alpha_beta", "alpha"):
        y = spec.alpha * y
    if step in ("alpha_beta", "beta_c") and spec.beta != 0:
        cc = spec.beta * _pad(ops.c.float()[r0:r0 + bm, c0:c0 + bn], bm, bn, 0.0)
        y = y + cc
        if defect == "epilogue_beta_c_twice":
            y = y + cc
    if step == "bias" and spec.bias != "none":
        axis = spec.bias
        if defect == "epilogue_bias_axis":
            axis = "row" if axis == "col" else "col"
        if axis == "row":
            y = y + _vec(ops.bias, r0, bm)[:, None]
        else:
            y = y + _vec(ops.bias, c0, bn)[None, :]
    if step == "activation":
        act = spec.activation
        if defect == "epilogue_gelu_tanh" and act == "gelu_erf":
            act = "gelu_tanh"
        y = _activation(y, act)
    if step == "cast":
        if spec.saturate and defect != "epilogue_cast_nosat":
            mx = DTYPES[spec.out_dtype].max_finite
            y = y.clamp(-mx, mx)
        out = y.to(DTYPES[spec.out_dtype].torch)
        if spec.out_dtype == "e4m3":  # torch saturates e4m3; the hardware cvt without .satfinite gives NaN
            out = out.clone()
            out.view(torch.uint8)[y.abs() > 464] = 0x7F
        return out
    return y


def _run_partial(spec, ops, here, kbs, pidx, acc, a_pad, b_pad, inj, bad, tapped, taps, partial_mma, m, n):
    """The k-blocks `kbs` of tile `here` accumulated into `acc` (partial `pidx` of a split tile), tapped."""
    t = spec.tile
    bm, bn, bk = t.bm, t.bn, t.bk
    tm, tn = here
    prev_tiles = None
    for kb in kbs:
        tiles = {}
        q = spec.quant_op
        if q is not None:  # the stored tile, loaded as bytes, then dequantised in registers (K along its rows)
            per = 2 if spec.dequant_config.packed else 1
            ks = slice(kb * bk // per, (kb + 1) * bk // per)
            stored = b_pad[ks, tn * bn:tn * bn + bn].clone() if q == "b" else a_pad[tm * bm:tm * bm + bm, ks].clone()
            defect = inj.defect if bad and kb == inj.k_block else None
            flip = (lambda x: x.t().contiguous()) if q == "a" else (lambda x: x)
            tiles[q] = flip(_dequant(spec, ops, flip(stored), kb * bk, (tm * bm if q == "a" else tn * bn), defect))
            if tapped:
                taps.append(Tap(f"load_{q}", here, stored, k_block=kb, slot=kb % 2, partial=pidx))
                taps.append(Tap(f"dequant_{q}", here, tiles[q].clone(), k_block=kb, slot=kb % 2, partial=pidx))
        for op, src, sl in (("a", a_pad, (slice(tm * bm, tm * bm + bm), slice(kb * bk, kb * bk + bk))),
                            ("b", b_pad, (slice(kb * bk, kb * bk + bk), slice(tn * bn, tn * bn + bn)))):
            if op in tiles:
                continue
            logical = src[sl].clone()
            major = getattr(spec, f"{op}_major")
            span = getattr(spec, f"swizzle_{op}")
            write_span = span
            if bad and inj.defect == "descriptor_swizzle" and op == "a" and kb == inj.k_block:
                write_span = 128 if span != 128 else 64
            img = _smem_image(_storage(logical, op, major), write_span)
            # the MMA's view: unswizzle with the DECLARED layout
            view = _unimage(img, op, major, logical.shape, logical.dtype, span)
            if bad and inj.defect == "load_stale_slot" and kb == inj.k_block and prev_tiles is not None:
                view = prev_tiles[op]
            if bad and inj.defect == "load_transposed" and op == "a" and kb == inj.k_block:
                view = view.t().contiguous()
            tiles[op] = view
            if tapped:
                taps.append(Tap(f"descriptor_{op}", here, img, k_block=kb, slot=kb % 2, partial=pidx))
                taps.append(Tap(f"load_{op}", here, view.clone(), k_block=kb, slot=kb % 2, partial=pidx))
        prev_tiles = tiles
        part = tiles["a"].float() @ tiles["b"].float()
        if spec.block_scaled:
            gm, gk = spec.scale_a.block
            gn = spec.scale_b.block[0]
            rows = (tm * bm + torch.arange(bm)).clamp(max=m - 1) // gm
            cols = (tn * bn + torch.arange(bn)).clamp(max=n - 1) // gn
            g = kb * bk // gk
            part = part * ops.scale_a[rows, g][:, None] * ops.scale_b[cols, g][None, :]
        if bad and inj.defect == "mma_kblock_twice" and kb == inj.k_block:
            part = part * 2
        acc = (acc.float() + part).to(acc.dtype)
        if tapped:
            mask = None
            if partial_mma:
                mask = torch.zeros(bm, bn, dtype=torch.bool)
                mask[::2, :] = True  # as if only the even-row fragments were tapped
            vals = acc.float().clone()
            if mask is not None:
                vals[~mask] = 0
            taps.append(Tap("mma", here, vals, k_block=kb, mask=mask, partial=pidx))
    return acc


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _dequant(spec, ops, stored, k0, n0, defect) -> torch.Tensor:
    """The model kernel's register dequant of one stored tile of the quantised operand, K along its
    rows (A's transposed; n0 and "columns" are then A's rows): codes by the packing, w = (q - z) * s
    (float_offset: (q - c) * s + z) with the group's scale and zero point, in fp32 then rounded to
    the MMA's dtype ("operand": each step in that dtype), with the planted dequant defect, if any."""
    raw = stored.view(torch.uint8).to(torch.int32)
    qop = spec.quant_op
    qdtype, scale_dtype, zero_kind = (getattr(spec, f"{qop}_{f}") for f in ("dtype", "scales", "zeros"))
    _, op_scales, op_zeros = ops.quant_kn(qop)
    extent = spec.n if qop == "b" else spec.m
    packing = getattr(spec, f"{qop}_packing")
    if defect == "dequant_plain_pairs":
        packing = "k_pairs_low_first"
    if packing == "k8_interleaved":  # each column's 4-byte little-endian words, 8 nibbles each
        words = sum(raw[j::4].to(torch.int64) << (8 * j) for j in range(4))  # [BK / 8, BN]
        order = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds element order[i] of the word's 8 k
        if defect == "dequant_nibble_order":
            order = tuple(order[i ^ 1] for i in range(8))  # the two nibbles of each byte swapped
        codes = torch.empty(2 * raw.shape[0], raw.shape[1], dtype=torch.int32)
        for i, e in enumerate(order):
            codes[e::8] = ((words >> (4 * i)) & 0xF).to(torch.int32)
    elif packing is not None:
        low_first = packing == "k_pairs_low_first"
        if defect == "dequant_nibble_order":
            low_first = not low_first
        lo, hi = raw & 0xF, raw >> 4
        pair = (lo, hi) if low_first else (hi, lo)
        codes = torch.stack(pair, dim=1).reshape(2 * raw.shape[0], raw.shape[1])
    else:
        codes = raw
    if qdtype == "int4":
        q = torch.where(codes >= 8, codes - 16, codes).float()
    elif qdtype == "uint4":
        q = codes.float()
    elif qdtype == "fp4_e2m1":
        q = torch.tensor(_E2M1)[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    elif qdtype == "int8":
        q = torch.where(codes >= 128, codes - 256, codes).float()
    else:
        q = codes.to(torch.uint8).view(DTYPES[qdtype].torch).float()
    tk, tn = q.shape
    groups = op_scales.shape[0]
    g = (k0 + torch.arange(tk)) // spec.group_k
    gz = g
    if defect in ("dequant_group_index", "dequant_scale_group"):
        g = (g + 1) % groups
        if defect == "dequant_group_index":
            gz = g
    cols = (n0 + torch.arange(tn)).clamp(max=extent - 1)
    if scale_dtype == "e8m0":
        b = op_scales.view(torch.uint8).to(torch.int64)
        scales = torch.where(b == 255, float("nan"), torch.pow(2.0, (b - 127).double())).float()
    else:
        scales = op_scales.float()
    s = scales[g[:, None], cols[None, :]]
    z = torch.zeros_like(s) if op_zeros is None else op_zeros.float()[gz[:, None], cols[None, :]]
    if defect == "dequant_zero_twice":
        z = 2 * z
    out_t = DTYPES[spec.mma_dtype].torch
    if zero_kind == "float_offset":  # w = (q - c) * s + z
        t = q - (8.0 if qdtype == "uint4" else 0.0)
        if spec.resolved_dequant_precision == "fp32":
            w = t * s + z
        else:
            w = (t * s.to(out_t).float()).to(out_t).float() + z.to(out_t).float()
    elif spec.resolved_dequant_precision == "fp32":
        w = (q - z) * s
    else:
        w = (q - z.to(out_t).float()).to(out_t).float() * s.to(out_t).float()
    w = w.to(out_t)
    w[:, (n0 + torch.arange(tn)) >= extent] = 0
    return w


def _unimage(img, op, major, shape, dtype, span) -> torch.Tensor:
    """Inverse of _smem_image: the logical tile the MMA reads."""
    k_inner = (op == "a" and major == "row") or (op == "b" and major == "col")
    if op == "a":
        outer, inner = (shape[0], shape[1]) if k_inner else (shape[1], shape[0])
    else:
        outer, inner = (shape[1], shape[0]) if k_inner else (shape[0], shape[1])
    itemsize = torch.empty((), dtype=dtype).element_size()
    if span == 0:
        raw = img.reshape(outer, inner * itemsize)
    else:
        boxes = torch.stack([_swizzle_bytes(b, span) for b in img.reshape(-1, outer * span)])
        boxes = boxes.reshape(-1, outer, span)  # [n_box, outer, span]
        raw = boxes.permute(1, 0, 2).reshape(outer, inner * itemsize)
    st = raw.contiguous().view(dtype).reshape(outer, inner)
    if op == "a":
        return st if k_inner else st.t().contiguous()
    return st.t().contiguous() if k_inner else st


def _vec(v: torch.Tensor, start: int, size: int) -> torch.Tensor:
    out = torch.zeros(size, dtype=torch.float32)
    part = v.float()[start:start + size]
    out[:part.numel()] = part
    return out


def _activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "relu":
        return torch.relu(x)
    if kind == "gelu_erf":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "silu":
        return x * torch.sigmoid(x)
    return x


def _simulate_groups(spec: ProblemSpec, ops: Operands, provenance: Provenance, inj: Optional[Injection],
                     tap_tiles, kernel: str) -> Recording:
    """Every group as its own GEMM (oracle.problem.partition): its taps name the group, D's rows follow."""
    import dataclasses

    if inj is not None and inj.problems(spec):
        raise ValueError(f"defect {inj.defect} cannot show on {spec.describe()}: {'; '.join(inj.problems(spec))}")
    offs = group_offsets(spec)
    sizes = spec.group_sizes
    bad_group = None if inj is None else (inj.group or 0)
    taps, rows = [], []
    for g, m_g in enumerate(sizes):
        if m_g == 0:
            continue
        o = offs[g]
        a = ops.a[o:o + m_g]
        b = ops.b[g]
        if g == bad_group and inj.defect == "group_offset":
            a = torch.cat([ops.a[o + 1:o + 1 + m_g], torch.zeros(max(0, o + 1 + m_g - spec.total_m), spec.k,
                                                                  dtype=ops.a.dtype)])
        if g == bad_group and inj.defect == "group_wrong_b":
            b = ops.b[(g + 1) % len(sizes)]
        bias = None if ops.bias is None else (ops.bias[o:o + m_g] if spec.bias == "row" else ops.bias[g])
        sub = dataclasses.replace(spec, m=m_g, groups=None, batch=1)
        sub_ops = Operands(a=a, b=b, c=None if ops.c is None else ops.c[o:o + m_g], bias=bias,
                           scale_a=ops.scale_a, scale_b=ops.scale_b)
        inner = inj if g == bad_group and inj.defect not in GROUP_DEFECTS else None
        _run_group(g, sub, sub_ops, provenance, inner, tap_tiles, kernel, taps, rows)
    return _stacked(spec, ops, provenance, inj, kernel, taps, rows)


def _simulate_k_groups(spec: ProblemSpec, ops: Operands, provenance: Provenance, inj: Optional[Injection],
                       tap_tiles, kernel: str) -> Recording:
    """A K-grouped launch: every group as its own GEMM on its columns of A and rows of B, its taps naming
    the group, D's rows [g M, (g + 1) M) its output; an empty group runs the epilogue of a zero
    accumulator (a one-k-block GEMM of zeros, untapped)."""
    import dataclasses

    if inj is not None and inj.problems(spec):
        raise ValueError(f"defect {inj.defect} cannot show on {spec.describe()}: {'; '.join(inj.problems(spec))}")
    m, koffs = spec.m, spec.k_offsets
    bad_group = None if inj is None else (inj.group or 0)
    taps, rows = [], []
    for g, kg in enumerate(spec.k_groups):
        o, k0 = g * m, koffs[g]
        bias = None if ops.bias is None else (ops.bias[o:o + m] if spec.bias == "row" else ops.bias[g])
        c = None if ops.c is None else ops.c[o:o + m]
        if kg == 0:
            if g == bad_group and inj.defect == "k_group_empty_skipped":
                rows.append(torch.zeros(m, spec.n, dtype=DTYPES[spec.out_dtype].torch))
                continue
            sub = dataclasses.replace(spec, k=spec.tile.bk, k_groups=None)
            zero = Operands(a=torch.zeros(m, sub.k, dtype=ops.a.dtype), b=torch.zeros(sub.k, spec.n, dtype=ops.b.dtype),
                            c=c, bias=bias, scale_a=ops.scale_a, scale_b=ops.scale_b)
            rows.append(simulate(sub, zero, provenance, tap_tiles=(), kernel=kernel).output)
            continue
        if g == bad_group and inj.defect == "k_group_offset":
            k0 = 0
        sub = dataclasses.replace(spec, k=kg, k_groups=None)
        sub_ops = Operands(a=ops.a[:, k0:k0 + kg], b=ops.b[k0:k0 + kg], c=c, bias=bias, scale_a=ops.scale_a,
                           scale_b=ops.scale_b)
        inner = inj if g == bad_group and inj.defect not in K_GROUP_DEFECTS else None
        _run_group(g, sub, sub_ops, provenance, inner, tap_tiles, kernel, taps, rows)
    return _stacked(spec, ops, provenance, inj, kernel, taps, rows)


def _run_group(g: int, sub: ProblemSpec, sub_ops: Operands, provenance: Provenance, inner: Optional[Injection],
               tap_tiles, kernel: str, taps: list, rows: list) -> None:
    """Group g of a grouped launch run as its own GEMM: its taps name the group, its D rows follow."""
    import dataclasses

    rec = simulate(sub, sub_ops, provenance, injection=inner, tap_tiles=tap_tiles, kernel=kernel)
    taps.extend(dataclasses.replace(t, group=g) for t in rec.taps)
    rows.append(rec.output)


def _stacked(spec: ProblemSpec, ops: Operands, provenance: Provenance, inj: Optional[Injection], kernel: str,
             taps: list, rows: list) -> Recording:
    """The recording of a grouped launch: every group's D rows one after the other, every group's taps."""
    name = kernel if inj is None else f"{kernel}[{inj.defect}]"
    return Recording(spec=spec, operands=ops, output=torch.cat(rows), provenance=provenance, taps=tuple(taps),
                     kernel=name, synthetic=True)

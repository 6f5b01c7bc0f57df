"""A Python model of a block-scaled fp8 GEMM ("1d2d": A's per-row scales and B's block scales applied to
each k-block's product as it is promoted into the fp32 accumulator) that taps load_a / load_b,
scale_a / scale_b and mma, with the scale-indexing bugs of public kernels planted on demand.

A grouped (MoE) or batched problem runs group by group, each with its rows of A's scales and B's
scales [g] (oracle.problem.spec), its taps naming the group; `scale_group_b_not_advanced` plants a
grouped launch's bug (every group applies group 0's B scales). A K-grouped problem runs group by
group on its K slice and its scale columns; `scale_k_group_not_advanced` plants its launch's bug
(every group applies the scale columns from group 0's first on).

Per tile (in a grouped launch order: block index -> tile coordinate, GROUP_M tiles along M a group),
per partial of a split tile, per k-block: p = fp32(A_kb @ B_kb) per scale group of the k-block and
acc = fp32(acc + fp32(p * fp32(sa * sb))). Written in plain torch, independently of the references;
recordings are marked synthetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.taps import Tap
from kernels_ref import scales as ref_scales
from kernels_ref.dtypes import DTYPES
from oracle.problem.partition import tile_partials
from oracle.problem.spec import ProblemSpec
from oracle.run.inputs import Operands, Provenance
from oracle.run.recording import Recording

GROUP_M = 2  # the launch order's tile groups along M
SCALE_DEFECTS = {
    "scale_b_reused": "the B-scale register is reused across M waves: from the second wave on it holds A's scale, "
                      "so A's scale is applied twice",
    "scale_split_slice0": "every split-K slice uses slice 0's scales",
    "scale_raw_block_index": "A's scale rows come from the raw block index instead of the swizzled tile coordinate",
    "scale_trailing_skipped": "the trailing K scale group is skipped by a strict '<' (the previous group's scale "
                              "stays in the register)",
    "scale_one_per_k_block": "one scale is loaded per k-block over scale groups narrower than it",
    "scale_map_group_size": "A's scale tensor map is built with the group size where the scale count belonged: "
                            "rows past it read as zero",
}

# a grouped (MoE) or batched launch's defects: not planted in the zoo's single-GEMM kernels
GROUPED_SCALE_DEFECTS = {
    "scale_group_b_not_advanced": "B's scale pointer is not advanced per group: every group applies group 0's "
                                  "B scales",
}
# a K-grouped launch's (oracle.problem.spec: k_groups)
K_GROUPED_SCALE_DEFECTS = {
    "scale_k_group_not_advanced": "the scale pointers are not advanced along K per group: every group applies the "
                                  "scale columns from group 0's first on",
}


@dataclass(frozen=True)
class ScaleInjection:
    defect: str

    def __post_init__(self):
        known = list(SCALE_DEFECTS) + list(GROUPED_SCALE_DEFECTS) + list(K_GROUPED_SCALE_DEFECTS)
        if self.defect not in known:
            raise ValueError(f"scale defect {self.defect!r} is unknown; known: {', '.join(known)}")

    def problems(self, spec: ProblemSpec) -> list[str]:
        """Why the defect would change nothing on `spec` (empty: it shows)."""
        if not spec.block_scaled:
            return [f"{self.defect} needs block scales (scale_a.kind and scale_b.kind block)"]
        if self.defect in K_GROUPED_SCALE_DEFECTS:
            kg = spec.k_groups or ()
            return [] if any(kg[g] and spec.k_offsets[g] for g in range(len(kg))) else \
                [f"{self.defect} needs a K-grouped problem with a non-empty group past k 0"]
        if spec.k_groups is not None:
            return [f"{self.defect} is planted in a single GEMM or an M-grouped one, not in a K-grouped one"]
        if self.defect in GROUPED_SCALE_DEFECTS:
            sizes = spec.group_sizes or ()
            return [] if any(sizes[1:]) else [f"{self.defect} needs a grouped or batched problem with rows in a "
                                              f"group after group 0"]
        if spec.group_sizes is not None:
            return [f"{self.defect} is planted in a single GEMM, not in a grouped or batched one"]
        gk = spec.scale_a.block[1]
        groups = -(-spec.k // gk)
        need = {"scale_b_reused": (spec.tiles_m >= 2, "two or more tiles along M (a second M wave)"),
                "scale_split_slice0": (spec.splits > 1, "split-K (splits > 1)"),
                "scale_raw_block_index": (spec.tiles_m >= 2 and spec.tiles_n >= 2,
                                          "a tile grid of at least 2 x 2 (the launch order swizzles it)"),
                "scale_trailing_skipped": (groups >= 2, "two or more scale groups along K"),
                "scale_one_per_k_block": (gk < spec.tile.bk, "scale groups narrower than tile.bk"),
                "scale_map_group_size": (spec.m > gk, f"M larger than the group size ({gk})")}[self.defect]
        return [] if need[0] else [f"{self.defect} needs {need[1]}"]


def launch_order(spec: ProblemSpec) -> list[tuple[int, tuple[int, int]]]:
    """(block index, tile) in launch order: GROUP_M tiles along M, then the next column."""
    out, tm_n, tn_n = [], spec.tiles_m, spec.tiles_n
    for pid in range(tm_n * tn_n):
        per_group = GROUP_M * tn_n
        first = (pid // per_group) * GROUP_M
        size = min(tm_n - first, GROUP_M)
        out.append((pid, (first + (pid % per_group) % size, (pid % per_group) // size)))
    return out


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols)
    out[:x.shape[0], :x.shape[1]] = x.float()
    return out


def simulate_scaled(spec: ProblemSpec, ops: Operands, provenance: Provenance,
                    injection: Optional[ScaleInjection] = None, kernel: str = "simulated_1d2d") -> Recording:
    """Run the model over every tile, tapping every tile and k-block."""
    if injection is not None and injection.problems(spec):
        raise ValueError(f"defect {injection.defect} cannot show on {spec.describe()}: "
                         f"{'; '.join(injection.problems(spec))}")
    if not spec.block_scaled or spec.stream_k_workers is not None:
        raise ValueError("the block-scaled model runs a GEMM with block scales (split-K allowed, no stream-K)")
    if spec.k_groups is not None:
        return _simulate_k_groups(spec, ops, provenance, injection, kernel)
    if spec.group_sizes is not None:
        return _simulate_groups(spec, ops, provenance, injection, kernel)
    d = injection.defect if injection is not None else None
    t = spec.tile
    bm, bn, bk = t.bm, t.bn, t.bk
    gk = spec.scale_a.block[1]
    s = ref_scales.groups_per_k_block(gk, bk)
    sub = bk // s  # k of one scale group inside the k-block
    a = _pad(ops.a, spec.tiles_m * bm, spec.k_blocks * bk)
    b = _pad(ops.b, spec.k_blocks * bk, spec.tiles_n * bn)
    va = ref_scales.scale_values(ops.scale_a, spec.scale_a.dtype)
    vb = ref_scales.scale_values(ops.scale_b, spec.scale_b.dtype)
    if d == "scale_map_group_size":
        va = va.clone()
        va[gk // spec.scale_a.block[0]:] = 0.0  # the map's row count is the group size: rows past it read zero
    n_groups = va.shape[1]
    taps: list[Tap] = []
    out = torch.zeros(spec.tiles_m * bm, spec.tiles_n * bn)
    for pid, (tm, tn) in launch_order(spec):
        scale_tm = pid // spec.tiles_n if d == "scale_raw_block_index" else tm
        pieces = tile_partials(spec, (tm, tn))
        finals = []
        for piece in pieces:
            pidx = piece.index if spec.partitioned else None
            acc = torch.zeros(bm, bn)
            for kb in range(piece.kb_begin, piece.kb_end):
                skb = pieces[0].kb_begin + kb - piece.kb_begin if d == "scale_split_slice0" else kb
                sa = ref_scales.tile_scales(va, spec.scale_a.block[0], gk, scale_tm * bm, bm, skb, bk, spec.m)
                sb = ref_scales.tile_scales(vb, spec.scale_b.block[0], gk, tn * bn, bn, skb, bk, spec.n)
                if d == "scale_trailing_skipped":  # the last group never loaded: the register keeps the one before
                    for j in range(s):
                        if ref_scales.group_of(skb, j, gk, bk) == n_groups - 1:  # group n - 2's column, alone
                            sa[:, j] = ref_scales.tile_scales(va, spec.scale_a.block[0], gk, scale_tm * bm, bm,
                                                              n_groups - 2, gk, spec.m)[:, 0]
                            sb[:, j] = ref_scales.tile_scales(vb, spec.scale_b.block[0], gk, tn * bn, bn,
                                                              n_groups - 2, gk, spec.n)[:, 0]
                if d == "scale_one_per_k_block":
                    sa, sb = sa[:, :1].expand(bm, s).clone(), sb[:, :1].expand(bn, s).clone()
                if d == "scale_b_reused" and tm >= 1:
                    sb = sa[:1, :].expand(bn, s).clone()  # the B register holds A's scale of the tile's first row
                a_t = a[tm * bm:(tm + 1) * bm, kb * bk:(kb + 1) * bk]
                b_t = b[kb * bk:(kb + 1) * bk, tn * bn:(tn + 1) * bn]
                for j in range(s):
                    p = (a_t[:, j * sub:(j + 1) * sub].double() @ b_t[j * sub:(j + 1) * sub].double()).float()
                    scale = (sa[:, j, None] * sb[None, :, j]).float()
                    acc = acc + (p * scale)
                taps.append(Tap("load_a", (tm, tn), a_t.to(ops.a.dtype), k_block=kb, partial=pidx))
                taps.append(Tap("load_b", (tm, tn), b_t.to(ops.b.dtype), k_block=kb, partial=pidx))
                taps.append(Tap("scale_a", (tm, tn), sa.float(), k_block=kb, partial=pidx))
                taps.append(Tap("scale_b", (tm, tn), sb.float(), k_block=kb, partial=pidx))
                taps.append(Tap("mma", (tm, tn), acc.clone(), k_block=kb, partial=pidx))
            finals.append(acc)
        acc = finals[0]
        if spec.partitioned:
            acc = torch.zeros(bm, bn)
            for x in finals:
                acc = acc + x
            taps.append(Tap("reduce", (tm, tn), acc.clone()))
        out[tm * bm:(tm + 1) * bm, tn * bn:(tn + 1) * bn] = acc
    y = out[:spec.m, :spec.n].to(DTYPES[spec.out_dtype].torch)
    name = kernel if d is None else f"{kernel}[{d}]"
    return Recording(spec=spec, operands=ops, output=y.contiguous(), provenance=provenance, taps=tuple(taps),
                     kernel=name, synthetic=True)


def _simulate_groups(spec: ProblemSpec, ops: Operands, provenance: Provenance, injection: Optional[ScaleInjection],
                     kernel: str) -> Recording:
    """A grouped or batched launch: each group run as its own GEMM on its rows of A (and of A's
    scales), B[g] and B's scales [g], its taps naming the group; an empty group runs no tile."""
    import dataclasses

    from oracle.problem.partition import group_offsets
    from oracle.run.inputs import group_scales

    offs = group_offsets(spec)
    d = injection.defect if injection is not None else None
    taps: list[Tap] = []
    outs = []
    for g, m_g in enumerate(spec.group_sizes):
        if m_g == 0:
            continue
        sub = dataclasses.replace(spec, m=m_g, groups=None, batch=1)
        sa, sb = group_scales(spec, ops, g)
        if d == "scale_group_b_not_advanced":
            sb = group_scales(spec, ops, 0)[1]
        o = offs[g]
        one = simulate_scaled(sub, Operands(a=ops.a[o:o + m_g], b=ops.b[g], scale_a=sa, scale_b=sb), provenance,
                              None, kernel)
        taps += [dataclasses.replace(t, group=g) for t in one.taps]
        outs.append(one.output)
    y = torch.cat(outs) if outs else torch.zeros(0, spec.n, dtype=DTYPES[spec.out_dtype].torch)
    name = kernel if d is None else f"{kernel}[{d}]"
    return Recording(spec=spec, operands=ops, output=y.contiguous(), provenance=provenance, taps=tuple(taps),
                     kernel=name, synthetic=True)


def _simulate_k_groups(spec: ProblemSpec, ops: Operands, provenance: Provenance,
                       injection: Optional[ScaleInjection], kernel: str) -> Recording:
    """A K-grouped launch: each group run as its own GEMM on its columns of A and rows of B and the
    scale columns of its K slice, its taps naming the group; an empty group's D is its zero
    accumulator's (zeros: the model has no epilogue). `scale_k_group_not_advanced` gives every group
    the scale columns from 0 on."""
    import dataclasses

    from oracle.run.inputs import group_scales

    d = injection.defect if injection is not None else None
    gk, koffs = spec.scale_a.block[1], spec.k_offsets
    taps: list[Tap] = []
    outs = []
    for g, kg in enumerate(spec.k_groups):
        if kg == 0:
            outs.append(torch.zeros(spec.m, spec.n, dtype=DTYPES[spec.out_dtype].torch))
            continue
        sa, sb = group_scales(spec, ops, g)
        if d == "scale_k_group_not_advanced":
            sa, sb = ops.scale_a[:, :kg // gk], ops.scale_b[:, :kg // gk]
        k0 = koffs[g]
        sub = dataclasses.replace(spec, k=kg, k_groups=None)
        one = simulate_scaled(sub, Operands(a=ops.a[:, k0:k0 + kg], b=ops.b[k0:k0 + kg], scale_a=sa, scale_b=sb),
                              provenance, None, kernel)
        taps += [dataclasses.replace(t, group=g) for t in one.taps]
        outs.append(one.output)
    name = kernel if d is None else f"{kernel}[{d}]"
    return Recording(spec=spec, operands=ops, output=torch.cat(outs).contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=name, synthetic=True)


def default_problem(defect: Optional[str] = None, scale_dtype: str = "fp32", groups: int = 1,
                    splits: int = 1, k: Optional[int] = None) -> ProblemSpec:
    """A small block-scaled problem on which `defect` shows: 64 x 64 x 64 e4m3 in 32 x 32 x 32 tiles, A's
    scales 1 x 32 and B's 32 x 32 in fp32 (1 x 16 groups for scale_one_per_k_block; e8m0 or e4m3 scales
    over 1 x 32 / 1 x 16 groups with `scale_dtype`), split-K 2 for scale_split_slice0, M = 128 for
    scale_map_group_size (rows past the group size). `groups` > 1 deepens the k-block to that many scale
    groups (K = 4 k-blocks: a 1 x 32 MX group under a 64-deep k-block with groups=2); `splits` > 1
    splits K; `k` sets K (a ragged K: the last k-block holds fewer groups, the last one partial)."""
    from oracle.problem.spec import Scale, Tile

    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups={groups!r}: a positive number of scale groups per k-block")
    gk = {"fp32": 16 if defect == "scale_one_per_k_block" else 32, "e8m0": 32, "e4m3": 16}[scale_dtype]
    rows_b = 32 if scale_dtype == "fp32" and gk >= 32 else 1
    bk = 32 if groups == 1 else gk * groups
    k = k if k is not None else 64 if groups == 1 else 4 * bk
    return ProblemSpec(m=128 if defect == "scale_map_group_size" else 64, n=64, k=k, a_dtype="e4m3", b_dtype="e4m3",
                       out_dtype="bf16", tile=Tile(32, 32, bk), scale_a=Scale("block", (1, gk), dtype=scale_dtype),
                       scale_b=Scale("block", (rows_b, gk), dtype=scale_dtype),
                       splits=2 if defect == "scale_split_slice0" and splits == 1 else splits)


def simulate_block_scaled(defect: Optional[str] = None, inputs: str = "scales", seed: int = 0,
                          scale_dtype: str = "fp32", groups: int = 1, splits: int = 1,
                          k: Optional[int] = None) -> Recording:
    """The model on its default problem (default_problem, with `groups` scale groups per k-block,
    `splits` splits and K = `k`), with `defect` planted (None: correct), on the input ladder `inputs`
    (default: the power-of-two scales that name a misapplied scale)."""
    from oracle.run.inputs import make_operands

    inj = ScaleInjection(defect) if defect else None
    spec = default_problem(defect, scale_dtype, groups, splits, k)
    ops = make_operands(spec, inputs, seed)
    return simulate_scaled(spec, ops, Provenance(inputs, seed), inj)

"""Where a recording's taps lie: the tile and k-block sizes, each tile's partition into partials (as
its mma taps show it, else by the declared rule), the origin of a stage's tile in its tensor, and
which elements can feed a valid output. Built once from the recording; nothing in it changes.

Masks: an element can feed a valid output if it lies inside the real extent (A rows < M, B columns
< N, accumulator and epilogue elements inside M x N: the rest is padding that feeds no valid
output). Elements past K do feed the sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

import torch

from kernels_ref._common import device_tensor
from oracle.problem.partition import (Partial, PartitionIssue, TilePartition, observed_partition, partial_of,
                                      tile_partials)
from oracle.problem.partition import max_partials as declared_max_partials
from oracle.run.recording import Recording


@dataclass(frozen=True, eq=False)
class Geometry:
    spec: Any  # oracle.problem.spec.ProblemSpec
    dev: torch.device  # the reference device: masks and tiles are made there
    bm: int
    bn: int
    bk: int
    quant: Any  # kernels_ref.dequant.DequantConfig of the quantised operand, None without one
    quant_op: Optional[str]  # the quantised operand ("a" or "b"), None without one
    partitions: Mapping[tuple[int, int], TilePartition]  # each traced tile's, as its mma taps show it
    tma_ops: frozenset  # the operands something says travel through a TMA copy (has_tma)
    stopped_short: tuple[PartitionIssue, ...] = ()  # whole tiles whose accumulator never reached K (_stopped_short)

    @classmethod
    def of(cls, rec: Recording, dev: torch.device) -> "Geometry":
        spec = rec.spec
        tma = frozenset(op for op in ("a", "b") if any(t.stage == f"descriptor_{op}" for t in rec.taps)
                        or any(d.operand == op for d in rec.descriptors))
        t = spec.tile
        return cls(spec, dev, t.bm, t.bn, t.bk, spec.dequant_config, spec.quant_op,
                   MappingProxyType(_partitions(rec)), tma, _stopped_short(rec))

    # -- partitions ----------------------------------------------------------------------------
    def partials(self, tile) -> tuple[Partial, ...]:
        """The tile's partials: as its mma taps show them, else by the declared rule."""
        p = self.partitions.get(tuple(tile))
        return p.partials if p is not None else tile_partials(self.spec, tuple(tile))

    def whole(self, tile) -> bool:
        """Is the tile accumulated in one piece (no split, its taps name no partial, or one partial)?"""
        p = self.partitions.get(tuple(tile))
        return not self.spec.partitioned or (p is not None and p.whole) or len(self.partials(tile)) == 1

    def partial(self, tile, index) -> Partial:
        """The partial a tap names (None: the one partial of a whole tile); a partial the tile's
        partition does not have holds no k-block."""
        if index is None:
            return Partial(0, 0, self.spec.k_blocks)
        found = partial_of(self.partials(tile), index)
        return found if found is not None else Partial(index, 0, 0)

    def assumed(self, tile, *, begin: Optional[int] = None, end: Optional[int] = None, at: Optional[int] = None,
                every: bool = False) -> tuple[str, ...]:
        """The partition boundaries a comparison in `tile` rests on that the declared rule placed over
        untraced k-blocks (oracle.problem.partition.AssumedBoundary), described: where partial
        `begin` begins, where partial `end` ends, which partial holds k-block `at`, or (`every`) any
        boundary of the tile. Each is an open confound of the units that rest on it."""
        p = self.partitions.get(tuple(tile))
        if p is None or not p.assumed:
            return ()
        found = p.assumed if every else \
            p.assumed_begin(begin) + p.assumed_end(end) + (p.assumed_at(at) if at is not None else ())
        return tuple(dict.fromkeys(a.describe() for a in found))

    @property
    def partition_assumptions(self) -> tuple[str, ...]:
        return tuple(a.describe() for p in self.partitions.values() for a in p.assumed)

    @property
    def partition_issues(self) -> tuple[PartitionIssue, ...]:
        return tuple(i for p in self.partitions.values() for i in p.issues) + self.stopped_short

    def max_partials(self) -> int:
        """The most partials any tile has (declared, or as tapped): what the reduction bound reads."""
        spec = self.spec
        if not spec.partitioned:
            return 1
        declared = declared_max_partials(spec)  # from the share boundaries, never by walking every tile
        return max([declared] + [len(p.partials) for p in self.partitions.values()])

    # -- tiles ---------------------------------------------------------------------------------
    def origin(self, stage: str, tile: tuple[int, int], k_block: Optional[int]) -> tuple[int, int]:
        tm, tn = tile
        if stage in ("scale_a", "scale_b"):  # (first row of A / column of B, k-block x scale groups per k-block)
            from oracle.judging.differential.scales import origin

            return origin(self.spec, stage, tile, k_block, self.bm, self.bn)
        if stage.endswith("_a"):
            return tm * self.bm, (k_block or 0) * self.bk
        if self.quant is not None and self.quant.packed and stage == f"load_{self.quant_op}":  # two k a byte
            kq = (k_block or 0) * self.bk // 2
            return (tm * self.bm, kq) if self.quant_op == "a" else (kq, tn * self.bn)
        if stage.endswith("_b"):
            return (k_block or 0) * self.bk, tn * self.bn
        return tm * self.bm, tn * self.bn

    def valid_mask(self, stage: str, tile: tuple[int, int], shape) -> torch.Tensor:
        """True where the element can feed a valid output (see module docstring)."""
        spec = self.spec
        tm, tn = tile
        rows = torch.arange(shape[0], device=self.dev)
        cols = torch.arange(shape[1], device=self.dev)
        if stage.endswith("_a"):
            return (tm * self.bm + rows < spec.m)[:, None].expand(shape)
        if stage.endswith("_b"):
            return (tn * self.bn + cols < spec.n)[None, :].expand(shape)
        return (tm * self.bm + rows < spec.m)[:, None] & (tn * self.bn + cols < spec.n)[None, :]

    def valid_units(self, stage: str, tiles, shape) -> torch.Tensor:
        """valid_mask() of many tiles at once: [len(tiles), *shape]."""
        spec = self.spec
        tt = device_tensor([list(t) for t in tiles], self.dev, torch.int64).reshape(-1, 2)
        rows = torch.arange(shape[0], device=self.dev)
        cols = torch.arange(shape[1], device=self.dev)
        r_ok = (tt[:, 0:1] * self.bm + rows[None, :] < spec.m)[:, :, None]
        c_ok = (tt[:, 1:2] * self.bn + cols[None, :] < spec.n)[:, None, :]
        full = (len(tiles),) + tuple(shape)
        if stage.endswith("_a"):
            return r_ok.expand(full)
        if stage.endswith("_b"):
            return c_ok.expand(full)
        return r_ok & c_ok

    def tile_slice(self, vec: Optional[torch.Tensor], start: int, size: int) -> Optional[torch.Tensor]:
        if vec is None:
            return None
        out = torch.zeros(size, dtype=vec.dtype, device=self.dev)
        part = vec[start:start + size]
        out[:part.numel()] = part
        return out

    def tile_of(self, full: torch.Tensor, tile) -> torch.Tensor:
        """One BM x BN tile of a full [M, N] tensor, zero past the extent."""
        r0, c0 = tile[0] * self.bm, tile[1] * self.bn
        out = torch.zeros(self.bm, self.bn, dtype=full.dtype, device=self.dev)
        part = full[r0:r0 + self.bm, c0:c0 + self.bn]
        out[:part.shape[0], :part.shape[1]] = part
        return out

    # -- operands ------------------------------------------------------------------------------
    def has_tma(self, op: str) -> bool:
        """Does anything say operand `op` travels through a TMA copy (an image tap or map fields)?"""
        return op in self.tma_ops

    def mma_stage_of(self, op: str) -> str:
        """The stage whose tap is the MMA's operand: dequant_<op> for the quantised operand, else load_<op>."""
        return f"dequant_{op}" if op == self.quant_op else f"load_{op}"

    def orient(self, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """A tile of the quantised operand turned between its own orientation and K along the rows
        (kernels_ref.dequant's): A's transposed (its own inverse), B's as it is."""
        return t.t() if t is not None and self.quant_op == "a" else t


def _partitions(rec: Recording) -> dict[tuple[int, int], TilePartition]:
    """Each traced tile's partition as its mma taps show it (oracle.problem.partition.observed_partition)."""
    spec = rec.spec
    if not spec.partitioned:
        return {}
    tapped: dict[tuple[int, int], dict] = {}
    for t in rec.taps:
        if t.stage == "mma" and t.k_block is not None:
            tapped.setdefault(t.tile, {}).setdefault(t.partial, set()).add(t.k_block)
    acc = rec.trace
    recorded = acc.selection.records_k_block if acc is not None else (lambda kb: True)
    return {tile: observed_partition(spec, tile, kbs, recorded) for tile, kbs in tapped.items()}


def _stopped_short(rec: Recording) -> tuple[PartitionIssue, ...]:
    """Whole tiles (a problem that is not split) whose mma taps stop before the last k-block while
    the trace would have recorded the k-blocks after it and lost nothing: those k-blocks were never
    accumulated (K rounded down to the tile, a loop bound off by one), a failing unit of mma at the
    first of them. Only a tile tapped at every k-block from 0 to its last tap says so: a kernel that
    taps only some k-blocks shows no trajectory that stops, and gaps are no findings; a kernel that
    stopped (an error) or a trace that lost records says nothing here."""
    spec, acc = rec.spec, rec.trace
    if spec.partitioned or acc is None or acc.dropped or acc.torn or rec.kernel_error:
        return ()
    last = spec.k_blocks - 1
    if not acc.selection.records_k_block(last):
        return ()
    tapped: dict[tuple, set] = {}
    for t in rec.taps:
        if t.stage == "mma" and t.k_block is not None and t.partial is None:
            tapped.setdefault((t.group, tuple(t.tile)), set()).add(t.k_block)
    out = []
    for (group, tile), kbs in sorted(tapped.items(), key=lambda kv: (-1 if kv[0][0] is None else kv[0][0], kv[0][1])):
        kb = max(kbs)
        if kbs != set(range(kb + 1)):  # the kernel taps only some k-blocks: where it stopped is not seen
            continue
        if kb < last and acc.selection.records_k_block(kb + 1):
            never = f"k-block {kb + 1}" if kb + 1 == last else f"k-blocks {kb + 1} to {last}"
            where = f" of group {group}" if group is not None else ""
            out.append(PartitionIssue("gap", tile, None, kb + 1,
                                      f"the accumulator{where} was tapped through k-block {kb} of {last + 1} and never "
                                      f"after, though the trace recorded them: {never} never accumulated (K = "
                                      f"{spec.k} in k-blocks of {spec.tile.bk}: a loop that stops short of K, such as "
                                      f"K rounded down to the tile)"))
    return tuple(out)

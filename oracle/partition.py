"""How a partitioned problem splits each tile's k-blocks into partials, and how a grouped or
batched problem splits into its GEMMs.

- split-K (`splits` = S): every tile's k-blocks are cut into S even shares, ceil(KB / S) each
  (the last one shorter; a share left empty is no partial): partial s covers
  [s * ceil(KB / S), min(KB, (s + 1) * ceil(KB / S))).
- stream-K (`stream_k_workers` = W): the tiles' k-blocks in tile order (row-major over the tile
  grid, k-blocks in order: T = tiles x KB iterations) are dealt out evenly, worker w taking
  iterations [floor(w T / W), floor((w + 1) T / W)). The piece of a tile one worker takes is a
  partial; a tile's partials are numbered 0, 1, ... in k order (the worker that starts the tile
  has partial 0).
- otherwise a tile has one partial covering every k-block, and its taps name no partial.

Groups: group g of a grouped problem covers rows [offset_g, offset_g + M_g) of A and D and uses
B[g]; a batched problem is `batch` groups of M rows each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from oracle.problem import ProblemSpec


@dataclass(frozen=True)
class Partial:
    index: int  # 0, 1, ... in k order within the tile
    kb_begin: int
    kb_end: int  # exclusive

    def holds(self, kb: int) -> bool:
        return self.kb_begin <= kb < self.kb_end

    def describe(self) -> str:
        return f"partial {self.index} (k-blocks {self.kb_begin}-{self.kb_end - 1})"


def tile_partials(spec: ProblemSpec, tile: tuple[int, int]) -> tuple[Partial, ...]:
    """The partials of one tile, in k order."""
    kb_n = spec.k_blocks
    if spec.stream_k_workers is not None:
        t = tile[0] * spec.tiles_n + tile[1]
        w_n, total = spec.stream_k_workers, spec.tiles_m * spec.tiles_n * kb_n
        lo, hi = t * kb_n, (t + 1) * kb_n
        out = []
        first = lo * w_n // total  # the worker holding iteration lo
        for w in range(first, w_n):
            a, b = w * total // w_n, (w + 1) * total // w_n
            if a >= hi:
                break
            s, e = max(a, lo), min(b, hi)
            if s < e:
                out.append(Partial(len(out), s - lo, e - lo))
        return tuple(out)
    if spec.splits > 1:
        per = -(-kb_n // spec.splits)
        return tuple(Partial(s, s * per, min(kb_n, (s + 1) * per)) for s in range(spec.splits) if s * per < kb_n)
    return (Partial(0, 0, kb_n),)


def partial_of(partials: tuple[Partial, ...], index: Optional[int]) -> Optional[Partial]:
    return next((p for p in partials if p.index == index), None) if index is not None else None


def group_offsets(spec: ProblemSpec) -> Optional[tuple[int, ...]]:
    """Row offsets of the groups, with the total at the end (G + 1 entries); None: not grouped."""
    sizes = spec.group_sizes
    if sizes is None:
        return None
    out, acc = [0], 0
    for m in sizes:
        acc += m
        out.append(acc)
    return tuple(out)

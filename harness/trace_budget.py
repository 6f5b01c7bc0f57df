"""How many bytes a trace selection records, before the launch.

Data path: the selection (stages, tile selectors, k-blocks) x the problem's tile grid and k-block
count x the tile shape and element sizes -> the sites a kernel may tap -> two sizes: `least`, what
any encoding of one complete tap per site needs (values alone, one record head per tap), and
`estimate`, what the usual encodings need (per-thread element records with their coordinates and
heads, per-warp image chunks). The harness sizes the sink to the estimate and, when a launch still
overflows, launches once more with the size the device's cursor measured (harness.runner).

Constraints: a kernel that taps an element several times (replicated fragments) or taps fewer
stages than selected moves the real size away from the estimate; `least` assumes every selected
stage is tapped, so a selection is refused before the launch only when it cannot fit at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from harness.taps import DEQUANT_STAGES, DESCRIPTOR_STAGES, LOAD_STAGES, SCALE_STAGES
from harness.trace_format import DESCRIPTOR_BODY, HEADER_BYTES, RECORD_HEAD_BYTES, TraceSelection

_ELEMENT_OVERHEAD = 4 + 8  # a coordinate per element, and a record head shared by ~8 elements
_WARP_RECORDS = 32  # image / block records of one tap: at most one per warp of a 1024-thread CTA


@dataclass(frozen=True)
class TraceBudget:
    tiles: int  # tiles of the grid the selection records
    k_blocks: int  # k-blocks it records
    stages: tuple[str, ...]
    least: int  # bytes (header included) that one complete tap per site needs at the least
    estimate: int  # bytes (header included) the usual encodings need

    def describe(self) -> str:
        return (f"{self.tiles} tile(s) x {self.k_blocks} k-block(s) x {len(self.stages)} stage(s): "
                f"about {self.estimate / 2**20:.1f} MiB (at least {self.least / 2**20:.1f} MiB)")


def trace_budget(selection: TraceSelection, *, tiles_m: int, tiles_n: int, k_blocks: int, block_m: int,
                 block_n: int, block_k: int, itemsize: Mapping[str, int], scale_groups: int = 1) -> TraceBudget:
    """`itemsize`: bytes of one tapped element per stage (a missing stage counts 4); `scale_groups`:
    the scale groups of one k-block a scale_a / scale_b tap holds per row or column."""
    n_tiles = _selected_tiles(selection, tiles_m, tiles_n)
    n_kb = _selected_k_blocks(selection, k_blocks)
    least = estimate = HEADER_BYTES
    for stage in selection.stages:
        size = itemsize.get(stage, 4)
        if stage in DESCRIPTOR_STAGES:
            rows = block_m if stage.endswith("_a") else block_n
            n = rows * block_k * size
            site_least, site_est = n + RECORD_HEAD_BYTES + 16, n + _WARP_RECORDS * (RECORD_HEAD_BYTES + 24)
            site_est += RECORD_HEAD_BYTES + DESCRIPTOR_BODY.size  # a tapped descriptor
        else:
            shape = {"load_a": (block_m, block_k), "load_b": (block_k, block_n), "dequant_a": (block_m, block_k),
                     "dequant_b": (block_k, block_n), "scale_a": (block_m, scale_groups),
                     "scale_b": (block_n, scale_groups)}.get(stage, (block_m, block_n))
            n = shape[0] * shape[1]
            site_least, site_est = n * size + RECORD_HEAD_BYTES + 8, n * (size + _ELEMENT_OVERHEAD)
        sites = n_tiles * (n_kb if stage in DESCRIPTOR_STAGES + LOAD_STAGES + DEQUANT_STAGES + SCALE_STAGES + ("mma",)
                           else 1)
        least += sites * site_least
        estimate += sites * site_est
    return TraceBudget(n_tiles, n_kb, tuple(selection.stages), least, estimate)


def _selected_tiles(selection: TraceSelection, tiles_m: int, tiles_n: int) -> int:
    """Tiles of a tiles_m x tiles_n grid matched by any selector, counted without enumerating the grid."""
    if selection.tiles is None or any(tm < 0 and tn < 0 for tm, tn in selection.tiles):
        return tiles_m * tiles_n
    whole_rows = {tm for tm, tn in selection.tiles if tn < 0 and tm < tiles_m}
    whole_cols = {tn for tm, tn in selection.tiles if tm < 0 and tn < tiles_n}
    exact = {(tm, tn) for tm, tn in selection.tiles if 0 <= tm < tiles_m and 0 <= tn < tiles_n}
    n = len(whole_rows) * tiles_n + len(whole_cols) * tiles_m - len(whole_rows) * len(whole_cols)
    return n + sum(1 for tm, tn in exact if tm not in whole_rows and tn not in whole_cols)


def _selected_k_blocks(selection: TraceSelection, k_blocks: int) -> int:
    return k_blocks if selection.k_blocks is None else sum(1 for kb in selection.k_blocks if kb < k_blocks)


def attention_trace_budget(selection: TraceSelection, *, batch: int, q_blocks: int, heads_q: int, kv_blocks: int,
                           splits: int, block_q: int, block_kv: int, head_dim: int, head_dim_v: int,
                           itemsize: Mapping[str, int]) -> TraceBudget:
    """The budget of an attention trace: a tile is (query block, query head), matched in every batch
    entry the selection's groups name (all without); the KV stages are tapped once per KV block, normalize once per split and combine once
    (docs/trace-format.md, "Attention sites"). `itemsize` as for trace_budget."""
    entries = batch if selection.groups is None else sum(1 for g in selection.groups if g < batch)
    n_tiles = entries * _selected_tiles(selection, q_blocks, heads_q)
    n_kb = _selected_k_blocks(selection, kv_blocks)
    shapes = {"load_q": (block_q, head_dim), "load_k": (block_kv, head_dim), "load_v": (block_kv, head_dim_v),
              "s": (block_q, block_kv), "mask": (block_q, block_kv), "p": (block_q, block_kv),
              "softmax_state": (block_q, 3), "o": (block_q, head_dim_v), "normalize": (block_q, head_dim_v + 1),
              "combine": (block_q, head_dim_v + 1)}
    per_unit = {"load_q": 1, "normalize": splits, "combine": 1}
    least = estimate = HEADER_BYTES
    for stage in selection.stages:
        rows, cols = shapes.get(stage, (block_q, block_kv))
        n, size = rows * cols, itemsize.get(stage, 4)
        sites = n_tiles * per_unit.get(stage, n_kb)
        least += sites * (n * size + RECORD_HEAD_BYTES + 8)
        estimate += sites * n * (size + _ELEMENT_OVERHEAD)
    return TraceBudget(n_tiles, n_kb, tuple(selection.stages), least, estimate)

"""The launch plan of the one pass: its launch shape (`FastConfig`, the default and the candidates
the benchmark tries) and how a shape and a tile shape become strips and programs (`_Plan`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_PROGRAMS_PER_TILE = 2048  # bounds the partial rows of a big tile (enough programs to fill a GPU)


@dataclass(frozen=True)
class FastConfig:
    """Launch shape of the fast pass: `rows_per_program` rows of one tile (and up to 256 of its
    columns) per program, `block_m` rows per loop step (up to 128 columns a step)."""
    rows_per_program: int = 128
    block_m: int = 16
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        for name in ("rows_per_program", "block_m", "num_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0 or v & (v - 1):
                raise ValueError(f"FastConfig.{name} = {v!r}: expected a positive power of two")
        if self.block_m > self.rows_per_program:
            raise ValueError(f"FastConfig.block_m = {self.block_m} exceeds rows_per_program = "
                             f"{self.rows_per_program}: expected block_m <= rows_per_program")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 4:
            raise ValueError(f"FastConfig.num_stages = {self.num_stages!r}: expected 1..4")


DEFAULT_CONFIG = FastConfig(128, 16, 4)
# Candidates the benchmark tries (the fastest is chosen in the run that measures it).
CANDIDATE_CONFIGS = (
    FastConfig(128, 8, 4), FastConfig(128, 16, 4), FastConfig(64, 16, 4), FastConfig(64, 8, 4),
    FastConfig(128, 32, 4), FastConfig(128, 8, 2), FastConfig(32, 32, 4), FastConfig(64, 32, 8),
    FastConfig(128, 32, 8), FastConfig(64, 64, 8), FastConfig(128, 16, 4, 3), FastConfig(32, 16, 2),
    FastConfig(128, 64, 16),
)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class _Plan:
    th: int
    tw: int
    tiles_h: int
    tiles_w: int
    pm: int
    pn: int
    bm: int
    bn: int
    nsub_m: int
    nsub_n: int
    even: bool

    @functools.cached_property
    def strips(self) -> int:  # per tile
        return self.nsub_m * self.nsub_n

    @functools.cached_property
    def per_tile(self) -> int:  # programs per tile: each takes strips k, k + per_tile, ...
        return min(self.strips, MAX_PROGRAMS_PER_TILE)

    @functools.cached_property
    def programs(self) -> int:
        return self.tiles_h * self.tiles_w * self.per_tile


@functools.lru_cache(maxsize=256)
def _plan(h: int, w: int, tile_shape, cfg: FastConfig, bytes_per_element: int = 4) -> _Plan:
    """The plan of a shape (one per argument set: plans are cached)."""
    th, tw = tile_shape or (h, w)
    th, tw = max(int(th), 1), max(int(tw), 1)
    tiles_h, tiles_w = -(-h // th), -(-w // tw)
    pn = tw if tw <= 256 else 256
    bn = min(_next_pow2(pn), 128)
    widen = max(1, 128 // bn)  # narrow tiles: more rows per step and per program
    pm = min(th, cfg.rows_per_program * widen)
    # block_m is sized for two 2-byte operands; wider data (a bound tensor, float32) takes fewer rows
    narrow = 1 << max(0, (max(4, bytes_per_element) // 4).bit_length() - 1)
    bm = min(max(1, cfg.block_m * widen // narrow), _next_pow2(pm))
    nsub_m, nsub_n = -(-th // pm), -(-tw // pn)
    even = h % th == 0 and w % tw == 0 and th % pm == 0 and tw % pn == 0 and pm % bm == 0 and pn % bn == 0
    return _Plan(th, tw, tiles_h, tiles_w, pm, pn, bm, bn, nsub_m, nsub_n, even)

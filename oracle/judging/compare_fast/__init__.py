"""One-pass per-tile comparison: the same `Comparison` as `oracle.judging.compare.compare_reference`, from a
single read of the data, with extra memory O(number of tiles).

Data path:
  1. fast pass   `_fast_kernel`: one Triton program per strip (`rows_per_program` rows of one tile)
                 reads received, expected, and the bound and the mask when given, once, computes in
                 float32 and writes one row of partial statistics (counts, maxima, sums). The
                 per-element bound is a tensor, or `atol + rtol * |expected|` computed inline (no
                 bound tensor is read; `inline_bound` gives the same tensor), or none (bit-exact: bit
                 patterns compared, NaN matches NaN, -0 differs from +0).
  2. float64     a program keeps its float32 row only when the pass vouches for it: every element
     pass        within its bound, every difference r - e exact in float32, everything finite. It
                 marks its strip otherwise, and `_general_kernel` (a few persistent programs that
                 scan the marks) redoes the marked strips in float64, element by element the way the
                 reference computes, and locates each strip's first bad element.
  3. fold        a few torch operations fold the rows of each tile into one, in float64.
  4. summary     one small kernel writes what the host reads (counts, the worst and first
                 non-finite tiles, the first failing tiles and their rows) into one buffer of
                 page-locked host memory: the call's only synchronisation when nothing fails.
  5. details     only failing tiles (up to `max_detail_tiles`) get a second look: their first bad
                 elements, in bounded chunks of rows from the first bad one.
So counts, max_abs_err, NaN/Inf counts, `trivial` and the first bad elements are identical to the
reference; sums (rel_l2, cosine, amplification) differ only by summation order; max_ratio and
max_rel_err of tiles the fast pass vouches for are float32 quotients (within 2^-21 relative on the
GPU, correctly rounded float32 under the interpreter).

Exact differences: a value of a type with P significant bits is a multiple of its ulp > |x| 2^-P, so
r - e is a float32 number when |r - e| <= 2^(23-P) min(|r|, |e|) (P = 24 for float32: TwoSum checks
those instead). Such a check runs per element for bound tensors. With rtol/atol it does not: an
inexact difference within the bound needs min(|r|, |e|) tiny, so |r - e| <= t0 ~ atol / (1 - rtol);
the largest difference of a strip that exceeds t0 is therefore exact, and a strip whose largest
difference does not goes to the float64 pass. The float64 pass also takes what float32 would get
wrong: sums of squares that overflow or underflow, nonzero differences under bounds below 2^-100,
maxima of quotients below 2^-26 (the GPU's fast division flushes differences below 2^-126).

Constraints: 2-D tensors of one shape; dtypes float32, float16, bfloat16, every 1-byte float8,
float64, bool and integers (float64 and 32/64-bit integers take the float64 pass only); a bound
tensor of a float dtype and a bool mask, each broadcastable to the shape.

The package, one job a module:
  kinds     the codes the kernels branch on, each dtype's element kind, what the pass accepts
            (`check_supported`) and the bound rtol/atol stand for (`inline_bound`)
  plan      the launch shape (`FastConfig`) and the plan of strips and programs per tile
  kernels   the @triton.jit device code: the fast pass, the float64 pass, their two kernels
  stats     what a pass leaves: the columns of a row of partial statistics and `TileStats`
  fold      the host-side fold: partial rows into one row per tile, a row into a tile's metrics
  launch    `tile_stats`: validate, plan, launch both kernels, fold
  summary   `summarize`: the folded rows into the one buffer the host reads (one kernel)
  results   `compare_fast`: TileStats into a Comparison, and the second look at failing tiles
The package imports oracle.judging.comparison (the types it returns), never oracle.judging.compare. The names
below are re-exported copies: a constant is patched in the module that defines it.
"""

from oracle.judging.compare_fast.kinds import (B_EXACT, B_INLINE, B_TENSOR, K_BF16, K_F16, K_F32, K_F64, K_INT, K_LUT,
                                       K_WIDE_INT, SUB_ALWAYS, SUB_SCALED, SUB_TWOSUM, check_supported,
                                       inline_bound)
from oracle.judging.compare_fast.launch import tile_stats
from oracle.judging.compare_fast.plan import CANDIDATE_CONFIGS, DEFAULT_CONFIG, MAX_PROGRAMS_PER_TILE, FastConfig
from oracle.judging.compare_fast.results import compare_fast
from oracle.judging.compare_fast.stats import (NSTAT, S_BAD, S_COMPARED, S_D2, S_DOT, S_E2, S_FIRST_BAD, S_GENERAL,
                                       S_INF_E, S_INF_R, S_INFO, S_MAX_ABS, S_MAX_RATIO, S_MAX_REL, S_NAN_E,
                                       S_NAN_R, S_R2, S_RATIO_NAN, S_SUM_E, S_SUM_R, TileStats)

__all__ = [
    "compare_fast", "tile_stats", "check_supported", "inline_bound", "TileStats", "FastConfig",
    "DEFAULT_CONFIG", "CANDIDATE_CONFIGS", "MAX_PROGRAMS_PER_TILE", "NSTAT",
    "S_COMPARED", "S_BAD", "S_NAN_R", "S_NAN_E", "S_INF_R", "S_INF_E", "S_INFO", "S_MAX_ABS", "S_MAX_REL",
    "S_MAX_RATIO", "S_RATIO_NAN", "S_D2", "S_E2", "S_R2", "S_DOT", "S_SUM_R", "S_SUM_E", "S_FIRST_BAD",
    "S_GENERAL",
    "K_F32", "K_F16", "K_BF16", "K_LUT", "K_INT", "K_F64", "K_WIDE_INT", "B_EXACT", "B_INLINE", "B_TENSOR",
    "SUB_ALWAYS", "SUB_SCALED", "SUB_TWOSUM",
]

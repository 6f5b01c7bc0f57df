"""Stage taps: what a kernel recorded about one stage of one tile.

A tap holds the OUTPUT of a stage as the kernel saw it:

| stage                | values                                   | shape                |
|----------------------|------------------------------------------|----------------------|
| descriptor_a / _b    | shared-memory byte image of one k-block  | 1-D uint8 [nbytes]   |
| load_a               | A tile as the MMA reads it, logical (m,k)| [BM, BK] operand dtype|
|                      | a packed 4-bit A: its bytes as the dequantiser reads them | [BM, BK/2] uint8 |
| load_b               | B tile as the MMA reads it, logical (k,n)| [BK, BN] operand dtype|
|                      | a packed 4-bit B: its bytes as the dequantiser reads them | [BK/2, BN] uint8 |
| dequant_a / _b       | the dequantised tile the MMA reads, logical (m,k) / (k,n) | [BM, BK] / [BK, BN] MMA operand dtype |
| scale_a / scale_b    | the block scales the k-block applied: per row of A's tile / column of B's, one column per scale group of the k-block (BK / gk groups narrower than BK, else 1) | [BM, S] / [BN, S] fp32 |
| mma                  | accumulator after k-block `k_block` (of its `partial`, for a split tile) | [BM, BN] acc dtype |
| reduce               | a split tile's partials summed: the accumulator the epilogue reads | [BM, BN] acc dtype |
| epilogue_<step>      | tile after that epilogue sub-step        | [BM, BN]             |

The epilogue's steps and their order are the problem's (`[problem] epilogue`, a graph of
kernels_ref.epilogue_graph): each declared step is the stage `epilogue_<step>`. STAGES holds the
default order; a graph that splits alpha from beta * C adds the stages epilogue_alpha and
epilogue_beta_c (SPLIT_EPILOGUE_STAGES), and `pipeline` gives the stages of any declared order.

A quantised operand (oracle.problem.spec: b_dtype int4, uint4, fp4_e2m1, int8, e4m3, e5m2 beside a
fp16/bf16 A, or a_dtype one of them beside a fp16/bf16 B) has a dequant stage between load and mma:
load_b holds the stored values (a packed 4-bit B: byte (r, n) of the tap holds k = 2r and 2r + 1
of column n, in the problem's b_packing; for k8_interleaved bytes 4w .. 4w + 3 are the word of
k = 8w .. 8w + 7, as stored), dequant_b the values (q - z) * s the MMA reads, in the MMA's operand
dtype (a_dtype); a quantised A the same along its rows: load_a byte (m, r) holds k = 2r and 2r + 1
of row m in a_packing, dequant_a is in b_dtype. `pipeline` lists a dequant stage only for a
problem that has one.

`mask` (bool, same shape) marks the elements that were actually recorded: a thread
that taps only the fragment it holds fills part of a tile. `None` means all of it.
Tile coordinates are in units of the output tile (BM, BN); k-blocks in units of BK.

Attention (a problem of kind `attention`) taps its own chain, ATTENTION_STAGES, on the same Tap:
tile = (query block, query head), k_block = the KV block, partial = the split-KV index (None when
not split), group = the batch entry. With BQ query rows and BKV keys a block, D the head dim of
Q and K and DV that of V:

| stage          | values                                                     | shape         |
|----------------|------------------------------------------------------------|---------------|
| load_q         | Q tile of the query block (no KV block)                    | [BQ, D]       |
| load_k / load_v| K / V tile of KV block `k_block`, one row per key          | [BKV, D] / [BKV, DV] |
| s              | Q K^T of the KV block, fp32                                | [BQ, BKV]     |
| mask           | the scores scaled, soft-capped and masked (-inf), fp32     | [BQ, BKV]     |
| softmax_state  | per query row after the KV block: m (running max, in the   | [BQ, 3] fp32  |
|                | scaled domain), the rescale factor of the old O, l (row sum)|              |
| p              | P as the second MMA reads it, in its operand dtype         | [BQ, BKV]     |
| o              | the O accumulator after the KV block (rescaled), fp32      | [BQ, DV]      |
| normalize      | O / l in columns 0..DV-1, the LSE (natural log) in column DV; no KV block; per split | [BQ, DV + 1] fp32 |
| combine        | the split partials merged by their LSE: O and LSE as in normalize; no KV block, no partial | [BQ, DV + 1] fp32 |

`store` (O and LSE in memory) is read from the outputs. `attention_pipeline()` gives the judged order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from harness.errors import BadInput

DESCRIPTOR_STAGES = ("descriptor_a", "descriptor_b")
LOAD_STAGES = ("load_a", "load_b")
DEQUANT_STAGES = ("dequant_a", "dequant_b")  # a quantised operand's tile after dequantisation
SCALE_STAGES = ("scale_a", "scale_b")  # the block scales a k-block of a tile applied (kernels_ref.scales)
EPILOGUE_STEPS = ("scale", "alpha_beta", "bias", "activation", "cast")
EPILOGUE_STAGES = tuple(f"epilogue_{s}" for s in EPILOGUE_STEPS) + ("epilogue_store",)
# Pipeline order: the comparator walks stages in this order (a quantised operand's dequant stage,
# DEQUANT_STAGES, goes between load and mma: `pipeline`).
STAGES = DESCRIPTOR_STAGES + LOAD_STAGES + ("mma", "reduce") + EPILOGUE_STAGES
# A declared epilogue that applies alpha and beta * C as two steps taps them as these stages.
SPLIT_EPILOGUE_STAGES = ("epilogue_alpha", "epilogue_beta_c")
_HEAD = DESCRIPTOR_STAGES + LOAD_STAGES + DEQUANT_STAGES + SCALE_STAGES + ("mma", "reduce")
# Stages a kernel can tap (epilogue_store is read from the output tensor itself).
TAP_STAGES = _HEAD + EPILOGUE_STAGES[:-1] + SPLIT_EPILOGUE_STAGES
# Every stage in one order for sorting: the dequant stages after load, the split steps beside the step they split.
ALL_STAGES = _HEAD + STAGES[STAGES.index("epilogue_scale"):STAGES.index("epilogue_alpha_beta")] \
    + ("epilogue_alpha", "epilogue_alpha_beta", "epilogue_beta_c") + STAGES[STAGES.index("epilogue_alpha_beta") + 1:]


# Attention's chain (see the module docstring), in pipeline order; `store` is read from the outputs.
ATTENTION_STAGES = ("load_q", "load_k", "load_v", "s", "mask", "softmax_state", "p", "o", "normalize", "combine",
                    "store")
ATTENTION_TAP_STAGES = ATTENTION_STAGES[:-1]
# attention stages whose tap belongs to one KV block (k_block required)
ATTENTION_KV_STAGES = ("load_k", "load_v", "s", "mask", "softmax_state", "p", "o")
SOFTMAX_STATE_COLUMNS = ("m", "rescale", "l")  # the columns of a softmax_state tap
# every stage a kernel of any problem kind can tap: what the trace format has a code for
ALL_TAP_STAGES = TAP_STAGES + ATTENTION_TAP_STAGES
# stages a tap must name a k-block (GEMM) or KV block (attention) for
K_BLOCK_STAGES = DESCRIPTOR_STAGES + LOAD_STAGES + DEQUANT_STAGES + SCALE_STAGES + ATTENTION_KV_STAGES
ALL_STAGES = ALL_STAGES + ATTENTION_STAGES


def attention_pipeline(split: bool = False) -> tuple[str, ...]:
    """Attention's stages in pipeline order; `combine` only for a split-KV problem."""
    return tuple(s for s in ATTENTION_STAGES if split or s != "combine")


def pipeline(epilogue_steps=EPILOGUE_STEPS, dequant=(), block_scaled: bool = False) -> tuple[str, ...]:
    """The stages of a problem in pipeline order, its epilogue's steps in their declared order, a
    dequant stage for each operand in `dequant` ("a", "b": the quantised ones), and the scale stages
    of a block-scaled problem."""
    head = tuple(s for s in _HEAD if (s not in DEQUANT_STAGES or s[-1] in tuple(dequant))
                 and (s not in SCALE_STAGES or block_scaled))
    return head + tuple(f"epilogue_{s}" for s in epilogue_steps) + ("epilogue_store",)


def stage_rank(stage: str) -> int:
    """A stage's place in one fixed order of every stage (for sorting; the judged order is `pipeline`)."""
    return ALL_STAGES.index(stage)


DESCRIPTOR_SOURCES = ("kernel", "host", "unknown")


class TapError(BadInput, ValueError):
    """A tap that is not self-consistent."""


def _index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass(frozen=True)
class Tap:
    stage: str
    tile: tuple[int, int]
    values: torch.Tensor
    k_block: Optional[int] = None
    slot: Optional[int] = None
    cta: Optional[int] = None
    mask: Optional[torch.Tensor] = field(default=None, compare=False)
    partial: Optional[int] = None  # the split-K / stream-K work unit of a split tile
    group: Optional[int] = None  # the batch entry or group of a batched / grouped GEMM

    def __post_init__(self) -> None:
        if self.stage not in ALL_TAP_STAGES:
            raise TapError(f"tap stage {self.stage!r} is unknown; allowed: {', '.join(ALL_TAP_STAGES)}")
        if not isinstance(self.tile, (tuple, list)) or len(self.tile) != 2 or not all(_index(t) for t in self.tile):
            raise TapError(f"tap tile {self.tile!r} must be two non-negative ints (tile_m, tile_n)")
        object.__setattr__(self, "tile", tuple(self.tile))
        if not isinstance(self.values, torch.Tensor):
            raise TapError(f"tap values for {self.stage} must be a torch.Tensor, got {type(self.values).__name__}")
        want_dim = 1 if self.stage in DESCRIPTOR_STAGES else 2
        if self.values.dim() != want_dim:
            raise TapError(
                f"tap {self.stage} tile {self.tile}: values must be {want_dim}-D, got shape {tuple(self.values.shape)}")
        if self.stage in DESCRIPTOR_STAGES and self.values.dtype != torch.uint8:
            raise TapError(f"tap {self.stage}: a shared-memory image must be uint8 bytes, got {self.values.dtype}")
        for name in ("k_block", "slot", "cta", "partial", "group"):
            v = getattr(self, name)
            if v is not None and not _index(v):
                raise TapError(f"tap {self.stage} tile {self.tile}: {name} {v!r} must be a non-negative int or None")
        if self.stage in K_BLOCK_STAGES and self.k_block is None:
            raise TapError(f"tap {self.stage} tile {self.tile}: k_block is required and must be >= 0")
        if self.mask is not None:
            if self.mask.dtype != torch.bool or tuple(self.mask.shape) != tuple(self.values.shape):
                raise TapError(
                    f"tap {self.stage} tile {self.tile}: mask must be bool with shape {tuple(self.values.shape)}, "
                    f"got {self.mask.dtype} {tuple(self.mask.shape)}")

    @property
    def key(self) -> tuple:
        """Identity of a tap within an unsplit, ungrouped run: (stage, tile, k_block)."""
        return (self.stage, self.tile, self.k_block)

    @property
    def site(self) -> tuple:
        """Identity of a tap within its group: (stage, tile, k_block, partial)."""
        return (self.stage, self.tile, self.k_block, self.partial)

    def describe(self) -> str:
        kb = "" if self.k_block is None else f" k-block {self.k_block}"
        part = "" if self.partial is None else f" partial {self.partial}"
        group = "" if self.group is None else f" group {self.group}"
        return f"{self.stage} tile {self.tile}{kb}{part}{group}"


@dataclass(frozen=True)
class DescriptorRecord:
    """The fields of a TMA tensor map as the kernel (or its host code) encoded them.

    Dimensions and strides are innermost first, as `cuTensorMapEncodeTiled` takes them;
    strides are in bytes and exclude the innermost (which is the element size).
    """

    operand: str  # "a" or "b"
    dtype: str
    global_dims: tuple[int, ...]
    global_strides: tuple[int, ...]
    box_dims: tuple[int, ...]
    element_strides: tuple[int, ...]
    swizzle: int  # bytes: 0, 32, 64 or 128
    oob_fill: str  # "zero" or "nan"
    # who made the record: "kernel" (tap_descriptor in the kernel), "host" (the harness encoded it
    # from the case: it checks the case file, not the kernel), "unknown" (an older recording)
    source: str = "kernel"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or self.source not in DESCRIPTOR_SOURCES:
            raise TapError(f"descriptor source {self.source!r} must be one of {', '.join(DESCRIPTOR_SOURCES)}")
        if not isinstance(self.operand, str) or self.operand not in ("a", "b"):
            raise TapError(f"descriptor operand {self.operand!r} must be 'a' or 'b'")
        if not isinstance(self.dtype, str) or not self.dtype:
            raise TapError(f"descriptor {self.operand}: dtype {self.dtype!r} must be a dtype name")
        # the widths of cuTensorMapEncodeTiled's arguments: any value they hold is evidence to judge
        for name, top in (("global_dims", 2**64 - 1), ("global_strides", 2**64 - 1), ("box_dims", 2**32 - 1),
                          ("element_strides", 2**32 - 1)):
            v = getattr(self, name)
            if not isinstance(v, tuple) or not all(_index(x) and x <= top for x in v):
                raise TapError(f"descriptor {self.operand}: {name} {v!r} must be a tuple of ints in 0..{top}")
        rank = len(self.global_dims)
        if not 1 <= rank <= 5:
            raise TapError(f"descriptor {self.operand}: rank {rank} must be 1..5")
        if len(self.global_strides) != rank - 1:
            raise TapError(f"descriptor {self.operand}: {len(self.global_strides)} strides for rank {rank}, "
                           f"expected {rank - 1}")
        for name in ("box_dims", "element_strides"):
            if len(getattr(self, name)) != rank:
                raise TapError(f"descriptor {self.operand}: {name} has {len(getattr(self, name))} entries "
                               f"for rank {rank}")
        if not _index(self.swizzle) or self.swizzle not in (0, 32, 64, 128):
            raise TapError(f"descriptor {self.operand}: swizzle {self.swizzle!r} must be 0, 32, 64 or 128")
        if not isinstance(self.oob_fill, str) or self.oob_fill not in ("zero", "nan"):
            raise TapError(f"descriptor {self.operand}: oob_fill {self.oob_fill!r} must be 'zero' or 'nan'")

    @property
    def stage(self) -> str:
        return f"descriptor_{self.operand}"

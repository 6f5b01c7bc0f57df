"""Scales stage: the block scales a block-scaled GEMM applies to each k-block of a tile.

Data path: a scale tensor as stored (fp32 values; e8m0 raw bytes, 2^(b - 127), 255 NaN; e4m3 values),
logically [ceil(rows / block rows), ceil(K / block k)] of A (rows: M) or of B (rows: N) -> its float64
values (`scale_values`) -> for k-block kb of a tile, the value each row of A's tile (each column of
B's) gets for each scale group the k-block holds (`tile_scales`): [BM, S] / [BN, S], S = BK / gk
scale groups per k-block when the groups are narrower than the k-block (an OCP MX 1 x 32 block
under a 64-deep k-block: S = 2), else S = 1 (the group of the k-block's first k). Rows past the
operand's extent get 0, as a kernel that predicates its scale loads holds them. K need not be a
multiple of the k-block or of gk: the tensors hold ceil(K / gk) groups, the last one possibly
partial, and the groups of the last k-block that start at or past K do not exist (`live_groups`:
a kernel may apply anything there, its products being zero; they are not judged).

Formats (`LAYOUTS` names the common ones, `layout_of` reads them from a problem): per tensor, per
row / column (epilogue scales: no stage), 1 x 128 and 128 x 128 blocks in fp32 (DeepSeek-style fp8,
in either storage major), OCP MX (1 x 32 blocks of e8m0 exponents over e4m3 / e5m2 elements: MXFP8)
and NVFP4-style 1 x 16 blocks of e4m3 scales (the per-tensor fp32 scale of NVFP4 is the epilogue's
alpha, as cuBLASLt and TensorRT-LLM fold the two global scales into it). The element decode tables of
the MX types (e2m1, e2m3, e3m2) and of ue8m0 are here too (`decode`), exact in float64.

Constraints: scales are gathered, never computed, so the stage is bit-exact; the host spec is the
reference (a gather needs no Triton kernel). `check_supported` returns the reasons a layout cannot be
modelled, each naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from kernels_ref._reasons import refuse

SCALE_DTYPES = ("fp32", "e8m0", "e4m3")  # how a block scale tensor is stored
# MX / NV element formats: (exponent bits, mantissa bits, bias); no infinities or NaN
ELEMENT_FORMATS = {"e2m1": (2, 1, 1), "e2m3": (2, 3, 1), "e3m2": (3, 2, 3)}
MX_BLOCK = 32  # OCP MX: 32 elements along K share one e8m0 scale
NVFP4_BLOCK = 16  # NVFP4: 16 elements along K share one e4m3 scale


@dataclass(frozen=True)
class ScaleLayout:
    """One operand's block scales: `block` (rows, k) elements per scale, the scale dtype, the storage
    major of the [rows / block rows, K / block k] tensor."""

    block: tuple[int, int]
    dtype: str = "fp32"
    major: str = "row"

    def __post_init__(self) -> None:
        refuse(check_supported(self))

    @property
    def group_k(self) -> int:
        return self.block[1]


def check_supported(layout: ScaleLayout, operand: str = "a") -> list[str]:
    """Reasons a block scale layout cannot be modelled (empty: it can); each names the field."""
    f = f"scale_{operand}"
    out = []
    b = layout.block
    if not (isinstance(b, tuple) and len(b) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                          for v in b)):
        return [f"{f}.block={b!r}: two positive integers (rows, k)"]
    if layout.dtype not in SCALE_DTYPES:
        out.append(f"{f}.dtype={layout.dtype!r}: one of {', '.join(SCALE_DTYPES)}")
    if layout.major not in ("row", "col"):
        out.append(f"{f}.major={layout.major!r}: 'row' or 'col'")
    if layout.dtype == "e8m0" and b[0] != 1:
        out.append(f"{f}.block={b!r}: e8m0 (OCP MX) scales cover 1 x k blocks of one row (A) or column (B)")
    if layout.dtype == "e4m3" and b[0] != 1:
        out.append(f"{f}.block={b!r}: e4m3 (NVFP4-style) scales cover 1 x k blocks of one row (A) or column (B)")
    return out


# the layouts in use, by name (docs/scales.md)
LAYOUTS = {
    "block_1x128": ScaleLayout((1, 128)),
    "block_128x128": ScaleLayout((128, 128)),
    "block_1x128_col": ScaleLayout((1, 128), major="col"),
    "block_128x128_col": ScaleLayout((128, 128), major="col"),
    "mxfp8": ScaleLayout((1, MX_BLOCK), "e8m0"),
    "nvfp4_scales": ScaleLayout((1, NVFP4_BLOCK), "e4m3"),
}


# -- decode (host, exact) -----------------------------------------------------------------------
def element_table(fmt: str) -> torch.Tensor:
    """float64 values of every code of an MX element format (e2m1: 16 codes; e2m3, e3m2: 64)."""
    if fmt not in ELEMENT_FORMATS:
        raise ValueError(f"element format {fmt!r} is unknown; known: {', '.join(ELEMENT_FORMATS)}")
    eb, mb, bias = ELEMENT_FORMATS[fmt]
    c = torch.arange(1 << (1 + eb + mb), dtype=torch.int64)
    e, m = (c >> mb) & ((1 << eb) - 1), (c & ((1 << mb) - 1)).double()
    mag = torch.where(e == 0, m * 2.0 ** (1 - bias - mb), (1 + m / (1 << mb)) * torch.pow(2.0, (e - bias).double()))
    return torch.where((c >> (eb + mb)) & 1 == 1, -mag, mag)


def decode(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """float64 values of codes (any integer tensor) of an element format (ELEMENT_FORMATS), ue8m0
    ("e8m0": 2^(b - 127), 255 NaN) or e4m3 (the bytes of float8_e4m3fn)."""
    c = codes.to(torch.int64)
    if fmt == "e8m0":
        if bool(((c < 0) | (c > 255)).any()):
            raise ValueError("e8m0 codes are bytes 0..255")
        return torch.where(c == 255, float("nan"), torch.pow(2.0, (c - 127).double()))
    if fmt == "e4m3":
        return c.to(torch.uint8).view(torch.float8_e4m3fn).double()
    table = element_table(fmt)
    if bool(((c < 0) | (c >= table.numel())).any()):
        raise ValueError(f"{fmt} codes are 0..{table.numel() - 1}")
    return table[c]


def e8m0_codes(values: torch.Tensor) -> torch.Tensor:
    """Raw e8m0 bytes of powers of two 2^-127 .. 2^127 (ValueError for anything else)."""
    v = values.double()
    e = torch.log2(v).round()
    if not bool(((torch.pow(2.0, e) == v) & (e >= -127) & (e <= 127)).all()):
        raise ValueError("e8m0 holds the powers of two 2^-127 .. 2^127 only")
    return (e.to(torch.int64) + 127).to(torch.uint8)


def torch_dtype(scale_dtype: str) -> torch.dtype:
    """The torch dtype a scale tensor of `scale_dtype` is held in (e8m0: its raw bytes)."""
    return {"fp32": torch.float32, "e8m0": torch.uint8, "e4m3": torch.float8_e4m3fn}[scale_dtype]


def stored(values: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """A scale tensor of `scale_dtype` holding `values` exactly (ValueError where it cannot)."""
    if scale_dtype == "e8m0":
        return e8m0_codes(values)
    out = values.to(torch_dtype(scale_dtype))
    if not bool((out.double() == values.double()).all()):
        raise ValueError(f"scale values not exactly representable in {scale_dtype}")
    return out


def scale_values(scales: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """float64 values of a stored scale tensor (CPU)."""
    s = scales.detach().cpu()
    if scale_dtype == "e8m0":
        return decode(s.contiguous().view(torch.uint8), "e8m0")
    return s.double()


# -- the stage's reference (host spec) ---------------------------------------------------------
def groups_per_k_block(group_k: int, block_k: int) -> int:
    """Scale groups one k-block holds: BK / gk for groups narrower than the k-block, else 1."""
    return block_k // group_k if group_k < block_k else 1


def tile_scales(values: torch.Tensor, block_rows: int, group_k: int, tile_row0: int, tile_rows: int,
                k_block: int, block_k: int, extent: int) -> torch.Tensor:
    """float64 [tile_rows, S]: the scale of each row of a tile (rows tile_row0 .. + tile_rows of A, or
    columns of B) for each scale group of k-block `k_block`, read from the operand's scale values
    `values` [ceil(extent / block_rows), G]; rows at or past `extent` get 0, and so do the groups of
    a ragged K's last k-block that lie wholly past K (G = ceil(K / gk): they are not in the tensor)."""
    s = groups_per_k_block(group_k, block_k)
    rows = tile_row0 + torch.arange(tile_rows)
    gs = k_block * block_k // group_k + torch.arange(s)
    picked = values.double()[(rows.clamp(max=extent - 1) // block_rows)[:, None],
                             gs.clamp(max=values.shape[1] - 1)[None, :]]
    return torch.where((rows < extent)[:, None] & (gs < values.shape[1])[None, :], picked, 0.0)


def live_groups(k_block: int, group_k: int, block_k: int, k: int) -> torch.Tensor:
    """bool [S]: which scale groups of k-block `k_block` exist, those that start before K (a ragged
    K's last k-block holds fewer; a group partly past K exists and is judged)."""
    s = groups_per_k_block(group_k, block_k)
    return (k_block * block_k // group_k + torch.arange(s)) * group_k < k


def groups_of_problem(spec) -> int:
    """Scale groups per k-block of a problem (oracle.problem.spec.ProblemSpec): 1 without block scales."""
    if spec.scale_a.kind != "block":
        return 1
    return groups_per_k_block(spec.scale_a.block[1], spec.tile.bk)


def group_of(k_block: int, j: int, group_k: int, block_k: int) -> int:
    """The global scale group of column j of a k-block's scale tap."""
    return k_block * block_k // group_k + j

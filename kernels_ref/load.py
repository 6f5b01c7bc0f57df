"""Load stage: the operand tile as the MMA sees it.

Data path: (a) straight from the logical operand: x -> k-block box with out-of-bounds fill ->
logical tile (A [BM, BK] indexed (m, k), B [BK, BN] indexed (k, n)); (b) from a shared-memory
image: uint8 image -> unswizzle -> storage rows -> logical tile (the inverse of
`descriptor.operand_image`). Path (b) after `operand_image` equals path (a) bit for bit.

Constraints: pure data movement in raw bits, so results are bit-exact between Triton and host.
Tile extents may be any positive size; a "nan" fill needs a floating-point dtype. Host specs
return tensors in the operand dtype (no arithmetic is involved, so float64 adds nothing).
"""

from __future__ import annotations

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref import descriptor as D
from kernels_ref._codec import _to_storage
from kernels_ref.descriptor import _origin_box_bits, _tile_byte_offset
from kernels_ref.dtypes import DTYPES


@triton.jit
def _load_tiles_kernel(src, out, BOX):
    """Box program_id(0) of src (descriptor._origin_box_bits) into out (ptr, stride_t, stride_r,
    stride_c); BOX: descriptor.Box."""
    out_ptr, so_t, so_r, so_c = out
    t = tl.program_id(0)
    bits = _origin_box_bits(src, t, BOX)
    i = tl.arange(0, BOX.RP)[:, None]
    j = tl.arange(0, BOX.CP)[None, :]
    tl.store(out_ptr + t.to(tl.int64) * so_t + i * so_r + j * so_c, _to_storage(bits, BOX.WIDTH),
             mask=(i < BOX.TR) & (j < BOX.TC))


@triton.jit
def _tile_from_image_bits(img_ptr, TR: tl.constexpr, TC: tl.constexpr, RP: tl.constexpr, CP: tl.constexpr,
                          WIDTH: tl.constexpr, TRANSPOSED: tl.constexpr, SW: tl.constexpr, SW_MASK: tl.constexpr):
    """Bits of the logical [TR, TC] tile (in a [RP, CP] block, padding 0) read from an image."""
    i = tl.arange(0, RP)[:, None]
    j = tl.arange(0, CP)[None, :]
    in_tile = (i < TR) & (j < TC)
    bits = tl.zeros([RP, CP], tl.int32)
    for byte in tl.static_range(WIDTH):
        off = _tile_byte_offset(i, j, byte, TR, TC, WIDTH, TRANSPOSED, SW, SW_MASK)
        b = tl.load(img_ptr + off, mask=in_tile, other=0).to(tl.int32) & 0xFF
        bits = bits | (b << (8 * byte))
    return bits


@triton.jit
def _tile_from_image_kernel(img_ptr, s_img, out_ptr, so_t, so_r, so_c,
                            TR: tl.constexpr, TC: tl.constexpr, RP: tl.constexpr, CP: tl.constexpr,
                            WIDTH: tl.constexpr, TRANSPOSED: tl.constexpr, SW: tl.constexpr, SW_MASK: tl.constexpr):
    t = tl.program_id(0)
    bits = _tile_from_image_bits(img_ptr + t.to(tl.int64) * s_img, TR, TC, RP, CP, WIDTH, TRANSPOSED, SW, SW_MASK)
    i = tl.arange(0, RP)[:, None]
    j = tl.arange(0, CP)[None, :]
    tl.store(out_ptr + t.to(tl.int64) * so_t + i * so_r + j * so_c, _to_storage(bits, WIDTH),
             mask=(i < TR) & (j < TC))


def check_supported(dtype_name: str, operand: str, block_mn: int, block_k: int, oob_fill: str = "zero",
                    major: str = "row", swizzle: int = 0) -> list[str]:
    """Reasons this load cannot be modelled (empty list: supported). `major` and `swizzle` matter
    only when reading from a shared-memory image."""
    return D.check_supported(dtype_name, operand, major, block_mn, block_k, swizzle, oob_fill)


def _validate(x, operand, block_mn, block_k, oob_fill) -> str:
    C.require_tensor("x", x, 2)
    name = C.dtype_name("x", x)
    reasons = check_supported(name, operand, block_mn, block_k, oob_fill)
    if reasons:
        raise C.reasons_error(reasons)
    return name


def load_tiles(x: torch.Tensor, operand: str, pairs, block_mn: int, block_k: int,
               oob_fill: str = "zero") -> torch.Tensor:
    """Many operand tiles in one launch: [T, BM, BK] for A, [T, BK, BN] for B, in x's dtype.
    `pairs` is a list of (tile_index, k_block): tile_index is tm for A, tn for B."""
    name = _validate(x, operand, block_mn, block_k, oob_fill)
    dev, T, src, box = D.box_args(x, operand, pairs, block_mn, block_k, name, oob_fill)
    out = torch.empty((T, box.TR.value, box.TC.value), dtype=x.dtype, device=dev)
    _load_tiles_kernel[(T,)](src, C.strided(out), box, **C.launch_options(dev))
    return out


def load_tile(x: torch.Tensor, operand: str, tile_index: int, k_block: int, block_mn: int, block_k: int,
              oob_fill: str = "zero") -> torch.Tensor:
    """One operand tile: A -> [BM, BK] (m, k), B -> [BK, BN] (k, n), in x's dtype."""
    for nm, v in (("tile_index", tile_index), ("k_block", k_block)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{nm}={v!r} must be an int")
    return load_tiles(x, operand, [(tile_index, k_block)], block_mn, block_k, oob_fill)[0]


def tile_from_image(image: torch.Tensor, operand: str, major: str, block_mn: int, block_k: int,
                    dtype_name: str, swizzle: int = 0) -> torch.Tensor:
    """The logical tile the MMA reads from a shared-memory image (inverse of `operand_image`).

    image: 1-D uint8 [nbytes] -> one tile; 2-D [T, nbytes] -> [T, ...] tiles."""
    C.require_tensor("image", image, (1, 2))
    if image.dtype != torch.uint8:
        raise ValueError(f"image must be uint8 bytes, got {image.dtype}")
    reasons = D.check_supported(dtype_name, operand, major, block_mn, block_k, swizzle, "zero")
    if reasons:
        raise C.reasons_error(reasons)
    nbytes = D.image_nbytes(dtype_name, block_mn, block_k)
    if image.shape[-1] != nbytes:
        raise ValueError(f"image has {image.shape[-1]} bytes per tile; a {dtype_name} tile of block_mn={block_mn}, "
                         f"block_k={block_k} has {nbytes}")
    dev = C.check_device(("image", image))
    imgs = image.reshape(-1, nbytes).contiguous()
    tr, tc = D.tile_shape(operand, block_mn, block_k)
    dt = DTYPES[dtype_name]
    out = torch.empty((imgs.shape[0], tr, tc), dtype=dt.torch, device=dev)
    ob = C.bits_view(out)
    _tile_from_image_kernel[(imgs.shape[0],)](
        imgs.view(torch.int8), imgs.stride(0), ob, ob.stride(0), ob.stride(1), ob.stride(2),
        TR=tr, TC=tc, RP=C.pad_dim(tr, 1), CP=C.pad_dim(tc, 1), WIDTH=dt.itemsize, TRANSPOSED=major == "col",
        SW=swizzle, SW_MASK=D._SWIZZLE_MASK[swizzle], **C.launch_options(dev))
    return out[0] if image.dim() == 1 else out


# ----------------------------------------------------------------------------------------------
# host specifications
# ----------------------------------------------------------------------------------------------


def load_tile_host(x: torch.Tensor, operand: str, tile_index: int, k_block: int, block_mn: int, block_k: int,
                   oob_fill: str = "zero") -> torch.Tensor:
    """Host spec of `load_tile` (CPU tensor in x's dtype)."""
    _validate(x, operand, block_mn, block_k, oob_fill)
    n_mn, n_kb = D.tile_counts(operand, x.shape, block_mn, block_k)
    C.require_index("tile_index", tile_index, n_mn)
    C.require_index("k_block", k_block, n_kb)
    return D.box_host(x, operand, tile_index, k_block, block_mn, block_k, oob_fill)


def load_tiles_host(x: torch.Tensor, operand: str, pairs, block_mn: int, block_k: int,
                    oob_fill: str = "zero") -> torch.Tensor:
    """Host spec of `load_tiles`."""
    return torch.stack([load_tile_host(x, operand, int(ti), int(kb), block_mn, block_k, oob_fill)
                        for ti, kb in pairs])


def tile_from_image_host(image: torch.Tensor, operand: str, major: str, block_mn: int, block_k: int,
                         dtype_name: str, swizzle: int = 0) -> torch.Tensor:
    """Host spec of `tile_from_image`."""
    C.require_tensor("image", image, (1, 2))
    if image.dim() == 2:
        return torch.stack([tile_from_image_host(im, operand, major, block_mn, block_k, dtype_name, swizzle)
                            for im in image])
    reasons = D.check_supported(dtype_name, operand, major, block_mn, block_k, swizzle, "zero")
    if reasons:
        raise C.reasons_error(reasons)
    nbytes = D.image_nbytes(dtype_name, block_mn, block_k)
    if image.numel() != nbytes or image.dtype != torch.uint8:
        raise ValueError(f"image must be {nbytes} uint8 bytes, got {image.numel()} of {image.dtype}")
    outer, inner = D.storage_shape(operand, major, block_mn, block_k)
    dt = DTYPES[dtype_name]
    img = image.cpu()
    if swizzle:
        logical = D.unswizzle_host(img, swizzle)
        rows = logical.reshape(-1, outer, swizzle).permute(1, 0, 2).reshape(outer, inner * dt.itemsize)
    else:
        rows = img.reshape(outer, inner * dt.itemsize)
    stored = rows.contiguous().view(C.bits_view(torch.empty(0, dtype=dt.torch)).dtype).view(dt.torch)
    return stored if major == "row" else stored.t().contiguous()

"""Descriptor stage: what a TMA load with a correct descriptor writes into shared memory.

Data path: logical operand x (A [M, K] or B [K, N], any strides) -> box of the operand k-block
tile, out-of-bounds elements filled (zero bytes or the dtype's quiet NaN) -> tile in storage
order (`outer` rows of `inner` elements, the inner dimension contiguous) -> split into boxes of
`swizzle` bytes along the inner dimension -> each byte offset `a` stored at
`a ^ (((a >> 7) & M) << 4)` (M = 7, 3, 1 for 128, 64, 32-byte swizzle) -> 1-D uint8 image.

Storage order ("major"): A row-major = BM rows of BK, A col-major = BK rows of BM,
B row-major = BK rows of BN, B col-major = BN rows of BK.

Constraints: with swizzle S > 0 the inner extent in bytes must be a multiple of S and the image a
whole number of 1024-byte swizzle atoms; a "nan" fill needs a floating-point dtype. Tile extents
need not be powers of two. Kernels move raw bits only, so Triton and host agree bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref import _common as C
from kernels_ref._codec import _to_storage, _unsigned
from kernels_ref.dtypes import DTYPES

_SWIZZLE_MASK = {0: 0, 32: 1, 64: 3, 128: 7}


# ----------------------------------------------------------------------------------------------
# jit helpers shared with the load, mma and gemm kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _box_bits(ptr, stride_r, stride_c, row0, col0, n_rows, n_cols,
              TR: tl.constexpr, TC: tl.constexpr, RP: tl.constexpr, CP: tl.constexpr,
              WIDTH: tl.constexpr, FILL_NAN: tl.constexpr, NAN_BITS: tl.constexpr):
    """Bits of the [TR, TC] box at (row0, col0) of a [n_rows, n_cols] matrix, in a [RP, CP] block.

    Elements outside the matrix get the fill (0 or NAN_BITS); block positions past the box
    (padding up to the power-of-two block) are always 0."""
    r = tl.arange(0, RP)
    c = tl.arange(0, CP)
    gr = row0 + r
    gc = col0 + c
    in_box = (r < TR)[:, None] & (c < TC)[None, :]
    in_mat = (gr < n_rows)[:, None] & (gc < n_cols)[None, :]
    raw = tl.load(ptr + gr[:, None] * stride_r + gc[None, :] * stride_c, mask=in_box & in_mat, other=0)
    bits = _unsigned(raw, WIDTH)
    if FILL_NAN:
        bits = tl.where(in_box & (~in_mat), NAN_BITS, bits)
    return bits


@triton.jit
def _swizzle_offset(a, SW_MASK: tl.constexpr):
    """Physical byte offset of logical byte offset `a` (an involution)."""
    if SW_MASK == 0:
        return a
    else:
        return a ^ (((a >> 7) & SW_MASK) << 4)


@triton.jit
def _smem_byte_offset(outer, inner_byte, N_OUTER: tl.constexpr, INNER_BYTES: tl.constexpr,
                      SW: tl.constexpr, SW_MASK: tl.constexpr):
    """Byte offset in the image of byte `inner_byte` of storage row `outer`."""
    if SW == 0:
        a = outer * INNER_BYTES + inner_byte
    else:
        a = (inner_byte // SW) * (N_OUTER * SW) + outer * SW + inner_byte % SW
    return _swizzle_offset(a, SW_MASK)


@triton.jit
def _tile_byte_offset(i, j, byte, TR: tl.constexpr, TC: tl.constexpr, WIDTH: tl.constexpr,
                      TRANSPOSED: tl.constexpr, SW: tl.constexpr, SW_MASK: tl.constexpr):
    """Byte offset in the image of byte `byte` of logical tile element (i, j) ([RP, 1] and [1, CP]
    index blocks): a transposed image stores the tile's columns as its rows."""
    if TRANSPOSED:
        return _smem_byte_offset(j + i * 0, (i + j * 0) * WIDTH + byte, TC, TR * WIDTH, SW, SW_MASK)
    else:
        return _smem_byte_offset(i + j * 0, (j + i * 0) * WIDTH + byte, TR, TC * WIDTH, SW, SW_MASK)


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _swizzle_kernel(src_ptr, dst_ptr, n, SW_MASK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = b < n
    v = tl.load(src_ptr + _swizzle_offset(b, SW_MASK), mask=m)
    tl.store(dst_ptr + b, v, mask=m)


@triton.jit
def _origin_box_bits(src, t, BOX):
    """`_box_bits` of box t of src (x_ptr, stride_r, stride_c, n_rows, n_cols, origins_ptr), whose
    origin (row0, col0) is the t-th pair at origins_ptr; BOX: Box."""
    x_ptr, sx_r, sx_c, n_rows, n_cols, org_ptr = src
    row0 = tl.load(org_ptr + 2 * t)
    col0 = tl.load(org_ptr + 2 * t + 1)
    return _box_bits(x_ptr, sx_r, sx_c, row0, col0, n_rows, n_cols, BOX.TR, BOX.TC, BOX.RP, BOX.CP, BOX.WIDTH,
                     BOX.FILL_NAN, BOX.NAN_BITS)


@triton.jit
def _operand_image_kernel(src, img, BOX, TRANSPOSED: tl.constexpr, SW: tl.constexpr, SW_MASK: tl.constexpr):
    """The image of box program_id(0) into img (ptr, stride per image)."""
    img_ptr, s_img = img
    t = tl.program_id(0)
    bits = _origin_box_bits(src, t, BOX)
    i = tl.arange(0, BOX.RP)[:, None]
    j = tl.arange(0, BOX.CP)[None, :]
    in_tile = (i < BOX.TR) & (j < BOX.TC)
    base = img_ptr + t.to(tl.int64) * s_img
    for byte in tl.static_range(BOX.WIDTH):
        off = _tile_byte_offset(i, j, byte, BOX.TR, BOX.TC, BOX.WIDTH, TRANSPOSED, SW, SW_MASK)
        tl.store(base + off, _to_storage((bits >> (8 * byte)) & 0xFF, 1), mask=in_tile)


# ----------------------------------------------------------------------------------------------
# geometry and checks
# ----------------------------------------------------------------------------------------------


class Box(NamedTuple):
    """The compile-time constants of a box read (`_box_bits`), one tuple argument (`BOX`): the
    logical tile [TR, TC], its power-of-two block [RP, CP], the element width in bytes, and the
    out-of-bounds fill (NaN with NAN_BITS, else zero). Each field a tl.constexpr."""

    TR: tl.constexpr
    TC: tl.constexpr
    RP: tl.constexpr
    CP: tl.constexpr
    WIDTH: tl.constexpr
    FILL_NAN: tl.constexpr
    NAN_BITS: tl.constexpr


def box_args(x: torch.Tensor, operand: str, pairs, block_mn: int, block_k: int, dtype_name: str,
             oob_fill: str) -> tuple:
    """(device, T, src, BOX) of a launch that reads the boxes of x's (tile_index, k_block) pairs
    (x already validated): src (x's bits and strides, its shape, the boxes' origins) and Box."""
    dev = C.check_device(("x", x))
    pairs_t = C.as_index_tensor("pairs", pairs, torch.device("cpu"))
    _check_pairs(x, operand, pairs_t, block_mn, block_k)
    origins = C.device_tensor([tile_origin(operand, int(ti), int(kb), block_mn, block_k)
                               for ti, kb in pairs_t.tolist()], dev, torch.int32)
    tr, tc = tile_shape(operand, block_mn, block_k)
    box = C.constexprs(Box, TR=tr, TC=tc, RP=C.pad_dim(tr, 1), CP=C.pad_dim(tc, 1), WIDTH=DTYPES[dtype_name].itemsize,
                       FILL_NAN=oob_fill == "nan", NAN_BITS=C.NAN_BITS.get(dtype_name, 0))
    return dev, pairs_t.shape[0], (*C.strided(x), x.shape[0], x.shape[1], origins), box


def tile_shape(operand: str, block_mn: int, block_k: int) -> tuple[int, int]:
    """Logical tile shape: A -> (BM, BK) (m, k); B -> (BK, BN) (k, n)."""
    return (block_mn, block_k) if operand == "a" else (block_k, block_mn)


def storage_shape(operand: str, major: str, block_mn: int, block_k: int) -> tuple[int, int]:
    """(outer, inner) extents of the tile in shared memory."""
    r, c = tile_shape(operand, block_mn, block_k)
    return (r, c) if major == "row" else (c, r)


def image_nbytes(dtype_name: str, block_mn: int, block_k: int) -> int:
    return block_mn * block_k * DTYPES[dtype_name].itemsize


def tile_origin(operand: str, tile_index: int, k_block: int, block_mn: int, block_k: int) -> tuple[int, int]:
    """(row, col) of the tile's first element in the logical operand."""
    return (tile_index * block_mn, k_block * block_k) if operand == "a" else (k_block * block_k, tile_index * block_mn)


def tile_counts(operand: str, shape: Sequence[int], block_mn: int, block_k: int) -> tuple[int, int]:
    """(number of tiles along M or N, number of k-blocks) of a logical operand shape."""
    if operand == "a":
        mn, k = shape
    else:
        k, mn = shape
    return C.cdiv(mn, block_mn), C.cdiv(k, block_k)


def check_supported(dtype_name: str, operand: str, major: str, block_mn: int, block_k: int,
                    swizzle: int = 0, oob_fill: str = "zero") -> list[str]:
    """Reasons this descriptor configuration cannot be modelled (empty list: supported)."""
    reasons = []
    if dtype_name not in DTYPES:
        reasons.append(f"dtype_name={dtype_name!r} is unknown; allowed: {', '.join(DTYPES)}")
    if operand not in C.OPERANDS:
        reasons.append(f"operand={operand!r} is not allowed; allowed: 'a', 'b'")
    if major not in C.MAJORS:
        reasons.append(f"major={major!r} is not allowed; allowed: 'row', 'col'")
    if swizzle not in C.SWIZZLES:
        reasons.append(f"swizzle={swizzle!r} is not allowed; allowed: 0, 32, 64, 128 (bytes)")
    if oob_fill not in C.OOB_FILLS:
        reasons.append(f"oob_fill={oob_fill!r} is not allowed; allowed: 'zero', 'nan'")
    for name, v in (("block_mn", block_mn), ("block_k", block_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            reasons.append(f"{name}={v!r} must be a positive int")
    if reasons:
        return reasons
    if oob_fill == "nan" and not DTYPES[dtype_name].is_float:
        reasons.append(f"oob_fill='nan' needs a floating-point dtype, got dtype_name={dtype_name!r}")
    if swizzle:
        _, inner = storage_shape(operand, major, block_mn, block_k)
        inner_bytes = inner * DTYPES[dtype_name].itemsize
        if inner_bytes % swizzle:
            reasons.append(f"swizzle={swizzle}: the inner extent ({inner} elements = {inner_bytes} bytes) must be "
                           f"a multiple of the swizzle span of {swizzle} bytes")
        nbytes = image_nbytes(dtype_name, block_mn, block_k)
        if nbytes % 1024:
            reasons.append(f"swizzle={swizzle}: the image ({nbytes} bytes) must be a multiple of the "
                           f"1024-byte swizzle atom")
    return reasons


def _check_image_len(n: int, swizzle_bytes: int) -> None:
    C.require_choice("swizzle_bytes", swizzle_bytes, C.SWIZZLES)
    if swizzle_bytes and n % 1024:
        raise ValueError(f"image length {n} must be a multiple of 1024 bytes when swizzle_bytes={swizzle_bytes} "
                         f"(the swizzle pattern repeats over 1024-byte aligned atoms)")


def _check_image(name: str, image) -> torch.Tensor:
    C.require_tensor(name, image, 1)
    if image.dtype != torch.uint8:
        raise ValueError(f"{name} must be uint8 bytes, got {image.dtype}")
    return image


def _validate_operand(x, operand, major, block_mn, block_k, swizzle, oob_fill) -> str:
    C.require_tensor("x", x, 2)
    C.require_choice("operand", operand, C.OPERANDS)
    name = C.dtype_name("x", x)
    reasons = check_supported(name, operand, major, block_mn, block_k, swizzle, oob_fill)
    if reasons:
        raise C.reasons_error(reasons)
    return name


def _check_pairs(x, operand, pairs_t: torch.Tensor, block_mn: int, block_k: int) -> None:
    n_mn, n_kb = tile_counts(operand, x.shape, block_mn, block_k)
    lo, hi = C.pair_bounds(pairs_t)
    if lo[0] < 0 or hi[0] >= n_mn:
        raise ValueError(f"tile index out of range in {pairs_t.tolist() if pairs_t.numel() <= 16 else 'pairs'}; "
                         f"allowed: 0..{n_mn - 1} for operand {operand!r} of shape {tuple(x.shape)}")
    if lo[1] < 0 or hi[1] >= n_kb:
        raise ValueError(f"k_block out of range in {pairs_t.tolist() if pairs_t.numel() <= 16 else 'pairs'}; "
                         f"allowed: 0..{n_kb - 1} for K={x.shape[1] if operand == 'a' else x.shape[0]} "
                         f"and block_k={block_k}")


# ----------------------------------------------------------------------------------------------
# public launchers
# ----------------------------------------------------------------------------------------------


def _swizzle_launch(image: torch.Tensor, swizzle_bytes: int) -> torch.Tensor:
    _check_image("image", image)
    _check_image_len(image.numel(), swizzle_bytes)
    C.check_device(("image", image))
    src = image.contiguous()
    out = torch.empty_like(src)
    n = src.numel()
    if n:
        BLOCK = 1024
        _swizzle_kernel[(C.cdiv(n, BLOCK),)](src.view(torch.int8), out.view(torch.int8), n,
                                             SW_MASK=_SWIZZLE_MASK[swizzle_bytes], BLOCK=BLOCK,
                                             **C.launch_options(src.device))
    return out


def swizzle(image: torch.Tensor, swizzle_bytes: int) -> torch.Tensor:
    """Logical (unswizzled) 1-D uint8 image -> the bytes as a swizzled TMA store lays them out."""
    return _swizzle_launch(image, swizzle_bytes)


def unswizzle(image: torch.Tensor, swizzle_bytes: int) -> torch.Tensor:
    """Swizzled 1-D uint8 shared-memory image -> logical byte order (inverse of `swizzle`)."""
    return _swizzle_launch(image, swizzle_bytes)


def operand_images(x: torch.Tensor, operand: str, major: str, pairs, block_mn: int, block_k: int,
                   swizzle: int = 0, oob_fill: str = "zero") -> torch.Tensor:
    """Shared-memory images of many operand tiles in one launch: [T, nbytes] uint8.

    `pairs` is a list of (tile_index, k_block): tile_index is tm for A, tn for B."""
    name = _validate_operand(x, operand, major, block_mn, block_k, swizzle, oob_fill)
    dev, T, src, box = box_args(x, operand, pairs, block_mn, block_k, name, oob_fill)
    out = torch.empty((T, box.TR.value * box.TC.value * box.WIDTH.value), dtype=torch.uint8, device=dev)
    _operand_image_kernel[(T,)](src, (out.view(torch.int8), out.stride(0)), box, TRANSPOSED=major == "col", SW=swizzle,
                                SW_MASK=_SWIZZLE_MASK[swizzle], **C.launch_options(dev))
    return out


def operand_image(x: torch.Tensor, operand: str, major: str, tile_index: int, k_block: int, block_mn: int,
                  block_k: int, swizzle: int = 0, oob_fill: str = "zero") -> torch.Tensor:
    """Shared-memory byte image (1-D uint8) of one operand k-block tile, as a TMA load writes it."""
    for nm, v in (("tile_index", tile_index), ("k_block", k_block)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{nm}={v!r} must be an int")
    return operand_images(x, operand, major, [(tile_index, k_block)], block_mn, block_k, swizzle, oob_fill)[0]


# ----------------------------------------------------------------------------------------------
# host specifications
# ----------------------------------------------------------------------------------------------


def _swizzle_permutation(n: int, swizzle_bytes: int) -> torch.Tensor:
    a = torch.arange(n, dtype=torch.int64)
    return a ^ (((a >> 7) & _SWIZZLE_MASK[swizzle_bytes]) << 4)


def swizzle_host(image: torch.Tensor, swizzle_bytes: int) -> torch.Tensor:
    """Host spec of `swizzle`: the byte at logical offset a lands at physical offset f(a)."""
    _check_image("image", image)
    _check_image_len(image.numel(), swizzle_bytes)
    src = image.cpu()
    out = torch.empty_like(src)
    out[_swizzle_permutation(src.numel(), swizzle_bytes)] = src
    return out


def unswizzle_host(image: torch.Tensor, swizzle_bytes: int) -> torch.Tensor:
    """Host spec of `unswizzle`: the logical byte a is read from physical offset f(a)."""
    _check_image("image", image)
    _check_image_len(image.numel(), swizzle_bytes)
    src = image.cpu()
    return src[_swizzle_permutation(src.numel(), swizzle_bytes)]


def box_host(x: torch.Tensor, operand: str, tile_index: int, k_block: int, block_mn: int, block_k: int,
             oob_fill: str = "zero") -> torch.Tensor:
    """The logical tile (A [BM, BK], B [BK, BN]) on the CPU in x's dtype, out-of-bounds filled."""
    name = C.dtype_name("x", x)
    tr, tc = tile_shape(operand, block_mn, block_k)
    r0, c0 = tile_origin(operand, tile_index, k_block, block_mn, block_k)
    fill = C.NAN_BITS[name] if oob_fill == "nan" else 0
    width = DTYPES[name].itemsize
    if width < 4 and fill >= 1 << (8 * width - 1):
        fill -= 1 << (8 * width)
    bits = torch.full((tr, tc), fill, dtype=C.bits_view(x).dtype)
    src = C.bits_view(x.detach().cpu())[r0:r0 + tr, c0:c0 + tc]
    bits[:src.shape[0], :src.shape[1]] = src
    return bits.view(x.dtype)


def operand_image_host(x: torch.Tensor, operand: str, major: str, tile_index: int, k_block: int,
                       block_mn: int, block_k: int, swizzle: int = 0, oob_fill: str = "zero") -> torch.Tensor:
    """Host spec of `operand_image`."""
    _validate_operand(x, operand, major, block_mn, block_k, swizzle, oob_fill)
    n_mn, n_kb = tile_counts(operand, x.shape, block_mn, block_k)
    C.require_index("tile_index", tile_index, n_mn)
    C.require_index("k_block", k_block, n_kb)
    tile = box_host(x, operand, tile_index, k_block, block_mn, block_k, oob_fill)
    stored = (tile if major == "row" else tile.t()).contiguous()
    outer = stored.shape[0]
    rows = C.bits_view(stored).view(torch.uint8).reshape(outer, -1)  # [outer, inner bytes]
    if swizzle == 0:
        return rows.reshape(-1).clone()
    boxes = rows.reshape(outer, -1, swizzle).permute(1, 0, 2).reshape(-1)
    return swizzle_host(boxes.contiguous(), swizzle)


def operand_images_host(x: torch.Tensor, operand: str, major: str, pairs, block_mn: int, block_k: int,
                        swizzle: int = 0, oob_fill: str = "zero") -> torch.Tensor:
    """Host spec of `operand_images`."""
    return torch.stack([operand_image_host(x, operand, major, int(ti), int(kb), block_mn, block_k, swizzle, oob_fill)
                        for ti, kb in pairs])

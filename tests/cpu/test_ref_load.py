"""Load stage: operand tiles from the operand and from shared-memory images, bit-exact against
the host spec and against plain slicing."""

import pytest
import torch

from kernels_ref import descriptor as D
from kernels_ref import load as L
from kernels_ref.dtypes import DTYPES

FLOATS = ("fp32", "fp16", "bf16", "e4m3", "e5m2")
ALL = FLOATS + ("int8",)
NAN_BITS = {"fp32": 0x7FC00000, "fp16": 0x7E00, "bf16": 0x7FC0, "e4m3": 0x7F, "e5m2": 0x7E}


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a.cpu()), _bits(b.cpu()))


def _random(name, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if name == "int8":
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    return (torch.randn(shape, generator=g) * 4).to(DTYPES[name].torch)


def _sliced(x, operand, ti, kb, bmn, bk, fill_bits):
    """The tile by plain slicing, padded with the fill: an independent statement of the stage."""
    r0, c0 = (ti * bmn, kb * bk) if operand == "a" else (kb * bk, ti * bmn)
    tr, tc = (bmn, bk) if operand == "a" else (bk, bmn)
    width = x.element_size()
    if width < 4 and fill_bits >= 1 << (8 * width - 1):
        fill_bits -= 1 << (8 * width)
    out = torch.full((tr, tc), fill_bits, dtype=_bits(x).dtype)
    part = _bits(x)[r0:r0 + tr, c0:c0 + tc]
    out[:part.shape[0], :part.shape[1]] = part
    return out.view(x.dtype)


@pytest.mark.parametrize("name", ALL)
def test_load_tile_matches_slicing_and_host(name):
    x = _random(name, (75, 99), seed=11)  # ragged for BM/BN = 32, BK = 16..64
    fills = ("zero", "nan") if name != "int8" else ("zero",)
    for operand in ("a", "b"):
        for bmn, bk in ((32, 64), (24, 40), (16, 16)):  # non-power-of-two extents included
            n_mn, n_kb = D.tile_counts(operand, x.shape, bmn, bk)
            pairs = [(0, 0), (n_mn - 1, n_kb - 1), (n_mn // 2, n_kb - 1)]
            for fill in fills:
                got = L.load_tiles(x, operand, pairs, bmn, bk, fill)
                for i, (ti, kb) in enumerate(pairs):
                    want = _sliced(x, operand, ti, kb, bmn, bk, NAN_BITS[name] if fill == "nan" else 0)
                    assert _same_bits(got[i], want), (operand, bmn, bk, ti, kb, fill)
                    assert _same_bits(L.load_tile_host(x, operand, ti, kb, bmn, bk, fill), want)
                    assert _same_bits(L.load_tile(x, operand, ti, kb, bmn, bk, fill), want)


@pytest.mark.parametrize("name", FLOATS)
def test_nan_fill_is_the_quiet_nan_pattern(name):
    x = _random(name, (20, 20), seed=2)
    t = L.load_tile(x, "b", 0, 0, 32, 32, "nan")  # B [K=20, N=20] in a 32 x 32 tile
    raw = _bits(t).to(torch.int64) & ((1 << (8 * t.element_size())) - 1)
    assert torch.all(raw[20:, :] == NAN_BITS[name]) and torch.all(raw[:, 20:] == NAN_BITS[name])
    assert torch.isnan(t.float()[20:, :]).all()
    assert _same_bits(t[:20, :20], x)


def test_transposed_view_is_honoured():
    b = _random("bf16", (96, 48), seed=4)        # B logical [K=96, N=48]
    b_colmajor = b.t().contiguous().t()          # storage [N, K]: K contiguous
    assert b_colmajor.stride() == (1, 96)
    for ti, kb in ((0, 0), (1, 2)):
        assert _same_bits(L.load_tile(b_colmajor, "b", ti, kb, 32, 32), L.load_tile(b, "b", ti, kb, 32, 32))


@pytest.mark.parametrize("name", ALL)
def test_image_round_trip_equals_direct_load(name):
    """descriptor then load (through the swizzled bytes) == the direct load, every mode."""
    x = _random(name, (70, 150), seed=6)
    checked = 0
    for operand in ("a", "b"):
        for major in ("row", "col"):
            for sw in (0, 32, 64, 128):
                for bmn, bk in ((32, 64), (64, 128)):
                    if D.check_supported(name, operand, major, bmn, bk, sw, "zero"):
                        continue
                    n_mn, n_kb = D.tile_counts(operand, x.shape, bmn, bk)
                    pairs = [(n_mn - 1, n_kb - 1), (0, 0)]
                    fill = "nan" if name != "int8" else "zero"
                    imgs = D.operand_images(x, operand, major, pairs, bmn, bk, sw, fill)
                    tiles = L.tile_from_image(imgs, operand, major, bmn, bk, name, sw)
                    host = L.tile_from_image_host(imgs, operand, major, bmn, bk, name, sw)
                    direct = L.load_tiles(x, operand, pairs, bmn, bk, fill)
                    assert _same_bits(tiles, direct), (operand, major, sw, bmn, bk)
                    assert _same_bits(host, direct), (operand, major, sw, bmn, bk)
                    assert _same_bits(L.tile_from_image(imgs[1], operand, major, bmn, bk, name, sw), direct[1])
                    checked += 1
    assert checked >= 8


def test_tile_from_image_reads_a_foreign_image():
    """A random byte image (not produced by operand_image) decodes identically in Triton and host."""
    img = torch.randint(0, 256, (2, 64 * 64 * 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(8))
    for operand, major, sw in (("a", "row", 128), ("b", "col", 64), ("b", "row", 0)):
        t = L.tile_from_image(img, operand, major, 64, 64, "fp16", sw)
        h = L.tile_from_image_host(img, operand, major, 64, 64, "fp16", sw)
        assert _same_bits(t, h)
    # a wrong swizzle mode reads different data: the stage can tell them apart
    a = L.tile_from_image(img[0], "a", "row", 64, 64, "fp16", 128)
    b = L.tile_from_image(img[0], "a", "row", 64, 64, "fp16", 64)
    assert not _same_bits(a, b)


def test_errors_name_the_argument():
    x = _random("fp16", (64, 64), seed=0)
    with pytest.raises(ValueError, match="operand"):
        L.load_tile(x, "c", 0, 0, 32, 32)
    with pytest.raises(ValueError, match="oob_fill"):
        L.load_tile(x, "a", 0, 0, 32, 32, "inf")
    with pytest.raises(ValueError, match="block_k"):
        L.load_tile(x, "a", 0, 0, 32, 0)
    with pytest.raises(ValueError, match="k_block out of range"):
        L.load_tile(x, "a", 0, 2, 32, 32)
    with pytest.raises(ValueError, match="pairs"):
        L.load_tiles(x, "a", [(0, 0, 0)], 32, 32)
    with pytest.raises(ValueError, match="bytes per tile"):
        L.tile_from_image(torch.zeros(100, dtype=torch.uint8), "a", "row", 32, 32, "fp16", 0)
    with pytest.raises(ValueError, match="dtype_name"):
        L.tile_from_image(torch.zeros(2048, dtype=torch.uint8), "a", "row", 32, 32, "fp64", 0)
    with pytest.raises(ValueError, match="has dtype"):
        L.load_tile(x.double(), "a", 0, 0, 32, 32)

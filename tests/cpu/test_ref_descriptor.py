"""Descriptor stage: swizzle and shared-memory images, Triton (interpreter) against the host spec
and against the swizzle rule written out independently here. Everything is bit-exact."""

import pytest
import torch

from kernels_ref import descriptor as D
from kernels_ref.dtypes import DTYPES

FLOATS = ("fp32", "fp16", "bf16", "e4m3", "e5m2")
ALL = FLOATS + ("int8",)
MASK = {32: 1, 64: 3, 128: 7}


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _random(name, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if name == "int8":
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    return (torch.randn(shape, generator=g) * 4).to(DTYPES[name].torch)


def _index_encoded(shape, dtype):
    """Each element's raw bits say where it came from (row * cols + col, wrapped to the width)."""
    r, c = shape
    idx = torch.arange(r * c, dtype=torch.int64).reshape(r, c)
    width = DTYPES[dtype].itemsize
    if width == 1:
        raw = (idx % 251 + 1).to(torch.uint8)
        raw = torch.where(raw == 0x7F, torch.full_like(raw, 3), raw)  # keep away from e4m3 NaN
    elif width == 2:
        raw = (idx % 30000 + 1).to(torch.int16)
    else:
        raw = (idx + 1).to(torch.int32)
    return raw.view(DTYPES[dtype].torch)


# ---------------------------------------------------------------------------------------------
# swizzle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sw", [32, 64, 128])
def test_swizzle_matches_the_rule(sw):
    img = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(sw))
    # The rule: the byte at logical offset a is stored at a ^ (((a >> 7) & M) << 4).
    want = torch.empty_like(img)
    for a in range(img.numel()):
        want[a ^ (((a >> 7) & MASK[sw]) << 4)] = img[a]
    assert torch.equal(D.swizzle_host(img, sw), want)
    assert torch.equal(D.swizzle(img, sw), want)
    assert not torch.equal(want, img)  # the permutation really moves bytes


@pytest.mark.parametrize("sw", [0, 32, 64, 128])
def test_swizzle_round_trip(sw):
    img = torch.randint(0, 256, (2048,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(D.unswizzle(D.swizzle(img, sw), sw), img)
    assert torch.equal(D.unswizzle_host(D.swizzle_host(img, sw), sw), img)
    assert torch.equal(D.unswizzle(img, sw), D.unswizzle_host(img, sw))


def test_swizzle_zero_is_identity_for_any_length():
    img = torch.arange(1000, dtype=torch.int64).to(torch.uint8)
    assert torch.equal(D.swizzle(img, 0), img)


def test_swizzle_length_rule():
    img = torch.zeros(1000, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multiple of 1024"):
        D.swizzle(img, 128)
    with pytest.raises(ValueError, match="multiple of 1024"):
        D.unswizzle_host(img, 64)
    with pytest.raises(ValueError, match="swizzle_bytes"):
        D.swizzle(torch.zeros(1024, dtype=torch.uint8), 16)
    with pytest.raises(ValueError, match="uint8"):
        D.swizzle(torch.zeros(1024, dtype=torch.int16), 32)


# ---------------------------------------------------------------------------------------------
# operand images
# ---------------------------------------------------------------------------------------------


def _configs(name):
    """(block_mn, block_k, swizzle) triples that are supported for this dtype."""
    out = []
    for bmn, bk in ((32, 64), (16, 128), (64, 32)):
        for sw in (0, 32, 64, 128):
            out.append((bmn, bk, sw))
    return out


@pytest.mark.parametrize("name", ALL)
def test_operand_image_triton_matches_host(name):
    # Ragged on every side: M=70, K=90 for A; K=70, N=90 for B. Tiles on the ragged edge.
    x = _random(name, (70, 90), seed=1)
    fills = ("zero", "nan") if name != "int8" else ("zero",)
    checked = 0
    for operand in ("a", "b"):
        for major in ("row", "col"):
            for bmn, bk, sw in _configs(name):
                if D.check_supported(name, operand, major, bmn, bk, sw, "zero"):
                    continue
                n_mn, n_kb = D.tile_counts(operand, x.shape, bmn, bk)
                pairs = [(0, 0), (n_mn - 1, n_kb - 1)]
                for fill in fills:
                    got = D.operand_images(x, operand, major, pairs, bmn, bk, sw, fill)
                    want = D.operand_images_host(x, operand, major, pairs, bmn, bk, sw, fill)
                    assert got.dtype == torch.uint8 and got.shape == want.shape
                    assert torch.equal(got, want), (operand, major, bmn, bk, sw, fill)
                    checked += 1
    assert checked >= 12


@pytest.mark.parametrize("name,operand,major,sw", [
    ("bf16", "a", "row", 128), ("bf16", "a", "col", 64), ("fp16", "b", "row", 32), ("fp16", "b", "col", 128),
    ("e4m3", "a", "row", 64), ("e5m2", "b", "col", 64), ("fp32", "a", "col", 128), ("fp32", "b", "row", 0),
])
def test_operand_image_places_every_element_by_the_rule(name, operand, major, sw):
    """Index-encoded operand: every element's bytes must sit where the TMA rule puts them."""
    bmn, bk = 32, 64
    shape = (64, 128) if operand == "a" else (128, 64)
    x = _index_encoded(shape, name)
    ti, kb = 1, 1
    img = D.operand_image(x, operand, major, ti, kb, bmn, bk, sw)
    width = DTYPES[name].itemsize
    tile = x[ti * bmn:(ti + 1) * bmn, kb * bk:(kb + 1) * bk] if operand == "a" else \
        x[kb * bk:(kb + 1) * bk, ti * bmn:(ti + 1) * bmn]
    stored = tile if major == "row" else tile.t()
    outer, inner = stored.shape
    raw = _bits(stored.contiguous()).to(torch.int64) & ((1 << (8 * width)) - 1)
    for o in range(outer):
        for i in range(0, inner, 3):  # a third of the columns keeps the interpreter-free loop short
            for byte in range(width):
                ib = i * width + byte
                if sw:
                    a = (ib // sw) * (outer * sw) + o * sw + ib % sw
                    p = a ^ (((a >> 7) & MASK[sw]) << 4)
                else:
                    p = o * inner * width + ib
                assert int(img[p]) == (int(raw[o, i]) >> (8 * byte)) & 0xFF, (o, i, byte)


@pytest.mark.parametrize("name", FLOATS)
def test_oob_nan_fill_bytes(name):
    x = _random(name, (40, 50), seed=3)  # A [M=40, K=50]; tile (1, 0) with BM=32 covers rows 32..63
    img = D.operand_image(x, "a", "row", 1, 1, 32, 32, 0, "nan")  # k 32..63: ragged in both m and k
    width = DTYPES[name].itemsize
    tile = img.reshape(32, 32, width)
    nan_bytes = torch.tensor([(D.C.NAN_BITS[name] >> (8 * b)) & 0xFF for b in range(width)], dtype=torch.uint8)
    for r in range(32):
        for c in range(32):
            inside = 32 + r < 40 and 32 + c < 50
            if inside:
                want = _bits(x[32 + r, 32 + c].reshape(1)).view(torch.uint8)
            else:
                want = nan_bytes
            assert torch.equal(tile[r, c], want), (r, c)
    zero = D.operand_image(x, "a", "row", 1, 1, 32, 32, 0, "zero").reshape(32, 32, width)
    assert int(zero[10, 20].abs().sum()) == 0 and int(zero[7, 18].sum()) == 0  # (42, 52) and (39, 50) lie outside
    assert torch.equal(zero[:8, :18], tile[:8, :18])


def test_strided_operand_is_read_logically():
    x = _random("bf16", (96, 80), seed=5)
    col_major = x.t().contiguous().t()  # same logical values, M contiguous in memory
    for sw in (0, 128):
        a = D.operand_image(x, "a", "col", 1, 0, 64, 64, sw)
        b = D.operand_image(col_major, "a", "col", 1, 0, 64, 64, sw)
        assert torch.equal(a, b)
        assert torch.equal(b, D.operand_image_host(col_major, "a", "col", 1, 0, 64, 64, sw))


def test_batched_images_equal_single_images():
    x = _random("e4m3", (100, 200), seed=9)
    pairs = [(0, 0), (1, 2), (3, 1), (3, 3)]
    many = D.operand_images(x, "a", "row", pairs, 32, 64, 64, "nan")
    for i, (ti, kb) in enumerate(pairs):
        assert torch.equal(many[i], D.operand_image(x, "a", "row", ti, kb, 32, 64, 64, "nan"))


def test_check_supported_reasons_and_errors():
    assert D.check_supported("bf16", "a", "row", 128, 64, 128, "zero") == []
    r = D.check_supported("bf16", "a", "row", 128, 32, 128, "zero")  # 64-byte rows under a 128-byte swizzle
    assert len(r) == 1 and "multiple of the swizzle span" in r[0]
    r = D.check_supported("int8", "b", "col", 64, 64, 0, "nan")
    assert len(r) == 1 and "floating-point" in r[0]
    r = D.check_supported("fp4", "c", "diag", 0, 64, 48, "ones")
    assert len(r) == 6
    x = _random("fp16", (64, 64), seed=0)
    with pytest.raises(ValueError, match="swizzle span"):
        D.operand_image(x, "a", "row", 0, 0, 64, 32, 128)
    with pytest.raises(ValueError, match="oob_fill"):
        D.operand_image(x, "a", "row", 0, 0, 64, 64, 0, "ones")
    with pytest.raises(ValueError, match="tile index out of range"):
        D.operand_image(x, "a", "row", 1, 0, 64, 64, 0)
    with pytest.raises(ValueError, match="k_block out of range"):
        D.operand_image(x, "b", "row", 0, 2, 64, 32, 0)
    with pytest.raises(ValueError, match="int8"):
        D.operand_image(torch.zeros(64, 64, dtype=torch.int8), "a", "row", 0, 0, 64, 64, 0, "nan")
    with pytest.raises(ValueError, match="1024-byte"):
        D.operand_image(x, "a", "row", 0, 0, 8, 32, 64)  # 512-byte image

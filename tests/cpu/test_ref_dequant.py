"""kernels_ref.dequant: the Triton stage against its float64 host spec, the packing's nibble order,
the decoders, and the tolerance table's dequant entry."""

from __future__ import annotations

import pytest
import torch

from kernels_ref import dequant as dq
from kernels_ref.dtypes import ALL_TYPES
from kernels_ref.scales import e8m0_codes
from oracle.judging import hardware_numerics, tolerance

CONFIGS = [
    ("int4", "fp16", "fp16", "int", "fp32", "k_pairs_low_first"),
    ("int4", "bf16", "bf16", "float", "operand", "k_pairs_high_first"),
    ("uint4", "fp32", "fp16", "float", "fp32", "k_pairs_low_first"),
    ("uint4", "fp16", "fp16", "int", "operand", "k_pairs_high_first"),
    ("fp4_e2m1", "e8m0", "bf16", "none", "fp32", "k_pairs_low_first"),
    ("fp4_e2m1", "e4m3", "fp16", "none", "operand", "k_pairs_high_first"),
    ("int8", "fp32", "fp16", "int", "operand", None),
    ("e4m3", "fp16", "bf16", "none", "fp32", None),
    ("e5m2", "bf16", "bf16", "none", "operand", None),
    ("int4", "fp16", "fp16", "int", "fp32", "k8_interleaved"),
    ("uint4", "bf16", "bf16", "float", "operand", "k8_interleaved"),
    ("fp4_e2m1", "e8m0", "fp16", "none", "fp32", "k8_interleaved"),
]


def _inputs(cfg: dq.DequantConfig, k: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16 if cfg.packed else 256, (k, n), generator=g)
    if cfg.dtype == "e4m3":
        codes[(codes & 0x7F) == 0x7F] = 0  # no NaN codes
    if cfg.dtype == "e5m2":
        codes[(codes & 0x7C) == 0x7C] = 0  # no Inf / NaN codes
    groups = k // cfg.group_size
    if cfg.scale_dtype == "e8m0":
        s = e8m0_codes(torch.pow(2.0, torch.randint(-6, 4, (groups, n), generator=g).double()))
    else:
        s = ((torch.rand(groups, n, generator=g) + 0.5) / 4).to(ALL_TYPES[cfg.scale_dtype].torch)
    z = None
    if cfg.zeros == "int":
        lo, hi = (0, 16) if cfg.dtype == "uint4" else (-8, 8)
        z = torch.randint(lo, hi, (groups, n), generator=g).to(cfg.zero_torch())
    elif cfg.zeros == "float":
        z = (torch.rand(groups, n, generator=g) * 9).to(cfg.zero_torch())
    return dq.pack_host(codes, cfg), codes, s, z


@pytest.mark.parametrize("dtype,scale,out,zeros,precision,packing", CONFIGS)
def test_triton_matches_the_host_spec_bit_for_bit(dtype, scale, out, zeros, precision, packing):
    cfg = dq.DequantConfig(dtype, scale, out, 16, packing, zeros, precision)
    stored, codes, s, z = _inputs(cfg, 64, 40, seed=len(dtype) + len(scale))
    assert torch.equal(dq.unpack_host(stored, cfg), codes)
    per = 2 if cfg.packed else 1
    tile = stored[32 // per:64 // per, 8:40]  # k-block 1 of a BK = 32 tile, columns 8..39 (past N = 40 not)
    host = dq.dequant_host(tile, s, z, cfg, k0=32, n0=8)
    tri = dq.dequant(tile, s, z, cfg, k0=32, n0=8)
    assert host.dtype == tri.dtype == ALL_TYPES[out].torch
    assert torch.equal(host.view(torch.int16), tri.view(torch.int16))
    whole = dq.dequant_operand(stored, s, z, cfg)
    assert torch.equal(whole[32:64, 8:40].view(torch.int16), tri.view(torch.int16))


def test_columns_past_n_dequantise_to_zero():
    cfg = dq.DequantConfig("int4", "fp16", "fp16", 16, "k_pairs_low_first", "int")
    stored, _, s, z = _inputs(cfg, 32, 24, 1)
    pad = torch.cat([stored[:, 16:], torch.full((16, 8), 0x77, dtype=torch.uint8)], dim=1)  # 16 columns, 8 past N
    out = dq.dequant(pad, s, z, cfg, n0=16)
    assert bool((out[:, 8:] == 0).all()) and not bool((out[:, :8] == 0).all())


def test_nibble_order_low_first_holds_the_even_k_in_the_low_nibble():
    low = dq.DequantConfig("uint4", "fp16", "fp16", 2, "k_pairs_low_first")
    high = dq.DequantConfig("uint4", "fp16", "fp16", 2, "k_pairs_high_first")
    byte = torch.tensor([[0x3A]], dtype=torch.uint8)  # high nibble 3, low nibble 10
    ones = torch.ones(1, 1, dtype=torch.float16)
    assert dq.dequant_host(byte, ones, None, low).flatten().tolist() == [10.0, 3.0]
    assert dq.dequant_host(byte, ones, None, high).flatten().tolist() == [3.0, 10.0]
    assert dq.pack_host(torch.tensor([[10], [3]]), low).item() == 0x3A


def test_k8_interleaved_holds_eight_k_in_a_little_endian_word():
    """Nibble i of the word (i = 0 the least significant) holds element [0, 2, 4, 6, 1, 3, 5, 7][i]."""
    cfg = dq.DequantConfig("uint4", "fp16", "fp16", 8, "k8_interleaved")
    codes = torch.stack([torch.arange(8), torch.arange(8, 16)], dim=1)  # column 0: k = 0..7 hold 0..7
    # column 0's nibbles from the least significant: 0 2 4 6 1 3 5 7; column 1's: 8 10 12 14 9 11 13 15
    words = (0x75316420, 0xFDB9ECA8)
    stored = dq.pack_host(codes, cfg)
    assert stored.dtype == torch.uint8 and tuple(stored.shape) == (4, 2)
    for col, word in enumerate(words):
        assert stored[:, col].tolist() == list(word.to_bytes(4, "little")), hex(word)
        assert int.from_bytes(bytes(stored[:, col].tolist()), "little") == word
    assert torch.equal(dq.unpack_host(stored, cfg), codes)
    ones = torch.ones(1, 2, dtype=torch.float16)
    host = dq.dequant_host(stored, ones, None, cfg)
    assert host[:, 0].tolist() == [float(v) for v in range(8)]
    assert torch.equal(dq.dequant(stored, ones, None, cfg).view(torch.int16), host.view(torch.int16))
    # the same bytes read as plain pairs give the interleaved order
    plain = dq.DequantConfig("uint4", "fp16", "fp16", 8, "k_pairs_low_first")
    assert dq.unpack_host(stored, plain)[:, 0].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    for k in range(24):
        for packing in dq.PACKINGS:
            assert dq.k_of_nibble(*dq.nibble_of(k, packing), packing) == k
    assert dq.nibble_of(1, "k8_interleaved") == (2, 0) and dq.nibble_of(6, "k8_interleaved") == (1, 1)


def test_k8_interleaved_tiles_hold_whole_words():
    cfg = dq.DequantConfig("int4", "fp16", "fp16", 8, "k8_interleaved")
    ones = torch.ones(2, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="not a multiple of 4"):
        dq.unpack_host(torch.zeros(6, 4, dtype=torch.uint8), cfg)
    with pytest.raises(ValueError, match="multiple of 8"):
        dq.pack_host(torch.zeros(12, 4, dtype=torch.int64), cfg)
    with pytest.raises(ValueError, match="k0 = 4"):
        dq.dequant_host(torch.zeros(4, 4, dtype=torch.uint8), ones, None, cfg, k0=4)
    with pytest.raises(ValueError, match="k0 = 4"):
        dq.dequant(torch.zeros(4, 4, dtype=torch.uint8), ones, None, cfg, k0=4)
    with pytest.raises(ValueError, match="stored has 2 rows"):
        dq.dequant(torch.zeros(2, 4, dtype=torch.uint8), ones, None, cfg)
    with pytest.raises(ValueError, match="group_size 12 must be a multiple of 8"):
        dq.DequantConfig("int4", "fp16", "fp16", 12, "k8_interleaved")


def test_decoders():
    assert dq.values_of_codes(torch.arange(16), "int4").tolist() == list(range(8)) + list(range(-8, 0))
    fp4 = dq.values_of_codes(torch.arange(16), "fp4_e2m1").tolist()
    assert fp4[:8] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] and fp4[9:] == [-v for v in fp4[1:8]]
    assert dq.scale_values_host(torch.tensor([127, 128, 0], dtype=torch.uint8), "e8m0").tolist() == \
        [1.0, 2.0, 2.0**-127]
    assert dq.codes_of_values(torch.tensor([-8.0, 7.0]), "int4").tolist() == [8, 7]
    with pytest.raises(ValueError, match="outside the int4"):
        dq.codes_of_values(torch.tensor([8.0]), "int4")
    with pytest.raises(ValueError, match="outside e2m1"):
        dq.codes_of_values(torch.tensor([5.0]), "fp4_e2m1")


def test_check_supported_names_every_problem():
    assert dq.check_supported(dq.DequantConfig("int4", "fp16", "fp16", 16, "k_pairs_low_first")) == []
    for kw, why in ((dict(packing=None), "packing None for a packed int4"), (dict(out_dtype="fp32"), "out_dtype"),
                    (dict(zeros="float", scale_dtype="e8m0"), "float zero points"),
                    (dict(group_size=3), "group_size 3"), (dict(precision="tf32"), "precision 'tf32'")):
        with pytest.raises(ValueError, match=why):
            dq.DequantConfig(**{**dict(dtype="int4", scale_dtype="fp16", out_dtype="fp16", group_size=16,
                                       packing="k_pairs_low_first"), **kw})


def test_the_dequant_tolerance_entries():
    assert tolerance.lookup("dequant_b", "fp16").u == 2.0**-11
    assert tolerance.lookup("dequant_b", "bf16").u == 2.0**-8
    with pytest.raises(hardware_numerics.ToleranceError):
        tolerance.lookup("dequant_b", "fp32")  # no silent default
    q, z, s = torch.tensor([3.0]), torch.tensor([1.5]), torch.tensor([0.1])
    kw = dict(out_dtype="fp16", zeros="float", scale_dtype="fp16")
    assert tolerance.dequant_bound(q, z, s, precision="fp32", **kw) is None  # declared fp32: exact
    assert tolerance.dequant_bound(q, z, s, precision="operand", out_dtype="fp16", zeros="none",
                                   scale_dtype="fp16") is None  # one rounding of q * s in any order
    b = tolerance.dequant_bound(q, z, s, precision="operand", **kw)
    assert b is not None and float(b) == pytest.approx(2 * 2.0**-11 * (1.5 * 0.1 + 1.5 * 0.1) + 2.0**-24)


@pytest.mark.parametrize("out", ["fp16", "bf16"])
def test_an_fma_order_stays_within_the_operand_bound(out):
    """A kernel computing q * s + (-z * s) in the operand dtype (z * s rounded first, one fma) against the
    reference's (q - z) * s: within the bound everywhere, and not always equal (so the bound is needed)."""
    cfg = dq.DequantConfig("uint4", "fp16", out, 16, "k_pairs_low_first", "float", "operand")
    stored, codes, s, z = _inputs(cfg, 256, 64, 9)
    ref = dq.dequant_host(stored, s, z, cfg).double()
    t = ALL_TYPES[out].torch
    q = dq.values_of_codes(codes, "uint4")
    g = torch.arange(256) // 16
    sv, zv = s.to(t).double()[g], z.to(t).double()[g]
    zs = (zv * sv).to(t).double()
    fma = (q * sv - zs).to(t).double()  # float64 holds q * s exactly: one rounding, as an fma
    bound = tolerance.dequant_bound(q, zv, sv, out_dtype=out, precision="operand", zeros="float", scale_dtype="fp16")
    assert bool(((fma - ref).abs() <= bound).all())
    assert bool((fma != ref).any())


def test_a_config_is_refused_naming_every_unsupported_field():
    from kernels_ref.scales import ScaleLayout

    with pytest.raises(ValueError) as e:
        dq.DequantConfig("int4", "fp64", "fp32", 32, packing="k_pairs_low_first")
    assert "scale_dtype 'fp64'" in str(e.value) and "out_dtype 'fp32'" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:
        ScaleLayout((1, 128), dtype="fp64", major="diagonal")
    assert "dtype='fp64'" in str(e.value) and "major='diagonal'" in str(e.value), str(e.value)

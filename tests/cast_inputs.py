"""Inputs that exercise an output cast, shared by the CPU and GPU cast tests: fp32 values of every
class a cast has a rule for, built from the target format's own bit patterns.

For a float target: every finite magnitude of the format (fp8) or a stride through them (fp16,
bf16: all exponents, many mantissas), each value's tie with its upper neighbour and one fp32 ulp
either side of the tie, both signs; the largest finite value and the overflow threshold; for an
int32 target the integers and half-integers around 0, 2^23, 2^24 and the ends of the range.
Always: +-0, +-inf, NaN of both signs with several payloads, fp32 subnormals, the fp32 extremes,
and seeded random bit patterns over every exponent.
"""

from __future__ import annotations

import torch

_FLOAT_TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
                "e5m2": torch.float8_e5m2}
_SPECIAL_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF,
                 0x7FFFFFFF, 0xFFFFFFFF, 0xFF800001, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00400000,
                 0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F000000, 0xBF000000]
WIDTH = 1024  # elements per row of the returned [R, WIDTH] tensor


def _from_bits(bits) -> torch.Tensor:
    b = torch.as_tensor(bits, dtype=torch.int64)
    return torch.where(b >= 2**31, b - 2**32, b).to(torch.int32).view(torch.float32)


def _float_values(name: str) -> list[torch.Tensor]:
    dt = _FLOAT_TORCH[name]
    width = torch.empty((), dtype=dt).element_size()
    n = 1 << (8 * width - 1)  # the non-negative patterns
    pats = torch.arange(n, dtype=torch.int64)
    if width == 2:  # every exponent, a spread of mantissas (the low ones, the high ones, a stride)
        m_bits = 10 if name == "fp16" else 7
        m = pats & ((1 << m_bits) - 1)
        pats = pats[(m < 4) | (m >= (1 << m_bits) - 4) | (pats % 13 == 0)]
        view = torch.int16
    else:
        view = torch.int8
    vals = pats.to(view).view(dt).to(torch.float64) if width == 2 else \
        torch.where(pats >= 128, pats - 256, pats).to(view).view(dt).to(torch.float64)
    finite = vals[torch.isfinite(vals)]
    # the upper neighbour of each sampled pattern: pattern + 1 (magnitudes grow with the pattern)
    nxt_p = pats + 1
    nxt_p = nxt_p[nxt_p < n]
    nxt = nxt_p.to(view).view(dt).to(torch.float64)
    lo = pats[: nxt.numel()].to(view).view(dt).to(torch.float64)
    keep = torch.isfinite(nxt) & torch.isfinite(lo)
    pairs = torch.stack([lo[keep], nxt[keep]], 1)
    mid = pairs.mean(1)
    mid32 = mid.to(torch.float32)
    assert torch.equal(mid32.double(), mid), "a tie is not representable in fp32"
    out = [finite.to(torch.float32), mid32, torch.nextafter(mid32, torch.tensor(float("inf"))),
           torch.nextafter(mid32, torch.tensor(0.0))]
    big = float(finite.max())
    over = {"fp16": 65520.0, "bf16": float(torch.tensor(0x7F7F8000, dtype=torch.int64).to(torch.int32)
                                          .view(torch.float32)), "e4m3": 464.0, "e5m2": 61440.0}[name]
    out.append(torch.tensor([big, over, 2 * big, big * 1.0001], dtype=torch.float32))
    out.append(torch.nextafter(torch.tensor([over, over], dtype=torch.float32),
                               torch.tensor([0.0, float("inf")])))
    return out


def _int32_values() -> list[torch.Tensor]:
    lo, hi = -2**31, 2**31 - 1
    base = torch.arange(-40, 41, dtype=torch.float64) / 4  # integers, halves, quarters around 0
    around = []
    for c in (2.0**23, 2.0**24, float(hi), float(lo), 2.0**31, 2.0**30, 1000.0):
        around.append(c + torch.arange(-6, 7, dtype=torch.float64) / 2)
    vals = torch.cat([base] + around)
    v32 = vals.to(torch.float32)
    return [v32, -v32, torch.nextafter(v32, torch.tensor(float("inf"))), torch.nextafter(v32, torch.tensor(0.0)),
            torch.tensor([2147483520.0, -2147483904.0, 3e9, -3e9, 1e38, -1e38, 127.49999, 127.50001, -128.50001],
                         dtype=torch.float32)]


def cast_inputs(out: str, seed: int = 0) -> torch.Tensor:
    """fp32 [R, WIDTH] inputs for a cast to `out` (a kernels_ref.epilogue.OUT_DTYPES name), on the CPU."""
    parts = [_from_bits(_SPECIAL_BITS)]
    if out in _FLOAT_TORCH:
        parts += _float_values(out)
    elif out == "int32":
        parts += _int32_values()
    g = torch.Generator().manual_seed(seed)
    parts.append(_from_bits(torch.randint(0, 2**32, (4096,), generator=g, dtype=torch.int64)))
    pos = torch.cat([p.reshape(-1) for p in parts])
    x = torch.cat([pos, -pos])
    pad = (-x.numel()) % WIDTH
    return torch.cat([x, torch.zeros(pad)]).reshape(-1, WIDTH).contiguous()


def same_bits(got: torch.Tensor, want: torch.Tensor) -> list[tuple[int, int, int]]:
    """Elements whose bits differ: (flat index, got bits, want bits), unsigned."""
    width = got.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[width]
    g = got.detach().cpu().contiguous().view(view).reshape(-1).to(torch.int64) & ((1 << (8 * width)) - 1)
    w = want.detach().cpu().contiguous().view(view).reshape(-1).to(torch.int64) & ((1 << (8 * width)) - 1)
    idx = torch.nonzero(g != w).reshape(-1).tolist()
    return [(i, int(g[i]), int(w[i])) for i in idx]


def int32_expectations() -> tuple[list[float], list[int]]:
    """(inputs, what cvt.rni.s32.f32 gives) written out by hand."""
    nan, inf = float("nan"), float("inf")
    common = [(0.0, 0), (-0.0, 0), (0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.5, -2), (3.5, 4),
              (0.49999997, 0), (0.50000006, 1), (1e-45, 0), (-1e-45, 0), (nan, 0), (-nan, 0),
              (126.5, 126), (-126.5, -126), (125.5, 126)]
    rows = common + [(8388607.5, 8388608), (8388606.5, 8388606), (16777216.0, 16777216), (123456.75, 123457),
                     (-123456.25, -123456), (2147483520.0, 2147483520), (2147483648.0, 2147483647),
                     (3e9, 2147483647), (inf, 2147483647), (-2147483648.0, -2147483648),
                     (-2147483904.0, -2147483648), (-inf, -2147483648)]
    return [x for x, _ in rows], [y for _, y in rows]

"""The operand types (normal exponent range, the unit "big" product, instruction depth) and the
controlled probes of the numerics measurement: each a set of dot products with chosen products,
every operand exact in its type (`split_product`), so each probe's exact sum and every plausible
rounding of it are known. Families: step, ladder, operand (benchmarks/measure_numerics.py says what
each tells apart).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

C_VALUES = (1.0, 1.25, 1.5, 1.75)  # small-mantissa factors every operand type holds


@dataclass(frozen=True)
class OpType:
    name: str
    torch: torch.dtype
    emin: int  # smallest normal exponent
    emax: int  # largest exponent
    unit: float  # the probes' big product
    instr_k: int  # k of one wgmma instruction
    fraction_bits: int


OPTYPES = {
    "bf16": OpType("bf16", torch.bfloat16, -126, 127, 1.0, 16, 7),
    "fp16": OpType("fp16", torch.float16, -14, 15, 2.0 ** 14, 16, 10),
    "tf32": OpType("tf32", torch.float32, -126, 127, 1.0, 8, 10),
    "fp32": OpType("fp32", torch.float32, -126, 127, 1.0, 8, 23),
    "e4m3": OpType("e4m3", torch.float8_e4m3fn, -6, 8, 2.0 ** 8, 32, 3),
}


def _representable(v: float, t: OpType) -> bool:
    x = torch.tensor([v], dtype=torch.float64)
    return bool(x.to(torch.float32).to(t.torch).to(torch.float64)[0] == x[0])


_SPLIT_CACHE: dict = {}


def split_product(p: float, t: OpType) -> tuple[float, float]:
    """(a, b), both exactly representable in t (normal where possible), with a * b == p exactly."""
    key = (p, t.name)
    if key in _SPLIT_CACHE:
        return _SPLIT_CACHE[key]
    if p == 0:
        return 0.0, 0.0
    m, e = math.frexp(abs(p))  # p = m 2^e, m in [0.5, 1)
    c, e = m * 2, e - 1  # p = c 2^e, c in [1, 2)
    sign = 1.0 if p > 0 else -1.0
    order = sorted(range(t.emin - t.fraction_bits, t.emax + 1), key=lambda ea: abs(ea - e / 2))
    for ea in order:
        a, b = sign * c * 2.0 ** ea, 2.0 ** (e - ea)
        if _representable(a, t) and _representable(b, t) and a * b == p:
            normal = abs(a) >= 2.0 ** t.emin and b >= 2.0 ** t.emin
            if normal or not any(_normal_split(c, e, x, t) for x in order):
                _SPLIT_CACHE[key] = (a, b)
                return a, b
    raise ValueError(f"product {p!r} cannot be formed from two {t.name} values")


def _normal_split(c, e, ea, t) -> bool:
    a, b = c * 2.0 ** ea, 2.0 ** (e - ea)
    return a >= 2.0 ** t.emin and b >= 2.0 ** t.emin and _representable(a, t) and _representable(b, t)


def operands_for(products: torch.Tensor, t: OpType) -> tuple[torch.Tensor, torch.Tensor]:
    """Factor a [n, K] tensor of products into operand rows a, b [n, K] of type t."""
    flat = products.flatten().tolist()
    uniq = {v: split_product(v, t) for v in set(flat)}
    a = torch.tensor([uniq[v][0] for v in flat], dtype=torch.float64).reshape(products.shape)
    b = torch.tensor([uniq[v][1] for v in flat], dtype=torch.float64).reshape(products.shape)
    return a, b


@dataclass
class Probes:
    family: str
    a: torch.Tensor  # [n, K] float64 operand rows
    b: torch.Tensor  # [n, K]
    labels: list

    @property
    def n(self) -> int:
        return self.a.shape[0]

    def cat(self, other: "Probes") -> "Probes":
        K = max(self.a.shape[1], other.a.shape[1])
        pad = (lambda x: torch.nn.functional.pad(x, (0, K - x.shape[1])))
        return Probes(self.family, torch.cat([pad(self.a), pad(other.a)]), torch.cat([pad(self.b), pad(other.b)]),
                      self.labels + other.labels)


def _from_products(family: str, rows: list, labels: list, K: int, t: OpType) -> Probes:
    p = torch.zeros(len(rows), K, dtype=torch.float64)
    for i, row in enumerate(rows):
        for k, v in row:
            p[i, k] = v
    a, b = operands_for(p, t)
    return Probes(family, a, b, labels)


def step_probes(t: OpType, quick: bool = False) -> Probes:
    """Inside and just past the first MMA instruction (module docstring)."""
    B, g = t.unit, t.instr_k
    # e4m3: products stay normal (>= 2^-12), so no probe leans on fp8 subnormals
    js = range(1, 35) if t.name != "e4m3" else range(1, 21)
    if quick:
        js = range(2, 35, 3) if t.name != "e4m3" else range(2, 21, 2)
    rows, labels = [], []

    def add(row, label):
        rows.append(row)
        labels.append(label)

    for j in js:
        for c in (C_VALUES if not quick else (1.0, 1.5)):
            small = c * B * 2.0 ** -j
            for s0 in (1, -1):
                for s1 in (1, -1):
                    add([(0, s0 * B), (1, s0 * s1 * small)], f"pair j={j} c={c} signs={s0},{s0 * s1}")
                add([(0, s0 * B), (1, s0 * small), (2, -s0 * B)], f"pair+cancel j={j} c={c} sign={s0}")
                add([(0, s0 * B), (g, s0 * small), (g + 1, -s0 * B)], f"next-step+cancel j={j} c={c} sign={s0}")
    many_js = [j for j in js if j >= 8]
    for j in many_js:
        for cnt in (2, 3, 7, g - 2):
            for s in (1, -1):
                smalls = [(k, s * B * 2.0 ** -j) for k in range(1, cnt + 1)]
                add([(0, B)] + smalls, f"many n={cnt} j={j} sign={s}")
                add([(0, B)] + smalls + [(cnt + 1, -B)], f"many+cancel n={cnt} j={j} sign={s}")
                add([(0, B)] + [(g + k, s * B * 2.0 ** -j) for k in range(cnt)] + [(2 * g - 1, -B)],
                    f"next-step many+cancel n={cnt} j={j} sign={s}")
                add([(0, B)] + [(k, s * B * 2.0 ** -j) for k in range(g, 2 * g)], f"next-step full j={j} sign={s}")
    for d in range(1, g):
        for j in many_js[::2]:
            add([(0, B), (d, 1.5 * B * 2.0 ** -j), ((d + 1) % g or g, -B)], f"position d={d} j={j}")
            add([(d, B), (0, 1.5 * B * 2.0 ** -j), (g + d, -B)], f"position-before d={d} j={j}")
    return _from_products("step", rows, labels, 2 * g, t)


def ladder_probes(t: OpType, K: int, quick: bool = False) -> Probes:
    """A big product, then small ones at every k (module docstring)."""
    B = t.unit
    js = (11, 13, 15, 17, 19) if t.name == "e4m3" else (22, 24, 26, 28, 31)
    if quick:
        js = js[1::2]
    rows, labels = [], []
    for j in js:
        s = B * 2.0 ** -j
        for q in (0, 37, K // 3 + 5, K - 200):
            smalls = [(k, s) for k in range(K) if k != q and k != K - 1]
            rows.append([(q, B)] + smalls)
            labels.append(f"ladder big@{q} j={j}")
            rows.append([(q, B)] + smalls + [(K - 1, -B)])
            labels.append(f"ladder+cancel big@{q} j={j}")
    return _from_products("ladder", rows, labels, K, t)


def operand_probes(quick: bool = False) -> Probes:
    """fp32 operands with bits past TF32's 10 fraction bits; the other factor 1 (or 2^-j)."""
    rows_a, rows_b, labels = [], [], []
    deltas = []
    for lo in range(9, 24):
        deltas += [2.0 ** -lo, 3 * 2.0 ** -(lo + 1), 2.0 ** -lo + 2.0 ** -23]
    deltas += [2.0 ** -10 + 2.0 ** -11, 2.0 ** -11 + 2.0 ** -12 + 2.0 ** -13, 2.0 ** -9 + 2.0 ** -11]
    if quick:
        deltas = deltas[::3]
    for dlt in deltas:
        for s in (1, -1):
            for side in ("a", "b"):
                v = s * (1 + dlt)
                rows_a.append(v if side == "a" else 1.0)
                rows_b.append(v if side == "b" else 1.0)
                labels.append(f"operand {side}=1+{dlt!r} sign={s}")
            rows_a.append(s * (1 + dlt))
            rows_b.append(1 + dlt)
            labels.append(f"operand both=1+{dlt!r} sign={s}")
    n, K = len(rows_a), 8
    a = torch.zeros(n, K, dtype=torch.float64)
    b = torch.zeros(n, K, dtype=torch.float64)
    a[:, 0] = torch.tensor(rows_a, dtype=torch.float64)
    b[:, 0] = torch.tensor(rows_b, dtype=torch.float64)
    return Probes("operand", a, b, labels)

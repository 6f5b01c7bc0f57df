"""Element types the reference stages understand, by short name.

One table: the torch dtype, the unit roundoff of the format (half an ulp at 1.0), the largest
finite value, and the MMA instruction depth (k elements one tensor-core instruction sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    name: str
    torch: torch.dtype
    unit_roundoff: float  # 0 for integers
    max_finite: float
    mma_k: int  # k depth of one MMA instruction for this operand type
    is_float: bool = True

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.torch).element_size()


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", torch.float32, 2.0**-24, float(torch.finfo(torch.float32).max), 8),
        DType("fp16", torch.float16, 2.0**-11, 65504.0, 16),
        DType("bf16", torch.bfloat16, 2.0**-8, float(torch.finfo(torch.bfloat16).max), 16),
        DType("e4m3", torch.float8_e4m3fn, 2.0**-4, 448.0, 32),
        DType("e5m2", torch.float8_e5m2, 2.0**-3, 57344.0, 32),
        DType("int8", torch.int8, 0.0, 127.0, 32, is_float=False),
        DType("int32", torch.int32, 0.0, float(2**31 - 1), 8, is_float=False),
    )
}

FP8 = ("e4m3", "e5m2")


def dtype(name: str) -> DType:
    """Look a dtype up by short name; the error lists what exists."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def name_of(t: torch.dtype) -> str:
    for d in DTYPES.values():
        if d.torch == t:
            return d.name
    raise ValueError(f"torch dtype {t} has no short name; known: {', '.join(DTYPES)}")

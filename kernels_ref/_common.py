"""Plumbing shared by the reference stages: argument checks, bit views, launch options.

Kernels never read a floating-point operand through Triton's own conversions: every tensor is
passed as a same-width integer view and decoded in-kernel (see `_codec`), so the interpreter and
the GPU see identical bits. This module holds the Python side of that convention.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Sequence

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl

from kernels_ref.dtypes import DTYPES, FLOAT_NAMES, name_of  # noqa: F401  (re-exported to the stages)

# Constexpr codes for element types inside kernels; `_codec` dispatches on them.
CODES: dict[str, int] = {k: d.ref_code for k, d in DTYPES.items()}

# Quiet NaN bit patterns a TMA "nan" out-of-bounds fill writes, per element type.
NAN_BITS: dict[str, int] = {k: d.nan_bits for k, d in DTYPES.items() if d.nan_bits is not None}

OOB_FILLS = ("zero", "nan")
OPERANDS = ("a", "b")
MAJORS = ("row", "col")
SWIZZLES = (0, 32, 64, 128)

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32}


@triton.jit
def _probe_kernel(x):
    pass


def interpreting() -> bool:
    """True when this package's kernels run under the interpreter (chosen at import: `_interpret`)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_probe_kernel, InterpretedFunction)


def launch_options(device: torch.device, num_warps: Optional[int] = None) -> dict:
    """Compile options for every launch. On the GPU, fp-contraction is off so that a*b+c rounds
    twice, as the float64 host specifications (and the interpreter) do."""
    if interpreting():
        return {}
    opts = {"enable_fp_fusion": False}
    if num_warps is not None:
        opts["num_warps"] = num_warps
    return opts


def refusal(e: Exception) -> str:
    """A compiler error in one line: its type and the last line it said."""
    said = str(e).strip().splitlines()
    return f"{type(e).__name__}: {said[-1] if said else ''}"


def check_device(*named: tuple[str, Optional[torch.Tensor]]) -> torch.device:
    """All given tensors on one device, and one that can run the kernels here."""
    dev = None
    first = None
    for name, t in named:
        if t is None:
            continue
        if dev is None:
            dev, first = t.device, name
        elif t.device != dev:
            raise ValueError(f"{name} is on {t.device} but {first} is on {dev}; all tensors must share a device")
    if dev is None:
        raise ValueError("no tensor given")
    if dev.type == "cpu" and not interpreting():
        why = (f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']}" if "TRITON_INTERPRET" in os.environ else
               "a GPU is visible" if torch.cuda.is_available() else
               "triton was imported before kernels_ref or oracle could select its interpreter")
        raise ValueError(f"{first} is on the CPU, which Triton can run only under its interpreter, and this "
                         f"process compiles its kernels for the GPU ({why}): pass CUDA tensors, or start the "
                         "process with TRITON_INTERPRET=1")
    return dev


def require_tensor(name: str, x, ndim: Optional[int | Sequence[int]] = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            raise ValueError(f"{name} must be {' or '.join(f'{d}-D' for d in allowed)}, "
                             f"got shape {tuple(x.shape)}")
    return x


def dtype_name(name: str, x: torch.Tensor, allowed: Iterable[str] = tuple(DTYPES)) -> str:
    """Short dtype name of tensor `name`, checked against `allowed`."""
    allowed = tuple(allowed)
    try:
        short = name_of(x.dtype)
    except ValueError:
        short = None
    if short not in allowed:
        raise ValueError(f"{name} has dtype {x.dtype}; allowed: {', '.join(allowed)}")
    return short


def require_choice(name: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(repr(a) for a in allowed)}")


def require_index(name: str, value, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"{name}={value!r} is out of range; allowed: 0..{limit - 1}")
    return value


def bits_view(x: torch.Tensor) -> torch.Tensor:
    """Same-width signed-integer view (any strides) of a tensor; kernels load raw bits from it."""
    return x.view(_INT_VIEW[x.element_size()])


def strided(x: torch.Tensor) -> tuple:
    """(bits, *strides): one kernel argument for a tensor the kernel indexes itself."""
    xb = bits_view(x)
    return (xb, *xb.stride())


def constexprs(cls, **values):
    """A NamedTuple of a kernel's compile-time constants, each field a tl.constexpr: passed as one
    argument, every field specialises the kernel as a constexpr argument of its own would (a tuple
    passed whole as a constexpr gives plain values on triton 3.6, which tl.static_range refuses)."""
    return cls(**{k: tl.constexpr(v) for k, v in values.items()})


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad_dim(n: int, minimum: int = 16) -> int:
    """Power-of-two extent >= n (and >= minimum) that a Triton block of n elements occupies."""
    return max(minimum, triton.next_power_of_2(n))


def dot_k_min(dtype_names: Iterable[str]) -> int:
    """Smallest k extent a tl.dot accepts for these operand types (8-bit types need 32)."""
    return 32 if any(DTYPES[d].itemsize == 1 for d in dtype_names) else 16


def f32(t: torch.Tensor) -> torch.Tensor:
    """Round a float64 tensor to the nearest fp32 value (RNE), kept as float64."""
    return t.to(torch.float32).to(torch.float64)


def reasons_error(reasons: list[str]) -> ValueError:
    return ValueError("; ".join(reasons))


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`. A CPU tensor bound for a GPU is copied from pinned memory without blocking:
    a plain copy from pageable memory waits for every kernel queued before it (the stream is
    synchronised), which would keep the host from queueing more work while the GPU runs. The
    caching host allocator keeps the pinned block until the copy has read it."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def device_tensor(data, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """torch.tensor(data, dtype) on `device`, copied there without blocking (`to_device`)."""
    return to_device(torch.tensor(data, dtype=dtype), device)


def as_index_tensor(name: str, pairs, device: torch.device) -> torch.Tensor:
    """[T, 2] int32 tensor from a list of index pairs."""
    try:
        t = torch.as_tensor(list(pairs) if not isinstance(pairs, torch.Tensor) else pairs, dtype=torch.int64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a list of (int, int) pairs: {e}") from None
    if t.dim() != 2 or t.shape[1] != 2 or t.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty list of (int, int) pairs, got shape {tuple(t.shape)}")
    return to_device(t.to(torch.int32).contiguous(), device)


def pair_bounds(pairs: torch.Tensor) -> tuple[list[int], list[int]]:
    """The smallest and the largest of each column of a CPU [T, 2] index tensor, in numpy: a torch
    reduction of a few elements costs the host far more (its dispatch, its intra-op threads)."""
    v = pairs.numpy()
    return v.min(axis=0).tolist(), v.max(axis=0).tolist()


"""What a kernel launch is: grid, block, cluster, dynamic shared memory and the ordered arguments,
plus how those arguments are packed for cuLaunchKernel.

Data path: LaunchSpec (validated) -> to_dict / from_dict (JSON, for the child process) ->
argument bytes (a device pointer per TensorArg, the little-endian scalar, the 128 encoded bytes of a
TensorMapArg, raw bytes of a StructArg) -> KernelParams: one host buffer per argument and a
`void*[n]` array of their addresses, which is what cuLaunchKernel's `kernelParams` wants.

Constraints: the argument list must match the kernel's C++ signature in order and size (the driver
copies each parameter's size from the kernel image, so a wrong ctype reads garbage); a tensor map
parameter must be `const __grid_constant__ CUtensorMap`. Limits checked here are those of sm_90.
"""

from __future__ import annotations

import ctypes
import math
import struct
from dataclasses import dataclass
from typing import Sequence, Union

from harness.errors import BadInput
from harness.tensormap import TensorMapSpec

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_DYNAMIC_SHARED_BYTES = 227 * 1024  # sm_90 opt-in limit per block
MAX_CLUSTER_SIZE = 16  # more than 8 needs the non-portable attribute (set by the runner)
PORTABLE_CLUSTER_SIZE = 8
ROLES = ("in", "out", "inout")

# ctype -> (struct format, lower bound, upper bound or None for floats)
SCALAR_TYPES = {
    "i32": ("<i", -(2**31), 2**31 - 1),
    "u32": ("<I", 0, 2**32 - 1),
    "i64": ("<q", -(2**63), 2**63 - 1),
    "u64": ("<Q", 0, 2**64 - 1),
    "f32": ("<f", None, None),
    "f64": ("<d", None, None),
}


class LaunchError(BadInput, ValueError):
    """A launch description that cannot be right; the message names the field and what is allowed."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class TensorArg:
    """A device buffer the runner allocates: uploaded before the launch for 'in'/'inout',
    poisoned for 'out', downloaded after it for 'out'/'inout'. Passed as a device pointer."""

    name: str
    role: str = "in"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise LaunchError(f"TensorArg name {self.name!r} must be an identifier-like string")
        if self.role not in ROLES:
            raise LaunchError(f"TensorArg {self.name!r}: role {self.role!r}; allowed {', '.join(ROLES)}")


@dataclass(frozen=True)
class ScalarArg:
    value: Union[int, float]
    ctype: str = "i32"

    def __post_init__(self) -> None:
        if self.ctype not in SCALAR_TYPES:
            raise LaunchError(f"ScalarArg ctype {self.ctype!r}; allowed {', '.join(SCALAR_TYPES)}")
        fmt, lo, hi = SCALAR_TYPES[self.ctype]
        if isinstance(self.value, bool):
            raise LaunchError(f"ScalarArg value {self.value!r} is a bool; pass 0 or 1 with an integer ctype")
        if lo is not None:
            if not _is_int(self.value):
                raise LaunchError(f"ScalarArg {self.ctype} needs an int, got {type(self.value).__name__} "
                                  f"{self.value!r}")
            if not lo <= self.value <= hi:
                raise LaunchError(f"ScalarArg value {self.value} does not fit {self.ctype} ({lo}..{hi})")
        else:
            if not isinstance(self.value, (int, float)):
                raise LaunchError(f"ScalarArg {self.ctype} needs a float, got {type(self.value).__name__}")
            if self.ctype == "f32" and math.isfinite(self.value) and abs(self.value) > 3.4028234663852886e38:
                raise LaunchError(f"ScalarArg value {self.value} overflows f32")

    def to_bytes(self) -> bytes:
        fmt = SCALAR_TYPES[self.ctype][0]
        return struct.pack(fmt, float(self.value) if fmt in ("<f", "<d") else self.value)


@dataclass(frozen=True)
class TensorMapArg:
    """A CUtensorMap passed by value, encoded by the runner against `tensor_name`'s device address."""

    tensor_name: str
    spec: TensorMapSpec

    def __post_init__(self) -> None:
        if not isinstance(self.tensor_name, str) or not self.tensor_name.isidentifier():
            raise LaunchError(f"TensorMapArg tensor_name {self.tensor_name!r} must be an identifier-like string")
        if not isinstance(self.spec, TensorMapSpec):
            raise LaunchError(f"TensorMapArg {self.tensor_name!r}: spec must be a TensorMapSpec, "
                              f"got {type(self.spec).__name__}")


@dataclass(frozen=True)
class StructArg:
    """Raw bytes passed by value (a parameter struct laid out by the caller)."""

    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray)) or len(self.data) == 0:
            raise LaunchError("StructArg data must be non-empty bytes")
        if len(self.data) > 32764:
            raise LaunchError(f"StructArg of {len(self.data)} bytes exceeds the 32764-byte parameter limit")
        object.__setattr__(self, "data", bytes(self.data))


KernelArg = Union[TensorArg, ScalarArg, TensorMapArg, StructArg]


def _dim3(name: str, v, limits: Sequence[int]) -> tuple[int, int, int]:
    if _is_int(v):
        v = (v,)
    try:
        t = tuple(v)
    except TypeError:
        raise LaunchError(f"{name} {v!r} must be an int or a tuple of 1-3 ints") from None
    if not 1 <= len(t) <= 3 or not all(_is_int(x) for x in t):
        raise LaunchError(f"{name} {v!r} must be an int or a tuple of 1-3 ints")
    t = t + (1,) * (3 - len(t))
    for axis, x, lim in zip("xyz", t, limits):
        if not 1 <= x <= lim:
            raise LaunchError(f"{name}.{axis} = {x}; allowed 1..{lim}")
    return t


@dataclass(frozen=True)
class LaunchSpec:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[KernelArg, ...] = ()
    shared_mem_bytes: int = 0  # dynamic shared memory per block
    cluster: tuple[int, int, int] = (1, 1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _dim3("grid", self.grid, MAX_GRID))
        object.__setattr__(self, "block", _dim3("block", self.block, MAX_BLOCK))
        object.__setattr__(self, "cluster", _dim3("cluster", self.cluster, (MAX_CLUSTER_SIZE,) * 3))
        threads = math.prod(self.block)
        if threads > MAX_THREADS_PER_BLOCK:
            raise LaunchError(f"block {self.block} has {threads} threads; at most {MAX_THREADS_PER_BLOCK}")
        if not _is_int(self.shared_mem_bytes) or not 0 <= self.shared_mem_bytes <= MAX_DYNAMIC_SHARED_BYTES:
            raise LaunchError(f"shared_mem_bytes {self.shared_mem_bytes!r}; allowed 0..{MAX_DYNAMIC_SHARED_BYTES}")
        csize = math.prod(self.cluster)
        if csize > MAX_CLUSTER_SIZE:
            raise LaunchError(f"cluster {self.cluster} has {csize} blocks; at most {MAX_CLUSTER_SIZE}")
        for axis, g, c in zip("xyz", self.grid, self.cluster):
            if g % c != 0:
                raise LaunchError(f"grid.{axis} = {g} is not a multiple of cluster.{axis} = {c}")
        args = tuple(self.args)
        object.__setattr__(self, "args", args)
        seen: set[str] = set()
        for i, a in enumerate(args):
            if not isinstance(a, (TensorArg, ScalarArg, TensorMapArg, StructArg)):
                raise LaunchError(f"args[{i}] is a {type(a).__name__}; allowed TensorArg, ScalarArg, "
                                  f"TensorMapArg, StructArg")
            if isinstance(a, TensorArg):
                if a.name in seen:
                    raise LaunchError(f"args[{i}]: tensor {a.name!r} is passed twice as a TensorArg")
                seen.add(a.name)

    def tensor_roles(self) -> dict[str, str]:
        """Every tensor the launch needs, with its role; a tensor named only by a TensorMapArg is 'in'."""
        roles: dict[str, str] = {}
        for a in self.args:
            if isinstance(a, TensorArg):
                roles[a.name] = a.role
        for a in self.args:
            if isinstance(a, TensorMapArg):
                roles.setdefault(a.tensor_name, "in")
        return roles

    # ------------------------------------------------------------------ JSON (child protocol)

    def to_dict(self) -> dict:
        out = []
        for a in self.args:
            if isinstance(a, TensorArg):
                out.append({"kind": "tensor", "name": a.name, "role": a.role})
            elif isinstance(a, ScalarArg):
                out.append({"kind": "scalar", "value": a.value, "ctype": a.ctype})
            elif isinstance(a, TensorMapArg):
                out.append({"kind": "tensormap", "tensor_name": a.tensor_name, "spec": a.spec.to_dict()})
            else:
                out.append({"kind": "struct", "hex": a.data.hex()})
        return {"grid": list(self.grid), "block": list(self.block), "cluster": list(self.cluster),
                "shared_mem_bytes": self.shared_mem_bytes, "args": out}

    @classmethod
    def from_dict(cls, d: dict) -> "LaunchSpec":
        args: list[KernelArg] = []
        for a in d["args"]:
            kind = a["kind"]
            if kind == "tensor":
                args.append(TensorArg(a["name"], a["role"]))
            elif kind == "scalar":
                args.append(ScalarArg(a["value"], a["ctype"]))
            elif kind == "tensormap":
                args.append(TensorMapArg(a["tensor_name"], TensorMapSpec.from_dict(a["spec"])))
            elif kind == "struct":
                args.append(StructArg(bytes.fromhex(a["hex"])))
            else:
                raise LaunchError(f"unknown argument kind {kind!r}")
        return cls(grid=tuple(d["grid"]), block=tuple(d["block"]), args=tuple(args),
                   shared_mem_bytes=d["shared_mem_bytes"], cluster=tuple(d.get("cluster", (1, 1, 1))))


# --------------------------------------------------------------------------- packing


def pointer_bytes(address: int) -> bytes:
    return struct.pack("<Q", int(address))


class KernelParams:
    """Host storage for each argument's bytes and the `void*[n]` array pointing at them.

    Keep the object alive until the launch call returns (the driver copies the values during
    cuLaunchKernel). Each buffer is 64-byte aligned, which suits CUtensorMap's alignment too."""

    ALIGN = 64

    def __init__(self, values: Sequence[bytes]):
        self._keep = []
        self.sizes = tuple(len(v) for v in values)
        self._array = (ctypes.c_void_p * max(len(values), 1))()
        for i, v in enumerate(values):
            if not v:
                raise LaunchError(f"argument {i} packs to zero bytes")
            raw = ctypes.create_string_buffer(len(v) + self.ALIGN)
            base = ctypes.addressof(raw)
            aligned = (base + self.ALIGN - 1) // self.ALIGN * self.ALIGN
            ctypes.memmove(aligned, bytes(v), len(v))
            self._keep.append(raw)
            self._array[i] = aligned
        self.count = len(values)

    @property
    def address(self) -> int:
        """Address of the pointer array, 0 for a kernel without parameters."""
        return ctypes.addressof(self._array) if self.count else 0

    def pointer(self, i: int) -> int:
        return int(self._array[i])

    def read(self, i: int) -> bytes:
        """The bytes argument i points at (for checks)."""
        return ctypes.string_at(self._array[i], self.sizes[i])


def argument_bytes(launch: LaunchSpec, device_ptrs: dict[str, int], tensor_maps: Sequence[bytes]) -> list[bytes]:
    """The bytes of each argument in order: `device_ptrs` maps tensor names to device addresses,
    `tensor_maps` holds the encoded maps of the TensorMapArgs in order of appearance."""
    out: list[bytes] = []
    maps = iter(tensor_maps)
    for i, a in enumerate(launch.args):
        if isinstance(a, TensorArg):
            out.append(pointer_bytes(device_ptrs[a.name]))
        elif isinstance(a, ScalarArg):
            out.append(a.to_bytes())
        elif isinstance(a, TensorMapArg):
            try:
                m = next(maps)
            except StopIteration:
                raise LaunchError(f"args[{i}]: no encoded tensor map given for {a.tensor_name!r}") from None
            if len(m) != 128:
                raise LaunchError(f"args[{i}]: an encoded tensor map has 128 bytes, got {len(m)}")
            out.append(bytes(m))
        else:
            out.append(a.data)
    return out

"""The launch-library ABI "oracle/1" on the Python side: the ctypes mirror of
oracle_trace::LaunchArgs (harness/include/oracle_trace/launch.hpp) and the call a library case makes.

Data path: LibraryCall (validated: sizes, alpha/beta, the epilogue's codes, each tensor's slot,
buffer, element type, logical shape and strides, the workspaces) -> to_dict / from_dict (JSON, for
the child process) -> fill(device pointers, sink, stream) -> a LaunchArgs the child passes to the
library's `oracle_launch`.

Constraints: the struct is built from the field lists below, which follow the header line by line;
tests/cpu/test_launch_library.py compiles a program printing the header's offsetof values and holds
both to each other. Element types are the launch codes of kernels_ref.dtypes. No torch here (the
child imports this module).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Mapping, Optional

from kernels_ref.dtypes import ELEMENT_TYPES

ABIS = ("oracle/1",)  # what `[launch] abi` may say
ABI_VERSION = 1
MAX_RANK = 4
TENSOR_SLOTS = 16
WORKSPACE_SLOTS = 8
WORKSPACE_NAME_BYTES = 32
MESSAGE_BYTES = 1024
ENTRY_SYMBOL = "oracle_launch"
ABI_SYMBOL = "oracle_launch_abi"

# TensorSlot (launch.hpp): the operands' places in LaunchArgs.tensors
SLOTS = {"a": 0, "b": 1, "c": 2, "d": 3, "bias": 4, "scale_a": 5, "scale_b": 6}
BIAS_KINDS = ("none", "row", "col")  # BiasKind
SCALE_KINDS = ("none", "tensor", "row", "col", "block")  # ScaleKind
ROLES = ("in", "out", "inout")
LAUNCH_CODES = {name: d.launch_code for name, d in ELEMENT_TYPES.items()}

TENSOR_REF_FIELDS = (
    ("data", ctypes.c_void_p),
    ("dtype", ctypes.c_uint32),
    ("rank", ctypes.c_uint32),
    ("shape", ctypes.c_int64 * MAX_RANK),
    ("stride", ctypes.c_int64 * MAX_RANK),
)


class TensorRef(ctypes.Structure):
    _fields_ = TENSOR_REF_FIELDS


WORKSPACE_REF_FIELDS = (
    ("data", ctypes.c_void_p),
    ("bytes", ctypes.c_uint64),
    ("name", ctypes.c_char * WORKSPACE_NAME_BYTES),
)


class WorkspaceRef(ctypes.Structure):
    _fields_ = WORKSPACE_REF_FIELDS


LAUNCH_ARGS_FIELDS = (
    ("abi_version", ctypes.c_uint32),
    ("struct_bytes", ctypes.c_uint32),
    ("m", ctypes.c_int64),
    ("n", ctypes.c_int64),
    ("k", ctypes.c_int64),
    ("batch", ctypes.c_int64),
    ("groups", ctypes.c_int64),
    ("group_offsets", ctypes.c_void_p),
    ("alpha", ctypes.c_float),
    ("beta", ctypes.c_float),
    ("splits", ctypes.c_int32),
    ("stream_k_workers", ctypes.c_int32),
    ("activation", ctypes.c_uint32),
    ("bias_kind", ctypes.c_uint32),
    ("scale_a_kind", ctypes.c_uint32),
    ("scale_b_kind", ctypes.c_uint32),
    ("scale_a_block", ctypes.c_int32 * 2),
    ("scale_b_block", ctypes.c_int32 * 2),
    ("tile_m", ctypes.c_int32),
    ("tile_n", ctypes.c_int32),
    ("tile_k", ctypes.c_int32),
    ("n_workspaces", ctypes.c_uint32),
    ("tensors", TensorRef * TENSOR_SLOTS),
    ("workspaces", WorkspaceRef * WORKSPACE_SLOTS),
    ("trace_sink", ctypes.c_void_p),
    ("stream", ctypes.c_void_p),
    ("message", ctypes.c_void_p),
    ("message_bytes", ctypes.c_uint32),
    ("reserved", ctypes.c_uint32),
)


class LaunchArgs(ctypes.Structure):
    _fields_ = LAUNCH_ARGS_FIELDS


def abi_word() -> int:
    """What the library's oracle_launch_abi() must return: (version << 32) | sizeof(LaunchArgs)."""
    return (ABI_VERSION << 32) | ctypes.sizeof(LaunchArgs)


def describe_abi_word(word: int) -> str:
    return f"ABI version {word >> 32}, LaunchArgs of {word & 0xFFFFFFFF} bytes"


class AbiError(ValueError):
    """A library call that cannot be described in LaunchArgs; the message names the field."""


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class TensorSlotArg:
    """One operand in LaunchArgs.tensors: its slot (SLOTS), the runner's buffer, element type,
    logical shape and strides in elements (the storage order the buffer holds)."""

    slot: str
    buffer: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    role: str = "in"

    def __post_init__(self) -> None:
        if self.slot not in SLOTS:
            raise AbiError(f"tensor slot {self.slot!r} is unknown; slots: {', '.join(SLOTS)}")
        if not isinstance(self.buffer, str) or not self.buffer.isidentifier():
            raise AbiError(f"tensor {self.slot}: buffer {self.buffer!r} must be an identifier-like name")
        if self.dtype not in LAUNCH_CODES:
            raise AbiError(f"tensor {self.slot}: dtype {self.dtype!r}; allowed {', '.join(LAUNCH_CODES)}")
        shape, strides = tuple(self.shape), tuple(self.strides)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "strides", strides)
        if not 1 <= len(shape) <= MAX_RANK or len(strides) != len(shape):
            raise AbiError(f"tensor {self.slot}: shape {shape} and strides {strides} must have the same rank, "
                           f"1 to {MAX_RANK}")
        if not all(_int(v) and v >= 0 for v in shape + strides):
            raise AbiError(f"tensor {self.slot}: shape {shape} and strides {strides} must be non-negative integers")
        if self.role not in ROLES:
            raise AbiError(f"tensor {self.slot}: role {self.role!r}; allowed {', '.join(ROLES)}")


@dataclass(frozen=True)
class LibraryCall:
    """Everything one `oracle_launch` call receives except device addresses, sink and stream."""

    m: int
    n: int
    k: int
    tile: tuple[int, int, int]
    tensors: tuple[TensorSlotArg, ...]
    workspaces: tuple[tuple[str, str], ...] = ()  # (case name, runner buffer), in declaration order
    batch: int = 1
    groups: int = 0
    group_offsets: Optional[str] = None  # the runner buffer holding them
    alpha: float = 1.0
    beta: float = 0.0
    splits: int = 1
    stream_k_workers: int = 0
    activation: int = 0
    bias_kind: str = "none"
    scale_a_kind: str = "none"
    scale_b_kind: str = "none"
    scale_a_block: tuple[int, int] = (0, 0)
    scale_b_block: tuple[int, int] = (0, 0)
    abi: str = "oracle/1"

    def __post_init__(self) -> None:
        if self.abi not in ABIS:
            raise AbiError(f"abi {self.abi!r} is not one this harness speaks; allowed: {', '.join(ABIS)}")
        for name in ("m", "n", "k", "batch", "groups", "splits", "stream_k_workers", "activation"):
            v = getattr(self, name)
            if not _int(v) or v < 0 or v >= 2**31:
                raise AbiError(f"{name} = {v!r} must be an integer in 0..2^31-1")
        object.__setattr__(self, "tile", tuple(self.tile))
        if len(self.tile) != 3 or not all(_int(v) and v > 0 for v in self.tile):
            raise AbiError(f"tile {self.tile!r} must be three positive integers")
        for name, kinds in (("bias_kind", BIAS_KINDS), ("scale_a_kind", SCALE_KINDS), ("scale_b_kind", SCALE_KINDS)):
            if getattr(self, name) not in kinds:
                raise AbiError(f"{name} = {getattr(self, name)!r}; allowed {', '.join(kinds)}")
        tensors = tuple(self.tensors)
        object.__setattr__(self, "tensors", tensors)
        seen = set()
        for t in tensors:
            if not isinstance(t, TensorSlotArg):
                raise AbiError(f"tensors holds a {type(t).__name__}, not a TensorSlotArg")
            if t.slot in seen:
                raise AbiError(f"tensor slot {t.slot!r} is given twice")
            seen.add(t.slot)
        ws = tuple(tuple(w) for w in self.workspaces)
        object.__setattr__(self, "workspaces", ws)
        if len(ws) > WORKSPACE_SLOTS:
            raise AbiError(f"{len(ws)} workspaces; LaunchArgs holds at most {WORKSPACE_SLOTS}")
        for name, buffer in ws:
            if not (isinstance(name, str) and name.isidentifier() and len(name.encode()) < WORKSPACE_NAME_BYTES):
                raise AbiError(f"workspace name {name!r} must be an identifier of at most "
                               f"{WORKSPACE_NAME_BYTES - 1} characters (LaunchArgs holds it)")
            if not isinstance(buffer, str) or not buffer.isidentifier():
                raise AbiError(f"workspace {name}: buffer {buffer!r} must be an identifier-like name")

    def buffers(self) -> dict[str, str]:
        """Every runner buffer the call uses, with its role."""
        out = {t.buffer: t.role for t in self.tensors}
        out.update({buffer: "inout" for _, buffer in self.workspaces})
        if self.group_offsets is not None:
            out[self.group_offsets] = "in"
        return out

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("m", "n", "k", "batch", "groups", "group_offsets", "alpha", "beta",
                                           "splits", "stream_k_workers", "activation", "bias_kind",
                                           "scale_a_kind", "scale_b_kind", "abi")}
        d.update(tile=list(self.tile), scale_a_block=list(self.scale_a_block),
                 scale_b_block=list(self.scale_b_block), workspaces=[list(w) for w in self.workspaces],
                 tensors=[{"slot": t.slot, "buffer": t.buffer, "dtype": t.dtype, "shape": list(t.shape),
                           "strides": list(t.strides), "role": t.role} for t in self.tensors])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "LibraryCall":
        d = dict(d)
        tensors = tuple(TensorSlotArg(t["slot"], t["buffer"], t["dtype"], tuple(t["shape"]), tuple(t["strides"]),
                                      t.get("role", "in")) for t in d.pop("tensors"))
        return cls(tensors=tensors, tile=tuple(d.pop("tile")), workspaces=tuple(tuple(w) for w in d.pop("workspaces")),
                   scale_a_block=tuple(d.pop("scale_a_block")), scale_b_block=tuple(d.pop("scale_b_block")), **d)


@dataclass
class FilledArgs:
    """A LaunchArgs and the host memory it points at (its message buffer), kept alive together."""

    args: LaunchArgs
    message_buffer: ctypes.Array = field(repr=False)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.args)

    def message(self) -> str:
        return self.message_buffer.value.decode(errors="replace")


def fill(call: LibraryCall, device_ptrs: Mapping[str, int], sizes: Mapping[str, int], *, sink: int = 0,
         stream: int = 0) -> FilledArgs:
    """The LaunchArgs of `call` over the runner's device buffers (name -> address, name -> bytes)."""
    a = LaunchArgs()
    a.abi_version = ABI_VERSION
    a.struct_bytes = ctypes.sizeof(LaunchArgs)
    a.m, a.n, a.k, a.batch, a.groups = call.m, call.n, call.k, call.batch, call.groups
    a.group_offsets = device_ptrs[call.group_offsets] if call.group_offsets is not None else None
    a.alpha, a.beta = float(call.alpha), float(call.beta)
    a.splits, a.stream_k_workers, a.activation = call.splits, call.stream_k_workers, call.activation
    a.bias_kind = BIAS_KINDS.index(call.bias_kind)
    a.scale_a_kind = SCALE_KINDS.index(call.scale_a_kind)
    a.scale_b_kind = SCALE_KINDS.index(call.scale_b_kind)
    a.scale_a_block[:] = list(call.scale_a_block)
    a.scale_b_block[:] = list(call.scale_b_block)
    a.tile_m, a.tile_n, a.tile_k = call.tile
    for t in call.tensors:
        ref = a.tensors[SLOTS[t.slot]]
        ref.data = device_ptrs[t.buffer]
        ref.dtype = LAUNCH_CODES[t.dtype]
        ref.rank = len(t.shape)
        for i in range(MAX_RANK):
            ref.shape[i] = t.shape[i] if i < len(t.shape) else 1
            ref.stride[i] = t.strides[i] if i < len(t.strides) else 0
    a.n_workspaces = len(call.workspaces)
    for i, (name, buffer) in enumerate(call.workspaces):
        a.workspaces[i].data = device_ptrs[buffer]
        a.workspaces[i].bytes = sizes[buffer]
        a.workspaces[i].name = name.encode()
    a.trace_sink = sink or None
    a.stream = stream or None
    buf = ctypes.create_string_buffer(MESSAGE_BYTES)
    a.message = ctypes.addressof(buf)
    a.message_bytes = MESSAGE_BYTES
    return FilledArgs(a, buf)

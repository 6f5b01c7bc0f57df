"""Run one kernel launch in a child process with a time limit, and bring back its outputs and sink.

Data path: run_kernel(cubin, entry, launch, tensors, sink) -> a temporary run directory
(request.json, kernel.cubin, inputs.safetensors) and a sink file -> `python -m harness._child RUN_DIR`
in a new process group (a fresh interpreter, CUDA through cuda-python only; or the child that
harness.child_process started ahead for this command, handed the run directory) -> the parent waits
with the time limit, until the child exits or says on its done pipe that its files are written (its
CUDA context's teardown is then reaped on a thread) -> status.json, outputs.safetensors,
progress.jsonl and the sink file -> KernelRun.
run_library(library .so, LibraryCall, tensors, sink) takes the same path with kernel.so and the call
in the request: the child calls the library's oracle_launch (harness.launch_abi) instead of launching.

Constraints: an illegal address or trap kills the CUDA context for good and a hang never returns,
so the kernel never runs in the caller's process; nothing the child does (crash, hang, garbage
files) raises here. On a timeout the whole process group is killed. The host-mapped sink is a
shared file (in a private 0700 folder in /dev/shm when possible) registered with the driver, so
the taps written before a fault or a hang are still readable by the parent. Tensors are CPU torch
tensors; the kernel sees a dense row-major copy of each (`.contiguous()`).
"""

from __future__ import annotations

import enum
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch

from harness.errors import BadInput
from harness import knobs as _knobs
from harness import _protocol as P
from harness import _tensorio
from harness.child_process import DEFAULT_CHILD, ChildProcess, after_run, close_done, hand_over, start, take
from harness.build import CUBIN_MAGICS, MAX_LIBRARY_BYTES, BuildError, BuildResult, build_cubin, load_cubin
from harness.files import read_bounded
from harness.guard_bands import GuardBreach, GuardError, breaches_of
from harness.launch import LaunchSpec, TensorMapArg
from harness.launch_abi import ENTRY_SYMBOL, LibraryCall
from kernels_ref.dtypes import ELEMENT_TYPES

TAIL_CHARS = 8000
KILL_GRACE_S = 30.0
MAX_SINK_BYTES = 1 << 34

TORCH_TO_ST: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        TORCH_TO_ST[getattr(torch, _name)] = _name.replace("uint", "U")
ST_TO_TORCH = {v: k for k, v in TORCH_TO_ST.items()}

# Tensor-map dtype name -> torch dtypes a buffer of that map may have.
MAP_DTYPE_TORCH: dict[str, tuple[torch.dtype, ...]] = {k: (d.torch,) for k, d in ELEMENT_TYPES.items()}


class RunnerError(BadInput, ValueError):
    """The run request itself is wrong (names, dtypes, sizes); raised before any child starts."""


class RunStatus(str, enum.Enum):
    OK = "OK"
    CUDA_ERROR = "CUDA_ERROR"  # the launch or the kernel failed (illegal address, trap, bad config)
    TIMEOUT = "TIMEOUT"  # the child did not finish in time and was killed
    CRASHED = "CRASHED"  # the child died without reporting (signal, abort)
    LOAD_ERROR = "LOAD_ERROR"  # the cubin, the entry point or the sink symbol could not be loaded
    SETUP_ERROR = "SETUP_ERROR"  # no driver/device, out of memory, a tensor map the driver refused
    BUILD_ERROR = "BUILD_ERROR"  # nvcc failed (run_source only; build_cubin raises BuildError)
    HARNESS_ERROR = "HARNESS_ERROR"  # the child failed outside CUDA (a defect here, or a bad request)
    LIBRARY_ERROR = "LIBRARY_ERROR"  # a launch library's oracle_launch returned non-zero (KernelRun.launch_return)


KERNEL_FAULTS = frozenset({RunStatus.CUDA_ERROR, RunStatus.TIMEOUT, RunStatus.CRASHED, RunStatus.LIBRARY_ERROR})


@dataclass(frozen=True)
class SinkRequest:
    """The trace sink: a buffer of `capacity` bytes (default: len(init_bytes)) that starts with
    `init_bytes` (e.g. trace_format.sink_init_bytes(...), or just its header and pre-written records
    from trace_format.sink_prefix) and is zero after them; its device address is written into the
    `__device__` pointer `symbol` before the launch. Host-mapped (pinned host memory the kernel writes
    over PCIe) survives a kernel fault; device memory is faster but can be read back only after a
    clean run. With `max_bytes`, a launch whose records did not fit is run once more with a sink of
    the size its cursor measured, if that is at most `max_bytes` (KernelRun.sink_overflow says so)."""

    init_bytes: bytes
    symbol: str = "oracle_trace_sink"
    host_mapped: bool = True
    capacity: Optional[int] = None
    max_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.init_bytes, (bytes, bytearray, memoryview)) or len(self.init_bytes) == 0:
            raise RunnerError("SinkRequest.init_bytes must be non-empty bytes (the sink's initial image)")
        object.__setattr__(self, "init_bytes", bytes(self.init_bytes))
        cap = len(self.init_bytes) if self.capacity is None else self.capacity
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < len(self.init_bytes):
            raise RunnerError(f"SinkRequest.capacity {self.capacity!r} must be an int of at least the "
                              f"{len(self.init_bytes)} initial bytes")
        object.__setattr__(self, "capacity", cap)
        for name, v in (("capacity", cap), ("max_bytes", self.max_bytes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v > MAX_SINK_BYTES):
                raise RunnerError(f"SinkRequest.{name} {v!r} must be an int of at most {MAX_SINK_BYTES} bytes")
        if self.max_bytes is not None and self.max_bytes < cap:
            raise RunnerError(f"SinkRequest.max_bytes {self.max_bytes} is smaller than its capacity {cap}")
        if not isinstance(self.symbol, str) or not self.symbol or any(c.isspace() for c in self.symbol):
            raise RunnerError(f"SinkRequest.symbol {self.symbol!r} must be a symbol name")


@dataclass(frozen=True)
class KernelRun:
    status: RunStatus
    message: str = ""
    error_code: Optional[int] = None
    error_name: Optional[str] = None
    error_call: Optional[str] = None
    phase: Optional[str] = None  # the child's last phase (see harness._protocol.PHASES)
    outputs: Mapping[str, torch.Tensor] = field(default_factory=dict)  # only when OK
    sink: Optional[bytes] = None  # the raw sink after the run, when it could be recovered
    sink_source: Optional[str] = None  # host_mapped_file | host_pinned_copy | device_copy
    elapsed_s: float = 0.0  # the child's life until it exited or said it was done, start-up included
    kernel_s: Optional[float] = None  # launch to end of synchronize, host clock
    returncode: Optional[int] = None
    stderr_tail: str = ""
    stdout_tail: str = ""
    device: Mapping[str, object] = field(default_factory=dict)
    function: Mapping[str, object] = field(default_factory=dict)  # registers, static smem, local bytes
    run_dir: Optional[str] = None  # kept only with keep_dir / ORACLE_KEEP_RUN_DIR
    timing: Optional[Mapping[str, object]] = None  # the kernel's own timing, when asked (see _child)
    # the first launch's sink overflowed: {"first_capacity", "needed", "max_size", "relaunched"}
    sink_overflow: Optional[Mapping[str, object]] = None
    # shared-memory poison, when asked: {"pattern", "ctas"} (CTAs whose prologue filled their smem)
    smem_poison: Optional[Mapping[str, object]] = None
    # a launch library's oracle_launch: what it returned (0: launched) and the sentence it wrote
    launch_return: Optional[int] = None
    launch_message: str = ""
    # bytes written outside an output's allocation, read from its guard bands (harness.guard_bands)
    guard_breaches: tuple[GuardBreach, ...] = ()
    # seconds of each of the child's phases, in order (its progress marks; "exit": from its last mark
    # until it said it was done, or until the parent saw it gone)
    phases_s: Mapping[str, float] = field(default_factory=dict)
    # a child started ahead (harness.child_process): {"context_s": its CUDA set-up, "waited_s": how
    # long it then waited for this run (0: the run waited for it), "context_held"}; None: started fresh
    started_ahead: Optional[Mapping[str, object]] = None

    @property
    def ok(self) -> bool:
        return self.status is RunStatus.OK

    @property
    def kernel_fault(self) -> bool:
        """The kernel (not the harness) failed: report KERNEL_ERROR with whatever sink came back."""
        return self.status in KERNEL_FAULTS

    def describe(self) -> str:
        code = f" {self.error_name} ({self.error_code})" if self.error_code is not None else ""
        if self.launch_return:
            code += f"; oracle_launch returned {self.launch_return}" + \
                (f" ({self.launch_message})" if self.launch_message else "")
        sink = "no sink" if self.sink is None else f"sink {len(self.sink)} bytes from {self.sink_source}"
        return f"{self.status.value}{code} at phase {self.phase}; {sink}; {self.elapsed_s:.2f} s: {self.message}"


# --------------------------------------------------------------------------- request checks


def _as_cubin_bytes(cubin) -> bytes:
    if isinstance(cubin, BuildResult):
        try:
            return cubin.read()  # the bytes the build cache verified, not its path opened again
        except BuildError as exc:
            raise RunnerError(f"cannot use {cubin.cubin_path} as a cubin: {exc}") from None
    if isinstance(cubin, (bytes, bytearray, memoryview)):
        data = bytes(cubin)
        if data[:4] not in CUBIN_MAGICS:
            raise RunnerError(f"cubin bytes start with {data[:4]!r}, not a cubin or fatbin")
        return data
    if isinstance(cubin, (str, os.PathLike)):
        try:
            return load_cubin(cubin)
        except (OSError, BuildError) as exc:
            raise RunnerError(f"cannot use {cubin} as a cubin: {exc}") from None
    raise RunnerError(f"cubin must be bytes, a path or a BuildResult, got {type(cubin).__name__}")


def _check_request(launch: LaunchSpec, tensors: Mapping[str, torch.Tensor],
                   later: Sequence[LaunchSpec] = ()) -> dict[str, torch.Tensor]:
    if not isinstance(launch, LaunchSpec):
        raise RunnerError(f"launch must be a LaunchSpec, got {type(launch).__name__}")
    roles = dict(launch.tensor_roles())
    for spec in later:
        roles.update({n: r for n, r in spec.tensor_roles().items() if n not in roles})
    missing = [n for n in roles if n not in tensors]
    if missing:
        raise RunnerError(f"the launch names tensors {missing} that were not given; given: {sorted(tensors)}")
    unused = [n for n in tensors if n not in roles]
    if unused:
        raise RunnerError(f"tensors {unused} are not used by any argument of the launch")
    dense = _dense(tensors)
    for i, a in enumerate(launch.args):
        if isinstance(a, TensorMapArg):
            t = dense[a.tensor_name]
            if t.dtype not in MAP_DTYPE_TORCH[a.spec.dtype]:
                raise RunnerError(f"args[{i}]: the tensor map is {a.spec.dtype} but tensor {a.tensor_name!r} "
                                  f"is {t.dtype}")
            nbytes = t.numel() * t.element_size()
            if a.spec.extent_bytes > nbytes:
                raise RunnerError(f"args[{i}]: the tensor map over {a.tensor_name!r} spans {a.spec.extent_bytes} "
                                  f"bytes (dims {a.spec.global_dims}, strides {a.spec.global_strides}) but the "
                                  f"tensor has {nbytes}")
    return dense


def _dense(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor checked (a CPU torch tensor of a supported dtype) and made dense row-major."""
    dense: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise RunnerError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.device.type != "cpu":
            raise RunnerError(f"tensor {name!r} is on {t.device}; pass CPU tensors (the kernel runs in a "
                              f"child process that uploads them)")
        if t.dtype not in TORCH_TO_ST:
            raise RunnerError(f"tensor {name!r} has dtype {t.dtype}; supported: "
                              f"{', '.join(str(d) for d in TORCH_TO_ST)}")
        dense[name] = t.detach().contiguous()
    return dense


def sequence_roles(launch: LaunchSpec, later: Sequence[LaunchSpec] = ()) -> dict[str, str]:
    """The role of every tensor over a launch and the launches after it: a tensor that one launch
    reads and another writes is 'inout' (uploaded, never poisoned, downloaded)."""
    roles = launch.tensor_roles()
    for spec in later:
        for name, role in spec.tensor_roles().items():
            roles[name] = "inout" if roles.get(name, role) != role else role
    return roles


def _sink_dir(run_dir: Path) -> Path:
    chosen = _knobs.get("ORACLE_SINK_DIR")
    if chosen is not None:
        return chosen
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return run_dir


SINK_NAME = "sink.bin"


def _write_sink_file(run_dir: Path, init: bytes, capacity: int) -> Path:
    """A file of `capacity` bytes starting with the sink's initial bytes, zero after them, its
    pages reserved up front: on tmpfs a page that cannot be allocated later would kill the child
    with SIGBUS instead of an error here. It is made (O_EXCL, O_NOFOLLOW, 0600) inside a private
    0700 folder of its own in the sink directory (the run directory's `sink` folder as a fallback),
    where the child also makes a regrown sink; the caller removes that folder (`_remove_sink`)."""
    directory = _sink_dir(run_dir)
    first = None
    if directory != run_dir:
        home = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            home = Path(tempfile.mkdtemp(prefix="oracle-sink-", dir=directory))
            return _reserved(home / SINK_NAME, init, capacity)
        except OSError as exc:
            if home is not None:
                shutil.rmtree(home, ignore_errors=True)
            first = f"in {directory}: {exc}; "
    try:
        home = run_dir / "sink"
        home.mkdir(mode=0o700)
        return _reserved(home / SINK_NAME, init, capacity)
    except OSError as exc:
        raise RunnerError(f"cannot reserve {capacity} bytes for the sink: {first or ''}in the run directory "
                          f"{run_dir}: {exc}") from None


def _reserved(path: Path, init: bytes, capacity: int) -> Path:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.posix_fallocate(fd, 0, capacity)
        os.pwrite(fd, init, 0)
    finally:
        os.close(fd)
    return path


def _remove_sink(sink_file: Path) -> None:
    """The sink's private folder and what is in it (the sink, a regrown sink a killed child left)."""
    shutil.rmtree(sink_file.parent, ignore_errors=True)


def _read_sink(path: Path) -> bytes:
    """The sink's header and records: the bytes its header says hold records (the zero rest of a
    large sink is not read); only the header when it is not valid (the parser names what is wrong)."""
    from harness.trace_format import HEADER_BYTES, TraceFormatError, trace_extent

    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
        try:
            extent = trace_extent(head)
        except TraceFormatError:
            return head  # never the whole file: the parser names what is wrong with the header
        if extent <= len(head):
            return head
        f.seek(0)
        return f.read(extent)  # the header again with the records, in one buffer (no concatenation)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_CHARS))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except OSError:
        pass


def _kill_and_reap(proc: subprocess.Popen) -> Optional[int]:
    """SIGKILL the child's process group and wait a bounded time for it to go: a process stuck in
    the driver's teardown must not hang the caller (None: it had not exited yet)."""
    _kill_group(proc)
    try:
        return proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        return None


def _wait(child: ChildProcess, timeout: float) -> tuple[Optional[int], bool]:
    """Wait for the child to exit or to say it is done (its done pipe, harness.child_process),
    woken the moment either happens (a pidfd and the pipe) rather than by polling: (its exit status,
    None when it said done and is still exiting; whether it said done). Raises
    subprocess.TimeoutExpired when neither came within `timeout` seconds."""
    proc = child.proc
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or the child is already reaped
        return proc.wait(timeout=timeout), False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if child.done is not None:
            poller.register(child.done, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            ready = dict(poller.poll(min(1 << 30, max(0, math.ceil((deadline - time.monotonic()) * 1000)))))
            if fd in ready:
                break
            if child.done in ready:
                if os.read(child.done, 1):
                    return None, True
                poller.unregister(child.done)  # closed without a word: its exit tells
            if not ready and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait(timeout=KILL_GRACE_S), False


_reapers: list[threading.Thread] = []
_reapers_lock = threading.Lock()


def _reap_later(proc: subprocess.Popen, device: int, command: Sequence[str]) -> None:
    """Reap the oracle's own child on a thread of its own (one that said it is done may still be in
    its CUDA context's teardown, in the driver, and the results are already read). Once it is gone,
    the next run's child is started ahead where this process keeps one (child_process.after_run)."""
    def reap():
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            return
        after_run(device, command)

    thread = threading.Thread(target=reap, name=f"oracle-reap-{proc.pid}", daemon=True)
    with _reapers_lock:
        _reapers.append(thread)
    thread.start()


def _join_reapers() -> None:
    """Wait until the earlier runs' own children are gone (each at most KILL_GRACE_S), so that the
    next run's child never shares the GPU's memory with the last one's teardown."""
    with _reapers_lock:
        waiting, _reapers[:] = list(_reapers), []
    for thread in waiting:
        thread.join()


def _read_outputs(run_dir: Path) -> dict[str, torch.Tensor]:
    found, _ = _tensorio.read(run_dir / P.OUTPUTS)
    out = {}
    for name, (entry, data) in found.items():
        dtype = ST_TO_TORCH[entry.dtype]
        if entry.nbytes == 0:
            out[name] = torch.empty(entry.shape, dtype=dtype)
        else:
            out[name] = torch.frombuffer(bytearray(data), dtype=dtype).reshape(entry.shape)
    return out


# --------------------------------------------------------------------------- run


def _child_settings(sink: Optional[SinkRequest], timeout_s: Optional[float],
                    keep_dir: Optional[bool]) -> tuple[float, bool]:
    """The sink checked, and the child's time limit and whether to keep its run directory, from the
    arguments or their knobs (ORACLE_KERNEL_TIMEOUT_S, ORACLE_KEEP_RUN_DIR)."""
    if sink is not None and not isinstance(sink, SinkRequest):
        raise RunnerError(f"sink must be a SinkRequest, got {type(sink).__name__}")
    timeout = float(_knobs.get("ORACLE_KERNEL_TIMEOUT_S") if timeout_s is None else timeout_s)
    if not (timeout > 0 and math.isfinite(timeout)):
        raise RunnerError(f"timeout_s {timeout_s!r} must be a positive number of seconds")
    return timeout, _knobs.get("ORACLE_KEEP_RUN_DIR") if keep_dir is None else bool(keep_dir)


def run_kernel(
    cubin: Union[bytes, str, os.PathLike, BuildResult],
    entry: str,
    launch: LaunchSpec,
    tensors: Mapping[str, torch.Tensor],
    *,
    timing: Optional[Mapping[str, object]] = None,
    then: Sequence[tuple[str, LaunchSpec]] = (),
    smem_poison: Optional[int] = None,
    **child,
) -> KernelRun:
    """Run `entry` from `cubin` once with `launch` in a child process; see the module docstring.

    `child`: how the child runs (sink, timeout_s, poison_outputs, device, child_cmd, keep_dir:
    _run_child's, the same for run_library). `timing` ({"entry", "min_reps", "max_reps",
    "rse_target", "max_ms", "warmup_ms", "flush_bytes"}, all optional) times the kernel after the
    verified run, with the sink off, and checks the outputs again afterwards (KernelRun.timing).
    `then`: (entry, launch) pairs run after the first launch, in order, on the same tensors (e.g. a
    reduction kernel after the kernel that writes the partials); the sink stays set for all of them,
    and `timing` is refused with them (it times one launch).
    `smem_poison`: a 32-bit pattern the trace header's smem_prologue() fills the kernel's dynamic
    shared memory with before it runs (the cubin must be a traced build; KernelRun.smem_poison
    says how many CTAs applied it).
    Raises RunnerError for a malformed request;
    never raises for anything the kernel or the child does.
    """
    if not isinstance(entry, str) or not entry:
        raise RunnerError(f"entry {entry!r} must be the kernel's (extern \"C\" or mangled) name")
    image = _as_cubin_bytes(cubin)
    then = tuple(then)
    for i, item in enumerate(then):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and item[0]
                and isinstance(item[1], LaunchSpec)):
            raise RunnerError(f"then[{i}] must be (entry, LaunchSpec), got {item!r}")
    if smem_poison is not None and (isinstance(smem_poison, bool) or not isinstance(smem_poison, int)
                                    or not 0 <= smem_poison <= 0xFFFFFFFF):
        raise RunnerError(f"smem_poison {smem_poison!r} must be a 32-bit pattern (0 to 0xFFFFFFFF)")
    if then and timing:
        raise RunnerError("timing times one launch; this run has more than one (then)")
    dense = _check_request(launch, tensors, [spec for _, spec in then])
    roles = sequence_roles(launch, [spec for _, spec in then])
    request = {"entry": entry, "launch": launch.to_dict(), "timing": dict(timing) if timing else None,
               "smem_poison": None if smem_poison is None else {"pattern": smem_poison},
               "then": [{"entry": e, "launch": spec.to_dict()} for e, spec in then]}
    return _run_child(P.CUBIN, image, request, dense, roles, tag=entry, **child)


def run_library(
    library: Union[str, os.PathLike, BuildResult],
    call: LibraryCall,
    tensors: Mapping[str, torch.Tensor],
    *,
    timing: Optional[Mapping[str, object]] = None,
    **child,
) -> KernelRun:
    """Run a launch library's `oracle_launch` once in a child process: the child loads the shared
    library (built by harness.build.build_library), refuses one of another ABI version, fills
    oracle_trace::LaunchArgs (harness.launch_abi) from `call` over the device buffers of `tensors`
    (named as `call` names them: inputs uploaded, outputs poisoned, workspaces as given) and the
    sink's device address, calls it on a stream of its own and synchronises. A non-zero return is
    LIBRARY_ERROR (a kernel fault: KernelRun.launch_return and .launch_message say what the library
    said), a CUDA error CUDA_ERROR, a hang TIMEOUT, as for run_kernel. `timing` times the call with a
    null sink. Raises RunnerError for a malformed request."""
    if not isinstance(call, LibraryCall):
        raise RunnerError(f"call must be a LibraryCall, got {type(call).__name__}")
    path = library.cubin_path if isinstance(library, BuildResult) else library
    try:
        if isinstance(library, BuildResult):
            image = library.read()  # the bytes the build cache verified, copied as they are into the run
        else:
            image = read_bounded(path, f"launch library {path}", MAX_LIBRARY_BYTES,
                                 f"the {MAX_LIBRARY_BYTES >> 20} MiB a launch library may have", RunnerError)
    except (OSError, BuildError) as exc:
        raise RunnerError(f"cannot read launch library {path}: {exc}") from None
    if image[:4] != b"\x7fELF":
        raise RunnerError(f"launch library {path} is not a shared object (first bytes {image[:4]!r})")
    roles = call.buffers()
    missing = sorted(set(roles) - set(tensors))
    if missing:
        raise RunnerError(f"the library call names buffers {missing} that were not given; given: {sorted(tensors)}")
    unused = sorted(set(tensors) - set(roles))
    if unused:
        raise RunnerError(f"tensors {unused} are not used by the library call")
    dense = _dense(tensors)
    for t in call.tensors:
        have = TORCH_TO_ST[dense[t.buffer].dtype]
        want = ELEMENT_TYPES[t.dtype].safetensors
        if have != want:
            raise RunnerError(f"tensor {t.buffer!r} ({t.slot}) is {dense[t.buffer].dtype}, the call says {t.dtype}")
        span = 1 + sum((d - 1) * st for d, st in zip(t.shape, t.strides) if d > 0)
        if all(d > 0 for d in t.shape) and span > dense[t.buffer].numel():
            raise RunnerError(f"tensor {t.buffer!r} ({t.slot}): shape {list(t.shape)} with strides {list(t.strides)} "
                              f"reaches element {span - 1}, past its {dense[t.buffer].numel()} elements")
    request = {"entry": ENTRY_SYMBOL, "library": call.to_dict(), "timing": dict(timing) if timing else None}
    return _run_child(P.LIBRARY, image, request, dense, roles, tag=ENTRY_SYMBOL, **child)


def _run_child(image_name: str, image: bytes, request_core: dict, dense: Mapping[str, torch.Tensor],
               roles: Mapping[str, str], *, tag: str, sink: Optional[SinkRequest] = None,
               timeout_s: Optional[float] = None, poison_outputs: bool = True, device: int = 0,
               child_cmd: Optional[Sequence[str]] = None, keep_dir: Optional[bool] = None) -> KernelRun:
    """Write the run directory (the image, the inputs, request.json), run the child with the time
    limit and collect what it left. `timeout_s` (default ORACLE_KERNEL_TIMEOUT_S) bounds the child's
    whole life, start-up included. `child_cmd` replaces the child's argv prefix (the run directory is
    appended), e.g. to run it under compute-sanitizer, or a stand-in child in tests. `keep_dir`
    (default ORACLE_KEEP_RUN_DIR) keeps the run directory and reports it in KernelRun.run_dir."""
    timeout, keep = _child_settings(sink, timeout_s, keep_dir)
    _join_reapers()
    run_dir = Path(tempfile.mkdtemp(prefix="oracle-run-"))
    sink_file: Optional[Path] = None
    child: Optional[ChildProcess] = None
    proc: Optional[subprocess.Popen] = None
    reported = False  # the child said it is done and is reaped on a thread of its own
    try:
        (run_dir / image_name).write_bytes(image)
        records = {}
        for name, t in dense.items():
            records[name] = {"role": roles[name], "st_dtype": TORCH_TO_ST[t.dtype], "shape": list(t.shape),
                             "nbytes": t.numel() * t.element_size(), "torch_dtype": str(t.dtype)}
        uploads = [(n, TORCH_TO_ST[t.dtype], tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy())
                   for n, t in dense.items() if roles[n] in ("in", "inout")]
        _tensorio.write(run_dir / P.INPUTS, uploads, {"entry": tag})
        sink_doc = None
        if sink is not None:
            sink_file = _write_sink_file(run_dir, sink.init_bytes, sink.capacity)
            sink_doc = {"symbol": sink.symbol, "size": sink.capacity, "prefix": len(sink.init_bytes),
                        "max_size": sink.max_bytes, "host_mapped": sink.host_mapped, "file": str(sink_file)}
        request = {"protocol": P.PROTOCOL_VERSION, **request_core,
                   "tensors": records, "sink": sink_doc, "device": int(device),
                   "poison_outputs": bool(poison_outputs), "timeout_s": timeout}
        P.write_json_atomic(run_dir / P.REQUEST, request)

        argv = list(child_cmd if child_cmd is not None else DEFAULT_CHILD) + [str(run_dir)]
        timed_out = False
        with open(run_dir / P.STDOUT, "wb") as out, open(run_dir / P.STDERR, "wb") as err:
            child = take(device, argv[:-1])  # one started ahead for this command (harness.child_process)
            started = time.monotonic()
            if child is not None and not hand_over(child, run_dir):
                child = None
            if child is None:
                try:  # the oracle's own child says when it is done; another command is waited on to its exit
                    child = start(argv, done_pipe=child_cmd is None, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=err, cwd=str(run_dir))
                except OSError as exc:
                    return KernelRun(status=RunStatus.HARNESS_ERROR,
                                     message=f"could not start the child {argv}: {exc}", phase=None)
            proc = child.proc
            try:
                rc, reported = _wait(child, timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                rc = _kill_and_reap(proc)
        elapsed = time.monotonic() - started
        _kill_group(proc)  # stray grandchildren (and a child that said it is done, in its teardown)
        if reported or (child.done is not None and rc is not None):  # the oracle's own child
            _reap_later(proc, device, argv[:-1])
        return _collect(run_dir, rc, timed_out, timeout, elapsed, sink_file, sink, keep)
    finally:
        if child is not None:
            close_done(child)
        if proc is not None and not reported and proc.poll() is None:
            _kill_and_reap(proc)
        if sink_file is not None:
            _remove_sink(sink_file)
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def run_source(source: Union[str, os.PathLike], entry: str, launch: LaunchSpec,
               tensors: Mapping[str, torch.Tensor], *, build: Optional[Mapping[str, object]] = None,
               **run_kwargs) -> KernelRun:
    """build_cubin(source, **build) then run_kernel(...); a compile error comes back as a KernelRun
    with status BUILD_ERROR and nvcc's output as the message instead of an exception."""
    try:
        res = build_cubin(source, **dict(build or {}))
    except BuildError as exc:
        return KernelRun(status=RunStatus.BUILD_ERROR, message=str(exc))
    return run_kernel(res, entry, launch, tensors, **run_kwargs)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _phase_seconds(progress: list[dict], elapsed: float) -> dict[str, float]:
    """Seconds from each progress mark to the next, summed by phase name (a relaunch's phases add
    up); the last mark's phase runs until `elapsed`, the end of the parent's wait."""
    out: dict[str, float] = {}
    marks = [(r["phase"], r.get("t")) for r in progress if isinstance(r.get("t"), (int, float))]
    for (phase, t), (_, t_next) in zip(marks, marks[1:] + [(None, elapsed)]):
        out[phase] = out.get(phase, 0.0) + max(0.0, t_next - t)
    return out


def _ahead_record(doc) -> Optional[dict]:
    """The child's record of being started ahead, its fields checked (None when absent or malformed)."""
    if not isinstance(doc, dict):
        return None
    times = {k: doc.get(k) for k in ("context_s", "waited_s")}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in times.values()):
        return None
    return {**times, "context_held": doc.get("context_held") is True}


def _collect(run_dir: Path, rc: Optional[int], timed_out: bool, timeout: float, elapsed: float,
             sink_file: Optional[Path], sink: Optional[SinkRequest], keep: bool) -> KernelRun:
    progress = P.read_progress(run_dir)
    phases = [r["phase"] for r in progress]
    last_phase = next((p for p in reversed(phases) if p in P.PHASES), None)
    doc, why = P.read_status(run_dir)
    stderr_tail = _tail(run_dir / P.STDERR)
    stdout_tail = _tail(run_dir / P.STDOUT)

    # The sink: readable when the kernel was launched and its bytes are (or were copied) in the file.
    sink_bytes, sink_source = None, None
    if sink is not None and sink_file is not None and "launch" in phases:
        ready = [r for r in progress if r["phase"] == "sink_ready"]
        mode = ready[-1].get("sink_mode") if ready else None
        copied = any(r["phase"] == "sink_copied" for r in progress)
        if mode == P.SINK_FILE or (mode in (P.SINK_PINNED_COPY, P.SINK_DEVICE_COPY) and copied):
            try:
                sink_bytes = _read_sink(sink_file)
                sink_source = mode
            except OSError:
                pass

    common = dict(phase=last_phase, sink=sink_bytes, sink_source=sink_source, elapsed_s=elapsed,
                  returncode=rc, stderr_tail=stderr_tail, stdout_tail=stdout_tail,
                  run_dir=str(run_dir) if keep else None, phases_s=_phase_seconds(progress, elapsed))
    if doc is not None:
        status = RunStatus(doc["status"])
        outputs: dict = {}
        message = str(doc.get("message", ""))
        if timed_out:
            message = (message + "; " if message else "") + \
                f"the child reported but did not exit within {timeout:g} s and was killed"
        if status is RunStatus.OK:
            try:
                outputs = _read_outputs(run_dir) if (run_dir / P.OUTPUTS).exists() else {}
            except (_tensorio.TensorFileError, OSError, KeyError) as exc:
                status, message = RunStatus.HARNESS_ERROR, f"the child's outputs are unreadable: {exc}"
        if doc.get("traceback"):
            message = f"{message}\n{doc['traceback']}"
        try:
            breaches = breaches_of(doc.get("guard_breaches"))
        except (GuardError, TypeError) as exc:
            breaches, status = (), RunStatus.HARNESS_ERROR
            message = f"the child's guard-band records are malformed: {exc}"
        return KernelRun(status=status, message=message, error_code=doc.get("error_code"),
                         error_name=doc.get("error_name"), error_call=doc.get("error_call"),
                         outputs=outputs, kernel_s=doc.get("kernel_s"), device=doc.get("device") or {},
                         function=doc.get("function") or {}, timing=doc.get("timing"),
                         sink_overflow=doc.get("sink_overflow"), smem_poison=doc.get("smem_poison"),
                         launch_return=doc.get("launch_return"), launch_message=str(doc.get("launch_message") or ""),
                         guard_breaches=breaches, started_ahead=_ahead_record(doc.get("started_ahead")), **common)
    if timed_out:
        where = {"sync": "the kernel was still running", "launch": "the launch call did not return"}.get(
            last_phase or "", f"the child was in phase {last_phase}")
        killed = ("the child's process group was killed" if rc is not None else
                  f"the child was sent SIGKILL but had not exited {KILL_GRACE_S:g} s later")
        return KernelRun(status=RunStatus.TIMEOUT, message=f"no result within {timeout:g} s ({where}); {killed}",
                         **common)
    how = "no exit status" if rc is None else _signal_name(rc) if rc < 0 else f"exit code {rc}"
    return KernelRun(status=RunStatus.CRASHED,
                     message=f"the child died ({how}) in phase {last_phase}: {why}", **common)

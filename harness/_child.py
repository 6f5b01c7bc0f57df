"""The kernel child process: `python -m harness._child RUN_DIR`.

A launch library (request "library", kernel.so): context, the library loaded with ctypes and its
ABI checked, device buffers as below, the sink's device address and a stream of the child's own
put in oracle_trace::LaunchArgs (harness.launch_abi) -> oracle_launch(&args) -> stream and context
synchronised; a non-zero return is LIBRARY_ERROR with the library's sentence, a fault CUDA_ERROR.
The library's CUDA runtime shares the primary context this child retained, so the driver API's
device pointers are valid in it.

Data path: request.json + kernel.cubin + inputs.safetensors -> context, module, device buffers
(inputs uploaded, outputs poisoned) -> sink pointer written into the `__device__` sink symbol ->
tensor maps encoded against the device buffers -> launch -> synchronize -> outputs.safetensors and
status.json. Every phase is appended to progress.jsonl first, so a parent that has to kill a hung
child still knows how far it got.

Constraints: cuda-python only (no torch, no numpy), so start-up stays light and nothing initialises
CUDA behind our back. After a sticky error (illegal address, trap) the context is dead: the child
only records what happened and exits; the operating system reclaims the GPU state.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import stat
import struct
import sys
import time
import traceback
from pathlib import Path

from harness import _protocol as P
from harness import _tensorio
from harness import launch_abi
from harness import cuda_driver as cu
from harness import guard_bands as G
from harness.child_process import DONE_FD_VARIABLE, WAIT_FLAG
from harness.launch import KernelParams, LaunchSpec, TensorMapArg, argument_bytes
from harness.stats import Policy, percentile, relative_standard_error, stop_reason
from harness.tensormap import TensorMapError, encode

# Phases whose CUDA errors are the kernel's (or its launch's) doing.
_KERNEL_PHASES = ("launch", "sync", "download", "time")
_LOAD_PHASES = ("load",)


class _Mapped:
    """A shared, writable mmap of a file and its address, closed in order."""

    def __init__(self, path: Path, size: int):
        self._fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)  # never through a link, never a FIFO's wait
        if not stat.S_ISREG(os.fstat(self._fd).st_mode):
            os.close(self._fd)
            raise OSError(f"{path} is not a regular file")
        self.size = size
        self.mm = mmap.mmap(self._fd, max(size, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.address = ctypes.addressof(self._anchor)

    def close(self) -> None:
        del self._anchor
        self.mm.close()
        os.close(self._fd)


class _Sink:
    """The trace sink: a shared file the parent reads afterwards, made visible to the kernel as
    host-mapped memory (the file's own pages, else a pinned copy) or as device memory, and its
    address written into the kernel's sink symbol. `regrow` replaces it with a larger one holding
    the same initial bytes (header with the new capacity, pre-written records, zeros)."""

    def __init__(self, path: Path, size: int, prefix: int, host_mapped: bool, symbol: int, status: dict):
        self.path, self.size, self.host_mapped, self.symbol, self.status = path, size, host_mapped, symbol, status
        self.mem = None
        self.dev = 0
        self.map = None
        self._open()
        self.prefix = bytes(self.map.mm[:max(prefix, 512)])  # header + pre-written records, before any launch

    def _open(self) -> None:
        self.map = _Mapped(self.path, self.size)
        if self.host_mapped:
            try:
                # Whole pages: the mapping is page-aligned and covers them (older drivers insist).
                pages = -(-self.size // mmap.PAGESIZE) * mmap.PAGESIZE
                self.mem = cu.host_register_mapped(self.map.address, pages)
                self.mode, self.dev = P.SINK_FILE, self.mem.device_ptr
            except cu.CudaError as exc:
                self.status["sink_register_error"] = str(exc)
                self.mem = cu.host_alloc_mapped(self.size)
                ctypes.memmove(self.mem.host_ptr, self.map.address, self.size)
                self.mode, self.dev = P.SINK_PINNED_COPY, self.mem.device_ptr
        else:
            self.dev = cu.mem_alloc(self.size)
            cu.memcpy_htod(self.dev, self.map.address, self.size)
            self.mode = P.SINK_DEVICE_COPY
        if self.symbol is not None:  # a launch library installs the sink itself (LaunchArgs.trace_sink)
            cu.memcpy_htod(self.symbol, self.dev.to_bytes(8, "little"))

    def _close(self) -> None:
        if self.mode == P.SINK_DEVICE_COPY:
            cu.mem_free(self.dev)
        elif self.mem is not None:
            self.mem.free()
        self.mem = None
        self.map.close()

    def _header(self) -> bytes:
        if self.mode == P.SINK_DEVICE_COPY:
            buf = ctypes.create_string_buffer(32)
            cu.memcpy_dtoh_into(ctypes.addressof(buf), self.dev, 32)
            return buf.raw
        if self.mode == P.SINK_PINNED_COPY:
            return ctypes.string_at(self.mem.host_ptr, 32)
        return bytes(self.map.mm[:32])

    def dropped(self) -> int:
        return int.from_bytes(self._header()[24:28], "little")

    def needed(self) -> int:
        """Bytes a sink needs to hold every record of the last launch: header plus the cursor."""
        head = self._header()
        return int.from_bytes(head[6:8], "little") + int.from_bytes(head[16:24], "little")

    def copy_back(self, progress: P.Progress) -> None:
        if self.mode == P.SINK_PINNED_COPY:
            ctypes.memmove(self.map.address, self.mem.host_ptr, self.size)
            progress.mark("sink_copied", sink_mode=self.mode)

    def download(self, progress: P.Progress) -> None:
        if self.mode == P.SINK_DEVICE_COPY:
            cu.memcpy_dtoh_into(self.map.address, self.dev, self.size)
            progress.mark("sink_copied", sink_mode=self.mode)

    def regrow(self, size: int) -> bool:
        """A fresh sink of `size` bytes in place of this one; False (this one kept) when the file
        cannot grow. The fresh file is made beside the sink, in the private folder the parent made
        for it, under a new name (O_EXCL, O_NOFOLLOW, 0600: nothing there is opened or removed
        unless this made it), then renamed over the sink."""
        import tempfile  # only here: the child's start-up stays light

        try:
            fd, fresh = tempfile.mkstemp(prefix=self.path.name + ".grow-", dir=self.path.parent)
        except OSError as exc:
            self.status["sink_regrow_error"] = f"a {size}-byte sink could not be made: {exc}"
            return False
        try:
            try:
                os.posix_fallocate(fd, 0, size)
                head = bytearray(self.prefix)
                head[8:16] = size.to_bytes(8, "little")  # the capacity field
                os.pwrite(fd, bytes(head), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            self.status["sink_regrow_error"] = f"a {size}-byte sink could not be made: {exc}"
            os.unlink(fresh)
            return False
        self._close()
        os.replace(fresh, self.path)
        self.size = size
        self._open()
        return True


def _prepare(inputs_path: Path, tensors: dict, dptrs: dict, poison: int) -> None:
    """Inputs uploaded, outputs poisoned."""
    if inputs_path.exists() and inputs_path.stat().st_size > 0:
        entries = _tensorio.entries(inputs_path)
        src = _Mapped(inputs_path, inputs_path.stat().st_size)
        try:
            for e in entries:
                cu.memcpy_htod(dptrs[e.name], src.address + e.offset, e.nbytes)
        finally:
            src.close()
    for name, info in tensors.items():
        if info["role"] == "out":
            cu.memset_d8(dptrs[name], poison, int(info["nbytes"]))


def _allocate(tensors: dict) -> tuple[dict, dict]:
    """Device buffers by name, and {name: (base, nbytes)} of those the kernel writes ('out', 'inout'),
    each allocated inside two guard bands (harness.guard_bands): the kernel gets the interior pointer."""
    dptrs, guarded = {}, {}
    for name, info in tensors.items():
        nbytes = int(info["nbytes"])
        if info["role"] in ("out", "inout"):
            base = cu.mem_alloc(G.guarded_bytes(nbytes))
            dptrs[name], guarded[name] = base + G.GUARD_BYTES, (base, nbytes)
        else:
            dptrs[name] = cu.mem_alloc(nbytes)
    return dptrs, guarded


def _fill_guards(guarded: dict) -> None:
    for base, nbytes in guarded.values():
        cu.memset_d8(base, G.GUARD_BYTE, G.GUARD_BYTES)
        cu.memset_d8(base + G.GUARD_BYTES + nbytes, G.GUARD_BYTE, G.GUARD_BYTES)


def _check_guards(guarded: dict) -> list:
    """The guard bands read back after the launches: every breach as a record for status.json."""
    out = []
    for name, (base, nbytes) in guarded.items():
        bands = []
        for address in (base, base + G.GUARD_BYTES + nbytes):
            buf = ctypes.create_string_buffer(G.GUARD_BYTES)
            cu.memcpy_dtoh_into(ctypes.addressof(buf), address, G.GUARD_BYTES)
            bands.append(buf.raw)
        out.extend(b.to_dict() for b in G.check_bands(name, bands[0], bands[1], nbytes))
    return out


def _write_outputs(run_dir: Path, tensors: dict, dptrs: dict) -> list:
    """The 'out' and 'inout' tensors downloaded into outputs.safetensors (written whole, then renamed)."""
    out_specs = [(n, i["st_dtype"], i["shape"]) for n, i in tensors.items() if i["role"] in ("out", "inout")]
    if out_specs:
        out_path = run_dir / P.OUTPUTS
        tmp = run_dir / (P.OUTPUTS + ".tmp")
        entries = _tensorio.create(tmp, out_specs)
        total = tmp.stat().st_size
        dst = _Mapped(tmp, total)
        try:
            for e in entries:
                cu.memcpy_dtoh_into(dst.address + e.offset, dptrs[e.name], e.nbytes)
            dst.mm.flush()
        finally:
            dst.close()
        os.replace(tmp, out_path)
    return out_specs


class _LibraryError(Exception):
    """A launch library that cannot be used (LOAD_ERROR) or whose oracle_launch said no (LIBRARY_ERROR)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def _open_context(req: dict, progress: P.Progress, status: dict):
    status["phase"] = "init"
    progress.mark("init")
    cu.init()
    status["phase"] = "context"
    progress.mark("context")
    ctx = cu.Context(int(req.get("device", 0)))
    status["device"] = {"ordinal": ctx.ordinal, "name": ctx.name,
                        "compute_capability": list(ctx.compute_capability)}
    try:
        status["device"]["driver_version"] = int(cu.call("cuDriverGetVersion"))
    except cu.CudaError:
        pass
    return ctx


def _load_library(path: Path):
    """The library's oracle_launch, after its oracle_launch_abi() matched this harness's ABI."""
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise _LibraryError("LOAD_ERROR", f"the launch library could not be loaded: {exc}") from None
    for symbol in (launch_abi.ABI_SYMBOL, launch_abi.ENTRY_SYMBOL):
        if not hasattr(lib, symbol):
            raise _LibraryError("LOAD_ERROR", f"the launch library exports no {symbol}(): define extern \"C\" int "
                                f"oracle_launch(const oracle_trace::LaunchArgs*) in a file that includes "
                                f"oracle_trace/launch.hpp")
    abi = lib[launch_abi.ABI_SYMBOL]
    abi.restype, abi.argtypes = ctypes.c_uint64, []
    word, want = int(abi()), launch_abi.abi_word()
    if word != want:
        raise _LibraryError("LOAD_ERROR", f"the launch library was built against {launch_abi.describe_abi_word(word)};"
                            f" this harness speaks {launch_abi.describe_abi_word(want)}: rebuild it with this "
                            f"harness's oracle_trace/launch.hpp")
    entry = lib[launch_abi.ENTRY_SYMBOL]
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p]
    return lib, entry


def _launch_regrowing(launch_once, prepare, sink, sink_req, status, progress) -> None:
    """Launch once; when the sink, sized from an estimate, overflowed, the cursor says what every
    record needs: launch once more with a sink of that size (inputs restored, outputs poisoned again)."""
    launch_once()
    max_size = int(sink_req.get("max_size") or 0) if sink_req is not None else 0
    if sink is not None and max_size and sink.dropped():
        need = sink.needed()
        over = {"first_capacity": sink.size, "needed": need, "max_size": max_size, "relaunched": False}
        status["sink_overflow"] = over
        if need <= max_size:
            status["phase"] = "sink"
            progress.mark("sink_regrow", needed=need)
            if sink.regrow(min(max_size, -(-need // 4096) * 4096)):
                prepare()
                launch_once()
                over["relaunched"] = True
        status["sink_size"] = sink.size


def _run_library(run_dir: Path, req: dict, progress: P.Progress, status: dict) -> None:
    """A launch library's oracle_launch, called with LaunchArgs over the device buffers."""
    call = launch_abi.LibraryCall.from_dict(req["library"])
    tensors: dict = req["tensors"]
    sink_req = req.get("sink")
    _open_context(req, progress, status)

    status["phase"] = "load"
    progress.mark("load")
    _lib, entry = _load_library(run_dir / P.LIBRARY)

    status["phase"] = "alloc"
    progress.mark("alloc")
    dptrs, guarded = _allocate(tensors)
    sizes = {name: int(info["nbytes"]) for name, info in tensors.items()}
    stream = cu.stream_create()
    status["phase"] = "upload"
    progress.mark("upload")
    poison = P.POISON_BYTE if req.get("poison_outputs", True) else 0
    inputs_path = run_dir / P.INPUTS
    _prepare(inputs_path, tensors, dptrs, poison)
    _fill_guards(guarded)
    sink = None
    if sink_req is not None:
        status["phase"] = "sink"
        progress.mark("sink")
        sink = _Sink(Path(sink_req["file"]), int(sink_req["size"]), int(sink_req.get("prefix", 0)),
                     bool(sink_req.get("host_mapped", True)), None, status)
        status["sink_mode"] = sink.mode
        progress.mark("sink_ready", sink_mode=sink.mode)

    def call_once(sink_address: int) -> int:
        filled = launch_abi.fill(call, dptrs, sizes, sink=sink_address, stream=stream)
        status["phase"] = "launch"
        progress.mark("launch", index=0)
        rc = int(entry(filled.address))
        status["launch_return"] = rc
        if rc != 0:
            status["launch_message"] = filled.message()
        return rc

    def launch_once() -> None:
        try:
            t0 = time.perf_counter()
            rc = call_once(sink.dev if sink is not None else 0)
            status["phase"] = "sync"
            progress.mark("sync", index=0)
            cu.stream_synchronize(stream)  # a fault of the kernel surfaces here even after a non-zero return
            cu.synchronize()
            status["kernel_s"] = time.perf_counter() - t0
            if rc != 0:
                raise _LibraryError("LIBRARY_ERROR", f"oracle_launch returned {rc}" + (
                    f": {status['launch_message']}" if status.get("launch_message") else ""))
        finally:
            if sink is not None:
                sink.copy_back(progress)

    _launch_regrowing(launch_once, lambda: (_prepare(inputs_path, tensors, dptrs, poison), _fill_guards(guarded)),
                      sink, sink_req, status, progress)

    status["phase"] = "download"
    progress.mark("download")
    status["guard_breaches"] = _check_guards(guarded)
    if sink is not None:
        sink.download(progress)
    out_specs = _write_outputs(run_dir, tensors, dptrs)
    timing = req.get("timing")
    if timing:
        status["phase"] = "time"
        progress.mark("time")

        untraced = launch_abi.fill(call, dptrs, sizes, sink=0, stream=stream)  # a null sink: every tap is off

        def timed() -> None:
            rc = int(entry(untraced.address))
            if rc != 0:
                status["launch_return"], status["launch_message"] = rc, untraced.message()
                raise _LibraryError("LIBRARY_ERROR", f"oracle_launch returned {rc} while timed: {untraced.message()}")

        status["timing"] = _time_kernel(timed, timing, progress, stream=stream)
        status["phase"] = "time"
        if out_specs and not any(i["role"] == "inout" for i in tensors.values()):
            status["timing"]["verified_after"] = _same_outputs(run_dir / P.OUTPUTS, dptrs)
    status["status"] = "OK"
    status["phase"] = "done"
    progress.mark("done")


def _run(run_dir: Path, progress: P.Progress, status: dict) -> None:
    req = json.loads((run_dir / P.REQUEST).read_text())
    if req.get("protocol") != P.PROTOCOL_VERSION:
        raise RuntimeError(f"request protocol {req.get('protocol')!r}, this child speaks {P.PROTOCOL_VERSION}")
    if req.get("library") is not None:
        _run_library(run_dir, req, progress, status)
        return
    launch = LaunchSpec.from_dict(req["launch"])
    tensors: dict = req["tensors"]
    sink_req = req.get("sink")

    ctx = _open_context(req, progress, status)  # noqa: F841  (held: the context lives as long as the run)

    phase = status["phase"] = "load"
    progress.mark(phase)
    module = cu.Module((run_dir / P.CUBIN).read_bytes())
    func = module.function(req["entry"])
    if launch.shared_mem_bytes > 48 * 1024:
        func.set_max_dynamic_shared(launch.shared_mem_bytes)
    if launch.cluster != (1, 1, 1) and launch.cluster[0] * launch.cluster[1] * launch.cluster[2] > 8:
        func.allow_non_portable_cluster()
    sink_symbol = None
    if sink_req is not None:
        sym_ptr, sym_size = module.global_(sink_req["symbol"])
        if sym_size != 8:
            raise cu.CudaError(500, "CUDA_ERROR_NOT_FOUND",
                               f"__device__ symbol {sink_req['symbol']!r} has {sym_size} bytes; the sink symbol "
                               f"must be a pointer (8 bytes)", "cuModuleGetGlobal")
        sink_symbol = sym_ptr
    poison_req = req.get("smem_poison")
    poison_symbol = None
    if poison_req is not None:
        try:
            poison_symbol, sym_size = module.global_(P.SMEM_POISON_SYMBOL)
        except cu.CudaError as exc:
            raise cu.CudaError(exc.code, exc.name, f"the module has no __device__ symbol {P.SMEM_POISON_SYMBOL!r}: "
                               f"shared-memory poison needs the kernel built with -DORACLE_TRACE and the trace "
                               f"header included", "cuModuleGetGlobal") from None
        if sym_size != 16:
            raise cu.CudaError(500, "CUDA_ERROR_NOT_FOUND", f"__device__ symbol {P.SMEM_POISON_SYMBOL!r} has "
                               f"{sym_size} bytes, not the header's 16", "cuModuleGetGlobal")
    status["function"] = {"num_regs": func.attribute("CU_FUNC_ATTRIBUTE_NUM_REGS"),
                          "static_shared_bytes": func.attribute("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
                          "local_bytes": func.attribute("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES")}

    phase = status["phase"] = "alloc"
    progress.mark(phase)
    dptrs, guarded = _allocate(tensors)

    phase = status["phase"] = "upload"
    progress.mark(phase)
    inputs_path = run_dir / P.INPUTS
    poison = P.POISON_BYTE if req.get("poison_outputs", True) else 0

    def prepare_tensors() -> None:
        """Inputs uploaded, outputs poisoned: before the launch, and again before a relaunch."""
        _prepare(inputs_path, tensors, dptrs, poison)
        _fill_guards(guarded)
        if poison_symbol is not None:  # {enabled, pattern, CTAs that applied it, 0}
            cu.memcpy_htod(poison_symbol, struct.pack("<4I", 1, int(poison_req["pattern"]) & 0xFFFFFFFF, 0, 0))

    prepare_tensors()
    sink = None
    if sink_req is not None:
        phase = status["phase"] = "sink"
        progress.mark(phase)
        sink = _Sink(Path(sink_req["file"]), int(sink_req["size"]), int(sink_req.get("prefix", 0)),
                     bool(sink_req.get("host_mapped", True)), sink_symbol, status)
        status["sink_mode"] = sink.mode
        progress.mark("sink_ready", sink_mode=sink.mode)

    phase = status["phase"] = "encode"
    progress.mark(phase)

    def packed(spec: LaunchSpec) -> KernelParams:
        maps = [encode(a.spec, dptrs[a.tensor_name]) for a in spec.args if isinstance(a, TensorMapArg)]
        return KernelParams(argument_bytes(spec, dptrs, maps))

    # the first launch, then any later ones ([[launch.next]]), in order, on the same buffers
    sequence = [(func, launch, packed(launch))]
    for item in req.get("then") or []:
        nxt = LaunchSpec.from_dict(item["launch"])
        fn = module.function(item["entry"])
        if nxt.shared_mem_bytes > 48 * 1024:
            fn.set_max_dynamic_shared(nxt.shared_mem_bytes)
        sequence.append((fn, nxt, packed(nxt)))
    params = sequence[0][2]

    def launch_once() -> None:
        try:
            t0 = time.perf_counter()
            for i, (fn, spec, par) in enumerate(sequence):
                status["phase"] = "launch"
                progress.mark("launch", index=i)
                cu.launch(fn, spec.grid, spec.block, spec.shared_mem_bytes, par.address, cluster=spec.cluster)
                status["phase"] = "sync"
                progress.mark("sync", index=i)
                cu.synchronize()
            status["kernel_s"] = time.perf_counter() - t0
        finally:
            if sink is not None:
                sink.copy_back(progress)

    _launch_regrowing(launch_once, prepare_tensors, sink, sink_req, status, progress)

    phase = status["phase"] = "download"
    progress.mark(phase)
    status["guard_breaches"] = _check_guards(guarded)
    if poison_symbol is not None:
        buf = ctypes.create_string_buffer(16)
        cu.memcpy_dtoh_into(ctypes.addressof(buf), poison_symbol, 16)
        _, pattern, ctas, _ = struct.unpack("<4I", buf.raw)
        status["smem_poison"] = {"pattern": pattern, "ctas": ctas}
    if sink is not None:
        sink.download(progress)
    out_specs = _write_outputs(run_dir, tensors, dptrs)
    timing = req.get("timing")
    if timing:
        phase = status["phase"] = "time"
        progress.mark(phase)
        fn = module.function(timing["entry"]) if timing.get("entry") else func
        if timing.get("entry") and launch.shared_mem_bytes > 48 * 1024:
            fn.set_max_dynamic_shared(launch.shared_mem_bytes)
        if sink_symbol is not None:
            cu.memcpy_htod(sink_symbol, bytes(8))  # a null sink: every tap is off while timing
        status["timing"] = _time_kernel(
            lambda: cu.launch(fn, launch.grid, launch.block, launch.shared_mem_bytes, params.address,
                              cluster=launch.cluster), timing, progress)
        if out_specs and not any(i["role"] == "inout" for i in tensors.values()):
            # verification after timing: the reps must reproduce the verified output
            status["timing"]["verified_after"] = _same_outputs(run_dir / P.OUTPUTS, dptrs)
    status["status"] = "OK"
    status["phase"] = "done"
    progress.mark("done")


def _time_kernel(launch_once, timing: dict, progress: P.Progress, stream: int = 0) -> dict:
    """Device-event timing of the kernel under test, the same rule as oracle.run.timing: warm-up,
    the L2 flushed before every rep (outside the timed region), adaptive stop on the relative
    standard error of the median (harness.stats)."""
    policy = Policy(warmup_ms=float(timing.get("warmup_ms", 25.0)), min_reps=int(timing.get("min_reps", 10)),
                    max_reps=int(timing.get("max_reps", 500)), rse_target=float(timing.get("rse_target", 0.02)),
                    max_ms=float(timing.get("max_ms", 2000.0)))
    flush_bytes = int(timing.get("flush_bytes", 0))
    flush = cu.mem_alloc(flush_bytes) if flush_bytes else None
    start, stop = cu.event_create(), cu.event_create()

    def rep() -> float:
        if flush is not None:
            cu.memset_d8(flush, 0, flush_bytes)
        cu.event_record(start, stream)
        launch_once()
        cu.event_record(stop, stream)
        return cu.event_elapsed_ms(start, stop)

    try:
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < policy.warmup_ms:
            rep()
        samples: list[float] = []
        t0 = time.perf_counter()
        reason = None
        while reason is None:
            samples.append(rep())
            reason = stop_reason(len(samples), relative_standard_error(samples),
                                 (time.perf_counter() - t0) * 1e3, policy)
        cu.synchronize()
    finally:
        cu.event_destroy(start)
        cu.event_destroy(stop)
        if flush is not None:
            cu.mem_free(flush)
    s = sorted(samples)
    progress.mark("timed", reps=len(s))
    return {"mode": "events", "cold_l2": flush is not None, "reps": len(s), "stop": reason,
            "median_ms": percentile(s, 0.5), "p10_ms": percentile(s, 0.1), "p90_ms": percentile(s, 0.9),
            "min_ms": s[0], "rse": relative_standard_error(s), "samples_ms": samples}


def _same_outputs(outputs_path: Path, dptrs: dict) -> bool:
    """Download the outputs again and compare them byte for byte with the verified ones."""
    size = outputs_path.stat().st_size
    ref = _Mapped(outputs_path, size)
    try:
        for e in _tensorio.entries(outputs_path):
            buf = ctypes.create_string_buffer(e.nbytes)
            cu.memcpy_dtoh_into(ctypes.addressof(buf), dptrs[e.name], e.nbytes)
            if buf.raw != ref.mm[e.offset:e.offset + e.nbytes]:
                return False
    finally:
        ref.close()
    return True


def _wait_for_run(device: str) -> Path:
    """A pre-started child (harness.child_process): CUDA up and the device's primary context
    retained (kept for the run, which retains it again), then the run directory from stdin; its
    stdout and stderr files become this process's. Exits at end-of-file (no run came)."""
    global _held_context, _ahead
    t0 = time.monotonic()
    try:
        cu.init()
        _held_context = cu.Context(int(device))
    except Exception:  # the run meets the same failure and reports it in its own files
        pass
    ready = time.monotonic()
    line = sys.stdin.buffer.readline().rstrip(b"\n")
    if not line:
        os._exit(0)
    _ahead = {"context_s": round(ready - t0, 6), "waited_s": round(time.monotonic() - ready, 6),
              "context_held": _held_context is not None}
    run_dir = Path(os.fsdecode(line))
    for fd, name in ((1, P.STDOUT), (2, P.STDERR)):
        f = os.open(run_dir / name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(run_dir)
    return run_dir


_held_context = None
_ahead = None  # a child started ahead: its CUDA set-up's seconds and how long it then waited for its run


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == WAIT_FLAG:
        run_dir = _wait_for_run(argv[1])
    elif len(argv) == 1:
        run_dir = Path(argv[0])
    else:
        print("usage: python -m harness._child RUN_DIR | --wait DEVICE", file=sys.stderr)
        return 2
    progress = P.Progress(run_dir)
    progress.mark("start", pid=os.getpid())
    status: dict = {"status": "HARNESS_ERROR", "phase": "start", "pid": os.getpid(), "started_ahead": _ahead}
    t0 = time.monotonic()
    try:
        _run(run_dir, progress, status)
    except cu.CudaError as exc:
        phase = status.get("phase", "start")
        if phase in _KERNEL_PHASES:
            status["status"] = "CUDA_ERROR"
        elif phase in _LOAD_PHASES:
            status["status"] = "LOAD_ERROR"
        else:
            status["status"] = "SETUP_ERROR"
        status.update(error_code=exc.code, error_name=exc.name, error_call=exc.call, sticky=exc.sticky,
                      message=f"{exc} (phase {phase})")
    except TensorMapError as exc:
        status.update(status="SETUP_ERROR", message=f"tensor map rejected: {exc}")
    except _LibraryError as exc:
        status.update(status=exc.status, message=f"{exc} (phase {status.get('phase', 'start')})")
    except Exception as exc:  # a harness defect or a broken request: report it, do not crash
        status.update(status="HARNESS_ERROR", message=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc())
    status["child_s"] = time.monotonic() - t0
    status["torch_imported"] = "torch" in sys.modules
    P.write_json_atomic(run_dir / P.STATUS, status)
    progress.mark("exit", status=status["status"])
    progress.close()
    sys.stdout.flush()
    sys.stderr.flush()
    _say_done()
    # Skip interpreter teardown: after a sticky error, driver clean-up at exit can take long or crash;
    # everything that matters is on disk.
    os._exit(0)


def _say_done() -> None:
    """One byte on the done pipe (harness.child_process), if the parent gave one: everything this
    child reports is on disk, and what is left is the process's teardown."""
    try:
        os.write(int(os.environ[DONE_FD_VARIABLE]), b"\n")
    except (KeyError, ValueError, OSError):
        pass


if __name__ == "__main__":
    main(sys.argv[1:])

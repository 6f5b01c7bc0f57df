"""Checked wrappers over `cuda.bindings.driver`: every call's CUresult is checked, failures raise
CudaError(code, name, message, call).

Data path: primary context -> module from cubin bytes -> function / `__device__` globals ->
device and host-mapped memory -> launch (plain or with a cluster) -> synchronize. A stream of its
own for a launch library, whose CUDA runtime uses the same primary context.

Constraints: `cuda.bindings` is imported on first use, so importing this module never needs a GPU,
a driver or even cuda-bindings; without a driver every call raises CudaError named
CUDA_DRIVER_UNAVAILABLE. Pointers are plain ints. Errors 700 and 710-719 are sticky: the context is
dead after them (`CudaError.sticky`), only host memory stays readable. No torch here: the kernel
child process imports this module and stays light.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Optional, Sequence, Union

# Codes with a name and a sentence, for messages that do not depend on a working driver.
ERROR_TEXT: dict[int, tuple[str, str]] = {
    1: ("CUDA_ERROR_INVALID_VALUE", "an argument of the call is out of range"),
    2: ("CUDA_ERROR_OUT_OF_MEMORY", "the allocation does not fit in device memory"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "cuInit has not been called"),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is visible"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "the device ordinal is not valid"),
    200: ("CUDA_ERROR_INVALID_IMAGE", "the module image is not a valid cubin"),
    209: ("CUDA_ERROR_NO_BINARY_FOR_GPU", "the cubin was built for another GPU architecture"),
    222: ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the PTX needs a newer driver"),
    500: ("CUDA_ERROR_NOT_FOUND", "no kernel or symbol of that name in the module"),
    700: ("CUDA_ERROR_ILLEGAL_ADDRESS", "the kernel accessed an illegal memory address"),
    701: ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many registers or threads for this launch"),
    702: ("CUDA_ERROR_LAUNCH_TIMEOUT", "the kernel ran past the display watchdog"),
    709: ("CUDA_ERROR_CONTEXT_IS_DESTROYED", "the context was destroyed"),
    710: ("CUDA_ERROR_ASSERT", "a device-side assert failed"),
    714: ("CUDA_ERROR_HARDWARE_STACK_ERROR", "call stack corruption or overflow in the kernel"),
    715: ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "the kernel executed an illegal instruction"),
    716: ("CUDA_ERROR_MISALIGNED_ADDRESS", "the kernel accessed a misaligned address"),
    717: ("CUDA_ERROR_INVALID_ADDRESS_SPACE", "an instruction used an address of the wrong state space"),
    718: ("CUDA_ERROR_INVALID_PC", "the kernel's program counter became invalid"),
    719: ("CUDA_ERROR_LAUNCH_FAILED", "the kernel failed (trap or other exception)"),
    720: ("CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks for a cooperative launch"),
    999: ("CUDA_ERROR_UNKNOWN", "unknown error"),
}
# Errors after which the context can do nothing more.
STICKY_ERRORS = frozenset({700, 710, 714, 715, 716, 717, 718, 719})

DRIVER_UNAVAILABLE = -1  # pseudo code: libcuda (or cuda-bindings) could not be loaded

TENSOR_MAP_BYTES = 128


class CudaError(RuntimeError):
    """A driver call returned an error (or the driver could not be loaded: code -1)."""

    def __init__(self, code: int, name: str, message: str, call: str):
        self.code = int(code)
        self.name = name
        self.message = message
        self.call = call
        super().__init__(f"{call} failed: {name} ({self.code}): {message}")

    @property
    def sticky(self) -> bool:
        """True when the context is unusable after this error."""
        return self.code in STICKY_ERRORS


_DRV = None


def _drv():
    global _DRV
    if _DRV is None:
        try:
            import cuda.bindings.driver as drv
        except ImportError as exc:
            raise CudaError(DRIVER_UNAVAILABLE, "CUDA_PYTHON_UNAVAILABLE",
                            f"cuda-bindings is not installed ({exc}); pip install cuda-bindings",
                            "import cuda.bindings.driver") from None
        _DRV = drv
    return _DRV


def error_name(code: int) -> str:
    code = int(code)
    if code == DRIVER_UNAVAILABLE:
        return "CUDA_DRIVER_UNAVAILABLE"
    try:
        return _drv().CUresult(code).name
    except Exception:
        return ERROR_TEXT.get(code, (f"CUDA_ERROR_{code}", ""))[0]


def error_message(code: int) -> str:
    code = int(code)
    try:
        drv = _drv()
        err, text = drv.cuGetErrorString(drv.CUresult(code))
        if int(err) == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        pass
    return ERROR_TEXT.get(code, ("", "unknown CUDA error"))[1]


def _is_driver_missing(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return ("notfound" in text.replace(" ", "") or "libcuda" in text or "dlopen" in text
            or "nvidia display driver" in text)


def call(fn_name: str, *args):
    """Call `cuda.bindings.driver.<fn_name>(*args)` and check its CUresult. Returns None, the single
    result, or a tuple of results."""
    drv = _drv()
    fn = getattr(drv, fn_name)
    try:
        out = fn(*args)
    except Exception as exc:
        if _is_driver_missing(exc):
            raise CudaError(DRIVER_UNAVAILABLE, "CUDA_DRIVER_UNAVAILABLE",
                            f"the CUDA driver library could not be loaded: {exc}", fn_name) from None
        raise
    if not isinstance(out, tuple):
        out = (out,)
    code = int(out[0])
    if code != 0:
        raise CudaError(code, error_name(code), error_message(code), fn_name)
    rest = out[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _int(handle) -> int:
    """A driver handle or pointer as an int (CUdeviceptr and friends convert with int())."""
    if isinstance(handle, int):
        return handle
    try:
        return int(handle)
    except TypeError:
        return int(handle.getPtr())


_initialised = False


def init() -> None:
    global _initialised
    if not _initialised:
        call("cuInit", 0)
        _initialised = True


def device_count() -> int:
    init()
    return int(call("cuDeviceGetCount"))


# --------------------------------------------------------------------------- context


class Context:
    """The primary context of one device, made current. Use as a context manager or close()."""

    def __init__(self, device: int = 0):
        init()
        self.ordinal = device
        self.device = call("cuDeviceGet", device)
        self.handle = call("cuDevicePrimaryCtxRetain", self.device)
        self._open = True
        call("cuCtxSetCurrent", self.handle)

    @property
    def name(self) -> str:
        raw = call("cuDeviceGetName", 256, self.device)
        raw = raw if isinstance(raw, bytes) else bytes(raw)
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def attribute(self, attr_name: str) -> int:
        drv = _drv()
        return int(call("cuDeviceGetAttribute", getattr(drv.CUdevice_attribute, attr_name), self.device))

    @property
    def compute_capability(self) -> tuple[int, int]:
        return (self.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                self.attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))

    def synchronize(self) -> None:
        synchronize()

    def close(self) -> None:
        if self._open:
            self._open = False
            call("cuDevicePrimaryCtxRelease", self.device)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        except CudaError:
            if exc[0] is None:
                raise


def synchronize() -> None:
    """cuCtxSynchronize; a kernel fault surfaces here as CudaError (700 illegal address, 719 trap...)."""
    call("cuCtxSynchronize")


def stream_create(non_blocking: bool = True) -> int:
    """A new stream of the current context, as an int handle (a CUstream is a cudaStream_t too: a
    launch library's runtime takes it as is)."""
    drv = _drv()
    flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else drv.CUstream_flags.CU_STREAM_DEFAULT
    return _int(call("cuStreamCreate", int(flags)))


def stream_synchronize(stream: int) -> None:
    """cuStreamSynchronize; a fault of work on the stream surfaces here as CudaError."""
    call("cuStreamSynchronize", stream)


# --------------------------------------------------------------------------- modules


@dataclass
class Function:
    handle: object
    name: str

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        drv = _drv()
        call("cuFuncSetAttribute", self.handle,
             drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))

    def attribute(self, attr_name: str) -> int:
        drv = _drv()
        return int(call("cuFuncGetAttribute", getattr(drv.CUfunction_attribute, attr_name), self.handle))

    def allow_non_portable_cluster(self) -> None:
        drv = _drv()
        call("cuFuncSetAttribute", self.handle,
             drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)


class Module:
    """A module loaded from cubin (or fatbin) bytes into the current context."""

    def __init__(self, image: bytes):
        self._image = bytes(image)  # kept alive for the duration of the call
        self.handle = call("cuModuleLoadData", self._image)

    def function(self, name: str) -> Function:
        try:
            handle = call("cuModuleGetFunction", self.handle, name.encode())
        except CudaError as exc:
            if exc.code == 500:
                raise CudaError(exc.code, exc.name, f"no kernel named {name!r} in the module (an extern \"C\" "
                                f"kernel keeps its name; a C++ one needs its mangled name)", exc.call) from None
            raise
        return Function(handle, name)

    def global_(self, name: str) -> tuple[int, int]:
        """(device address, size in bytes) of a `__device__` variable."""
        try:
            dptr, size = call("cuModuleGetGlobal", self.handle, name.encode())
        except CudaError as exc:
            if exc.code == 500:
                raise CudaError(exc.code, exc.name, f"no __device__ symbol named {name!r} in the module "
                                f"(one inside a C++ namespace is found only by its mangled name)",
                                exc.call) from None
            raise
        return _int(dptr), int(size)

    def write_global(self, name: str, data: bytes) -> None:
        dptr, size = self.global_(name)
        if len(data) != size:
            raise ValueError(f"__device__ symbol {name!r} has {size} bytes, got {len(data)} to write")
        memcpy_htod(dptr, data)

    def read_global(self, name: str) -> bytes:
        dptr, size = self.global_(name)
        return memcpy_dtoh(dptr, size)

    def unload(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            call("cuModuleUnload", handle)


# --------------------------------------------------------------------------- memory

BytesLike = Union[bytes, bytearray, memoryview]


def mem_alloc(nbytes: int) -> int:
    return _int(call("cuMemAlloc", max(int(nbytes), 1)))


def mem_free(dptr: int) -> None:
    call("cuMemFree", dptr)


def memcpy_htod(dptr: int, src: Union[BytesLike, int], nbytes: Optional[int] = None) -> None:
    """Copy host -> device. `src` is bytes-like, or a host address (int) with `nbytes`."""
    if isinstance(src, int):
        if nbytes is None:
            raise ValueError("memcpy_htod from a host address needs nbytes")
        if nbytes:
            call("cuMemcpyHtoD", dptr, src, int(nbytes))
        return
    view = memoryview(src).cast("B")
    n = len(view) if nbytes is None else int(nbytes)
    if n:
        buf = ctypes.create_string_buffer(view.tobytes()[:n], n)
        call("cuMemcpyHtoD", dptr, ctypes.addressof(buf), n)


def memcpy_dtoh(dptr: int, nbytes: int) -> bytes:
    buf = ctypes.create_string_buffer(max(int(nbytes), 1))
    if nbytes:
        call("cuMemcpyDtoH", ctypes.addressof(buf), dptr, int(nbytes))
    return buf.raw[:nbytes]


def memcpy_dtoh_into(host_address: int, dptr: int, nbytes: int) -> None:
    if nbytes:
        call("cuMemcpyDtoH", host_address, dptr, int(nbytes))


def memset_d8(dptr: int, value: int, nbytes: int) -> None:
    if nbytes:
        call("cuMemsetD8", dptr, int(value) & 0xFF, int(nbytes))


@dataclass
class HostMapped:
    """Pinned host memory mapped into the device's address space."""

    host_ptr: int
    device_ptr: int
    nbytes: int
    registered: bool  # True: an existing range registered with cuMemHostRegister

    def read(self) -> bytes:
        return ctypes.string_at(self.host_ptr, self.nbytes)

    def write(self, data: bytes) -> None:
        if len(data) > self.nbytes:
            raise ValueError(f"{len(data)} bytes do not fit in a {self.nbytes}-byte host mapping")
        ctypes.memmove(self.host_ptr, data, len(data))

    def free(self) -> None:
        if self.registered:
            call("cuMemHostUnregister", self.host_ptr)
        else:
            call("cuMemFreeHost", self.host_ptr)


def host_alloc_mapped(nbytes: int) -> HostMapped:
    """cuMemHostAlloc(DEVICEMAP | PORTABLE) + its device address."""
    drv = _drv()
    flags = int(drv.CU_MEMHOSTALLOC_DEVICEMAP) | int(drv.CU_MEMHOSTALLOC_PORTABLE)
    host = _int(call("cuMemHostAlloc", int(nbytes), flags))
    dev = _int(call("cuMemHostGetDevicePointer", host, 0))
    return HostMapped(host, dev, int(nbytes), registered=False)


def host_register_mapped(host_ptr: int, nbytes: int) -> HostMapped:
    """Page-lock an existing host range (e.g. a shared file mapping) and map it for the device."""
    drv = _drv()
    flags = int(drv.CU_MEMHOSTREGISTER_DEVICEMAP) | int(drv.CU_MEMHOSTREGISTER_PORTABLE)
    call("cuMemHostRegister", host_ptr, int(nbytes), flags)
    try:
        dev = _int(call("cuMemHostGetDevicePointer", host_ptr, 0))
    except CudaError:
        call("cuMemHostUnregister", host_ptr)
        raise
    return HostMapped(host_ptr, dev, int(nbytes), registered=True)


# --------------------------------------------------------------------------- launch


def launch(function: Function, grid: Sequence[int], block: Sequence[int], shared_mem_bytes: int,
           params_address: int, *, cluster: Optional[Sequence[int]] = None, stream: int = 0) -> None:
    """Launch `function`. `params_address` is the address of a `void*[n]` array of pointers to each
    argument's bytes (launch.KernelParams.address), 0 for a kernel without parameters. A cluster
    other than (1, 1, 1) launches through cuLaunchKernelEx with a cluster-dimension attribute."""
    gx, gy, gz = (int(v) for v in grid)
    bx, by, bz = (int(v) for v in block)
    params = int(params_address) or None
    if cluster is None or tuple(cluster) == (1, 1, 1):
        call("cuLaunchKernel", function.handle, gx, gy, gz, bx, by, bz, int(shared_mem_bytes), stream,
             params, 0)
        return
    drv = _drv()
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = (int(v) for v in cluster)
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
    config.sharedMemBytes = int(shared_mem_bytes)
    config.hStream = stream
    config.attrs = [attr]
    config.numAttrs = 1
    call("cuLaunchKernelEx", config, function.handle, params, 0)


# --------------------------------------------------------------------------- tensor maps


def encode_tensor_map_tiled(data_type: int, global_address: int, global_dims: Sequence[int],
                            global_strides: Sequence[int], box_dims: Sequence[int],
                            element_strides: Sequence[int], interleave: int, swizzle: int,
                            l2_promotion: int, oob_fill: int) -> bytes:
    """cuTensorMapEncodeTiled with enum values given as ints; the 128-byte CUtensorMap. The binding
    wants its arrays as cuuint64_t / cuuint32_t objects (plain ints raise TypeError); a value too
    large for those types raises OverflowError before the driver is called."""
    drv = _drv()
    init()
    rank = len(global_dims)
    tmap = call(
        "cuTensorMapEncodeTiled",
        drv.CUtensorMapDataType(data_type), rank, global_address,
        [drv.cuuint64_t(int(v)) for v in global_dims], [drv.cuuint64_t(int(v)) for v in global_strides],
        [drv.cuuint32_t(int(v)) for v in box_dims], [drv.cuuint32_t(int(v)) for v in element_strides],
        drv.CUtensorMapInterleave(interleave), drv.CUtensorMapSwizzle(swizzle),
        drv.CUtensorMapL2promotion(l2_promotion), drv.CUtensorMapFloatOOBfill(oob_fill),
    )
    return ctypes.string_at(_int(tmap.getPtr()), TENSOR_MAP_BYTES)


# --------------------------------------------------------------------------- events


def event_create():
    """A CUDA event with timing enabled."""
    return call("cuEventCreate", 0)


def event_record(event, stream: int = 0) -> None:
    call("cuEventRecord", event, stream)


def event_elapsed_ms(start, end) -> float:
    """Milliseconds between two recorded events (waits for `end`)."""
    call("cuEventSynchronize", end)
    return float(call("cuEventElapsedTime", start, end))


def event_destroy(event) -> None:
    call("cuEventDestroy", event)

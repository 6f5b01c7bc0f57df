"""Every driver call the harness makes, issued through the real cuda.bindings with the argument
types the wrappers use. cuda.bindings converts arguments to C before it loads libcuda, so without a
driver a well-typed call fails with CUDA_DRIVER_UNAVAILABLE and a badly typed one with TypeError:
this catches binding-signature slips on the CPU tier instead of on the GPU."""

import ctypes

import pytest

from harness import cuda_driver as cu
from harness.launch import KernelParams

drv = pytest.importorskip("cuda.bindings.driver")


def _driver_works() -> bool:
    try:
        return int(drv.cuInit(0)[0]) == 0
    except Exception:
        return False


pytestmark = pytest.mark.skipif(_driver_works(), reason="A CUDA driver is present; these checks need its absence.")

HOST = ctypes.create_string_buffer(4096)
HOST_ADDR = ctypes.addressof(HOST)
DEV = 0x7F0000000000


def _module():
    m = cu.Module.__new__(cu.Module)
    m.handle = drv.CUmodule()
    return m


CALLS = {
    "cuInit": lambda: cu.call("cuInit", 0),
    "cuDeviceGet": lambda: cu.call("cuDeviceGet", 0),
    "cuDeviceGetCount": lambda: cu.call("cuDeviceGetCount"),
    "cuDevicePrimaryCtxRetain": lambda: cu.call("cuDevicePrimaryCtxRetain", drv.CUdevice(0)),
    "cuCtxSetCurrent": lambda: cu.call("cuCtxSetCurrent", drv.CUcontext()),
    "cuDeviceGetName": lambda: cu.call("cuDeviceGetName", 256, drv.CUdevice(0)),
    "cuDeviceGetAttribute": lambda: cu.call(
        "cuDeviceGetAttribute", drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, drv.CUdevice(0)),
    "cuDriverGetVersion": lambda: cu.call("cuDriverGetVersion"),
    "cuDevicePrimaryCtxRelease": lambda: cu.call("cuDevicePrimaryCtxRelease", drv.CUdevice(0)),
    "cuCtxSynchronize": cu.synchronize,
    "cuModuleLoadData": lambda: cu.Module(b"\x7fELF" + bytes(60)),
    "cuModuleGetFunction": lambda: _module().function("k"),
    "cuModuleGetGlobal": lambda: _module().global_("oracle_trace_sink"),
    "cuModuleUnload": lambda: _module().unload(),
    "cuFuncSetAttribute": lambda: cu.Function(drv.CUfunction(), "k").set_max_dynamic_shared(100_000),
    "cuFuncSetAttribute(cluster)": lambda: cu.Function(drv.CUfunction(), "k").allow_non_portable_cluster(),
    "cuFuncGetAttribute": lambda: cu.Function(drv.CUfunction(), "k").attribute("CU_FUNC_ATTRIBUTE_NUM_REGS"),
    "cuMemAlloc": lambda: cu.mem_alloc(64),
    "cuMemFree": lambda: cu.mem_free(DEV),
    "cuMemcpyHtoD(bytes)": lambda: cu.memcpy_htod(DEV, b"abcd"),
    "cuMemcpyHtoD(address)": lambda: cu.memcpy_htod(DEV, HOST_ADDR, 16),
    "cuMemcpyDtoH": lambda: cu.memcpy_dtoh(DEV, 16),
    "cuMemcpyDtoH(into)": lambda: cu.memcpy_dtoh_into(HOST_ADDR, DEV, 16),
    "cuMemsetD8": lambda: cu.memset_d8(DEV, 0xFF, 16),
    "cuMemHostAlloc": lambda: cu.host_alloc_mapped(4096),
    "cuMemHostRegister": lambda: cu.host_register_mapped(HOST_ADDR, 4096),
    "cuMemHostGetDevicePointer": lambda: cu.call("cuMemHostGetDevicePointer", HOST_ADDR, 0),
    "cuMemHostUnregister": lambda: cu.call("cuMemHostUnregister", HOST_ADDR),
    "cuMemFreeHost": lambda: cu.call("cuMemFreeHost", HOST_ADDR),
    "cuLaunchKernel": lambda: cu.launch(cu.Function(drv.CUfunction(), "k"), (2, 1, 1), (32, 1, 1), 0,
                                        KernelParams([b"\0" * 8]).address),
    "cuLaunchKernel(no params)": lambda: cu.launch(cu.Function(drv.CUfunction(), "k"), (1, 1, 1), (32, 1, 1), 0, 0),
    "cuLaunchKernelEx": lambda: cu.launch(cu.Function(drv.CUfunction(), "k"), (4, 1, 1), (32, 1, 1), 1024,
                                          KernelParams([b"\0" * 128]).address, cluster=(2, 1, 1)),
    "cuGetErrorString": lambda: cu.call("cuGetErrorString", drv.CUresult(700)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_call_is_well_typed(name, monkeypatch):
    monkeypatch.setattr(cu, "_initialised", True)
    with pytest.raises(cu.CudaError) as info:
        CALLS[name]()
    assert info.value.code == cu.DRIVER_UNAVAILABLE, info.value


def test_tensor_map_encode_is_well_typed(monkeypatch):
    from harness.tensormap import encode, operand_tensormap

    monkeypatch.setattr(cu, "_initialised", True)
    spec = operand_tensormap("b", "col", 512, 256, "e4m3", block_mn=128, block_k=128, swizzle=128)
    with pytest.raises(cu.CudaError) as info:
        encode(spec, DEV)
    assert info.value.code == cu.DRIVER_UNAVAILABLE

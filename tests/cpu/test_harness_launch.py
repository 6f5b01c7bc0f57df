"""LaunchSpec validation, its JSON form, argument packing for cuLaunchKernel, and the checked driver
wrappers driven through a stand-in driver module (no GPU)."""

import ctypes
import struct
import types

import pytest

from cuda_tools import cuda_driver_works  # tests/ on sys.path
from harness import cuda_driver as cu
from harness.launch import (KernelParams, LaunchError, LaunchSpec, ScalarArg, StructArg, TensorArg,
                            TensorMapArg, argument_bytes)
from harness.tensormap import operand_tensormap

MAP = operand_tensormap("a", "row", 128, 256, "bf16", block_mn=64, block_k=64)


def full_spec():
    return LaunchSpec(grid=(4, 2), block=128, shared_mem_bytes=100 * 1024, cluster=(2, 1, 1), args=[
        TensorArg("a"), TensorArg("c", "out"), TensorMapArg("a", MAP), ScalarArg(7), ScalarArg(-3, "i64"),
        ScalarArg(2**32 - 1, "u32"), ScalarArg(0.5, "f32"), ScalarArg(1e300, "f64"), StructArg(b"\x01\x02\x03"),
        TensorMapArg("b", MAP)])


def test_dims_are_normalised_and_roles_collected():
    s = full_spec()
    assert s.grid == (4, 2, 1) and s.block == (128, 1, 1) and s.cluster == (2, 1, 1)
    assert isinstance(s.args, tuple)
    assert s.tensor_roles() == {"a": "in", "c": "out", "b": "in"}


def test_json_round_trip():
    s = full_spec()
    assert LaunchSpec.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("kwargs,match", [
    (dict(grid=(0, 1, 1), block=32), "grid.x = 0"),
    (dict(grid=(1, 65536), block=32), "grid.y"),
    (dict(grid=1, block=(32, 32, 2)), "2048 threads"),
    (dict(grid=1, block=(1, 1, 65)), "block.z"),
    (dict(grid=1, block=32, shared_mem_bytes=228 * 1024), "shared_mem_bytes"),
    (dict(grid=3, block=32, cluster=2), "not a multiple of cluster.x"),
    (dict(grid=32, block=32, cluster=(4, 4, 2)), "32 blocks"),
    (dict(grid=(1.5,), block=32), "grid"),
    (dict(grid=1, block=32, args=[TensorArg("x"), TensorArg("x", "out")]), "passed twice"),
    (dict(grid=1, block=32, args=["x"]), "args\\[0\\] is a str"),
])
def test_launch_spec_rejects(kwargs, match):
    with pytest.raises(LaunchError, match=match):
        LaunchSpec(**kwargs)


@pytest.mark.parametrize("make,match", [
    (lambda: TensorArg("a b"), "identifier"),
    (lambda: TensorArg("a", "output"), "role"),
    (lambda: ScalarArg(1, "i16"), "ctype"),
    (lambda: ScalarArg(2**31), "does not fit i32"),
    (lambda: ScalarArg(-1, "u32"), "does not fit u32"),
    (lambda: ScalarArg(1.5, "i32"), "needs an int"),
    (lambda: ScalarArg(True), "bool"),
    (lambda: ScalarArg(1e39, "f32"), "overflows f32"),
    (lambda: StructArg(b""), "non-empty"),
    (lambda: TensorMapArg("a", {"dtype": "bf16"}), "TensorMapSpec"),
])
def test_argument_rejects(make, match):
    with pytest.raises(LaunchError, match=match):
        make()


def test_argument_bytes_and_params_array():
    s = full_spec()
    maps = [bytes(range(128)), bytes(range(128, 256))]
    values = argument_bytes(s, {"a": 0x7F0000001000, "c": 0x7F0000002000, "b": 0x7F0000003000}, maps)
    assert values[0] == struct.pack("<Q", 0x7F0000001000)
    assert values[1] == struct.pack("<Q", 0x7F0000002000)
    assert values[2] == maps[0] and values[9] == maps[1]
    assert values[3] == struct.pack("<i", 7)
    assert values[4] == struct.pack("<q", -3)
    assert values[5] == b"\xff\xff\xff\xff"
    assert values[6] == struct.pack("<f", 0.5)
    assert values[7] == struct.pack("<d", 1e300)
    assert values[8] == b"\x01\x02\x03"
    params = KernelParams(values)
    assert params.count == 10 and params.address != 0
    # The array at `address` holds one pointer per argument, each to 64-byte aligned bytes.
    array = (ctypes.c_void_p * 10).from_address(params.address)
    for i, v in enumerate(values):
        assert array[i] == params.pointer(i)
        assert params.pointer(i) % 64 == 0
        assert ctypes.string_at(array[i], len(v)) == v
        assert params.read(i) == v


def test_no_arguments_means_a_null_params_pointer():
    assert KernelParams([]).address == 0


def test_missing_or_short_tensor_map_is_refused():
    s = LaunchSpec(grid=1, block=32, args=[TensorMapArg("a", MAP)])
    with pytest.raises(LaunchError, match="no encoded tensor map"):
        argument_bytes(s, {"a": 0}, [])
    with pytest.raises(LaunchError, match="128 bytes"):
        argument_bytes(s, {"a": 0}, [b"\0" * 64])


# --------------------------------------------------------------------------- driver wrappers


class _Result(int):
    pass


def _fake_driver(monkeypatch, **functions):
    """A stand-in for cuda.bindings.driver: the real module's types, our functions."""
    real = pytest.importorskip("cuda.bindings.driver")
    fake = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})
    for name, fn in functions.items():
        setattr(fake, name, fn)
    monkeypatch.setattr(cu, "_DRV", fake)
    return fake


def test_call_checks_every_result(monkeypatch):
    _fake_driver(monkeypatch, cuMemAlloc=lambda n: (_Result(0), 0xABC000),
                 cuMemFree=lambda p: (_Result(0),),
                 cuCtxSynchronize=lambda: (_Result(700),),
                 cuModuleGetGlobal=lambda m, name: (_Result(500), 0, 0))
    assert cu.mem_alloc(64) == 0xABC000
    assert cu.mem_free(0xABC000) is None
    with pytest.raises(cu.CudaError) as info:
        cu.synchronize()
    err = info.value
    assert (err.code, err.name, err.call) == (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuCtxSynchronize")
    assert err.sticky
    mod = cu.Module.__new__(cu.Module)
    mod.handle = object()
    with pytest.raises(cu.CudaError, match="mangled name"):
        mod.global_("ns::oracle_trace_sink")


def test_launch_passes_the_params_address(monkeypatch):
    seen = {}

    def launch_kernel(*args):
        seen["plain"] = args
        return (_Result(0),)

    def launch_kernel_ex(config, f, params, extra):
        seen["ex"] = (config, f, params, extra)
        return (_Result(0),)

    _fake_driver(monkeypatch, cuLaunchKernel=launch_kernel, cuLaunchKernelEx=launch_kernel_ex)
    fn = cu.Function(handle="F", name="k")
    params = KernelParams([b"\0" * 8, struct.pack("<i", 3)])
    cu.launch(fn, (4, 2, 1), (128, 1, 1), 1024, params.address)
    assert seen["plain"] == ("F", 4, 2, 1, 128, 1, 1, 1024, 0, params.address, 0)
    cu.launch(fn, (4, 2, 1), (128, 1, 1), 0, 0)
    assert seen["plain"][9] is None
    cu.launch(fn, (4, 2, 1), (128, 1, 1), 2048, params.address, cluster=(2, 1, 1))
    config, f, p, extra = seen["ex"]
    assert f == "F" and p == params.address and extra == 0
    assert (config.gridDimX, config.gridDimY, config.blockDimX, config.sharedMemBytes) == (4, 2, 128, 2048)
    assert config.numAttrs == 1
    assert (config.attrs[0].value.clusterDim.x, config.attrs[0].value.clusterDim.y) == (2, 1)


def test_error_names_and_messages_without_a_driver():
    assert cu.error_name(719) == "CUDA_ERROR_LAUNCH_FAILED"
    assert cu.error_name(cu.DRIVER_UNAVAILABLE) == "CUDA_DRIVER_UNAVAILABLE"
    assert "illegal" in cu.error_message(700).lower()
    assert not cu.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "", "x").sticky
    assert cu.CudaError(719, "CUDA_ERROR_LAUNCH_FAILED", "", "x").sticky


@pytest.mark.skipif(cuda_driver_works(), reason="A CUDA driver is present here, so its absence cannot be tested.")
def test_a_missing_driver_is_a_cuda_error(monkeypatch):
    pytest.importorskip("cuda.bindings.driver")
    monkeypatch.setattr(cu, "_initialised", False)
    with pytest.raises(cu.CudaError) as info:
        cu.init()
    # No libcuda at all: the pseudo code -1; a driver without a device: the driver's own code.
    if info.value.code == cu.DRIVER_UNAVAILABLE:
        assert info.value.name == "CUDA_DRIVER_UNAVAILABLE"
    else:
        assert info.value.name.startswith("CUDA_ERROR_")

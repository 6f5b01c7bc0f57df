"""The CUTLASS adapter (harness/include/oracle_trace/cutlass.hpp) without a GPU, on the zoo's real
CUTLASS SM90 GEMM (zoo/cutlass_sm90/cutlass_sm90.cu), through the quick route and the host route:

- the traced launch library builds with nvcc, exports oracle_launch and oracle_launch_abi and
  carries the CUDA runtime statically;
- oracle_launch refuses, with a sentence and before any CUDA call, what the kernel cannot run (another
  ABI, another tile, another element type or layout, a bias, scales a LinearCombination lacks, a split
  of k on the persistent scheduler);
- the host route (ORACLE_CUTLASS_HOST_ENTRY, zoo/cutlass_sm90/host.toml: the one host-route build)
  refuses the same before it calls the user's make_arguments, and runs what make_arguments returns
  through can_implement up to the first CUDA call.

The stream-K scheduler's libraries, the SASS identity of the production kernel and the traced collective's
tap maps are tested in test_cutlass_stream_k_library.py, test_cutlass_sass_identity.py and
test_cutlass_tap_maps.py: each CUTLASS build takes about a minute of one core and 2-3 GB, so the builds are
cut into files that --dist loadfile runs side by side; they go through the oracle's build cache
(ORACLE_CACHE_DIR). Both builds are the build tier's (--every-build).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
from cutlass_launch import launch, launch_without_a_device, library_call, require_cutlass, zoo_library

from harness import launch_abi as L

pytestmark = [pytest.mark.nvcc, pytest.mark.every_build]


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    require_cutlass()


@pytest.fixture(scope="module")
def traced_library() -> Path:
    return zoo_library("cutlass_sm90.toml")


@pytest.fixture(scope="module")
def host_library() -> Path:
    """The host route (ORACLE_CUTLASS_HOST_ENTRY with the zoo's make_arguments), traced: the one
    correct host-route build (zoo/cutlass_sm90/host.toml)."""
    return zoo_library("host.toml")


@pytest.mark.parametrize("route", ["quick", "host"])
def test_the_traced_library_exports_the_abi(request, route):
    traced_library = request.getfixturevalue("traced_library" if route == "quick" else "host_library")
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed: the exported symbols cannot be listed.")
    out = subprocess.run([nm, "-D", "--defined-only", str(traced_library)], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert {"oracle_launch", "oracle_launch_abi"} <= exported
    needed = subprocess.run(["readelf", "-d", str(traced_library)], capture_output=True, text=True).stdout
    assert "libcudart" not in needed, "the CUDA runtime is linked statically"
    lib = ctypes.CDLL(str(traced_library))
    lib.oracle_launch_abi.restype = ctypes.c_uint64
    assert lib.oracle_launch_abi() == L.abi_word()


@pytest.mark.parametrize("call, fields, code, words", [
    (library_call(), {"abi_version": 2}, 1000, "ABI version 2"),
    (library_call(tile=(128, 128, 32)), {}, 1001, "128 x 128 x 64, the case says 128 x 128 x 32"),
    (library_call(batch=2), {}, 1001, "B must be [batch, K, N] = [2, 520, 392]"),
    (library_call(tensors=(L.TensorSlotArg("a", "a", "fp16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     {}, 1001, "A must be a [M, K] = [300, 520] matrix of element type bf16 (got fp16)"),
    (library_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (1, 300)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     {}, 1001, "A's strides (1, 300; batch step 0) do not fit"),
    (library_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out"))),
     {}, 1001, "beta = 0.5 needs C"),
    (library_call(bias_kind="col"), {}, 1001, "the kernel's epilogue adds bias none and activation none; the case asks "
                                       "for bias col and activation none"),
    (library_call(), {"scale_a_kind": 1, "scale_b_kind": 1}, 1001,
     "the epilogue is a LinearCombination (alpha, beta, C): no scales (scale kinds tensor and tensor given"),
])
def test_oracle_launch_refuses_what_the_kernel_cannot_run(traced_library, call, fields, code, words):
    got, message = launch(traced_library, call, **fields)
    assert got == code, message
    assert words in message, message


@pytest.mark.parametrize("call, words", [
    (library_call(tile=(128, 128, 32)), "128 x 128 x 64, the case says 128 x 128 x 32"),
    (library_call(tensors=(L.TensorSlotArg("a", "a", "fp16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     "A must be a [M, K] = [300, 520] matrix of element type bf16 (got fp16)"),
    (library_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (392, 1)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     "B's strides (392, 1; batch step 0) do not fit"),  # a layout the user's code was not written for: refused, not passed
])
def test_the_host_route_refuses_what_the_kernel_cannot_run_before_calling_the_user_s_code(host_library, call, words):
    got, message = launch(host_library, call)
    assert got == 1001 and words in message, message


def test_the_persistent_scheduler_s_library_refuses_a_split(traced_library):
    got, message = launch(traced_library, library_call(), splits=2)
    assert got == 1001, message
    assert ("splits 2, stream_k_workers 0 given: the kernel's tile scheduler (CUTLASS's persistent one) never splits "
            "a tile") in message, message


def test_the_host_route_runs_the_user_s_arguments_up_to_the_launch(host_library):
    out = launch_without_a_device(host_library)
    # make_arguments ran, its arguments passed the route's checks and CUTLASS's can_implement: the
    # first CUDA call (installing the sink) is what fails without a device
    assert out.startswith("1002 setting the trace sink: "), out

"""The CUTLASS adapter (harness/include/oracle_trace/cutlass.hpp) without a GPU, on the zoo's real
CUTLASS SM90 GEMM (zoo/cutlass_sm90/cutlass_sm90.cu):

- the traced launch library builds with nvcc, exports oracle_launch and oracle_launch_abi and
  carries the CUDA runtime statically;
- oracle_launch refuses, with a sentence and before any CUDA call, what the kernel cannot run (another
  ABI, another tile, another element type or layout, a bias);
- tracing off costs nothing: CUTLASS's production instantiation has the same SASS with the adapter
  included (aliases, entry macro) as without it, and the traced build's kernel differs.

Each CUTLASS build takes about a minute of one core and 2-3 GB: the builds go through the oracle's
build cache (ORACLE_CACHE_DIR), one at a time.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
from cuda_tools import cuobjdump, sass_by_function  # tests/ is on sys.path

from harness import launch_abi as L
from harness.build import build_cubin, build_library, cutlass_include_dirs
from oracle.run.case import load_case

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"
SOURCE = ZOO / "cutlass_sm90.cu"


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.fixture(scope="module")
def traced_library() -> Path:
    case = load_case(str(ZOO / "cutlass_sm90.toml"))
    return build_library(case.kernel.library, arch=case.kernel.arch, defines={"ORACLE_TRACE": "1"}).cubin_path


def test_the_traced_library_exports_the_abi(traced_library):
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


def _call(**over) -> L.LibraryCall:
    m, n, k = over.pop("mnk", (300, 392, 520))
    tensors = over.pop("tensors", (
        L.TensorSlotArg("a", "a", "bf16", (m, k), (k, 1)),
        L.TensorSlotArg("b", "b", "bf16", (k, n), (1, k)),
        L.TensorSlotArg("c", "c", "bf16", (m, n), (n, 1)),
        L.TensorSlotArg("d", "d", "bf16", (m, n), (n, 1), "out"),
    ))
    kw = dict(m=m, n=n, k=k, tile=(128, 128, 64), tensors=tensors, alpha=0.75, beta=0.5)
    kw.update(over)
    return L.LibraryCall(**kw)


def _launch(lib_path: Path, call: L.LibraryCall, **fields) -> tuple[int, str]:
    """oracle_launch on fake device addresses: only calls refused before any CUDA call are safe."""
    names = {t.buffer for t in call.tensors}
    filled = L.fill(call, {b: 4096 * (i + 1) for i, b in enumerate(sorted(names))}, {b: 1 for b in names})
    for name, value in fields.items():
        setattr(filled.args, name, value)
    lib = ctypes.CDLL(str(lib_path))
    lib.oracle_launch.restype = ctypes.c_int
    lib.oracle_launch.argtypes = [ctypes.c_void_p]
    return lib.oracle_launch(filled.address), filled.message()


@pytest.mark.parametrize("call, fields, code, words", [
    (_call(), {"abi_version": 2}, 1000, "ABI version 2"),
    (_call(tile=(128, 128, 32)), {}, 1001, "128 x 128 x 64, the case says 128 x 128 x 32"),
    (_call(batch=2), {}, 1001, "batch 2"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "fp16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     {}, 1001, "A must be a [M, K] = [300, 520] matrix of element type 3 (got 2)"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (1, 300)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     {}, 1001, "A's strides (1, 300) do not fit"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out"))),
     {}, 1001, "beta = 0.5 needs C"),
    (_call(bias_kind="col"), {}, 1001, "no bias, activation or scales"),
])
def test_oracle_launch_refuses_what_the_kernel_cannot_run(traced_library, call, fields, code, words):
    got, message = _launch(traced_library, call, **fields)
    assert got == code, message
    assert words in message, message


def _cubin(*defines: str) -> dict[str, list[str]]:
    res = build_cubin(SOURCE, defines={d: "1" for d in defines})
    return sass_by_function(res.cubin_path)


def test_the_production_instantiation_has_the_same_sass_with_the_adapter_included():
    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    plain = _cubin("ZOO_CUTLASS_PLAIN")
    adapted = _cubin()
    assert len(plain) == 1 and all("device_kernel" in name for name in plain), sorted(plain)
    assert adapted == plain  # same kernel name (same types) and the same instructions
    traced = _cubin("ORACLE_TRACE")
    (name,) = traced
    assert "Sm90TracedMainloop" in name and "TracedFusion" in name
    assert traced[name] != plain[next(iter(plain))]

"""The zoo's CUTLASS SM90 GEMM (zoo/cutlass_sm90/cutlass_sm90.cu) as the adapter's tests build and call it
without a GPU: its launch libraries built through the build cache as the zoo's cases build them, and
oracle_launch called on fake device addresses (only calls refused before any CUDA call are safe, or in a
child that sees no device); the batched GEMM (batched.cu) built as a live run builds it. Shared by
tests/cpu/test_cutlass_adapter.py, test_cutlass_stream_k_library.py, test_cutlass_sass_identity.py and
test_cutlass_batched*.py, each file holding its own builds so that --dist loadfile runs them side by side."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import launch_abi as L
from harness.build import build_library, cutlass_include_dirs
from oracle.run.case import load_case

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "zoo" / "cutlass_sm90"
SOURCE = ZOO / "cutlass_sm90.cu"


def require_cutlass() -> None:
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


def zoo_library(case_file: str) -> Path:
    """The traced launch library of the zoo case `case_file` with the case's own kernel defines (the build
    cache shares it between the test files and workers that ask for it)."""
    case = load_case(str(ZOO / case_file), allow_library=True)
    return build_library(case.kernel.library, arch=case.kernel.arch,
                         defines={"ORACLE_TRACE": "1", **case.kernel.defines}).cubin_path


def check_batched_build(case_file: str) -> None:
    """The zoo's batched CUTLASS case `case_file` (zoo/cutlass_sm90/batched.cu) builds traced as a live run
    builds it (oracle.run.adapters.library_defines: ORACLE_CASE_BATCH included), exports oracle_launch and
    keeps the LinearCombination tree's epilogue order."""
    from oracle.run.adapters import library_defines
    from oracle.run.library_epilogue import declared_order

    case = load_case(str(ZOO / case_file), allow_library=True)
    defines = library_defines(case.kernel, case.spec, traced=True)
    assert defines["ORACLE_CASE_BATCH"] == str(case.spec.batch) == "3"
    built = build_library(case.kernel.library, arch=case.kernel.arch, defines=defines)
    blob = Path(built.cubin_path).read_bytes()
    assert b"oracle_launch" in blob, case_file
    assert declared_order(blob) == ("alpha_beta", "cast"), case_file  # the LinearCombination tree's


def library_call(**over) -> L.LibraryCall:
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


def launch(lib_path: Path, call: L.LibraryCall, **fields) -> tuple[int, str]:
    """oracle_launch on fake device addresses: only calls refused before any CUDA call are safe."""
    names = {t.buffer for t in call.tensors}
    filled = L.fill(call, {b: 4096 * (i + 1) for i, b in enumerate(sorted(names))}, {b: 1 for b in names})
    for name, value in fields.items():
        setattr(filled.args, name, value)
    lib = ctypes.CDLL(str(lib_path))
    lib.oracle_launch.restype = ctypes.c_int
    lib.oracle_launch.argtypes = [ctypes.c_void_p]
    return lib.oracle_launch(filled.address), filled.message()


# oracle_launch in a child that sees no device: every CUDA call fails there, so fake addresses are safe.
_NO_DEVICE_CALL = r"""
import json, sys
sys.path[:0] = sys.argv[3:]
import cutlass_launch as t
got, message = t.launch(sys.argv[1], t.library_call(), **json.loads(sys.argv[2]))
print(got, message)
"""


def launch_without_a_device(lib_path: Path, **fields) -> str:
    """What oracle_launch prints, called with library_call() and `fields` in a child that sees no device."""
    import json

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", _NO_DEVICE_CALL, str(lib_path), json.dumps(fields),
                          str(Path(__file__).parent), str(ROOT)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout

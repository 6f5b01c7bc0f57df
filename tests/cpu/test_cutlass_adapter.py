"""The CUTLASS adapter (harness/include/oracle_trace/cutlass.hpp) without a GPU, on the zoo's real
CUTLASS SM90 GEMM (zoo/cutlass_sm90/cutlass_sm90.cu):

- the traced launch library builds with nvcc, exports oracle_launch and oracle_launch_abi and
  carries the CUDA runtime statically;
- oracle_launch refuses, with a sentence and before any CUDA call, what the kernel cannot run (another
  ABI, another tile, another element type or layout, a bias, scales a LinearCombination lacks, a split
  of k on the persistent scheduler); the stream-K build (ZOO_CUTLASS_STREAMK: TracedScheduler, slow)
  takes a split-K or stream-K case up to its first CUDA call and refuses splits it cannot run;
- the host route (ORACLE_CUTLASS_HOST_ENTRY, zoo/cutlass_sm90/host.toml: the one host-route build)
  refuses the same before it calls the user's make_arguments, and runs what make_arguments returns
  through can_implement up to the first CUDA call;
- tracing off costs nothing: CUTLASS's production instantiation has the same SASS with the adapter
  included (aliases, entry macro) as without it, and the traced kernel (read from the traced
  library, whose device code a traced cubin build would repeat) differs.

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
from harness.build import build_cubin, build_library, build_slot, cutlass_include_dirs
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
    case = load_case(str(ZOO / "cutlass_sm90.toml"), allow_library=True)
    return build_library(case.kernel.library, arch=case.kernel.arch, defines={"ORACLE_TRACE": "1"}).cubin_path


@pytest.fixture(scope="module")
def host_library() -> Path:
    """The host route (ORACLE_CUTLASS_HOST_ENTRY with the zoo's make_arguments), traced: the one
    correct host-route build (zoo/cutlass_sm90/host.toml)."""
    case = load_case(str(ZOO / "host.toml"), allow_library=True)
    return build_library(case.kernel.library, arch=case.kernel.arch,
                         defines={"ORACLE_TRACE": "1", **case.kernel.defines}).cubin_path


@pytest.fixture(scope="module")
def stream_k_library() -> Path:
    """The kernel with CUTLASS's stream-K scheduler through TracedScheduler (zoo/cutlass_sm90/splitk.toml's
    build, which streamk.toml and streamk_dp.toml share), traced."""
    case = load_case(str(ZOO / "splitk.toml"), allow_library=True)
    return build_library(case.kernel.library, arch=case.kernel.arch,
                         defines={"ORACLE_TRACE": "1", **case.kernel.defines}).cubin_path


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
    (_call(batch=2), {}, 1001, "B must be [batch, K, N] = [2, 520, 392]"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "fp16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     {}, 1001, "A must be a [M, K] = [300, 520] matrix of element type bf16 (got fp16)"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (1, 300)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     {}, 1001, "A's strides (1, 300; batch step 0) do not fit"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out"))),
     {}, 1001, "beta = 0.5 needs C"),
    (_call(bias_kind="col"), {}, 1001, "the kernel's epilogue adds bias none and activation none; the case asks "
                                       "for bias col and activation none"),
    (_call(), {"scale_a_kind": 1, "scale_b_kind": 1}, 1001,
     "the epilogue is a LinearCombination (alpha, beta, C): no scales (scale kinds tensor and tensor given"),
])
def test_oracle_launch_refuses_what_the_kernel_cannot_run(traced_library, call, fields, code, words):
    got, message = _launch(traced_library, call, **fields)
    assert got == code, message
    assert words in message, message


@pytest.mark.parametrize("call, words", [
    (_call(tile=(128, 128, 32)), "128 x 128 x 64, the case says 128 x 128 x 32"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "fp16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (1, 520)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     "A must be a [M, K] = [300, 520] matrix of element type bf16 (got fp16)"),
    (_call(tensors=(L.TensorSlotArg("a", "a", "bf16", (300, 520), (520, 1)),
                    L.TensorSlotArg("b", "b", "bf16", (520, 392), (392, 1)),
                    L.TensorSlotArg("d", "d", "bf16", (300, 392), (392, 1), "out")), beta=0.0),
     "B's strides (392, 1; batch step 0) do not fit"),  # a layout the user's code was not written for: refused, not passed
])
def test_the_host_route_refuses_what_the_kernel_cannot_run_before_calling_the_user_s_code(host_library, call, words):
    got, message = _launch(host_library, call)
    assert got == 1001 and words in message, message


@pytest.mark.slow
@pytest.mark.parametrize("fields, words", [
    ({"splits": 2, "stream_k_workers": 8}, "splits 2, stream_k_workers 8: splits >= 1, stream_k_workers >= 0, not both"),
    ({"splits": 0}, "splits 0, stream_k_workers 0: splits >= 1"),
    ({"stream_k_workers": -1}, "stream_k_workers -1"),
])
def test_the_stream_k_library_refuses_a_split_it_cannot_run(stream_k_library, fields, words):
    got, message = _launch(stream_k_library, _call(), **fields)
    assert got == 1001 and words in message, message


@pytest.mark.slow
def test_the_host_route_s_stream_k_arguments_may_not_split_an_unsplit_case():
    # the zoo's make_arguments leaves the scheduler's arguments at CUTLASS's defaults: the Heuristic
    # decomposition, which may split tiles that the unsplit case would judge whole
    lib = build_library(SOURCE, defines={"ORACLE_TRACE": "1", "ZOO_CUTLASS_HOST": "1",
                                         "ZOO_CUTLASS_STREAMK": "1"}).cubin_path
    got, message = _launch(lib, _call())
    assert got == 1001, message
    assert ("make_arguments asks CUTLASS's stream-K scheduler for decomposition Heuristic with splits 1, and the "
            "case declares no split") in message, message


def test_the_persistent_scheduler_s_library_refuses_a_split(traced_library):
    got, message = _launch(traced_library, _call(), splits=2)
    assert got == 1001, message
    assert ("splits 2, stream_k_workers 0 given: the kernel's tile scheduler (CUTLASS's persistent one) never splits "
            "a tile") in message, message


# oracle_launch in a child that sees no device: every CUDA call fails there, so fake addresses are safe.
NO_DEVICE_CALL = r"""
import ctypes, sys
sys.path[:0] = sys.argv[2:]
import test_cutlass_adapter as t
got, message = t._launch(sys.argv[1], t._call())
print(got, message)
"""


def test_the_host_route_runs_the_user_s_arguments_up_to_the_launch(host_library):
    import os
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", NO_DEVICE_CALL, str(host_library), str(Path(__file__).parent),
                          str(ROOT / "tests"), str(ROOT)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # make_arguments ran, its arguments passed the route's checks and CUTLASS's can_implement: the
    # first CUDA call (installing the sink) is what fails without a device
    assert out.stdout.startswith("1002 setting the trace sink: "), out.stdout


STREAM_K_CALL = r"""
import ctypes, sys
sys.path[:0] = sys.argv[3:]
import test_cutlass_adapter as t
got, message = t._launch(sys.argv[1], t._call(), **{sys.argv[2]: 3 if sys.argv[2] == "splits" else 16})
print(got, message)
"""


@pytest.mark.slow
@pytest.mark.parametrize("field", ["splits", "stream_k_workers"])
def test_the_stream_k_library_takes_a_split_case_up_to_the_first_cuda_call(stream_k_library, field):
    import os
    import sys

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", STREAM_K_CALL, str(stream_k_library), field, str(Path(__file__).parent),
                          str(ROOT / "tests"), str(ROOT)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # the split passed every check before the device is asked for its SM count (the quick route's first
    # CUDA call), which fails without a device
    assert out.stdout.startswith("1002 cudaGetDevice: "), out.stdout
    traced = sass_by_function(stream_k_library) if cuobjdump() is not None else {}
    assert all("TracedStreamKTag" in name for name in traced), sorted(traced)  # the kernel's scheduler tag


def _cubin(*defines: str) -> dict[str, list[str]]:
    res = build_cubin(SOURCE, defines={d: "1" for d in defines})
    return sass_by_function(res.cubin_path)


def test_the_production_instantiation_has_the_same_sass_with_the_adapter_included(traced_library):
    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    plain = _cubin("ZOO_CUTLASS_PLAIN")
    adapted = _cubin()
    assert len(plain) == 1 and all("device_kernel" in name for name in plain), sorted(plain)
    assert adapted == plain  # same kernel name (same types) and the same instructions
    # the traced kernel as the library embeds it (the same device code as a traced cubin build)
    traced = sass_by_function(traced_library)
    (name,) = traced
    assert "Sm90TracedMainloop" in name and "TracedFusion" in name
    assert traced[name] != plain[next(iter(plain))]


# The traced collective's tap maps and the traced epilogue's arguments, printed by a host program
# through the same types the kernel uses (CUTLASS's builder output, the adapter's derived types).
# The program runs no device code: ZOO_CUTLASS_TYPES_ONLY keeps the kernel uninstantiated, which
# halves its build (the production kernel's device code is the SASS-identity test's, above).
MAPS_PROGRAM = r'''
#define ZOO_CUTLASS_PLAIN 1
#define ZOO_CUTLASS_TYPES_ONLY 1
#include "cutlass_sm90.cu"
#include "oracle_trace/cutlass.hpp"
#include <cstdio>

using Traced = oracle_trace::cutlass_sm90::Sm90TracedMainloop<zoo_cutlass::BuiltMainloop>;
using Fusion = typename oracle_trace::cutlass_sm90::TracedEpilogueOf<zoo_cutlass::BuiltEpilogue>::type::FusionCallbacks;
alignas(1024) static cutlass::bfloat16_t smem[2 * Traced::Stages * 128 * 64];

int main() {
  printf("stages %d threads %d\n", Traced::Stages, int(cute::size(typename Traced::TiledMma{})));
  for (int stage : {0, Traced::Stages - 1})
    for (int r = 0; r < Traced::kBM; ++r)
      for (int c = 0; c < Traced::kBK; ++c) printf("A %d %d %d %d\n", stage, r, c, Traced::offset_a(smem, r, c, stage));
  for (int stage : {0, Traced::Stages - 1})
    for (int k = 0; k < Traced::kBK; ++k)
      for (int n = 0; n < Traced::kBN; ++n) printf("B %d %d %d %d\n", stage, k, n, Traced::offset_b(smem, k, n, stage));
  for (int t = 0; t < int(cute::size(typename Traced::TiledMma{})); ++t) {
    auto coords = Traced::accumulator_coords(t);
    for (int i = 0; i < int(cute::size(coords)); ++i)
      printf("C %d %d %d\n", t, int(cute::get<0>(coords(i))), int(cute::get<1>(coords(i))));
  }
  typename Fusion::Arguments a{};
  a.alpha = 0.75f;
  a.beta = 0.5f;
  typename Fusion::Impl::Arguments tree = a;  // the conversion the epilogue applies
  printf("beta %g alpha %g\n", double(tree.op_0.op_0.op_0.op_0.scalars[0]), double(tree.op_0.op_0.op_0.op_2.op_0.scalars[0]));
  return 0;
}
'''


def _swizzled(byte: int) -> int:
    return byte ^ (((byte >> 7) & 7) << 4)  # 128-byte swizzle: 16-byte chunk ^= row within 8


@pytest.mark.parametrize("pingpong", [False, True], ids=["cooperative", "pingpong"])
def test_the_traced_collective_taps_where_the_tma_and_the_mma_put_each_element(tmp_path, pingpong):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH.")
    src = tmp_path / "maps.cu"
    src.write_text(MAPS_PROGRAM)
    exe = tmp_path / "maps"
    cmd = [nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
           f"-I{ROOT / 'harness' / 'include'}", f"-I{ZOO}", *(f"-I{d}" for d in cutlass_include_dirs()),
           *(["-DZOO_CUTLASS_PINGPONG=1"] if pingpong else []), "-o", str(exe), str(src)]
    with build_slot():
        proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    _, stages, _, threads = lines[0].split()
    stages, threads = int(stages), int(threads)
    assert threads == (128 if pingpong else 256)
    bm = bn = 128
    row_bytes = 64 * 2  # one 64-element bf16 row of the k-block: 128 bytes
    seen_a, seen_b, acc = 0, 0, {}
    for line in lines[1:]:
        kind, *vals = line.split()
        if kind == "A":
            stage, r, c, off = map(int, vals)
            assert off * 2 == _swizzled(stage * bm * row_bytes + r * row_bytes + c * 2), line
            seen_a += 1
        elif kind == "B":  # logical (k, n) of B, stored as [N, K] rows of K
            stage, k, n, off = map(int, vals)
            assert off * 2 == _swizzled(stage * bn * row_bytes + n * row_bytes + k * 2), line
            seen_b += 1
        elif kind == "C":
            t, r, c = map(int, vals)
            assert (r, c) not in acc, f"accumulator element {(r, c)} held by threads {acc[(r, c)]} and {t}"
            acc[(r, c)] = t
        else:
            assert line == "beta 0.5 alpha 0.75", line  # alpha and beta reach the FMA subtree
    assert seen_a == seen_b == 2 * 128 * 64
    assert set(acc) == {(r, c) for r in range(bm) for c in range(bn)}  # every element, once

"""The CUTLASS adapter's traced collective taps where the TMA and the MMA put each element: its tap maps and
the traced epilogue's arguments, printed by a host program built from the zoo's CUTLASS SM90 GEMM
(zoo/cutlass_sm90/cutlass_sm90.cu) through the same types the kernel uses, checked against the 128-byte
swizzle and the accumulator's ownership, for the cooperative and the ping-pong kernel: two host programs,
the build tier's (--every-build), in a file of their own so that --dist loadfile builds them beside the
adapter's libraries.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from cutlass_launch import ROOT, ZOO, require_cutlass

from harness.build import build_slot, cutlass_include_dirs

pytestmark = [pytest.mark.nvcc, pytest.mark.every_build]


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    require_cutlass()


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

"""Build the cubins the GPU runs need, here (nvcc, no GPU), into a cache that can be carried.

    ORACLE_CACHE_DIR=.carry/cache python benchmarks/prebuild.py

Each live case builds its kernel source with `-DORACLE_TRACE` and the case's defines for its arch
(oracle.run.live.run_live); the cache key covers source, headers, flags and nvcc's version text, so a
cubin built here is a hit on a machine with the same nvcc. Builds the zoo's kernels and the
harness examples once each, in parallel; prints what it built and how long it took.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = ("zoo/hopper_gemm/hopper_gemm.toml", "zoo/sm80_gemm/sm80_gemm.toml", "zoo/split_gemm/splitk_serial.toml",
         "harness/examples/simple_gemm.toml",
         "harness/examples/fault_trap.toml")


def main() -> int:
    from harness.build import build_cubin, default_cache_dir
    from oracle.run.case import load_case

    jobs = {}
    for path in CASES:
        k = load_case(str(ROOT / path), {"m": 128, "n": 128, "k": 128}).kernel
        key = (k.source, k.arch, tuple(sorted(k.defines.items())))
        jobs[key] = k
    print(f"cache: {default_cache_dir()}")

    def build(k):
        t0 = time.perf_counter()
        res = build_cubin(k.source, arch=k.arch, defines={"ORACLE_TRACE": "1", **k.defines})
        return k.source, res.cached, time.perf_counter() - t0

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as ex:
        for src, cached, secs in ex.map(build, jobs.values()):
            print(f"{Path(src).relative_to(ROOT)}: {'cached' if cached else 'built'} in {secs:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

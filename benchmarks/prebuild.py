"""Build the cubins the GPU runs need, here (nvcc, no GPU), into a cache that can be carried.

    ORACLE_CACHE_DIR=.carry/cache python benchmarks/prebuild.py [--zoo NAME_PART ...] [--at-size] [--jobs N] [--into DIR]

Each live case builds its kernel source with `-DORACLE_TRACE` and the case's defines for its arch
(oracle.run.live.run_live); the cache key covers source, headers, flags and nvcc's version text, so a
cubin built here is a hit on a machine with the same nvcc. Builds the zoo's kernels and the
harness examples once each, in parallel; with `--zoo`, also every manifest entry
(tests/zoo/manifest.json) whose name contains one of the given parts ("" for all); with `--at-size`, every
run of benchmarks/zoo_at_size.py (its command line resolved as the command resolves it); with `--into`,
each entry is also copied into another cache folder (built in the user's cache, carried from the
copy). Prints what it built and how long it took.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CASES = ("zoo/hopper_gemm/hopper_gemm.toml", "zoo/sm80_gemm/sm80_gemm.toml", "zoo/split_gemm/splitk_serial.toml",
         "harness/examples/simple_gemm.toml",
         "harness/examples/fault_trap.toml")


def _zoo_cases(parts: list[str]):
    from zoo_cases import attention_entry_case, entries, entry_case

    for e in entries(kind=None):
        if any(p in e["name"] for p in parts):
            make = attention_entry_case if e.get("kind") == "attention" else entry_case
            for problem in [e["problem"]] + ([e["record_problem"]] if "record_problem" in e else []):
                yield e["name"], make(e, problem)


def _job(case):
    """What run_live builds for `case`: (kind, path, defines, options)."""
    from oracle.run.adapters import library_defines
    from oracle.run.kernel_flags import build_options

    k = case.kernel
    if k.library:
        return "library", k.library, library_defines(k, case.spec, traced=True), build_options(k)
    return "cubin", k.source, {"ORACLE_TRACE": "1", **k.defines}, build_options(k)


def _copy_entry(built: Path, cache: Path, into: Path) -> None:
    """Copy a cache entry (the built file and its .json) to the same place under `into`."""
    for src in (built, built.with_suffix(".json")):
        dst = into / src.relative_to(cache)
        dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(src, dst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", nargs="*", default=None, help="also the manifest entries whose name holds one of these")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--at-size", action="store_true", help="also the runs of benchmarks/zoo_at_size.py")
    ap.add_argument("--no-base", action="store_true", help="only the manifest entries, not the base cases")
    ap.add_argument("--into", default=None, help="also copy each built entry into this cache folder (same layout)")
    args = ap.parse_args()
    from harness.build import build_cubin, build_library, default_cache_dir
    from oracle.run.case import load_case

    cases = [] if args.no_base else [(p, load_case(str(ROOT / p), {"m": 128, "n": 128, "k": 128})) for p in CASES]
    if args.zoo is not None:
        cases += list(_zoo_cases(args.zoo or [""]))
    if args.at_size:
        from benchmarks.zoo_at_size import RUNS, case_of

        cases += [(name, case_of(run)) for name, run in RUNS]
    jobs = {}
    for label, case in cases:
        kind, path, defines, options = _job(case)
        key = (kind, path, case.kernel.arch, tuple(sorted(defines.items())), repr(sorted(options.items())))
        jobs.setdefault(key, (label, kind, path, case.kernel.arch, defines, options))
    print(f"cache: {default_cache_dir()}; {len(jobs)} builds", flush=True)

    def build(job):
        label, kind, path, arch, defines, options = job
        t0 = time.perf_counter()
        res = (build_library if kind == "library" else build_cubin)(path, arch=arch, defines=defines, **options)
        return label, res, time.perf_counter() - t0

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for label, res, secs in ex.map(build, jobs.values()):
            print(f"{label}: {'cached' if res.cached else 'built'} in {secs:.1f} s", flush=True)
            if args.into:
                _copy_entry(res.cubin_path, default_cache_dir(), Path(args.into))
    return 0


if __name__ == "__main__":
    sys.exit(main())

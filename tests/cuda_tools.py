"""CUDA binary tools shared by the CPU-tier tests that inspect cubins (no GPU needed)."""

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
HOPPER_SOURCE = ROOT / "zoo" / "hopper_gemm" / "hopper_gemm.cu"


def cuobjdump() -> Optional[str]:
    """cuobjdump on PATH, else the copy inside the triton package, else None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except Exception:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(path) if path.exists() else None


def sass_by_function(cubin: Path) -> dict[str, list[str]]:
    """Per-function SASS lines, whitespace-normalised, without the lines that name source files."""
    text = subprocess.run([cuobjdump(), "--dump-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    funcs: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = m.group(1)
            funcs[current] = []
            continue
        if current is None or "identifier" in line or str(cubin.parent) in line or ".cu" in line:
            continue
        norm = " ".join(line.split())
        if norm:
            funcs[current].append(norm)
    assert funcs, f"no functions in the SASS of {cubin}"
    return funcs


def entry_symbols(cubin: Path) -> set[str]:
    """The kernel entry points (STO_ENTRY symbols) of a cubin."""
    text = subprocess.run([cuobjdump(), "-symbols", str(cubin)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in text.splitlines() if "STO_ENTRY" in line}


def all_symbols(cubin: Path) -> str:
    """`cuobjdump -symbols` of a cubin, as text."""
    return subprocess.run([cuobjdump(), "-symbols", str(cubin)], capture_output=True, text=True, check=True).stdout


def ptxas_usage(log: str) -> dict[str, tuple[int, int, int]]:
    """{function: (stack frame bytes, spill store bytes, spill load bytes)} from `ptxas -v`."""
    out, current = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current is not None:
            out[current] = tuple(int(x) for x in m.groups())
            current = None
    return out


def traced_and_plain(source: Path) -> dict:
    """`source` built with and without -DORACLE_TRACE (ptxas -v in the logs), side by side: the
    oracle's build cache keeps both, so a test that builds the same source the same way gets them
    from there."""
    import pytest

    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    with ThreadPoolExecutor(max_workers=2) as pool:
        traced = pool.submit(zoo_build, source, True)
        plain = pool.submit(zoo_build, source, False)
        return {"traced": traced.result(), "plain": plain.result()}


def zoo_build(source: Path, traced: bool):
    """`source` built as traced_and_plain builds it (the oracle's flags, ptxas -v in the log), through
    the oracle's build cache: a test that needs one of the two builds shares it, key and all."""
    from harness.build import build_cubin

    return build_cubin(source, defines={"ORACLE_TRACE": "1"} if traced else {}, extra_flags=("--ptxas-options=-v",))


def zoo_builds_with_defects(source: Path, defect_build, defects: Sequence[str]) -> dict:
    """`source` built traced and plain, and `defect_build(d)` for each of `defects`, two at a time
    (skips without cuobjdump): {"traced", "plain", defect: BuildResult}."""
    import pytest
    from concurrent.futures import ThreadPoolExecutor

    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {"traced": pool.submit(zoo_build, source, True), "plain": pool.submit(zoo_build, source, False)}
        jobs.update({d: pool.submit(defect_build, d) for d in defects})
        return {k: j.result() for k, j in jobs.items()}


def assert_every_entry_traced_and_plain(builds: dict, entries: set, wanted: set) -> None:
    """The plain build holds `entries`, the traced one each with its `_traced` twin and every entry
    point in `wanted`; only the traced build declares the sink."""
    traced, plain = entry_symbols(builds["traced"].cubin_path), entry_symbols(builds["plain"].cubin_path)
    assert plain == entries
    assert traced == entries | {f"{e}_traced" for e in entries}
    assert_sink_only_traced(builds)
    assert wanted <= traced, sorted(wanted - traced)


def require_nvcc() -> None:
    """Skip the calling test or fixture where nvcc is not on PATH."""
    import pytest

    if shutil.which("nvcc") is None:
        pytest.skip("This test needs nvcc on PATH to compile CUDA, and it is not installed here.")


def traced_entries(builds: dict, folder: str) -> set[str]:
    """The entry points of the traced build, which hold every one the zoo manifest names in zoo/`folder`/."""
    from zoo_cases import entries

    want = {e["kernel"].partition(":")[2] for e in entries() if e["kernel"].startswith(f"zoo/{folder}/")}
    got = entry_symbols(builds["traced"].cubin_path)
    assert want <= got, f"missing entry points: {sorted(want - got)}"
    return got


def assert_sink_only_traced(builds: dict) -> None:
    """The traced build declares the trace sink; the plain build has none."""
    assert "oracle_trace_sink" in all_symbols(builds["traced"].cubin_path)
    assert "oracle_trace_sink" not in all_symbols(builds["plain"].cubin_path)


def assert_no_spills(build, exempt=lambda name: False) -> None:
    """Every function of `build` (ptxas -v in its log) has no stack frame and no spills, but those `exempt`."""
    usage = ptxas_usage(build.log)
    assert set(usage) == entry_symbols(build.cubin_path), f"ptxas -v output not understood:\n{build.log[:2000]}"
    bad = {f: u for f, u in usage.items() if u != (0, 0, 0) and not exempt(f)}
    assert not bad, f"(stack frame, spill stores, spill loads) bytes: {bad}"


def assert_tracing_compiled_out(builds: dict, same: Sequence[str], traced_differs: Sequence[str]) -> None:
    """Each of `same` has the same SASS in the traced and the plain build; each of `traced_differs`
    has a `_traced` twin whose SASS differs from the plain one (its taps are there)."""
    on, off = sass_by_function(builds["traced"].cubin_path), sass_by_function(builds["plain"].cubin_path)
    for name in same:
        assert on[name] == off[name], name
    for name in traced_differs:
        assert on[f"{name}_traced"] != off[name], name


def traced_example_cubin(example: str, out: Path) -> Path:
    """harness/examples/`example` built with -DORACLE_TRACE for sm_90a into `out` by nvcc itself
    (not the oracle's build), for a test that loads it with cuda.bindings; skips without either."""
    import pytest

    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        pytest.skip("This test needs cuda-python (cuda.bindings) to load a cubin, and it is not installed.")
    if shutil.which("nvcc") is None:
        pytest.skip(f"This test needs nvcc to build {example}, and it is not on PATH.")
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-DORACLE_TRACE",
                    f"-I{root / 'harness' / 'include'}", "-o", str(out), str(root / "harness" / "examples" / example)],
                   check=True, capture_output=True)
    return out


def cuda_driver_works() -> bool:
    """Whether a CUDA driver initialises here (cuda.bindings installed, a driver and a device present)."""
    try:
        import cuda.bindings.driver as drv

        return int(drv.cuInit(0)[0]) == 0
    except Exception:
        return False

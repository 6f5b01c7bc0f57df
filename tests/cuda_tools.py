"""CUDA binary tools shared by the CPU-tier tests that inspect cubins (no GPU needed)."""

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

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

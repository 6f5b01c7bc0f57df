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


def traced_and_plain(source: Path) -> dict:
    """`source` built with and without -DORACLE_TRACE (ptxas -v in the logs), side by side: the
    oracle's build cache keeps both, so a test that builds the same source the same way gets them
    from there."""
    import pytest

    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    from harness.build import build_cubin

    def build(defines):
        return build_cubin(source, defines=defines, extra_flags=("--ptxas-options=-v",))

    with ThreadPoolExecutor(max_workers=2) as pool:
        traced = pool.submit(build, {"ORACLE_TRACE": "1"})
        plain = pool.submit(build, {})
        return {"traced": traced.result(), "plain": plain.result()}

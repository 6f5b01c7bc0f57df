"""With tracing off, the trace header must add nothing to a kernel: identical SASS.

Builds cubins with nvcc (no GPU needed) and compares `cuobjdump --dump-sass` text, with
whitespace runs collapsed and file names dropped:
- harness/examples/sass_identity.cu with the header included and ORACLE_TRACE off is identical
  to the same kernel with neither header nor taps, and holds no `oracle_trace_sink`;
- with ORACLE_TRACE on, the traced kernel's SASS differs (so the comparison can fail) and the
  cubin holds the unmangled `oracle_trace_sink` symbol;
- in harness/examples/simple_gemm.cu, built as the oracle builds it, the untraced instantiations are
  identical whether or not ORACLE_TRACE is on: only the chosen instantiation carries taps.
"""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cuda_tools import cuobjdump, sass_by_function  # tests/ is on sys.path

from harness.build import build_cubin, build_slot

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "harness" / "examples"
INCLUDE = ROOT / "harness" / "include"
ARCH = "-gencode=arch=compute_90a,code=sm_90a"


def _build(src: Path, out: Path, *defines: str) -> Path:
    cmd = ["nvcc", ARCH, "-cubin", "-std=c++17", f"-I{INCLUDE}", *(f"-D{d}" for d in defines), "-o", str(out), str(src)]
    with build_slot():
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stderr}")
    return out


def _symbols(cubin: Path) -> str:
    return subprocess.run([cuobjdump(), "-elf", str(cubin)], capture_output=True, text=True, check=True).stdout


def _symtab_names(cubin: Path) -> list[str]:
    """Names in the cubin's .symtab: every variable, function and section it defines."""
    text = _symbols(cubin)
    m = re.search(r"\.section \.symtab\n(.*?)(?:\n\s*\n|\Z)", text, re.S)
    assert m, f"no .symtab in {cubin}"
    return sorted(line.split()[-1] for line in m.group(1).splitlines()[1:] if line.strip())


@pytest.fixture(scope="module")
def cubins(tmp_path_factory) -> dict[str, Path]:
    if cuobjdump() is None:
        pytest.skip("This test needs cuobjdump (from the CUDA toolkit or the triton package), and neither has it.")
    tmp = tmp_path_factory.mktemp("sass")
    jobs = {
        "none": (EXAMPLES / "sass_identity.cu", ()),
        "off": (EXAMPLES / "sass_identity.cu", ("SASS_IDENTITY_WITH_HEADER",)),
        "on": (EXAMPLES / "sass_identity.cu", ("SASS_IDENTITY_WITH_HEADER", "ORACLE_TRACE")),
        "faults_off": (EXAMPLES / "faults.cu", ()),
        "faults_on": (EXAMPLES / "faults.cu", ("ORACLE_TRACE",)),
    }
    # simple_gemm as the oracle builds it (harness.build: its flags and cache), with and without
    # ORACLE_TRACE: the same two builds tests/cpu/test_repro.py compares make's cubins with
    oracle_builds = {"gemm_off": {}, "gemm_on": {"ORACLE_TRACE": "1"}}
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = {k: pool.submit(_build, src, tmp / f"{k}.cubin", *d) for k, (src, d) in jobs.items()}
        futures.update({k: pool.submit(lambda d: build_cubin(EXAMPLES / "simple_gemm.cu", defines=d).cubin_path, d)
                        for k, d in oracle_builds.items()})
        return {k: f.result() for k, f in futures.items()}


def test_header_with_tracing_off_adds_nothing(cubins):
    none, off = sass_by_function(cubins["none"]), sass_by_function(cubins["off"])
    assert set(none) == {"sass_identity_gemm", "sass_identity_gemm_untraced"}
    assert off == none
    assert _symtab_names(cubins["off"]) == _symtab_names(cubins["none"])  # no variable, no function added
    assert "oracle_trace_sink" not in _symbols(cubins["off"])


def test_tracing_on_changes_the_traced_kernel(cubins):
    none, on = sass_by_function(cubins["none"]), sass_by_function(cubins["on"])
    assert on["sass_identity_gemm"] != none["sass_identity_gemm"]
    assert len(on["sass_identity_gemm"]) > len(none["sass_identity_gemm"])
    # the instantiation with its Trace switch off is untouched even with the machinery on
    assert on["sass_identity_gemm_untraced"] == none["sass_identity_gemm_untraced"]
    assert "oracle_trace_sink" in _symtab_names(cubins["on"])


def test_simple_gemm_untraced_entry_points_do_not_change(cubins):
    off, on = sass_by_function(cubins["gemm_off"]), sass_by_function(cubins["gemm_on"])
    plain = {f"simple_gemm_{d}" for d in ("fp32", "fp16", "bf16")}
    assert set(off) == plain
    assert set(on) == plain | {f"{p}_traced" for p in plain}
    for name in plain:
        assert on[name] == off[name], name
        assert on[f"{name}_traced"] != off[name], name


def test_faults_build_with_and_without_tracing(cubins):
    names = {"fault_illegal_address", "fault_trap", "fault_hang"}
    assert set(sass_by_function(cubins["faults_off"])) == names
    on = sass_by_function(cubins["faults_on"])
    assert set(on) == names
    assert any("BPT.TRAP" in line for line in on["fault_trap"])
    assert any("NANOSLEEP" in line for line in on["fault_hang"])

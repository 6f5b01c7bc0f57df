"""The reproducer's host programs (repro, repro_traced), built once per test session by a reproducer's
own Makefile (`make host`) and shared by the test files and xdist workers that run them: repro.cu and
its headers are the same for every case (oracle.repro.generate), so one build serves every reproducer.

A reproducer takes them in through host_from, which checks that its repro.cu, host/ and kernel/include
are byte for byte the shared build's before copying, so its `make` finds them up to date.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.build import HARNESS_INCLUDE_DIR, build_slot
from oracle.repro.makefile import TEMPLATE, TEMPLATE_PARTS

ROOT = Path(__file__).resolve().parents[1]
SIMPLE = ROOT / "harness" / "examples" / "simple_gemm.toml"
PROGRAMS = ("repro", "repro_traced")


def session_dir(tmp_path_factory) -> Path:
    """A folder every worker of this pytest session shares: under xdist the parent of each worker's
    base temp (pytest-N), alone the base temp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def sources_key() -> str:
    """A hash of everything a host program is built from: the template, its headers, the trace headers."""
    h = hashlib.sha256()
    for p in [TEMPLATE, *TEMPLATE_PARTS, *sorted(HARNESS_INCLUDE_DIR.rglob("*"))]:
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def shared_host_programs(tmp_path_factory) -> Path:
    """simple_gemm's reproducer with repro and repro_traced built by its `make host`, once per session:
    the first caller builds, the others wait on the lock and find the programs."""
    if shutil.which("nvcc") is None:
        pytest.skip("This test needs nvcc on PATH to compile the reproducer's host program, and it is not installed here.")
    from oracle.tools import cli

    d = session_dir(tmp_path_factory) / f"host_programs_{sources_key()}"
    with open(d.parent / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((d / p).is_file() for p in PROGRAMS):
            shutil.rmtree(d, ignore_errors=True)
            assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ones", "--out", str(d)]) == 0
            with build_slot():
                proc = subprocess.run(["make", "-C", str(d), "host"], capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert all((d / p).is_file() for p in PROGRAMS), proc.stdout
    return d


def host_from(shared: Path, d: Path, *programs: str) -> None:
    """The shared build's `programs` copied into the reproducer d, whose host sources must be the
    shared build's: copied after them (newer than its sources), make finds each up to date."""
    own = [p.relative_to(d) for sub in ("host", "kernel/include") for p in (d / sub).rglob("*") if p.is_file()]
    theirs = [p.relative_to(shared) for sub in ("host", "kernel/include") for p in (shared / sub).rglob("*")
              if p.is_file()]
    assert sorted(own) == sorted(theirs), f"{d}'s host sources are not the shared build's"
    for f in ("repro.cu", *own):
        assert (d / f).read_bytes() == (shared / f).read_bytes(), f"{f} differs from the shared build's"
    for p in programs:
        assert p in PROGRAMS, p
        shutil.copy(shared / p, d / p)

"""Every Python the oracle starts (the kernel child, started ahead or fresh, and a sweep's workers)
never imports from the folder the user runs it in: modules planted there (json.py, harness.py,
oracle.py, ...) that write a marker file must never run, and PYTHONPATH keeps working."""

from __future__ import annotations

import ast
import glob
import io
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import child_process
from harness.knobs import absolute_paths
from harness.launch import LaunchSpec, TensorArg
from harness.python_start import REPO_ROOT, python_command, python_env, python_path
from harness.runner import RunStatus, run_kernel

# module names the child, the workers and the bootstrap import (or start with)
PLANTED = ("json", "runpy", "harness", "oracle", "safetensors", "torch", "cuda", "struct", "traceback", "mmap",
           "ctypes", "tempfile", "signal")


def _plant(folder: Path, marker: Path) -> None:
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A current folder full of planted modules; the marker file they would write."""
    here = tmp_path / "here"
    here.mkdir()
    marker = tmp_path / "marker"
    _plant(here, marker)
    monkeypatch.chdir(here)
    yield marker
    assert not marker.exists(), f"planted modules ran: {marker.read_text()!r}"


def test_a_started_python_has_no_current_folder_entry_and_keeps_pythonpath(planted, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    env = python_env({**os.environ, "PYTHONPATH": f"::{extra}:rel"})
    code = "import sys; print(repr(sys.path))"
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "__init__.py").write_text("")
    (probe / "__main__.py").write_text(code + "\n")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    out = subprocess.run(list(python_command("probe")), env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path = ast.literal_eval(out.stdout)
    here = os.getcwd()
    assert path[0] == str(REPO_ROOT), "the repository root comes first"
    assert str(extra) in path and os.path.join(here, "rel") in path, "PYTHONPATH entries kept, made absolute"
    assert "" not in path and here not in path, "no entry for the current folder"


@pytest.mark.parametrize("version", ["3.10", "3.12", "3.13"])
def test_the_bootstrap_drops_the_current_folder_on_other_pythons(planted, version, tmp_path):
    found = [shutil.which(f"python{version}")] + sorted(glob.glob(os.path.expanduser(
        f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    exe = next((e for e in found if e and subprocess.run([e, "-c", "0"], capture_output=True).returncode == 0), None)
    if exe is None:
        pytest.skip(f"Python {version} is not installed here, so the bootstrap cannot be tried on it.")
    env = {k: v for k, v in python_env().items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path)
    (tmp_path / "probe.py").write_text("import json, sys; print(json.dumps(sys.path))\n")
    out = subprocess.run([exe, *python_command("probe")[1:]], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path = ast.literal_eval(out.stdout)
    assert path[0] == str(tmp_path) and "" not in path and os.getcwd() not in path


def test_the_child_started_ahead_never_imports_from_the_current_folder(planted):
    assert child_process.prestart(0)
    waiting = child_process._waiting[2].proc
    try:
        home = Path(os.readlink(f"/proc/{waiting.pid}/cwd"))
        home_stat = os.stat(home)
        taken = child_process.take(0, child_process.DEFAULT_CHILD)
        home_left = home.exists()
        taken.proc.stdin.close()  # no run comes: end-of-file, and it leaves (having imported all it needs)
        assert taken.proc.wait(timeout=120) == 0
        child_process.close_done(taken)
    finally:
        child_process._stop_waiting()
        if waiting.poll() is None:
            waiting.kill()
    assert taken.proc is waiting and home != Path.cwd(), "it waits in a folder of its own"
    assert stat.S_IMODE(home_stat.st_mode) == 0o700 and home_stat.st_uid == os.getuid()
    assert not home_left, "its private folder goes once it is taken"


def test_a_fresh_child_never_imports_from_the_current_folder(planted):
    run = run_kernel(b"\x7fELF" + bytes(60), "k", LaunchSpec(grid=1, block=1, args=[TensorArg("x")]),
                     {"x": torch.zeros(4)}, timeout_s=120)
    # no GPU here: the real child gets as far as CUDA's set-up, having imported everything it needs
    assert run.status in (RunStatus.SETUP_ERROR, RunStatus.OK), run.describe() + run.stderr_tail


def test_the_workers_never_import_from_the_current_folder(planted, tmp_path):
    from oracle.tools.workers import run_workers

    seen, said = tmp_path / "seen", io.StringIO()
    rows = run_workers(lambda sub, out: ["knobs"], (0, 1), 1, [0], stream=said)
    # `knobs` writes no row; the worker ran the real oracle's command and exited 0
    assert rows[0]["verdict"] == "ERROR" and "exited with" not in said.getvalue(), said.getvalue()
    code = "import os, sys; open(sys.argv[-1], 'w').write(os.getcwd())"
    run_workers(lambda sub, out: [str(seen)], (0, 1), 1, [0], prefix=(sys.executable, "-c", code),
                stream=open(os.devnull, "w"))
    assert seen.read_text() != os.getcwd() and not Path(seen.read_text()).exists(), \
        "a worker runs in a private folder that is gone afterwards"


def test_path_knobs_are_anchored_for_a_process_started_elsewhere():
    env = absolute_paths({"ORACLE_CACHE_DIR": "c", "ORACLE_NVCC": "nvcc", "ORACLE_SINK_DIR": "/abs",
                          "ORACLE_KERNEL_TIMEOUT_S": "5", "ORACLE_SERVER": ""}, "/home/u")
    assert env == {"ORACLE_CACHE_DIR": "/home/u/c", "ORACLE_NVCC": "nvcc", "ORACLE_SINK_DIR": "/abs",
                   "ORACLE_KERNEL_TIMEOUT_S": "5", "ORACLE_SERVER": ""}
    assert absolute_paths({"ORACLE_NVCC": "bin/nvcc"}, "/w")["ORACLE_NVCC"] == "/w/bin/nvcc"


def test_python_path_drops_empty_entries_and_keeps_order():
    got = python_path(f":/a::b:/a:{REPO_ROOT}", "/w").split(os.pathsep)
    assert got == [str(REPO_ROOT), "/a", "/w/b"]


def test_an_op_module_found_only_in_the_current_folder_is_refused_for_workers(tmp_path, monkeypatch):
    from oracle.run.case_types import CaseError
    from oracle.tools.verify import _check_workers_import

    (tmp_path / "myops_here.py").write_text("def gemm(a, b):\n    return a @ b\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    import myops_here  # noqa: F401

    try:
        with pytest.raises(CaseError, match="current folder.*PYTHONPATH"):
            _check_workers_import("myops_here:gemm")
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        _check_workers_import("myops_here:gemm")  # on PYTHONPATH: the workers import it too
    finally:
        sys.modules.pop("myops_here", None)

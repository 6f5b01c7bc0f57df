"""The child-process runner without a GPU: stand-in children (through `child_cmd`) that hang, die,
write garbage, fake a fault after tapping the sink, or do the work in Python; and the real child,
which must report a missing driver cleanly."""

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from cuda_tools import cuda_driver_works  # tests/ on sys.path
from harness import _protocol as P
from harness import _tensorio
from harness.launch import LaunchSpec, ScalarArg, TensorArg, TensorMapArg
from harness.runner import RunnerError, RunStatus, SinkRequest, run_kernel
from harness.tensormap import operand_tensormap

CUBIN = b"\x7fELF" + b"\0" * 60
VADD = LaunchSpec(grid=1, block=64, args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"), ScalarArg(64)])


def py_child(body: str) -> list[str]:
    """A stand-in child: Python source run with the run directory as sys.argv[1]."""
    prelude = ("import json, os, sys, time, mmap\nfrom pathlib import Path\n"
               "from harness import _protocol as P, _tensorio\n"
               "run = Path(sys.argv[1])\nreq = json.loads((run / P.REQUEST).read_text())\n"
               "prog = P.Progress(run)\n")
    return [sys.executable, "-c", prelude + body]


def vadd_tensors(n=64):
    x = torch.arange(n, dtype=torch.float32)
    return {"x": x, "y": 2 * x, "z": torch.empty(n)}


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


# --------------------------------------------------------------------------- stand-in children

ADD_IN_PYTHON = r'''
import struct
prog.mark("launch"); prog.mark("sync")
found, _ = _tensorio.read(run / P.INPUTS)
x = struct.unpack("<64f", found["x"][1]); y = struct.unpack("<64f", found["y"][1])
prog.mark("download")
_tensorio.write(run / P.OUTPUTS, [("z", "F32", (64,), struct.pack("<64f", *[a + b for a, b in zip(x, y)]))])
P.write_json_atomic(run / P.STATUS, {"status": "OK", "phase": "done", "kernel_s": 0.001,
                                      "device": {"name": "stand-in"}})
prog.mark("done")
'''


def test_ok_run_brings_outputs_back():
    run = run_kernel(CUBIN, "vadd", VADD, vadd_tensors(), child_cmd=py_child(ADD_IN_PYTHON), timeout_s=30)
    assert run.ok, run.describe()
    assert run.status is RunStatus.OK and not run.kernel_fault
    assert torch.equal(run.outputs["z"], 3 * torch.arange(64, dtype=torch.float32))
    assert run.kernel_s == 0.001 and run.device == {"name": "stand-in"}
    assert run.phase == "done" and run.returncode == 0
    assert run.sink is None and run.run_dir is None


PHASES_WITH_PAUSES = r'''
prog.mark("upload"); time.sleep(0.3)
prog.mark("launch"); prog.mark("sync"); time.sleep(0.2)
prog.mark("download")
P.write_json_atomic(run / P.STATUS, {"status": "OK", "phase": "done"})
prog.mark("done"); time.sleep(0.4)
'''


def test_the_childs_phases_are_timed_from_its_progress_marks():
    run = run_kernel(CUBIN, "vadd", VADD, vadd_tensors(), child_cmd=py_child(PHASES_WITH_PAUSES), timeout_s=30)
    assert run.ok, run.describe()
    s = run.phases_s
    assert list(s) == ["upload", "launch", "sync", "download", "done"]
    assert 0.3 <= s["upload"] < 1.3 and 0.2 <= s["sync"] < 1.2 and s["launch"] < 0.2
    # the last mark's phase lasts until the parent saw the child gone: its pause after "done"
    assert 0.4 <= s["done"] <= run.elapsed_s
    assert sum(s.values()) <= run.elapsed_s + 0.05


def test_a_run_starts_its_child_only_once_the_last_child_that_said_done_is_gone():
    """A child that said it was done may still be tearing its CUDA context down; the next run waits
    for it, so that two runs' GPU memory is never held at once."""
    import subprocess

    from harness import runner

    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    runner._reap_later(lingering, 0, [sys.executable])  # as a run leaves a child that said it was done
    body = ('P.write_json_atomic(run / P.STATUS, {"status": "OK", '
            f'"message": "alive" if os.path.exists("/proc/{lingering.pid}") else "gone"}})\n')
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), child_cmd=py_child(body), timeout_s=30)
    assert run.ok and run.message == "gone", run.describe()


ECHO_REQUEST = r'''
P.write_json_atomic(run / P.STATUS, {"status": "OK", "message": json.dumps(req)})
'''


def test_request_carries_launch_tensors_and_flags():
    spec = operand_tensormap("a", "row", 64, 64, "bf16", block_mn=64, block_k=64)
    launch = LaunchSpec(grid=(2, 1, 1), block=128, shared_mem_bytes=4096,
                        args=[TensorMapArg("a", spec), TensorArg("c", "inout"), ScalarArg(1.5, "f32")])
    tensors = {"a": torch.zeros(64, 64, dtype=torch.bfloat16), "c": torch.zeros(4, dtype=torch.int32)}
    run = run_kernel(CUBIN, "k", launch, tensors, child_cmd=py_child(ECHO_REQUEST), poison_outputs=False,
                     device=3, timeout_s=30)
    req = json.loads(run.message)
    assert req["entry"] == "k" and req["device"] == 3 and req["poison_outputs"] is False
    assert LaunchSpec.from_dict(req["launch"]) == launch
    assert req["tensors"]["a"] == {"role": "in", "st_dtype": "BF16", "shape": [64, 64], "nbytes": 8192,
                                   "torch_dtype": "torch.bfloat16"}
    assert req["tensors"]["c"]["role"] == "inout"
    assert req["sink"] is None


ECHO_INPUTS = r'''
found, _ = _tensorio.read(run / P.INPUTS)
_tensorio.write(run / P.OUTPUTS, [(n, e.dtype, e.shape, d) for n, (e, d) in found.items()])
P.write_json_atomic(run / P.STATUS, {"status": "OK"})
'''


def test_every_dtype_round_trips_and_views_are_made_dense():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 10, generator=g)
    tensors = {
        "f32": base.t(),  # a non-contiguous view: the kernel sees its dense copy
        "f16": base.half(), "bf16": base.bfloat16(), "e4m3": base.to(torch.float8_e4m3fn),
        "e5m2": base.to(torch.float8_e5m2), "i8": (base * 10).to(torch.int8), "i32": (base * 1000).int(),
        "i64": (base * 1e6).long(), "u8": torch.arange(60, dtype=torch.uint8).reshape(6, 10),
        "b": base > 0, "f64": base.double(), "empty": torch.empty(0, 3),
    }
    launch = LaunchSpec(grid=1, block=32, args=[TensorArg(n, "inout") for n in tensors])
    run = run_kernel(CUBIN, "k", launch, tensors, child_cmd=py_child(ECHO_INPUTS), timeout_s=30)
    assert run.ok, run.describe()
    for name, t in tensors.items():
        got = run.outputs[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert torch.equal(got.view(torch.uint8) if got.numel() else got,
                           t.contiguous().view(torch.uint8) if t.numel() else t), name


SLEEP_WITH_GRANDCHILD = r'''
import subprocess
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
(run / "grandchild.pid").write_text(str(g.pid))
prog.mark("init"); prog.mark("context"); prog.mark("load")
time.sleep(120)
'''


def test_a_hanging_child_times_out_and_its_whole_group_dies():
    t0 = time.monotonic()
    run = run_kernel(CUBIN, "vadd", VADD, vadd_tensors(), child_cmd=py_child(SLEEP_WITH_GRANDCHILD),
                     timeout_s=2.0, keep_dir=True)
    took = time.monotonic() - t0
    try:
        assert run.status is RunStatus.TIMEOUT and run.kernel_fault
        assert 2.0 <= run.elapsed_s < 10 and took < 15
        assert run.phase == "load" and "phase load" in run.message
        assert run.returncode is not None and run.returncode < 0
        assert run.outputs == {}
        pid = int((Path(run.run_dir) / "grandchild.pid").read_text())
        deadline = time.monotonic() + 5
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid), "the child's own child survived the kill"
    finally:
        import shutil

        shutil.rmtree(run.run_dir, ignore_errors=True)


TAP_THEN_HANG = r'''
s = req["sink"]
fd = os.open(s["file"], os.O_RDWR)
m = mmap.mmap(fd, s["size"])
prog.mark("sink"); prog.mark("sink_ready", sink_mode="host_mapped_file")
prog.mark("launch"); prog.mark("sync")
m[0:4] = b"TAP!"          # what a kernel writes through the host-mapped sink before it spins
time.sleep(120)
'''


def test_taps_written_before_a_hang_are_recovered():
    init = b"INIT" + bytes(60)
    run = run_kernel(CUBIN, "vadd", VADD, vadd_tensors(), sink=SinkRequest(init), child_cmd=py_child(TAP_THEN_HANG),
                     timeout_s=2.0)
    assert run.status is RunStatus.TIMEOUT
    assert run.phase == "sync" and "still running" in run.message
    assert run.sink == b"TAP!" + bytes(60)
    assert run.sink_source == P.SINK_FILE


FAULT_AFTER_TAP = r'''
s = req["sink"]
fd = os.open(s["file"], os.O_RDWR)
m = mmap.mmap(fd, s["size"])
prog.mark("sink_ready", sink_mode="host_mapped_file"); prog.mark("launch"); prog.mark("sync")
m[4:8] = b"\x01\x02\x03\x04"
P.write_json_atomic(run / P.STATUS, {"status": "CUDA_ERROR", "phase": "sync", "error_code": 700,
                    "error_name": "CUDA_ERROR_ILLEGAL_ADDRESS", "error_call": "cuCtxSynchronize",
                    "message": "cuCtxSynchronize failed"})
'''


def test_a_fault_reports_the_code_and_the_recovered_sink():
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), sink=SinkRequest(bytes(16)), child_cmd=py_child(FAULT_AFTER_TAP),
                     timeout_s=30)
    assert run.status is RunStatus.CUDA_ERROR and run.kernel_fault
    assert (run.error_code, run.error_name, run.error_call) == (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "cuCtxSynchronize")
    assert run.sink == bytes(4) + b"\x01\x02\x03\x04" + bytes(8)
    assert run.outputs == {}


def test_no_sink_before_the_kernel_was_launched():
    body = 'prog.mark("load")\nP.write_json_atomic(run / P.STATUS, {"status": "LOAD_ERROR", "error_code": 500})\n'
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), sink=SinkRequest(bytes(16)), child_cmd=py_child(body),
                     timeout_s=30)
    assert run.status is RunStatus.LOAD_ERROR and not run.kernel_fault
    assert run.sink is None


def test_a_device_sink_is_returned_only_once_copied():
    body = ('prog.mark("sink_ready", sink_mode="device_copy"); prog.mark("launch")\n'
            'P.write_json_atomic(run / P.STATUS, {"status": "CUDA_ERROR", "error_code": 719})\n')
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), sink=SinkRequest(bytes(16), host_mapped=False),
                     child_cmd=py_child(body), timeout_s=30)
    assert run.status is RunStatus.CUDA_ERROR and run.sink is None


@pytest.mark.parametrize("body,match", [
    ("import signal\nprog.mark('launch')\nos.kill(os.getpid(), signal.SIGSEGV)\n", "SIGSEGV"),
    ("sys.exit(3)\n", "exit code 3"),
    ("(run / P.STATUS).write_text('{not json')\n", "unreadable"),
    ("(run / P.STATUS).write_text(json.dumps({'status': 'FINE'}))\n", "malformed"),
])
def test_a_dying_child_is_crashed_not_raised(body, match):
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), child_cmd=py_child(body), timeout_s=30)
    assert run.status is RunStatus.CRASHED and run.kernel_fault
    assert match in run.message


def test_garbage_outputs_are_a_harness_error():
    body = '(run / P.OUTPUTS).write_bytes(b"\\xff" * 3)\nP.write_json_atomic(run / P.STATUS, {"status": "OK"})\n'
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), child_cmd=py_child(body), timeout_s=30)
    assert run.status is RunStatus.HARNESS_ERROR and "unreadable" in run.message


def test_a_child_that_cannot_start_is_a_harness_error():
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), child_cmd=["/nonexistent/python"], timeout_s=30)
    assert run.status is RunStatus.HARNESS_ERROR


def test_temporary_files_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("ORACLE_SINK_DIR", str(tmp_path / "sinks"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    run_kernel(CUBIN, "k", VADD, vadd_tensors(), sink=SinkRequest(bytes(8)), child_cmd=py_child(ADD_IN_PYTHON),
               timeout_s=30)
    assert list((tmp_path / "sinks").iterdir()) == []
    assert list((tmp_path / "runs").iterdir()) == []


def test_timeout_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ORACLE_KERNEL_TIMEOUT_S", "1.0")
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), child_cmd=py_child("time.sleep(60)\n"))
    assert run.status is RunStatus.TIMEOUT and run.elapsed_s < 8


# --------------------------------------------------------------------------- request errors


@pytest.mark.parametrize("tensors,match", [
    ({"x": torch.zeros(4), "y": torch.zeros(4)}, "not given"),
    ({**vadd_tensors(), "w": torch.zeros(1)}, "not used"),
    ({**vadd_tensors(), "x": [1.0]}, "not a torch.Tensor"),
    ({**vadd_tensors(), "x": torch.zeros(2, dtype=torch.complex64)}, "dtype"),
])
def test_bad_requests_raise_before_any_child(tensors, match):
    with pytest.raises(RunnerError, match=match):
        run_kernel(CUBIN, "k", VADD, tensors, child_cmd=["/nonexistent"])


def test_tensor_map_must_fit_its_tensor():
    spec = operand_tensormap("a", "row", 64, 64, "bf16", block_mn=64, block_k=64)
    launch = LaunchSpec(grid=1, block=32, args=[TensorMapArg("a", spec)])
    with pytest.raises(RunnerError, match="is torch.float16"):
        run_kernel(CUBIN, "k", launch, {"a": torch.zeros(64, 64, dtype=torch.float16)})
    with pytest.raises(RunnerError, match="spans 8192 bytes"):
        run_kernel(CUBIN, "k", launch, {"a": torch.zeros(63, 64, dtype=torch.bfloat16)})


def test_cubin_and_sink_arguments_are_checked(tmp_path):
    with pytest.raises(RunnerError, match="not a cubin"):
        run_kernel(b"hello", "k", VADD, vadd_tensors())
    with pytest.raises(RunnerError, match="non-empty"):
        SinkRequest(b"")
    with pytest.raises(RunnerError, match="symbol"):
        SinkRequest(b"x", symbol="a b")
    with pytest.raises(RunnerError, match="timeout"):
        run_kernel(CUBIN, "k", VADD, vadd_tensors(), timeout_s=0)


# --------------------------------------------------------------------------- the real child


@pytest.mark.skipif(cuda_driver_works(), reason="A CUDA driver is present here; the GPU tier covers the real child.")
def test_real_child_reports_a_missing_driver_and_stays_torch_free():
    pytest.importorskip("cuda.bindings.driver")
    run = run_kernel(CUBIN, "vadd", VADD, vadd_tensors(), sink=SinkRequest(bytes(64)), timeout_s=60, keep_dir=True)
    try:
        assert run.status is RunStatus.SETUP_ERROR, run.describe() + run.stderr_tail
        assert run.phase == "init"
        assert run.error_name in ("CUDA_DRIVER_UNAVAILABLE", "CUDA_ERROR_NO_DEVICE")
        assert run.sink is None and not run.kernel_fault
        status = json.loads((Path(run.run_dir) / P.STATUS).read_text())
        assert status["torch_imported"] is False
    finally:
        import shutil

        shutil.rmtree(run.run_dir, ignore_errors=True)


@pytest.mark.skipif(cuda_driver_works(), reason="A CUDA driver is present here; the GPU tier covers the real child.")
def test_a_real_child_started_ahead_reports_the_same_as_one_started_for_the_run():
    pytest.importorskip("cuda.bindings.driver")
    from harness import child_process

    assert child_process.prestart(0)
    waiting = child_process._waiting[2].proc
    try:
        run = run_kernel(CUBIN, "vadd", VADD, vadd_tensors(), sink=SinkRequest(bytes(64)), timeout_s=60,
                         keep_dir=True)
        status = json.loads((Path(run.run_dir) / P.STATUS).read_text())
        assert status["pid"] == waiting.pid
        assert run.status is RunStatus.SETUP_ERROR and run.phase == "init", run.describe() + run.stderr_tail
        assert run.error_name in ("CUDA_DRIVER_UNAVAILABLE", "CUDA_ERROR_NO_DEVICE")
        assert status["torch_imported"] is False
    finally:
        child_process._stop_waiting()
        import shutil

        shutil.rmtree(run.run_dir, ignore_errors=True)


def test_the_child_module_imports_neither_torch_nor_numpy():
    import subprocess

    code = "import sys, harness._child; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    assert out.stdout.split() == ["False", "False"]


def test_tensor_files_are_safetensors_compatible(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int8), "c": torch.randn(2).bfloat16()}
    path = tmp_path / "t.safetensors"
    _tensorio.write(path, [(n, {torch.float32: "F32", torch.int8: "I8", torch.bfloat16: "BF16"}[t.dtype],
                            tuple(t.shape), t.view(torch.uint8).numpy()) for n, t in tensors.items()])
    back = st.load_file(str(path))
    assert all(torch.equal(back[n], t) for n, t in tensors.items())
    path2 = tmp_path / "u.safetensors"
    st.save_file(tensors, str(path2))
    found, _ = _tensorio.read(path2)
    assert found["a"][1] == tensors["a"].numpy().tobytes()
    for e in _tensorio.entries(path):
        assert e.offset % _tensorio.ITEMSIZE[e.dtype] == 0


@pytest.mark.nvcc
def test_run_source_turns_a_compile_error_into_a_result(tmp_path):
    from harness.runner import run_source

    run = run_source('extern "C" __global__ void k() { nope(); }\n', "k", LaunchSpec(grid=1, block=1), {},
                     build={"cache_dir": tmp_path})
    assert run.status is RunStatus.BUILD_ERROR and "nope" in run.message


def test_cubin_paths_are_checked(tmp_path):
    with pytest.raises(RunnerError, match="cannot use"):
        run_kernel(tmp_path / "missing.cubin", "k", VADD, vadd_tensors())
    (tmp_path / "text.cubin").write_text("not a cubin")
    with pytest.raises(RunnerError, match="not a cubin"):
        run_kernel(tmp_path / "text.cubin", "k", VADD, vadd_tensors())


SINK_HOME = r'''
sink = Path(req["sink"]["file"])
st = os.stat(sink.parent)
Path(os.environ["SINK_SEEN"]).write_text(json.dumps(
    {"file": str(sink), "home_mode": st.st_mode & 0o777, "file_mode": os.stat(sink).st_mode & 0o777,
     "home_owner": st.st_uid == os.getuid()}))
(sink.parent / "sink.bin.grow-left").write_bytes(b"a regrown sink a killed child left")
'''


def test_the_sink_lives_in_a_private_folder_that_is_removed_whole(tmp_path, monkeypatch):
    import os
    import stat

    monkeypatch.setenv("ORACLE_SINK_DIR", str(tmp_path / "sinks"))
    monkeypatch.setenv("SINK_SEEN", str(tmp_path / "seen.json"))
    (tmp_path / "sinks").mkdir()
    planted = tmp_path / "sinks" / "oracle-sink-planted"
    os.symlink(tmp_path / "victim", planted)
    body = SINK_HOME + "sys.exit(0)\n"
    run = run_kernel(CUBIN, "k", VADD, vadd_tensors(), sink=SinkRequest(bytes(8)), child_cmd=py_child(body),
                     timeout_s=30)
    assert (tmp_path / "seen.json").exists(), run.stderr_tail
    seen = json.loads((tmp_path / "seen.json").read_text())
    home = Path(seen["file"]).parent
    assert home.parent == tmp_path / "sinks" and home.name.startswith("oracle-sink-") and home != planted
    assert seen["home_mode"] == 0o700 and seen["file_mode"] == 0o600 and seen["home_owner"]
    assert sorted(os.listdir(tmp_path / "sinks")) == ["oracle-sink-planted"], "its folder gone, whole"
    assert stat.S_ISLNK(os.lstat(planted).st_mode)

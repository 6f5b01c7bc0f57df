"""The real child (harness._child) end to end under the real runner, with the driver emulated in
host memory: "device" buffers are ctypes buffers, a launch runs a Python stand-in of the kernel that
reads its arguments through the kernelParams pointer array exactly as the driver would. This covers
request parsing, upload, poisoning, the sink symbol, tensor-map encoding order, argument packing,
error mapping and the output files without a GPU."""

import signal
import struct
import sys

import torch

from harness import _protocol as P
from harness.launch import LaunchSpec, ScalarArg, TensorArg, TensorMapArg
from harness.runner import RunStatus, SinkRequest, run_kernel
from harness.tensormap import TensorMapSpec
from emulated_driver import DRIVER_IN_HOST_MEMORY  # tests/ is on sys.path

CUBIN = b"\x7fELF" + b"\0" * 60

EMULATED_CHILD = DRIVER_IN_HOST_MEMORY + r'''
STATE = {"pending": None}
SYMBOL = ctypes.create_string_buffer(8)

class Function:
    def __init__(self, name): self.name = name
    def set_max_dynamic_shared(self, n): pass
    def allow_non_portable_cluster(self): pass
    def attribute(self, name): return 0

class Module:
    def __init__(self, image): assert image[:4] == b"\x7fELF"
    def function(self, name):
        if name not in KERNELS:
            raise cu.CudaError(500, "CUDA_ERROR_NOT_FOUND", f"no kernel named {name!r}", "cuModuleGetFunction")
        return Function(name)
    def global_(self, name):
        if name != "oracle_trace_sink":
            raise cu.CudaError(500, "CUDA_ERROR_NOT_FOUND", f"no __device__ symbol named {name!r}", "cuModuleGetGlobal")
        return ctypes.addressof(SYMBOL), 8

def register(addr, n):
    if os.environ.get("EMULATED_REGISTER_FAILS"):
        raise cu.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "refused", "cuMemHostRegister")
    return cu.HostMapped(addr, addr, n, True)

def args(params, n):
    ptrs = (ctypes.c_void_p * n).from_address(params)
    return ptrs

def q(p): return struct.unpack("<Q", ctypes.string_at(p, 8))[0]
def i32(p): return struct.unpack("<i", ctypes.string_at(p, 4))[0]

def tap(word):
    sink = q(ctypes.addressof(SYMBOL))
    if sink:
        (ctypes.c_uint32 * 2).from_address(sink)[:] = [0xC0FFEE00 | word, 7]

def vadd(params):
    a = args(params, 4)
    n = i32(a[3])
    x, y, z = (ctypes.c_float * (n + 1)).from_address(q(a[0])), (ctypes.c_float * (n + 1)).from_address(q(a[1])), \
        (ctypes.c_float * (n + 1)).from_address(q(a[2]))
    for i in range(n):
        z[i] = x[i] + y[i]
    tap(4)

def fault(params):
    tap(1)
    STATE["pending"] = cu.CudaError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "illegal address", "cuCtxSynchronize")

def tma(params):
    a = args(params, 3)
    encoded = ctypes.string_at(a[0], 128)
    (ctypes.c_int64 * 2).from_address(q(a[2]))[:] = [int(encoded[:8] == ctypes.string_at(a[1], 8)),
                                                     int(encoded[8:12] == b"bf16")]

def overflow(params):
    # six trace records, reserved as the device does: the ones past the area are dropped
    sink = q(ctypes.addressof(SYMBOL))
    record = bytes.fromhex(os.environ["EMULATED_RECORD"])
    head = (ctypes.c_uint64 * 3).from_address(sink)
    hb = ctypes.c_uint16.from_address(sink + 6).value  # the header's size: records start there
    area = head[1] - hb
    for _ in range(6):
        off = head[2]
        head[2] = off + len(record)
        if off + len(record) > area:
            counts = (ctypes.c_uint32 * 1).from_address(sink + 24)
            counts[0] += 1
            by_stage = (ctypes.c_uint32 * ((hb - 448) // 4)).from_address(sink + 448)
            by_stage[record[8]] += 1
            if off < area:
                ctypes.memmove(sink + hb + off, struct.pack("<IHH", area - off, 5, 0xC0DE), 8)
        else:
            ctypes.memmove(sink + hb + off, record, len(record))

def overrun(params):
    # vadd's arguments; writes its n values and two more past the end of z, and one byte before it
    a = args(params, 4)
    n = i32(a[3])
    z = (ctypes.c_float * (n + 2)).from_address(q(a[2]))
    for i in range(n + 2):
        z[i] = 1.0
    ctypes.memset(q(a[2]) - 3, 0, 1)

def die(params):
    os._exit(3)  # the process gone mid-launch, with no word on its done pipe

KERNELS = {"vadd": vadd, "fault": fault, "tma": tma, "overflow": overflow, "overrun": overrun, "die": die}

def launch(function, grid, block, smem, params, cluster=None, stream=0):
    KERNELS[function.name](params)

def synchronize():
    err, STATE["pending"] = STATE["pending"], None
    if err is not None:
        raise err

def encode(spec, address):
    return struct.pack("<Q", address) + spec.dtype.encode().ljust(120, b"\0")

if os.environ.get("EMULATED_TEARDOWN_S"):  # a context whose teardown takes this long at exit
    import time
    real_exit = os._exit
    os._exit = lambda code: (time.sleep(float(os.environ["EMULATED_TEARDOWN_S"])), real_exit(code))

cu.Module = Module
cu.host_register_mapped = register
cu.launch, cu.synchronize = launch, synchronize
_child.encode = encode
_child.main(sys.argv[1:])
'''

CHILD = [sys.executable, "-c", EMULATED_CHILD]
N = 33


def vadd_run(**kw):
    x = torch.arange(N + 1, dtype=torch.float32)
    launch = LaunchSpec(grid=1, block=32, args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"), ScalarArg(N)])
    tensors = {"x": x, "y": 10 * x, "z": torch.zeros(N + 1)}
    return run_kernel(CUBIN, kw.pop("entry", "vadd"), launch, tensors, child_cmd=CHILD, timeout_s=60, **kw)


def test_ok_run_outputs_poison_and_sink():
    run = vadd_run(sink=SinkRequest(bytes(32)))
    assert run.ok, run.describe() + run.stderr_tail
    z = run.outputs["z"]
    assert torch.equal(z[:N], 11 * torch.arange(N, dtype=torch.float32))
    assert torch.isnan(z[N]), "the element no one wrote keeps the poison"
    assert run.sink_source == P.SINK_FILE
    assert struct.unpack("<2I", run.sink[:8]) == (0xC0FFEE04, 7)
    assert run.device["name"] == "emulated" and run.device["driver_version"] == 12080


def test_a_write_outside_an_output_is_read_from_its_guard_bands():
    clean = vadd_run()
    assert clean.ok and clean.guard_breaches == ()
    launch = LaunchSpec(grid=1, block=32, args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"), ScalarArg(N)])
    x = torch.arange(N, dtype=torch.float32)
    run = run_kernel(CUBIN, "overrun", launch, {"x": x, "y": x, "z": torch.zeros(N)}, child_cmd=CHILD, timeout_s=60)
    assert run.ok, run.describe() + run.stderr_tail
    after = next(b for b in run.guard_breaches if b.side == "after")
    before = next(b for b in run.guard_breaches if b.side == "before")
    assert (after.tensor, after.first, after.last, after.nbytes) == ("z", 4 * N, 4 * N + 7, 4 * N)
    assert (before.first, before.last, before.changed) == (-3, -3, 1)
    assert torch.equal(run.outputs["z"], torch.ones(N))


def test_without_poison_outputs_start_at_zero():
    run = vadd_run(poison_outputs=False)
    assert run.ok and run.outputs["z"][N] == 0


def test_device_sink_is_copied_back_after_a_clean_run():
    run = vadd_run(sink=SinkRequest(bytes(32), host_mapped=False))
    assert run.ok and run.sink_source == P.SINK_DEVICE_COPY
    assert struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE04


def test_registration_failure_falls_back_to_pinned_memory(monkeypatch):
    monkeypatch.setenv("EMULATED_REGISTER_FAILS", "1")
    run = vadd_run(sink=SinkRequest(bytes(32)))
    assert run.ok and run.sink_source == P.SINK_PINNED_COPY
    assert struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE04


def test_fault_maps_to_cuda_error_with_the_sink():
    run = vadd_run(entry="fault", sink=SinkRequest(bytes(32)))
    assert run.status is RunStatus.CUDA_ERROR and run.kernel_fault
    assert (run.error_code, run.error_name, run.phase) == (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "sync")
    assert struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE01
    assert run.outputs == {}


def test_fallback_sink_is_recovered_after_a_fault_too(monkeypatch):
    monkeypatch.setenv("EMULATED_REGISTER_FAILS", "1")
    run = vadd_run(entry="fault", sink=SinkRequest(bytes(32)))
    assert run.status is RunStatus.CUDA_ERROR and run.sink_source == P.SINK_PINNED_COPY
    assert struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE01


def test_load_errors():
    run = vadd_run(entry="missing")
    assert run.status is RunStatus.LOAD_ERROR and run.error_code == 500 and "missing" in run.message
    run = vadd_run(sink=SinkRequest(bytes(8), symbol="other_sink"))
    assert run.status is RunStatus.LOAD_ERROR and "other_sink" in run.message and run.sink is None


def test_tensor_map_is_encoded_against_its_tensor():
    spec = TensorMapSpec(dtype="bf16", global_dims=(64, 8), global_strides=(128,), box_dims=(64, 8), swizzle=128)
    launch = LaunchSpec(grid=1, block=32, args=[TensorMapArg("a", spec), TensorArg("a"), TensorArg("out", "out")])
    run = run_kernel(CUBIN, "tma", launch, {"a": torch.zeros(8, 64, dtype=torch.bfloat16),
                                            "out": torch.zeros(2, dtype=torch.int64)}, child_cmd=CHILD, timeout_s=60)
    assert run.ok, run.describe()
    assert run.outputs["out"].tolist() == [1, 1]


from harness.trace_format import HEADER_BYTES as HB  # noqa: E402  (the sink header's bytes)


def _overflowing_run(monkeypatch, capacity, max_bytes):
    from harness import trace_format as tf

    rec = tf.encode_record(tf.RecordKind.ELEMENTS, tf.ELEMENTS_BODY.pack(1, 0) + struct.pack("<If", 0, 1.0),
                           stage="mma", dtype="fp32", tile=(0, 0), k_block=0, shape=(4, 4))
    monkeypatch.setenv("EMULATED_RECORD", rec.hex())
    prefix = tf.sink_prefix(capacity)
    run = vadd_run(entry="overflow", sink=SinkRequest(prefix, capacity=capacity, max_bytes=max_bytes))
    assert run.ok, run.describe() + run.stderr_tail
    return run, tf.parse_trace(run.sink, block_m=4, block_n=4, block_k=4), len(rec)


def test_an_overflowing_sink_is_measured_and_the_kernel_launched_again(monkeypatch):
    run, res, size = _overflowing_run(monkeypatch, HB + 2 * 64, max_bytes=1 << 16)
    assert run.sink_overflow["relaunched"] and run.sink_overflow["needed"] == HB + 6 * size
    assert res.dropped == 0 and res.records == 6 and res.capacity >= HB + 6 * size


def test_an_overflow_past_the_ceiling_keeps_the_first_run_and_says_so(monkeypatch):
    run, res, size = _overflowing_run(monkeypatch, HB + 2 * 64, max_bytes=HB + 3 * 64)
    assert run.sink_overflow == {"first_capacity": HB + 2 * 64, "needed": HB + 6 * size, "max_size": HB + 3 * 64,
                                 "relaunched": False}
    assert res.dropped == 4 and dict(res.dropped_by_stage) == {"mma": 4}


def test_without_a_ceiling_an_overflow_is_left_as_it_is(monkeypatch):
    run, res, _ = _overflowing_run(monkeypatch, HB + 2 * 64, max_bytes=None)
    assert run.sink_overflow is None and res.dropped == 4


def _status_pid(run) -> int:
    import json
    import shutil
    from pathlib import Path

    try:
        return json.loads((Path(run.run_dir) / P.STATUS).read_text())["pid"]
    finally:
        shutil.rmtree(run.run_dir, ignore_errors=True)


def test_a_prestarted_child_runs_the_next_run_of_its_command():
    from harness import child_process

    assert child_process.prestart(0, CHILD)
    waiting = child_process._waiting[2].proc
    try:
        run = vadd_run(sink=SinkRequest(bytes(32)), keep_dir=True)
        assert run.ok, run.describe() + run.stderr_tail
        assert _status_pid(run) == waiting.pid, "the run went to the child started ahead"
        assert torch.equal(run.outputs["z"][:N], 11 * torch.arange(N, dtype=torch.float32))
        assert torch.isnan(run.outputs["z"][N]) and struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE04
        # it said done and left: by itself, or by the SIGKILL to its group that ends every run
        assert child_process._waiting is None and waiting.wait(timeout=60) in (0, -signal.SIGKILL), \
            "it was the run's, and left"
        again = vadd_run(keep_dir=True)  # none waits now: a fresh child, as before
        assert again.ok and _status_pid(again) != waiting.pid
    finally:
        child_process._stop_waiting()


def test_a_run_ends_when_its_child_says_done_not_when_its_teardown_ends(monkeypatch):
    import time

    from harness import child_process

    monkeypatch.setenv("EMULATED_TEARDOWN_S", "30")
    assert child_process.prestart(0, CHILD)
    waiting = child_process._waiting[2].proc
    try:
        t0 = time.monotonic()
        run = vadd_run(sink=SinkRequest(bytes(32)))
        took = time.monotonic() - t0
        assert run.ok, run.describe() + run.stderr_tail
        assert torch.equal(run.outputs["z"][:N], 11 * torch.arange(N, dtype=torch.float32))
        assert struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE04
        assert took < 20 and run.returncode is None, "the run waited for the child's teardown"
        assert run.phases_s["exit"] < 20
        assert waiting.wait(timeout=30) is not None, "the child is reaped (killed with its group) all the same"
    finally:
        child_process._stop_waiting()


def _prestarted_vadd_run(**kw):
    """vadd_run(**kw) on a child started ahead (stopped afterwards if the run did not take it)."""
    from harness import child_process

    assert child_process.prestart(0, CHILD)
    try:
        return vadd_run(**kw)
    finally:
        child_process._stop_waiting()


def test_a_child_gone_without_a_word_on_its_done_pipe_is_a_crash():
    run = _prestarted_vadd_run(entry="die", sink=SinkRequest(bytes(32)))
    assert run.status is RunStatus.CRASHED and run.returncode == 3 and run.phase == "launch", run.describe()


def test_a_prestarted_child_reports_a_fault_in_its_run_directory():
    run = _prestarted_vadd_run(entry="fault", sink=SinkRequest(bytes(32)))
    assert run.status is RunStatus.CUDA_ERROR and run.phase == "sync"
    assert struct.unpack("<I", run.sink[:4])[0] == 0xC0FFEE01


def test_a_prestarted_child_is_kept_from_runs_of_another_command_or_device_and_stopped_at_exit():
    from harness import child_process

    assert child_process.prestart(1, CHILD)
    waiting = child_process._waiting[2].proc
    try:
        assert not child_process.prestart(1, CHILD), "one waits at a time"
        run = vadd_run(keep_dir=True)  # device 0: not the waiting child's
        assert run.ok and _status_pid(run) != waiting.pid
        assert child_process.take(1, ["python", "-m", "other"]) is None
        assert child_process._waiting is not None and waiting.poll() is None
    finally:
        child_process._stop_waiting()
    assert child_process._waiting is None and waiting.poll() is not None


def test_a_waiting_child_leaves_when_its_parent_closes_the_pipe():
    from harness import child_process

    assert child_process.prestart(0, CHILD)
    waiting = child_process._waiting[2]
    child_process._waiting = None
    waiting.proc.stdin.close()  # what the parent's exit does
    assert waiting.proc.wait(timeout=60) == 0
    child_process.close_done(waiting)


def _keeping_a_child_ahead(monkeypatch, seconds: str):
    from harness import child_process

    monkeypatch.setenv("ORACLE_CHILD_AHEAD_S", seconds)
    monkeypatch.setattr(child_process, "_ahead", "unsaid")
    child_process.keep_ahead()
    return child_process


def _run_on_a_child_started_ahead(**kw):
    """vadd_run on a prestarted child (which says done, as the oracle's own child does), its
    reaping and what that starts ahead awaited."""
    from harness import child_process, runner

    assert child_process.prestart(0, CHILD)
    run = vadd_run(**kw)
    runner._join_reapers()
    return run


def _settle():
    from harness import child_process, runner

    runner._join_reapers()
    child_process._stop_waiting()


def test_a_process_that_keeps_a_child_ahead_starts_the_next_runs_child_once_the_last_is_gone(monkeypatch):
    child_process = _keeping_a_child_ahead(monkeypatch, "60")
    try:
        run = _run_on_a_child_started_ahead(sink=SinkRequest(bytes(32)), keep_dir=True)
        assert run.ok, run.describe() + run.stderr_tail
        assert set(run.started_ahead) == {"context_s", "waited_s", "context_held"}, run.started_ahead
        ahead = child_process._waiting
        assert ahead is not None and ahead.command == tuple(CHILD) and ahead.device == 0 and ahead.timer is not None
        assert ahead.child.proc.pid != _status_pid(run), "a new child, started once the run's was gone"
        again = vadd_run(keep_dir=True)
        assert again.ok and _status_pid(again) == ahead.child.proc.pid, "the next run went to the child ahead"
        assert again.started_ahead is not None and again.started_ahead["context_held"]
    finally:
        _settle()


def test_a_child_ahead_that_no_run_takes_is_stopped_after_its_idle_time(monkeypatch):
    import time

    child_process = _keeping_a_child_ahead(monkeypatch, "1.5")
    try:
        assert _run_on_a_child_started_ahead().ok
        ahead = child_process._waiting
        assert ahead is not None, "a child was started ahead after the run"
        assert ahead.child.proc.wait(timeout=30) is not None, "stopped once idle"
        deadline = time.monotonic() + 10
        while child_process._waiting is not None and time.monotonic() < deadline:
            time.sleep(0.05)  # _expire clears the record right after the stop
        assert child_process._waiting is None and not ahead.home.exists()
    finally:
        _settle()


def test_the_plain_command_and_a_zero_knob_keep_no_child_ahead(monkeypatch):
    child_process = _keeping_a_child_ahead(monkeypatch, "0")
    started = []
    prestart = child_process.prestart
    monkeypatch.setattr(child_process, "prestart", lambda *a, **kw: started.append(kw) or prestart(*a, **kw))
    try:
        assert _run_on_a_child_started_ahead().ok
        assert child_process._waiting is None and started == [{}], "ORACLE_CHILD_AHEAD_S=0: none after the run"
        monkeypatch.setenv("ORACLE_CHILD_AHEAD_S", "60")
        child_process.one_run_only()
        child_process.keep_ahead()  # a run's request path asks; the plain command said no first
        assert _run_on_a_child_started_ahead().ok
        assert child_process._waiting is None and started == [{}, {}], "the plain command: none after the run"
    finally:
        _settle()


def test_a_forked_copy_of_the_process_does_not_take_its_parents_child_ahead():
    import os

    from harness import child_process

    assert child_process.prestart(0, CHILD)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the copy: not its child to take, nor to stop
            took = child_process.take(0, CHILD)
            child_process._stop_waiting()
            os.write(w, b"1" if took is None else b"0")
            os._exit(0)
        os.close(w)
        answer = os.read(r, 1)
        os.waitpid(pid, 0)
        assert answer == b"1", "the forked copy took its parent's child"
        assert child_process._waiting is not None and child_process._waiting.child.proc.poll() is None
    finally:
        child_process._stop_waiting()


def _bare_sink(tmp_path, monkeypatch):
    """A _Sink over a real file without CUDA: mapping and registration are left out, regrow's file
    handling is what runs."""
    from pathlib import Path

    from harness._child import _Sink

    home = tmp_path / "oracle-sink-x"
    home.mkdir(mode=0o700)
    path = home / "sink.bin"
    path.write_bytes(b"\x01" * 512)
    sink = _Sink.__new__(_Sink)
    sink.path, sink.size, sink.prefix, sink.status = Path(path), 512, b"\x01" * 512, {}
    monkeypatch.setattr(_Sink, "_open", lambda self: None)
    monkeypatch.setattr(_Sink, "_close", lambda self: None)
    return sink


def test_regrow_never_writes_through_a_link_planted_at_the_old_name(tmp_path, monkeypatch):
    import os
    import stat

    sink = _bare_sink(tmp_path, monkeypatch)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.chmod(victim, 0o640)
    os.symlink(victim, str(sink.path) + ".grow")  # the name the old regrow used
    assert sink.regrow(8192)
    assert victim.read_bytes() == b"keep me" and stat.S_IMODE(victim.stat().st_mode) == 0o640
    st = os.lstat(sink.path)
    assert stat.S_ISREG(st.st_mode) and st.st_size == 8192 and stat.S_IMODE(st.st_mode) == 0o600
    assert sink.path.read_bytes()[8:16] == (8192).to_bytes(8, "little")
    assert os.path.islink(str(sink.path) + ".grow"), "what it did not make it leaves alone"


def test_regrow_neither_waits_on_nor_removes_a_fifo_planted_at_the_old_name(tmp_path, monkeypatch):
    import os
    import threading

    sink = _bare_sink(tmp_path, monkeypatch)
    fifo = str(sink.path) + ".grow"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(sink.regrow(4096)), daemon=True)
    t.start()
    t.join(timeout=30)
    assert done == [True], "regrow hung or failed on a FIFO it did not make"
    assert os.path.exists(fifo) and os.path.getsize(sink.path) == 4096


def test_a_regrow_that_fails_removes_only_its_own_file(tmp_path, monkeypatch):
    import os

    sink = _bare_sink(tmp_path, monkeypatch)

    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    assert not sink.regrow(1 << 20) and "No space" in sink.status["sink_regrow_error"]
    assert sorted(p.name for p in sink.path.parent.iterdir()) == ["sink.bin"]

"""GPU: taps written before a crash or a hang survive in a host-mapped sink.

Each fault kernel of harness/examples/faults.cu runs in a child process (a crash poisons the
CUDA context for good): the child puts the sink in host-mapped pinned memory, launches, and
writes the sink's bytes to a file after the fault (or, for the hang, once the records are
visible). The parent parses them with partial=True.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from cuda_tools import traced_example_cubin  # tests/ on sys.path
from harness.trace_format import parse_trace, sink_init_bytes

pytestmark = pytest.mark.gpu

THREADS = 32
RECORD_BYTES = 56  # one element record of one fp32 value: 40 + 8 + 4 + 4

CHILD = textwrap.dedent("""
    import ctypes, os, struct, sys, time
    from cuda.bindings import driver as cu

    def check(result):
        err, *rest = result
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"driver call failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    cubin, kernel, init_path, out_path, threads, expect = sys.argv[1:7]
    threads, expect = int(threads), int(expect)
    init = open(init_path, "rb").read()
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    mod = check(cu.cuModuleLoadData(open(cubin, "rb").read()))
    fn = check(cu.cuModuleGetFunction(mod, kernel.encode()))
    host = check(cu.cuMemHostAlloc(len(init), cu.CU_MEMHOSTALLOC_DEVICEMAP))
    ctypes.memmove(host, init, len(init))
    dptr = check(cu.cuMemHostGetDevicePointer(host, 0))
    sym, size = check(cu.cuModuleGetGlobal(mod, b"oracle_trace_sink"))
    check(cu.cuMemcpyHtoD(sym, struct.pack("<Q", int(dptr)), 8))
    out = check(cu.cuMemAlloc(4 * threads))
    args = [ctypes.c_void_p(int(out)), ctypes.c_int(threads)]
    params = (ctypes.c_void_p * 2)(*[ctypes.addressof(a) for a in args])
    check(cu.cuLaunchKernel(fn, 1, 1, 1, threads, 1, 1, 0, 0, ctypes.addressof(params), 0))
    if kernel == "fault_hang":
        deadline = time.time() + 30
        while time.time() < deadline:
            if struct.unpack_from("<Q", ctypes.string_at(host, 24), 16)[0] >= expect:
                break
            time.sleep(0.01)
        status = "running"
    else:
        err = cu.cuCtxSynchronize()[0]
        status = str(int(getattr(err, "value", err)))
    time.sleep(0.1)
    with open(out_path, "wb") as f:
        f.write(ctypes.string_at(host, len(init)))
    print(status, flush=True)
    os._exit(0)
""")


@pytest.fixture(scope="module")
def faults_cubin(tmp_path_factory) -> Path:
    return traced_example_cubin("faults.cu", tmp_path_factory.mktemp("faults") / "faults.cubin")


@pytest.mark.parametrize("kernel,status", [("fault_illegal_address", "700"), ("fault_trap", "719"),
                                           ("fault_hang", "running")])
def test_taps_survive_the_fault(faults_cubin, tmp_path, kernel, status):
    init = tmp_path / "init.bin"
    out = tmp_path / "sink.bin"
    init.write_bytes(sink_init_bytes(1 << 16))
    cmd = [sys.executable, "-c", CHILD, str(faults_cubin), kernel, str(init), str(out), str(THREADS),
           str(THREADS * RECORD_BYTES)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.stdout.strip() == status, proc.stderr
    except subprocess.TimeoutExpired:
        assert kernel == "fault_hang", "the child hung"  # exiting with a spinning kernel may be slow
    res = parse_trace(out.read_bytes(), block_m=16, block_n=16, block_k=16, partial=True)
    (tap,) = res.taps
    assert tap.key == ("mma", (0, 0), 0)
    want = torch.zeros(16, 16, dtype=torch.bool)
    want.view(-1)[:THREADS] = True
    assert torch.equal(tap.mask, want)
    assert torch.equal(tap.values.view(-1)[:THREADS], torch.arange(THREADS, dtype=torch.float32))

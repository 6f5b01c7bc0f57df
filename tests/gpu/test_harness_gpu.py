"""The harness on a real GPU (H200): build at test time, run in the child, faults, hangs, TMA.

All kernels live in one source (one nvcc call, about a second); `tests/cpu/test_harness_build.py`
compiles the same source on the CPU tier, so a syntax slip never costs GPU time. The kernels write a
marker word through `oracle_trace_sink` (declared here, not taken from the trace header, so these
tests depend on the harness only) before they fault, to prove the taps survive the fault.
"""

import random
import struct
import time

import pytest
import torch

from harness import _protocol as P
from harness.build import build_cubin
from harness.launch import LaunchSpec, ScalarArg, StructArg, TensorArg, TensorMapArg
from harness.runner import RunStatus, SinkRequest, run_kernel
from harness.tensormap import MAP_DTYPES, TensorMapSpec, swizzle_offset, tensormap_problems

pytestmark = pytest.mark.gpu

KERNELS = r'''
#include <cuda.h>

__device__ unsigned int* oracle_trace_sink;

__device__ __forceinline__ void tap(unsigned int word) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && oracle_trace_sink != nullptr) {
    oracle_trace_sink[0] = 0xC0FFEE00u | word;
    oracle_trace_sink[1] = blockDim.x;
    __threadfence_system();
  }
}

extern "C" __global__ void vadd(const float* x, const float* y, float* z, int write_n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < write_n) z[i] = x[i] + y[i];
}

extern "C" __global__ void tap_only() { tap(4); }

extern "C" __global__ void fault_illegal_address(unsigned long long bad_address) {
  tap(1);
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile int*>(bad_address) = 1;
}

extern "C" __global__ void fault_trap() {
  tap(2);
  __syncthreads();
  if (threadIdx.x == 0) __trap();
}

extern "C" __global__ void fault_spin(const volatile unsigned int* never_set) {
  tap(3);
  while (never_set[0] == 0u) { __nanosleep(1000); }
}

extern "C" __global__ void scalars(double* out, int a, long long b, unsigned int c, float d, double e,
                                   unsigned long long f, int3 s) {
  if (threadIdx.x == 0) {
    out[0] = a; out[1] = (double)b; out[2] = c; out[3] = d; out[4] = e; out[5] = (double)f;
    out[6] = s.x; out[7] = s.y; out[8] = s.z;
  }
}

extern "C" __global__ void smem_reverse(const unsigned int* in, unsigned int* out, unsigned int n) {
  extern __shared__ unsigned int buf[];
  for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = in[i];
  __syncthreads();
  for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}

extern "C" __global__ void cluster_rank(unsigned int* out) {
  unsigned int rank, cid;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
  if (threadIdx.x == 0) { out[2 * blockIdx.x] = rank; out[2 * blockIdx.x + 1] = cid; }
}

// One TMA box load into a 1024-byte aligned shared tile, then the raw shared bytes out.
extern "C" __global__ void tma_load_2d(const __grid_constant__ CUtensorMap map, unsigned char* out,
                                       int c0, int c1, unsigned int nbytes, unsigned long long* tile_addr) {
  __shared__ __align__(1024) unsigned char tile[8192];
  __shared__ __align__(8) unsigned long long bar;
  unsigned int tile_s = static_cast<unsigned int>(__cvta_generic_to_shared(tile));
  unsigned int bar_s = static_cast<unsigned int>(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_s) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar_s), "r"(nbytes) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        :: "r"(tile_s), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(bar_s)
        : "memory");
  }
  __syncthreads();
  unsigned int done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar_s), "r"(0u) : "memory");
  }
  for (unsigned int i = threadIdx.x; i < nbytes; i += blockDim.x) out[i] = tile[i];
  if (threadIdx.x == 0) tile_addr[0] = tile_s;
}
'''

MARKER = 0xC0FFEE00
SINK_INIT = bytes(64)


@pytest.fixture(scope="module")
def cubin():
    return build_cubin(KERNELS).read()


def sink_words(run):
    assert run.sink is not None, run.describe()
    return struct.unpack("<16I", run.sink)


# --------------------------------------------------------------------------- happy paths


def test_vector_add_and_poisoned_outputs(cubin):
    n = 1000
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    launch = LaunchSpec(grid=(n + 127) // 128, block=128,
                        args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"), ScalarArg(n - 1)])
    run = run_kernel(cubin, "vadd", launch, {"x": x, "y": y, "z": torch.zeros(n)}, timeout_s=60)
    assert run.ok, run.describe() + run.stderr_tail
    z = run.outputs["z"]
    assert torch.equal(z[:-1], (x + y)[:-1])
    assert torch.isnan(z[-1]), "the element the kernel did not write must keep the poison"
    assert run.device.get("compute_capability") == [9, 0]
    assert run.kernel_s is not None and run.kernel_s > 0


def test_a_child_started_ahead_runs_the_kernel_as_a_fresh_one_does(cubin):
    import json
    import shutil
    from pathlib import Path

    from harness import child_process

    n = 4096
    g = torch.Generator().manual_seed(12)
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    launch = LaunchSpec(grid=n // 128, block=128, args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"),
                                                        ScalarArg(n)])
    fresh = run_kernel(cubin, "vadd", launch, {"x": x, "y": y, "z": torch.zeros(n)}, timeout_s=60)
    assert child_process.prestart(0)
    waiting = child_process._waiting[2].proc
    time.sleep(1.0)  # let it come up: its CUDA context is made before the run
    run = None
    try:
        run = run_kernel(cubin, "vadd", launch, {"x": x, "y": y, "z": torch.zeros(n)}, timeout_s=60,
                         sink=SinkRequest(SINK_INIT), keep_dir=True)
        assert run.ok, run.describe() + run.stderr_tail
        assert json.loads((Path(run.run_dir) / P.STATUS).read_text())["pid"] == waiting.pid
        assert torch.equal(run.outputs["z"], fresh.outputs["z"]) and torch.equal(run.outputs["z"], x + y)
        assert run.device == fresh.device
    finally:
        child_process._stop_waiting()
        if run is not None and run.run_dir:
            shutil.rmtree(run.run_dir, ignore_errors=True)


def test_a_process_that_keeps_a_child_ahead_hands_the_next_run_a_child_with_its_context_up(cubin, monkeypatch):
    from harness import child_process, runner

    n = 4096
    x, y = torch.randn(n), torch.randn(n)
    launch = LaunchSpec(grid=n // 128, block=128, args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"),
                                                        ScalarArg(n)])
    monkeypatch.setenv("ORACLE_CHILD_AHEAD_S", "60")
    monkeypatch.setattr(child_process, "_ahead", "unsaid")
    child_process.keep_ahead()
    try:
        first = run_kernel(cubin, "vadd", launch, {"x": x, "y": y, "z": torch.zeros(n)}, timeout_s=60)
        assert first.ok and first.started_ahead is None, first.describe()
        runner._join_reapers()
        ahead = child_process._waiting
        assert ahead is not None and ahead.command == tuple(runner.DEFAULT_CHILD), "the next run's child is started"
        time.sleep(2.0)  # a script's pause between runs: its CUDA context comes up meanwhile
        run = run_kernel(cubin, "vadd", launch, {"x": x, "y": y, "z": torch.zeros(n)}, timeout_s=60)
        assert run.ok and torch.equal(run.outputs["z"], x + y), run.describe() + run.stderr_tail
        took = run.started_ahead
        assert took is not None and took["context_held"] and took["waited_s"] > 0.5, took
        assert run.phases_s["context"] < first.phases_s["context"], (run.phases_s, first.phases_s)
    finally:
        runner._join_reapers()
        child_process._stop_waiting()


def test_taps_reach_host_mapped_and_device_sinks(cubin):
    launch = LaunchSpec(grid=1, block=32)
    for host_mapped, sources in ((True, (P.SINK_FILE, P.SINK_PINNED_COPY)), (False, (P.SINK_DEVICE_COPY,))):
        run = run_kernel(cubin, "tap_only", launch, {}, sink=SinkRequest(SINK_INIT, host_mapped=host_mapped))
        assert run.ok, run.describe()
        assert run.sink_source in sources
        assert sink_words(run)[:2] == (MARKER | 4, 32)
    # The shared-file sink is what lets a hang be recovered; make its absence loud.
    run = run_kernel(cubin, "tap_only", launch, {}, sink=SinkRequest(SINK_INIT))
    assert run.sink_source == P.SINK_FILE, "cuMemHostRegister of the shared sink file failed; " + run.describe()


def test_scalar_and_struct_arguments(cubin):
    s = struct.pack("<iii", -7, 8, 9)
    launch = LaunchSpec(grid=1, block=32, args=[
        TensorArg("out", "out"), ScalarArg(-5), ScalarArg(-(2**40), "i64"), ScalarArg(2**32 - 1, "u32"),
        ScalarArg(0.25, "f32"), ScalarArg(1e-300, "f64"), ScalarArg(2**53, "u64"), StructArg(s)])
    run = run_kernel(cubin, "scalars", launch, {"out": torch.zeros(9, dtype=torch.float64)})
    assert run.ok, run.describe()
    assert run.outputs["out"].tolist() == [-5, -(2**40), 2**32 - 1, 0.25, 1e-300, 2**53, -7, 8, 9]


def test_large_dynamic_shared_memory(cubin):
    n = 50_000  # 200,000 bytes: above the 48 KiB default, so the attribute must be raised
    data = torch.arange(n, dtype=torch.int32)  # the kernel reads it as unsigned: same bits
    launch = LaunchSpec(grid=1, block=1024, shared_mem_bytes=n * 4,
                        args=[TensorArg("inp"), TensorArg("out", "out"), ScalarArg(n, "u32")])
    run = run_kernel(cubin, "smem_reverse", launch, {"inp": data, "out": torch.zeros_like(data)})
    assert run.ok, run.describe()
    assert torch.equal(run.outputs["out"], torch.arange(n - 1, -1, -1, dtype=torch.int32))


def test_cluster_launch(cubin):
    launch = LaunchSpec(grid=8, block=32, cluster=(2, 1, 1), args=[TensorArg("out", "out")])
    run = run_kernel(cubin, "cluster_rank", launch, {"out": torch.zeros(16, dtype=torch.int32)})
    assert run.ok, run.describe()
    out = run.outputs["out"].view(8, 2)
    assert out[:, 0].tolist() == [0, 1] * 4
    assert out[:, 1].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


# --------------------------------------------------------------------------- faults


def test_illegal_address_is_700_with_the_tap_recovered(cubin):
    launch = LaunchSpec(grid=1, block=32, args=[ScalarArg(0x10, "u64")])
    run = run_kernel(cubin, "fault_illegal_address", launch, {}, sink=SinkRequest(SINK_INIT))
    assert run.status is RunStatus.CUDA_ERROR and run.kernel_fault, run.describe()
    assert run.error_code == 700 and run.error_name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert run.phase == "sync"
    assert sink_words(run)[:2] == (MARKER | 1, 32)


def test_trap_is_a_launch_failure_with_the_tap_recovered(cubin):
    run = run_kernel(cubin, "fault_trap", LaunchSpec(grid=1, block=32), {}, sink=SinkRequest(SINK_INIT))
    assert run.status is RunStatus.CUDA_ERROR, run.describe()
    assert run.error_code in (719, 715), run.describe()
    assert sink_words(run)[:2] == (MARKER | 2, 32)


def test_a_spinning_kernel_times_out_and_the_gpu_stays_usable(cubin):
    launch = LaunchSpec(grid=1, block=32, args=[TensorArg("flag")])
    t0 = time.monotonic()
    run = run_kernel(cubin, "fault_spin", launch, {"flag": torch.zeros(4, dtype=torch.int32)},
                     sink=SinkRequest(SINK_INIT), timeout_s=8)
    assert run.status is RunStatus.TIMEOUT, run.describe()
    assert 8 <= run.elapsed_s < 20 and time.monotonic() - t0 < 30
    assert run.phase == "sync"
    assert sink_words(run)[:2] == (MARKER | 3, 32)
    # The killed child's context is gone with it: the next run works.
    test_vector_add_and_poisoned_outputs(cubin)


def test_load_errors(cubin):
    run = run_kernel(cubin, "no_such_kernel", LaunchSpec(grid=1, block=32), {})
    assert run.status is RunStatus.LOAD_ERROR and run.error_code == 500 and "no_such_kernel" in run.message
    run = run_kernel(cubin, "tap_only", LaunchSpec(grid=1, block=32), {},
                     sink=SinkRequest(SINK_INIT, symbol="ns_oracle_trace_sink"))
    assert run.status is RunStatus.LOAD_ERROR and "ns_oracle_trace_sink" in run.message


# --------------------------------------------------------------------------- TMA

ROWS, COLS = 20, 64  # int32 global tensor; rows past 20 are out of bounds
BOX_ROWS = 16


def linear_box(t: torch.Tensor, c0: int, c1: int, inner: int, fill) -> torch.Tensor:
    box = torch.full((BOX_ROWS, inner), fill, dtype=t.dtype)
    for r in range(BOX_ROWS):
        for c in range(inner):
            if c1 + r < t.shape[0] and c0 + c < t.shape[1]:
                box[r, c] = t[c1 + r, c0 + c]
    return box


@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_tma_box_lands_at_the_swizzled_addresses(cubin, swizzle):
    inner = (swizzle or 128) // 4
    spec = TensorMapSpec(dtype="int32", global_dims=(COLS, ROWS), global_strides=(COLS * 4,),
                         box_dims=(inner, BOX_ROWS), swizzle=swizzle)
    nbytes = spec.box_bytes
    c0, c1 = 8, 12
    t = torch.arange(ROWS * COLS, dtype=torch.int32).reshape(ROWS, COLS) + 1
    launch = LaunchSpec(grid=1, block=128, args=[
        TensorMapArg("t", spec), TensorArg("smem", "out"), ScalarArg(c0), ScalarArg(c1), ScalarArg(nbytes, "u32"),
        TensorArg("addr", "out")])
    run = run_kernel(cubin, "tma_load_2d", launch, {"t": t, "smem": torch.zeros(nbytes, dtype=torch.uint8),
                                                   "addr": torch.zeros(1, dtype=torch.int64)})
    assert run.ok, run.describe()
    assert int(run.outputs["addr"][0]) % 1024 == 0, "the shared tile is not 1024-byte aligned"
    linear = linear_box(t, c0, c1, inner, 0).view(torch.uint8).reshape(-1)
    smem = run.outputs["smem"]
    expected = torch.empty_like(linear)
    for a in range(nbytes):
        expected[swizzle_offset(a, swizzle)] = linear[a]
    bad = (smem != expected).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} bytes differ, first at byte {int(bad[0])}"


def test_tma_nan_fill_out_of_bounds(cubin):
    spec = TensorMapSpec(dtype="fp32", global_dims=(COLS, ROWS), global_strides=(COLS * 4,),
                         box_dims=(32, BOX_ROWS), swizzle=128, oob_fill="nan")
    t = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(3))
    launch = LaunchSpec(grid=1, block=128, args=[
        TensorMapArg("t", spec), TensorArg("smem", "out"), ScalarArg(0), ScalarArg(12),
        ScalarArg(spec.box_bytes, "u32"), TensorArg("addr", "out")])
    run = run_kernel(cubin, "tma_load_2d", launch, {"t": t, "smem": torch.zeros(spec.box_bytes, dtype=torch.uint8),
                                                   "addr": torch.zeros(1, dtype=torch.int64)})
    assert run.ok, run.describe()
    smem = run.outputs["smem"]
    unswizzled = torch.stack([smem[swizzle_offset(a, 128)] for a in range(spec.box_bytes)])
    box = unswizzled.view(torch.float32).reshape(BOX_ROWS, 32)
    assert torch.equal(box[: ROWS - 12], t[12:, :32])
    assert torch.isnan(box[ROWS - 12:]).all()


def test_host_rules_agree_with_the_driver():
    """Random maps near every boundary: our pure-Python verdict must equal cuTensorMapEncodeTiled's.
    A disagreement means a rule is missing or wrong in harness.tensormap."""
    from harness import cuda_driver as cu
    from harness.tensormap import INTERLEAVE_ENUM, L2_PROMOTION_ENUM, OOB_FILL_ENUM, SWIZZLE_ENUM

    rng = random.Random(1234)
    with cu.Context(0):
        base = cu.mem_alloc(1 << 20)
        try:
            disagreements = []
            for _ in range(600):
                dtype = rng.choice(list(MAP_DTYPES))
                rank = rng.randint(1, 5)
                dims = [rng.choice([1, 2, 7, 64, 256, 1000, 2**32, 2**32 + 1, 0]) for _ in range(rank)]
                strides = [rng.choice([16, 32, 48, 8, 24, 1 << 20, 2**40 - 16, 2**40]) for _ in range(rank - 1)]
                box = [rng.choice([1, 2, 8, 16, 32, 64, 128, 256, 257, 0]) for _ in range(rank)]
                estr = [rng.choice([1, 1, 1, 2, 8, 9, 0]) for _ in range(rank)]
                swizzle = rng.choice([0, 32, 64, 128])
                oob = rng.choice(["zero", "nan"])
                l2 = rng.choice([0, 64, 128, 256])
                ours = not tensormap_problems(dtype, dims, strides, box, estr, swizzle, oob, "none", l2)
                try:
                    cu.encode_tensor_map_tiled(MAP_DTYPES[dtype][1], base, dims, strides, box, estr,
                                               INTERLEAVE_ENUM["none"], SWIZZLE_ENUM[swizzle],
                                               L2_PROMOTION_ENUM[l2], OOB_FILL_ENUM[oob])
                    theirs = True
                except cu.CudaError as exc:
                    assert exc.code == 1, exc
                    theirs = False
                except (OverflowError, ValueError, TypeError):
                    theirs = False  # the binding refuses a value that does not fit its C type
                if ours != theirs:
                    disagreements.append((ours, theirs, dtype, dims, strides, box, estr, swizzle, oob, l2))
        finally:
            cu.mem_free(base)
    assert not disagreements, "host rules vs driver (ours, driver, fields...):\n" + "\n".join(
        map(str, disagreements[:15]))

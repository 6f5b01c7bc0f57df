// faults.cu -- deliberately broken kernels for the harness's crash and timeout tests.
//
// Each kernel first writes out[i] = i for i < n (grid-stride) and taps one record per
// thread into the trace sink, then faults:
//   extern "C" __global__ void fault_illegal_address(float* out, int n);  // store to an unmapped address (CUDA error 700)
//   extern "C" __global__ void fault_trap(float* out, int n);             // __trap() (CUDA error 719)
//   extern "C" __global__ void fault_hang(float* out, int n);             // spins forever; only a kill ends it
// Launch: any grid, block of at most 256 threads, e.g. grid (1, 1, 1), block (32, 1, 1).
//
// The tap (built with -DORACLE_TRACE; without it the kernels only fault): thread t of CTA
// (blockIdx.x, blockIdx.y) records element (t / 16, t % 16) = float(t) of stage mma, tile
// (blockIdx.y, blockIdx.x), k-block 0, in a 16x16 tile; parse with block_m = block_n = 16
// (block_k any) and partial=True. Each record is committed with __threadfence_system()
// before the fault, so with a sink in host-mapped pinned memory the records survive the
// crash and can be read back.
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include -DORACLE_TRACE

#include <stdint.h>

#include "oracle_trace/trace.cuh"

namespace faults {

__device__ __forceinline__ void write_and_tap(float* out, int n) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  for (int i = cta * threads + t; i < n; i += threads * gridDim.x * gridDim.y * gridDim.z) out[i] = float(i);
  using Tr = oracle_trace::Tracer<true>;
  if constexpr (Tr::enabled) {
    if (t < 256) {
      Tr::tap_elements(oracle_trace::Stage::Mma, oracle_trace::Site{int(blockIdx.y), int(blockIdx.x), 0}, 16, 16,
                       1, [&](int) { return oracle_trace::Element<float>{t / 16, t % 16, float(t)}; });
    }
  }
  __threadfence_system();
}

}  // namespace faults

extern "C" __global__ void fault_illegal_address(float* out, int n) {
  faults::write_and_tap(out, n);
  // An address far below any allocation: the store faults with an illegal address.
  volatile float* bad = reinterpret_cast<volatile float*>(static_cast<uintptr_t>(0x40) + (threadIdx.x << 2));
  *bad = 1.f;
}

extern "C" __global__ void fault_trap(float* out, int n) {
  faults::write_and_tap(out, n);
  __trap();
}

extern "C" __global__ void fault_hang(float* out, int n) {
  faults::write_and_tap(out, n);
  for (;;) {
    asm volatile("nanosleep.u32 1000;");
  }
}

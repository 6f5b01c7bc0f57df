// faults_lib.cu -- harness/examples/faults.cu brought as a launch library (ABI "oracle/1"), for the
// harness's tests of a library that fails.
//
// oracle_launch fills D (at least 256 fp32 elements) through one of faults.cu's kernels, chosen
// by the define FAULT_KIND (a case's [kernel] defines):
//   1 fault_trap              the kernel taps, then traps (CUDA error 719)
//   2 (no kernel)             oracle_launch returns 7 with a sentence: the library refuses
//   3 fault_illegal_address   the kernel taps, then stores to an unmapped address (CUDA error 700)
//   4 fault_hang              the kernel taps, then spins until the harness kills the process
// Launch: grid (1, 1, 1), block (256, 1, 1), on the harness's stream, after install_sink.

#include "oracle_trace/launch.hpp"
#include "faults.cu"

#ifndef FAULT_KIND
#define FAULT_KIND 1
#endif

extern "C" int oracle_launch(const oracle_trace::LaunchArgs* args) {
  using namespace oracle_trace;
  if (const int bad = check_args(args)) return bad;
  const TensorRef& D = tensor(args, kSlotD);
  if (D.data == nullptr || D.dtype != uint32_t(ElementType::F32) || D.shape[0] * D.shape[1] < 256)
    return fail_launch(args, kLaunchUnsupported, "D must hold at least 256 fp32 elements");
  if (FAULT_KIND == 2) return fail_launch(args, 7, "this library refuses every problem (FAULT_KIND 2)");
  if (const cudaError_t e = install_sink(args))
    return fail_launch(args, kLaunchCudaError, "setting the trace sink: %s", cudaGetErrorString(e));
  float* out = static_cast<float*>(D.data);
  switch (FAULT_KIND) {
    case 1: fault_trap<<<1, 256, 0, args->stream>>>(out, 256); break;
    case 3: fault_illegal_address<<<1, 256, 0, args->stream>>>(out, 256); break;
    case 4: fault_hang<<<1, 256, 0, args->stream>>>(out, 256); break;
    default: return fail_launch(args, kLaunchUnsupported, "FAULT_KIND %d is not 1, 2, 3 or 4", FAULT_KIND);
  }
  if (const cudaError_t e = cudaGetLastError())
    return fail_launch(args, kLaunchCudaError, "launching the kernel: %s", cudaGetErrorString(e));
  return kLaunchOk;
}

// simple_gemm_lib.cu -- harness/examples/simple_gemm.cu brought as a launch library (ABI "oracle/1").
//
// The kernels are simple_gemm.cu's, unchanged (included below, taps and all); this file adds only
// the host code a production launcher would have: oracle_launch checks the problem it is given,
// picks the entry point for the element type, installs the trace sink and launches on the
// harness's stream. With ORACLE_TRACE and a sink it launches the traced entry point; without a
// sink (timing, or an untraced build) the production one.
//
// Supported: row-major A [M, K], B [K, N], C and D [M, N] (unit column stride, any row stride),
// one element type for A, B, C, D and bias (fp32, fp16 or bf16), a column bias [N] or none, no
// scales, no batch, groups or split/stream-K, the 64 x 64 x 16 tile. Anything else returns
// kLaunchUnsupported with a sentence saying what.
// Build: nvcc -shared -Xcompiler -fPIC -cudart static -gencode=arch=compute_90a,code=sm_90a
//        -I harness/include [-DORACLE_TRACE] -o simple_gemm_lib.so simple_gemm_lib.cu

#include "oracle_trace/launch.hpp"
#include "simple_gemm.cu"

namespace {

using oracle_trace::ElementType;
using oracle_trace::LaunchArgs;
using oracle_trace::TensorRef;

template <class T>
using Kernel = void (*)(const T*, const T*, const T*, T*, const T*, int, int, int, int, int, int, int, float, float,
                        int);

struct Call {
  const LaunchArgs* args;
  int lda, ldb, ldc, ldd;
};

// One launch of `kernel` with the call's operands as T.
template <class T>
cudaError_t launch(Kernel<T> kernel, const Call& c) {
  const LaunchArgs* a = c.args;
  const int M = int(a->m), N = int(a->n), K = int(a->k);
  const dim3 grid(unsigned((N + simple_gemm::kBN - 1) / simple_gemm::kBN),
                  unsigned((M + simple_gemm::kBM - 1) / simple_gemm::kBM), 1);
  const dim3 block(16, 16, 1);
  auto ptr = [&](oracle_trace::TensorSlot s) { return static_cast<T*>(a->tensors[s].data); };
  kernel<<<grid, block, 0, a->stream>>>(ptr(oracle_trace::kSlotA), ptr(oracle_trace::kSlotB), ptr(oracle_trace::kSlotC),
                                        ptr(oracle_trace::kSlotD), ptr(oracle_trace::kSlotBias), M, N, K, c.lda, c.ldb,
                                        c.ldc, c.ldd, a->alpha, a->beta, int(a->activation));
  return cudaGetLastError();
}

// The traced entry point when tracing (ORACLE_TRACE and a sink), else the production one.
template <class T>
cudaError_t launch(Kernel<T> plain, Kernel<T> traced, const Call& c) {
  return launch<T>(c.args->trace_sink != nullptr && traced != nullptr ? traced : plain, c);
}

#if defined(ORACLE_TRACE)
#define SIMPLE_GEMM_TRACED(NAME) NAME
#else
#define SIMPLE_GEMM_TRACED(NAME) nullptr
#endif

cudaError_t dispatch(ElementType dt, const Call& c) {
  switch (dt) {
    case ElementType::F32:
      return launch<float>(simple_gemm_fp32, SIMPLE_GEMM_TRACED(simple_gemm_fp32_traced), c);
    case ElementType::F16:
      return launch<__half>(simple_gemm_fp16, SIMPLE_GEMM_TRACED(simple_gemm_fp16_traced), c);
    case ElementType::BF16:
      return launch<__nv_bfloat16>(simple_gemm_bf16, SIMPLE_GEMM_TRACED(simple_gemm_bf16_traced), c);
    default:
      return cudaErrorInvalidValue;
  }
}

// A row-major matrix of `rows` x `cols` (unit column stride); its row stride in `ld`.
bool row_major(const TensorRef& t, int64_t rows, int64_t cols, int* ld) {
  if (t.rank != 2 || t.shape[0] != rows || t.shape[1] != cols || t.stride[1] != 1 || t.stride[0] < cols) return false;
  *ld = int(t.stride[0]);
  return true;
}

}  // namespace

extern "C" int oracle_launch(const LaunchArgs* args) {
  using namespace oracle_trace;
  if (const int bad = check_args(args)) return bad;
  const TensorRef& A = tensor(args, kSlotA);
  const TensorRef& B = tensor(args, kSlotB);
  const TensorRef& C = tensor(args, kSlotC);
  const TensorRef& D = tensor(args, kSlotD);
  const TensorRef& bias = tensor(args, kSlotBias);
  const int64_t M = args->m, N = args->n, K = args->k;
  if (args->batch != 1 || args->groups != 0 || args->splits != 1 || args->stream_k_workers != 0)
    return fail_launch(args, kLaunchUnsupported, "no batch, groups, split-K or stream-K here");
  if (args->tile_m != simple_gemm::kBM || args->tile_n != simple_gemm::kBN || args->tile_k != simple_gemm::kBK)
    return fail_launch(args, kLaunchUnsupported, "the kernel's tile is 64 x 64 x 16, the case says %d x %d x %d",
                       args->tile_m, args->tile_n, args->tile_k);
  if (args->scale_a_kind != uint32_t(ScaleKind::None) || args->scale_b_kind != uint32_t(ScaleKind::None))
    return fail_launch(args, kLaunchUnsupported, "no scales here");
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return fail_launch(args, kLaunchUnsupported, "sizes past int32");
  int lda = 0, ldb = 0, ldc = 0, ldd = 0;
  if (!row_major(A, M, K, &lda)) return fail_launch(args, kLaunchUnsupported, "A must be a row-major [M, K]");
  if (!row_major(B, K, N, &ldb)) return fail_launch(args, kLaunchUnsupported, "B must be a row-major [K, N]");
  if (!row_major(D, M, N, &ldd)) return fail_launch(args, kLaunchUnsupported, "D must be a row-major [M, N]");
  if (C.data != nullptr && !row_major(C, M, N, &ldc))
    return fail_launch(args, kLaunchUnsupported, "C must be a row-major [M, N]");
  if (args->beta != 0.f && C.data == nullptr) return fail_launch(args, kLaunchUnsupported, "beta != 0 needs C");
  const uint32_t dt = A.dtype;
  if (B.dtype != dt || D.dtype != dt || (C.data && C.dtype != dt) || (bias.data && bias.dtype != dt))
    return fail_launch(args, kLaunchUnsupported, "A, B, C, D and bias must share one element type");
  if (bias.data != nullptr && (args->bias_kind != uint32_t(BiasKind::Col) || bias.rank != 1 || bias.shape[0] != N))
    return fail_launch(args, kLaunchUnsupported, "the bias must be one per column, [N]");
  if (args->activation > uint32_t(Activation::GeluTanh))
    return fail_launch(args, kLaunchUnsupported, "activation %u is not one of none, relu, gelu_erf, gelu_tanh",
                       args->activation);

  if (dt != uint32_t(ElementType::F32) && dt != uint32_t(ElementType::F16) && dt != uint32_t(ElementType::BF16))
    return fail_launch(args, kLaunchUnsupported, "element type %u: fp32, fp16 or bf16 only", dt);
  if (args->trace_sink != nullptr && !compiled_in)
    return fail_launch(args, kLaunchUnsupported, "a trace sink was given but this build has no ORACLE_TRACE");
  if (const cudaError_t e = install_sink(args))
    return fail_launch(args, kLaunchCudaError, "setting the trace sink: %s", cudaGetErrorString(e));
  if (const cudaError_t e = dispatch(ElementType(dt), Call{args, lda, ldb, ldc, ldd}))
    return fail_launch(args, kLaunchCudaError, "launching the kernel: %s", cudaGetErrorString(e));
  return kLaunchOk;
}

// oracle_trace/cutlass/entry.hpp -- oracle_launch for a CUTLASS 3.x GemmUniversalAdapter.
//
//   ORACLE_CUTLASS_ENTRY(Gemm)               defines extern "C" oracle_launch for `Gemm`
//   ORACLE_CUTLASS_ENTRY_WITH(Gemm, adjust)  ... calling int adjust(const LaunchArgs*, Gemm::Arguments&)
//                                            after the arguments are filled (0: go on; else the code
//                                            returned, with the message adjust wrote)
//
// Data path: LaunchArgs -> checks (ABI, problem kinds this GEMM has, tile, element types, layouts)
// -> Gemm::Arguments {kGemm, (M, N, K, 1), {A, dA, B, dB}, {{alpha, beta}, C, dC, D, dD}, hw_info}
// -> can_implement -> workspace (cudaMallocAsync on args->stream when the kernel asks for one, freed
// with cudaFreeAsync on the same stream after the launch) -> install_sink -> initialize -> run on
// args->stream. Every failure returns a code (launch.hpp's kLaunch*) with a sentence in args->message.
//
// Constraints: one GEMM (batch 1, no groups, no split-K or stream-K request: the kernel's own tile
// scheduler decides), no bias or activation. The epilogue is CUTLASS's LinearCombination (alpha, beta, C;
// no scales) or the adapter's TensorScaledLinearCombination (also scale_a and scale_b of kind "tensor":
// one fp32 each, handed to the kernel as device pointers); a fusion with anything else stops the
// build at a static_assert, a problem the fusion lacks is refused with kLaunchUnsupported.
// C absent only with beta == 0 (D's address then stands in for C's, which the epilogue does not read).
// The case's tile must be the kernel's CTA tile (BM, BN, BK). Each stride mode CUTLASS fixes at compile
// time (the unit stride of a row- or column-major operand) must be the tensor's.

#ifndef ORACLE_TRACE_CUTLASS_ENTRY_HPP_
#define ORACLE_TRACE_CUTLASS_ENTRY_HPP_

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"
#include "oracle_trace/cutlass/sm90_epilogue.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/launch.hpp"

namespace oracle_trace::cutlass_sm90 {

// One stride mode: a dynamic one takes `value`; a static one must already be `value`.
template <class ModeRef>
bool put_stride(ModeRef&& mode, int64_t value) {
  using Mode = cute::remove_cvref_t<ModeRef>;
  if constexpr (cute::is_static<Mode>::value) {
    return int64_t(Mode::value) == value;
  } else {
    mode = static_cast<Mode>(value);
    return true;
  }
}

// CUTLASS's (outer, inner, batch) stride from a rank-2 TensorRef's two logical strides.
template <class Stride>
bool put_strides(Stride& s, int64_t first, int64_t second) {
  return put_stride(cute::get<0>(s), first) && put_stride(cute::get<1>(s), second) &&
         put_stride(cute::get<2>(s), 0);
}

inline bool is_matrix(const TensorRef& t, int64_t rows, int64_t cols) {
  return t.data != nullptr && t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols;
}

template <class Element>
bool has_type(const TensorRef& t) {
  return launch_code<Element> != ElementType::None && t.dtype == uint32_t(launch_code<Element>);
}

template <class Operation>
constexpr bool is_linear_combination = false;
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
constexpr bool is_linear_combination<cutlass::epilogue::fusion::LinearCombination<Out, Compute, Source, Scalar, Round>> =
    true;

inline bool is_scalar_f32(const TensorRef& t) {
  int64_t count = 1;
  for (uint32_t d = 0; d < t.rank && d < kMaxRank; ++d) count *= t.shape[d];
  return t.data != nullptr && t.dtype == uint32_t(ElementType::F32) && t.rank <= kMaxRank && count == 1;
}

template <class Gemm>
int launch(const LaunchArgs* args, int (*adjust)(const LaunchArgs*, typename Gemm::Arguments&)) {
  using Kernel = typename Gemm::GemmKernel;
  using Mainloop = typename Kernel::CollectiveMainloop;
  using Epilogue = typename Kernel::CollectiveEpilogue;
  using TileShape = typename Mainloop::TileShape;
  using ElementA = typename Mainloop::ElementA;
  using ElementB = typename Mainloop::ElementB;
  using ElementC = typename Epilogue::ElementC;
  using ElementD = typename Epilogue::ElementD;
  constexpr int kBM = cute::size<0>(TileShape{}), kBN = cute::size<1>(TileShape{}), kBK = cute::size<2>(TileShape{});
  static_assert(cute::rank(typename Kernel::ProblemShape{}) == 4, "ORACLE_CUTLASS_ENTRY: a (M, N, K, L) problem shape");
  using Operation = typename cutlass::epilogue::fusion::FusionCallbacksTraits<typename Epilogue::FusionCallbacks>::Operation;
  constexpr bool kScaled = is_tensor_scaled<Operation>;
  static_assert(kScaled || is_linear_combination<Operation>,
                "ORACLE_CUTLASS_ENTRY: the epilogue fusion must be cutlass::epilogue::fusion::LinearCombination or "
                "oracle_trace::cutlass_sm90::TensorScaledLinearCombination (no bias, activation, row/column/block "
                "scales or auxiliary outputs)");

  if (const int bad = check_args(args)) return bad;
  const TensorRef& A = tensor(args, kSlotA);
  const TensorRef& B = tensor(args, kSlotB);
  const TensorRef& C = tensor(args, kSlotC);
  const TensorRef& D = tensor(args, kSlotD);
  const int64_t M = args->m, N = args->n, K = args->k;
  if (args->batch != 1 || args->groups != 0 || args->splits != 1 || args->stream_k_workers != 0)
    return fail_launch(args, kLaunchUnsupported,
                       "this CUTLASS GEMM takes one problem: batch %lld, groups %lld, splits %d, stream_k_workers %d "
                       "given (allowed: 1, 0, 1, 0)",
                       (long long)args->batch, (long long)args->groups, args->splits, args->stream_k_workers);
  if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || M < 1 || N < 1 || K < 1)
    return fail_launch(args, kLaunchUnsupported, "sizes %lld x %lld x %lld: each must be 1 .. 2^31 - 1",
                       (long long)M, (long long)N, (long long)K);
  if (args->tile_m != kBM || args->tile_n != kBN || args->tile_k != kBK)
    return fail_launch(args, kLaunchUnsupported, "the kernel's CTA tile is %d x %d x %d, the case says %d x %d x %d", kBM,
                       kBN, kBK, args->tile_m, args->tile_n, args->tile_k);
  if (args->bias_kind != uint32_t(BiasKind::None) || tensor(args, kSlotBias).data != nullptr ||
      args->activation != uint32_t(Activation::None))
    return fail_launch(args, kLaunchUnsupported,
                       "the epilogue is a LinearCombination (alpha, beta, C%s): no bias or activation", kScaled ? ", per-tensor scales" : "");
  if constexpr (kScaled) {
    if (args->scale_a_kind != uint32_t(ScaleKind::Tensor) || args->scale_b_kind != uint32_t(ScaleKind::Tensor))
      return fail_launch(args, kLaunchUnsupported,
                         "the epilogue scales A and B per tensor: scale kinds %u and %u given (allowed: %u, tensor, "
                         "for both)", args->scale_a_kind, args->scale_b_kind, unsigned(ScaleKind::Tensor));
    if (!is_scalar_f32(tensor(args, kSlotScaleA)) || !is_scalar_f32(tensor(args, kSlotScaleB)))
      return fail_launch(args, kLaunchUnsupported, "scale_a and scale_b must each be one fp32 element in device memory");
  } else if (args->scale_a_kind != uint32_t(ScaleKind::None) || args->scale_b_kind != uint32_t(ScaleKind::None)) {
    return fail_launch(args, kLaunchUnsupported,
                       "the epilogue is a LinearCombination (alpha, beta, C): no scales (scale kinds %u and %u "
                       "given; TensorScaledLinearCombination takes per-tensor ones)", args->scale_a_kind,
                       args->scale_b_kind);
  }
  if (!is_matrix(A, M, K) || !has_type<ElementA>(A))
    return fail_launch(args, kLaunchUnsupported, "A must be a [M, K] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)K, element_type_name(launch_code<ElementA>), element_type_name(A.dtype));
  if (!is_matrix(B, K, N) || !has_type<ElementB>(B))
    return fail_launch(args, kLaunchUnsupported, "B must be a [K, N] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)K, (long long)N, element_type_name(launch_code<ElementB>), element_type_name(B.dtype));
  if (!is_matrix(D, M, N) || !has_type<ElementD>(D))
    return fail_launch(args, kLaunchUnsupported, "D must be a [M, N] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)N, element_type_name(launch_code<ElementD>), element_type_name(D.dtype));
  const bool with_c = C.data != nullptr;
  if (with_c && (!is_matrix(C, M, N) || !has_type<ElementC>(C)))
    return fail_launch(args, kLaunchUnsupported, "C must be a [M, N] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)N, element_type_name(launch_code<ElementC>), element_type_name(C.dtype));
  if (!with_c && args->beta != 0.f)
    return fail_launch(args, kLaunchUnsupported, "beta = %g needs C, and the harness passed none", double(args->beta));
  if (args->trace_sink != nullptr && !compiled_in)
    return fail_launch(args, kLaunchUnsupported, "a trace sink was given but this build has no ORACLE_TRACE");

  typename Gemm::Arguments g{};
  g.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  g.problem_shape = {int(M), int(N), int(K), 1};
  g.mainloop.ptr_A = static_cast<const ElementA*>(A.data);
  g.mainloop.ptr_B = static_cast<const ElementB*>(B.data);
  // CUTLASS strides: A (m, k, l), B (n, k, l), C and D (m, n, l)
  if (!put_strides(g.mainloop.dA, A.stride[0], A.stride[1]))
    return fail_launch(args, kLaunchUnsupported, "A's strides (%lld, %lld) do not fit the kernel's layout of A",
                       (long long)A.stride[0], (long long)A.stride[1]);
  if (!put_strides(g.mainloop.dB, B.stride[1], B.stride[0]))
    return fail_launch(args, kLaunchUnsupported, "B's strides (%lld, %lld) do not fit the kernel's layout of B",
                       (long long)B.stride[0], (long long)B.stride[1]);
  const TensorRef& src = with_c ? C : D;
  if (!put_strides(g.epilogue.dC, src.stride[0], src.stride[1]))
    return fail_launch(args, kLaunchUnsupported, "C's strides (%lld, %lld) do not fit the kernel's layout of C",
                       (long long)src.stride[0], (long long)src.stride[1]);
  if (!put_strides(g.epilogue.dD, D.stride[0], D.stride[1]))
    return fail_launch(args, kLaunchUnsupported, "D's strides (%lld, %lld) do not fit the kernel's layout of D",
                       (long long)D.stride[0], (long long)D.stride[1]);
  g.epilogue.ptr_C = static_cast<const ElementC*>(src.data);
  g.epilogue.ptr_D = static_cast<ElementD*>(D.data);
  g.epilogue.thread.alpha = args->alpha;
  g.epilogue.thread.beta = args->beta;
  if constexpr (kScaled) {
    g.epilogue.thread.scale_a_ptr = static_cast<const float*>(tensor(args, kSlotScaleA).data);
    g.epilogue.thread.scale_b_ptr = static_cast<const float*>(tensor(args, kSlotScaleB).data);
  }
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device))
    return fail_launch(args, kLaunchCudaError, "cudaGetDevice: %s", cudaGetErrorString(e));
  g.hw_info.device_id = device;
  g.hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  if (adjust != nullptr) {
    if (const int code = adjust(args, g)) return code;
  }

  Gemm gemm;
  if (const cutlass::Status s = gemm.can_implement(g); s != cutlass::Status::kSuccess)
    return fail_launch(args, kLaunchUnsupported, "CUTLASS cannot run this problem (can_implement: %s)",
                       cutlassGetStatusString(s));
  const size_t workspace_bytes = Gemm::get_workspace_size(g);
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    if (const cudaError_t e = cudaMallocAsync(&workspace, workspace_bytes, args->stream))
      return fail_launch(args, kLaunchCudaError, "cudaMallocAsync of the %zu-byte workspace: %s", workspace_bytes,
                         cudaGetErrorString(e));
  }
  auto release = [&](int code) {
    if (workspace != nullptr) cudaFreeAsync(workspace, args->stream);
    return code;
  };
  if (const cudaError_t e = install_sink(args))
    return release(fail_launch(args, kLaunchCudaError, "setting the trace sink: %s", cudaGetErrorString(e)));
  if (const cutlass::Status s = gemm.initialize(g, workspace, args->stream); s != cutlass::Status::kSuccess)
    return release(fail_launch(args, kLaunchCudaError, "Gemm::initialize: %s (%s)", cutlassGetStatusString(s),
                               cudaGetErrorString(cudaGetLastError())));
  if (const cutlass::Status s = gemm.run(args->stream); s != cutlass::Status::kSuccess)
    return release(fail_launch(args, kLaunchCudaError, "Gemm::run: %s (%s)", cutlassGetStatusString(s),
                               cudaGetErrorString(cudaGetLastError())));
  if (const cudaError_t e = cudaGetLastError())
    return release(fail_launch(args, kLaunchCudaError, "launching the kernel: %s", cudaGetErrorString(e)));
  return release(kLaunchOk);
}

}  // namespace oracle_trace::cutlass_sm90

// The traced build's shared memory holds one binding per stage more than CUTLASS's stage count
// planned for: refuse a kernel that no longer fits (227 KiB per CTA on SM90).
#define ORACLE_CUTLASS_ENTRY_WITH(GEMM, ADJUST)                                                              \
  static_assert(GEMM::GemmKernel::SharedStorageSize <= 232448,                                               \
                "the kernel's shared memory exceeds SM90's 227 KiB (a traced mainloop adds a binding per stage)"); \
  extern "C" int oracle_launch(const oracle_trace::LaunchArgs* args) {                                       \
    return oracle_trace::cutlass_sm90::launch<GEMM>(args, ADJUST);                                           \
  }

#define ORACLE_CUTLASS_ENTRY(GEMM) ORACLE_CUTLASS_ENTRY_WITH(GEMM, nullptr)

#endif  // ORACLE_TRACE_CUTLASS_ENTRY_HPP_

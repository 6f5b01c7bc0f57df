// oracle_trace/cutlass/entry.hpp -- oracle_launch for a CUTLASS 3.x GemmUniversalAdapter.
//
//   ORACLE_CUTLASS_HOST_ENTRY(Gemm, make)    defines extern "C" oracle_launch for `Gemm`, whose
//                                            Gemm::Arguments come from the user's own host code:
//                                              typename Gemm::Arguments make(int m, int n, int k, int l,
//                                                  const ElementA* a, int64_t lda, const ElementB* b, int64_t ldb,
//                                                  const ElementC* c, int64_t ldc, ElementD* d, int64_t ldd,
//                                                  float alpha, float beta)
//                                            (any parameter types these convert to; `make` is a name found
//                                            from the global namespace: qualify it)
//   ORACLE_CUTLASS_ENTRY(Gemm)               ... the adapter fills Gemm::Arguments itself (the quick route)
//   ORACLE_CUTLASS_ENTRY_WITH(Gemm, adjust)  ... calling int adjust(const LaunchArgs*, Gemm::Arguments&)
//                                            after the arguments are filled (0: go on; else the code
//                                            returned, with the message adjust wrote)
//
// Data path: LaunchArgs -> checks (ABI, problem kinds this GEMM has, tile, element types, layouts)
// -> Gemm::Arguments, filled by the adapter {kGemm, (M, N, K, L), {A, dA, B, dB}, {{alpha, beta}, C,
// dC, D, dD}, hw_info} or returned by the user's make(M, N, K, L, A, lda, ...) -> can_implement ->
// workspace (cudaMallocAsync on args->stream when the kernel asks for one, freed with cudaFreeAsync on
// the same stream after the launch) -> install_sink -> initialize -> run on args->stream. Every failure
// returns a code (launch.hpp's kLaunch*) with a sentence in args->message.
//
// Each macro first instantiates EntryChecks<Gemm> at namespace scope (cutlass/entry_checks.hpp): a
// kernel the adapter cannot run (another tile scheduler, a rank-3 problem shape, another fusion, an
// element type or a stride it cannot pass) stops the build there, in seconds, before the kernel is
// instantiated.
// CaseChecks<Gemm> does the same for what the case expects of the kernel (tile, element types, majors)
// where a live run passes it as -DORACLE_CASE_* defines (oracle/run/adapters.py library_defines).
//
// Constraints: one GEMM or a strided batched one (L = the case's batch, M each entry's rows, every operand's
// entries one after the other as the oracle stores them; the taps name the entry as their group, so each
// entry is judged as its own GEMM); a grouped kernel (GroupProblemShape) goes through cutlass/grouped_entry.hpp,
// whose launch_entry / launch_host_entry the macros call (they pick this file's launch / launch_host otherwise). A split of k (splits > 1, or stream_k_workers; batch 1) needs CUTLASS's stream-K
// scheduler, traced (TracedScheduler, cutlass/sm90_stream_k.hpp); the quick route asks it for
// DecompositionMode::SplitK with the case's splits, StreamK with the SM count stream_k_workers (at most the
// device's), or DataParallel where the case splits nothing; the host route's own scheduler arguments run as
// returned, but may not split where the case declares no split. The epilogue is CUTLASS's LinearCombination (alpha, beta, C; no
// scales), LinCombEltAct, LinCombPerRowBias, LinCombPerColBias or their EltAct forms (the quick route
// passes the bias: a contiguous [M] or [N] vector of the fusion's ElementBias), the adapter's
// TensorScaledLinearCombination (also scale_a and scale_b of kind "tensor": one fp32 each, handed to the
// kernel as device pointers; the quick route only), or the user's own Sm90EVT tree (its arguments filled
// by ORACLE_CUTLASS_ENTRY_WITH's function; its bias and activation are not checked here, its order is);
// a fusion with anything else stops the build at a static_assert, a problem the fusion lacks (or a bias
// or activation it does not have) is refused with kLaunchUnsupported. The traced build keeps the
// epilogue tree's order as text (ORACLE_CUTLASS_EPILOGUE_ORDER) for the oracle to read. C absent only with beta == 0 (D's address then
// stands in for C's, which the epilogue does not read). The case's tile must be the kernel's CTA tile
// (BM, BN, BK). Each stride mode CUTLASS fixes at compile time (the unit stride of a row- or
// column-major operand) must be the tensor's. The host route's own arguments are run as returned
// (their sizes, pointers, strides, alpha and beta are what is judged); only a batch count L other
// than the case's batch or a grouped / array mode is refused. A bias with batch > 1 is refused (one
// vector is passed).

#ifndef ORACLE_TRACE_CUTLASS_ENTRY_HPP_
#define ORACLE_TRACE_CUTLASS_ENTRY_HPP_

#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"
#include "oracle_trace/cutlass/entry_checks.hpp"
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

// CUTLASS's (outer, inner, batch) stride.
template <class Stride>
bool put_strides(Stride& s, int64_t first, int64_t second, int64_t batch) {
  return put_stride(cute::get<0>(s), first) && put_stride(cute::get<1>(s), second) &&
         put_stride(cute::get<2>(s), batch);
}

// The batch entries of a launch: L = args->batch, each `rows` = M / L of A's, C's and D's rows (the
// entries are stacked along M, one after the other, as the oracle stores them).
struct Batch {
  int64_t count;
  int64_t rows;
};

// An operand's logical strides into CUTLASS's stride. A, C, D: a [L * M, cols] TensorRef whose entry l
// starts M rows after entry l - 1 (batch stride M * the row stride). B (`stacked`): [K, N] when L = 1,
// else [L, K, N], whose (n, k, l) stride reads the TensorRef's strides the other way round. One the
// kernel's layout cannot take (a static mode of another value: a static batch stride with L > 1)
// refuses the launch, naming the operand. kLaunchOk when it fits.
template <class Stride>
int put_operand_strides(const LaunchArgs* args, Stride& s, const TensorRef& t, const char* name, Batch batch,
                        bool stacked = false) {
  const int lead = stacked && t.rank == 3 ? 1 : 0;  // B: the first of (K, N)
  int64_t first = t.stride[lead], second = t.stride[lead + 1], step = 0;
  if (batch.count > 1) step = stacked ? t.stride[0] : batch.rows * t.stride[0];
  if (stacked) std::swap(first, second);
  if (put_strides(s, first, second, step)) return kLaunchOk;
  return fail_launch(args, kLaunchUnsupported,
                     "%s's strides (%lld, %lld; batch step %lld) do not fit the kernel's layout of %s", name,
                     (long long)t.stride[lead], (long long)t.stride[lead + 1], (long long)step, name);
}

inline bool is_matrix(const TensorRef& t, int64_t rows, int64_t cols) {
  return t.data != nullptr && t.rank == 2 && t.shape[0] == rows && t.shape[1] == cols;
}

// B of a launch: [K, N], or [L, K, N] for L > 1 batch entries.
inline bool is_b_operand(const TensorRef& t, int64_t batch, int64_t k, int64_t n) {
  if (batch == 1) return is_matrix(t, k, n);
  return t.data != nullptr && t.rank == 3 && t.shape[0] == batch && t.shape[1] == k && t.shape[2] == n;
}

inline Batch batch_of(const LaunchArgs* args) { return {args->batch, args->m / args->batch}; }

template <class Element>
bool has_type(const TensorRef& t) {
  return launch_code<Element> != ElementType::None && t.dtype == uint32_t(launch_code<Element>);
}

inline bool is_scalar_f32(const TensorRef& t) {
  int64_t count = 1;
  for (uint32_t d = 0; d < t.rank && d < kMaxRank; ++d) count *= t.shape[d];
  return t.data != nullptr && t.dtype == uint32_t(ElementType::F32) && t.rank <= kMaxRank && count == 1;
}

// The runtime refusals both routes share: the problem kinds, sizes, tile, epilogue and tensors.
template <class Gemm>
int check_launch(const LaunchArgs* args) {
  using T = KernelTypes<Gemm>;
  using TileShape = typename T::TileShape;
  constexpr int kBM = cute::size<0>(TileShape{}), kBN = cute::size<1>(TileShape{}), kBK = cute::size<2>(TileShape{});
  constexpr bool kScaled = T::kScaled;

  if (const int bad = check_args(args)) return bad;
  const TensorRef& A = tensor(args, kSlotA);
  const TensorRef& B = tensor(args, kSlotB);
  const TensorRef& C = tensor(args, kSlotC);
  const TensorRef& D = tensor(args, kSlotD);
  const int64_t M = args->m, N = args->n, K = args->k, L = args->batch;  // M: every batch entry's rows
  if (args->groups != 0)
    return fail_launch(args, kLaunchUnsupported,
                       "a grouped problem (%lld groups) was passed to a kernel that is not grouped: a grouped case "
                       "runs on CUTLASS's grouped GEMM (GroupProblemShape, cutlass/grouped_entry.hpp)",
                       (long long)args->groups);
  if (args->splits < 1 || args->stream_k_workers < 0 || (args->splits > 1 && args->stream_k_workers > 0))
    return fail_launch(args, kLaunchUnsupported, "splits %d, stream_k_workers %d: splits >= 1, stream_k_workers >= 0, "
                       "not both a split", args->splits, args->stream_k_workers);
  if (!T::kStreamK && (args->splits != 1 || args->stream_k_workers != 0))
    return fail_launch(args, kLaunchUnsupported,
                       "splits %d, stream_k_workers %d given: the kernel's tile scheduler (CUTLASS's persistent one) "
                       "never splits a tile (allowed: 1, 0; a split needs StreamKScheduler through TracedScheduler)",
                       args->splits, args->stream_k_workers);
  if (L != 1 && (args->splits != 1 || args->stream_k_workers != 0))
    return fail_launch(args, kLaunchUnsupported,
                       "batch %lld with splits %d, stream_k_workers %d: a split of k is traced for one GEMM per call "
                       "(batch 1)", (long long)L, args->splits, args->stream_k_workers);
  if (L < 1 || L > INT32_MAX || M % L != 0)
    return fail_launch(args, kLaunchUnsupported,
                       "batch %lld over %lld rows: the batch count must be 1 .. 2^31 - 1 and divide M (every entry "
                       "has M / batch rows)", (long long)L, (long long)M);
  if (M / L > INT32_MAX || N > INT32_MAX || K > INT32_MAX || M < 1 || N < 1 || K < 1)
    return fail_launch(args, kLaunchUnsupported, "sizes %lld x %lld x %lld: each must be 1 .. 2^31 - 1",
                       (long long)(M / L), (long long)N, (long long)K);
  if (args->tile_m != kBM || args->tile_n != kBN || args->tile_k != kBK)
    return fail_launch(args, kLaunchUnsupported, "the kernel's CTA tile is %d x %d x %d, the case says %d x %d x %d", kBM,
                       kBN, kBK, args->tile_m, args->tile_n, args->tile_k);
  if constexpr (!T::kUserTree) {  // a user's own tree: what it adds is its own (the order is judged)
    using Facts = typename T::Facts;
    if (args->bias_kind != uint32_t(Facts::bias) || args->activation != uint32_t(Facts::activation))
      return fail_launch(args, kLaunchUnsupported,
                         "the kernel's epilogue adds bias %s and activation %s; the case asks for bias %s and "
                         "activation %s", bias_kind_name(uint32_t(Facts::bias)), activation_name(uint32_t(Facts::activation)),
                         bias_kind_name(args->bias_kind), activation_name(args->activation));
    if constexpr (Facts::bias != int(BiasKind::None)) {
      if (L != 1)
        return fail_launch(args, kLaunchUnsupported,
                           "batch %lld with a bias: the adapter passes one bias vector (batch 1); a bias per batch "
                           "entry is not passed by this version", (long long)L);
      const TensorRef& bias = tensor(args, kSlotBias);
      const int64_t length = Facts::bias == int(BiasKind::Row) ? args->m : args->n;
      using ElementBias = cute::remove_cvref_t<decltype(*std::declval<typename Gemm::Arguments&>().epilogue.thread.bias_ptr)>;
      if (bias.data == nullptr || bias.rank != 1 || bias.shape[0] != length || bias.stride[0] != 1 ||
          !has_type<ElementBias>(bias))
        return fail_launch(args, kLaunchUnsupported,
                           "the bias must be a contiguous [%s] = [%lld] vector of element type %s (got %s, rank %u)",
                           Facts::bias == int(BiasKind::Row) ? "M" : "N", (long long)length,
                           element_type_name(launch_code<ElementBias>), element_type_name(bias.dtype), bias.rank);
    } else if (tensor(args, kSlotBias).data != nullptr) {
      return fail_launch(args, kLaunchUnsupported, "a bias tensor was passed to an epilogue without a bias");
    }
  }
  if constexpr (kScaled) {
    if (args->scale_a_kind != uint32_t(ScaleKind::Tensor) || args->scale_b_kind != uint32_t(ScaleKind::Tensor))
      return fail_launch(args, kLaunchUnsupported,
                         "the epilogue scales A and B per tensor: scale kinds %s and %s given (allowed: tensor for "
                         "both)", scale_kind_name(args->scale_a_kind), scale_kind_name(args->scale_b_kind));
    if (!is_scalar_f32(tensor(args, kSlotScaleA)) || !is_scalar_f32(tensor(args, kSlotScaleB)))
      return fail_launch(args, kLaunchUnsupported, "scale_a and scale_b must each be one fp32 element in device memory");
  } else if constexpr (T::kBlockScaled) {  // the mainloop applies them (cutlass/sm90_blockwise.hpp)
    if (const int bad = check_block_scales<typename T::Mainloop>(args)) return bad;
  } else if (args->scale_a_kind != uint32_t(ScaleKind::None) || args->scale_b_kind != uint32_t(ScaleKind::None)) {
    return fail_launch(args, kLaunchUnsupported,
                       "the epilogue is a LinearCombination (alpha, beta, C): no scales (scale kinds %s and %s "
                       "given; TensorScaledLinearCombination takes per-tensor ones)", scale_kind_name(args->scale_a_kind),
                       scale_kind_name(args->scale_b_kind));
  }
  using ElementA = typename T::ElementA;
  using ElementB = typename T::ElementB;
  using ElementC = typename T::ElementC;
  using ElementD = typename T::ElementD;
  if (!is_matrix(A, M, K) || !has_type<ElementA>(A))
    return fail_launch(args, kLaunchUnsupported, "A must be a [M, K] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)K, element_type_name(launch_code<ElementA>), element_type_name(A.dtype));
  if (!is_b_operand(B, L, K, N) || !has_type<ElementB>(B)) {
    if (L == 1)
      return fail_launch(args, kLaunchUnsupported, "B must be a [K, N] = [%lld, %lld] matrix of element type %s (got %s)",
                         (long long)K, (long long)N, element_type_name(launch_code<ElementB>), element_type_name(B.dtype));
    return fail_launch(args, kLaunchUnsupported,
                       "B must be [batch, K, N] = [%lld, %lld, %lld] of element type %s (got %s, rank %u)", (long long)L,
                       (long long)K, (long long)N, element_type_name(launch_code<ElementB>), element_type_name(B.dtype),
                       B.rank);
  }
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
  return kLaunchOk;
}

// The quick route: Gemm::Arguments from LaunchArgs (check_launch passed). The strides are checked
// against the kernel's layouts here; no CUDA call.
template <class Gemm>
int fill_arguments(const LaunchArgs* args, typename Gemm::Arguments& g) {
  using T = KernelTypes<Gemm>;
  const TensorRef& A = tensor(args, kSlotA);
  const TensorRef& B = tensor(args, kSlotB);
  const TensorRef& C = tensor(args, kSlotC);
  const TensorRef& D = tensor(args, kSlotD);
  const Batch batch = batch_of(args);
  g.mode = cutlass::gemm::GemmUniversalMode::kGemm;  // CUTLASS 3.x: (M, N, K, L) with L entries
  g.problem_shape = {int(batch.rows), int(args->n), int(args->k), int(batch.count)};
  g.mainloop.ptr_A = static_cast<const typename T::ElementA*>(A.data);
  g.mainloop.ptr_B = static_cast<const typename T::ElementB*>(B.data);
  // CUTLASS strides: A (m, k, l), B (n, k, l), C and D (m, n, l)
  const TensorRef& src = C.data != nullptr ? C : D;
  if (int e = put_operand_strides(args, g.mainloop.dA, A, "A", batch)) return e;
  if (int e = put_operand_strides(args, g.mainloop.dB, B, "B", batch, true)) return e;
  if (int e = put_operand_strides(args, g.epilogue.dC, src, "C", batch)) return e;
  if (int e = put_operand_strides(args, g.epilogue.dD, D, "D", batch)) return e;
  g.epilogue.ptr_C = static_cast<const typename T::ElementC*>(src.data);
  g.epilogue.ptr_D = static_cast<typename T::ElementD*>(D.data);
  if constexpr (!T::kUserTree) {  // a user's own tree: its arguments are filled by the user's function
    g.epilogue.thread.alpha = args->alpha;
    g.epilogue.thread.beta = args->beta;
  }
  if constexpr (!T::kUserTree && T::Facts::bias != int(BiasKind::None)) {
    using ElementBias = cute::remove_cvref_t<decltype(*g.epilogue.thread.bias_ptr)>;
    g.epilogue.thread.bias_ptr = static_cast<const ElementBias*>(tensor(args, kSlotBias).data);
  }
  if constexpr (T::kStreamK) {  // the case's split: split-K, stream-K, or none (data-parallel: whole tiles)
    using Mode = cute::remove_cvref_t<decltype(g.scheduler.decomposition_mode)>;
    g.scheduler.splits = args->splits;
    g.scheduler.decomposition_mode =
        args->splits > 1 ? Mode::SplitK : args->stream_k_workers > 0 ? Mode::StreamK : Mode::DataParallel;
  }
  if constexpr (T::kBlockScaled) fill_block_scales<typename T::Mainloop>(args, g.mainloop);
  if constexpr (T::kScaled) {
    g.epilogue.thread.scale_a_ptr = static_cast<const float*>(tensor(args, kSlotScaleA).data);
    g.epilogue.thread.scale_b_ptr = static_cast<const float*>(tensor(args, kSlotScaleB).data);
  }
  return kLaunchOk;
}

// The device's id and SM count (the quick route's; the host route's make sets its own, or leaves the
// SM count 0 for CUTLASS to query).
template <class Gemm>
int fill_hw_info(const LaunchArgs* args, typename Gemm::Arguments& g) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device))
    return fail_launch(args, kLaunchCudaError, "cudaGetDevice: %s", cudaGetErrorString(e));
  g.hw_info.device_id = device;
  g.hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  if constexpr (KernelTypes<Gemm>::kStreamK) {  // CUTLASS sizes its stream-K units by the SM count it is given
    if (args->stream_k_workers > g.hw_info.sm_count)
      return fail_launch(args, kLaunchUnsupported,
                         "stream_k_workers = %d: CUTLASS's stream-K takes at most the device's %d SMs (its units wait "
                         "on each other: all must be resident)", args->stream_k_workers, g.hw_info.sm_count);
    if (args->stream_k_workers > 0) g.hw_info.sm_count = args->stream_k_workers;
  }
  return kLaunchOk;
}

// A row- or column-major stride's leading dimension: its integer mode of the first two.
template <class Stride>
int64_t leading_dimension(const Stride& s) {
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    return int64_t(cute::get<1>(s));
  } else {
    return int64_t(cute::get<0>(s));
  }
}

// can_implement, the workspace, the sink and the launch, on args->stream.
template <class Gemm>
int run_gemm(const LaunchArgs* args, const typename Gemm::Arguments& g) {
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

// The quick route: the adapter fills the arguments, `adjust` (if any) changes them.
template <class Gemm>
int launch(const LaunchArgs* args, int (*adjust)(const LaunchArgs*, typename Gemm::Arguments&)) {
  static_assert(EntryChecks<Gemm>::ok, "");
  if (const int bad = check_launch<Gemm>(args)) return bad;
  typename Gemm::Arguments g{};
  if (const int bad = fill_arguments<Gemm>(args, g)) return bad;
  if (const int bad = fill_hw_info<Gemm>(args, g)) return bad;
  if (adjust != nullptr) {
    if (const int code = adjust(args, g)) return code;
  }
  return run_gemm<Gemm>(args, g);
}

inline const char* mode_name(cutlass::gemm::GemmUniversalMode mode) {
  using Mode = cutlass::gemm::GemmUniversalMode;
  switch (mode) {
    case Mode::kGemm: return "kGemm";
    case Mode::kGemmSplitKParallel: return "kGemmSplitKParallel";
    case Mode::kBatched: return "kBatched";
    case Mode::kArray: return "kArray";
    case Mode::kGrouped: return "kGrouped";
    default: return "kInvalid";
  }
}

inline const char* decomposition_name(int mode) {
  switch (mode) {  // PersistentTileSchedulerSm90StreamKParams::DecompositionMode
    case 0: return "Heuristic";
    case 1: return "DataParallel";
    case 2: return "SplitK";
    case 3: return "StreamK";
    default: return "(unknown)";
  }
}

// The host route's stream-K scheduler arguments against the case: a case that declares no split
// (splits 1, no stream_k_workers) is judged as whole tiles, so the arguments may not split.
template <class Gemm>
int check_host_split(const LaunchArgs* args, const typename Gemm::Arguments& g) {
  using Mode = cute::remove_cvref_t<decltype(g.scheduler.decomposition_mode)>;
  if (args->splits > 1 || args->stream_k_workers > 0) return kLaunchOk;  // the partition is read from the taps
  if (g.scheduler.splits > 1 || g.scheduler.decomposition_mode != Mode::DataParallel)
    return fail_launch(args, kLaunchUnsupported,
                       "make_arguments asks CUTLASS's stream-K scheduler for decomposition %s with splits %d, and the "
                       "case declares no split: give the case splits or stream_k_workers (the partition is read from "
                       "the taps), or pass DecompositionMode::DataParallel",
                       decomposition_name(int(g.scheduler.decomposition_mode)), g.scheduler.splits);
  return kLaunchOk;
}

// The host route: the user's make(...) returns the arguments, run as returned. The adapter's own
// filling checks the layouts and gives the leading dimensions and pointers make receives, with
// m = each batch entry's rows and l = the batch count (the entries stacked as the oracle stores them:
// a packed stride's batch step, CUTLASS's make_cute_packed_stride(S{}, {m, k, l}), is theirs).
template <class Gemm, class Make>
int launch_host(const LaunchArgs* args, Make make) {
  static_assert(EntryChecks<Gemm>::ok && HostEntryChecks<Gemm, Make>::ok, "");
  if (const int bad = check_launch<Gemm>(args)) return bad;
  typename Gemm::Arguments ours{};
  if (const int bad = fill_arguments<Gemm>(args, ours)) return bad;
  const typename Gemm::Arguments g =
      make(int(batch_of(args).rows), int(args->n), int(args->k), int(args->batch), ours.mainloop.ptr_A,
           leading_dimension(ours.mainloop.dA),
           ours.mainloop.ptr_B, leading_dimension(ours.mainloop.dB), ours.epilogue.ptr_C,
           leading_dimension(ours.epilogue.dC), static_cast<typename KernelTypes<Gemm>::ElementD*>(tensor(args, kSlotD).data),
           leading_dimension(ours.epilogue.dD), args->alpha, args->beta);
  using Mode = cutlass::gemm::GemmUniversalMode;
  if (g.mode != Mode::kGemm && g.mode != Mode::kBatched)
    return fail_launch(args, kLaunchUnsupported,
                       "make_arguments returned GemmUniversalMode::%s: the adapter runs a GEMM or a strided batched "
                       "one (kGemm or kBatched)", mode_name(g.mode));
  if (const int l = int(cute::get<3>(g.problem_shape)); l != args->batch)
    return fail_launch(args, kLaunchUnsupported,
                       "make_arguments returned a problem shape with L = %d where the case has batch = %lld: the "
                       "oracle judges every batch entry, so L must be the case's batch", l, (long long)args->batch);
  if constexpr (KernelTypes<Gemm>::kStreamK) {
    if (const int bad = check_host_split<Gemm>(args, g)) return bad;
  }
  return run_gemm<Gemm>(args, g);
}

}  // namespace oracle_trace::cutlass_sm90

// The traced tree's epilogue order, kept in the library as text that the oracle reads from the built
// file before it runs it (oracle/run/adapters.py library_epilogue): a case without `epilogue` is judged
// in this order, one that declares another is refused naming both. Only the traced build has it (the
// production tree has no taps to read it from).
#if defined(ORACLE_TRACE)
#define ORACLE_CUTLASS_EPILOGUE_ORDER(GEMM)                                                    \
  __attribute__((used)) static constexpr auto oracle_cutlass_epilogue_order =                 \
      oracle_trace::cutlass_sm90::EpilogueOrder<GEMM>::value;
#else
#define ORACLE_CUTLASS_EPILOGUE_ORDER(GEMM)
#endif

// Each entry macro checks the kernel's types first, at namespace scope (EntryChecks): a kernel the
// adapter cannot run stops the build before its device code is instantiated.
#define ORACLE_CUTLASS_ENTRY_WITH(GEMM, ADJUST)                                                  \
  static_assert(oracle_trace::cutlass_sm90::EntryChecks<GEMM>::ok, "");                          \
  static_assert(oracle_trace::cutlass_sm90::CaseChecks<GEMM>::ok, "");                           \
  static_assert(oracle_trace::cutlass_sm90::AdjustChecks<GEMM, decltype(ADJUST)>::ok, "");       \
  ORACLE_CUTLASS_EPILOGUE_ORDER(GEMM)                                                            \
  extern "C" int oracle_launch(const oracle_trace::LaunchArgs* args) {            \
    return oracle_trace::cutlass_sm90::launch_entry<GEMM>(args, ADJUST);          \
  }

#define ORACLE_CUTLASS_ENTRY(GEMM) ORACLE_CUTLASS_ENTRY_WITH(GEMM, nullptr)

// MAKE: the user's function (a name found from the global namespace), called through a wrapper so
// that an overload set or a template works too.
#define ORACLE_CUTLASS_HOST_ENTRY(GEMM, MAKE)                                                                   \
  static_assert(oracle_trace::cutlass_sm90::EntryChecks<GEMM>::ok, "");                                         \
  static_assert(oracle_trace::cutlass_sm90::CaseChecks<GEMM>::ok, "");                                          \
  namespace {                                                                                                   \
  struct OracleCutlassMakeArguments {                                                                           \
    template <class... Ts>                                                                                      \
    auto operator()(Ts... values) const -> decltype(MAKE(values...)) {                                         \
      return MAKE(values...);                                                                                   \
    }                                                                                                           \
  };                                                                                                            \
  }                                                                                                             \
  static_assert(oracle_trace::cutlass_sm90::HostEntryChecks<GEMM, OracleCutlassMakeArguments>::ok, "");         \
  ORACLE_CUTLASS_EPILOGUE_ORDER(GEMM)                                                                           \
  extern "C" int oracle_launch(const oracle_trace::LaunchArgs* args) {                                          \
    return oracle_trace::cutlass_sm90::launch_host_entry<GEMM>(args, OracleCutlassMakeArguments{});             \
  }

#endif  // ORACLE_TRACE_CUTLASS_ENTRY_HPP_

// oracle_trace/cutlass/grouped_entry.hpp -- oracle_launch for a grouped (pointer-array) CUTLASS GEMM, and the
// entry macros' dispatch between it and the plain one (cutlass/entry.hpp).
//
// A grouped case (`groups` = [M_0, ..., M_{G-1}], N and K shared, as the oracle's grouped MoE problems are
// described: oracle/problem/spec.py) arrives as the harness stores it: A [sum M, K] and C, D [sum M, N] with
// the groups' rows one after the other, B [G, K, N] (one matrix per group), the groups' row offsets in
// device memory (args->group_offsets, G + 1 of them). Group g's operands: A, C and D from row offset_g,
// B[g].
//
// Data path: LaunchArgs -> check_grouped_launch (ABI, sizes, tile, what a LinearCombination takes) ->
// the offsets copied to the host (on args->stream, synchronised) and checked -> per group: (M_g, N, K),
// the four pointers, the four strides ->
//   quick route (ORACLE_CUTLASS_ENTRY): the adapter's own Gemm::Arguments, {kGrouped, {G, sizes on the
//     device, sizes on the host}, {ptr_A[], dA[], ptr_B[], dB[]}, {{alpha, beta}, ptr_C[], dC[], ptr_D[],
//     dD[]}, hw_info}, its arrays in one cudaMallocAsync block on args->stream (freed on it after the launch);
//   host route (ORACLE_CUTLASS_HOST_ENTRY): the user's make(G, group_m, n, k, a, lda, b, ldb, c, ldc, d, ldd,
//     alpha, beta), whose arrays, pointers, strides and per-group sizes are run as returned (its own device
//     memory, alive until the harness synchronises the stream); only a mode other than kGrouped or a group
//     count other than the case's is refused;
// -> run_gemm (cutlass/entry.hpp: can_implement, workspace, sink, launch).
//
// Constraints: LinearCombination only (no bias, activation or scales: cutlass/sm90_grouped.hpp's
// GroupedChecks); batch 1, no split; an empty group (M_g = 0) is passed as CUTLASS takes it, (0, N, K).

#ifndef ORACLE_TRACE_CUTLASS_GROUPED_ENTRY_HPP_
#define ORACLE_TRACE_CUTLASS_GROUPED_ENTRY_HPP_

#include <stdint.h>

#include <type_traits>
#include <vector>

#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "oracle_trace/cutlass/entry.hpp"
#include "oracle_trace/cutlass/entry_checks.hpp"
#include "oracle_trace/launch.hpp"

namespace oracle_trace::cutlass_sm90 {

// The refusals of a grouped launch, before any CUDA call.
template <class Gemm>
int check_grouped_launch(const LaunchArgs* args) {
  using T = KernelTypes<Gemm>;
  using TileShape = typename T::TileShape;
  constexpr int kBM = cute::size<0>(TileShape{}), kBN = cute::size<1>(TileShape{}), kBK = cute::size<2>(TileShape{});
  if (const int bad = check_args(args)) return bad;
  const int64_t M = args->m, N = args->n, K = args->k, G = args->groups;
  if (G < 1 || G > INT32_MAX || args->group_offsets == nullptr)
    return fail_launch(args, kLaunchUnsupported,
                       "the kernel is a grouped GEMM (GroupProblemShape) and the launch has %lld groups%s: a grouped "
                       "case gives [problem] groups = [M of each group]", (long long)G,
                       args->group_offsets == nullptr ? " and no group offsets" : "");
  if (args->batch != 1 || args->splits != 1 || args->stream_k_workers != 0)
    return fail_launch(args, kLaunchUnsupported,
                       "batch %lld, splits %d, stream_k_workers %d with groups: a grouped GEMM runs every group whole "
                       "(batch 1, no split)", (long long)args->batch, args->splits, args->stream_k_workers);
  if (M < 0 || M > INT32_MAX || N < 1 || N > INT32_MAX || K < 1 || K > INT32_MAX)
    return fail_launch(args, kLaunchUnsupported, "sizes %lld x %lld x %lld: M 0 .. 2^31 - 1, N and K 1 .. 2^31 - 1",
                       (long long)M, (long long)N, (long long)K);
  if (args->tile_m != kBM || args->tile_n != kBN || args->tile_k != kBK)
    return fail_launch(args, kLaunchUnsupported, "the kernel's CTA tile is %d x %d x %d, the case says %d x %d x %d", kBM,
                       kBN, kBK, args->tile_m, args->tile_n, args->tile_k);
  if (args->bias_kind != uint32_t(BiasKind::None) || args->activation != uint32_t(Activation::None) ||
      args->scale_a_kind != uint32_t(ScaleKind::None) || args->scale_b_kind != uint32_t(ScaleKind::None) ||
      tensor(args, kSlotBias).data != nullptr)
    return fail_launch(args, kLaunchUnsupported,
                       "the grouped kernel's epilogue is a LinearCombination (alpha, beta, C); the case asks for bias "
                       "%s, activation %s, scales %s and %s", bias_kind_name(args->bias_kind),
                       activation_name(args->activation), scale_kind_name(args->scale_a_kind),
                       scale_kind_name(args->scale_b_kind));
  const TensorRef& A = tensor(args, kSlotA);
  const TensorRef& B = tensor(args, kSlotB);
  const TensorRef& C = tensor(args, kSlotC);
  const TensorRef& D = tensor(args, kSlotD);
  if (!is_matrix(A, M, K) || !has_type<typename T::ElementA>(A))
    return fail_launch(args, kLaunchUnsupported, "A must be a [M, K] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)K, element_type_name(launch_code<typename T::ElementA>),
                       element_type_name(A.dtype));
  if (B.data == nullptr || B.rank != 3 || B.shape[0] != G || B.shape[1] != K || B.shape[2] != N ||
      !has_type<typename T::ElementB>(B))
    return fail_launch(args, kLaunchUnsupported,
                       "B must be one [K, N] matrix per group, [groups, K, N] = [%lld, %lld, %lld], of element type %s "
                       "(got %s, rank %u)", (long long)G, (long long)K, (long long)N,
                       element_type_name(launch_code<typename T::ElementB>), element_type_name(B.dtype), B.rank);
  if (!is_matrix(D, M, N) || !has_type<typename T::ElementD>(D))
    return fail_launch(args, kLaunchUnsupported, "D must be a [M, N] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)N, element_type_name(launch_code<typename T::ElementD>),
                       element_type_name(D.dtype));
  if (C.data != nullptr && (!is_matrix(C, M, N) || !has_type<typename T::ElementC>(C)))
    return fail_launch(args, kLaunchUnsupported, "C must be a [M, N] = [%lld, %lld] matrix of element type %s (got %s)",
                       (long long)M, (long long)N, element_type_name(launch_code<typename T::ElementC>),
                       element_type_name(C.dtype));
  if (C.data == nullptr && args->beta != 0.f)
    return fail_launch(args, kLaunchUnsupported, "beta = %g needs C, and the harness passed none", double(args->beta));
  if (args->trace_sink != nullptr && !compiled_in)
    return fail_launch(args, kLaunchUnsupported, "a trace sink was given but this build has no ORACLE_TRACE");
  return kLaunchOk;
}

// M of every group, from the harness's device offsets (G + 1, the last M), checked.
inline int read_group_sizes(const LaunchArgs* args, std::vector<int>& group_m, std::vector<int64_t>& offset) {
  const size_t groups = size_t(args->groups);
  std::vector<int32_t> raw(groups + 1);
  if (const cudaError_t e = cudaMemcpyAsync(raw.data(), args->group_offsets, raw.size() * sizeof(int32_t),
                                            cudaMemcpyDeviceToHost, args->stream))
    return fail_launch(args, kLaunchCudaError, "copying the group offsets to the host: %s", cudaGetErrorString(e));
  if (const cudaError_t e = cudaStreamSynchronize(args->stream))
    return fail_launch(args, kLaunchCudaError, "copying the group offsets to the host: %s", cudaGetErrorString(e));
  group_m.assign(groups, 0);
  offset.assign(groups + 1, 0);
  for (size_t g = 0; g <= groups; ++g) offset[g] = raw[g];
  if (raw[0] != 0 || int64_t(raw[groups]) != args->m)
    return fail_launch(args, kLaunchUnsupported, "the group offsets run from %d to %d; they must run from 0 to M = %lld",
                       raw[0], raw[groups], (long long)args->m);
  for (size_t g = 0; g < groups; ++g) {
    if (raw[g + 1] < raw[g])
      return fail_launch(args, kLaunchUnsupported, "group %zu's offsets %d .. %d decrease", g, raw[g], raw[g + 1]);
    group_m[g] = raw[g + 1] - raw[g];
  }
  return kLaunchOk;
}

// One operand of group g: its first element (`rows_from` rows of the stacked matrix in, or B[g]) and its
// CUTLASS stride (outer, inner, 0), checked against the kernel's layout.
template <class Element, class Stride>
int group_operand(const LaunchArgs* args, const TensorRef& t, const char* name, int64_t rows_from, bool stacked,
                  size_t g, const Element*& ptr, Stride& stride) {
  const int lead = stacked ? 1 : 0;
  int64_t first = t.stride[lead], second = t.stride[lead + 1];
  if (stacked) std::swap(first, second);  // B's (n, k) stride reads [K, N]'s the other way round
  const int64_t start = stacked ? int64_t(g) * t.stride[0] : rows_from * t.stride[0];
  ptr = static_cast<const Element*>(t.data) + start;
  if (put_strides(stride, first, second, 0)) return kLaunchOk;
  return fail_launch(args, kLaunchUnsupported, "%s's strides (%lld, %lld) do not fit the kernel's layout of %s", name,
                     (long long)t.stride[lead], (long long)t.stride[lead + 1], name);
}

// Every group's pointers and strides as the oracle stores the groups (check_grouped_launch passed).
template <class Gemm>
struct GroupedOperands {
  using Kernel = typename Gemm::GemmKernel;
  using T = KernelTypes<Gemm>;
  using StrideA = cute::remove_pointer_t<typename Kernel::StrideA>;
  using StrideB = cute::remove_pointer_t<typename Kernel::StrideB>;
  using StrideC = cute::remove_pointer_t<typename Kernel::StrideC>;
  using StrideD = cute::remove_pointer_t<typename Kernel::StrideD>;
  using Size = typename Kernel::ProblemShape::UnderlyingProblemShape;
  std::vector<int> group_m;
  std::vector<int64_t> offset;
  std::vector<Size> sizes;
  std::vector<const typename T::ElementA*> a;
  std::vector<const typename T::ElementB*> b;
  std::vector<const typename T::ElementC*> c;
  std::vector<typename T::ElementD*> d;
  std::vector<StrideA> da;
  std::vector<StrideB> db;
  std::vector<StrideC> dc;
  std::vector<StrideD> dd;

  int fill(const LaunchArgs* args) {
    if (const int bad = read_group_sizes(args, group_m, offset)) return bad;
    const size_t groups = group_m.size();
    const TensorRef& C = tensor(args, kSlotC);
    const TensorRef& D = tensor(args, kSlotD);
    const TensorRef& src = C.data != nullptr ? C : D;  // D stands in for C where beta = 0 (not read)
    sizes.resize(groups), a.resize(groups), b.resize(groups), c.resize(groups), d.resize(groups);
    da.resize(groups), db.resize(groups), dc.resize(groups), dd.resize(groups);
    for (size_t g = 0; g < groups; ++g) {
      sizes[g] = Size{group_m[g], int(args->n), int(args->k)};
      const typename T::ElementD* out = nullptr;
      if (int e = group_operand(args, tensor(args, kSlotA), "A", offset[g], false, g, a[g], da[g])) return e;
      if (int e = group_operand(args, tensor(args, kSlotB), "B", 0, true, g, b[g], db[g])) return e;
      if (int e = group_operand(args, src, "C", offset[g], false, g, c[g], dc[g])) return e;
      if (int e = group_operand(args, D, "D", offset[g], false, g, out, dd[g])) return e;
      d[g] = const_cast<typename T::ElementD*>(out);
    }
    return kLaunchOk;
  }
};

// Bytes of n values of T, rounded up to 16 (each array of the quick route's block starts 16-byte aligned).
template <class T>
size_t padded_bytes(size_t n) {
  return (n * sizeof(T) + 15) / 16 * 16;
}

// The quick route: the adapter's arrays in one device block, the arguments pointing into it.
template <class Gemm>
int launch_grouped(const LaunchArgs* args, int (*adjust)(const LaunchArgs*, typename Gemm::Arguments&)) {
  static_assert(EntryChecks<Gemm>::ok, "");
  if (const int bad = check_grouped_launch<Gemm>(args)) return bad;
  GroupedOperands<Gemm> ops;
  if (const int bad = ops.fill(args)) return bad;
  const size_t groups = ops.group_m.size();
  using O = GroupedOperands<Gemm>;
  const size_t parts[] = {padded_bytes<typename O::Size>(groups),
                          padded_bytes<const void*>(groups) * 4,
                          padded_bytes<typename O::StrideA>(groups), padded_bytes<typename O::StrideB>(groups),
                          padded_bytes<typename O::StrideC>(groups), padded_bytes<typename O::StrideD>(groups)};
  size_t total = 0;
  for (size_t p : parts) total += p;
  std::vector<char> host(total, 0);
  char* at = host.data();
  auto place = [&](const void* src, size_t bytes, size_t padded) {
    memcpy(at, src, bytes);
    const size_t where = size_t(at - host.data());
    at += padded;
    return where;
  };
  const size_t sizes_at = place(ops.sizes.data(), groups * sizeof(typename O::Size), parts[0]);
  const size_t ptr_bytes = padded_bytes<const void*>(groups);
  const size_t a_at = place(ops.a.data(), groups * sizeof(void*), ptr_bytes);
  const size_t b_at = place(ops.b.data(), groups * sizeof(void*), ptr_bytes);
  const size_t c_at = place(ops.c.data(), groups * sizeof(void*), ptr_bytes);
  const size_t d_at = place(ops.d.data(), groups * sizeof(void*), ptr_bytes);
  const size_t da_at = place(ops.da.data(), groups * sizeof(typename O::StrideA), parts[2]);
  const size_t db_at = place(ops.db.data(), groups * sizeof(typename O::StrideB), parts[3]);
  const size_t dc_at = place(ops.dc.data(), groups * sizeof(typename O::StrideC), parts[4]);
  const size_t dd_at = place(ops.dd.data(), groups * sizeof(typename O::StrideD), parts[5]);
  char* block = nullptr;
  if (const cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&block), total, args->stream))
    return fail_launch(args, kLaunchCudaError, "cudaMallocAsync of the %zu-byte group arrays: %s", total,
                       cudaGetErrorString(e));
  auto release = [&](int code) {
    cudaFreeAsync(block, args->stream);
    return code;
  };
  if (const cudaError_t e = cudaMemcpyAsync(block, host.data(), total, cudaMemcpyHostToDevice, args->stream))
    return release(fail_launch(args, kLaunchCudaError, "copying the group arrays: %s", cudaGetErrorString(e)));
  if (const cudaError_t e = cudaStreamSynchronize(args->stream))  // `host` may go once the copy is done
    return release(fail_launch(args, kLaunchCudaError, "copying the group arrays: %s", cudaGetErrorString(e)));

  using T = KernelTypes<Gemm>;
  typename Gemm::Arguments g{};
  g.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  g.problem_shape = {int(groups), reinterpret_cast<typename O::Size*>(block + sizes_at), ops.sizes.data()};
  g.mainloop.ptr_A = reinterpret_cast<const typename T::ElementA**>(block + a_at);
  g.mainloop.dA = reinterpret_cast<typename O::StrideA*>(block + da_at);
  g.mainloop.ptr_B = reinterpret_cast<const typename T::ElementB**>(block + b_at);
  g.mainloop.dB = reinterpret_cast<typename O::StrideB*>(block + db_at);
  g.epilogue.ptr_C = reinterpret_cast<const typename T::ElementC**>(block + c_at);
  g.epilogue.dC = reinterpret_cast<typename O::StrideC*>(block + dc_at);
  g.epilogue.ptr_D = reinterpret_cast<typename T::ElementD**>(block + d_at);
  g.epilogue.dD = reinterpret_cast<typename O::StrideD*>(block + dd_at);
  g.epilogue.thread.alpha = args->alpha;
  g.epilogue.thread.beta = args->beta;
  if (const int bad = fill_hw_info<Gemm>(args, g)) return release(bad);
  if (adjust != nullptr) {
    if (const int code = adjust(args, g)) return release(code);
  }
  return release(run_gemm<Gemm>(args, g));
}

// The host route: the user's make(...) with the groups' sizes, the stacked operands' first elements and
// leading dimensions; its arguments run as returned.
template <class Gemm, class Make>
int launch_grouped_host(const LaunchArgs* args, Make make) {
  static_assert(EntryChecks<Gemm>::ok && HostEntryChecks<Gemm, Make>::ok, "");
  if (const int bad = check_grouped_launch<Gemm>(args)) return bad;
  GroupedOperands<Gemm> ops;
  if (const int bad = ops.fill(args)) return bad;
  const bool with_c = tensor(args, kSlotC).data != nullptr;
  const typename Gemm::Arguments g = make(
      int(ops.group_m.size()), static_cast<const int*>(ops.group_m.data()), int(args->n), int(args->k), ops.a[0],
      leading_dimension(ops.da[0]), ops.b[0], leading_dimension(ops.db[0]), with_c ? ops.c[0] : nullptr,
      leading_dimension(ops.dc[0]), ops.d[0], leading_dimension(ops.dd[0]), args->alpha, args->beta);
  if (g.mode != cutlass::gemm::GemmUniversalMode::kGrouped)
    return fail_launch(args, kLaunchUnsupported,
                       "make_arguments returned GemmUniversalMode::%s for a grouped kernel: a grouped GEMM runs in "
                       "kGrouped", mode_name(g.mode));
  if (g.problem_shape.num_groups != int(args->groups))
    return fail_launch(args, kLaunchUnsupported,
                       "make_arguments returned %d groups where the case has %lld: the oracle judges every group, so "
                       "the group count must be the case's", g.problem_shape.num_groups, (long long)args->groups);
  return run_gemm<Gemm>(args, g);
}

template <class Gemm>
constexpr bool is_grouped_gemm = is_group_problem_shape<typename Gemm::GemmKernel::ProblemShape>;

// The entry macros' routes: a grouped kernel's, or the plain one (cutlass/entry.hpp).
template <class Gemm>
int launch_entry(const LaunchArgs* args, int (*adjust)(const LaunchArgs*, typename Gemm::Arguments&)) {
  if constexpr (is_grouped_gemm<Gemm>) {
    return launch_grouped<Gemm>(args, adjust);
  } else {
    return launch<Gemm>(args, adjust);
  }
}

template <class Gemm, class Make>
int launch_host_entry(const LaunchArgs* args, Make make) {
  if constexpr (is_grouped_gemm<Gemm>) {
    return launch_grouped_host<Gemm>(args, make);
  } else {
    return launch_host<Gemm>(args, make);
  }
}

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_GROUPED_ENTRY_HPP_

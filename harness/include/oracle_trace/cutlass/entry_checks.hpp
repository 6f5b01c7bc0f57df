// oracle_trace/cutlass/entry_checks.hpp -- what the entry macros check on a Gemm's types, at compile time.
//
//   KernelTypes<Gemm>            the kernel's collectives, tile, element types and epilogue operation
//   EntryChecks<Gemm>::ok        what the adapter can run: tile scheduler (StreamKChecks for a traced
//                                stream-K one), (M, N, K, L) problem shape (a grouped GroupProblemShape
//                                refused by name), fusion, element types, strides, shared memory
//                                (cutlass/checks.hpp's traits)
//   CaseChecks<Gemm>::ok         what the case expects of the kernel (tile, element types, majors, bias,
//                                activation, a split of k; a batch > 1 needs a run-time L and batch
//                                strides), where
//                                the oracle passes it as -DORACLE_CASE_* defines (oracle/run/adapters.py
//                                expected_defines); nothing without them
//   AdjustChecks<Gemm, Adjust>   a user's own EVT tree comes with the function that fills its arguments
//   EpilogueOrder<Gemm>::value   the traced tree's order as text (the entry macros keep it in the library)
//   HostEntryChecks<Gemm, Make>  the host route's make_arguments: callable with the launch's values,
//                                returning Gemm::Arguments
//
// The entry macros (cutlass/entry.hpp) instantiate them at namespace scope, before the kernel: a failed
// static_assert there ends the build in the seconds the front end takes to read CUTLASS's headers. A
// check whose message cannot name a value carries it in its template arguments, which nvcc prints with
// the failure ("[with KernelBM=128, ..., CaseBN=64, ...]").

#ifndef ORACLE_TRACE_CUTLASS_ENTRY_CHECKS_HPP_
#define ORACLE_TRACE_CUTLASS_ENTRY_CHECKS_HPP_

#include <stdint.h>

#include <type_traits>
#include <utility>

#include "cute/tensor.hpp"
#include "cutlass/epilogue/fusion/callbacks.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "oracle_trace/cutlass/checks.hpp"
#include "oracle_trace/cutlass/sm90_blockwise.hpp"
#include "oracle_trace/cutlass/sm90_epilogue.hpp"
#include "oracle_trace/cutlass/sm90_grouped.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/launch.hpp"

namespace oracle_trace::cutlass_sm90 {

// The kernel's types, named once for the checks and the routes.
template <class Gemm>
struct KernelTypes {
  using Kernel = typename Gemm::GemmKernel;
  using Mainloop = typename Kernel::CollectiveMainloop;
  using Epilogue = typename Kernel::CollectiveEpilogue;
  using TileShape = typename Mainloop::TileShape;
  using ElementA = typename Mainloop::ElementA;
  using ElementB = typename Mainloop::ElementB;
  using ElementC = typename Epilogue::ElementC;
  using ElementD = typename Epilogue::ElementD;
  using Operation = typename cutlass::epilogue::fusion::FusionCallbacksTraits<typename Epilogue::FusionCallbacks>::Operation;
  static constexpr bool kScaled = is_tensor_scaled<Operation>;
  // A user's own tree (callbacks that are not FusionCallbacks: CUTLASS's traits say FusionOperation):
  // its bias and activation are not known from its type, its arguments are the user's to fill.
  static constexpr bool kUserTree = std::is_same_v<Operation, cutlass::epilogue::fusion::FusionOperation>;
  using Facts = FusionFacts<Operation>;
  // The epilogue's steps in the order its traced tree computes them (none without ORACLE_TRACE).
  using Steps = typename StepsOf<typename Epilogue::FusionCallbacks>::type;
  // CUTLASS's stream-K scheduler (split-K and stream-K), traced or not.
  using Scheduler = typename Kernel::TileScheduler;
  static constexpr bool kStreamK = is_stream_k_scheduler<Scheduler> || is_traced_stream_k_scheduler<Scheduler>;
  // CUTLASS's blockwise-scaled fp8 mainloop (cutlass/sm90_blockwise.hpp): block scales in the mainloop.
  static constexpr bool kBlockScaled = is_blockwise_mainloop<Mainloop>;
};

// The traced stream-K scheduler's conditions (cutlass/sm90_stream_k.hpp); nothing for another scheduler.
template <class Kernel, class Scheduler = typename Kernel::TileScheduler>
struct StreamKChecks {
  static constexpr bool ok = true;
};
template <class Kernel, class Base, class Mainloop, class Mutation>
struct StreamKChecks<Kernel, Sm90TracedStreamK<Base, Mainloop, Mutation>> {
  using Policy = typename Kernel::CollectiveMainloop::DispatchPolicy;
  static_assert(std::is_same_v<Mainloop, typename Kernel::CollectiveMainloop>,
                "ORACLE_CUTLASS_ENTRY: TracedScheduler<cutlass::gemm::StreamKScheduler, Mainloop> must name the "
                "kernel's CollectiveMainloop (the traced one: its accumulator layout places the reduce tap)");
  static_assert(std::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedCooperative, typename Policy::Schedule>,
                "ORACLE_CUTLASS_ENTRY: the stream-K scheduler runs in CUTLASS's cooperative kernel only "
                "(KernelTmaWarpSpecializedCooperative; the ping-pong kernel takes no stream-K scheduler)");
  static_assert(cute::size(typename Policy::ClusterShape{}) == 1,
                "ORACLE_CUTLASS_ENTRY: the traced stream-K scheduler reads each work unit's partial for a cluster of "
                "one CTA: use ClusterShape Shape<_1, _1, _1> with StreamKScheduler");
  static constexpr bool ok = true;
};

// The text the oracle reads from the built library (oracle/run/adapters.py library_epilogue): the
// traced tree's order after OrderText's prefix.
template <class Gemm>
struct EpilogueOrder {
  using Text = OrderText<typename KernelTypes<Gemm>::Steps>;
  static constexpr typename Text::Text value = Text::value;
};

template <class T>
constexpr bool is_passed_type = launch_code<T> != ElementType::None;

// What the adapter can run, on types alone: instantiated by the entry macros at namespace scope.
template <class Gemm>
struct EntryChecks {
  using T = KernelTypes<Gemm>;
  using Kernel = typename T::Kernel;
  // a grouped kernel: GroupedChecks (cutlass/sm90_grouped.hpp) in place of the scheduler's and strides' checks
  static constexpr bool kGrouped = is_group_problem_shape<typename Kernel::ProblemShape>;
  static_assert(ProblemShapeChecks<typename Kernel::ProblemShape>::ok, "");
  struct Skipped {
    static constexpr bool ok = true;
  };
  static_assert(std::conditional_t<kGrouped, GroupedChecks<Gemm>, Skipped>::ok, "");
  static_assert(std::conditional_t<kGrouped, Skipped, SchedulerChecks<typename Kernel::TileScheduler>>::ok, "");
  static_assert(std::conditional_t<kGrouped, Skipped, StreamKChecks<Kernel>>::ok, "");
  static_assert(T::Facts::traced || T::kUserTree,
                "ORACLE_CUTLASS_ENTRY: the epilogue fusion must be one the adapter traces: "
                "cutlass::epilogue::fusion::LinearCombination, LinCombEltAct, LinCombPerRowBias, LinCombPerColBias, "
                "LinCombPerRowBiasEltAct, LinCombPerColBiasEltAct, oracle_trace::cutlass_sm90::"
                "TensorScaledLinearCombination, or the user's own Sm90EVT tree with oracle_trace::cutlass_sm90::Tap "
                "nodes (no row/column/block scales or auxiliary outputs)");
#if defined(ORACLE_TRACE)
  static_assert(kGrouped || T::Steps::size > 0,
                "ORACLE_CUTLASS_ENTRY: the epilogue's tree taps no step: wrap the nodes of your Sm90EVT tree whose "
                "results are steps in oracle_trace::cutlass_sm90::Tap<Stage::Epilogue..., Node> (the last one "
                "Tap<Stage::EpilogueCast, Node, ElementD>)");
  static_assert(kGrouped || OrderText<typename T::Steps>::all_steps,
                "ORACLE_CUTLASS_ENTRY: a Tap or Fused node of the epilogue's tree names a stage that is not an "
                "epilogue step (EpilogueScale, EpilogueAlpha, EpilogueAlphaBeta, EpilogueBetaC, EpilogueBias, "
                "EpilogueActivation, EpilogueCast)");
#endif
  static_assert(is_passed_type<typename T::ElementA> && is_passed_type<typename T::ElementB>,
                "ORACLE_CUTLASS_ENTRY: the kernel's ElementA or ElementB is not an element type the harness passes "
                "(float, cutlass::half_t, bfloat16_t, float_e4m3_t, float_e5m2_t, int8_t, int32_t)");
  static_assert(is_passed_type<typename T::ElementD> &&
                    (is_passed_type<typename T::ElementC> || std::is_void_v<typename T::ElementC>),
                "ORACLE_CUTLASS_ENTRY: the kernel's ElementC or ElementD is not an element type the harness passes "
                "(float, cutlass::half_t, bfloat16_t, float_e4m3_t, float_e5m2_t, int8_t, int32_t; void for C)");
  static_assert(kGrouped || (is_fillable_stride<typename Kernel::StrideA>() && is_fillable_stride<typename Kernel::StrideB>()),
                "ORACLE_CUTLASS_ENTRY: the kernel's StrideA or StrideB is not a row- or column-major one: the adapter "
                "passes strides of three modes (rows, cols, batch), one of the first two cute::Int<1>, the other an "
                "integer (CUTLASS's RowMajor / ColumnMajor layout tags give these)");
  static_assert(BlockwiseChecks<typename T::Mainloop>::ok, "");
  static_assert(kGrouped || (is_fillable_stride<typename Kernel::StrideC>() && is_fillable_stride<typename Kernel::StrideD>()),
                "ORACLE_CUTLASS_ENTRY: the kernel's StrideC or StrideD is not a row- or column-major one (see StrideA)");
  // The traced build's shared memory holds one binding per stage more than CUTLASS's stage count
  // planned for: refuse a kernel that no longer fits (227 KiB per CTA on SM90).
  static_assert(Kernel::SharedStorageSize <= 232448,
                "ORACLE_CUTLASS_ENTRY: the kernel's shared memory exceeds SM90's 227 KiB (a traced mainloop adds a "
                "binding per stage): lower the stage count (StageCount<N>) or the tile");
  static constexpr bool ok = true;
};

// The CUTLASS element type of a LaunchArgs element code: launch_code (types.hpp) read backwards over
// the types it names; void for a code none has.
template <int Code, class... Ts>
struct element_of_code {
  using type = void;
};
template <int Code, class T, class... Ts>
struct element_of_code<Code, T, Ts...> {
  using type = cute::conditional_t<int(launch_code<T>) == Code, T, typename element_of_code<Code, Ts...>::type>;
};
template <int Code>
struct case_element : element_of_code<Code, float, cutlass::half_t, cutlass::bfloat16_t, cutlass::float_e4m3_t,
                                      cutlass::float_e5m2_t, int8_t, int32_t> {};

// What the case expects of the kernel, where the oracle says it (-DORACLE_CASE_*: oracle/run/adapters.py
// expected_defines): its tile, element types and majors, compared on types, so that a case that does
// not fit the kernel stops the build in seconds rather than oracle_launch after the full build. Each
// check's template arguments, which nvcc prints with the failure, are the kernel's then the case's.
struct OperandA {};
struct OperandB {};
struct OperandC {};
struct OperandD {};

template <int KernelBM, int KernelBN, int KernelBK, int CaseBM, int CaseBN, int CaseBK>
struct CaseTileCheck {
  static_assert(KernelBM == CaseBM && KernelBN == CaseBN && KernelBK == CaseBK,
                "ORACLE_CUTLASS_ENTRY: the kernel's CTA tile (TileShape) is not the case's [problem] tile: "
                "CaseTileCheck<the kernel's BM, BN, BK, the case's>");
  static constexpr bool ok = true;
};

template <class Operand, class KernelElement, class CaseElement>
struct CaseElementCheck {
  static_assert(std::is_same_v<KernelElement, CaseElement>,
                "ORACLE_CUTLASS_ENTRY: the kernel's element type of an operand is not the case's *_dtype: "
                "CaseElementCheck<the operand, the kernel's type, the case's>");
  static constexpr bool ok = true;
};

// A stride's mode of unit stride: 0 or 1 (is_fillable_stride holds).
template <class Stride>
constexpr int unit_mode() {
  return cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(Stride{}))>>::value ? 0 : 1;
}

template <class Operand, int KernelUnitMode, int CaseUnitMode>
struct CaseMajorCheck {
  static_assert(KernelUnitMode == CaseUnitMode,
                "ORACLE_CUTLASS_ENTRY: the kernel's layout of an operand is not the case's *_major: CaseMajorCheck<the "
                "operand, the kernel's mode of unit stride, the case's> in CUTLASS's (m, k), (n, k), (m, n) order: 1 is "
                "a row-major A, C or D and a column-major (K-contiguous) B");
  static constexpr bool ok = true;
};

// A batched case (batch > 1) on the kernel: its problem shape's L and every operand's batch stride mode must
// be run-time values (a static L of another value, or a static batch stride, cannot step between the
// entries). KernelL: the static L, 0 where it is an int; KernelBatchStrides: the four batch modes dynamic.
template <int KernelL, bool KernelBatchStrides, int CaseBatch>
struct CaseBatchCheck {
  static_assert(KernelL == 0 || KernelL == CaseBatch,
                "ORACLE_CUTLASS_ENTRY: the kernel's problem shape fixes L at compile time to another value than the "
                "case's [problem] batch: CaseBatchCheck<the kernel's L, ..., the case's batch>; write "
                "GemmUniversal<Shape<int, int, int, int>, ...>");
  static_assert(KernelBatchStrides,
                "ORACLE_CUTLASS_ENTRY: the case is batched ([problem] batch > 1) and a batch mode of the kernel's "
                "StrideA, StrideB, StrideC or StrideD is static (cute::Int): it cannot step from one entry to the "
                "next; CUTLASS's layout tags (cutlass::detail::TagToStrideA_t ...) give an int64_t batch mode");
  static constexpr bool ok = true;
};

template <class Shape>
constexpr int static_l() {
  using L = cute::remove_cvref_t<decltype(cute::get<3>(Shape{}))>;
  if constexpr (cute::is_static<L>::value) {
    return int(L::value);
  } else {
    return 0;
  }
}

template <class Stride>
constexpr bool dynamic_batch_mode() {
  return !cute::is_static<cute::remove_cvref_t<decltype(cute::get<2>(Stride{}))>>::value;
}

// What the epilogue adds, kernel's then case's (launch.hpp's BiasKind: 0 none, 1 row (one per m), 2
// column (one per n); Activation: 0 none, 1 relu, 2 gelu_erf, 3 gelu_tanh, 4 silu).
template <int KernelBias, int CaseBias>
struct CaseBiasCheck {
  static_assert(KernelBias == CaseBias,
                "ORACLE_CUTLASS_ENTRY: the kernel's epilogue bias is not the case's [problem] bias: CaseBiasCheck<the "
                "kernel's, the case's>, 0 none, 1 row (LinCombPerRowBias*: one per m), 2 col (LinCombPerColBias*: one "
                "per n)");
  static constexpr bool ok = true;
};

template <int KernelActivation, int CaseActivation>
struct CaseActivationCheck {
  static_assert(KernelActivation == CaseActivation,
                "ORACLE_CUTLASS_ENTRY: the kernel's epilogue activation is not the case's [problem] activation: "
                "CaseActivationCheck<the kernel's, the case's>, 0 none, 1 relu (ReLu), 2 gelu_erf (GELU), 3 gelu_tanh "
                "(GELU_taylor), 4 silu (SiLu)");
  static constexpr bool ok = true;
};

// Both, where the kernel's fusion says them (not a user's own tree: kKnown false).
template <bool kKnown, int KernelBias, int CaseBias, int KernelActivation, int CaseActivation>
struct CaseFusionCheck {
  static constexpr bool ok =
      CaseBiasCheck<KernelBias, CaseBias>::ok && CaseActivationCheck<KernelActivation, CaseActivation>::ok;
};
template <int KernelBias, int CaseBias, int KernelActivation, int CaseActivation>
struct CaseFusionCheck<false, KernelBias, CaseBias, KernelActivation, CaseActivation> {
  static constexpr bool ok = true;
};

struct OperandBias {};

// A case that splits k (splits > 1 or stream_k_workers: ORACLE_CASE_SPLIT) needs a kernel that does.
template <bool KernelIsStreamK>
struct CaseSplitCheck {
  static_assert(KernelIsStreamK,
                "ORACLE_CUTLASS_ENTRY: the case splits k (splits > 1 or stream_k_workers) but the kernel's tile "
                "scheduler is CUTLASS's persistent one, which never splits a tile: build the kernel with "
                "oracle_trace::cutlass_sm90::TracedScheduler<cutlass::gemm::StreamKScheduler, CollectiveMainloop>, or "
                "drop splits / stream_k_workers from the case");
  static constexpr bool ok = true;
};

// The bias vector's element type, where the fusion has one the adapter fills.
template <class Gemm, bool kNone>
struct BiasElementCheck {
  static constexpr bool ok = true;
};
#if defined(ORACLE_CASE_BIAS_DTYPE)
template <class Gemm>
struct BiasElementCheck<Gemm, false> {
  using ElementBias = cute::remove_cvref_t<decltype(*std::declval<typename Gemm::Arguments&>().epilogue.thread.bias_ptr)>;
  static_assert(CaseElementCheck<OperandBias, ElementBias, typename case_element<ORACLE_CASE_BIAS_DTYPE>::type>::ok, "");
  static constexpr bool ok = true;
};
#endif

// The quick route fills alpha, beta and the bias of the fusions it knows; a user's own tree's
// arguments are the user's: ORACLE_CUTLASS_ENTRY_WITH(Gemm, fill) fills them.
template <class Gemm, class Adjust>
struct AdjustChecks {
  static_assert(!(KernelTypes<Gemm>::kUserTree && std::is_same_v<Adjust, std::nullptr_t>),
                "ORACLE_CUTLASS_ENTRY: the epilogue is your own Sm90EVT tree, whose arguments the adapter cannot "
                "fill: use ORACLE_CUTLASS_ENTRY_WITH(Gemm, fill), fill(const oracle_trace::LaunchArgs*, "
                "Gemm::Arguments&) setting g.epilogue.thread from args (alpha, beta, the bias tensor)");
  static constexpr bool ok = true;
};

// A grouped case (groups: ORACLE_CASE_GROUPS, the group count) needs a grouped kernel, and a grouped kernel a
// grouped case (KernelGrouped, the case's groups; 0: not grouped).
template <bool KernelGrouped, int CaseGroups>
struct CaseGroupsCheck {
  static_assert(KernelGrouped || CaseGroups == 0,
                "ORACLE_CUTLASS_ENTRY: the case is grouped ([problem] groups) but the kernel is not: a grouped case runs "
                "on CUTLASS's grouped GEMM (GroupProblemShape<Shape<int, int, int>>, KernelPtrArrayTmaWarpSpecialized"
                "Cooperative or ...Pingpong, example 57): CaseGroupsCheck<the kernel's, the case's group count>");
  static_assert(!KernelGrouped || CaseGroups > 0,
                "ORACLE_CUTLASS_ENTRY: the kernel is a grouped GEMM (GroupProblemShape) and the case has no groups: "
                "give the case [problem] groups = [M of each group] (their sum is m)");
  static constexpr bool ok = true;
};

#if defined(ORACLE_CASE_GROUPS)
constexpr int kCaseGroups = ORACLE_CASE_GROUPS;
#else
constexpr int kCaseGroups = 0;
#endif

template <class Gemm, bool kGrouped = is_group_problem_shape<typename KernelTypes<Gemm>::Kernel::ProblemShape>>
struct CaseChecks {
#if defined(ORACLE_CASE_TILE_M)
  // a grouped kernel: its tile, element types, majors (of the per-group strides) and the case's groups
  using T = KernelTypes<Gemm>;
  using Kernel = typename T::Kernel;
  using TileShape = typename T::TileShape;
  static_assert(CaseGroupsCheck<kGrouped, kCaseGroups>::ok, "");  // kGrouped: dependent, checked at instantiation
  static_assert(CaseTileCheck<int(cute::size<0>(TileShape{})), int(cute::size<1>(TileShape{})),
                              int(cute::size<2>(TileShape{})), ORACLE_CASE_TILE_M, ORACLE_CASE_TILE_N,
                              ORACLE_CASE_TILE_K>::ok, "");
  static_assert(CaseElementCheck<OperandA, typename T::ElementA, typename case_element<ORACLE_CASE_A>::type>::ok, "");
  static_assert(CaseElementCheck<OperandB, typename T::ElementB, typename case_element<ORACLE_CASE_B>::type>::ok, "");
  static_assert(CaseElementCheck<OperandD, typename T::ElementD, typename case_element<ORACLE_CASE_D>::type>::ok, "");
  static_assert(CaseMajorCheck<OperandA, unit_mode<cute::remove_pointer_t<typename Kernel::StrideA>>(),
                               ORACLE_CASE_A_UNIT_MODE>::ok, "");
  static_assert(CaseMajorCheck<OperandB, unit_mode<cute::remove_pointer_t<typename Kernel::StrideB>>(),
                               ORACLE_CASE_B_UNIT_MODE>::ok, "");
  static_assert(CaseMajorCheck<OperandD, unit_mode<cute::remove_pointer_t<typename Kernel::StrideD>>(),
                               ORACLE_CASE_D_UNIT_MODE>::ok, "");
#endif
  static constexpr bool ok = true;
};

template <class Gemm>
struct CaseChecks<Gemm, false> {
#if defined(ORACLE_CASE_GROUPS)
  static_assert(CaseGroupsCheck<is_group_problem_shape<typename KernelTypes<Gemm>::Kernel::ProblemShape>,
                                ORACLE_CASE_GROUPS>::ok, "");
#endif
#if defined(ORACLE_CASE_TILE_M)
  using T = KernelTypes<Gemm>;
  using Kernel = typename T::Kernel;
  using TileShape = typename T::TileShape;
  static_assert(CaseTileCheck<int(cute::size<0>(TileShape{})), int(cute::size<1>(TileShape{})),
                              int(cute::size<2>(TileShape{})), ORACLE_CASE_TILE_M, ORACLE_CASE_TILE_N,
                              ORACLE_CASE_TILE_K>::ok, "");
  static_assert(CaseElementCheck<OperandA, typename T::ElementA, typename case_element<ORACLE_CASE_A>::type>::ok, "");
  static_assert(CaseElementCheck<OperandB, typename T::ElementB, typename case_element<ORACLE_CASE_B>::type>::ok, "");
  static_assert(CaseElementCheck<OperandD, typename T::ElementD, typename case_element<ORACLE_CASE_D>::type>::ok, "");
  static_assert(CaseMajorCheck<OperandA, unit_mode<typename Kernel::StrideA>(), ORACLE_CASE_A_UNIT_MODE>::ok, "");
  static_assert(CaseMajorCheck<OperandB, unit_mode<typename Kernel::StrideB>(), ORACLE_CASE_B_UNIT_MODE>::ok, "");
  static_assert(CaseMajorCheck<OperandD, unit_mode<typename Kernel::StrideD>(), ORACLE_CASE_D_UNIT_MODE>::ok, "");
#if defined(ORACLE_CASE_BIAS)
  static_assert(CaseFusionCheck<!T::kUserTree, T::Facts::bias, ORACLE_CASE_BIAS, T::Facts::activation,
                                ORACLE_CASE_ACTIVATION>::ok, "");
#endif
#if defined(ORACLE_CASE_BIAS_DTYPE)
  static_assert(BiasElementCheck<Gemm, T::kUserTree || T::Facts::bias == int(BiasKind::None)>::ok, "");
#endif
#if defined(ORACLE_CASE_BATCH)
  static_assert(CaseBatchCheck<static_l<typename Kernel::ProblemShape>(),
                               dynamic_batch_mode<typename Kernel::StrideA>() &&
                                   dynamic_batch_mode<typename Kernel::StrideB>() &&
                                   dynamic_batch_mode<typename Kernel::StrideC>() &&
                                   dynamic_batch_mode<typename Kernel::StrideD>(),
                               ORACLE_CASE_BATCH>::ok, "");
#endif
#if defined(ORACLE_CASE_SPLIT)
  static_assert(CaseSplitCheck<T::kStreamK>::ok, "");
#endif
#if defined(ORACLE_CASE_C)
  static_assert(CaseElementCheck<OperandC, typename T::ElementC, typename case_element<ORACLE_CASE_C>::type>::ok, "");
  static_assert(CaseMajorCheck<OperandC, unit_mode<typename Kernel::StrideC>(), ORACLE_CASE_C_UNIT_MODE>::ok, "");
#endif
#endif
  static constexpr bool ok = true;
};

// The host route's function: callable with the launch's values, returning Gemm::Arguments.
template <class Gemm, class Make>
struct HostEntryChecks {
  using T = KernelTypes<Gemm>;
  static_assert(!T::kScaled && !T::kUserTree && T::Facts::bias == int(BiasKind::None),
                "ORACLE_CUTLASS_HOST_ENTRY: the host route takes a LinearCombination or LinCombEltAct epilogue "
                "(make_arguments receives no bias or scale pointers); a kernel with a bias, "
                "TensorScaledLinearCombination or its own Sm90EVT tree uses ORACLE_CUTLASS_ENTRY_WITH");
  static_assert(!T::kBlockScaled,
                "ORACLE_CUTLASS_HOST_ENTRY: the kernel's mainloop is CUTLASS's blockwise-scaled fp8 one, and "
                "make_arguments receives no scale pointers or layouts: use ORACLE_CUTLASS_ENTRY (the adapter fills "
                "ptr_SFA, layout_SFA, ptr_SFB, layout_SFB from the case's block scales)");
  static constexpr bool kGrouped = is_group_problem_shape<typename T::Kernel::ProblemShape>;
  static_assert(kGrouped || std::is_invocable_r_v<typename Gemm::Arguments, Make, int, int, int, int, const typename T::ElementA*,
                                      int64_t, const typename T::ElementB*, int64_t, const typename T::ElementC*,
                                      int64_t, typename T::ElementD*, int64_t, float, float>,
                "ORACLE_CUTLASS_HOST_ENTRY(Gemm, make): make must be callable as make(int m, int n, int k, int l, "
                "const ElementA* a, int64_t lda, const ElementB* b, int64_t ldb, const ElementC* c, int64_t ldc, "
                "ElementD* d, int64_t ldd, float alpha, float beta) and return typename Gemm::Arguments");
  static_assert(!kGrouped || std::is_invocable_r_v<typename Gemm::Arguments, Make, int, const int*, int, int,
                                                   const typename T::ElementA*, int64_t, const typename T::ElementB*,
                                                   int64_t, const typename T::ElementC*, int64_t, typename T::ElementD*,
                                                   int64_t, float, float>,
                "ORACLE_CUTLASS_HOST_ENTRY(Gemm, make) of a grouped GEMM: make must be callable as make(int groups, "
                "const int* group_m (host: M of each group), int n, int k, const ElementA* a, int64_t lda, const "
                "ElementB* b, int64_t ldb, const ElementC* c, int64_t ldc, ElementD* d, int64_t ldd, float alpha, float "
                "beta) and return typename Gemm::Arguments (a: every group's rows one after the other; b: [groups] "
                "matrices of K x N, each ldb * (N or K) elements after the last)");
  static constexpr bool ok = true;
};

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_ENTRY_CHECKS_HPP_

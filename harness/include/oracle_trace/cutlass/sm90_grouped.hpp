// oracle_trace/cutlass/sm90_grouped.hpp -- CUTLASS's grouped (pointer-array) SM90 GEMM, traced.
//
// A grouped GEMM (CUTLASS's examples 56 and 57, the MoE layout: GemmUniversal<GroupProblemShape<Shape<int,
// int, int>>, ...> built with KernelPtrArrayTmaWarpSpecialized{Cooperative,Pingpong} and PtrArrayTmaWarp
// Specialized{Cooperative,Pingpong}, arrays of per-group pointers and strides, per-group problem sizes in
// device memory) comes through the same two aliases as a plain one:
//
//   using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop>;  // -> Sm90TracedArrayMainloop
//   using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<BuiltEpilogue>;  // -> the traced tree below
//
// Data path: CUTLASS's grouped kernel hands the mainloop's producer each tile of group g as (m, n) within
// the group with l = 0, and tells the collective the group only through tensors_perform_update(..., g)
// before the group's first tile: Sm90TracedArrayMainloop keeps that g, its producer (CUTLASS's array load:
// the TMA through the group's tensormap) writes (tile_m, tile_n, k_block, g, -1) into the stage's binding,
// and the consumer is the plain traced one (cutlass/sm90_mainloop.hpp), so descriptor_a/b, load_a/b and
// mma name the group, the tile within it and the k-block. The epilogue's tree is CUTLASS's pointer-array
// LinearCombination (alpha and beta scalars, or per-group arrays: alpha_ptr_array, dAlpha) with the cast
// split out and GroupTapNode taps, which name the group the epilogue is given (its tile coordinate's l) as
// the plain tree's taps name a batch entry. Each group is then judged as its own GEMM: group g covers
// rows [offset_g, offset_g + M_g) of A, C and D and reads B[g] (oracle/problem/partition.py).
//
// Ping-pong (CUTLASS 4.2's sm90_gemm_array_tma_warpspecialized_pingpong.hpp): the two consumer warp groups
// take a CTA's tiles in turn, each a whole tile (TiledMma of 128 threads), so one may be in group g's
// epilogue while the other runs group h's mainloop. Nothing the traced collectives read is per warp group:
// the one producer warp loads the tiles in the order the warp groups take them, calling
// tensors_perform_update between two groups, so each stage's binding names the group of the tile it was
// loaded for, whichever warp group consumes it; each warp group's epilogue is given its own tile's
// coordinate (l: its group) and problem shape, and stores through its own tensormap. The kernel's ordered
// barriers keep the warp groups' mainloops apart; the serialised traced mainloop changes no order.
//
// Constraints: the epilogue is CUTLASS's LinearCombination (no bias, activation, scales or user tree:
// GroupedChecks). Every group's N and K are the case's (the oracle's grouped problems vary M only); a kernel
// given another size for a group (the host route runs what the user's code returns) computes what it
// computes, and that is judged.

#ifndef ORACLE_TRACE_CUTLASS_SM90_GROUPED_HPP_
#define ORACLE_TRACE_CUTLASS_SM90_GROUPED_HPP_

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "oracle_trace/cutlass/checks.hpp"
#include "oracle_trace/cutlass/sm90_epilogue.hpp"
#include "oracle_trace/cutlass/sm90_mainloop.hpp"
#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/trace.cuh"

namespace oracle_trace::cutlass_sm90 {

// ---- The mainloop: CUTLASS's array producer with the binding written, the plain traced consumer ----

template <class Base, class Mutation>
struct Sm90TracedArrayMainloop : Sm90TracedMainloop<Base, Mutation> {
  using Traced = Sm90TracedMainloop<Base, Mutation>;
  using typename Traced::DispatchPolicy;
  using typename Traced::MainloopPipeline;
  using typename Traced::Params;
  using typename Traced::PipelineState;
  using typename Traced::SmemLayoutA;
  using typename Traced::SmemLayoutB;
  using typename Traced::TensorStorage;
  static_assert(is_array_policy<DispatchPolicy>, "Sm90TracedArrayMainloop takes CUTLASS's pointer-array collective");

  int32_t group_ = 0;  // the group the kernel last told the collective (tensors_perform_update)

  // CUTLASS's grouped kernel calls this before the first tile of every group the producer loads.
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& input_tensors, Params const& params,
                                                     ProblemShape_MNKL problem_shape_mnkl, int32_t next_batch) {
    group_ = next_batch;
    return Base::tensors_perform_update(input_tensors, params, problem_shape_mnkl, next_batch);
  }

  // CUTLASS's array producer (the TMA through the group's tensormap), the stage's binding written before
  // the arrive that releases it, as the plain traced producer does.
  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage& storage) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BM, BK, stage)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BN, BK, stage)
    constexpr uint32_t cluster_x = size<0>(typename DispatchPolicy::ClusterShape{});
    const uint32_t cta_x = block_rank_in_cluster % cluster_x, cta_y = block_rank_in_cluster / cluster_x;
    auto tma_a = params.tma_load_a.get_slice(cta_y);
    auto tma_b = params.tma_load_b.get_slice(cta_x);
    auto [m, n, k_unused, l] = blk_coord;  // (m, n) within the group; l = 0 (the group is group_)
    Tensor tAgA = tma_a.partition_S(get<0>(load_inputs)(_, _, m, _, l));
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(get<1>(load_inputs)(_, _, n, _, l));
    Tensor tBsB = tma_b.partition_D(sB);
    const auto [mask_a, mask_b] = multicast_masks<typename DispatchPolicy::ClusterShape, typename Base::GmemTiledCopyA,
                                                  typename Base::GmemTiledCopyB>(cta_x, cta_y);

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write) {
      auto token = pipeline.producer_try_acquire(write);
      while (token != cutlass::BarrierStatus::WaitDone) token = pipeline.producer_try_acquire(write);
      const int stage = write.index();
      int32_t* b = storage.binding[stage];
      b[0] = int32_t(m);
      b[1] = int32_t(n);
      b[2] = int32_t(*k_tile_iter);
      b[3] = group_;
      b[4] = kNone;
      __threadfence_block();
      pipeline.producer_acquire(write, token);
      auto* barrier = pipeline.producer_get_barrier(write);
      copy(params.tma_load_a.with(get<0>(tensormaps), *barrier, mask_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(get<1>(tensormaps), *barrier, mask_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
    }
  }
};

// ---- The epilogue: taps that name the group ----

// TapNode whose records name the tile coordinate's l as their group whatever L is: a grouped kernel hands
// its epilogue each group's (M, N, K, 1) and the group as l.
template <Stage S, class T>
struct GroupTapNode : TapNode<S, T> {
  using TapNode<S, T>::TapNode;

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    const int bm = int(cute::size<0>(args.tile_shape_mnk)), bn = int(cute::size<1>(args.tile_shape_mnk));
    const int row0 = int(M) - int(cute::get<0>(args.residue_tCcD)) - int(m) * bm;
    const int col0 = int(N) - int(cute::get<1>(args.residue_tCcD)) - int(n) * bn;
    using Callbacks = typename TapNode<S, T>::template ConsumerStoreCallbacks<decltype(args.tCcD)>;
    return Callbacks(args.tCcD, row0, col0, int(m), int(n), int(l), bm, bn, this->params.off);
  }
};

template <Stage S, class T>
struct StepsOf<GroupTapNode<S, T>> {
  using type = Steps<S>;
};

// CUTLASS's pointer-array LinearCombination (beta * C + alpha * acc, alpha and beta scalars or per-group
// arrays) in Compute, the convert to Out split out, both tapped.
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
using TracedGroupedLinearCombinationTree = cutlass::epilogue::fusion::Sm90EVT<
    GroupTapNode<Stage::EpilogueCast, Out>,
    cutlass::epilogue::fusion::Sm90EVT<
        cutlass::epilogue::fusion::Sm90Compute<Pass, Out, Compute, Round>,
        cutlass::epilogue::fusion::Sm90EVT<
            GroupTapNode<Stage::EpilogueAlphaBeta, Compute>,
            cutlass::epilogue::fusion::Sm90LinearCombinationPtrArray<Compute, Compute, Source, Scalar, Round>>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, int WarpGroups,
          class ElementOutput, class ElementCompute, class ElementSource, class ElementScalar,
          cutlass::FloatRoundStyle RoundStyle, class CtaTile, class EpilogueTile>
struct TracedFusion<
    cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore,
                                                      WarpGroups>,
    cutlass::epilogue::fusion::LinearCombination<ElementOutput, ElementCompute, ElementSource, ElementScalar,
                                                 RoundStyle>,
    CtaTile, EpilogueTile>
    : TracedGroupedLinearCombinationTree<typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type,
                                         ElementCompute, ElementSource, ElementScalar, RoundStyle> {
  using Impl = TracedGroupedLinearCombinationTree<typename cutlass::detail::get_unpacked_element_type<ElementOutput>::type,
                                                  ElementCompute, ElementSource, ElementScalar, RoundStyle>;
  using Policy = cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC,
                                                                   DelayTmaStore, WarpGroups>;
  using Operation = cutlass::epilogue::fusion::LinearCombination<ElementOutput, ElementCompute, ElementSource,
                                                                 ElementScalar, RoundStyle>;
  // CUTLASS's own callbacks for the same combination producing ElementCompute: the FMA subtree.
  using Fma = cutlass::epilogue::fusion::FusionCallbacks<
      Policy, cutlass::epilogue::fusion::LinearCombination<ElementCompute, ElementCompute, ElementSource, ElementScalar,
                                                           RoundStyle>,
      CtaTile, EpilogueTile>;
  static_assert(cute::is_same_v<typename Fma::Impl,
                                cutlass::epilogue::fusion::Sm90LinearCombinationPtrArray<
                                    ElementCompute, ElementCompute, ElementSource, ElementScalar, RoundStyle>>,
                "the FMA subtree is CUTLASS's pointer-array LinearCombination tree");
  // CUTLASS's arguments (alpha, beta, their pointers and per-group arrays, dAlpha, dBeta) for the FMA subtree.
  struct Arguments : Fma::Arguments {
    operator typename Impl::Arguments() const {
      typename Impl::Arguments a{};
      a.op_0.op_0.op_0 = static_cast<typename Fma::Impl::Arguments>(static_cast<typename Fma::Arguments const&>(*this));
      return a;
    }
  };

  using Impl::Impl;
};

// ---- What a grouped kernel must be, on types (EntryChecks instantiates it for a grouped problem shape) ----

template <class Schedule>
constexpr bool is_ptr_array_cooperative = std::is_base_of_v<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative, Schedule>;
template <class Schedule>
constexpr bool is_ptr_array_pingpong = std::is_base_of_v<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong, Schedule>;

template <class Operation>
constexpr bool is_linear_combination = false;
template <class Out, class Compute, class Source, class Scalar, cutlass::FloatRoundStyle Round>
constexpr bool is_linear_combination<cutlass::epilogue::fusion::LinearCombination<Out, Compute, Source, Scalar, Round>> =
    true;

template <class Gemm>
struct GroupedChecks {
  using Kernel = typename Gemm::GemmKernel;
  using Mainloop = typename Kernel::CollectiveMainloop;
  using Schedule = typename Mainloop::DispatchPolicy::Schedule;
  using Operation = typename cutlass::epilogue::fusion::FusionCallbacksTraits<
      typename Kernel::CollectiveEpilogue::FusionCallbacks>::Operation;
  static_assert(is_ptr_array_pingpong<Schedule> || is_ptr_array_cooperative<Schedule>,
                "ORACLE_CUTLASS_ENTRY: a grouped problem shape (GroupProblemShape) with a mainloop that is not "
                "CUTLASS's pointer-array one (KernelPtrArrayTmaWarpSpecializedCooperative or "
                "KernelPtrArrayTmaWarpSpecializedPingpong)");
  static_assert(is_linear_combination<Operation>,
                "ORACLE_CUTLASS_ENTRY: a grouped kernel's epilogue fusion must be CUTLASS's LinearCombination (alpha, "
                "beta, C; per-group alpha and beta arrays allowed): the adapter traces no bias, activation, scales or "
                "user tree in the pointer-array epilogue");
  static_assert(is_fillable_stride<cute::remove_pointer_t<typename Kernel::StrideA>>() &&
                    is_fillable_stride<cute::remove_pointer_t<typename Kernel::StrideB>>() &&
                    is_fillable_stride<cute::remove_pointer_t<typename Kernel::StrideC>>() &&
                    is_fillable_stride<cute::remove_pointer_t<typename Kernel::StrideD>>(),
                "ORACLE_CUTLASS_ENTRY: a grouped kernel's per-group strides must be row- or column-major ones "
                "(CUTLASS's layout tags written LayoutA *, as in example 57)");
  static constexpr bool ok = true;
};

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_SM90_GROUPED_HPP_

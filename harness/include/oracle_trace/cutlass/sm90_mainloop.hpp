// oracle_trace/cutlass/sm90_mainloop.hpp -- CUTLASS's SM90 TMA warp-specialized mainloop, traced.
//
//   using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop>;
//
// BuiltMainloop is what CUTLASS's CollectiveBuilder gives for KernelTmaWarpSpecialized{,Cooperative,
// Pingpong} (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized<...>, ...>). Without ORACLE_TRACE the
// alias IS BuiltMainloop: the production kernel is CUTLASS's own, instruction for instruction.
// With ORACLE_TRACE it is Sm90TracedMainloop<BuiltMainloop>, derived from it, which replaces the
// producer's load(), the consumer's mma() and mma_tail() (everything else is inherited):
//
// Data path, per k-block:
//   producer: waits for a free stage, writes (tile_m, tile_n, k_block, group, partial) into the
//     stage's binding in shared memory (partial: the work unit's partial of a split tile, from the
//     traced stream-K scheduler's k-block count, cutlass/sm90_stream_k.hpp; -1 otherwise), then arrives on the stage's full barrier and issues the TMA
//     loads (the arrive releases the binding to whoever waits on that barrier);
//   consumer: waits for the stage, reads the binding (so every tap names its output tile and
//     k-block, also in persistent and ping-pong schedules where the consumer never learns its tile),
//     taps the stage's raw images (descriptor_a/b; only when an image starts on a 1024-byte
//     swizzle boundary) and logical tiles (load_a [BM, BK], load_b [BK, BN], read through CuTe's
//     swizzled tensors), issues the k-block's WGMMAs, waits for them, taps the accumulator (mma), then
//     releases the stage. Every tap of a split tile's stage carries the unit's partial.
//
// Constraints: the traced build is serialised: each k-block's WGMMAs are waited for before the next
// are issued (CUTLASS keeps one batch in flight), so its timing is not the production kernel's;
// the report declares it. Clusters of one CTA or more both work (the binding is per CTA). Supported:
// the non-FP8 TMA warp-specialized collective (static_assert otherwise); FP8's promotion mainloop is
// another collective (use the FP8FastAccum schedules, whose mainloop is this one); the blockwise-scaled
// fp8 collective is traced by cutlass/sm90_blockwise.hpp (TracedMainloop picks it); the pointer-array
// collective of a grouped GEMM (MainloopSm90ArrayTmaGmmaWarpSpecialized) gets Sm90TracedArrayMainloop
// (cutlass/sm90_grouped.hpp: its own producer, this consumer; the binding's group is the group). A batched
// GEMM (L > 1): the binding's group is the batch entry l, so every tap names its entry. `Mutation` plants a
// defect for the bug zoo: issues(k_block), or issues(k_block, group) for one batch entry's (group -1 when
// L = 1), how often the k-block's MMAs are issued (NoMutation: once);
// optionally load_a_element(k_block), the linear index (row * BK + col) of the A element of the
// k-block's stage that is overwritten with 64 after the descriptor taps and before the load taps and
// the MMAs (-1: none), between two named barriers of the consumer group (CUTLASS user barrier id 0;
// ping-pong: 0 and 1, one per consumer warp group).

#ifndef ORACLE_TRACE_CUTLASS_SM90_MAINLOOP_HPP_
#define ORACLE_TRACE_CUTLASS_SM90_MAINLOOP_HPP_

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "oracle_trace/cutlass/checks.hpp"
#include "oracle_trace/cutlass/sm90_stream_k.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/trace.cuh"

namespace oracle_trace::cutlass_sm90 {

// Every k-block's MMAs issued once (a correct kernel).
struct NoMutation {
  CUTLASS_DEVICE static constexpr int issues(int /*k_block*/) { return 1; }
};

// Does the mutation overwrite an element of A's stage (load_a_element)?
template <class M, class = void>
struct corrupts_load : cute::false_type {};
template <class M>
struct corrupts_load<M, cute::void_t<decltype(M::load_a_element(0))>> : cute::true_type {};

// How often k-block `k_block` of batch entry `group` (-1: not batched) is issued: the mutation's
// issues(k_block, group) where it has one (a defect planted in one batch entry), else issues(k_block).
template <class M, class = void>
struct issues_per_group : cute::false_type {};
template <class M>
struct issues_per_group<M, cute::void_t<decltype(M::issues(0, 0))>> : cute::true_type {};

template <class M>
CUTLASS_DEVICE constexpr int issue_count(int k_block, int group) {
  if constexpr (issues_per_group<M>::value) {
    return M::issues(k_block, group);
  } else {
    return M::issues(k_block);
  }
}

template <class Policy>
constexpr bool is_array_policy = false;
template <int Stages, class Cluster, class Schedule>
constexpr bool is_array_policy<cutlass::gemm::MainloopSm90ArrayTmaGmmaWarpSpecialized<Stages, Cluster, Schedule>> = true;

template <class Policy>
constexpr bool is_tma_ws_policy = false;
template <int Stages, class Cluster, class Schedule>
constexpr bool is_tma_ws_policy<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<Stages, Cluster, Schedule>> = true;

// ---- What every traced mainloop computes alike (the plain, blockwise-scaled and pointer-array ones) ----

// Element offset of logical (row, col) of `stage` in a CuTe shared-memory layout of (rows, cols, stages),
// from the operand's base, through CuTe's swizzled tensor (the swizzle acts on the address: `base` as the
// kernel has it).
template <class SmemLayout, class T>
CUTE_HOST_DEVICE int smem_offset(const T* base, int row, int col, int stage) {
  auto s = cute::make_tensor(cute::make_smem_ptr(base), SmemLayout{});
  return int(cute::raw_pointer_cast(&s(row, col, stage)) - base);
}

// (row, col) in the tile of each accumulator element of consumer thread `group_thread`.
template <class TiledMma, class TileShape>
CUTE_HOST_DEVICE auto tile_accumulator_coords(int group_thread) {
  return TiledMma{}.get_thread_slice(group_thread).partition_C(
      cute::make_identity_tensor(cute::select<0, 1>(TileShape{})));
}

// The TMA multicast masks of the producer of CTA (cta_x, cta_y) in its cluster: A goes to the cluster's
// CTAs of one row, B to those of one column (0 where the copy is not a multicast).
struct MulticastMasks {
  uint16_t a = 0, b = 0;
};
template <class ClusterShape, class GmemTiledCopyA, class GmemTiledCopyB>
CUTE_HOST_DEVICE MulticastMasks multicast_masks(uint32_t cta_x, uint32_t cta_y) {
  using namespace cute;
  MulticastMasks m;
  auto cluster = Layout<ClusterShape>{};
  if constexpr (is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>)
    for (int j = 0; j < size<1>(cluster); ++j) m.a |= uint16_t(1) << cluster(cta_x, j, Int<0>{});
  if constexpr (is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>)
    for (int i = 0; i < size<0>(cluster); ++i) m.b |= uint16_t(1) << cluster(i, cta_y, Int<0>{});
  return m;
}

template <class Base, class Mutation = NoMutation>
struct Sm90TracedMainloop : Base {
  // the pointer-array collective comes through Sm90TracedArrayMainloop (cutlass/sm90_grouped.hpp), whose
  // producer is its own and whose consumer is this one
  static_assert(is_array_policy<typename Base::DispatchPolicy> || is_tma_ws_policy<typename Base::DispatchPolicy>,
                "Sm90TracedMainloop traces CUTLASS's MainloopSm90TmaGmmaWarpSpecialized collective only (fp8: "
                "the FP8FastAccum schedules; the promoting MainloopSm90TmaGmmaWarpSpecializedFP8 is not traced)");

  using typename Base::DispatchPolicy;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TileShape;
  using typename Base::TiledMma;
  static constexpr int Stages = DispatchPolicy::Stages;
  static constexpr int kBM = cute::size<0>(TileShape{});
  static constexpr int kBN = cute::size<1>(TileShape{});
  static constexpr int kBK = cute::size<2>(TileShape{});
  using ValueA = trace_value_t<typename TiledMma::ValTypeA>;
  using ValueB = trace_value_t<typename TiledMma::ValTypeB>;
  static constexpr DType kDTypeA = dtype_of<ValueA>::value;
  static constexpr DType kDTypeB = dtype_of<ValueB>::value;

  // The base's operand stages plus one binding per stage: {tile_m, tile_n, k_block, group, partial}.
  struct TensorStorage : Base::TensorStorage {
    alignas(16) int32_t binding[Stages][5];
  };

  // Element offset of logical A (row, k) / B (k, n) of `stage` from the operand's base (smem_offset).
  template <class T>
  CUTE_HOST_DEVICE static int offset_a(const T* base, int r, int c, int stage) {
    return smem_offset<SmemLayoutA>(base, r, c, stage);
  }
  template <class T>
  CUTE_HOST_DEVICE static int offset_b(const T* base, int r, int c, int stage) {
    return smem_offset<SmemLayoutB>(base, c, r, stage);
  }
  CUTE_HOST_DEVICE static auto accumulator_coords(int group_thread) {
    return tile_accumulator_coords<TiledMma, TileShape>(group_thread);
  }

  // KTiles: the work unit's k-block count, an integer or (the traced stream-K scheduler's UnitKTiles)
  // with the unit's partial of its tile.
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord, class KTiles>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB> const& load_inputs, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, KTiles k_tiles, int /*thread_idx*/,
                           uint32_t block_rank_in_cluster, TensorStorage& storage) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BM, BK, stage)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BN, BK, stage)
    constexpr uint32_t cluster_x = size<0>(typename DispatchPolicy::ClusterShape{});
    const uint32_t cta_x = block_rank_in_cluster % cluster_x, cta_y = block_rank_in_cluster / cluster_x;
    auto tma_a = params.tma_load_a.get_slice(cta_y);
    auto tma_b = params.tma_load_b.get_slice(cta_x);
    auto [m, n, k_unused, l] = blk_coord;
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);
    Tensor tAgA = tma_a.partition_S(gA_mkl(_, _, m, _, l));
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgB = tma_b.partition_S(gB_nkl(_, _, n, _, l));
    Tensor tBsB = tma_b.partition_D(sB);
    const auto [mask_a, mask_b] = multicast_masks<typename DispatchPolicy::ClusterShape, typename Base::GmemTiledCopyA,
                                                  typename Base::GmemTiledCopyB>(cta_x, cta_y);
    const int32_t group = size<4>(gA_mkl) > 1 ? int32_t(l) : int32_t(kNone);
    const int32_t partial = partial_of(k_tiles);
    int k_tile_count = count_of(k_tiles);

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write) {
      auto token = pipeline.producer_try_acquire(write);
      while (token != cutlass::BarrierStatus::WaitDone) token = pipeline.producer_try_acquire(write);
      const int stage = write.index();
      // the stage is free: nobody reads its binding until the arrive below completes its phase
      int32_t* b = storage.binding[stage];
      b[0] = int32_t(m);
      b[1] = int32_t(n);
      b[2] = int32_t(*k_tile_iter);
      b[3] = group;
      b[4] = partial;
      __threadfence_block();
      pipeline.producer_acquire(write, token);  // arrive and expect the stage's bytes
      auto* barrier = pipeline.producer_get_barrier(write);
      copy(params.tma_load_a.with(*barrier, mask_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(*barrier, mask_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
    }
  }

  template <class FrgTensorC, class KTiles>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, KTiles k_tiles,
                          int thread_idx, TensorStorage& storage, Params const& /*params*/) {
    using namespace cute;
    using Tr = Tracer<true>;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator lives in registers");
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BM, BK, stage)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BN, BK, stage)
    constexpr int kThreads = size(TiledMma{});  // the consumer threads of one tile
    const int group_thread = thread_idx % kThreads;
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(__shfl_sync(0xFFFFFFFF, group_thread / cutlass::NumThreadsPerWarpGroup, 0) *
                                      cutlass::NumThreadsPerWarpGroup);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, stage)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, stage)
    Tensor tCcC = accumulator_coords(group_thread);
    static_assert(decltype(size(tCcC))::value == decltype(size(accum))::value, "accumulator coordinates");
    const auto* base_a = reinterpret_cast<const ValueA*>(storage.smem_A.data());
    const auto* base_b = reinterpret_cast<const ValueB*>(storage.smem_B.data());

    bool first = true;
    int k_tile_count = count_of(k_tiles);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++read) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int stage = read.index();
      const int32_t* b = storage.binding[stage];
      const Site site{b[0], b[1], b[2], stage, b[4], b[3]};  // partial: the producer's unit's
      if constexpr (Tr::enabled) {
        // the raw images, read through the swizzle from their start: only when that start is where
        // the swizzle pattern starts (1024 bytes), else the stages stay unobserved
        const ValueA* image_a = base_a + stage * kBM * kBK;
        const ValueB* image_b = base_b + stage * kBN * kBK;
        if ((reinterpret_cast<uintptr_t>(image_a) & 1023u) == 0)
          Tr::tap_smem_bytes(Stage::DescriptorA, site, image_a, kBM * kBK * sizeof(ValueA), kDTypeA, kBM, kBK,
                             group_thread, kThreads);
        if ((reinterpret_cast<uintptr_t>(image_b) & 1023u) == 0)
          Tr::tap_smem_bytes(Stage::DescriptorB, site, image_b, kBN * kBK * sizeof(ValueB), kDTypeB, kBK, kBN,
                             group_thread, kThreads);
      }
      if constexpr (corrupts_load<Mutation>::value) {
        const int bad = Mutation::load_a_element(site.k_block);
        if (bad >= 0) {  // the same for every thread of the group: the binding is
          const uint32_t group = uint32_t(cutlass::canonical_warp_group_idx() - 1) / uint32_t(kThreads / 128);
          cutlass::arch::NamedBarrier::sync(kThreads, group);  // every descriptor tap has read the stage
          if (group_thread == 0) {
            storage.smem_A.data()[offset_a(storage.smem_A.data(), bad / kBK, bad % kBK, stage)] =
                typename TiledMma::ValTypeA(64.0f);
            cutlass::arch::fence_view_async_shared();  // seen by the WGMMAs (the async proxy)
          }
          cutlass::arch::NamedBarrier::sync(kThreads, group);
        }
      }
      if constexpr (Tr::enabled) {
        Tr::tap_smem_tile(Stage::LoadA, site, base_a, kBM, kBK,
                          [&](int r, int c) { return offset_a(storage.smem_A.data(), r, c, stage); }, group_thread,
                          kThreads);
        Tr::tap_smem_tile(Stage::LoadB, site, base_b, kBK, kBN,
                          [&](int r, int c) { return offset_b(storage.smem_B.data(), r, c, stage); }, group_thread,
                          kThreads);
      }
      const int reps = issue_count<Mutation>(site.k_block, site.group);
      for (int rep = 0; rep < reps; ++rep) {
        warpgroup_fence_operand(accum);
        warpgroup_arrive();
        CUTLASS_PRAGMA_UNROLL
        for (int kb = 0; kb < size<2>(tCrA); ++kb) {  // the first MMA of a tile overwrites the accumulator
          tiled_mma.accumulate_ = first ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
          gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), accum);
          first = false;
        }
        warpgroup_commit_batch();
        warpgroup_wait<0>();  // serialised: the accumulator is this k-block's
        warpgroup_fence_operand(accum);
      }
      if constexpr (Tr::enabled) {
        Tr::tap_elements(Stage::Mma, Site{site.tile_m, site.tile_n, site.k_block, kNone, site.partial, site.group}, kBM, kBN,
                         int(size(accum)), [&](int i) {
                           return Element<float>{int(get<0>(tCcC(i))), int(get<1>(tCcC(i))), float(accum(i))};
                         });
      }
      pipeline.consumer_release(read);  // after every tap of the stage
    }
  }

  // mma() has released every stage and waited for every MMA: nothing is left in flight.
  template <class KTiles>
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, KTiles) {}
};

template <class Base, class Mutation>
struct Sm90TracedArrayMainloop;  // cutlass/sm90_grouped.hpp: a grouped GEMM's pointer-array collective

// The traced collective for CUTLASS's collective `Base`: this file's, the pointer-array one's, or (a
// specialisation in cutlass/sm90_blockwise.hpp) the blockwise-scaled fp8 one's.
template <class Base, class Mutation, class = void>
struct TracedMainloopOf {
  using type = cute::conditional_t<is_array_policy<typename Base::DispatchPolicy>,
                                   Sm90TracedArrayMainloop<Base, Mutation>, Sm90TracedMainloop<Base, Mutation>>;
};

#if defined(ORACLE_TRACE)
template <class Base, class Mutation = NoMutation>
using TracedMainloop = typename TracedMainloopOf<Base, Mutation>::type;
#else
template <class Base, class Mutation = NoMutation>
using TracedMainloop = Base;
#endif

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_SM90_MAINLOOP_HPP_

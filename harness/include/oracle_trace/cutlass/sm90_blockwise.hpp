// oracle_trace/cutlass/sm90_blockwise.hpp -- CUTLASS 4.2's blockwise-scaled fp8 mainloop, traced.
//
//   using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop>;
//
// BuiltMainloop is what CUTLASS's CollectiveBuilder gives for KernelTmaWarpSpecializedCooperativeFP8Blockwise
// (alias ...FP8BlockScaledAccum; CollectiveMma<MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8<...>, ...>, example
// 67) with the operand layouts cute::tuple<LayoutA, LayoutSFA>, cute::tuple<LayoutB, LayoutSFB> of a
// cutlass::detail::Sm90BlockwiseScaleConfig. TracedMainloop (cutlass/sm90_mainloop.hpp) picks this file's
// Sm90TracedBlockwiseMainloop for that collective; without ORACLE_TRACE the alias IS BuiltMainloop.
// Derived from it, it replaces the producer's load(), the consumer's mma() and mma_tail(); the scales'
// cp.async loads (load_auxiliary, the second producer warp) and everything else are CUTLASS's own.
//
// Data path, per k-block:
//   producer: as cutlass/sm90_mainloop.hpp (the stage's binding {tile_m, tile_n, k_block, group, partial}
//     written before its arrive), then the TMA loads of A, B and of the scales CUTLASS loads by TMA
//     (IsTmaLoadSFA / IsTmaLoadSFB); the other scales arrive by CUTLASS's own load_auxiliary;
//   consumer: waits for the stage, taps descriptor_a/b and load_a/b as the plain traced mainloop does,
//     reads the stage's scales into registers as CUTLASS does (partition_C of the scale tensors: each
//     thread the scales of the accumulator elements it holds), issues the k-block's WGMMAs into a zeroed
//     fp32 fragment, waits for them, taps the scales it is about to apply (scale_a [BM, 1]: per row, from
//     the threads that hold column 0; scale_b [BN, 1]: per column, from those that hold row 0), forms
//     CUTLASS's product (sa * sb, or one of them where the tile holds one scale) and promotes the
//     fragment as CUTLASS's GmmaFP8Accumulation does (acc += part * scale, the same expression), taps the
//     accumulator after the promotion (mma), then releases the stage.
//
// Constraints: the scale group's k extent (ScaleGranularityK) must be the tile's BK (one promotion per
// k-block, as the oracle's mma stage judges it; static_assert otherwise); ScaleGranularityM / N divide the
// tile (CUTLASS's own asserts). The traced build is serialised as the plain one is (cutlass/sm90_mainloop.hpp).
// The accumulator is cleared before the first promotion (CUTLASS 4.2's collective adds the first promotion
// to the accumulator the kernel allocated, which no code clears; 0 + x * s is x * s's rounding).
// Not traced here (refused by the launch and the case load): a batch L > 1, a split of k, the ping-pong
// schedule's stream-K. `Mutation` plants a scale defect for the bug zoo (each optional):
//   scale_b_hoisted    B's scale registers are read from the first k-block's stage only, then kept
//   scale_a_group_rows A's scale registers are partitioned by the thread's index in its warp group, so the
//                      second consumer warp group applies the first one's rows' scales
//
// The launch side (both routes share it; cutlass/entry.hpp calls it for a block-scaled kernel):
// check_block_scales() refuses a case whose scales are not the kernel's (kind block on both, the
// kernel's granularity, fp32 tensors stored in its scale layouts' majors); fill_block_scales() sets
// ptr_SFA / layout_SFA and ptr_SFB / layout_SFB from the kernel's ScaleConfig for (M, N, K, 1).

#ifndef ORACLE_TRACE_CUTLASS_SM90_BLOCKWISE_HPP_
#define ORACLE_TRACE_CUTLASS_SM90_BLOCKWISE_HPP_

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "oracle_trace/cutlass/sm90_mainloop.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/launch.hpp"
#include "oracle_trace/scales.cuh"
#include "oracle_trace/trace.cuh"

namespace oracle_trace::cutlass_sm90 {

template <class Policy>
constexpr bool is_blockwise_policy = false;
template <int Stages, class Cluster, class Schedule>
constexpr bool is_blockwise_policy<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8<Stages, Cluster, Schedule>> =
    true;

// A blockwise-scaled mainloop (CUTLASS's, or the traced one derived from it).
template <class Mainloop, class = void>
constexpr bool is_blockwise_mainloop = false;
template <class Mainloop>
constexpr bool is_blockwise_mainloop<Mainloop, cute::void_t<typename Mainloop::DispatchPolicy>> =
    is_blockwise_policy<typename Mainloop::DispatchPolicy>;

// The optional mutations (header): detected by name.
template <class M, class = void>
constexpr bool hoists_scale_b = false;
template <class M>
constexpr bool hoists_scale_b<M, cute::void_t<decltype(M::scale_b_hoisted)>> = M::scale_b_hoisted;
template <class M, class = void>
constexpr bool scale_a_by_group_rows = false;
template <class M>
constexpr bool scale_a_by_group_rows<M, cute::void_t<decltype(M::scale_a_group_rows)>> = M::scale_a_group_rows;

template <class Base, class Mutation = NoMutation>
struct Sm90TracedBlockwiseMainloop : Base {
  using typename Base::DispatchPolicy;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TileShape;
  using typename Base::TiledMma;
  using Scale = typename Base::ElementBlockScale;
  static constexpr int Stages = DispatchPolicy::Stages;
  static constexpr int kBM = cute::size<0>(TileShape{});
  static constexpr int kBN = cute::size<1>(TileShape{});
  static constexpr int kBK = cute::size<2>(TileShape{});
  static constexpr int kMsPerTile = Base::ScaleMsPerTile;
  static constexpr int kNsPerTile = Base::ScaleNsPerTile;
  using ValueA = trace_value_t<typename TiledMma::ValTypeA>;
  using ValueB = trace_value_t<typename TiledMma::ValTypeB>;
  static constexpr DType kDTypeA = dtype_of<ValueA>::value;
  static constexpr DType kDTypeB = dtype_of<ValueB>::value;

  static_assert(Base::ScaleGranularityK == kBK,
                "Sm90TracedBlockwiseMainloop: the blockwise collective's ScaleGranularityK must equal the tile's K "
                "(one scale group, one promotion per k-block, as the oracle's mma stage judges it); a scale group "
                "spanning several k-blocks is promoted once for all of them and is not traced by this version");
  static_assert(std::is_same_v<Scale, float>, "the blockwise collective's scales are fp32");

  // The base's stages plus one binding per stage: {tile_m, tile_n, k_block, group, partial}.
  struct TensorStorage : Base::TensorStorage {
    alignas(16) int32_t binding[Stages][5];
  };

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

  template <class TensorA, class TensorB, class TensorSFA, class TensorSFB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState write,
                           cute::tuple<TensorA, TensorB, TensorSFA, TensorSFB> const& load_inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t block_rank_in_cluster, TensorStorage& storage) {
    using namespace cute;
    if (!elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BM, BK, stage)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BN, BK, stage)
    Tensor sSFA = make_tensor(make_smem_ptr(storage.smem_SFA.data()), filter_zeros(SmemLayoutSFA{}));
    Tensor sSFB = make_tensor(make_smem_ptr(storage.smem_SFB.data()), filter_zeros(SmemLayoutSFB{}));
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
    // the scales CUTLASS loads by TMA: one box of the tile's scale rows (columns) per k-block
    Tensor gSFA = local_tile(get<2>(load_inputs), make_tile(Int<kMsPerTile>{}, Int<1>{}), make_coord(m, _, l));
    Tensor gSFB = local_tile(get<3>(load_inputs), make_tile(Int<kNsPerTile>{}, Int<1>{}), make_coord(n, _, l));
    const auto [mask_a, mask_b] = multicast_masks<typename DispatchPolicy::ClusterShape, typename Base::GmemTiledCopyA,
                                                  typename Base::GmemTiledCopyB>(cta_x, cta_y);
    const int32_t group = size<4>(gA_mkl) > 1 ? int32_t(l) : int32_t(kNone);

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write) {
      auto token = pipeline.producer_try_acquire(write);
      while (token != cutlass::BarrierStatus::WaitDone) token = pipeline.producer_try_acquire(write);
      const int stage = write.index();
      int32_t* b = storage.binding[stage];  // read by nobody until the arrive below completes the phase
      b[0] = int32_t(m);
      b[1] = int32_t(n);
      b[2] = int32_t(*k_tile_iter);
      b[3] = group;
      b[4] = kNone;
      __threadfence_block();
      pipeline.producer_acquire(write, token);  // arrive and expect the stage's bytes
      auto* barrier = pipeline.producer_get_barrier(write);
      copy(params.tma_load_a.with(*barrier, mask_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(*barrier, mask_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
      if constexpr (Base::IsTmaLoadSFA) {
        auto tma = params.tma_load_sfa.get_slice(cta_y);
        copy(params.tma_load_sfa.with(*barrier, uint16_t(0)), tma.partition_S(gSFA)(_, _, _, *k_tile_iter),
             tma.partition_D(sSFA)(_, _, _, stage));
      }
      if constexpr (Base::IsTmaLoadSFB) {
        auto tma = params.tma_load_sfb.get_slice(cta_y);
        copy(params.tma_load_sfb.with(*barrier, uint16_t(0)), tma.partition_S(gSFB)(_, _, _, *k_tile_iter),
             tma.partition_D(sSFB)(_, _, _, stage));
      }
    }
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& storage, Params const& /*params*/) {
    using namespace cute;
    using Tr = Tracer<true>;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator lives in registers");
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), SmemLayoutA{});  // (BM, BK, stage)
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), SmemLayoutB{});  // (BN, BK, stage)
    // the scales as the tile's (BM, BN, (k, stage)) tensors, each broadcast along the other operand's axis
    Tensor sSFA = make_tensor(make_smem_ptr(storage.smem_SFA.data()),
                              make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                                                     make_shape(get<1>(shape(SmemLayoutSFA{})), get<2>(shape(SmemLayoutSFA{})))),
                                          make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                                      make_stride(get<1>(stride(SmemLayoutSFA{})),
                                                                  get<2>(stride(SmemLayoutSFA{}))))));
    Tensor sSFB = make_tensor(make_smem_ptr(storage.smem_SFB.data()),
                              make_layout(make_shape(get<0>(TileShape{}), get<0>(shape(SmemLayoutSFB{})),
                                                     make_shape(get<1>(shape(SmemLayoutSFB{})), get<2>(shape(SmemLayoutSFB{})))),
                                          make_stride(_0{}, get<0>(stride(SmemLayoutSFB{})),
                                                      make_stride(get<1>(stride(SmemLayoutSFB{})),
                                                                  get<2>(stride(SmemLayoutSFB{}))))));
    constexpr int kThreads = size(TiledMma{});  // the consumer threads of one tile
    const int group_thread = thread_idx % kThreads;
    TiledMma tiled_mma;
    auto wg_mma = tiled_mma.get_slice(__shfl_sync(0xFFFFFFFF, group_thread / cutlass::NumThreadsPerWarpGroup, 0) *
                                      cutlass::NumThreadsPerWarpGroup);
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, stage)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, stage)
    // each thread's scales of the accumulator elements it holds (the defect: A's by the warp-group index)
    const int sfa_thread = scale_a_by_group_rows<Mutation> ? group_thread % cutlass::NumThreadsPerWarpGroup : group_thread;
    Tensor tCsSFA = tiled_mma.get_slice(sfa_thread).partition_C(sSFA);    // (MMA, MMA_M, MMA_N, (k, stage))
    Tensor tCsSFB = tiled_mma.get_slice(group_thread).partition_C(sSFB);  // (MMA, MMA_M, MMA_N, (k, stage))
    Tensor tCrSFA = make_tensor_like<Scale>(tCsSFA(_, _, _, _0{}));
    Tensor tCrSFB = make_tensor_like<Scale>(tCsSFB(_, _, _, _0{}));
    Tensor tCcC = accumulator_coords(group_thread);
    constexpr int kAcc = decltype(size(accum))::value;
    static_assert(decltype(size(tCcC))::value == kAcc, "accumulator coordinates");
    static_assert(decltype(size(tCrSFA))::value == kAcc && decltype(size(tCrSFB))::value == kAcc, "scale registers");
    auto part = make_fragment_like(accum);  // the k-block's WGMMA sum, before its promotion
    const auto* base_a = reinterpret_cast<const ValueA*>(storage.smem_A.data());
    const auto* base_b = reinterpret_cast<const ValueB*>(storage.smem_B.data());
    // the accumulator elements of column 0 (A's scale per row) and of row 0 (B's per column) this thread holds
    int rows_at[kAcc], cols_at[kAcc], n_rows = 0, n_cols = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kAcc; ++i) {
      if (int(get<1>(tCcC(i))) == 0) rows_at[n_rows++] = i;
      if (int(get<0>(tCcC(i))) == 0) cols_at[n_cols++] = i;
    }
    clear(accum);

    bool first = true;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++read) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      const int stage = read.index();
      const int32_t* b = storage.binding[stage];
      const Site site{b[0], b[1], b[2], stage, b[4], b[3]};
      const Site at{site.tile_m, site.tile_n, site.k_block, kNone, site.partial, site.group};
      if constexpr (Tr::enabled) {
        const ValueA* image_a = base_a + stage * kBM * kBK;
        const ValueB* image_b = base_b + stage * kBN * kBK;
        if ((reinterpret_cast<uintptr_t>(image_a) & 1023u) == 0)
          Tr::tap_smem_bytes(Stage::DescriptorA, site, image_a, kBM * kBK * sizeof(ValueA), kDTypeA, kBM, kBK,
                             group_thread, kThreads);
        if ((reinterpret_cast<uintptr_t>(image_b) & 1023u) == 0)
          Tr::tap_smem_bytes(Stage::DescriptorB, site, image_b, kBN * kBK * sizeof(ValueB), kDTypeB, kBK, kBN,
                             group_thread, kThreads);
        Tr::tap_smem_tile(Stage::LoadA, site, base_a, kBM, kBK,
                          [&](int r, int c) { return offset_a(storage.smem_A.data(), r, c, stage); }, group_thread,
                          kThreads);
        Tr::tap_smem_tile(Stage::LoadB, site, base_b, kBK, kBN,
                          [&](int r, int c) { return offset_b(storage.smem_B.data(), r, c, stage); }, group_thread,
                          kThreads);
      }
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), tCrSFA);
      if (!hoists_scale_b<Mutation> || first) copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), tCrSFB);

      warpgroup_fence_operand(part);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;  // every k-block's sum starts from zero
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();  // serialised: the fragment is this k-block's
      warpgroup_fence_operand(part);
      first = false;

      // the scales applied: per element where the tile holds several, else the thread's first register
      auto sa = [&](int i) { return kMsPerTile > 1 ? tCrSFA(i) : tCrSFA(0); };
      auto sb = [&](int i) { return kNsPerTile > 1 ? tCrSFB(i) : tCrSFB(0); };
      if constexpr (Tr::enabled) {
        if (n_rows > 0)
          oracle_trace::scale_a<true>(at, kBM, 1, n_rows, [&](int j) {
            return Element<float>{int(get<0>(tCcC(rows_at[j]))), 0, float(sa(rows_at[j]))};
          });
        if (n_cols > 0)
          oracle_trace::scale_b<true>(at, kBN, 1, n_cols, [&](int j) {
            return Element<float>{int(get<1>(tCcC(cols_at[j]))), 0, float(sb(cols_at[j]))};
          });
      }
      // CUTLASS's promotion: the product of the two where one of them is one scale for the tile, then
      // acc += part * scale (acc += part * sa * sb where both vary)
      if constexpr (kMsPerTile == 1 && kNsPerTile == 1) {
        const Scale s = tCrSFA(_0{}) * tCrSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kAcc; ++i) accum(i) += part(i) * s;
      } else if constexpr (kMsPerTile > 1 && kNsPerTile == 1) {
        const Scale s_b = tCrSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFA)); ++i) filter_zeros(tCrSFA)(i) = filter_zeros(tCrSFA)(i) * s_b;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kAcc; ++i) accum(i) += part(i) * tCrSFA(i);
      } else if constexpr (kMsPerTile == 1 && kNsPerTile > 1) {
        const Scale s_a = tCrSFA(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFB)); ++i) filter_zeros(tCrSFB)(i) = filter_zeros(tCrSFB)(i) * s_a;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kAcc; ++i) accum(i) += part(i) * tCrSFB(i);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kAcc; ++i) accum(i) += part(i) * tCrSFA(i) * tCrSFB(i);
      }
      if constexpr (Tr::enabled) {
        Tr::tap_elements(Stage::Mma, at, kBM, kBN, kAcc, [&](int i) {
          return Element<float>{int(get<0>(tCcC(i))), int(get<1>(tCcC(i))), float(accum(i))};
        });
      }
      pipeline.consumer_release(read);  // after every tap of the stage
    }
  }

  // mma() has released every stage and waited for every MMA: nothing is left in flight.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

// TracedMainloop's choice for CUTLASS's blockwise-scaled collective (cutlass/sm90_mainloop.hpp).
template <class Base, class Mutation>
struct TracedMainloopOf<Base, Mutation, std::enable_if_t<is_blockwise_mainloop<Base>>> {
  using type = Sm90TracedBlockwiseMainloop<Base, Mutation>;
};

template <class Mainloop>
constexpr bool is_traced_blockwise = false;
template <class Base, class Mutation>
constexpr bool is_traced_blockwise<Sm90TracedBlockwiseMainloop<Base, Mutation>> = true;

// The entry's check (cutlass/entry_checks.hpp EntryChecks): a traced build runs the blockwise collective
// through TracedMainloop, or its scales and promotions would go unseen; nothing for another mainloop.
template <class Mainloop>
struct BlockwiseChecks {
  static_assert(!(kTracedBuild && is_blockwise_mainloop<Mainloop> && !is_traced_blockwise<Mainloop>),
                "ORACLE_CUTLASS_ENTRY: the kernel's mainloop is CUTLASS's blockwise-scaled fp8 collective "
                "(MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8) untraced: its scales and promotions would go "
                "unseen; write using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop> "
                "(CUTLASS's own collective without ORACLE_TRACE)");
  static_assert(!is_blockwise_mainloop<Mainloop> ||
                    std::is_base_of_v<cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                      typename Mainloop::DispatchPolicy::Schedule>,
                "ORACLE_CUTLASS_ENTRY: the blockwise-scaled fp8 mainloop is traced in CUTLASS's cooperative kernel "
                "(KernelTmaWarpSpecializedCooperativeFP8Blockwise) only");
  static constexpr bool ok = true;
};

// ---- the launch side -------------------------------------------------------------------------

// The TensorRef of a block scale stored as the kernel's layout reads it: fp32, [blocks, k groups], the
// major's stride 1 and the other the packed extent.
inline bool is_block_scale(const TensorRef& t, int64_t blocks, int64_t groups, bool mn_major) {
  if (t.data == nullptr || t.dtype != uint32_t(ElementType::F32) || t.rank != 2 || t.shape[0] != blocks ||
      t.shape[1] != groups)
    return false;
  return mn_major ? (t.stride[0] == 1 && (groups == 1 || t.stride[1] == blocks))
                  : (t.stride[1] == 1 && (blocks == 1 || t.stride[0] == groups));
}

// The case's block scales against the kernel's: kind, granularity, batch, split, tensors. kLaunchOk or a
// refusal that names both.
template <class Mainloop>
int check_block_scales(const LaunchArgs* args) {
  constexpr int gm = Mainloop::ScaleGranularityM, gn = Mainloop::ScaleGranularityN, gk = Mainloop::ScaleGranularityK;
  if (args->scale_a_kind != uint32_t(ScaleKind::Block) || args->scale_b_kind != uint32_t(ScaleKind::Block))
    return fail_launch(args, kLaunchUnsupported,
                       "the mainloop is CUTLASS's blockwise-scaled fp8 one: scale kinds %s and %s given (allowed: "
                       "block for both)", scale_kind_name(args->scale_a_kind), scale_kind_name(args->scale_b_kind));
  if (args->scale_a_block[0] != gm || args->scale_a_block[1] != gk || args->scale_b_block[0] != gn ||
      args->scale_b_block[1] != gk)
    return fail_launch(args, kLaunchUnsupported,
                       "the kernel's scale blocks are %d x %d for A and %d x %d for B (ScaleGranularityM/N/K); the "
                       "case says %d x %d and %d x %d", gm, gk, gn, gk, args->scale_a_block[0], args->scale_a_block[1],
                       args->scale_b_block[0], args->scale_b_block[1]);
  if (args->batch != 1 || args->splits != 1 || args->stream_k_workers != 0)
    return fail_launch(args, kLaunchUnsupported,
                       "batch %lld, splits %d, stream_k_workers %d: the traced blockwise-scaled mainloop runs one GEMM "
                       "of whole tiles per call (batch 1, no split)", (long long)args->batch, args->splits,
                       args->stream_k_workers);
  const int64_t groups = (args->k + gk - 1) / gk;
  if (!is_block_scale(tensor(args, kSlotScaleA), (args->m + gm - 1) / gm, groups, Mainloop::MMajorSFA))
    return fail_launch(args, kLaunchUnsupported,
                       "scale_a must be fp32 [ceil(M / %d), ceil(K / %d)] = [%lld, %lld] stored %s (the kernel's "
                       "LayoutSFA)", gm, gk, (long long)((args->m + gm - 1) / gm), (long long)groups,
                       Mainloop::MMajorSFA ? "M-major (major = \"col\")" : "K-major (major = \"row\")");
  if (!is_block_scale(tensor(args, kSlotScaleB), (args->n + gn - 1) / gn, groups, Mainloop::NMajorSFB))
    return fail_launch(args, kLaunchUnsupported,
                       "scale_b must be fp32 [ceil(N / %d), ceil(K / %d)] = [%lld, %lld] stored %s (the kernel's "
                       "LayoutSFB)", gn, gk, (long long)((args->n + gn - 1) / gn), (long long)groups,
                       Mainloop::NMajorSFB ? "N-major (major = \"col\")" : "K-major (major = \"row\")");
  return kLaunchOk;
}

// The scale pointers and CUTLASS's packed scale layouts for (M, N, K, 1), as example 67 fills them.
template <class Mainloop, class MainloopArguments>
void fill_block_scales(const LaunchArgs* args, MainloopArguments& g) {
  using ScaleConfig = typename Mainloop::ScaleConfig;
  const auto shape = cute::make_shape(int(args->m), int(args->n), int(args->k), 1);
  g.ptr_SFA = static_cast<const float*>(tensor(args, kSlotScaleA).data);
  g.ptr_SFB = static_cast<const float*>(tensor(args, kSlotScaleB).data);
  g.layout_SFA = ScaleConfig::tile_atom_to_shape_SFA(shape);
  g.layout_SFB = ScaleConfig::tile_atom_to_shape_SFB(shape);
}

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_SM90_BLOCKWISE_HPP_

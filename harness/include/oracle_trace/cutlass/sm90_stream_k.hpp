// oracle_trace/cutlass/sm90_stream_k.hpp -- CUTLASS's SM90 stream-K tile scheduler, traced.
//
//   using Scheduler = oracle_trace::cutlass_sm90::TracedScheduler<cutlass::gemm::StreamKScheduler, CollectiveMainloop>;
//   using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
//                                                           CollectiveEpilogue, Scheduler>;
//
// Without ORACLE_TRACE the alias IS the tag (cutlass::gemm::StreamKScheduler): the production kernel is
// CUTLASS's own. With it, the tag selects Sm90TracedStreamK, derived from CUTLASS's
// PersistentTileSchedulerSm90StreamK, which replaces what the cooperative kernel asks of its scheduler
// where a work unit is handed out and where its partial is reduced (everything else is inherited):
//
// Data path, per work unit of an output tile:
//   initial_work_tile_info / fetch_next_work: CUTLASS's own work unit, labelled with its partial: the
//     unit's index among the units that share the tile, in k order (0, 1, ...), or -1 where the unit
//     does the whole tile (a data-parallel tile, or a stream-K tile one unit does alone). Split-K: the
//     split (CUTLASS deals KB k-blocks to S splits, KB / S each and one more to the first KB mod S);
//     stream-K: the units of the tile's stream-K group before this one whose k-range reaches into the
//     tile, read from CUTLASS's own assignment of each (get_current_work_for_linear_idx);
//   get_work_k_tile_count: the unit's k-block count with its partial (UnitKTiles, which converts to
//     the count): the traced mainloop's producer writes the partial into the stage's binding and its
//     consumer taps load_a/b and mma with it, so the oracle reads each tile's partition from the taps;
//   fixup: CUTLASS's own reduction through the workspace (in place: each unit but the last adds its
//     partial into the tile's workspace, the last adds the workspace into its accumulators; a separate
//     reduction unit sums the peers' partials), then, in the unit that runs the tile's epilogue, the
//     reduced accumulator is tapped as `reduce`.
//
// Constraints: the cooperative kernel (CUTLASS's ping-pong kernel takes no stream-K scheduler), a
// cluster of one CTA, the traced mainloop (its accumulator_coords places the reduce tap's elements).
// Both reduction modes (Deterministic, Nondeterministic) are reduced by CUTLASS as they are; CUTLASS
// 4.2 never chooses its separate reduction (should_perform_separate_reduction returns false), whose
// units would be tapped the same way. `Mutation` plants a defect for the bug zoo:
// add_own_partial_again, true where the unit that reduces the tile adds its own partial once more after
// CUTLASS's fixup (a partial accumulated twice).

#ifndef ORACLE_TRACE_CUTLASS_SM90_STREAM_K_HPP_
#define ORACLE_TRACE_CUTLASS_SM90_STREAM_K_HPP_

#include <stdint.h>

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "oracle_trace/trace.cuh"

namespace oracle_trace::cutlass_sm90 {

// A work unit's k-block count with the unit's partial (kNone: the unit does the whole tile). It
// converts to the count wherever CUTLASS's kernel uses the count.
struct UnitKTiles {
  uint32_t count;
  int32_t partial;
  CUTLASS_HOST_DEVICE operator uint32_t() const { return count; }
};

template <class KTiles>
CUTLASS_HOST_DEVICE int32_t partial_of(KTiles const&) {
  return kNone;
}
CUTLASS_HOST_DEVICE int32_t partial_of(UnitKTiles const& k) { return k.partial; }

template <class KTiles>
CUTLASS_HOST_DEVICE int count_of(KTiles const& k) {
  return int(k);
}

// The fixup as CUTLASS does it (a correct kernel).
struct NoFixupMutation {
  static constexpr bool add_own_partial_again = false;
};

template <class Base, class Mainloop, class Mutation = NoFixupMutation>
struct Sm90TracedStreamK : Base {
  using typename Base::Params;
  using BaseWork = typename Base::WorkTileInfo;

  // CUTLASS's work unit and the partial it computes of its tile (kNone: the whole tile).
  struct WorkTileInfo : BaseWork {
    int32_t partial = kNone;
  };

  CUTLASS_HOST_DEVICE Sm90TracedStreamK() {}

  // As CUTLASS's constructor: the first work unit's linear index from the block index.
  CUTLASS_DEVICE explicit Sm90TracedStreamK(Params const& params) : Base(params) {
    linear_ = params.raster_order_ == Base::RasterOrder::AlongN
                  ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x)
                  : uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return labelled(Base::get_current_work());
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    BaseWork& base = work;
    if (Base::continue_current_work(base)) {  // the same unit, its next (earlier) tile
      return cute::make_tuple(labelled(base), true);
    }
    Base::advance_to_next_work();
    linear_ += uint64_t(gridDim.x) * uint64_t(gridDim.y) * uint64_t(gridDim.z);
    return cute::make_tuple(labelled(Base::get_current_work()), true);
  }

  template <class Pipeline, class PipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, Pipeline&, PipelineState) {
    return fetch_next_work(work);
  }

  template <class ProblemShape, class TileShape>
  CUTLASS_HOST_DEVICE static UnitKTiles get_work_k_tile_count(WorkTileInfo const& work, ProblemShape, TileShape) {
    return UnitKTiles{work.k_tile_count, work.partial};
  }

  // CUTLASS's fixup, then the reduced accumulator tapped where the tile's epilogue runs.
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const& params, WorkTileInfo const& work, FrgTensorC& accumulators,
                                   uint32_t num_barriers, uint32_t barrier_idx) {
    using namespace cute;
    const bool reduced = (Base::requires_fixup(params, work) || work.is_reduction_unit()) &&
                         Base::compute_epilogue(work, params);
    if constexpr (Mutation::add_own_partial_again) {
      auto own = make_fragment_like(accumulators);
      copy(accumulators, own);
      Base::fixup(params, work, accumulators, num_barriers, barrier_idx);
      if (reduced && !work.is_reduction_unit()) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accumulators); ++i) accumulators(i) += own(i);
      }
    } else {
      Base::fixup(params, work, accumulators, num_barriers, barrier_idx);
    }
    using Tr = Tracer<true>;
    if constexpr (Tr::enabled) {
      if (!reduced) return;
      using TileShape = typename Mainloop::TileShape;
      constexpr int kBM = size<0>(TileShape{}), kBN = size<1>(TileShape{});
      constexpr int kThreads = size(typename Mainloop::TiledMma{});
      auto coords = Mainloop::accumulator_coords(int(threadIdx.x % kThreads));  // the kernel's mma_thread_idx
      Tr::tap_elements(Stage::Reduce, Site{int(work.M_idx), int(work.N_idx)}, kBM, kBN, int(size(accumulators)),
                       [&](int i) {
                         return Element<float>{int(get<0>(coords(i))), int(get<1>(coords(i))), float(accumulators(i))};
                       });
    }
  }

 private:
  uint64_t linear_ = 0;  // CUTLASS's linear index of the current work unit (the base keeps its own)

  CUTLASS_DEVICE WorkTileInfo labelled(BaseWork const& base) const {
    WorkTileInfo work;
    static_cast<BaseWork&>(work) = base;
    work.partial = partial_index(base);
    return work;
  }

  // The unit's partial of its tile: kNone where it does the whole tile.
  CUTLASS_DEVICE int32_t partial_index(BaseWork const& work) const {
    const Params& p = this->scheduler_params;
    if (!Base::requires_fixup(p, work) || work.is_reduction_unit()) return kNone;
    const uint32_t k_idx = uint32_t(work.K_idx);
    if (p.divmod_splits_.divisor > 1) {  // split-K: split s begins at s * (KB / S) + min(s, KB mod S)
      const uint32_t per = uint32_t(p.divmod_k_tiles_per_sk_unit_.divisor), big = p.big_units_;
      if (k_idx < big * (per + 1)) return int32_t(k_idx / (per + 1));
      return int32_t(big + (k_idx - big * (per + 1)) / per);
    }
    // Stream-K: a unit covers the k-iterations [start, start + remaining) of its group and does its
    // tiles last to first; the units of one group are every `groups`-th linear index, in k order.
    const dim3 in_cluster = cute::block_id_in_cluster();
    uint32_t start = 0;  // this unit's first k-iteration
    Base::get_current_work_for_linear_idx(start, linear_, in_cluster, p);
    const uint32_t piece_begin = start + work.k_tile_remaining - work.k_tile_count;
    const uint32_t tile_begin = piece_begin - k_idx;
    const uint64_t groups = p.divmod_sk_groups_.divisor;
    int32_t rank = 0;
    for (uint64_t u = linear_; u >= groups;) {
      u -= groups;
      uint32_t other_start = 0;
      const BaseWork other = Base::get_current_work_for_linear_idx(other_start, u, in_cluster, p);
      if (other.k_tile_remaining == 0) continue;  // an empty unit has no partial
      if (other_start + other.k_tile_remaining <= tile_begin) break;
      ++rank;
    }
    return rank;
  }
};

// The tag GemmUniversal selects the traced scheduler by (TracedScheduler's, under ORACLE_TRACE).
template <class Mainloop, class Mutation = NoFixupMutation>
struct TracedStreamKTag {};

template <class Tag, class Mainloop, class Mutation>
struct traced_scheduler_tag {
  using type = Tag;  // the persistent scheduler's taps are the mainloop's: nothing to add
};
template <class Mainloop, class Mutation>
struct traced_scheduler_tag<cutlass::gemm::StreamKScheduler, Mainloop, Mutation> {
  using type = TracedStreamKTag<Mainloop, Mutation>;
};

#if defined(ORACLE_TRACE)
template <class Tag, class Mainloop, class Mutation = NoFixupMutation>
using TracedScheduler = typename traced_scheduler_tag<Tag, Mainloop, Mutation>::type;
#else
template <class Tag, class Mainloop, class Mutation = NoFixupMutation>
using TracedScheduler = Tag;
#endif

}  // namespace oracle_trace::cutlass_sm90

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount, class Mainloop, class Mutation>
struct TileSchedulerSelector<oracle_trace::cutlass_sm90::TracedStreamKTag<Mainloop, Mutation>, arch::Sm90, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = oracle_trace::cutlass_sm90::Sm90TracedStreamK<
      PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape>, Mainloop, Mutation>;
};

}  // namespace cutlass::gemm::kernel::detail

#endif  // ORACLE_TRACE_CUTLASS_SM90_STREAM_K_HPP_

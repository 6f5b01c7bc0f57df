// oracle_trace/cutlass/checks.hpp -- what the CUTLASS adapter can run, checked on types alone.
//
//   SchedulerChecks<TileScheduler>::ok   the kernel's tile scheduler is CUTLASS's default persistent one,
//                                        or (stream-K, split-K) CUTLASS's stream-K one, traced in a traced
//                                        build (TracedScheduler, cutlass/sm90_stream_k.hpp)
//   ProblemShapeChecks<ProblemShape>::ok a (M, N, K, L) problem shape (L: the batch count of a strided
//                                        batched GEMM) or a grouped one (GroupProblemShape: cutlass/sm90_grouped.hpp)
//   is_fillable_stride<Stride>()         a (rows, cols, batch) stride with one static unit mode
//
// The two Checks are classes whose static_asserts fire when it is instantiated. The entry macros
// (cutlass/entry.hpp) instantiate them at namespace scope, before the kernel: a kernel the adapter
// cannot run stops the build in the seconds the front end takes to read CUTLASS's headers, before
// the device code is instantiated (a failed namespace-scope static_assert ends the translation unit's
// pending instantiations), and the message names what to change.
//
// Constraints: needs only CUTLASS's tile scheduler header (a test compiles these checks alone).

#ifndef ORACLE_TRACE_CUTLASS_CHECKS_HPP_
#define ORACLE_TRACE_CUTLASS_CHECKS_HPP_

#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace oracle_trace::cutlass_sm90 {

template <class Scheduler>
constexpr bool is_stream_k_scheduler = false;
template <class TileShape, class ClusterShape>
constexpr bool is_stream_k_scheduler<cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape>> =
    true;

template <class Base, class Mainloop, class Mutation>
struct Sm90TracedStreamK;  // cutlass/sm90_stream_k.hpp

template <class Scheduler>
constexpr bool is_traced_stream_k_scheduler = false;
template <class Base, class Mainloop, class Mutation>
constexpr bool is_traced_stream_k_scheduler<Sm90TracedStreamK<Base, Mainloop, Mutation>> = true;

// A build whose taps would miss a stream-K kernel's fixup: CUTLASS's own stream-K scheduler, traced.
#if defined(ORACLE_TRACE)
constexpr bool kTracedBuild = true;
#else
constexpr bool kTracedBuild = false;
#endif

template <class Scheduler>
constexpr bool is_group_scheduler = false;
template <class GroupProblemShape, int Stages>
constexpr bool is_group_scheduler<cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Group<GroupProblemShape, Stages>> =
    true;

// CUTLASS's default SM90 scheduler: GemmUniversal's scheduler argument void (the default),
// PersistentScheduler or StaticPersistentScheduler.
template <class Scheduler>
constexpr bool is_persistent_scheduler = std::is_same_v<Scheduler, cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90>;

template <class TileScheduler>
struct SchedulerChecks {
  static_assert(!(kTracedBuild && is_stream_k_scheduler<TileScheduler>),
                "ORACLE_CUTLASS_ENTRY: the kernel's tile scheduler is cutlass::gemm::StreamKScheduler (stream-K and "
                "split-K) untraced: its fixup (a reduction of partial tiles) and each work unit's partial would be "
                "missed; write GemmUniversal's fourth template argument as oracle_trace::cutlass_sm90::TracedScheduler<"
                "cutlass::gemm::StreamKScheduler, CollectiveMainloop> (CUTLASS's own scheduler without ORACLE_TRACE)");
  static_assert(!is_group_scheduler<TileScheduler>,
                "ORACLE_CUTLASS_ENTRY: the kernel's tile scheduler is cutlass::gemm::GroupScheduler, which deals a "
                "grouped GEMM's tiles, and its problem shape is not grouped: write GemmUniversal<cutlass::gemm::"
                "GroupProblemShape<Shape<int, int, int>>, ...> with the pointer-array schedules (CUTLASS's example 57), "
                "or CUTLASS's default scheduler for a (M, N, K, L) problem");
  static_assert(is_stream_k_scheduler<TileScheduler> || is_group_scheduler<TileScheduler> ||
                    is_persistent_scheduler<TileScheduler> || is_traced_stream_k_scheduler<TileScheduler>,
                "ORACLE_CUTLASS_ENTRY: the kernel's tile scheduler is neither CUTLASS's default persistent one "
                "(PersistentTileSchedulerSm90: GemmUniversal's fourth template argument void, PersistentScheduler or "
                "StaticPersistentScheduler) nor its stream-K one (StreamKScheduler, through TracedScheduler); the "
                "adapter traces those only");
  static constexpr bool ok = true;
};

template <class ProblemShape>
constexpr bool is_group_problem_shape = false;
template <class Shape>
constexpr bool is_group_problem_shape<cutlass::gemm::GroupProblemShape<Shape>> = true;

template <class ProblemShape>
struct ProblemShapeChecks {
  static_assert(is_group_problem_shape<ProblemShape> || cute::rank(ProblemShape{}) == 4,
                "ORACLE_CUTLASS_ENTRY: the kernel's problem shape must be (M, N, K, L): write "
                "GemmUniversal<Shape<int, int, int, int>, ...> (a rank-3 Shape<int, int, int>, as in CUTLASS's example "
                "48, has no L: add the fourth int), or a grouped GEMM's GroupProblemShape<Shape<int, int, int>>");
  static constexpr bool ok = true;
};

// A stride the adapter fills from a row- or column-major matrix: three modes (rows, cols, batch),
// exactly one of the first two the static unit stride, the other an integer.
template <class Stride>
constexpr bool is_fillable_stride() {
  if constexpr (cute::rank(Stride{}) != 3) {
    return false;
  } else {
    using S0 = cute::remove_cvref_t<decltype(cute::get<0>(Stride{}))>;
    using S1 = cute::remove_cvref_t<decltype(cute::get<1>(Stride{}))>;
    constexpr bool unit0 = cute::is_static<S0>::value && cute::is_integral<S0>::value;
    constexpr bool unit1 = cute::is_static<S1>::value && cute::is_integral<S1>::value;
    if constexpr (unit0 == unit1) {
      return false;
    } else if constexpr (unit0) {
      return S0::value == 1 && std::is_integral_v<S1>;
    } else {
      return S1::value == 1 && std::is_integral_v<S0>;
    }
  }
}

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_CHECKS_HPP_

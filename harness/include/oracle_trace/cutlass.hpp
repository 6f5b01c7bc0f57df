// oracle_trace/cutlass.hpp -- bring a CUTLASS 3.x SM90 GEMM to the oracle (CUTLASS 4.2, pinned).
//
// In the kernel's file, next to CUTLASS's CollectiveBuilder aliases:
//
//   #include "oracle_trace/cutlass.hpp"
//   using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop>;
//   using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<BuiltEpilogue>;
//   ... GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue> ... Gemm;
//   ORACLE_CUTLASS_HOST_ENTRY(Gemm, make_arguments)   the user's own host code fills Gemm::Arguments
//   (or ORACLE_CUTLASS_ENTRY(Gemm): the adapter fills them; cutlass/entry.hpp has make_arguments' shape)
//
// The mainloop builder's StageCountAutoCarveout names BuiltEpilogue (CollectiveEpilogue is the traced
// type after the rename). A kernel the adapter cannot run (another tile scheduler, a rank-3 problem
// shape, another fusion, element type or stride) stops the build in seconds (cutlass/entry_checks.hpp).
//
// Bias and activation: CUTLASS's LinCombEltAct, LinCombPerRowBias, LinCombPerColBias and their EltAct forms
// (cutlass/sm90_epilogue.hpp traces their trees), or the user's own Sm90EVT tree with its steps marked
// oracle_trace::cutlass_sm90::Tap<Stage::Epilogue..., Node> (its arguments filled by the user's function,
// ORACLE_CUTLASS_ENTRY_WITH). The traced library keeps the tree's epilogue order as text; the oracle
// reads it from the built file and judges the case in it.
// Split-K and stream-K: CUTLASS's StreamKScheduler as GemmUniversal's fourth argument, written
// oracle_trace::cutlass_sm90::TracedScheduler<cutlass::gemm::StreamKScheduler, CollectiveMainloop>
// (cutlass/sm90_stream_k.hpp: each work unit's taps name its partial, the fixup's sum is tapped as
// reduce); the case's splits or stream_k_workers choose CUTLASS's decomposition.
// Grouped (pointer-array) GEMMs, CUTLASS's example 57 (GroupProblemShape, KernelPtrArrayTmaWarpSpecializedCooperative):
// the same two aliases give the traced array collectives (cutlass/sm90_grouped.hpp: every tap names its group)
// and the entry macros the grouped launch (cutlass/grouped_entry.hpp: the host route's make_arguments takes
// the groups' sizes, make(int groups, const int* group_m, int n, int k, a, lda, b, ldb, c, ldc, d, ldd, alpha, beta)).
// fp8 with per-tensor scales: an FP8FastAccum schedule and, as the epilogue's fusion,
// oracle_trace::cutlass_sm90::TensorScaledLinearCombination<D, float, C, float> (cutlass/sm90_epilogue.hpp).
// What the adapter refuses (a bias with batch or groups, other scales, the promoting FP8 mainloop, a bias or activation
// that is not the fusion's): static_asserts here, kLaunchUnsupported in oracle_launch, and a CaseError when a case is
// loaded (oracle/run/adapters.py); README "Bring a CUTLASS kernel" has the table.
//
// Without ORACLE_TRACE both aliases are CUTLASS's own types (the production kernel is unchanged)
// and the entry is host code. With it: cutlass/sm90_mainloop.hpp (descriptor_a/b, load_a/b, mma
// taps, bound to their tile through shared memory), cutlass/sm90_epilogue.hpp (epilogue_scale,
// epilogue_alpha_beta and epilogue_cast tap nodes), cutlass/sm90_stream_k.hpp (the stream-K scheduler's
// partials and reduce), cutlass/entry.hpp (oracle_launch: LaunchArgs -> Gemm::Arguments,
// filled by the adapter or by the user's make_arguments), cutlass/entry_checks.hpp and cutlass/checks.hpp
// (the type checks).

#ifndef ORACLE_TRACE_CUTLASS_HPP_
#define ORACLE_TRACE_CUTLASS_HPP_

#include "oracle_trace/cutlass/version.hpp"
#include "oracle_trace/cutlass/types.hpp"
#include "oracle_trace/cutlass/checks.hpp"
#include "oracle_trace/cutlass/entry_checks.hpp"
#include "oracle_trace/cutlass/sm90_stream_k.hpp"
#include "oracle_trace/cutlass/sm90_mainloop.hpp"
#include "oracle_trace/cutlass/sm90_blockwise.hpp"
#include "oracle_trace/cutlass/sm90_epilogue.hpp"
#include "oracle_trace/cutlass/sm90_grouped.hpp"
#include "oracle_trace/cutlass/entry.hpp"
#include "oracle_trace/cutlass/grouped_entry.hpp"

#endif  // ORACLE_TRACE_CUTLASS_HPP_

// batched.cu -- CUTLASS's own SM90 warp-specialized GEMM run as a strided batched GEMM (L batch entries of
// one shape), brought to the oracle as a launch library (ABI "oracle/1"): bf16 A [M, K] row-major x bf16 B
// [K, N] column-major per entry, fp32 accumulate, D = alpha * acc + beta * C in bf16 (row-major), 128 x 128
// x 64 CTA tile, cluster 1 x 1, the cooperative schedule and the persistent tile scheduler, which deals the
// tiles of every entry (m, n, l). Everything but the four marked lines is what a CUTLASS user writes with
// the CollectiveBuilder; the host code is example 48's args_from_options, whose packed strides
// (make_cute_packed_stride(StrideA{}, {m, k, l})) step from one entry to the next.
//
// The oracle stores the entries one after the other (A [L * M, K], B [L, N, K] as a column-major B is
// stored, C and D [L * M, N]), packed: the strides above. The taps name the entry l as their group, so each
// entry is judged as its own GEMM.
//
// Build switches (the case files set them as [kernel] defines):
//   ZOO_BATCHED_HOST=1          the host route: Gemm::Arguments come from the user's own make_arguments,
//                               entered through ORACLE_CUTLASS_HOST_ENTRY (default: ORACLE_CUTLASS_ENTRY, the
//                               adapter fills them for L = the case's batch)
// Planted defects (tests/zoo/manifest.json names the stage the oracle must name):
//   ZOO_BATCHED_HOST_B_STRIDE_OF_A=1  (host route) B's packed stride made from A's extents (m, k, l): its
//                                     batch step is M * K where N * K belongs, so entries 1.. read B from
//                                     the wrong place (entry 0 is right): descriptor_b, group 1
//   ZOO_BATCHED_ENTRY1_KBLOCK_TWICE=1 batch entry 1's k-block 1 MMAs issued twice (traced build only: the
//                                     defect lives in the traced mainloop's loop): mma, group 1, k-block 1

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "oracle_trace/cutlass.hpp"  // (1) the adapter

namespace zoo_batched {

using namespace cute;

using ElementA = cutlass::bfloat16_t;
using ElementB = cutlass::bfloat16_t;
using ElementC = cutlass::bfloat16_t;
using ElementD = cutlass::bfloat16_t;
using ElementAccumulator = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16-byte TMA alignment

using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;

using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, ElementC, LayoutC, kAlign,
    ElementD, LayoutD, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlign, ElementB, LayoutB, kAlign,
    ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename BuiltEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

#if defined(ZOO_BATCHED_ENTRY1_KBLOCK_TWICE)
struct Entry1KBlockTwice {  // the defect: batch entry 1's k-block 1 MMAs issued twice
  CUTLASS_DEVICE static constexpr int issues(int k_block, int entry) { return entry == 1 && k_block == 1 ? 2 : 1; }
};
using Mutation = Entry1KBlockTwice;
#else
using Mutation = oracle_trace::cutlass_sm90::NoMutation;
#endif
using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop, Mutation>;  // (2)
using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<BuiltEpilogue>;           // (3)

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

#if defined(ZOO_BATCHED_HOST)
using StrideA = typename Gemm::GemmKernel::StrideA;
using StrideB = typename Gemm::GemmKernel::StrideB;
using StrideC = typename Gemm::GemmKernel::StrideC;
using StrideD = typename Gemm::GemmKernel::StrideD;

// The user's own host code (example 48's args_from_options): every entry packed, one after the other.
typename Gemm::Arguments make_arguments(int m, int n, int k, int l, ElementA const* a, int64_t /*lda*/,
                                        ElementB const* b, int64_t /*ldb*/, ElementC const* c, int64_t /*ldc*/,
                                        ElementD* d, int64_t /*ldd*/, float alpha, float beta) {
  auto stride_a = cutlass::make_cute_packed_stride(StrideA{}, {m, k, l});
#if defined(ZOO_BATCHED_HOST_B_STRIDE_OF_A)
  auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, {m, k, l});  // the defect: A's extents
#else
  auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, {n, k, l});
#endif
  auto stride_c = cutlass::make_cute_packed_stride(StrideC{}, {m, n, l});
  auto stride_d = cutlass::make_cute_packed_stride(StrideD{}, {m, n, l});
  return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, l},
                                  {a, stride_a, b, stride_b},
                                  {{alpha, beta}, c, stride_c, d, stride_d}};
}
#endif

}  // namespace zoo_batched

#if defined(ZOO_BATCHED_HOST)
ORACLE_CUTLASS_HOST_ENTRY(zoo_batched::Gemm, zoo_batched::make_arguments)  // (4) oracle_launch, the user's host code
#else
ORACLE_CUTLASS_ENTRY(zoo_batched::Gemm)  // (4) oracle_launch
#endif

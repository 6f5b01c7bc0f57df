// blockwise.cu -- CUTLASS's own SM90 blockwise-scaled fp8 GEMM, written as CUTLASS's example 67
// (67_hopper_fp8_warp_specialized_gemm_with_groupwise_scaling.cu) writes it, brought to the oracle as a
// launch library (ABI "oracle/1"): e4m3 A [M, K] row-major x e4m3 B [K, N] column-major, A's scales per row
// and 128-deep k group (1 x 128, stored M-major: [K / 128, M] in memory), B's per 128 x 128 block (stored
// K-major: [N / 128, K / 128]), each k-block's WGMMA sum promoted into the fp32 accumulator times
// sa[row] * sb[column block], D = alpha * acc + beta * C in bf16. 128 x 128 x 128 CTA tile, cluster 1 x 1,
// the cooperative schedule KernelTmaWarpSpecializedCooperativeFP8Blockwise (CUTLASS 4.2's name; alias
// ...FP8BlockScaledAccum), CUTLASS's ScaleConfig and its LayoutSFA / LayoutSFB, the persistent tile
// scheduler. Everything but the four marked lines is what a CUTLASS user writes with the CollectiveBuilder;
// the adapter fills the arguments (the quick route: ptr_SFA / layout_SFA and ptr_SFB / layout_SFB from the
// case's scales, the layouts from ScaleConfig::tile_atom_to_shape_SFA / _SFB as example 67 makes them).
//
// Planted defects (tests/zoo/manifest.json names the stage the oracle must name). Both live in the traced
// mainloop's loop (cutlass/sm90_blockwise.hpp's Mutation), so they are traced-build defects:
//   ZOO_BLOCKWISE_SCALE_B_HOISTED=1     B's scale registers read from the tile's first k-block only (the read
//                                       hoisted out of the k loop): every k-block applies k group 0's B
//                                       scale -> scale_b, k-block 1
//   ZOO_BLOCKWISE_SCALE_A_GROUP_ROWS=1  A's scale registers partitioned by the thread's index in its warp
//                                       group, not in the tile: the second consumer warp group (rows 64..127)
//                                       applies rows 0..63's scales -> scale_a, k-block 0

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "oracle_trace/cutlass.hpp"  // (1) the adapter

namespace zoo_blockwise {

using namespace cute;

using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using ElementC = cutlass::bfloat16_t;
using ElementD = cutlass::bfloat16_t;
using ElementAccumulator = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16-byte TMA alignment
constexpr int kAlignCD = 128 / cutlass::sizeof_bits<ElementC>::value;

using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _1, _1>;

// A: one scale per row and 128-deep k group; B: one per 128 x 128 block (example 67's groupwise scaling)
constexpr int ScaleGranularityM = 1;
constexpr int ScaleGranularityN = 128;
constexpr int ScaleGranularityK = 128;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<ScaleGranularityM, ScaleGranularityN, ScaleGranularityK,
                                                              cute::GMMA::Major::MN, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, ElementC, LayoutC, kAlignCD,
    ElementD, LayoutD, kAlignCD, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, kAlignAB, ElementB,
    cute::tuple<LayoutB, LayoutSFB>, kAlignAB, ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename BuiltEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;

#if defined(ZOO_BLOCKWISE_SCALE_B_HOISTED)
struct Mutation {  // the defect: B's scales read once per tile, before the k loop
  static constexpr bool scale_b_hoisted = true;
};
#elif defined(ZOO_BLOCKWISE_SCALE_A_GROUP_ROWS)
struct Mutation {  // the defect: A's scales partitioned by the warp group's thread index
  static constexpr bool scale_a_group_rows = true;
};
#else
using Mutation = oracle_trace::cutlass_sm90::NoMutation;
#endif
using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop, Mutation>;  // (2)
using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<BuiltEpilogue>;           // (3)

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

}  // namespace zoo_blockwise

ORACLE_CUTLASS_ENTRY(zoo_blockwise::Gemm)  // (4) oracle_launch

// grouped.cu -- CUTLASS's own SM90 grouped GEMM (pointer-array, CUTLASS's example 57: one GEMM per group of
// its own M, as a mixture of experts runs its experts), brought to the oracle as a launch library (ABI
// "oracle/1"): bf16 A [M_g, K] row-major x bf16 B [K, N] column-major per group, fp32 accumulate, D = alpha *
// acc + beta * C in bf16 (row-major), 128 x 128 x 64 CTA tile, cluster 1 x 1, KernelPtrArrayTmaWarpSpecialized
// Cooperative (or ...Pingpong: ZOO_GROUPED_PINGPONG) with CUTLASS's group tile scheduler. Everything but the
// four marked lines is what a CUTLASS user writes with the CollectiveBuilder (example 57's types: LayoutA *
// ..., GroupProblemShape); the host code is example 57's args_from_options: per-group problem sizes, pointers
// and strides in device memory.
//
// The oracle stores the groups one after the other (A [sum M_g, K], C and D [sum M_g, N], B [G, N, K] as a
// column-major B is stored), packed. The taps name the group, the tile within it and the k-block, so each
// group is judged as its own GEMM.
//
// Build switches (the case files set them as [kernel] defines):
//   ZOO_GROUPED_HOST=1   the host route: Gemm::Arguments come from the user's own make_arguments, entered
//                        through ORACLE_CUTLASS_HOST_ENTRY (default: ORACLE_CUTLASS_ENTRY, the adapter fills
//                        the group arrays itself)
//   ZOO_GROUPED_PINGPONG=1  example 57's ping-pong schedule (KernelPtrArrayTmaWarpSpecializedPingpong with
//                        PtrArrayTmaWarpSpecializedPingpong; its 128 x 128 tile, K of 128 bytes: 64 bf16; cluster
//                        1 x 1 as the cooperative variant's, where the example's ping-pong one is 2 x 1), the
//                        two consumer warp groups taking a CTA's tiles in turn; the kernel is given 2 SMs
//                        (hw_info.sm_count, by both routes) so that each of the 2 CTAs runs 5 of the case's 10
//                        tiles: in each CTA one warp group runs group 1's tile (0, 0) or (0, 1) while the other
//                        runs group 3's first tiles (on all SMs every CTA would get one tile, and the second warp
//                        group none)
//   ZOO_GROUPED_CLUSTER_2X1=1  a 2 x 1 cluster (B's tile multicast to both CTAs of a cluster), as example 57's
//                        cooperative kernel runs its groups: CUTLASS's group scheduler hands out whole clusters,
//                        so a group of one M tile (group 1, 72 rows) gets a second CTA past its rows, which
//                        loads a zero A tile and stores nothing (its taps are a padding CTA's)
// Planted defects in the user's host code (tests/zoo/manifest.json names the stage the oracle must name):
//   ZOO_GROUPED_HOST_B_OF_GROUP0=1       group 1 given group 0's B pointer (an expert's weights taken from
//                                        the wrong expert): descriptor_b, group 1
//   ZOO_GROUPED_HOST_A_OF_GROUP0=1       group 3 given group 0's A pointer (its token rows read from the first
//                                        group's, a per-group offset never added): descriptor_a, group 3
//   ZOO_GROUPED_HOST_ALPHA_TWICE_GROUP1=1  per-group alphas (the epilogue's alpha_ptr_array, example 57's
//                                        other branch) with group 1's alpha applied twice (alpha * alpha):
//                                        epilogue_alpha_beta, group 1

#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/device_memory.h"
#include "cutlass/util/packed_stride.hpp"
#include "oracle_trace/cutlass.hpp"  // (1) the adapter

namespace zoo_grouped {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using ElementA = cutlass::bfloat16_t;
using ElementB = cutlass::bfloat16_t;
using ElementC = cutlass::bfloat16_t;
using ElementD = cutlass::bfloat16_t;
using ElementAccumulator = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
constexpr int kAlign = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16-byte TMA alignment

using TileShape = Shape<_128, _128, _64>;
#if defined(ZOO_GROUPED_CLUSTER_2X1)
using ClusterShape = Shape<_2, _1, _1>;
#else
using ClusterShape = Shape<_1, _1, _1>;
#endif
#if defined(ZOO_GROUPED_PINGPONG)
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
constexpr int kSmCount = 2;  // each CTA runs several tiles, its two consumer warp groups in turn
#else
using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
constexpr int kSmCount = 0;  // 0: the device's
#endif

using BuiltEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, ElementC, LayoutC*,
    kAlign, ElementD, LayoutC*, kAlign, EpilogueSchedule,
    cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator>>::CollectiveOp;

using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlign, ElementB, LayoutB*, kAlign,
    ElementAccumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename BuiltEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop>;  // (2)
using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<BuiltEpilogue>;  // (3)

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

#if defined(ZOO_GROUPED_HOST)
using StrideA = typename Gemm::GemmKernel::InternalStrideA;
using StrideB = typename Gemm::GemmKernel::InternalStrideB;
using StrideC = typename Gemm::GemmKernel::InternalStrideC;
using StrideD = typename Gemm::GemmKernel::InternalStrideD;

// The user's device arrays (example 57 keeps them as globals): alive until the launch has run.
cutlass::DeviceAllocation<ProblemShape::UnderlyingProblemShape> problem_sizes;
std::vector<ProblemShape::UnderlyingProblemShape> problem_sizes_host;
cutlass::DeviceAllocation<const ElementA*> ptr_A;
cutlass::DeviceAllocation<const ElementB*> ptr_B;
cutlass::DeviceAllocation<const ElementC*> ptr_C;
cutlass::DeviceAllocation<ElementD*> ptr_D;
cutlass::DeviceAllocation<StrideA> stride_A;
cutlass::DeviceAllocation<StrideB> stride_B;
cutlass::DeviceAllocation<StrideC> stride_C;
cutlass::DeviceAllocation<StrideD> stride_D;
cutlass::DeviceAllocation<float> alpha_device;
cutlass::DeviceAllocation<const float*> alpha_ptrs;

// The user's own host code: the tokens of every expert one after the other in A, C and D (group_m[g] rows
// each), one packed [K, N] weight matrix per expert in B.
typename Gemm::Arguments make_arguments(int groups, const int* group_m, int n, int k, ElementA const* a,
                                        int64_t /*lda*/, ElementB const* b, int64_t /*ldb*/, ElementC const* c,
                                        int64_t /*ldc*/, ElementD* d, int64_t /*ldd*/, float alpha, float beta) {
  std::vector<const ElementA*> a_host(groups);
  std::vector<const ElementB*> b_host(groups);
  std::vector<const ElementC*> c_host(groups);
  std::vector<ElementD*> d_host(groups);
  std::vector<StrideA> sa(groups);
  std::vector<StrideB> sb(groups);
  std::vector<StrideC> sc(groups);
  std::vector<StrideD> sd(groups);
  problem_sizes_host.assign(groups, {});
  int64_t row = 0;
  for (int g = 0; g < groups; ++g) {
    const int m = group_m[g];
    problem_sizes_host[g] = {m, n, k};
    a_host[g] = a + row * k;
    b_host[g] = b + int64_t(g) * n * k;
    c_host[g] = c + row * n;
    d_host[g] = d + row * n;
    sa[g] = cutlass::make_cute_packed_stride(StrideA{}, {m, k, 1});
    sb[g] = cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1});
    sc[g] = cutlass::make_cute_packed_stride(StrideC{}, {m, n, 1});
    sd[g] = cutlass::make_cute_packed_stride(StrideD{}, {m, n, 1});
    row += m;
  }
#if defined(ZOO_GROUPED_HOST_B_OF_GROUP0)
  if (groups > 1) b_host[1] = b_host[0];  // the defect: group 1 multiplied by group 0's weights
#endif
#if defined(ZOO_GROUPED_HOST_A_OF_GROUP0)
  if (groups > 3) a_host[3] = a;  // the defect: group 3's rows read from where group 0's start
#endif
  problem_sizes.reset(groups);
  problem_sizes.copy_from_host(problem_sizes_host.data());
  ptr_A.reset(groups), ptr_A.copy_from_host(a_host.data());
  ptr_B.reset(groups), ptr_B.copy_from_host(b_host.data());
  ptr_C.reset(groups), ptr_C.copy_from_host(c_host.data());
  ptr_D.reset(groups), ptr_D.copy_from_host(d_host.data());
  stride_A.reset(groups), stride_A.copy_from_host(sa.data());
  stride_B.reset(groups), stride_B.copy_from_host(sb.data());
  stride_C.reset(groups), stride_C.copy_from_host(sc.data());
  stride_D.reset(groups), stride_D.copy_from_host(sd.data());

  typename Gemm::Arguments arguments;
  decltype(arguments.epilogue.thread) fusion_args;
#if defined(ZOO_GROUPED_HOST_ALPHA_TWICE_GROUP1)
  // one alpha per group (example 57's alpha_ptr_array branch)
  std::vector<float> alphas(groups, alpha);
  if (groups > 1) alphas[1] = alpha * alpha;  // the defect: group 1's alpha applied twice
  alpha_device.reset(groups), alpha_device.copy_from_host(alphas.data());
  std::vector<const float*> alpha_host(groups);
  for (int g = 0; g < groups; ++g) alpha_host[g] = alpha_device.get() + g;
  alpha_ptrs.reset(groups), alpha_ptrs.copy_from_host(alpha_host.data());
  fusion_args.alpha = 0;
  fusion_args.alpha_ptr_array = alpha_ptrs.get();
  fusion_args.dAlpha = {cute::_0{}, cute::_0{}, 1};
#else
  fusion_args.alpha = alpha;
  fusion_args.alpha_ptr_array = nullptr;
  fusion_args.dAlpha = {cute::_0{}, cute::_0{}, 0};
#endif
  fusion_args.beta = beta;
  fusion_args.alpha_ptr = nullptr;
  fusion_args.beta_ptr = nullptr;
  fusion_args.beta_ptr_array = nullptr;
  fusion_args.dBeta = {cute::_0{}, cute::_0{}, 0};

  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = 0;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw_info.device_id);
  if (kSmCount > 0) hw_info.sm_count = kSmCount;
  arguments = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                       {groups, problem_sizes.get(), problem_sizes_host.data()},
                                       {ptr_A.get(), stride_A.get(), ptr_B.get(), stride_B.get()},
                                       {fusion_args, ptr_C.get(), stride_C.get(), ptr_D.get(), stride_D.get()},
                                       hw_info};
  return arguments;
}
#elif defined(ZOO_GROUPED_PINGPONG)
// The quick route's arguments given the ping-pong variant's SM count.
int set_sm_count(const oracle_trace::LaunchArgs*, typename Gemm::Arguments& arguments) {
  arguments.hw_info.sm_count = kSmCount;
  return 0;
}
#endif

}  // namespace zoo_grouped

#if defined(ZOO_GROUPED_HOST)
ORACLE_CUTLASS_HOST_ENTRY(zoo_grouped::Gemm, zoo_grouped::make_arguments)  // (4) oracle_launch, the user's host code
#elif defined(ZOO_GROUPED_PINGPONG)
ORACLE_CUTLASS_ENTRY_WITH(zoo_grouped::Gemm, zoo_grouped::set_sm_count)  // (4) oracle_launch, 2 SMs
#else
ORACLE_CUTLASS_ENTRY(zoo_grouped::Gemm)  // (4) oracle_launch
#endif

// deepgemm_sm90.cu -- the bug zoo's DeepGEMM-style fp8 "1d2d" block-scaled GEMM for sm_90a: A's
// per-row 1 x gk scales and B's 128 x gk block scales, each scale group's WGMMA sum promoted into the
// fp32 accumulator times sa[row] * sb[block]; the planted defects re-enact six scale-indexing bugs of
// public kernels (docs/scales.md).
//
//   D = bf16(alpha * sum_g fp32(A_g @ B_g) * fp32(sa[m][g] * sb[n / 128][g]))
//
// The kernel:
//   tiles        64 x 128 x 128 (BM x BN x BK).
//   order        one CTA per tile (and split): block index pid -> tile in a grouped order, GROUP_M = 2
//                tiles along M a group, then the next column (oracle/run/scale_model.py launch_order):
//                  per = 2 * tiles_n; first = (pid / per) * 2; size = min(tiles_m - first, 2)
//                  tm = first + (pid % per) % size;  tn = (pid % per) / size
//                so that the block index is not the tile coordinate.
//   descriptor   two TMA tensor maps built by the host: A [M, K], B [N, K], both K-major, boxes (128, 64) / (128, 128),
//                128-byte swizzle, zero OOB fill (the hopper_gemm kernel's loading, its slot layouts:
//                ../hopper_gemm/hopper_layout.cuh).
//   load         a 4-slot ring; warpgroup 0, one thread, produces: per k-block it writes B's scales of
//                the k-block into the slot's shared-memory scale words, then arms the slot's full
//                barrier (its arrive releases them) and issues the two TMA loads. Warpgroup 1 consumes.
//   scales       A's: read from global memory by each consumer thread for the rows it holds, stored
//                MN-major as DeepGEMM keeps them: [G, M], G = cdiv(K, gk) (scale_a.major = "col").
//                B's: [cdiv(N, 128), G] row-major, through shared memory (above).
//   mma          per scale group of the k-block (S = 128 / gk: 1 or 2), WGMMA into a zeroed fp32
//                fragment over the group's k (SS, one CuTe atom 64 x 128 x 32: the tile's 64 rows),
//                wgmma.wait 0, then promotion: acc = fp32(acc + fp32(part * fp32(sa * sb))).
//   split-K      (the _splitk entries) grid z = splits; split s runs k-blocks [s * c, min(KB, (s + 1) * c)),
//                c = cdiv(KB, splits), from a zeroed accumulator into the workspace; the last split to
//                arrive at the tile's counter sums the partials in order 0, 1, ... and runs the epilogue.
//   epilogue     alpha * v (fp32), round to bf16, store row-major masked to M x N.
//
// Entry points (extern "C", <name>[_traced]):
//   void zoo_dg_e4m3[_g64](const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
//                          bf16* D, const float* scale_a, const float* scale_b, int M, int N, int K, int ldd,
//                          float alpha, unsigned tx_bytes)
//   void zoo_dg_e4m3_splitk(..., unsigned tx_bytes, float* partials, int* counters)
//       partials: tiles x splits x 64 x 128 fp32; counters: tiles ints, zero before the launch
//   zoo_dg_e4m3         1 x 128 / 128 x 128 scales (S = 1)
//   zoo_dg_e4m3_g64     1 x 64 / 128 x 64 scales: two scale groups per 128-deep k-block (S = 2)
//   zoo_dg_e4m3_splitk  1 x 128 / 128 x 128 scales, split-K
//   tx_bytes: (BM + BN) * 128 = 24576, the bytes of one k-block's two boxes.
// Launch: block (256, 1, 1), grid (tiles, 1, splits); dynamic shared memory at least
// sizeof(SharedStorage) + 1024 = 100352 bytes (less traps).
//
// Taps of the traced entry points (Site partial = the split where split, else none):
//   load_a   [64, 128]   the A tile through the layout the MMAs read it with
//   load_b   [128, 128]  the B tile, logical (k, n)
//   scale_a  [64, S]     the scale each row of A's tile got per scale group (the registers applied)
//   scale_b  [128, S]    the scale each column of B's tile got (the register read from shared memory)
//   mma      [64, 128] fp32   the accumulator after the k-block's promotion
//   reduce   [64, 128] fp32   (split-K) the partials summed
//   epilogue_alpha_beta fp32, epilogue_cast bf16
//
// Planted defects (a define each, ZOO_DG_<NAME>; the stage the oracle must name):
//   SCALE_B_REUSED          the B-scale register is reused across M waves: from tile row 1 on it holds
//                           A's scale of the tile's first row, so A's scale is applied twice  -> scale_b
//   SCALE_SPLIT_SLICE0      every split-K slice uses slice 0's scales (k-block kb - kb0)      -> scale_a
//   SCALE_RAW_BLOCK_INDEX   A's scale rows come from the raw block index (pid / tiles_n), not the
//                           grouped tile coordinate                                             -> scale_a
//   SCALE_TRAILING_SKIPPED  the trailing scale group is skipped by a strict '<': the register keeps
//                           the one before                                                      -> scale_a
//   SCALE_ONE_PER_K_BLOCK   (g64) one scale is loaded per k-block for both of its groups        -> scale_a
//   SCALE_MAP_GROUP_SIZE    A's scales are bounded by the group size where the scale count (M)
//                           belonged: rows past gk read zero                                    -> scale_a
// Build: nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cubin --expt-relaxed-constexpr
//        -I harness/include -I <cutlass>/include [-DORACLE_TRACE] [-DZOO_DG_<NAME>=1]

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "oracle_trace/scales.cuh"
#include "oracle_trace/trace.cuh"
#include "../common/tma_ring.cuh"
#include "../hopper_gemm/hopper_layout.cuh"

#ifndef ZOO_DG_SCALE_B_REUSED
#define ZOO_DG_SCALE_B_REUSED 0
#endif
#ifndef ZOO_DG_SCALE_SPLIT_SLICE0
#define ZOO_DG_SCALE_SPLIT_SLICE0 0
#endif
#ifndef ZOO_DG_SCALE_RAW_BLOCK_INDEX
#define ZOO_DG_SCALE_RAW_BLOCK_INDEX 0
#endif
#ifndef ZOO_DG_SCALE_TRAILING_SKIPPED
#define ZOO_DG_SCALE_TRAILING_SKIPPED 0
#endif
#ifndef ZOO_DG_SCALE_ONE_PER_K_BLOCK
#define ZOO_DG_SCALE_ONE_PER_K_BLOCK 0
#endif
#ifndef ZOO_DG_SCALE_MAP_GROUP_SIZE
#define ZOO_DG_SCALE_MAP_GROUP_SIZE 0
#endif

namespace zoo_dg {
using namespace cute;
using T = float_e4m3_t;

// 64-row tiles (one warpgroup, one 64 x 128 WGMMA atom): the k-block's sum and the accumulator, 64
// registers each, fit beside each other without spilling
constexpr int kBM = 64, kBN = 128, kBK = 128, kStages = 4, kGroupM = 2;
constexpr int kStageA = kBM * kBK, kStageB = kBN * kBK;  // elements of one slot

template <int S_, bool Split_>
struct Config {
  static constexpr int kS = S_;          // scale groups per k-block
  static constexpr int kGk = kBK / S_;   // k of one scale group
  static constexpr bool kSplit = Split_;
  using TileShape = Shape<Int<kBM>, Int<kBN>, Int<kBK>>;
  using MmaOp = decltype(GMMA::ss_op_selector<T, T, float, TileShape, GMMA::Major::K, GMMA::Major::K>());
  using TiledMma = decltype(make_tiled_mma(MmaOp{}));
  // the slots as a 128-byte-swizzled TMA box writes them (hopper_gemm's K-major layout, its test)
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kBM>, Int<kBK>, Int<kStages>>{}));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{}, Shape<Int<kBN>, Int<kBK>, Int<kStages>>{}));
};

template <int S>
struct SharedStorage {
  alignas(1024) T a[kStageA * kStages];
  alignas(1024) T b[kStageB * kStages];
  alignas(16) float sb[kStages][S];  // B's scales of the slot's k-block, one per group
  alignas(8) uint64_t full[kStages];
  alignas(8) uint64_t empty[kStages];
  int last;                          // split-K: this CTA arrived last at its tile
};

struct Params {
  __nv_bfloat16* D;
  const float* scale_a;  // [G, M]
  const float* scale_b;  // [cdiv(N, 128), G]
  int M, N, K, ldd;
  float alpha;
  uint32_t tx_bytes;
  float* partials;
  int* counters;
};

// The tile of block index pid in the grouped launch order.
__device__ __forceinline__ void tile_of(int pid, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per = kGroupM * tiles_n, first = (pid / per) * kGroupM, size = min(tiles_m - first, kGroupM);
  tm = first + (pid % per) % size;
  tn = (pid % per) / size;
}

// The scale group applied to group j of k-block kb (kb0: the first k-block of this split), planted
// defects included; G groups along K.
template <int S>
__device__ __forceinline__ int scale_group(int kb, int j, int kb0, int G) {
  const int skb = ZOO_DG_SCALE_SPLIT_SLICE0 ? kb - kb0 : kb;  // slice 0's k-blocks
  const int jj = ZOO_DG_SCALE_ONE_PER_K_BLOCK ? 0 : j;        // one scale per k-block
  const int g = skb * S + jj;
  // `for (g = 0; g < G - 1; ++g) load`: the last group never loads, its register holds the first
  // group of the k-block before
  if (ZOO_DG_SCALE_TRAILING_SKIPPED && G >= 2 && g == G - 1) return ((G - 2) / S) * S;
  return min(g, G - 1);
}

// A's scale of global row gm, group g (rows past the map's row count read zero).
__device__ __forceinline__ float a_scale(const Params& p, int gm, int g, int gk) {
  const int rows = ZOO_DG_SCALE_MAP_GROUP_SIZE ? gk : p.M;  // the map's row count: gk where M belonged
  return gm < rows && gm < p.M ? p.scale_a[static_cast<size_t>(g) * p.M + gm] : 0.f;
}

template <class Cfg, bool Trace>
__device__ __forceinline__ void gemm(const CUtensorMap* tma_a, const CUtensorMap* tma_b, const Params& p) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Site;
  using oracle_trace::Stage;
  constexpr int S = Cfg::kS, Gk = Cfg::kGk;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  using Storage = SharedStorage<S>;

  extern __shared__ unsigned char smem_raw[];
  auto& s = zoo_tma::ring_storage<Storage>(smem_raw);

  const int tid = threadIdx.x, pid = blockIdx.x;
  const int tiles_m = (p.M + kBM - 1) / kBM, tiles_n = (p.N + kBN - 1) / kBN;
  const int k_blocks = (p.K + kBK - 1) / kBK, G = (p.K + Gk - 1) / Gk;
  int tm, tn;
  tile_of(pid, tiles_m, tiles_n, tm, tn);
  const int split = Cfg::kSplit ? blockIdx.z : 0, splits = Cfg::kSplit ? gridDim.z : 1;
  const int share = (k_blocks + splits - 1) / splits;
  const int kb0 = split * share, kb1 = min(k_blocks, kb0 + share);
  if (kb0 >= kb1) return;  // an empty share is no partial (the whole CTA leaves)
  const int partial = Cfg::kSplit ? split : oracle_trace::kNone;
  const int scale_tm = ZOO_DG_SCALE_RAW_BLOCK_INDEX ? pid / tiles_n : tm;  // the tile row of A's scales

  zoo_tma::init_ring(s.full, s.empty);

  if (tid < 128) {
    // -- producer: B's scales into the slot, then the two TMA loads ------------------------------
    if (tid != 0) return;
    for (int kb = kb0; kb < kb1; ++kb) {
      const int it = kb - kb0, slot = it % kStages, phase = (it / kStages) & 1;
      Barrier::wait(&s.empty[slot], phase ^ 1);
#pragma unroll
      for (int j = 0; j < S; ++j)
        s.sb[slot][j] = p.scale_b[static_cast<size_t>(tn) * G + scale_group<S>(kb, j, kb0, G)];
      // arming the slot's barrier releases the scale words
      zoo_tma::load_k_block<kStageA, kStageB>(tma_a, tma_b, s, slot, p.tx_bytes, kb * kBK, tm * kBM, tn * kBN);
    }
    return;
  }

  // -- consumer warpgroup -------------------------------------------------------------------------
  const int ct = tid - 128;
  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(ct);
  Tensor sA = make_tensor(make_smem_ptr(s.a), typename Cfg::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(s.b), typename Cfg::SmemLayoutB{});
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE)
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor cC = make_identity_tensor(Shape<Int<kBM>, Int<kBN>>{});
  Tensor tCcC = thr.partition_C(cC);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});
  Tensor part = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});
  constexpr int kAcc = decltype(size(acc))::value;
  constexpr int kK = decltype(size<2>(tCrA))::value;  // MMA k-steps of one k-block
  static_assert(kK % S == 0, "a scale group is a whole number of MMA k-steps");
  // 64 x 128 atoms over the tile's rows: ((2 cols, 2 rows 8 apart, 16 column groups), BM / 64, 1)
  static_assert(decltype(size<0, 0>(acc))::value == 2 && decltype(size<0, 1>(acc))::value == 2 &&
                    decltype(size<1>(acc))::value == kBM / 64 && decltype(size<2>(acc))::value == 1,
                "accumulator fragment ((2, 2, N / 8), BM / 64, 1)");
  constexpr int kNg = decltype(size<0, 2>(acc))::value, kMh = kBM / 64, kRows = 2 * kMh;
  mma.accumulate_ = GMMA::ScaleOut::One;
  auto row_of = [&](int i) { return static_cast<int>(get<0>(tCcC(i))); };
  auto col_of = [&](int i) { return static_cast<int>(get<1>(tCcC(i))); };
  // the row of the (r2, mh) rows this thread holds (the same for every column it holds)
  auto held_row = [&](int r2, int mh) {
    return static_cast<int>(get<0>(tCcC(make_coord(make_coord(0, r2, 0), mh, 0))));
  };
  const int m0 = tm * kBM, n0 = tn * kBN;

  clear(acc);
  for (int kb = kb0; kb < kb1; ++kb) {
    const int it = kb - kb0, slot = it % kStages, phase = (it / kStages) & 1;
    TxBarrier::wait(&s.full[slot], phase);
    const Site site{tm, tn, kb, oracle_trace::kNone, partial};

    if constexpr (Tr::enabled) {
      using TT = __nv_fp8_e4m3;
      const Site read{tm, tn, kb, slot, partial};
      const TT* a = reinterpret_cast<const TT*>(s.a);
      const TT* b = reinterpret_cast<const TT*>(s.b);
      Tr::tap_smem_tile(Stage::LoadA, read, a, kBM, kBK,
                        [&](int r, int c) { return zoo_hopper::element_offset(sA, s.a, r, c, slot); }, ct, 128);
      Tr::tap_smem_tile(Stage::LoadB, read, b, kBK, kBN,
                        [&](int r, int c) { return zoo_hopper::element_offset(sB, s.b, c, r, slot); }, ct, 128);
    }

    // the scales of this k-block: A's for the four rows this thread holds, B's from the slot
    float sa[S][2][kMh], sb[S];
#pragma unroll
    for (int j = 0; j < S; ++j) {
      const int g = scale_group<S>(kb, j, kb0, G);
#pragma unroll
      for (int mh = 0; mh < kMh; ++mh)
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) sa[j][r2][mh] = a_scale(p, scale_tm * kBM + held_row(r2, mh), g, Gk);
      sb[j] = s.sb[slot][j];
      // the B register reused: from the second M wave on it holds A's scale of the tile's first row
      if (ZOO_DG_SCALE_B_REUSED && tm >= 1) sb[j] = a_scale(p, scale_tm * kBM, g, Gk);
    }

    if constexpr (Tr::enabled) {
      // A's: the threads that hold column 0 (one per row); B's: those that hold row 0 (one per column)
      if (col_of(0) == 0)
        oracle_trace::scale_a<Trace>(site, kBM, S, S * kRows, [&](int i) {
          const int j = i / kRows, r2 = (i / kMh) % 2, mh = i % kMh;
          return Element<float>{held_row(r2, mh), j, sa[j][r2][mh]};
        });
      if (row_of(0) == 0)
        oracle_trace::scale_b<Trace>(site, kBN, S, S * kNg * 2, [&](int i) {
          const int j = i / (kNg * 2), c = i % (kNg * 2);
          const int col = static_cast<int>(get<1>(tCcC(make_coord(make_coord(c % 2, 0, c / 2), 0, 0))));
          return Element<float>{col, j, sb[j]};
        });
    }

#pragma unroll
    for (int j = 0; j < S; ++j) {
      clear(part);
      warpgroup_fence_operand(part);
      warpgroup_arrive();
#pragma unroll
      for (int kk = j * (kK / S); kk < (j + 1) * (kK / S); ++kk)
        cute::gemm(mma, tCrA(_, _, kk, slot), tCrB(_, _, kk, slot), part);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(part);
      // promotion: acc = fp32(acc + fp32(part * fp32(sa * sb)))
#pragma unroll
      for (int mh = 0; mh < kMh; ++mh)
#pragma unroll
        for (int r2 = 0; r2 < 2; ++r2) {
          const float scale = __fmul_rn(sa[j][r2][mh], sb[j]);
#pragma unroll
          for (int ng = 0; ng < kNg; ++ng)
#pragma unroll
            for (int c2 = 0; c2 < 2; ++c2) {
              const auto at = make_coord(make_coord(c2, r2, ng), mh, 0);
              acc(at) = __fadd_rn(acc(at), __fmul_rn(part(at), scale));
            }
        }
    }

    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Mma, site, kBM, kBN, kAcc,
                       [&](int i) { return Element<float>{row_of(i), col_of(i), static_cast<float>(acc(i))}; });
    }
    Barrier::arrive(&s.empty[slot]);
  }

  float v[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) v[i] = acc(i);

  if constexpr (Cfg::kSplit) {
    // publish the partial; the last split to arrive sums the tile's partials in order
    const int tile = tm * tiles_n + tn, parts = (k_blocks + share - 1) / share;
    float* ws = p.partials + static_cast<size_t>(tile) * splits * kBM * kBN;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ws[static_cast<size_t>(split) * kBM * kBN + row_of(i) * kBN + col_of(i)] = v[i];
    __threadfence();
    cutlass::arch::NamedBarrier::sync(128, 1);
    if (ct == 0) s.last = atomicAdd(p.counters + tile, 1) == parts - 1;
    cutlass::arch::NamedBarrier::sync(128, 1);
    if (!s.last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) v[i] = 0.f;
    for (int q = 0; q < parts; ++q) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i)
        v[i] = __fadd_rn(v[i], __ldcg(ws + static_cast<size_t>(q) * kBM * kBN + row_of(i) * kBN + col_of(i)));
    }
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Reduce, Site{tm, tn}, kBM, kBN, kAcc,
                       [&](int i) { return Element<float>{row_of(i), col_of(i), v[i]}; });
    }
    if (ct == 0) p.counters[tile] = 0;  // ready for the next launch
  }

  // -- epilogue ----------------------------------------------------------------------------------
#pragma unroll
  for (int i = 0; i < kAcc; ++i) v[i] = __fmul_rn(p.alpha, v[i]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueAlphaBeta, Site{tm, tn}, kBM, kBN, kAcc,
                     [&](int i) { return Element<float>{row_of(i), col_of(i), v[i]}; });
  }
  __nv_bfloat16 out[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) out[i] = __float2bfloat16_rn(v[i]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueCast, Site{tm, tn}, kBM, kBN, kAcc,
                     [&](int i) { return Element<__nv_bfloat16>{row_of(i), col_of(i), out[i]}; });
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int gm = m0 + row_of(i), gn = n0 + col_of(i);
    if (gm < p.M && gn < p.N) p.D[static_cast<size_t>(gm) * p.ldd + gn] = out[i];
  }
}

using Plain = Config<1, false>;
using G64 = Config<2, false>;
using SplitK = Config<1, true>;

}  // namespace zoo_dg

#define ZOO_DG_ENTRY(NAME, CFG, TRACE)                                                                        \
  extern "C" __global__ void __launch_bounds__(256, 1)                                                      \
      NAME(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,              \
           __nv_bfloat16* D, const float* scale_a, const float* scale_b, int M, int N, int K, int ldd,        \
           float alpha, unsigned tx_bytes) {                                                                  \
    const zoo_dg::Params p{D, scale_a, scale_b, M, N, K, ldd, alpha, tx_bytes, nullptr, nullptr};            \
    zoo_dg::gemm<zoo_dg::CFG, TRACE>(&tma_a, &tma_b, p);                                                     \
  }
#define ZOO_DG_SPLIT_ENTRY(NAME, CFG, TRACE)                                                                  \
  extern "C" __global__ void __launch_bounds__(256, 1)                                                      \
      NAME(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,              \
           __nv_bfloat16* D, const float* scale_a, const float* scale_b, int M, int N, int K, int ldd,        \
           float alpha, unsigned tx_bytes, float* partials, int* counters) {                                  \
    const zoo_dg::Params p{D, scale_a, scale_b, M, N, K, ldd, alpha, tx_bytes, partials, counters};          \
    zoo_dg::gemm<zoo_dg::CFG, TRACE>(&tma_a, &tma_b, p);                                                     \
  }

// Every build has the production entries; with ORACLE_TRACE, their _traced twins too.
#define ZOO_DG_ALL(SUFFIX, TRACE)                    \
  ZOO_DG_ENTRY(zoo_dg_e4m3##SUFFIX, Plain, TRACE)    \
  ZOO_DG_ENTRY(zoo_dg_e4m3_g64##SUFFIX, G64, TRACE)  \
  ZOO_DG_SPLIT_ENTRY(zoo_dg_e4m3_splitk##SUFFIX, SplitK, TRACE)

ZOO_DG_ALL(, false)
#if defined(ORACLE_TRACE)
ZOO_DG_ALL(_traced, true)
#endif

#undef ZOO_DG_ALL
#undef ZOO_DG_SPLIT_ENTRY
#undef ZOO_DG_ENTRY

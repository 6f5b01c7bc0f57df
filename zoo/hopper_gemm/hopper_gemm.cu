// hopper_gemm.cu -- the bug zoo's Hopper GEMM: TMA, an mbarrier pipeline, WGMMA and a persistent
// tile scheduler, written with CuTe; correct, and with planted defects, every variant instrumented
// with oracle_trace taps.
//
//   D = cast(act(alpha * scale(A @ B) + beta * C + bias))      (fp8 block scales act per k-block)
//
// The kernel:
//   descriptor   two TMA tensor maps built by the host (the case's [launch] table): A [M, K] and
//                B [N, K], both K-major, box (BK, BM) / (BK, BN), 128-byte swizzle, zero OOB fill.
//                One box per operand and k-block; BK * sizeof(T) = 128 bytes.
//   load         a 4-slot shared-memory ring (GMMA::Layout_K_SW128_Atom tiles, hopper_layout.cuh).
//                Warpgroup 0, one thread, is the producer: it waits for a slot to be empty, arms the slot's
//                full barrier with `tx_bytes` and issues the two TMA loads. Warpgroup 1 (128
//                threads) consumes: it waits on the full barrier, runs the MMAs and frees the slot.
//   mma          WGMMA (SS, fp32 accumulators in registers), one CuTe TiledMMA atom 64 x BN x k
//                repeated over the 128 rows of the tile; the k-block is finished (wgmma.wait 0)
//                before the slot is freed. fp8: each k-block accumulates into a fresh fragment
//                that is then added to the main accumulator, times the block scales if any
//                (the promotion every 128 k-elements that fp8 tensor cores need).
//   epilogue     per element in fp32, each sub-step on its own:
//                  scale       tensor: v * fp32(sa * sb); rowcol: v * sa[m] * sb[n]
//                  alpha_beta  alpha * v (+ beta * C[m][n] when beta != 0), two roundings
//                  bias        v + bias[n]
//                  activation  0 identity, 1 relu, 2 gelu (erf), 3 gelu (tanh)
//                  cast        round to nearest even into TOut (e4m3: saturating)
//   store        D[m][n] row-major, masked to M x N.
// Tiles BM x BN (BM = 128, BN = 128 or 16); tile t = (t / tiles_n, t % tiles_n); CTA b runs tiles
// b, b + gridDim.x, ... The accumulator is zeroed per tile.
//
// Entry points (extern "C", for cuLaunchKernel), <name>[_<defect>][_traced]:
//   void NAME(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
//             const bf16* C, TOut* D, const bf16* bias, const float* scale_a, const float* scale_b,
//             int M, int N, int K, int ldc, int ldd, float alpha, float beta, int activation,
//             unsigned tx_bytes)
//   zoo_hopper_bf16        bf16 x bf16 -> bf16, BN 128
//   zoo_hopper_bf16_n16    the same with BN 16 (a batch on the MMA's N side)
//   zoo_hopper_fp16        fp16 x fp16 -> bf16 (the correct twin of the fp16_acc defect)
//   zoo_hopper_e4m3_tensor e4m3 x e4m3 -> bf16, per-tensor scales scale_a[0], scale_b[0]
//   zoo_hopper_e4m3_rowcol e4m3 x e4m3 -> bf16, scale_a[M] per row, scale_b[N] per column
//   zoo_hopper_e4m3_block  e4m3 x e4m3 -> bf16, block scales scale_a [M, kbs] (1 x 128) and
//                          scale_b [cdiv(N, 128), kbs] (128 x 128), row-major, kbs = cdiv(K, 128)
//   zoo_hopper_e4m3_block_mn  the same with A's scales MN-major (DeepGEMM): stored [kbs, M]
//   zoo_hopper_e4m3_tensor_e4m3out  per-tensor scales, e4m3 output (saturating cast)
//   C (beta != 0) and bias may be null; C and D row-major with ldc, ldd >= N.
//   tx_bytes: the bytes the two TMA boxes of one k-block bring; the host computes it from the
//   boxes it encodes: (BM + BN) * 128 for these tiles (32768 for BN 128, 18432 for BN 16).
// Launch: block (256, 1, 1), any grid; dynamic shared memory at least sizeof(SharedStorage) + 1024
// (133120 bytes for BN 128, 75776 for BN 16; less traps); above 48 KiB, so the function's max
// dynamic shared size must be raised.
//
// Taps of the traced entry points (block_m = 128, block_n = BN, block_k = BK):
//   descriptor_a / _b  the slot's raw bytes after its full barrier (the TMA's image of k-block kb)
//   load_a   [128, BK]  the A tile through the layout the MMAs read it with, from the slot they read
//   load_b   [BK, BN]   the B tile likewise, logical (k, n)
//   mma      [128, BN] fp32   the accumulator after k-block kb, every element at its (row, col)
//   epilogue_scale (scaled variants), _alpha_beta, _bias, _activation  fp32;  epilogue_cast TOut
//
// Planted defects (template parameter; the stage the oracle must name):
//   stale_slot      the last k-block (of at least two) is read from the previous k-block's slot
//                                                                         -> load_a
//   transposed_a    the MMAs read A through an MN-major layout of the K-major slot -> load_a
//   kblock_twice    k-block 1 is multiplied into the accumulator twice    -> mma
//   no_reset        the accumulator is zeroed once per CTA, not per tile   -> mma
//   fp16_acc        (fp16) WGMMA with f16 accumulators where fp32 is declared -> mma
//   scale_twice     (e4m3 tensor) the per-tensor scale is applied twice  -> epilogue_scale
//   col_scale_row   (e4m3 rowcol) the per-column scale is indexed by the row -> epilogue_scale
//   bias_row        the bias is indexed by the row                         -> epilogue_bias
//   gelu_tanh       gelu with erf computed with the tanh approximation     -> epilogue_activation
//   cast_no_sat     (e4m3 out) the fp8 cast does not saturate: overflow gives NaN -> epilogue_cast
//   swapped_store   a tile (tm, tn), tm != tn, is stored at tile (tn, tm)  -> epilogue_store
//   scale_prev_kblock  (e4m3 block) from k-block 1 on, A's block scale is read for the k-block
//                   before (scale_a[m][kb - 1]): a scale read for the wrong block -> mma, k-block 1
//   block_scale_twice  (e4m3 block) each k-block's partial is multiplied by sa * sb twice
//                                                                         -> mma, k-block 0
//   skip_promotion  (e4m3 block) k-block 0's partial is not promoted: it stays in the WGMMA
//                   accumulator, k-block 1 accumulates on top of it and the sum of both is promoted
//                   once, with k-block 1's scales                          -> mma, k-block 0
// Descriptor defects live where descriptors are built, in the host's tensor maps (the case files
// under zoo/hopper_gemm/defects/): wrong leading dimension, a box narrower than the k-block, no
// swizzle for a swizzled layout, NaN out-of-bounds fill.
// Build: nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cubin --expt-relaxed-constexpr
//        -I harness/include -I <cutlass>/include [-DORACLE_TRACE]

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

#include "oracle_trace/trace.cuh"
#include "../common/activation.cuh"
#include "../common/tma_ring.cuh"
#include "hopper_layout.cuh"

namespace zoo_hopper {
using namespace cute;

enum Defect : int {
  kCorrect = 0,
  kStaleSlot,
  kTransposedA,
  kKBlockTwice,
  kNoReset,
  kFp16Acc,
  kScaleTwice,
  kColScaleRow,
  kBiasRow,
  kGeluTanh,
  kCastNoSat,
  kSwappedStore,
  kScalePrevKBlock,
  kBlockScaleTwice,
  kSkipPromotion,
};
// kBlockScaleMn: block scales with A's stored MN-major, [kbs, M] (DeepGEMM's layout)
enum ScaleMode : int { kNoScale = 0, kTensorScale, kRowColScale, kBlockScale, kBlockScaleMn };

// CuTe element types and the trace's value types (same bits).
template <class T>
struct TraceType;
template <>
struct TraceType<bfloat16_t> {
  using type = __nv_bfloat16;
  static constexpr oracle_trace::DType dtype = oracle_trace::DType::BF16;
};
template <>
struct TraceType<half_t> {
  using type = __half;
  static constexpr oracle_trace::DType dtype = oracle_trace::DType::F16;
};
template <>
struct TraceType<float_e4m3_t> {
  using type = __nv_fp8_e4m3;
  static constexpr oracle_trace::DType dtype = oracle_trace::DType::E4M3;
};

template <class T_, class TOut_, int BN, int Scale, int Defect_>
struct Config {
  using T = T_;
  using TOut = TOut_;
  static constexpr int kDefect = Defect_;
  static constexpr int kScale = Scale;
  static constexpr bool kFp8 = sizeof(T) == 1;
  static constexpr int kBM = 128, kBN = BN, kBK = 128 / static_cast<int>(sizeof(T)), kStages = 4;
  using TileShape = Shape<Int<kBM>, Int<kBN>, Int<kBK>>;
  using AccT = conditional_t<Defect_ == kFp16Acc, half_t, float>;
  static constexpr GMMA::Major kMajorA = Defect_ == kTransposedA ? GMMA::Major::MN : GMMA::Major::K;
  using MmaOp = decltype(GMMA::ss_op_selector<T, T, AccT, TileShape, kMajorA, GMMA::Major::K>());
  using TiledMma = decltype(make_tiled_mma(MmaOp{}));
  using Layouts = SmemLayouts<T, kBM, kBN, kBK, kStages, Defect_ == kTransposedA>;  // hopper_layout.cuh
  using SmemLayoutA = typename Layouts::A;
  using SmemLayoutB = typename Layouts::B;
  using SmemLayoutAMma = typename Layouts::AMma;
  static constexpr int kStageA = kBM * kBK, kStageB = kBN * kBK;
};

template <class Cfg>
struct SharedStorage {
  alignas(1024) typename Cfg::T a[Cfg::kStageA * Cfg::kStages];
  alignas(1024) typename Cfg::T b[Cfg::kStageB * Cfg::kStages];
  alignas(8) uint64_t full[Cfg::kStages];
  alignas(8) uint64_t empty[Cfg::kStages];
};

template <class TOut, int Defect>
__device__ __forceinline__ TOut to_out(float v) {
  if constexpr (std::is_same<TOut, __nv_bfloat16>::value) {
    return __float2bfloat16_rn(v);
  } else {
    __nv_fp8_e4m3 r;
    r.__x = __nv_cvt_float_to_fp8(v, Defect == kCastNoSat ? __NV_NOSAT : __NV_SATFINITE, __NV_E4M3);
    return r;
  }
}

struct Params {
  const __nv_bfloat16* C;
  void* D;
  const __nv_bfloat16* bias;
  const float* scale_a;
  const float* scale_b;
  int M, N, K, ldc, ldd;
  float alpha, beta;
  int activation;
  uint32_t tx_bytes;
};

template <class Cfg, bool Trace>
__device__ __forceinline__ void gemm(const CUtensorMap* tma_a, const CUtensorMap* tma_b, const Params& p) {
  using T = typename Cfg::T;
  using TT = typename TraceType<T>::type;
  using TOut = conditional_t<std::is_same<typename Cfg::TOut, float_e4m3_t>::value, __nv_fp8_e4m3, __nv_bfloat16>;
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Site;
  using oracle_trace::Stage;
  constexpr int BM = Cfg::kBM, BN = Cfg::kBN, BK = Cfg::kBK, S = Cfg::kStages, D = Cfg::kDefect;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;

  extern __shared__ unsigned char smem_raw[];
  auto& s = zoo_tma::ring_storage<SharedStorage<Cfg>>(smem_raw);

  const int tid = threadIdx.x;
  const int tiles_m = (p.M + BM - 1) / BM, tiles_n = (p.N + BN - 1) / BN, tiles = tiles_m * tiles_n;
  const int k_blocks = (p.K + BK - 1) / BK;

  zoo_tma::init_ring(s.full, s.empty);

  if (tid < 128) {
    // -- producer: one thread issues every TMA load ----------------------------------------
    if (tid != 0) return;
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int tm = tile / tiles_n, tn = tile % tiles_n;
      for (int kb = 0; kb < k_blocks; ++kb, ++it) {
        const int slot = it % S, phase = (it / S) & 1;
        Barrier::wait(&s.empty[slot], phase ^ 1);
        zoo_tma::load_k_block<Cfg::kStageA, Cfg::kStageB>(tma_a, tma_b, s, slot, p.tx_bytes, kb * BK, tm * BM, tn * BN);
      }
    }
    return;
  }

  // -- consumer warpgroup ---------------------------------------------------------------------
  const int ct = tid - 128;
  typename Cfg::TiledMma mma;
  auto thr = mma.get_thread_slice(ct);
  Tensor sA = make_tensor(make_smem_ptr(s.a), typename Cfg::SmemLayoutAMma{});
  Tensor sB = make_tensor(make_smem_ptr(s.b), typename Cfg::SmemLayoutB{});
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor cC = make_identity_tensor(Shape<Int<BM>, Int<BN>>{});
  Tensor tCcC = thr.partition_C(cC);  // (row, col) of every accumulator element of this thread
  Tensor acc = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});
  constexpr int kAcc = decltype(size(acc))::value;
  static_assert(kAcc == decltype(size(tCcC))::value, "one coordinate per accumulator element");
  mma.accumulate_ = GMMA::ScaleOut::One;

  auto row_of = [&](int i) { return static_cast<int>(get<0>(tCcC(i))); };
  auto col_of = [&](int i) { return static_cast<int>(get<1>(tCcC(i))); };

  if constexpr (D == kNoReset) clear(acc);
  Tensor part = partition_fragment_C(mma, Shape<Int<BM>, Int<BN>>{});  // fp8: one k-block's sum
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int tm = tile / tiles_n, tn = tile % tiles_n;
    const int m0 = tm * BM, n0 = tn * BN;
    if constexpr (D != kNoReset) clear(acc);

    for (int kb = 0; kb < k_blocks; ++kb, ++it) {
      const int slot = it % S, phase = (it / S) & 1;
      TxBarrier::wait(&s.full[slot], phase);
      int rs = slot;  // the slot the MMAs read
      if constexpr (D == kStaleSlot) {
        if (kb == k_blocks - 1 && kb > 0) rs = (it + S - 1) % S;
      }

      if constexpr (Tr::enabled) {
        const Site site{tm, tn, kb, slot};
        constexpr auto dt = TraceType<T>::dtype;
        Tr::tap_smem_bytes(Stage::DescriptorA, site, s.a + slot * Cfg::kStageA, Cfg::kStageA * sizeof(T), dt, BM, BK,
                           ct, 128);
        Tr::tap_smem_bytes(Stage::DescriptorB, site, s.b + slot * Cfg::kStageB, Cfg::kStageB * sizeof(T), dt, BK, BN,
                           ct, 128);
        const Site read{tm, tn, kb, rs};
        const TT* a = reinterpret_cast<const TT*>(s.a);
        const TT* b = reinterpret_cast<const TT*>(s.b);
        Tr::tap_smem_tile(Stage::LoadA, read, a, BM, BK, [&](int r, int c) { return element_offset(sA, s.a, r, c, rs); },
                          ct, 128);
        Tr::tap_smem_tile(Stage::LoadB, read, b, BK, BN, [&](int r, int c) { return element_offset(sB, s.b, c, r, rs); },
                          ct, 128);
      }

      if constexpr (Cfg::kFp8) {
        // promotion: this k-block's partial sum, then added to the fp32 accumulator
        // (skip_promotion: k-block 0's partial is neither promoted nor cleared; k-block 1 adds to it)
        const bool skip = D == kSkipPromotion && kb == 0 && k_blocks > 1;
        if (!(D == kSkipPromotion && kb == 1)) clear(part);
        warpgroup_fence_operand(part);
        warpgroup_arrive();
        gemm(mma, tCrA(_, _, _, rs), tCrB(_, _, _, rs), part);
        warpgroup_commit_batch();
        warpgroup_wait<0>();
        warpgroup_fence_operand(part);
        const int reps = skip ? 0 : (D == kKBlockTwice && kb == 1) ? 2 : 1;
        const int kb_a = (D == kScalePrevKBlock && kb > 0) ? kb - 1 : kb;  // the k-block of A's scale
#pragma unroll
        for (int i = 0; i < kAcc; ++i) {
          float q = part(i);
          if constexpr (Cfg::kScale == kBlockScale || Cfg::kScale == kBlockScaleMn) {
            const int gm = m0 + row_of(i), gn = n0 + col_of(i);
            const size_t at = Cfg::kScale == kBlockScaleMn ? static_cast<size_t>(kb_a) * p.M + gm
                                                           : static_cast<size_t>(gm) * k_blocks + kb_a;
            const float sa = gm < p.M ? p.scale_a[at] : 0.f;
            const float sb = gn < p.N ? p.scale_b[static_cast<size_t>(gn / 128) * k_blocks + kb] : 0.f;
            q = __fmul_rn(q, __fmul_rn(sa, sb));
            if constexpr (D == kBlockScaleTwice) q = __fmul_rn(q, __fmul_rn(sa, sb));
          }
          for (int r = 0; r < reps; ++r) acc(i) = __fadd_rn(acc(i), q);
        }
      } else {
        const int reps = (D == kKBlockTwice && kb == 1) ? 2 : 1;
        for (int r = 0; r < reps; ++r) {
          warpgroup_fence_operand(acc);
          warpgroup_arrive();
          gemm(mma, tCrA(_, _, _, rs), tCrB(_, _, _, rs), acc);
          warpgroup_commit_batch();
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc);
        }
      }

      if constexpr (Tr::enabled) {
        Tr::tap_elements(Stage::Mma, Site{tm, tn, kb}, BM, BN, kAcc, [&](int i) {
          return Element<float>{row_of(i), col_of(i), static_cast<float>(acc(i))};
        });
      }
      Barrier::arrive(&s.empty[slot]);  // the slot (and every tap of it) is done
    }

    // -- epilogue, one sub-step at a time so that each can be tapped ----------------------------
    float v[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) v[i] = static_cast<float>(acc(i));
    auto tap_step = [&](Stage stage) {
      if constexpr (Tr::enabled) {
        Tr::tap_elements(stage, Site{tm, tn}, BM, BN, kAcc,
                         [&](int i) { return Element<float>{row_of(i), col_of(i), v[i]}; });
      }
    };

    if constexpr (Cfg::kScale == kTensorScale) {
      const float ts = __fmul_rn(p.scale_a[0], p.scale_b[0]);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        v[i] = __fmul_rn(v[i], ts);
        if constexpr (D == kScaleTwice) v[i] = __fmul_rn(v[i], ts);
      }
      tap_step(Stage::EpilogueScale);
    } else if constexpr (Cfg::kScale == kRowColScale) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int gm = m0 + row_of(i), gn = n0 + col_of(i);
        const int at = D == kColScaleRow ? gm : gn;  // the defect: the column scale indexed by the row
        v[i] = __fmul_rn(v[i], gm < p.M ? p.scale_a[gm] : 0.f);
        v[i] = __fmul_rn(v[i], at < p.N ? p.scale_b[at] : 0.f);
      }
      tap_step(Stage::EpilogueScale);
    }

#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int gm = m0 + row_of(i), gn = n0 + col_of(i);
      float x = __fmul_rn(p.alpha, v[i]);
      if (p.beta != 0.f && gm < p.M && gn < p.N)
        x = __fadd_rn(x, __fmul_rn(p.beta, __bfloat162float(p.C[static_cast<size_t>(gm) * p.ldc + gn])));
      v[i] = x;
    }
    tap_step(Stage::EpilogueAlphaBeta);

    if (p.bias != nullptr) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int gm = m0 + row_of(i), gn = n0 + col_of(i);
        const int at = D == kBiasRow ? gm : gn;
        v[i] = __fadd_rn(v[i], at < p.N ? __bfloat162float(p.bias[at]) : 0.f);
      }
    }
    tap_step(Stage::EpilogueBias);

#pragma unroll
    for (int i = 0; i < kAcc; ++i) v[i] = zoo::activate<D == kGeluTanh>(v[i], p.activation);
    tap_step(Stage::EpilogueActivation);

    TOut out[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) out[i] = to_out<TOut, D>(v[i]);
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::EpilogueCast, Site{tm, tn}, BM, BN, kAcc,
                       [&](int i) { return Element<TOut>{row_of(i), col_of(i), out[i]}; });
    }

    int dm0 = m0, dn0 = n0;
    if constexpr (D == kSwappedStore) {
      if (tm != tn && tn < tiles_m && tm < tiles_n) {
        dm0 = tn * BM;
        dn0 = tm * BN;
      }
    }
    TOut* dst = static_cast<TOut*>(p.D);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int gm = dm0 + row_of(i), gn = dn0 + col_of(i);
      if (gm < p.M && gn < p.N) dst[static_cast<size_t>(gm) * p.ldd + gn] = out[i];
    }
  }
}

}  // namespace zoo_hopper

#define ZOO_HOPPER_ENTRY(NAME, CFG, TRACE)                                                                    \
  extern "C" __global__ void __launch_bounds__(256, 1)                                                      \
      NAME(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,              \
           const __nv_bfloat16* C, void* D, const __nv_bfloat16* bias, const float* scale_a,                  \
           const float* scale_b, int M, int N, int K, int ldc, int ldd, float alpha, float beta,              \
           int activation, unsigned tx_bytes) {                                                               \
    const zoo_hopper::Params p{C,   D,   bias, scale_a, scale_b, M,          N,       K,                       \
                               ldc, ldd, alpha, beta,   activation, tx_bytes};                                 \
    zoo_hopper::gemm<zoo_hopper::CFG, TRACE>(&tma_a, &tma_b, p);                                               \
  }

namespace zoo_hopper {
using bf16 = bfloat16_t;
using e4m3 = float_e4m3_t;
// name                          operands  output  BN   scale         defect
using Bf16 = Config<bf16, bf16, 128, kNoScale, kCorrect>;
using Bf16N16 = Config<bf16, bf16, 16, kNoScale, kCorrect>;
using E4m3Tensor = Config<e4m3, bf16, 128, kTensorScale, kCorrect>;
using E4m3RowCol = Config<e4m3, bf16, 128, kRowColScale, kCorrect>;
using E4m3Block = Config<e4m3, bf16, 128, kBlockScale, kCorrect>;
using E4m3BlockMn = Config<e4m3, bf16, 128, kBlockScaleMn, kCorrect>;
using E4m3TensorE4m3 = Config<e4m3, e4m3, 128, kTensorScale, kCorrect>;
using Bf16StaleSlot = Config<bf16, bf16, 128, kNoScale, kStaleSlot>;
using Bf16TransposedA = Config<bf16, bf16, 128, kNoScale, kTransposedA>;
using Bf16KBlockTwice = Config<bf16, bf16, 128, kNoScale, kKBlockTwice>;
using Bf16NoReset = Config<bf16, bf16, 128, kNoScale, kNoReset>;
using Fp16Fp16Acc = Config<half_t, bf16, 128, kNoScale, kFp16Acc>;
using E4m3TensorScaleTwice = Config<e4m3, bf16, 128, kTensorScale, kScaleTwice>;
using E4m3RowColColScaleRow = Config<e4m3, bf16, 128, kRowColScale, kColScaleRow>;
using Bf16BiasRow = Config<bf16, bf16, 128, kNoScale, kBiasRow>;
using Bf16GeluTanh = Config<bf16, bf16, 128, kNoScale, kGeluTanh>;
using E4m3TensorE4m3CastNoSat = Config<e4m3, e4m3, 128, kTensorScale, kCastNoSat>;
using Bf16SwappedStore = Config<bf16, bf16, 128, kNoScale, kSwappedStore>;
using Fp16 = Config<half_t, bf16, 128, kNoScale, kCorrect>;
using E4m3BlockScalePrevKBlock = Config<e4m3, bf16, 128, kBlockScale, kScalePrevKBlock>;
using E4m3BlockScaleTwice = Config<e4m3, bf16, 128, kBlockScale, kBlockScaleTwice>;
using E4m3BlockSkipPromotion = Config<e4m3, bf16, 128, kBlockScale, kSkipPromotion>;
}  // namespace zoo_hopper

// The variants, one list. Without ORACLE_TRACE every variant is built untraced; with it every
// variant is built traced and only the correct ones also untraced (their production names).
#define ZOO_HOPPER_CORRECT(X, SUFFIX, TRACE)                      \
  X(zoo_hopper_bf16##SUFFIX, Bf16, TRACE)                         \
  X(zoo_hopper_bf16_n16##SUFFIX, Bf16N16, TRACE)                  \
  X(zoo_hopper_fp16##SUFFIX, Fp16, TRACE)                         \
  X(zoo_hopper_e4m3_tensor##SUFFIX, E4m3Tensor, TRACE)            \
  X(zoo_hopper_e4m3_rowcol##SUFFIX, E4m3RowCol, TRACE)            \
  X(zoo_hopper_e4m3_block##SUFFIX, E4m3Block, TRACE)              \
  X(zoo_hopper_e4m3_block_mn##SUFFIX, E4m3BlockMn, TRACE)         \
  X(zoo_hopper_e4m3_tensor_e4m3out##SUFFIX, E4m3TensorE4m3, TRACE)
#define ZOO_HOPPER_DEFECTIVE(X, SUFFIX, TRACE)                                          \
  X(zoo_hopper_bf16_stale_slot##SUFFIX, Bf16StaleSlot, TRACE)                           \
  X(zoo_hopper_bf16_transposed_a##SUFFIX, Bf16TransposedA, TRACE)                       \
  X(zoo_hopper_bf16_kblock_twice##SUFFIX, Bf16KBlockTwice, TRACE)                       \
  X(zoo_hopper_bf16_no_reset##SUFFIX, Bf16NoReset, TRACE)                               \
  X(zoo_hopper_fp16_fp16_acc##SUFFIX, Fp16Fp16Acc, TRACE)                               \
  X(zoo_hopper_e4m3_tensor_scale_twice##SUFFIX, E4m3TensorScaleTwice, TRACE)            \
  X(zoo_hopper_e4m3_rowcol_col_scale_row##SUFFIX, E4m3RowColColScaleRow, TRACE)         \
  X(zoo_hopper_bf16_bias_row##SUFFIX, Bf16BiasRow, TRACE)                               \
  X(zoo_hopper_bf16_gelu_tanh##SUFFIX, Bf16GeluTanh, TRACE)                             \
  X(zoo_hopper_e4m3_tensor_e4m3out_cast_no_sat##SUFFIX, E4m3TensorE4m3CastNoSat, TRACE) \
  X(zoo_hopper_bf16_swapped_store##SUFFIX, Bf16SwappedStore, TRACE)                     \
  X(zoo_hopper_e4m3_block_scale_prev_kblock##SUFFIX, E4m3BlockScalePrevKBlock, TRACE)   \
  X(zoo_hopper_e4m3_block_scale_twice##SUFFIX, E4m3BlockScaleTwice, TRACE)             \
  X(zoo_hopper_e4m3_block_skip_promotion##SUFFIX, E4m3BlockSkipPromotion, TRACE)

ZOO_HOPPER_CORRECT(ZOO_HOPPER_ENTRY, , false)
#if defined(ORACLE_TRACE)
ZOO_HOPPER_CORRECT(ZOO_HOPPER_ENTRY, _traced, true)
ZOO_HOPPER_DEFECTIVE(ZOO_HOPPER_ENTRY, _traced, true)
#else
ZOO_HOPPER_DEFECTIVE(ZOO_HOPPER_ENTRY, , false)
#endif

#undef ZOO_HOPPER_CORRECT
#undef ZOO_HOPPER_DEFECTIVE
#undef ZOO_HOPPER_ENTRY

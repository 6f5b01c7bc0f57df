// mx_sm80.cu -- the bug zoo's OCP MXFP8 block-scaled GEMM, emulated on Hopper the way Blackwell's
// block-scaled formats must be here: every 32-wide K block of A and B is dequantised with its own
// ue8m0 scale into bf16 before an ordinary mma.sync; the planted defects re-enact six
// scale-indexing bugs of public kernels (docs/scales.md), each named at scale_a or scale_b.
//
//   D = bf16(alpha * sum_k bf16(a[m][k] * sa[m][k / 32]) * bf16(b[k][n] * sb[n][k / 32]))
//
// The kernel:
//   elements     e4m3 (float8_e4m3fn) A [M, K] and B [N, K], both K contiguous (lda, ldb >= K, multiples
//                of 16, the buffers 16-byte aligned: whole cp.async chunks).
//   scales       ue8m0 bytes, one per 1 x 32 block along K of a row of A (a column of B), row-major
//                scale_a [M, G] and scale_b [N, G], G = cdiv(K, 32); a byte e is 2^(e - 127) (0: 2^-127,
//                an fp32 subnormal; 255: NaN).
//   tiles        64 x 64 x 64 (BM x BN x BK): two 32-wide scale groups per k-block (S = 2). One CTA per
//                tile (and split), in a grouped launch order (GROUP_M = 2 tiles along M a group, then the
//                next column; oracle/run/scale_model.py launch_order), so the block index is not the tile:
//                  per = 2 * tiles_n; first = (pid / per) * 2; size = min(tiles_m - first, 2)
//                  tm = first + (pid % per) % size;  tn = (pid % per) / size
//   load         cp.async.cg 16-byte chunks into a 2-slot ring of fp8 tiles (A [64 m][64 k], B [64 n][64 k]),
//                zero-filled past M, N and K; k-block kb + 1 is copied while kb is dequantised and multiplied.
//   dequant      128 threads; thread t owns row t / 2 of A's tile and column t / 2 of B's, scale group
//                j = t % 2 of the k-block: it reads the two scale bytes (global group g = kb * 2 + j,
//                clamped to G - 1; rows past M, columns past N get 0), decodes them into its registers
//                sa, sb and writes its 32 elements as bf16(fp32(x) * s) into the bf16 tiles (exact where
//                the product is a normal bf16: e4m3 has 3 mantissa bits, bf16 7).
//   mma          4 warps as 2 x 2, each 32 x 32 = 2 x 4 mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, four
//                k16 steps per k-block (ldmatrix.x4, no .trans: both bf16 tiles are k contiguous), fp32
//                accumulators zeroed per tile (per split).
//   split-K      (zoo_mx_e4m3_splitk) grid z = splits; split s runs k-blocks [s * c, min(KB, (s + 1) * c)),
//                c = cdiv(KB, splits), from zero into the workspace; the last split to arrive at the tile's
//                counter sums the partials in order 0, 1, ... and runs the epilogue.
//   epilogue     alpha * v (fp32), round to bf16, store row-major masked to M x N.
//
// Entry points (extern "C", <name>[_traced]):
//   void zoo_mx_e4m3(const uint8_t* A, const uint8_t* B, bf16* D, const uint8_t* scale_a, const uint8_t* scale_b,
//                    int M, int N, int K, int lda, int ldb, int ldd, float alpha)
//   void zoo_mx_e4m3_splitk(..., float alpha, float* partials, int* counters)
//       partials: tiles x splits x 64 x 64 fp32; counters: tiles ints, zero before the launch
// Launch: block (128, 1, 1), grid (tiles, 1, splits); static shared memory only (34832 bytes).
//
// Taps of the traced entry points (Site partial = the split where split, else none):
//   load_a   [64, 64] e4m3    the fp8 A tile of the slot, (m, k)
//   load_b   [64, 64] e4m3    the fp8 B tile of the slot, logical (k, n)
//   scale_a  [64, 2]          the scale register each row of A's tile was dequantised with, per group
//   scale_b  [64, 2]          the scale register each column of B's tile was dequantised with
//   mma      [64, 64] fp32    the accumulator after the k-block's four MMAs
//   reduce   [64, 64] fp32    (split-K) the partials summed
//   epilogue_alpha_beta fp32, epilogue_cast bf16
//
// Planted defects (a define each, ZOO_MX_<NAME>; the stage the oracle must name):
//   SCALE_B_REUSED          B's scale is loaded on the first M wave only (tile row 0); later waves reuse the
//                           register, which holds this thread's A scale (row c of the tile for column c):
//                           A's scale applied twice                                             -> scale_b
//   SCALE_SPLIT_SLICE0      every split-K slice uses slice 0's scales (k-block kb - kb0)        -> scale_a
//   SCALE_RAW_BLOCK_INDEX   A's scale rows come from the raw block index (pid / tiles_n), not the
//                           grouped tile coordinate                                             -> scale_a
//   SCALE_TRAILING_SKIPPED  a scale is loaded only while g < G - 1 (a strict '<' where g < G belonged):
//                           the trailing group's registers keep the group of the k-block before -> scale_a
//   SCALE_ONE_PER_K_BLOCK   one scale per 64-deep k-block: both 32-wide groups read group kb * 2 -> scale_a
//   SCALE_MAP_GROUP_SIZE    A's scale rows are bounded by the group size (32) where the scale count (M)
//                           belonged: rows 32 and on read zero                                  -> scale_a
// Build: nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include [-DORACLE_TRACE]
//        [-DZOO_MX_<NAME>=1]

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "oracle_trace/scales.cuh"
#include "oracle_trace/trace.cuh"

#ifndef ZOO_MX_SCALE_B_REUSED
#define ZOO_MX_SCALE_B_REUSED 0
#endif
#ifndef ZOO_MX_SCALE_SPLIT_SLICE0
#define ZOO_MX_SCALE_SPLIT_SLICE0 0
#endif
#ifndef ZOO_MX_SCALE_RAW_BLOCK_INDEX
#define ZOO_MX_SCALE_RAW_BLOCK_INDEX 0
#endif
#ifndef ZOO_MX_SCALE_TRAILING_SKIPPED
#define ZOO_MX_SCALE_TRAILING_SKIPPED 0
#endif
#ifndef ZOO_MX_SCALE_ONE_PER_K_BLOCK
#define ZOO_MX_SCALE_ONE_PER_K_BLOCK 0
#endif
#ifndef ZOO_MX_SCALE_MAP_GROUP_SIZE
#define ZOO_MX_SCALE_MAP_GROUP_SIZE 0
#endif

namespace zoo_mx {

constexpr int kBM = 64, kBN = 64, kBK = 64, kGroup = 32, kS = kBK / kGroup, kGroupM = 2;
constexpr int kThreads = 128, kWarpM = 32, kWarpN = 32;
constexpr int kChunks = kBK / 16;          // 16-byte chunks of one tile row
constexpr int kPitch = kBK + 8;            // bf16 tile row pitch: 144 bytes, ldmatrix rows in distinct banks
constexpr int kAcc = (kWarpM / 16) * (kWarpN / 8) * 4;  // 32 accumulators a thread
static_assert(kBM * kS == kThreads && kBN * kS == kThreads, "one thread per (row, scale group)");
static_assert(kBM * kChunks % kThreads == 0, "copy split");

struct Shared {
  alignas(16) uint8_t a[2][kBM * kBK];        // fp8 ring, (m, k)
  alignas(16) uint8_t b[2][kBN * kBK];        // (n, k)
  alignas(16) __nv_bfloat16 da[kBM * kPitch];  // dequantised, (m, k)
  alignas(16) __nv_bfloat16 db[kBN * kPitch];  // (n, k)
  int last;                                    // split-K: this CTA arrived last at its tile
};

struct Params {
  const uint8_t* A;
  const uint8_t* B;
  __nv_bfloat16* D;
  const uint8_t* scale_a;  // [M, G]
  const uint8_t* scale_b;  // [N, G]
  int M, N, K, lda, ldb, ldd;
  float alpha;
  float* partials;
  int* counters;
};

// -- PTX -------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared; src_bytes < 16 zero-fills the rest (0: nothing is read).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
// D = A x B + D, m16n8k16, bf16 operands, fp32 accumulators
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// -- indices -----------------------------------------------------------------------------------------
// The tile of block index pid in the grouped launch order.
__device__ __forceinline__ void tile_of(int pid, int tiles_m, int tiles_n, int& tm, int& tn) {
  const int per = kGroupM * tiles_n, first = (pid / per) * kGroupM, size = min(tiles_m - first, kGroupM);
  tm = first + (pid % per) % size;
  tn = (pid % per) / size;
}

// ue8m0: 2^(e - 127); e = 0 is the fp32 subnormal 2^-127, 255 NaN.
__device__ __forceinline__ float e8m0(uint8_t e) {
  return __uint_as_float(e == 255 ? 0x7fc00000u : e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23);
}

// The global scale group of group j of k-block kb (kb0: this split's first k-block), defects included.
__device__ __forceinline__ int scale_group(int kb, int j, int kb0) {
  const int skb = ZOO_MX_SCALE_SPLIT_SLICE0 ? kb - kb0 : kb;  // slice 0's k-blocks
  return skb * kS + (ZOO_MX_SCALE_ONE_PER_K_BLOCK ? 0 : j);    // one scale per k-block
}

// The scale of row (column) `row` of an operand with `rows` of them, group g of G; 0 past the rows.
__device__ __forceinline__ float scale_of(const uint8_t* scales, int row, int rows, int bound, int g, int G) {
  return row < bound && row < rows ? e8m0(scales[static_cast<size_t>(row) * G + min(g, G - 1)]) : 0.f;
}

// One k-block of A and B into ring slot `slot`: 2 x 128 chunks of each, zero past M, N and K.
__device__ __forceinline__ void load_k_block(Shared& s, const Params& p, int slot, int kb, int m0, int n0, int tid) {
#pragma unroll
  for (int i = 0; i < kBM * kChunks / kThreads; ++i) {
    const int q = tid + i * kThreads, r = q / kChunks, c = q % kChunks, k = kb * kBK + c * 16;
    const int ka = r + m0 < p.M ? min(max(p.K - k, 0), 16) : 0;
    const int kbytes = r + n0 < p.N ? min(max(p.K - k, 0), 16) : 0;
    cp_async_16(&s.a[slot][r * kBK + c * 16], ka ? p.A + static_cast<size_t>(m0 + r) * p.lda + k : p.A, ka);
    cp_async_16(&s.b[slot][r * kBK + c * 16], kbytes ? p.B + static_cast<size_t>(n0 + r) * p.ldb + k : p.B, kbytes);
  }
  cp_async_commit();
}

// 32 fp8 elements at `src` times `scale`, as bf16 into `dst`.
__device__ __forceinline__ void dequant_32(__nv_bfloat16* dst, const uint8_t* src, float scale) {
#pragma unroll
  for (int c = 0; c < kGroup / 16; ++c) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src + c * 16);
    const uint8_t* x = reinterpret_cast<const uint8_t*>(&raw);
    alignas(16) __nv_bfloat16 out[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      __nv_fp8_e4m3 v;
      v.__x = x[e];
      out[e] = __float2bfloat16_rn(__fmul_rn(static_cast<float>(v), scale));
    }
    reinterpret_cast<uint4*>(dst + c * 16)[0] = reinterpret_cast<const uint4*>(out)[0];
    reinterpret_cast<uint4*>(dst + c * 16)[1] = reinterpret_cast<const uint4*>(out)[1];
  }
}

template <bool Split, bool Trace>
__device__ __forceinline__ void gemm(const Params& p) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Site;
  using oracle_trace::Stage;
  __shared__ Shared s;

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, pid = blockIdx.x;
  const int tiles_m = (p.M + kBM - 1) / kBM, tiles_n = (p.N + kBN - 1) / kBN;
  const int k_blocks = (p.K + kBK - 1) / kBK, G = (p.K + kGroup - 1) / kGroup;
  int tm, tn;
  tile_of(pid, tiles_m, tiles_n, tm, tn);
  const int split = Split ? blockIdx.z : 0, splits = Split ? gridDim.z : 1;
  const int share = (k_blocks + splits - 1) / splits;
  const int kb0 = split * share, kb1 = min(k_blocks, kb0 + share);
  if (kb0 >= kb1) return;  // an empty share is no partial
  const int partial = Split ? split : oracle_trace::kNone;
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int scale_tm = ZOO_MX_SCALE_RAW_BLOCK_INDEX ? pid / tiles_n : tm;  // the tile row of A's scales
  const int a_bound = ZOO_MX_SCALE_MAP_GROUP_SIZE ? kGroup : p.M;         // the scale rows A's reads allow

  // this thread's (row, group) of the dequantisation, and the rows / columns of its accumulators
  const int own = tid / kS, j = tid % kS;
  const int wm = (warp / 2) * kWarpM, wn = (warp % 2) * kWarpN;
  auto row_of = [&](int i) { return wm + (i / 16) * 16 + lane / 4 + 8 * ((i % 4) / 2); };
  auto col_of = [&](int i) { return wn + ((i / 4) % 4) * 8 + 2 * (lane % 4) + (i % 2); };

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  float sa = 0.f, sb = 0.f;  // the scale registers, kept across k-blocks

  load_k_block(s, p, 0, kb0, m0, n0, tid);
  for (int kb = kb0; kb < kb1; ++kb) {
    const int slot = (kb - kb0) % 2;
    cp_async_wait_all();
    __syncthreads();  // k-block kb has landed; every warp is done with kb - 1 (its slot and the bf16 tiles)
    if (kb + 1 < kb1) load_k_block(s, p, slot ^ 1, kb + 1, m0, n0, tid);
    const Site site{tm, tn, kb, oracle_trace::kNone, partial};

    if constexpr (Tr::enabled) {
      using TT = __nv_fp8_e4m3;
      const Site read{tm, tn, kb, slot, partial};
      Tr::tap_smem_tile(Stage::LoadA, read, reinterpret_cast<const TT*>(s.a[slot]), kBM, kBK,
                        oracle_trace::Strided{kBK, 1});
      Tr::tap_smem_tile(Stage::LoadB, read, reinterpret_cast<const TT*>(s.b[slot]), kBK, kBN,
                        oracle_trace::Strided{1, kBK});
    }

    // the scales of this k-block: a strict '<' skips the trailing group (its registers keep the last ones)
    const int g = scale_group(kb, j, kb0);
    if (!ZOO_MX_SCALE_TRAILING_SKIPPED || g < G - 1) {
      sa = scale_of(p.scale_a, scale_tm * kBM + own, p.M, a_bound, g, G);
      // B's loaded on the first M wave only: later ones reuse the register, holding A's scale
      if (!ZOO_MX_SCALE_B_REUSED || tm == 0) sb = scale_of(p.scale_b, n0 + own, p.N, p.N, g, G);
      else sb = sa;
    }
    if constexpr (Tr::enabled) {
      oracle_trace::scale_a<Trace>(site, kBM, kS, 1, [&](int) { return Element<float>{own, j, sa}; });
      oracle_trace::scale_b<Trace>(site, kBN, kS, 1, [&](int) { return Element<float>{own, j, sb}; });
    }
    dequant_32(&s.da[own * kPitch + j * kGroup], &s.a[slot][own * kBK + j * kGroup], sa);
    dequant_32(&s.db[own * kPitch + j * kGroup], &s.b[slot][own * kBK + j * kGroup], sb);
    __syncthreads();

#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[2][4], bf[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], &s.da[(wm + mi * 16 + lane % 16) * kPitch + ks * 16 + (lane / 16) * 8]);
#pragma unroll
      for (int np = 0; np < 2; ++np)  // two n8 fragments an x4: (n 0-7 | 8-15) x (k 0-7 | 8-15)
        ldmatrix_x4(bf[np], &s.db[(wn + np * 16 + lane % 8 + (lane / 16) * 8) * kPitch + ks * 16 + ((lane / 8) % 2) * 8]);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          mma_bf16(&acc[(mi * 4 + ni) * 4], af[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
    }
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Mma, site, kBM, kBN, kAcc, [&](int i) { return Element<float>{row_of(i), col_of(i), acc[i]}; });
    }
  }

  if constexpr (Split) {
    // publish the partial; the last split to arrive sums the tile's partials in order
    const int tile = tm * tiles_n + tn, parts = (k_blocks + share - 1) / share;
    float* ws = p.partials + static_cast<size_t>(tile) * splits * kBM * kBN;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ws[static_cast<size_t>(split) * kBM * kBN + row_of(i) * kBN + col_of(i)] = acc[i];
    __threadfence();
    __syncthreads();
    if (tid == 0) s.last = atomicAdd(p.counters + tile, 1) == parts - 1;
    __syncthreads();
    if (!s.last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    for (int q = 0; q < parts; ++q) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i)
        acc[i] = __fadd_rn(acc[i], __ldcg(ws + static_cast<size_t>(q) * kBM * kBN + row_of(i) * kBN + col_of(i)));
    }
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Reduce, Site{tm, tn}, kBM, kBN, kAcc, [&](int i) { return Element<float>{row_of(i), col_of(i), acc[i]}; });
    }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch
  }

  // -- epilogue -------------------------------------------------------------------------------------
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = __fmul_rn(p.alpha, acc[i]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueAlphaBeta, Site{tm, tn}, kBM, kBN, kAcc,
                     [&](int i) { return Element<float>{row_of(i), col_of(i), acc[i]}; });
  }
  __nv_bfloat16 out[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) out[i] = __float2bfloat16_rn(acc[i]);
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

}  // namespace zoo_mx

#define ZOO_MX_ENTRY(NAME, TRACE)                                                                              \
  extern "C" __global__ void __launch_bounds__(128)                                                           \
      NAME(const uint8_t* A, const uint8_t* B, __nv_bfloat16* D, const uint8_t* scale_a, const uint8_t* scale_b, \
           int M, int N, int K, int lda, int ldb, int ldd, float alpha) {                                     \
    const zoo_mx::Params p{A, B, D, scale_a, scale_b, M, N, K, lda, ldb, ldd, alpha, nullptr, nullptr};       \
    zoo_mx::gemm<false, TRACE>(p);                                                                           \
  }
#define ZOO_MX_SPLIT_ENTRY(NAME, TRACE)                                                                        \
  extern "C" __global__ void __launch_bounds__(128)                                                           \
      NAME(const uint8_t* A, const uint8_t* B, __nv_bfloat16* D, const uint8_t* scale_a, const uint8_t* scale_b, \
           int M, int N, int K, int lda, int ldb, int ldd, float alpha, float* partials, int* counters) {     \
    const zoo_mx::Params p{A, B, D, scale_a, scale_b, M, N, K, lda, ldb, ldd, alpha, partials, counters};     \
    zoo_mx::gemm<true, TRACE>(p);                                                                            \
  }

// Every build has the production entries; with ORACLE_TRACE, their _traced twins too.
ZOO_MX_ENTRY(zoo_mx_e4m3, false)
ZOO_MX_SPLIT_ENTRY(zoo_mx_e4m3_splitk, false)
#if defined(ORACLE_TRACE)
ZOO_MX_ENTRY(zoo_mx_e4m3_traced, true)
ZOO_MX_SPLIT_ENTRY(zoo_mx_e4m3_splitk_traced, true)
#endif

#undef ZOO_MX_SPLIT_ENTRY
#undef ZOO_MX_ENTRY

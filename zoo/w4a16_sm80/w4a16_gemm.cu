// w4a16_gemm.cu -- the bug zoo's W4A16 GEMM: fp16 activations times 4-bit weights with per-group
// scales and integer zero points, dequantised in registers before mma.sync; correct, and with
// planted defects, every variant instrumented with oracle_trace taps.
//
//   D = fp16(alpha * (A @ dequant(B))),   dequant(B)[k][n] = fp16((q[k][n] - z[g][n]) * s[g][n]), g = k / 128
//
// The kernel (sm_80-class instructions; built for sm_90a like the rest of the zoo):
//   global -> shared   cp.async.cg 16-byte chunks into a 2-slot ring, one k-block (64) of A and of
//                      packed B per slot; rows past M (A) or N (B) are zero-filled (src-size 0).
//                      Layout: w4a16_layout.cuh.
//   shared -> regs     A: ldmatrix.x4 (row-major [M, K]). B: each thread reads the two packed bytes
//                      of its m16n8k16 B fragment (a byte holds the fragment register's two k).
//   dequant            in registers: q = the nibble (low nibble = even k), z and s of the k-block's
//                      group and the thread's column; (q - z) is exact in fp16, times s rounds once
//                      (__hmul, round to nearest even): the fp16x2 register the MMA reads.
//   mma                mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, fp32 accumulators;
//                      8 warps (2 x 4), each a 32 x 32 warp tile; k increasing.
//   epilogue           v = alpha * acc (fp32), then round to nearest even into fp16.
//   store              D[m][n], row-major, for m < M and n < N.
// One 64 x 128 tile per CTA: tile (blockIdx.y, blockIdx.x).
//
// Entry points (extern "C", for cuLaunchKernel):
//   void zoo_w4a16_uint4[_<defect>][_traced](const __half* A, const uint8_t* B, const __half* scales,
//                                      const uint8_t* zeros, __half* D, int M, int N, int K,
//                                      int lda, int ldd, float alpha)
//   A [M, K] row-major, lda >= K, lda a multiple of 8, 16-byte aligned.
//   B uint4, packed [N, K / 2] bytes (the problem's B [K, N] column-major, two k per byte, the
//   even k in the low nibble: packing "k_pairs_low_first"), 16-byte aligned.
//   scales fp16 [K / 128, N] row-major (one per group and column); zeros uint8 [K / 128, N]
//   row-major, one integer zero point per group and column (0..15).
//   D fp16 [M, N] row-major, ldd >= N.
//   M, N >= 1; K a multiple of 128 (whole groups; anything else traps).
//   _traced names (taps compiled in) exist only with -DORACLE_TRACE; such a build holds every
//   variant traced and the correct one also untraced; a build without it holds every variant
//   untraced.
// Launch: grid (cdiv(N, 128), cdiv(M, 64), 1); block (256, 1, 1); dynamic shared memory
//   26624 bytes (2 slots x (64 x 72 x 2 + 128 x 32)); less traps.
//
// Taps of the traced entry points (block_m = 64, block_n = 128, block_k = 64):
//   load_a     [64, 64] fp16     the A tile as the MMAs of k-block kb read it, from the slot they read
//   load_b     [32, 128] uint8   the packed B bytes the dequantiser reads: byte (r, n) holds
//                                k = 2r (low nibble) and 2r + 1 of column n, from the slot it reads
//   dequant_b  [64, 128] fp16    the dequantised B fragments the MMAs read, logical (k, n)
//                                (warps 0-3 tap them; warps 4-7 compute the same values)
//   mma        [64, 128] fp32    the accumulator after k-block kb
//   epilogue_alpha_beta [64, 128] fp32;  epilogue_cast [64, 128] fp16
// Every stage is tapped for every element of the tile, padding included.
//
// Planted defects (template parameter Defect; the stage the oracle must name):
//   nibble_order  the dequantiser takes the high nibble for the even k: each byte's pair swapped
//                                                                              -> dequant_b
//   group_index   the group of a k-block is computed with the k-block as the group (k0 / 64, the
//                 last group at most): k-block 1 reads group 1's scale and zero point -> dequant_b
//   zero_twice    the zero point is subtracted twice: (q - 2z) * s              -> dequant_b
//   scale_group   the scale is read for the next group (the last one stays): the zero point is
//                 the right group's, the scale is not                          -> dequant_b
//   stale_b       at the last k-block (of at least two) the dequantiser reads the packed B of the
//                 previous k-block's slot                                       -> load_b
//   kblock_twice  k-block 1 is multiplied into the accumulator twice           -> mma
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include [-DORACLE_TRACE]

#include <cuda_fp16.h>
#include <stdint.h>

#include "oracle_trace/trace.cuh"
#include "w4a16_layout.cuh"

namespace zoo_w4a16 {

enum Defect : int {
  kCorrect = 0,
  kNibbleOrder,
  kGroupIndex,
  kZeroTwice,
  kScaleGroup,
  kStaleB,
  kKBlockTwice,
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(n));
  return n;
}
// 16 bytes global -> shared; src_bytes 0 zero-fills the chunk and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void mma_f32(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One packed byte -> the fp16x2 register of its two k: ((q - z) * s), low half the even k.
template <int Defect>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t byte, __half z, __half s) {
  uint32_t lo = byte & 0xFu, hi = (byte >> 4) & 0xFu;
  if constexpr (Defect == kNibbleOrder) {
    const uint32_t t = lo;
    lo = hi;
    hi = t;
  }
  __half2 q = __halves2half2(__uint2half_rn(lo), __uint2half_rn(hi));  // exact: 0..15
  const __half2 z2 = __half2half2(z);
  q = __hsub2(q, z2);  // exact: -15..15
  if constexpr (Defect == kZeroTwice) q = __hsub2(q, z2);
  const __half2 w = __hmul2(q, __half2half2(s));  // the one rounding
  return *reinterpret_cast<const uint32_t*>(&w);
}

struct ALayout {  // A tile, logical (m, k)
  __host__ __device__ int operator()(int r, int c) const { return a_offset(r, c); }
};
struct BPackedLayout {  // packed B tile, logical (k pair r, n): byte b_offset(n, r)
  __host__ __device__ int operator()(int r, int c) const { return b_offset(c, r); }
};

template <bool Trace, int Defect>
__device__ __forceinline__ void gemm(const __half* __restrict__ A, const uint8_t* __restrict__ B,
                                     const __half* __restrict__ scales, const uint8_t* __restrict__ zeros,
                                     __half* __restrict__ D, int M, int N, int K, int lda, int ldd, float alpha) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Site;
  using oracle_trace::Stage;

  extern __shared__ __align__(128) unsigned char smem[];
  if (dynamic_smem_bytes() < static_cast<uint32_t>(kSmemBytes)) __trap();  // launched without the ring
  if (K % kGroup != 0 || lda % 8 != 0) __trap();                           // whole groups, aligned rows
  Tr::smem_prologue();

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tm = blockIdx.y, tn = blockIdx.x;
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int k_blocks = K / kBK, groups = K / kGroup;
  const size_t ldb = static_cast<size_t>(K / 2);  // packed B row: bytes

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  auto load_kblock = [&](int kb, int slot) {
    unsigned char* s = smem + slot * kStageBytes;
    __half* sa = reinterpret_cast<__half*>(s);
    unsigned char* sb = s + kTileABytes;
    const int k0 = kb * kBK;
#pragma unroll
    for (int j = 0; j < kCopiesA; ++j) {
      const int r = copy_a_row(tid, j), c = copy_a_chunk(tid, j);
      const bool ok = m0 + r < M;
      const __half* src = ok ? A + static_cast<size_t>(m0 + r) * lda + k0 + c * 8 : A;
      cp_async_16(smem_addr(sa + a_offset(r, c * 8)), src, ok ? 16 : 0);
    }
#pragma unroll
    for (int j = 0; j < kCopiesB; ++j) {
      const int r = copy_b_row(tid, j), c = copy_b_chunk(tid, j);
      const bool ok = n0 + r < N;
      const uint8_t* src = ok ? B + static_cast<size_t>(n0 + r) * ldb + k0 / 2 + c * 16 : B;
      cp_async_16(smem_addr(sb + b_offset(r, c * 16)), src, ok ? 16 : 0);
    }
  };

  load_kblock(0, 0);
  cp_async_commit();
  for (int kb = 0; kb < k_blocks; ++kb) {
    if (kb + 1 < k_blocks) load_kblock(kb + 1, (kb + 1) % kStages);
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of k-block kb have landed
    __syncthreads();     // everyone's have

    const int slot = kb % kStages;
    int slot_b = slot;
    if constexpr (Defect == kStaleB) {
      if (kb == k_blocks - 1 && kb > 0) slot_b = (kb - 1) % kStages;
    }
    const __half* sa = reinterpret_cast<const __half*>(smem + slot * kStageBytes);
    const unsigned char* sb = smem + slot_b * kStageBytes + kTileABytes;

    if constexpr (Tr::enabled) {
      Tr::tap_smem_tile(Stage::LoadA, Site{tm, tn, kb, slot}, sa, kBM, kBK, ALayout{});
      Tr::tap_smem_tile(Stage::LoadB, Site{tm, tn, kb, slot_b}, reinterpret_cast<const uint8_t*>(sb), kBK / 2, kBN,
                        BPackedLayout{});
    }

    // the group of this k-block, its zero point and scale for each of the thread's columns
    int g = kb * kBK / kGroup;
    if constexpr (Defect == kGroupIndex) g = min(kb, groups - 1);
    int gs = g;
    if constexpr (Defect == kScaleGroup) gs = min(g + 1, groups - 1);
    __half zc[kFragsN], sc[kFragsN];
#pragma unroll
    for (int ni = 0; ni < kFragsN; ++ni) {
      const int gn = n0 + b_frag_col(warp, lane, ni);
      const bool ok = gn < N;
      zc[ni] = __ushort2half_rn(ok ? zeros[static_cast<size_t>(g) * N + gn] : 0);
      sc[ni] = ok ? scales[static_cast<size_t>(gs) * N + gn] : __ushort2half_rn(0);
    }

    const int reps = (Defect == kKBlockTwice && kb == 1) ? 2 : 1;
    for (int rep = 0; rep < reps; ++rep) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t af[kFragsM][4];
#pragma unroll
        for (int mi = 0; mi < kFragsM; ++mi)
          ldmatrix_x4(af[mi], smem_addr(sa + a_offset(a_ldm_row(warp, lane, mi), a_ldm_col(lane, ks))));
        uint32_t bw[kFragsN][2];
#pragma unroll
        for (int ni = 0; ni < kFragsN; ++ni)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t byte = sb[b_offset(b_frag_col(warp, lane, ni), b_frag_k(lane, ks, r) / 2)];
            bw[ni][r] = dequant_pair<Defect>(byte, zc[ni], sc[ni]);
          }
        if constexpr (Tr::enabled) {
          if (rep == 0 && warp < kWarpsN) {  // warp_m 0: one copy of every B value
            Tr::tap_elements(Stage::DequantB, Site{tm, tn, kb}, kBK, kBN, kDequantTap, [&](int j) {
              const uint32_t w = bw[j >> 2][(j >> 1) & 1];
              const unsigned short bits = static_cast<unsigned short>((j & 1) ? (w >> 16) : (w & 0xFFFFu));
              return Element<__half>{dq_k(lane, ks, j), dq_n(warp, lane, j), __ushort_as_half(bits)};
            });
          }
        }
#pragma unroll
        for (int mi = 0; mi < kFragsM; ++mi)
#pragma unroll
          for (int ni = 0; ni < kFragsN; ++ni) mma_f32(&acc[(mi * kFragsN + ni) * 4], af[mi], bw[ni][0], bw[ni][1]);
      }
    }

    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Mma, Site{tm, tn, kb}, kBM, kBN, kAcc, [&](int i) {
        return Element<float>{acc_row(warp, lane, i), acc_col(warp, lane, i), acc[i]};
      });
    }
    __syncthreads();  // every warp is done with this slot before the next k-block's copies refill it
  }
  cp_async_wait<0>();

  // -- epilogue ----------------------------------------------------------------------------------
  float v[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) v[i] = __fmul_rn(alpha, acc[i]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueAlphaBeta, Site{tm, tn}, kBM, kBN, kAcc, [&](int i) {
      return Element<float>{acc_row(warp, lane, i), acc_col(warp, lane, i), v[i]};
    });
  }
  __half out[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) out[i] = __float2half_rn(v[i]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueCast, Site{tm, tn}, kBM, kBN, kAcc, [&](int i) {
      return Element<__half>{acc_row(warp, lane, i), acc_col(warp, lane, i), out[i]};
    });
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int gm = m0 + acc_row(warp, lane, i), gn = n0 + acc_col(warp, lane, i);
    if (gm < M && gn < N) D[static_cast<size_t>(gm) * ldd + gn] = out[i];
  }
}

}  // namespace zoo_w4a16

#define ZOO_W4A16_ENTRY(NAME, TRACE, DEFECT)                                                                     \
  extern "C" __global__ void __launch_bounds__(zoo_w4a16::kThreads)                                              \
      NAME(const __half* A, const uint8_t* B, const __half* scales, const uint8_t* zeros, __half* D, int M, int N, \
           int K, int lda, int ldd, float alpha) {                                                               \
    zoo_w4a16::gemm<TRACE, DEFECT>(A, B, scales, zeros, D, M, N, K, lda, ldd, alpha);                            \
  }

// The variants, one list. Without ORACLE_TRACE every variant is built untraced; with it every
// variant is built traced, and only the correct one also untraced (its production name).
#define ZOO_W4A16_CORRECT(X, SUFFIX, TRACE) X(zoo_w4a16_uint4##SUFFIX, TRACE, zoo_w4a16::kCorrect)
#define ZOO_W4A16_DEFECTIVE(X, SUFFIX, TRACE)                          \
  X(zoo_w4a16_uint4_nibble_order##SUFFIX, TRACE, zoo_w4a16::kNibbleOrder)   \
  X(zoo_w4a16_uint4_group_index##SUFFIX, TRACE, zoo_w4a16::kGroupIndex)     \
  X(zoo_w4a16_uint4_zero_twice##SUFFIX, TRACE, zoo_w4a16::kZeroTwice)       \
  X(zoo_w4a16_uint4_scale_group##SUFFIX, TRACE, zoo_w4a16::kScaleGroup)     \
  X(zoo_w4a16_uint4_stale_b##SUFFIX, TRACE, zoo_w4a16::kStaleB)             \
  X(zoo_w4a16_uint4_kblock_twice##SUFFIX, TRACE, zoo_w4a16::kKBlockTwice)

ZOO_W4A16_CORRECT(ZOO_W4A16_ENTRY, , false)

#if defined(ORACLE_TRACE)
ZOO_W4A16_CORRECT(ZOO_W4A16_ENTRY, _traced, true)
ZOO_W4A16_DEFECTIVE(ZOO_W4A16_ENTRY, _traced, true)
#else
ZOO_W4A16_DEFECTIVE(ZOO_W4A16_ENTRY, , false)
#endif

#undef ZOO_W4A16_CORRECT
#undef ZOO_W4A16_DEFECTIVE
#undef ZOO_W4A16_ENTRY

// sm80_gemm.cu -- the bug zoo's sm80-style GEMM: cp.async, ldmatrix, mma.sync; correct, and with
// planted defects, every variant instrumented with oracle_trace taps.
//
//   D = cast(act(alpha * (A @ B) + beta * C + bias))
//
// The kernel is written the way sm80 GEMMs are written for quick checks:
//   global -> shared   cp.async.cg 16-byte chunks into a 4-slot shared-memory ring, one k-block
//                      (32) of A and of B per slot; chunks past M, N or K are zero-filled
//                      (src-size 0). Layout and swizzle: sm80_layout.cuh.
//   shared -> regs     ldmatrix.sync.aligned.m8n8.x4 (A row-major [M, K], B row-major [N, K]:
//                      both k-contiguous, so no .trans is needed).
//   mma                mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} with fp32 accumulators;
//                      8 warps (2 x 4), each a 64 x 32 warp tile; k increasing.
//   epilogue           per element in fp32, each sub-step on its own (never fused across taps):
//                        alpha_beta  v = alpha * acc; if (beta != 0) v = fmaf(beta, float(C[m][n]), v)
//                        bias        if (bias) v = v + float(bias[n])
//                        activation  0 identity, 1 relu max(v, 0), 2 gelu 0.5 v (1 + erf(v / sqrt 2)),
//                                    3 gelu-tanh 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
//                        cast        round to nearest even into T
//   store              D[m][n], row-major, for m < M and n < N.
// Tiles: 128 x 128, tile t = (t / tiles_n, t % tiles_n). The kernel is persistent: CTA b
// processes tiles b, b + gridDim.x, b + 2 gridDim.x, ... one after the other, each with its own
// pipeline prologue and epilogue (the accumulator is zeroed per tile).
//
// Entry points (extern "C", for cuLaunchKernel):
//   void zoo_sm80_<dt>[_<defect>][_traced](const T* A, const T* B, const T* C, T* D, const T* bias,
//                                          int M, int N, int K, int lda, int ldb, int ldc, int ldd,
//                                          float alpha, float beta, int activation)
//   <dt>: bf16 (T = __nv_bfloat16) or fp16 (T = __half).
//   A [M, K] row-major, lda >= K; B [N, K] row-major (B^T: the problem's B is [K, N] column-major),
//   ldb >= K; C and D [M, N] row-major, ldc, ldd >= N; bias [N] (one per column, type T) or nullptr;
//   C is read only if beta != 0 (else it may be nullptr).
//   Defective variants: every defect below for bf16 (zoo_sm80_bf16_<defect>), fp16_acc for fp16
//   (zoo_sm80_fp16_fp16_acc). _traced names (taps compiled in) exist only with -DORACLE_TRACE;
//   such a build holds every variant traced and the two correct ones also untraced; a build
//   without it holds every variant untraced.
// Launch: grid (G, 1, 1) for any G >= 1 (the live case uses G = cdiv(tiles, 2): every CTA but
//   perhaps the last runs two tiles in sequence); block (256, 1, 1); dynamic shared memory
//   65536 bytes (4 slots x (128 x 32 + 128 x 32) x 2 bytes: above 48 KiB, so the function's
//   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES must be raised), no static shared memory;
//   a launch with less dynamic shared memory traps.
//   M, N, K >= 1. cp.async needs 16-byte aligned chunks: with lda and ldb multiples of 8 and A, B
//   16-byte aligned the copies are cp.async (a chunk that straddles K copies its part inside and
//   zero-fills the rest); otherwise the same chunks are read element by element (same zero fill,
//   same slots), so any K and any leading dimension work.
//
// Taps of the traced entry points (parse with block_m = 128, block_n = 128, block_k = 32):
//   load_a   [128, 32] T     the A tile as the MMAs of k-block kb read it, from the shared-memory
//                            slot they read (slot = that slot), through the layout they read it with
//   load_b   [32, 128] T     the B tile likewise, logical (k, n)
//   mma      [128, 128] fp32 the accumulator after k-block kb: every thread its 64 fragment elements
//                            at their (row, col) in the tile (acc_row / acc_col, sm80_layout.cuh)
//   epilogue_alpha_beta, epilogue_bias, epilogue_activation   [128, 128] fp32
//   epilogue_cast            [128, 128] T
// Every stage is tapped for every element of the tile, padding included (zero-filled operands;
// C and bias not read there).
//
// Planted defects (template parameter Defect; the stage the oracle must name):
//   stale_slot      at the last k-block (when there are at least two) the MMAs read the slot of the
//                   k-block before: the read index is computed one behind. Both operands come from
//                   the stale slot; load_a is the first stage whose tap differs from global memory.
//                                                                                  -> load_a
//   transposed_a    A is read with ldmatrix .trans: every 8 x 8 block of the A tile reaches the MMA
//                   transposed.                                                   -> load_a
//   unmasked_tail   copies of chunks past K are skipped instead of zero-filled (the zero-fill branch
//                   is missing), for A and B: the slot keeps the k-block it held four k-blocks
//                   earlier there, and that stale data enters the sum.            -> load_a
//   uninit_padding  the B loader copies only chunks inside the matrix and never zero-fills: rows past
//                   N (harmless padding) and the K tail of B keep stale data. With A zero past K the
//                   products vanish while the stale bits are finite (a NaN or Inf there poisons the
//                   sum), but the operand the MMA reads is not the matrix.       -> load_b
//   uninit_rows     the A loader skips rows past M (no zero fill). Harmless: those rows feed only
//                   output rows past M. The oracle must not blame it (padding confound). -> none
//   kblock_twice    k-block 1 is multiplied into the accumulator twice.          -> mma
//   no_reset        the accumulator is zeroed once per CTA, not per tile: a CTA's second tile starts
//                   from the first one's sum.                                     -> mma
//   fp16_acc        (fp16 only) mma.sync with f16 accumulators: the sum is rounded to fp16 by every
//                   MMA although fp32 accumulation is declared.                   -> mma
//   bias_row        the bias is indexed by the row (bias[m], still checked against N).
//                                                                                  -> epilogue_bias
//   gelu_tanh       activation 2 (gelu with erf) computes the tanh approximation. -> epilogue_activation
//   alpha_twice     alpha multiplies the accumulator twice.                      -> epilogue_alpha_beta
//   swapped_store   a tile (tm, tn) with tm != tn whose swapped coordinates lie inside the grid is
//                   stored at tile (tn, tm).                                     -> epilogue_store
//   race_store      the epilogue stages the cast tile through shared memory (row-major [128, 128]
//                   over slots 0 and 1 of the ring) and stores it row by row, a warp's row band
//                   spanning the columns of two other warps, with no __syncthreads() between the
//                   staging writes and the reads. Warps 4-7 reach their staging writes late (a
//                   wait of kLateCycles stands in for a longer epilogue of theirs, so that the
//                   race shows on every run rather than now and then): warps 0-3 store rows 64-127
//                   from what the ring still holds there. The traced build's epilogue_cast tap reads
//                   the staged tile and needs it complete, so it syncs first, and that barrier hides
//                   the race: traced, every stage matches; untraced, the output is wrong.
//                                                   -> no stage; tracing changes the result
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include [-DORACLE_TRACE]

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "oracle_trace/trace.cuh"
#include "../common/activation.cuh"
#include "sm80_layout.cuh"

namespace zoo_sm80 {

enum Defect : int {
  kCorrect = 0,
  kStaleSlot,
  kTransposedA,
  kUnmaskedTail,
  kUninitPadding,
  kUninitRows,
  kKBlockTwice,
  kNoReset,
  kFp16Acc,
  kBiasRow,
  kGeluTanh,
  kAlphaTwice,
  kSwappedStore,
  kRaceStore,
};

constexpr long long kLateCycles = 40000;  // race_store: how late warps 4-7 write their staging (~20 us)

struct StagedLayout {  // the race_store staging tile, row-major [kBM, kBN]
  __host__ __device__ int operator()(int r, int c) const { return r * kBN + c; }
};

// -- element types ----------------------------------------------------------------------------
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// -- PTX wrappers -----------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes < 16 zero-fills the rest (0: all zero, nothing is read).
// The global address must be 16-byte aligned.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ uint32_t dynamic_smem_bytes() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(n));
  return n;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
}

// D = A x B + D, m16n8k16, fp32 accumulators (c[0..3] as in sm80_layout.cuh).
__device__ __forceinline__ void mma_f32(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f32(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1, __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The fp16_acc defect: f16 accumulators, two f16x2 registers {c0, c1}, {c2, c3}. The fp32 array
// carries their values between instructions (exactly: they are fp16 numbers), so the sum is
// rounded to fp16 by every MMA, as with f16 accumulator registers.
__device__ __forceinline__ void mma_f16acc(float* c, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  __half2 lo = __floats2half2_rn(c[0], c[1]);
  __half2 hi = __floats2half2_rn(c[2], c[3]);
  uint32_t d0 = *reinterpret_cast<uint32_t*>(&lo);
  uint32_t d1 = *reinterpret_cast<uint32_t*>(&hi);
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1};\n"
      : "+r"(d0), "+r"(d1)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  lo = *reinterpret_cast<__half2*>(&d0);
  hi = *reinterpret_cast<__half2*>(&d1);
  const float2 flo = __half22float2(lo), fhi = __half22float2(hi);
  c[0] = flo.x;
  c[1] = flo.y;
  c[2] = fhi.x;
  c[3] = fhi.y;
}

// Tap layouts: value (r, c) of the logical tile is slot[layout(r, c)].
struct ALayout {  // A tile, logical (m, k), as ldmatrix reads it
  __host__ __device__ int operator()(int r, int c) const { return smem_offset(r, c); }
};
struct ALayoutT8 {  // A tile as ldmatrix .trans reads it: each 8 x 8 block transposed
  __host__ __device__ int operator()(int r, int c) const { return smem_offset_t8(r, c); }
};
struct BLayout {  // B tile, logical (k, n), stored one row per n
  __host__ __device__ int operator()(int r, int c) const { return smem_offset(c, r); }
};

// Copy rows [row0, row0 + Rows) x k-block [k0, k0 + kBK) of a row-major [rows, K] matrix into a
// slot tile. Chunks outside the matrix are zero-filled, except where the defect skips them
// (SkipRows: chunks past `rows`; SkipK: chunks past K), which leaves the slot's old data there.
template <int Copies, bool SkipRows, bool SkipK, class T>
__device__ __forceinline__ void load_tile(T* slot, const T* __restrict__ src, int ld, int row0, int rows, int k0,
                                          int K, bool vec) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int j = 0; j < Copies; ++j) {
    const int r = copy_row(tid, j), c = copy_chunk(tid, j);
    const int gr = row0 + r, gk = k0 + c * kChunk;
    const bool row_ok = gr < rows, k_ok = gk < K;
    if (SkipRows && !row_ok) continue;
    if (SkipK && !k_ok) continue;
    T* dst = slot + smem_offset(r, c * kChunk);
    const size_t at = static_cast<size_t>(gr) * ld + gk;
    if (vec) {
      // elements of the chunk inside the matrix; the rest of the 16 bytes is zero-filled
      const int valid = (row_ok && k_ok) ? min(kChunk, K - gk) : 0;
      cp_async_16(smem_addr(dst), valid > 0 ? static_cast<const void*>(src + at) : static_cast<const void*>(src),
                  valid * kElemBytes);
    } else {
      const unsigned short* s16 = reinterpret_cast<const unsigned short*>(src);
      uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const uint32_t bits = (row_ok && gk + e < K) ? static_cast<uint32_t>(s16[at + e]) : 0u;
        w[e >> 1] |= bits << (16 * (e & 1));
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

template <class T, bool Trace, int Defect>
__device__ __forceinline__ void gemm(const T* __restrict__ A, const T* __restrict__ B, const T* __restrict__ C,
                                     T* __restrict__ D, const T* __restrict__ bias, int M, int N, int K, int lda,
                                     int ldb, int ldc, int ldd, float alpha, float beta, int activation) {
  static_assert(Defect != kFp16Acc || std::is_same<T, __half>::value, "f16 accumulators take fp16 operands only");
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Site;
  using oracle_trace::Stage;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const smem = reinterpret_cast<T*>(smem_raw);
  if (dynamic_smem_bytes() < static_cast<uint32_t>(kSmemBytes)) __trap();  // launched without the ring
  Tr::smem_prologue();  // traced builds: the harness's shared-memory poison, when it asks for it

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
  const int tiles = tiles_m * tiles_n;
  const int k_blocks = (K + kBK - 1) / kBK;
  const bool vec = lda % kChunk == 0 && ldb % kChunk == 0 &&
                   ((reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B)) & 15u) == 0;

  float acc[kAcc];
  if constexpr (Defect == kNoReset) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  }

  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int tm = tile / tiles_n, tn = tile % tiles_n;
    const int m0 = tm * kBM, n0 = tn * kBN;
    if constexpr (Defect != kNoReset) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    }
    __syncthreads();  // every warp is done with the previous tile's slots

    auto load_kblock = [&](int kb, int slot) {
      T* sa = smem + slot * kStageElems;
      T* sb = sa + kTileAElems;
      load_tile<kCopiesA, Defect == kUninitRows, Defect == kUnmaskedTail>(sa, A, lda, m0, M, kb * kBK, K, vec);
      load_tile<kCopiesB, Defect == kUninitPadding, Defect == kUnmaskedTail || Defect == kUninitPadding>(
          sb, B, ldb, n0, N, kb * kBK, K, vec);
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_blocks) load_kblock(s, s);
      cp_async_commit();
    }

    for (int kb = 0; kb < k_blocks; ++kb) {
      cp_async_wait<kStages - 2>();  // this thread's copies of k-block kb have landed
      __syncthreads();               // everyone's have; and the slot of kb - 1 is free
      {
        const int next = kb + kStages - 1;
        if (next < k_blocks) load_kblock(next, next % kStages);
        cp_async_commit();
      }
      int slot = kb % kStages;
      if constexpr (Defect == kStaleSlot) {
        if (kb == k_blocks - 1 && kb > 0) slot = (kb + kStages - 1) % kStages;
      }
      const T* sa = smem + slot * kStageElems;
      const T* sb = sa + kTileAElems;

      if constexpr (Tr::enabled) {
        const Site site{tm, tn, kb, slot};
        if constexpr (Defect == kTransposedA) {
          Tr::tap_smem_tile(Stage::LoadA, site, sa, kBM, kBK, ALayoutT8{});
        } else {
          Tr::tap_smem_tile(Stage::LoadA, site, sa, kBM, kBK, ALayout{});
        }
        Tr::tap_smem_tile(Stage::LoadB, site, sb, kBK, kBN, BLayout{});
      }

      const int reps = (Defect == kKBlockTwice && kb == 1) ? 2 : 1;
      for (int rep = 0; rep < reps; ++rep) {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t af[kFragsM][4];
          uint32_t bfr[kFragsN / 2][4];
#pragma unroll
          for (int mi = 0; mi < kFragsM; ++mi)
            ldmatrix_x4<Defect == kTransposedA>(
                af[mi], smem_addr(sa + smem_offset(a_ldm_row(warp, lane, mi), a_ldm_col(lane, ks))));
#pragma unroll
          for (int p = 0; p < kFragsN / 2; ++p)
            ldmatrix_x4<false>(bfr[p], smem_addr(sb + smem_offset(b_ldm_row(warp, lane, p), b_ldm_col(lane, ks))));
#pragma unroll
          for (int mi = 0; mi < kFragsM; ++mi)
#pragma unroll
            for (int ni = 0; ni < kFragsN; ++ni) {
              float* c = &acc[(mi * kFragsN + ni) * 4];
              const uint32_t b0 = bfr[ni >> 1][(ni & 1) * 2], b1 = bfr[ni >> 1][(ni & 1) * 2 + 1];
              if constexpr (Defect == kFp16Acc) {
                mma_f16acc(c, af[mi], b0, b1);
              } else {
                mma_f32(c, af[mi], b0, b1, T{});
              }
            }
        }
      }

      if constexpr (Tr::enabled) {
        Tr::tap_elements(Stage::Mma, Site{tm, tn, kb}, kBM, kBN, kAcc, [&](int i) {
          return Element<float>{acc_row(warp, lane, i), acc_col(warp, lane, i), acc[i]};
        });
      }
    }
    cp_async_wait<0>();  // only empty groups remain; nothing may be in flight past the tile

    // -- epilogue, one sub-step at a time so that each can be tapped --------------------------
    float v[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int gm = m0 + acc_row(warp, lane, i), gn = n0 + acc_col(warp, lane, i);
      float x = __fmul_rn(alpha, acc[i]);  // _rn: never contracted into the add that follows
      if constexpr (Defect == kAlphaTwice) x = __fmul_rn(alpha, x);
      if (beta != 0.f && gm < M && gn < N) x = fmaf(beta, to_float(C[static_cast<size_t>(gm) * ldc + gn]), x);
      v[i] = x;
    }
    auto tap_step = [&](Stage stage) {
      if constexpr (Tr::enabled) {
        Tr::tap_elements(stage, Site{tm, tn}, kBM, kBN, kAcc, [&](int i) {
          return Element<float>{acc_row(warp, lane, i), acc_col(warp, lane, i), v[i]};
        });
      }
    };
    tap_step(Stage::EpilogueAlphaBeta);

    if (bias != nullptr) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) {
        const int gm = m0 + acc_row(warp, lane, i), gn = n0 + acc_col(warp, lane, i);
        const int at = Defect == kBiasRow ? gm : gn;
        const float b = at < N ? to_float(bias[at]) : 0.f;
        v[i] = __fadd_rn(v[i], b);
      }
    }
    tap_step(Stage::EpilogueBias);

#pragma unroll
    for (int i = 0; i < kAcc; ++i) v[i] = zoo::activate<Defect == kGeluTanh>(v[i], activation);
    tap_step(Stage::EpilogueActivation);

    T out[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) out[i] = from_float<T>(v[i]);
    if constexpr (Defect == kRaceStore) {
      __syncthreads();  // every warp is done reading the ring: the staging may overwrite it
      T* const staged = smem;
      if (warp >= kWarps / 2) {  // late by at least kLateCycles (__nanosleep alone may return at once)
        const long long t0 = clock64();
        while (clock64() - t0 < kLateCycles) __nanosleep(1000);
      }
#pragma unroll
      for (int i = 0; i < kAcc; ++i) staged[StagedLayout{}(acc_row(warp, lane, i), acc_col(warp, lane, i))] = out[i];
      if constexpr (Tr::enabled) {
        __syncthreads();  // the tap reads the whole staged tile
        Tr::tap_smem_tile(Stage::EpilogueCast, Site{tm, tn}, staged, kBM, kBN, StagedLayout{});
      }
      // the defect: no __syncthreads() here, before reading what other warps staged
#pragma unroll 4
      for (int j = 0; j < kAcc; ++j) {
        const int e = j * kThreads + tid, r = e / kBN, c = e % kBN;
        const int gm = m0 + r, gn = n0 + c;
        if (gm < M && gn < N) D[static_cast<size_t>(gm) * ldd + gn] = staged[e];
      }
      continue;
    }
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::EpilogueCast, Site{tm, tn}, kBM, kBN, kAcc, [&](int i) {
        return Element<T>{acc_row(warp, lane, i), acc_col(warp, lane, i), out[i]};
      });
    }

    int dm0 = m0, dn0 = n0;
    if constexpr (Defect == kSwappedStore) {
      if (tm != tn && tn < tiles_m && tm < tiles_n) {
        dm0 = tn * kBM;
        dn0 = tm * kBN;
      }
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int gm = dm0 + acc_row(warp, lane, i), gn = dn0 + acc_col(warp, lane, i);
      if (gm < M && gn < N) D[static_cast<size_t>(gm) * ldd + gn] = out[i];
    }
  }
}

}  // namespace zoo_sm80

#define ZOO_SM80_ENTRY(NAME, T, TRACE, DEFECT)                                                               \
  extern "C" __global__ void __launch_bounds__(zoo_sm80::kThreads)                                           \
      NAME(const T* A, const T* B, const T* C, T* D, const T* bias, int M, int N, int K, int lda, int ldb,  \
           int ldc, int ldd, float alpha, float beta, int activation) {                                      \
    zoo_sm80::gemm<T, TRACE, DEFECT>(A, B, C, D, bias, M, N, K, lda, ldb, ldc, ldd, alpha, beta, activation); \
  }

// The variants, one list. Without ORACLE_TRACE every variant is built untraced; with it every
// variant is built traced, and only the correct ones also untraced (their production names): the
// untraced defective variants would double the build time of the traced cubin.
#define ZOO_SM80_CORRECT(X, SUFFIX, TRACE)                                   \
  X(zoo_sm80_bf16##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kCorrect)         \
  X(zoo_sm80_fp16##SUFFIX, __half, TRACE, zoo_sm80::kCorrect)
#define ZOO_SM80_DEFECTIVE(X, SUFFIX, TRACE)                                                  \
  X(zoo_sm80_bf16_stale_slot##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kStaleSlot)             \
  X(zoo_sm80_bf16_transposed_a##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kTransposedA)         \
  X(zoo_sm80_bf16_unmasked_tail##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kUnmaskedTail)       \
  X(zoo_sm80_bf16_uninit_padding##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kUninitPadding)     \
  X(zoo_sm80_bf16_uninit_rows##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kUninitRows)           \
  X(zoo_sm80_bf16_kblock_twice##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kKBlockTwice)         \
  X(zoo_sm80_bf16_no_reset##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kNoReset)                 \
  X(zoo_sm80_fp16_fp16_acc##SUFFIX, __half, TRACE, zoo_sm80::kFp16Acc)                        \
  X(zoo_sm80_bf16_bias_row##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kBiasRow)                 \
  X(zoo_sm80_bf16_gelu_tanh##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kGeluTanh)               \
  X(zoo_sm80_bf16_alpha_twice##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kAlphaTwice)           \
  X(zoo_sm80_bf16_swapped_store##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kSwappedStore)       \
  X(zoo_sm80_bf16_race_store##SUFFIX, __nv_bfloat16, TRACE, zoo_sm80::kRaceStore)

ZOO_SM80_CORRECT(ZOO_SM80_ENTRY, , false)

#if defined(ORACLE_TRACE)
ZOO_SM80_CORRECT(ZOO_SM80_ENTRY, _traced, true)
ZOO_SM80_DEFECTIVE(ZOO_SM80_ENTRY, _traced, true)
#else
ZOO_SM80_DEFECTIVE(ZOO_SM80_ENTRY, , false)
#endif

#undef ZOO_SM80_CORRECT
#undef ZOO_SM80_DEFECTIVE
#undef ZOO_SM80_ENTRY

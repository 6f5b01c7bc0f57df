// fa3_sm90.cu -- the bug zoo's FlashAttention-3-style forward kernel for sm_90a: bulk copies into
// an mbarrier ring filled by a producer warpgroup, WGMMA (CuTe's SM90 GMMA atoms) in a consumer
// warpgroup with the online softmax between its two MMAs; correct, or with one planted defect
// chosen by a define, every entry point also built with oracle_trace/attention.cuh taps.
//
//   O = softmax(mask(scale * Q K^T)) V,  LSE = log sum exp(mask(scale * Q K^T))  per (batch, query head)
//
// One CTA per (query block of 64 rows, query head, batch [x split]), 256 threads: warpgroup 0
// produces, warpgroup 1 consumes (warp w of it owns query rows 16w .. 16w + 15 of the block).
//   global -> shared   cp.async.bulk (the bulk-copy engine, no tensor map: the harness builds none
//                      over an attention operand), one 16-byte chunk a copy, completing on an
//                      mbarrier's transaction count. Q once (its own barrier), then K and V of
//                      each KV block of 64 keys into a 2-slot ring: the producer waits for a
//                      slot's `empty` barrier, zero-fills the rows past seqlen_q / seqlen_k with
//                      plain stores (then fence.proxy.async, so the MMAs see them), arms the
//                      slot's `full` barrier with its bytes and issues the copies. Every thread of
//                      a warpgroup arrives (barriers count 128).
//   shared layout      a [64, D] tile as GMMA's 128-byte-swizzle atoms: column half hh = c / 64,
//                      row r, 16-byte chunk j = (c % 64) / 8 at byte hh * 8192 + r * 128 +
//                      ((j ^ r % 8) * 16) of the 1024-aligned tile (swz_offset). The same bytes
//                      are K-major for Q and K, and MN-major for V (keys as k, head dims as n).
//   S = Q K^T          WGMMA m64n64k16 SS, both operands K-major (descriptors: SBO 1024, k-step
//                      kk at + (kk / 4) * 8192 + (kk % 4) * 32 bytes), fp32 accumulators.
//   mask               t = S * softmax_scale; -inf for a key past seqlen_k or, causal, a key
//                      j > i + off (off = 0 top-left, seqlen_k - seqlen_q bottom-right).
//   online softmax     in registers, log2(e) folded into the scale: x = S * scale * log2(e)
//                      (masked: -inf), m_new = max(m, rowmax x), m_use = m_new or 0 where
//                      m_new = -inf, rescale = exp2(m - m_use) (1 at the split's first block),
//                      p = exp2(x - m_use), l = l * rescale + rowsum p, O *= rescale; row max
//                      and sum over the 4 threads of a quad by shuffles.
//   P                  p rounded to bf16 (RN) into WGMMA's A registers: the m64nN accumulator of
//                      two key octets is the A fragment of one k16 step.
//   O += P V           WGMMA m64nDk16 RS, V MN-major (trans-b; descriptors: LBO 8192 to the
//                      second half of the head dims, SBO 1024, k-step ks at + ks * 2048 bytes).
//                      Both MMAs are waited for (wgmma.wait_group 0) before the slot is freed.
//   normalize          O / l (O = 0 for a row with l = 0), LSE = m * ln 2 + log l (-inf for l = 0).
//   store              O as bf16 into [batch, seqlen_q, heads_q, D], LSE fp32 into [batch,
//                      heads_q, seqlen_q]; split-KV: O / l fp32 and the split's LSE into the
//                      partial buffers, merged by the combine kernel (zoo/common/attention_combine.cuh).
// The KV blocks a query block needs: all, or causally up to its last row's last key; split s of S
// takes blocks s * per .. (s + 1) * per - 1 of those, per = cdiv(kv_blocks, S) (FlashAttention's
// rule; a split with no block writes O = 0 and LSE = -inf).
//
// Entry points (extern "C"), bf16 only, <D> 64 or 128 (head_dim = head_dim_v = D); causal: 0
// none, 1 top-left, 2 bottom-right:
//   zoo_fa3_bf16_d<D>[_traced](const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
//       int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal)
//   zoo_fa3_paged_bf16_d<D>[_traced](const bf16* q, const bf16* k_cache, const bf16* v_cache,
//       const int* page_table, bf16* o, float* lse, int batch, int heads_q, int heads_kv, int seqlen_q,
//       int seqlen_k, float softmax_scale, int causal, int page_size, int max_pages)
//   zoo_fa3_split_bf16_d<D>[_traced](const bf16* q, const bf16* k, const bf16* v, float* o_partial,
//       float* lse_partial, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k,
//       float softmax_scale, int causal, int splits)
//   zoo_fa3_combine_bf16_d<D>[_traced](const float* o_partial, const float* lse_partial, bf16* o,
//       float* lse, int batch, int heads_q, int seqlen_q, int splits)
//   q [batch, seqlen_q, heads_q, D]; k, v [batch, seqlen_k, heads_kv, D]; paged: k_cache, v_cache
//   [pages, page_size, heads_kv, D], page_table [batch, max_pages] int32 (key j of batch b is row
//   j % page_size of page page_table[b][j / page_size]); o_partial [splits, batch, heads_q,
//   seqlen_q, D] fp32, lse_partial [splits, batch, heads_q, seqlen_q] fp32. Query head h reads KV
//   head h / (heads_q / heads_kv). Pointers 16-byte aligned.
// Launch: forward kernels grid (cdiv(seqlen_q, 64), heads_q, batch) (split: batch * splits, z =
//   batch index * splits + split), block (256, 1, 1), dynamic shared memory smem_bytes<D>(): five
//   64 x D bf16 tiles (Q, two K and two V slots), 64 bytes of barriers and 1024 to align the tiles
//   (42048 for D 64, 83008 for D 128: the larger above 48 KiB, so the function's maximum must be
//   raised); the combine kernel grid (cdiv(seqlen_q, 64), heads_q, batch), block (128, 1, 1), none.
//   A build with -DORACLE_TRACE holds every entry point traced (_traced) and untraced; a build
//   without it holds the untraced ones only.
//
// Taps of the traced entry points (oracle_trace/attention.cuh; site: batch, query head, query
// block, KV block, split (kNone unless split); the consumer warpgroup taps): load_q [64, D],
// load_k [64, D], load_v [64, D] (the shared-memory tiles as the MMAs read them, after the full
// barrier), s and mask [64, 64] fp32, softmax_state [64, 3] (m in the mask's units, the rescale,
// l), p [64, 64] in its packed type, o [64, D] fp32 after each KV block, normalize [64, D + 1] (O
// / l and the LSE), combine [64, D + 1] (the combine kernel). Every stage is tapped for all 64 rows
// of the block (rows past seqlen_q are padding).
//
// Planted defects: define one of these (none: the correct kernel); the stage the oracle must name:
//   ZOO_FA3_KV_TAIL_NOT_ZEROED           K/V rows past seqlen_k are not zero-filled: they keep what
//                                        the slot held (the KV block two before)       load_k
//   ZOO_FA3_CAUSAL_OFF_BY_ONE            the causal bound is j <= i + off + 1          mask
//   ZOO_FA3_MAX_NOT_UPDATED_BEFORE_RESCALE  the rescale factor is computed from the old max (1)  softmax_state
//   ZOO_FA3_L_SUMMED_BEFORE_RESCALE      l = (l + rowsum) * rescale                    softmax_state
//   ZOO_FA3_P_WRONG_TYPE                 P is packed as fp16, which the bf16 WGMMA reads as bf16  p
//   ZOO_FA3_V_READ_WITH_K_LAYOUT         V's descriptor is K's (K-major, no trans-b): the MMA reads
//                                        B(key j, dim c) = V[c % 64][(c / 64) * 64 + j]  load_v
//   ZOO_FA3_SPLIT_MERGE_WITHOUT_MAX      a split hands the combine log l, its max dropped, as its LSE  combine
//   ZOO_FA3_EMPTY_ROW_DIVIDED_BY_ZERO    O / l without the l = 0 guard: a fully masked row is NaN  normalize
//   ZOO_FA3_GQA_HEAD_MODULO              query head h reads KV head h % heads_kv       load_k
//   ZOO_FA3_PAGE_TABLE_OFF_BY_ONE        the page table is read one entry too far (clamped to the last)  load_k
// Build: nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include
//        -I <cutlass>/include [-DORACLE_TRACE]

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

#include "oracle_trace/attention.cuh"
#include "../common/attention_combine.cuh"
#include "../common/attention_defects.cuh"
#include "../common/attention_softmax.cuh"

namespace zoo_fa3 {

ZOO_ATTN_DEFECT_FLAGS(ZOO_FA3)  // kKvTailNotZeroed, ... kPageOffByOne (zoo/common/attention_defects.cuh)

using T = __nv_bfloat16;
namespace GMMA = cute::SM90::GMMA;

constexpr int kBQ = 64;  // query rows a block
constexpr int kBKV = 64;  // keys a KV block
constexpr int kStages = 2;  // K/V slots of the ring
constexpr int kWgThreads = 128;  // one warpgroup
constexpr int kThreads = 2 * kWgThreads;  // producer, consumer
constexpr int kAtomBytes = 128;  // a swizzle atom's row: 64 bf16
constexpr int kHalfBytes = kBQ * kAtomBytes;  // one 64-column half of a 64-row tile
static_assert(kBQ == kBKV, "Q, K and V tiles share one shape and one swizzled layout");

template <int D>
constexpr int tile_bytes() { return kBQ * D * 2; }
constexpr int kBarrierBytes = 64;  // q_full, full[kStages], empty[kStages], 8 bytes each
template <int D>
constexpr int smem_bytes() { return (1 + 2 * kStages) * tile_bytes<D>() + kBarrierBytes + 1024; }
static_assert((1 + 2 * kStages) * 8 <= kBarrierBytes, "the barriers fit their bytes");
static_assert(smem_bytes<64>() == 42048 && smem_bytes<128>() == 83008, "the launch's dynamic shared memory");

// Byte offset of 16-byte chunk j (columns 8j .. 8j + 7) of row r in a [64, D] tile (1024-aligned):
// GMMA's 128-byte swizzle (Swizzle<3,4,3>) over 64-column halves.
__host__ __device__ constexpr int swz_offset(int r, int j) {
  return (j / 8) * kHalfBytes + r * kAtomBytes + (((j % 8) ^ (r % 8)) * 16);
}
// Element offset of (r, c) in such a tile: the tap's layout.
struct SwizzledTile {
  __host__ __device__ constexpr int operator()(int r, int c) const { return swz_offset(r, c / 8) / 2 + c % 8; }
};
// The V tile as the K-major descriptor of V_READ_WITH_K_LAYOUT hands it to the MMA: B(key r, dim c)
// is the tile's (row c % 64, column (c / 64) * 64 + r).
struct VReadAsK {
  __host__ __device__ constexpr int operator()(int r, int c) const {
    return SwizzledTile{}(c % 64, (c / 64) * 64 + r);
  }
};

// -- PTX: mbarriers, bulk copies, proxies ------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// 16 bytes global -> shared by the bulk-copy engine, completing on `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy16(uint32_t dst, const void* src, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 16, [%2];\n" ::"r"(dst),
               "l"(src), "r"(bar)
               : "memory");
}
// Generic-proxy writes to shared memory (the zero fill) made visible to the async proxy (WGMMA).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// -- WGMMA through CuTe's SM90 GMMA atoms ------------------------------------------------------------
// A shared-memory matrix descriptor, 128-byte swizzle: start, leading and stride byte offsets.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((start & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (static_cast<uint64_t>(1) << 62);
}
// K-major operand (Q, K): k16 step kk of a [64, D] tile.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile, int kk) {
  return gmma_desc(tile + (kk / 4) * kHalfBytes + (kk % 4) * 32, 16, 8 * kAtomBytes);
}
// MN-major operand (V: keys are k, head dims are n): keys 16 ks .. 16 ks + 15 of a [64, D] tile.
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile, int ks) {
  return gmma_desc(tile + ks * 16 * kAtomBytes, kHalfBytes, 8 * kAtomBytes);
}

template <int N, GMMA::Major MajorB>
struct Gmma;
template <GMMA::Major MajorB>
struct Gmma<64, MajorB> {
  using SS = GMMA::MMA_64x64x16_F32BF16BF16_SS<GMMA::Major::K, MajorB>;
  using RS = GMMA::MMA_64x64x16_F32BF16BF16_RS<GMMA::Major::K, MajorB>;
};
template <GMMA::Major MajorB>
struct Gmma<128, MajorB> {
  using SS = GMMA::MMA_64x128x16_F32BF16BF16_SS<GMMA::Major::K, MajorB>;
  using RS = GMMA::MMA_64x128x16_F32BF16BF16_RS<GMMA::Major::K, MajorB>;
};
template <class Atom, int N, size_t... I>
__device__ __forceinline__ void gmma_ss(uint64_t a, uint64_t b, float (&d)[N], GMMA::ScaleOut scale,
                                        std::index_sequence<I...>) {
  Atom::fma(a, b, d[I]..., scale);
}
template <class Atom, int N, size_t... I>
__device__ __forceinline__ void gmma_rs(const uint32_t (&a)[4], uint64_t b, float (&d)[N], std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], b, d[I]..., GMMA::ScaleOut::One);
}
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

// -- types -------------------------------------------------------------------------------------
using PT = typename std::conditional<kPWrongType, __half, __nv_bfloat16>::type;  // P's type as packed


// -- the problem ---------------------------------------------------------------------------------
using Params = zoo_attn::Params<T>;

// 16 zero bytes at shared address `at` (a plain store; `base` is the tiles' generic pointer).
__device__ __forceinline__ void zero16(unsigned char* base, uint32_t at) {
  *reinterpret_cast<uint4*>(base + (at - smem_addr(base))) = make_uint4(0, 0, 0, 0);
}

// -- the producer warpgroup: Q once, then K and V block after block into the ring ------------------
template <int D, bool Paged>
__device__ __forceinline__ void produce(const Params& p, uint32_t sQ, uint32_t sK0, uint32_t sV0, uint32_t q_full,
                                        uint32_t full0, uint32_t empty0, int b, int h, int hk, int qb,
                                        const zoo_attn::KvRange& kr, unsigned char* base) {
  constexpr int kRowChunks = D / 8;
  constexpr int kChunks = kBQ * kRowChunks;
  const int pt = threadIdx.x;  // 0 .. 127
  // Q: zero rows past seqlen_q, then arm and copy
  uint32_t bytes = 0;
  for (int c = pt; c < kChunks; c += kWgThreads) {
    const int r = c / kRowChunks, j = c % kRowChunks;
    if (qb * kBQ + r < p.seqlen_q)
      bytes += 16;
    else
      zero16(base, sQ + swz_offset(r, j));
  }
  fence_proxy_async();
  mbar_arrive_expect_tx(q_full, bytes);
  for (int c = pt; c < kChunks; c += kWgThreads) {
    const int r = c / kRowChunks, j = c % kRowChunks, row = qb * kBQ + r;
    if (row < p.seqlen_q)
      bulk_copy16(sQ + swz_offset(r, j), p.q + ((static_cast<long long>(b) * p.seqlen_q + row) * p.heads_q + h) * D + j * 8,
                  q_full);
  }
  // K and V: slot i % kStages, its empty barrier's phase (i / kStages) & 1 ^ 1 (a fresh barrier's
  // previous phase counts as complete)
  for (int kb = kr.kb0, i = 0; kb < kr.kb1; ++kb, ++i) {
    const int slot = i % kStages;
    const uint32_t full = full0 + 8 * slot, sK = sK0 + slot * tile_bytes<D>(), sV = sV0 + slot * tile_bytes<D>();
    mbar_wait(empty0 + 8 * slot, ((i / kStages) & 1) ^ 1);
    bytes = 0;
    for (int c = pt; c < kChunks; c += kWgThreads) {
      const int r = c / kRowChunks, j = c % kRowChunks;
      if (kb * kBKV + r < p.seqlen_k) {
        bytes += 32;
      } else if (!kKvTailNotZeroed) {  // the defect: these rows keep the slot's previous keys
        zero16(base, sK + swz_offset(r, j));
        zero16(base, sV + swz_offset(r, j));
      }
    }
    fence_proxy_async();
    mbar_arrive_expect_tx(full, bytes);
    for (int c = pt; c < kChunks; c += kWgThreads) {
      const int r = c / kRowChunks, j = c % kRowChunks, key = kb * kBKV + r;
      if (key < p.seqlen_k) {
        const long long at = zoo_attn::key_row<Paged, kPageOffByOne>(p, b, hk, key, D) + j * 8;
        bulk_copy16(sK + swz_offset(r, j), p.k + at, full);
        bulk_copy16(sV + swz_offset(r, j), p.v + at, full);
      }
    }
  }
}

// -- the forward kernel --------------------------------------------------------------------------
template <int D, bool Paged, bool Split, bool Trace>
__device__ __forceinline__ void forward(const Params& p) {
  using At = oracle_trace::AttentionTracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Stage;
  using GmmaS = Gmma<kBKV, GMMA::Major::K>;
  using GmmaO = Gmma<D, kVKLayout ? GMMA::Major::K : GMMA::Major::MN>;
  constexpr int kSRegs = kBKV / 2;  // S accumulator floats a thread holds: (64 x 64) / 128
  constexpr int kORegs = D / 2;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");

  if constexpr (At::enabled) At::Tr::smem_prologue();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // the tiles' 1024 alignment
  const uint32_t sQ = smem_addr(base);
  const uint32_t sK0 = sQ + tile_bytes<D>(), sV0 = sK0 + kStages * tile_bytes<D>();
  const uint32_t q_full = sV0 + kStages * tile_bytes<D>(), full0 = q_full + 8, empty0 = full0 + 8 * kStages;
  if (threadIdx.x == 0) {
    mbar_init(q_full, kWgThreads);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full0 + 8 * s, kWgThreads);
      mbar_init(empty0 + 8 * s, kWgThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  fence_proxy_async();  // the poison prologue's plain stores come before any bulk copy
  __syncthreads();

  const int qb = blockIdx.x, h = blockIdx.y;
  const int b = Split ? blockIdx.z / p.splits : blockIdx.z;
  const int split = Split ? blockIdx.z % p.splits : 0;
  const int hk = zoo_attn::kv_head<kGqaModulo>(h, p.heads_q, p.heads_kv);
  const zoo_attn::KvRange kr = zoo_attn::kv_range<kBQ, kBKV, kCausalOffByOne>(p, qb, split, Split);

  if (threadIdx.x < kWgThreads) {
    produce<D, Paged>(p, sQ, sK0, sV0, q_full, full0, empty0, b, h, hk, qb, kr, base);
    return;
  }

  // -- the consumer warpgroup --
  const int ct = threadIdx.x - kWgThreads, warp = ct / 32, lane = ct % 32, t4 = lane % 4;
  const int row0 = warp * 16 + lane / 4;  // this thread's rows of the block: row0 and row0 + 8
  const int site_split = Split ? split : oracle_trace::kNone;
  const oracle_trace::AttnSite unit{b, h, qb, oracle_trace::kNone, site_split};
  const T* tile_q = reinterpret_cast<const T*>(base);

  mbar_wait(q_full, 0);
  if constexpr (At::enabled) At::tap_q(unit, tile_q, kBQ, D, SwizzledTile{}, ct, kWgThreads);

  float m[2] = {-INFINITY, -INFINITY};  // running row max of x (log2 units)
  float l[2] = {0.f, 0.f};  // running row sum
  float mt[2] = {-INFINITY, -INFINITY};  // traced only: the running max in the mask stage's units
  float acc[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) acc[i] = 0.f;
  const float scale_log2 = p.scale * zoo_attn::kLog2e;
  const zoo_attn::Frag f{row0, t4};  // accumulator element i of an m64nN fragment: (f.row(i), f.col(i))
  auto acc_at = [&](int i) -> float& { return acc[i]; };

  for (int kb = kr.kb0, it = 0; kb < kr.kb1; ++kb, ++it) {
    const int slot = it % kStages;
    const uint32_t sK = sK0 + slot * tile_bytes<D>(), sV = sV0 + slot * tile_bytes<D>();
    mbar_wait(full0 + 8 * slot, (it / kStages) & 1);
    const oracle_trace::AttnSite at{b, h, qb, kb, site_split};
    if constexpr (At::enabled) {
      const T* tile_k = reinterpret_cast<const T*>(base + (sK - sQ));
      const T* tile_v = reinterpret_cast<const T*>(base + (sV - sQ));
      At::tap_k(at, tile_k, kBKV, D, SwizzledTile{}, ct, kWgThreads);
      if constexpr (kVKLayout)
        At::tap_v(at, tile_v, kBKV, D, VReadAsK{}, ct, kWgThreads);
      else
        At::tap_v(at, tile_v, kBKV, D, SwizzledTile{}, ct, kWgThreads);
    }

    // S = Q K^T
    float s[kSRegs];
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;
    fence_operands(s);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      gmma_ss<typename GmmaS::SS>(desc_k_major(sQ, kk), desc_k_major(sK, kk), s,
                                  kk == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One,
                                  std::make_index_sequence<kSRegs>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_operands(s);

    auto s_at = [&](int i) -> float& { return s[i]; };
    zoo_attn::mask<At, kBQ, kBKV, kSRegs>(s_at, f, p, kr, qb, kb, scale_log2, mt, at);

    // the online softmax: s becomes P in fp32
    float rescale[2];
    zoo_attn::online_softmax<At, kMaxNotUpdated, kLBeforeRescale, kBQ, kSRegs>(s_at, f, kb == kr.kb0, m, l, rescale,
                                                                               mt, at);

    // P in WGMMA's A registers: k16 step ks covers keys 16 ks .. 16 ks + 15 (accumulator octets 2 ks, 2 ks + 1)
    uint32_t pa[kBKV / 16][4];
    zoo_attn::pack_p<At, PT, kBQ, kBKV, kSRegs>(s_at, pa, f, at);

    // O = O * rescale + P V
    zoo_attn::rescale_o<kORegs>(acc_at, rescale);
    fence_operands(acc);
#pragma unroll
    for (int ks = 0; ks < kBKV / 16; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(pa[ks][r]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int ks = 0; ks < kBKV / 16; ++ks) {
      const uint64_t dv = kVKLayout ? desc_k_major(sV, ks) : desc_mn_major(sV, ks);
      gmma_rs<typename GmmaO::RS>(pa[ks], dv, acc, std::make_index_sequence<kORegs>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    fence_operands(acc);
    mbar_arrive(empty0 + 8 * slot);  // both MMAs are done with the slot
    zoo_attn::tap_o<At, kBQ, D>(acc_at, f, at);
  }

  // normalize: O / l and the LSE
  float inv[2], lse[2];
  zoo_attn::normalize<At, kEmptyRowNan, kBQ, D>(acc_at, f, m, l, inv, lse, unit);

  // store
  zoo_attn::store<Split, kMergeWithoutMax, kBQ, D>(acc, f, p, inv, lse, l, b, h, qb, split);
}

}  // namespace zoo_fa3

// -- entry points ----------------------------------------------------------------------------------
#define ZOO_FA3_ENTRIES(D, SUFFIX, TRACE)                                                                            \
  extern "C" __global__ void __launch_bounds__(zoo_fa3::kThreads, 1) zoo_fa3_bf16_d##D##SUFFIX(                     \
      const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, float* lse,          \
      int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal) {           \
    const zoo_fa3::Params p{q, k, v, nullptr, o, lse, nullptr, nullptr, batch, heads_q, heads_kv, seqlen_q,         \
                            seqlen_k, softmax_scale, causal, 1, 0, 0};                                               \
    zoo_fa3::forward<D, false, false, TRACE>(p);                                                                     \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(zoo_fa3::kThreads, 1) zoo_fa3_paged_bf16_d##D##SUFFIX(               \
      const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, const int* page_table,   \
      __nv_bfloat16* o, float* lse, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k,                \
      float softmax_scale, int causal, int page_size, int max_pages) {                                               \
    const zoo_fa3::Params p{q, k_cache, v_cache, page_table, o, lse, nullptr, nullptr, batch, heads_q, heads_kv,    \
                            seqlen_q, seqlen_k, softmax_scale, causal, 1, page_size, max_pages};                     \
    zoo_fa3::forward<D, true, false, TRACE>(p);                                                                      \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(zoo_fa3::kThreads, 1) zoo_fa3_split_bf16_d##D##SUFFIX(               \
      const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* o_partial, float* lse_partial, \
      int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal,             \
      int splits) {                                                                                                  \
    const zoo_fa3::Params p{q, k, v, nullptr, nullptr, nullptr, o_partial, lse_partial, batch, heads_q, heads_kv,   \
                            seqlen_q, seqlen_k, softmax_scale, causal, splits, 0, 0};                                \
    zoo_fa3::forward<D, false, true, TRACE>(p);                                                                      \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(2 * zoo_fa3::kBQ) zoo_fa3_combine_bf16_d##D##SUFFIX(                 \
      const float* o_partial, const float* lse_partial, __nv_bfloat16* o, float* lse, int batch, int heads_q,       \
      int seqlen_q, int splits) {                                                                                    \
    zoo_attn::combine<__nv_bfloat16, zoo_fa3::kBQ, D, TRACE>(o_partial, lse_partial, o, lse, batch, heads_q,        \
                                                             seqlen_q, splits);                                      \
  }

#define ZOO_FA3_ALL(SUFFIX, TRACE) \
  ZOO_FA3_ENTRIES(64, SUFFIX, TRACE) \
  ZOO_FA3_ENTRIES(128, SUFFIX, TRACE)

ZOO_FA3_ALL(, false)
#if defined(ORACLE_TRACE)
ZOO_FA3_ALL(_traced, true)
#endif

#undef ZOO_FA3_ALL
#undef ZOO_FA3_ENTRIES

// fa2_sm80.cu -- the bug zoo's FlashAttention-2-style forward kernel for sm_80+: cp.async,
// ldmatrix, mma.sync; correct, or with one planted defect chosen by a define, every entry point
// also built with oracle_trace/attention.cuh taps.
//
//   O = softmax(mask(scale * Q K^T)) V,  LSE = log sum exp(mask(scale * Q K^T))  per (batch, query head)
//
// One CTA per (query block of 64 rows, query head, batch [x split]); 4 warps, warp w owns query
// rows 16w .. 16w + 15 of the block. Per KV block of 64 keys (block after block, one buffer):
//   global -> shared   cp.async.cg 16-byte chunks; Q once, then K and V of the block. Rows past
//                      seqlen_q / seqlen_k are zero-filled (src-size 0). Tiles row-major with
//                      rows padded by 8 elements (row stride D + 8), so no swizzle is needed.
//   S = Q K^T          ldmatrix.x4 (Q as A, K as B: both d-contiguous) and
//                      mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}, fp32 accumulators.
//   mask               t = S * softmax_scale; -inf for a key past seqlen_k or, causal, a key
//                      j > i + off (off = 0 top-left, seqlen_k - seqlen_q bottom-right).
//   online softmax     in registers, FA2's way with log2(e) folded into the scale:
//                        x = S * scale * log2(e) (masked: -inf), m_new = max(m, rowmax x),
//                        m_use = m_new or 0 where m_new = -inf, rescale = exp2(m - m_use)
//                        (1 at the split's first block), p = exp2(x - m_use) fp32,
//                        l = l * rescale + rowsum p, O *= rescale; row max and sum over the 4
//                        threads of a quad by shuffles.
//   P                  p rounded to T (RN) into the A fragments of the second MMA directly (the
//                      m16n8k16 C fragment of two key octets is the A fragment of one k-step).
//   O += P V           V as B through ldmatrix.x4.trans (V is key-major in shared memory).
//   normalize          O / l (O = 0 for a row with l = 0), LSE = m * ln 2 + log l (-inf for l = 0).
//   store              O as T into [batch, seqlen_q, heads_q, D], LSE fp32 into [batch, heads_q,
//                      seqlen_q]; split-KV: O / l fp32 and the split's LSE into the partial
//                      buffers, merged by the combine kernel (zoo/common/attention_combine.cuh).
// The KV blocks a query block needs: all, or causally up to its last row's last key; split s of S
// takes blocks s * per .. (s + 1) * per - 1 of those, per = cdiv(kv_blocks, S) (FlashAttention's
// rule; a split with no block writes O = 0 and LSE = -inf).
//
// Entry points (extern "C"), <dt> bf16 (T = __nv_bfloat16) or fp16 (T = __half), <D> 64 or 128
// (head_dim = head_dim_v = D); causal: 0 none, 1 top-left, 2 bottom-right:
//   zoo_fa2_<dt>_d<D>[_traced](const T* q, const T* k, const T* v, T* o, float* lse,
//       int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal)
//   zoo_fa2_paged_<dt>_d<D>[_traced](const T* q, const T* k_cache, const T* v_cache, const int* page_table,
//       T* o, float* lse, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k,
//       float softmax_scale, int causal, int page_size, int max_pages)
//   zoo_fa2_split_<dt>_d<D>[_traced](const T* q, const T* k, const T* v, float* o_partial, float* lse_partial,
//       int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal,
//       int splits)
//   zoo_fa2_combine_<dt>_d<D>[_traced](const float* o_partial, const float* lse_partial, T* o, float* lse,
//       int batch, int heads_q, int seqlen_q, int splits)
//   q [batch, seqlen_q, heads_q, D]; k, v [batch, seqlen_k, heads_kv, D]; paged: k_cache, v_cache
//   [pages, page_size, heads_kv, D], page_table [batch, max_pages] int32 (key j of batch b is
//   row j % page_size of page page_table[b][j / page_size]); o_partial [splits, batch, heads_q,
//   seqlen_q, D] fp32, lse_partial [splits, batch, heads_q, seqlen_q] fp32. Query head h reads KV
//   head h / (heads_q / heads_kv). Pointers 16-byte aligned.
// Launch: forward kernels grid (cdiv(seqlen_q, 64), heads_q, batch) (split: batch * splits, z =
//   batch index * splits + split), block (128, 1, 1), dynamic shared memory 3 * 64 * (D + 8) * 2
//   bytes (27648 for D 64, 52224 for D 128: above 48 KiB, so the function's maximum must be
//   raised); the combine kernel grid (cdiv(seqlen_q, 64), heads_q, batch), block (128, 1, 1), none.
//   A build with -DORACLE_TRACE holds every entry point traced (_traced) and untraced; a build
//   without it holds the untraced ones only.
//
// Taps of the traced entry points (oracle_trace/attention.cuh; site: batch, query head, query
// block, KV block, split (kNone unless split)): load_q [64, D], load_k [64, D], load_v [64, D]
// (the shared-memory tiles as the MMAs read them), s and mask [64, 64] fp32, softmax_state
// [64, 3] (m in the mask's units, the rescale, l), p [64, 64] in T, o [64, D] fp32 after each KV
// block, normalize [64, D + 1] (O / l and the LSE), combine [64, D + 1] (the combine kernel).
// Every stage is tapped for all 64 rows of the block (rows past seqlen_q are padding).
//
// Planted defects: define one of these (none: the correct kernel); the stage the oracle must name:
//   ZOO_FA2_KV_TAIL_NOT_ZEROED           K/V rows past seqlen_k are not copied nor zero-filled: they hold the
//                                        previous KV block's rows                              load_k
//   ZOO_FA2_CAUSAL_OFF_BY_ONE            the causal bound is j <= i + off + 1: each row sees one key too many  mask
//   ZOO_FA2_MAX_NOT_UPDATED_BEFORE_RESCALE  the rescale factor is computed from the old max (1)  softmax_state
//   ZOO_FA2_L_SUMMED_BEFORE_RESCALE      l = (l + rowsum) * rescale                            softmax_state
//   ZOO_FA2_P_WRONG_TYPE                 P is packed in the other 16-bit type (fp16 beside a bf16 V, and
//                                        the reverse), which the second MMA reads as V's type   p
//   ZOO_FA2_V_READ_WITH_K_LAYOUT         V is read with ldmatrix without .trans, as K is: every 8 x 8
//                                        block transposed                                      load_v
//   ZOO_FA2_SPLIT_MERGE_WITHOUT_MAX      a split hands the combine log l, its max dropped, as its LSE  combine
//   ZOO_FA2_EMPTY_ROW_DIVIDED_BY_ZERO    O / l without the l = 0 guard: a fully masked row is NaN  normalize
//   ZOO_FA2_GQA_HEAD_MODULO              query head h reads KV head h % heads_kv               load_k
//   ZOO_FA2_PAGE_TABLE_OFF_BY_ONE        the page table is read one entry too far (clamped to the last)  load_k

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "oracle_trace/attention.cuh"
#include "../common/attention_combine.cuh"
#include "../common/attention_defects.cuh"
#include "../common/attention_softmax.cuh"

namespace zoo_fa2 {

ZOO_ATTN_DEFECT_FLAGS(ZOO_FA2)  // kKvTailNotZeroed, ... kPageOffByOne (zoo/common/attention_defects.cuh)

constexpr int kBQ = 64;  // query rows a block
constexpr int kBKV = 64;  // keys a KV block
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;  // elements each shared-memory row is padded by

template <int D>
constexpr int row_stride() { return D + kPad; }
template <int D>
constexpr int smem_bytes() { return 3 * kBQ * row_stride<D>() * 2; }
static_assert(kBQ == kBKV, "Q, K and V tiles share one shape");
static_assert(smem_bytes<64>() == 27648 && smem_bytes<128>() == 52224, "the launch's dynamic shared memory");

// -- types -------------------------------------------------------------------------------------
template <class T>
struct Other;  // the other 16-bit type (P_WRONG_TYPE)
template <>
struct Other<__nv_bfloat16> { using type = __half; };
template <>
struct Other<__half> { using type = __nv_bfloat16; };


// -- PTX ---------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `bytes` 16 copies, 0 zero-fills (nothing is read from `src`).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a (16 x 16, row) * b (16 x 8, col), fp32 accumulators.
__device__ __forceinline__ void mma16816(__nv_bfloat16, float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(__half, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// -- the problem ---------------------------------------------------------------------------------
template <class T>
using Params = zoo_attn::Params<T>;

template <bool B, class X, class Y>
struct Pick { using type = X; };
template <class X, class Y>
struct Pick<false, X, Y> { using type = Y; };

// The V tile as ldmatrix without .trans hands it to the MMA (V_READ_WITH_K_LAYOUT): B(key r, dim c)
// is V[r0 + c % 8][c0 + r % 8] of the 8 x 8 block (r0, c0): every block transposed.
template <int ST>
struct VReadAsK {
  __host__ __device__ constexpr int operator()(int r, int c) const {
    return ((r / 8) * 8 + c % 8) * ST + (c / 8) * 8 + r % 8;
  }
};

// -- the forward kernel --------------------------------------------------------------------------
template <class T, int D, bool Paged, bool Split, bool Trace>
__device__ __forceinline__ void forward(const Params<T>& p) {
  using At = oracle_trace::AttentionTracer<Trace>;
  using oracle_trace::Element;
  using oracle_trace::Stage;
  using PT = typename Pick<kPWrongType, typename Other<T>::type, T>::type;  // P's type as packed
  constexpr int ST = row_stride<D>();
  constexpr int kChunks = kBQ * D / 8;  // 16-byte chunks of a tile
  constexpr int kDTiles = D / 8;  // 8-column n-tiles of O a warp holds
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");

  if constexpr (At::enabled) At::Tr::smem_prologue();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBQ * ST;
  T* sV = sK + kBKV * ST;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, t4 = lane % 4;
  const int row0 = warp * 16 + lane / 4;  // this thread's rows of the block: row0 and row0 + 8
  const int qb = blockIdx.x, h = blockIdx.y;
  const int b = Split ? blockIdx.z / p.splits : blockIdx.z;
  const int split = Split ? blockIdx.z % p.splits : 0;
  const int site_split = Split ? split : oracle_trace::kNone;
  const int hk = zoo_attn::kv_head<kGqaModulo>(h, p.heads_q, p.heads_kv);
  const oracle_trace::AttnSite unit{b, h, qb, oracle_trace::kNone, site_split};

  // Q, zero past seqlen_q
  for (int c = tid; c < kChunks; c += kThreads) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8, row = qb * kBQ + r;
    const bool ok = row < p.seqlen_q;
    const long long at = ok ? ((static_cast<long long>(b) * p.seqlen_q + row) * p.heads_q + h) * D + col : 0;
    cp_async16(sQ + r * ST + col, p.q + at, ok ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  if constexpr (At::enabled) At::tap_q(unit, sQ, kBQ, D, oracle_trace::Strided{ST, 1});

  // the KV blocks of this query block (and split)
  const zoo_attn::KvRange kr = zoo_attn::kv_range<kBQ, kBKV, kCausalOffByOne>(p, qb, split, Split);

  float m[2] = {-INFINITY, -INFINITY};  // running row max of x (log2 units)
  float l[2] = {0.f, 0.f};  // running row sum
  float mt[2] = {-INFINITY, -INFINITY};  // traced only: the running max in the mask stage's units
  float acc[kDTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;
  const float scale_log2 = p.scale * zoo_attn::kLog2e;
  const zoo_attn::Frag f{row0, t4};
  // element i of the fragments: s[i / 4][i % 4], acc[i / 4][i % 4]
  auto acc_at = [&](int i) -> float& { return acc[i / 4][i % 4]; };

  for (int kb = kr.kb0; kb < kr.kb1; ++kb) {
    __syncthreads();  // every warp is done with the previous block's K and V
    for (int c = tid; c < kChunks; c += kThreads) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8, key = kb * kBKV + r;
      const bool ok = key < p.seqlen_k;
      if (kKvTailNotZeroed && !ok) continue;  // the defect: these rows keep the previous block's keys
      const long long at = ok ? zoo_attn::key_row<Paged, kPageOffByOne>(p, b, hk, key, D) + col : 0;
      cp_async16(sK + r * ST + col, p.k + at, ok ? 16 : 0);
      cp_async16(sV + r * ST + col, p.v + at, ok ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    const oracle_trace::AttnSite at{b, h, qb, kb, site_split};
    if constexpr (At::enabled) {
      At::tap_k(at, sK, kBKV, D, oracle_trace::Strided{ST, 1});
      if constexpr (kVKLayout)
        At::tap_v(at, sV, kBKV, D, VReadAsK<ST>{});
      else
        At::tap_v(at, sV, kBKV, D, oracle_trace::Strided{ST, 1});
    }

    // S = Q K^T: s[nt][e] is (row0 + 8 * (e / 2), key nt * 8 + 2 * t4 + e % 2)
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + (warp * 16 + lane % 8 + ((lane / 8) % 2) * 8) * ST + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(bk, sK + (np * 16 + lane % 8 + (lane / 16) * 8) * ST + kk * 16 + ((lane / 8) % 2) * 8);
        mma16816(T(), s[2 * np], a, bk[0], bk[1]);
        mma16816(T(), s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    auto s_at = [&](int i) -> float& { return s[i / 4][i % 4]; };
    zoo_attn::mask<At, kBQ, kBKV, 32>(s_at, f, p, kr, qb, kb, scale_log2, mt, at);

    // the online softmax: s becomes P in fp32
    float rescale[2];
    zoo_attn::online_softmax<At, kMaxNotUpdated, kLBeforeRescale, kBQ, 32>(s_at, f, kb == kr.kb0, m, l, rescale, mt, at);

    // P in the A fragments of the second MMA: k-step ks covers keys 16 ks .. 16 ks + 15
    uint32_t pa[4][4];
    zoo_attn::pack_p<At, PT, kBQ, kBKV, 32>(s_at, pa, f, at);

    // O = O * rescale + P V
    zoo_attn::rescale_o<D / 2>(acc_at, rescale);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        const T* src = sV + (ks * 16 + lane % 8 + ((lane / 8) % 2) * 8) * ST + dp * 16 + (lane / 16) * 8;
        if constexpr (kVKLayout)
          ldmatrix_x4(bv, src);
        else
          ldmatrix_x4_trans(bv, src);
        mma16816(T(), acc[2 * dp], pa[ks], bv[0], bv[1]);
        mma16816(T(), acc[2 * dp + 1], pa[ks], bv[2], bv[3]);
      }
    zoo_attn::tap_o<At, kBQ, D>(acc_at, f, at);
  }

  // normalize: O / l and the LSE
  float inv[2], lse[2];
  zoo_attn::normalize<At, kEmptyRowNan, kBQ, D>(acc_at, f, m, l, inv, lse, unit);

  // store
  zoo_attn::store<Split, kMergeWithoutMax, kBQ, D>(acc, f, p, inv, lse, l, b, h, qb, split);
}

}  // namespace zoo_fa2

// -- entry points ----------------------------------------------------------------------------------
#define ZOO_FA2_ENTRIES(DT, T, D, SUFFIX, TRACE)                                                                     \
  extern "C" __global__ void __launch_bounds__(zoo_fa2::kThreads) zoo_fa2_##DT##_d##D##SUFFIX(                      \
      const T* q, const T* k, const T* v, T* o, float* lse, int batch, int heads_q, int heads_kv, int seqlen_q,      \
      int seqlen_k, float softmax_scale, int causal) {                                                               \
    const zoo_fa2::Params<T> p{q, k, v, nullptr, o, lse, nullptr, nullptr, batch, heads_q, heads_kv, seqlen_q,     \
                               seqlen_k, softmax_scale, causal, 1, 0, 0};                                            \
    zoo_fa2::forward<T, D, false, false, TRACE>(p);                                                                  \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(zoo_fa2::kThreads) zoo_fa2_paged_##DT##_d##D##SUFFIX(                \
      const T* q, const T* k_cache, const T* v_cache, const int* page_table, T* o, float* lse, int batch,           \
      int heads_q, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal, int page_size,         \
      int max_pages) {                                                                                               \
    const zoo_fa2::Params<T> p{q, k_cache, v_cache, page_table, o, lse, nullptr, nullptr, batch, heads_q, heads_kv, \
                               seqlen_q, seqlen_k, softmax_scale, causal, 1, page_size, max_pages};                  \
    zoo_fa2::forward<T, D, true, false, TRACE>(p);                                                                   \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(zoo_fa2::kThreads) zoo_fa2_split_##DT##_d##D##SUFFIX(                \
      const T* q, const T* k, const T* v, float* o_partial, float* lse_partial, int batch, int heads_q,             \
      int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale, int causal, int splits) {                       \
    const zoo_fa2::Params<T> p{q, k, v, nullptr, nullptr, nullptr, o_partial, lse_partial, batch, heads_q,         \
                               heads_kv, seqlen_q, seqlen_k, softmax_scale, causal, splits, 0, 0};                   \
    zoo_fa2::forward<T, D, false, true, TRACE>(p);                                                                   \
  }                                                                                                                  \
  extern "C" __global__ void __launch_bounds__(zoo_fa2::kThreads) zoo_fa2_combine_##DT##_d##D##SUFFIX(              \
      const float* o_partial, const float* lse_partial, T* o, float* lse, int batch, int heads_q, int seqlen_q,     \
      int splits) {                                                                                                  \
    zoo_attn::combine<T, zoo_fa2::kBQ, D, TRACE>(o_partial, lse_partial, o, lse, batch, heads_q, seqlen_q,           \
                                                 splits);                                                            \
  }

#define ZOO_FA2_ALL(SUFFIX, TRACE)                         \
  ZOO_FA2_ENTRIES(bf16, __nv_bfloat16, 64, SUFFIX, TRACE)  \
  ZOO_FA2_ENTRIES(bf16, __nv_bfloat16, 128, SUFFIX, TRACE) \
  ZOO_FA2_ENTRIES(fp16, __half, 64, SUFFIX, TRACE)         \
  ZOO_FA2_ENTRIES(fp16, __half, 128, SUFFIX, TRACE)

ZOO_FA2_ALL(, false)
#if defined(ORACLE_TRACE)
ZOO_FA2_ALL(_traced, true)
#endif

#undef ZOO_FA2_ALL
#undef ZOO_FA2_ENTRIES

// Fixture for tests/cpu/test_attention_trace.py: a small FlashAttention-2-style forward kernel
// (bf16 Q, K, V; fp32 online softmax; one thread per query row) that uses every tap of
// oracle_trace/attention.cuh, built three ways:
//   -DATTENTION_TAPS_WITH_HEADER                  header included, tracing off
//   (nothing)                                     header and taps absent altogether
//   -DATTENTION_TAPS_WITH_HEADER -DORACLE_TRACE   tracing on
// The first two must give identical SASS; the third must differ in attention_taps_fwd only.
//
// extern "C" __global__ void attention_taps_fwd(const __nv_bfloat16* q, const __nv_bfloat16* k,
//     const __nv_bfloat16* v, float* o, float* lse, int seqlen_q, int seqlen_k, int heads, float scale_log2);
//   q, o [batch, seqlen_q, heads, 32]; k, v [batch, seqlen_k, heads, 32]; lse [batch, heads, seqlen_q];
//   grid (ceil(seqlen_q / 32), heads, batch), block 32. No split, no mask.
// attention_taps_fwd_untraced: the same with the Trace switch off (no taps in any build).

#include <cuda_bf16.h>

#if defined(ATTENTION_TAPS_WITH_HEADER)
#include "oracle_trace/attention.cuh"
#define ATTENTION_TAPS(...) __VA_ARGS__
#else
#define ATTENTION_TAPS(...)
#endif

namespace {

constexpr int kBQ = 32, kBKV = 32, kD = 32;

template <bool Trace>
__device__ __forceinline__ void fwd(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* o,
                                    float* lse, int seqlen_q, int seqlen_k, int heads, float scale_log2) {
  __shared__ __nv_bfloat16 sq[kBQ][kD];
  __shared__ __nv_bfloat16 sk[kBKV][kD];
  __shared__ __nv_bfloat16 sv[kBKV][kD];
  const int r = threadIdx.x, q_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int qi = q_block * kBQ + r;
  ATTENTION_TAPS(using At = oracle_trace::AttentionTracer<Trace>;
                 oracle_trace::AttnSite at{batch, head, q_block};)
  for (int d = 0; d < kD; ++d)
    sq[r][d] = qi < seqlen_q ? q[((size_t(batch) * seqlen_q + qi) * heads + head) * kD + d] : __float2bfloat16(0.f);
  __syncthreads();
  ATTENTION_TAPS(if constexpr (At::enabled) At::tap_q(at, &sq[0][0], kBQ, kD, oracle_trace::Strided{kD, 1});)
  float m = -INFINITY, l = 0.f, acc[kD];
  for (int d = 0; d < kD; ++d) acc[d] = 0.f;
  for (int kb = 0; kb * kBKV < seqlen_k; ++kb) {
    ATTENTION_TAPS(at.kv_block = kb;)
    __syncthreads();
    const int kj = kb * kBKV + r;
    for (int d = 0; d < kD; ++d) {
      const size_t g = ((size_t(batch) * seqlen_k + kj) * heads + head) * kD + d;
      sk[r][d] = kj < seqlen_k ? k[g] : __float2bfloat16(0.f);
      sv[r][d] = kj < seqlen_k ? v[g] : __float2bfloat16(0.f);
    }
    __syncthreads();
    ATTENTION_TAPS(if constexpr (At::enabled) {
      At::tap_k(at, &sk[0][0], kBKV, kD, oracle_trace::Strided{kD, 1});
      At::tap_v(at, &sv[0][0], kBKV, kD, oracle_trace::Strided{kD, 1});
    })
    float s[kBKV];
    float m_new = m;
    for (int j = 0; j < kBKV; ++j) {
      float dot = 0.f;
      for (int d = 0; d < kD; ++d) dot += __bfloat162float(sq[r][d]) * __bfloat162float(sk[j][d]);
      s[j] = dot;
    }
    ATTENTION_TAPS(if constexpr (At::enabled) At::tap_scores(oracle_trace::Stage::S, at, kBQ, kBKV, kBKV, [&](int j) {
      return oracle_trace::Element<float>{r, j, s[j]};
    });)
    for (int j = 0; j < kBKV; ++j) {
      s[j] = kb * kBKV + j < seqlen_k ? s[j] * scale_log2 : -INFINITY;
      m_new = fmaxf(m_new, s[j]);
    }
    ATTENTION_TAPS(if constexpr (At::enabled) At::tap_scores(oracle_trace::Stage::Mask, at, kBQ, kBKV, kBKV, [&](int j) {
      return oracle_trace::Element<float>{r, j, s[j]};
    });)
    const float rescale = exp2f(m - m_new);
    __nv_bfloat16 p[kBKV];
    float rowsum = 0.f;
    for (int j = 0; j < kBKV; ++j) {
      p[j] = __float2bfloat16(exp2f(s[j] - m_new));
      rowsum += __bfloat162float(p[j]);
    }
    l = l * rescale + rowsum;
    m = m_new;
    ATTENTION_TAPS(if constexpr (At::enabled) {
      At::tap_softmax_state(at, kBQ, 1, [&](int) { return oracle_trace::RowState{r, m, rescale, l}; });
      At::tap_scores(oracle_trace::Stage::P, at, kBQ, kBKV, kBKV, [&](int j) {
        return oracle_trace::Element<__nv_bfloat16>{r, j, p[j]};
      });
    })
    for (int d = 0; d < kD; ++d) {
      float x = acc[d] * rescale;
      for (int j = 0; j < kBKV; ++j) x += __bfloat162float(p[j]) * __bfloat162float(sv[j][d]);
      acc[d] = x;
    }
    ATTENTION_TAPS(if constexpr (At::enabled) At::tap_o(at, kBQ, kD, kD, [&](int d) {
      return oracle_trace::Element<float>{r, d, acc[d]};
    });)
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  const float row_lse = m * 0.69314718f + logf(l);
  ATTENTION_TAPS(if constexpr (At::enabled) {
    At::tap_out(oracle_trace::Stage::Normalize, at, kBQ, kD, kD, [&](int d) {
      return oracle_trace::Element<float>{r, d, acc[d] * inv};
    });
    At::tap_lse(oracle_trace::Stage::Normalize, at, kBQ, kD, 1, [&](int) { return oracle_trace::RowValue{r, row_lse}; });
    At::tap_out(oracle_trace::Stage::Combine, at, kBQ, kD, kD, [&](int d) {
      return oracle_trace::Element<float>{r, d, acc[d] * inv};
    });
    At::tap_lse(oracle_trace::Stage::Combine, at, kBQ, kD, 1, [&](int) { return oracle_trace::RowValue{r, row_lse}; });
  })
  if (qi < seqlen_q) {
    for (int d = 0; d < kD; ++d) o[((size_t(batch) * seqlen_q + qi) * heads + head) * kD + d] = acc[d] * inv;
    lse[(size_t(batch) * heads + head) * seqlen_q + qi] = row_lse;
  }
}

}  // namespace

extern "C" __global__ void attention_taps_fwd(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                              float* o, float* lse, int seqlen_q, int seqlen_k, int heads,
                                              float scale_log2) {
  fwd<true>(q, k, v, o, lse, seqlen_q, seqlen_k, heads, scale_log2);
}

extern "C" __global__ void attention_taps_fwd_untraced(const __nv_bfloat16* q, const __nv_bfloat16* k,
                                                       const __nv_bfloat16* v, float* o, float* lse, int seqlen_q,
                                                       int seqlen_k, int heads, float scale_log2) {
  fwd<false>(q, k, v, o, lse, seqlen_q, seqlen_k, heads, scale_log2);
}

// attention_combine.cuh -- the split-KV combine of the zoo's attention kernels: every query row's
// per-split partials (O / l in fp32 and the split's LSE) merged by their LSE, defined once for all.
//
//   lse = log sum_s exp(lse_s),  O = sum_s exp(lse_s - lse) O_s   (a row no split saw: O = 0, LSE = -inf)
//
// One CTA per (query block of BQ rows, query head, batch), 2 * BQ threads: thread t merges row
// t / 2 of the block, head dims (t % 2) * D / 2 .. + D / 2.
//   o_partial [splits, batch, heads_q, seqlen_q, D] fp32, lse_partial [splits, batch, heads_q, seqlen_q]
//   fp32; o [batch, seqlen_q, heads_q, D] in T, lse [batch, heads_q, seqlen_q] fp32.
// Traced (oracle_trace/attention.cuh): the combine stage [BQ, D + 1] (O, then the LSE in column D)
// of every row of the block, rows past seqlen_q as zeros and -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "oracle_trace/attention.cuh"

namespace zoo_attn {

__device__ __forceinline__ uint32_t pack_out(__nv_bfloat16, float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_out(__half, float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <class T, int BQ, int D, bool Trace>
__device__ __forceinline__ void combine(const float* o_partial, const float* lse_partial, T* o, float* lse, int batch,
                                        int heads_q, int seqlen_q, int splits) {
  using At = oracle_trace::AttentionTracer<Trace>;
  constexpr int kCols = D / 2;
  const int qb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int r = threadIdx.x / 2, c0 = (threadIdx.x % 2) * kCols, row = qb * BQ + r;
  float out[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) out[c] = 0.f;
  float lse_row = -INFINITY;
  if (row < seqlen_q) {
    const long long stride = static_cast<long long>(batch) * heads_q * seqlen_q;  // one split's rows
    const long long at = (static_cast<long long>(b) * heads_q + h) * seqlen_q + row;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse_partial[s * stride + at]);
    if (mx != -INFINITY) {
      float sum = 0.f;
      for (int s = 0; s < splits; ++s) sum += expf(lse_partial[s * stride + at] - mx);
      lse_row = mx + logf(sum);
      for (int s = 0; s < splits; ++s) {
        const float w = expf(lse_partial[s * stride + at] - lse_row);
        const float* src = o_partial + (s * stride + at) * D + c0;
#pragma unroll
        for (int c = 0; c < kCols; ++c) out[c] += w * src[c];
      }
    }
    T* dst = o + ((static_cast<long long>(b) * seqlen_q + row) * heads_q + h) * D + c0;
#pragma unroll
    for (int c = 0; c < kCols; c += 2) *reinterpret_cast<uint32_t*>(dst + c) = pack_out(T(), out[c], out[c + 1]);
    if (c0 == 0) lse[(static_cast<long long>(b) * heads_q + h) * seqlen_q + row] = lse_row;
  }
  if constexpr (At::enabled) {
    const oracle_trace::AttnSite merged{b, h, qb};
    At::tap_out(oracle_trace::Stage::Combine, merged, BQ, D, kCols,
                [&](int i) { return oracle_trace::Element<float>{r, c0 + i, out[i]}; });
    if (c0 == 0)
      At::tap_lse(oracle_trace::Stage::Combine, merged, BQ, D, 1,
                  [&](int) { return oracle_trace::RowValue{r, lse_row}; });
  }
}

}  // namespace zoo_attn

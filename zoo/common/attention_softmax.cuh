// attention_softmax.cuh -- what the zoo's attention kernels (fa2_sm80, fa3_sm90) do alike around
// their two MMAs, defined once: the problem's parameters, the KV blocks of a query block, the mask,
// the online softmax, P's packing, the normalize and the store, each with its taps
// (oracle_trace/attention.cuh). The kernels hand their planted defects in as template flags.
//
// A thread holds two rows of an accumulator in the m16n8 fragment order (Frag): element i is
// (row0 + 8 * ((i / 2) % 2), (i / 4) * 8 + 2 * t4 + i % 2) of the block. The kernels pass their
// register arrays as accessors (int i -> float&), so either array shape serves.
#pragma once

#include <math.h>
#include <stdint.h>

#include "oracle_trace/attention.cuh"
#include "attention_combine.cuh"

namespace zoo_attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <class T>
struct Params {
  const T* q;
  const T* k;  // dense [batch, seqlen_k, heads_kv, D], or the paged cache [pages, page_size, heads_kv, D]
  const T* v;
  const int* page_table;  // [batch, max_pages]; paged only
  T* o;  // [batch, seqlen_q, heads_q, D]; not split
  float* lse;  // [batch, heads_q, seqlen_q]; not split
  float* o_partial;  // [splits, batch, heads_q, seqlen_q, D]; split only
  float* lse_partial;  // [splits, batch, heads_q, seqlen_q]; split only
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  float scale;
  int causal;  // 0 none, 1 top-left, 2 bottom-right
  int splits;
  int page_size, max_pages;
};

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}
// The low (hi = 0) or high 16 bits of a packed pair, as T.
template <class T>
__device__ __forceinline__ T half_of(uint32_t bits, int hi) {
  const unsigned short b = static_cast<unsigned short>(hi ? bits >> 16 : bits & 0xFFFFu);
  return *reinterpret_cast<const T*>(&b);
}

// The KV head query head h reads (GqaModulo: the defect's h % heads_kv).
template <bool GqaModulo>
__device__ __forceinline__ int kv_head(int h, int heads_q, int heads_kv) {
  if constexpr (GqaModulo) return h % heads_kv;
  return h / (heads_q / heads_kv);
}

// Element offset of key `key`'s row (head hk) in K or V (PageOffByOne: the defect's page + 1).
template <bool Paged, bool PageOffByOne, class T>
__device__ __forceinline__ long long key_row(const Params<T>& p, int b, int hk, int key, int D) {
  if constexpr (Paged) {
    int page = key / p.page_size;
    if constexpr (PageOffByOne) page = min(page + 1, p.max_pages - 1);
    const long long phys = p.page_table[static_cast<long long>(b) * p.max_pages + page];
    return ((phys * p.page_size + key % p.page_size) * p.heads_kv + hk) * D;
  }
  return ((static_cast<long long>(b) * p.seqlen_k + key) * p.heads_kv + hk) * D;
}

// The KV blocks [kb0, kb1) of a query block (and split), with the causal offset and the defect's
// bump (CausalOffByOne: 1).
struct KvRange {
  int kb0, kb1, bump, off;
};
template <int BQ, int BKV, bool CausalOffByOne, class T>
__device__ __forceinline__ KvRange kv_range(const Params<T>& p, int qb, int split, bool is_split) {
  const int off = p.causal == 2 ? p.seqlen_k - p.seqlen_q : 0;
  const int bump = CausalOffByOne ? 1 : 0;
  const int n_kv = (p.seqlen_k + BKV - 1) / BKV;
  int n_max = n_kv;
  if (p.causal != 0) {
    const int keys = min(p.seqlen_k, (qb + 1) * BQ + off + bump);  // keys the block's last row may see
    n_max = keys <= 0 ? 0 : (keys + BKV - 1) / BKV;
  }
  KvRange r{0, n_max, bump, off};
  if (is_split) {
    const int per = (n_kv + p.splits - 1) / p.splits;
    r.kb0 = split * per;
    r.kb1 = min(r.kb0 + per, n_max);
  }
  return r;
}

// A thread's place in the fragments: its rows row0 and row0 + 8, its column pair 2 * t4.
struct Frag {
  int row0, t4;
  __device__ __forceinline__ int row(int i) const { return row0 + ((i & 2) ? 8 : 0); }
  __device__ __forceinline__ int col(int i) const { return (i / 4) * 8 + 2 * t4 + (i & 1); }
};

// The mask of KV block kb's N scores s (traced: the s and mask taps and mt, the running row max in
// the mask's units), then s = scale * log2(e) * s, or -inf where the key is masked.
template <class At, int BQ, int BKV, int N, class T, class S>
__device__ __forceinline__ void mask(S&& s, const Frag& f, const Params<T>& p, const KvRange& kr, int qb, int kb,
                                     float scale_log2, float (&mt)[2], const oracle_trace::AttnSite& at) {
  using oracle_trace::Element;
  auto allowed = [&](int r, int c) {
    const int key = kb * BKV + c;
    return key < p.seqlen_k && (p.causal == 0 || key <= qb * BQ + r + kr.off + kr.bump);
  };
  if constexpr (At::enabled) {
    At::tap_scores(oracle_trace::Stage::S, at, BQ, BKV, N,
                   [&](int i) { return Element<float>{f.row(i), f.col(i), s(i)}; });
    At::tap_scores(oracle_trace::Stage::Mask, at, BQ, BKV, N, [&](int i) {
      const int r = f.row(i), c = f.col(i);
      return Element<float>{r, c, allowed(r, c) ? s(i) * p.scale : -INFINITY};
    });
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < N / 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = nt * 4 + 2 * hr + e;
          if (allowed(f.row(i), f.col(i))) mx = fmaxf(mx, s(i) * p.scale);
        }
      mt[hr] = fmaxf(mt[hr], quad_max(mx));
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) s(i) = allowed(f.row(i), f.col(i)) ? s(i) * scale_log2 : -INFINITY;
}

// The online softmax over N masked scores: s becomes P in fp32, m and l move on, rescale is the
// factor O is to be scaled by (1 at the first block). The defects: MaxNotUpdated takes the factor
// from the max before its update, LBeforeRescale sums l before rescaling it. Traced: the
// softmax_state tap (m in the mask's units, mt).
template <class At, bool MaxNotUpdated, bool LBeforeRescale, int BQ, int N, class S>
__device__ __forceinline__ void online_softmax(S&& s, const Frag& f, bool first, float (&m)[2], float (&l)[2],
                                               float (&rescale)[2], const float (&mt)[2],
                                               const oracle_trace::AttnSite& at) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < N / 4; ++nt) mx = fmaxf(mx, fmaxf(s(nt * 4 + 2 * hr), s(nt * 4 + 2 * hr + 1)));
    const float m_new = fmaxf(m[hr], quad_max(mx));
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    if (first)
      rescale[hr] = 1.f;
    else if (MaxNotUpdated)  // the defect: the factor from the max before its update
      rescale[hr] = exp2f(m[hr] - (m[hr] == -INFINITY ? 0.f : m[hr]));
    else
      rescale[hr] = exp2f(m[hr] - m_use);
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < N / 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s(nt * 4 + 2 * hr + e);
        x = exp2f(x - m_use);
        sum += x;
      }
    sum = quad_sum(sum);
    l[hr] = LBeforeRescale ? (l[hr] + sum) * rescale[hr] : l[hr] * rescale[hr] + sum;
    m[hr] = m_new;
  }
  if constexpr (At::enabled) {
    if (f.t4 == 0)
      At::tap_softmax_state(at, BQ, 2, [&](int i) {
        return oracle_trace::RowState{f.row0 + 8 * i, mt[i], rescale[i], l[i]};
      });
  }
}

// P (N fp32 values) rounded to PT into the A fragments of the second MMA: k16 step ks holds
// elements 8 ks .. 8 ks + 7 (two key octets), two to a register. Traced: the p tap.
template <class At, class PT, int BQ, int BKV, int N, class S>
__device__ __forceinline__ void pack_p(S&& s, uint32_t (&pa)[N / 8][4], const Frag& f,
                                       const oracle_trace::AttnSite& at) {
#pragma unroll
  for (int ks = 0; ks < N / 8; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[ks][r] = pack_out(PT(), s(8 * ks + 2 * r), s(8 * ks + 2 * r + 1));
  if constexpr (At::enabled) {
    At::tap_scores(oracle_trace::Stage::P, at, BQ, BKV, N, [&](int i) {
      return oracle_trace::Element<PT>{f.row(i), f.col(i), half_of<PT>(pa[i / 8][(i % 8) / 2], i & 1)};
    });
  }
}

// O *= rescale, row by row, over the N accumulator values a thread holds.
template <int N, class Acc>
__device__ __forceinline__ void rescale_o(Acc&& acc, const float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc(i) *= rescale[(i & 2) ? 1 : 0];
}

// Traced: the o tap of O [BQ, D] after a KV block.
template <class At, int BQ, int D, class Acc>
__device__ __forceinline__ void tap_o(Acc&& acc, const Frag& f, const oracle_trace::AttnSite& at) {
  if constexpr (At::enabled)
    At::tap_o(at, BQ, D, D / 2, [&](int i) { return oracle_trace::Element<float>{f.row(i), f.col(i), acc(i)}; });
}

// The normalize: inv = 1 / l (0 for a row with l = 0; EmptyRowNan, the defect: no guard) and the
// LSE = m * ln 2 + log l (-inf for l = 0). Traced: the normalize taps (O / l, the LSE).
template <class At, bool EmptyRowNan, int BQ, int D, class Acc>
__device__ __forceinline__ void normalize(Acc&& acc, const Frag& f, const float (&m)[2], const float (&l)[2],
                                          float (&inv)[2], float (&lse)[2], const oracle_trace::AttnSite& unit) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const bool empty = !(l[hr] > 0.f);
    inv[hr] = (empty && !EmptyRowNan) ? 0.f : 1.f / l[hr];
    lse[hr] = empty ? -INFINITY : m[hr] * kLn2 + logf(l[hr]);
  }
  if constexpr (At::enabled) {
    At::tap_out(oracle_trace::Stage::Normalize, unit, BQ, D, D / 2, [&](int i) {
      return oracle_trace::Element<float>{f.row(i), f.col(i), acc(i) * inv[(i & 2) ? 1 : 0]};
    });
    if (f.t4 == 0)
      At::tap_lse(oracle_trace::Stage::Normalize, unit, BQ, D, 2,
                  [&](int i) { return oracle_trace::RowValue{f.row0 + 8 * i, lse[i]}; });
  }
}

// Element e of n-tile nt of an accumulator held as [n-tiles][4] or flat.
template <int NT>
__device__ __forceinline__ float frag_at(const float (&a)[NT][4], int nt, int e) { return a[nt][e]; }
template <int N>
__device__ __forceinline__ float frag_at(const float (&a)[N], int nt, int e) { return a[nt * 4 + e]; }

// The store of a thread's rows past normalize: O as T and the LSE, or (Split) O / l fp32 and the
// split's LSE into the partial buffers (MergeWithoutMax, the defect: log l, the max dropped). The
// accumulator is read as its array (frag_at), not through an accessor: that keeps the kernels'
// code as it was.
template <bool Split, bool MergeWithoutMax, int BQ, int D, class T, class Acc>
__device__ __forceinline__ void store(const Acc& acc, const Frag& f, const Params<T>& p, const float (&inv)[2],
                                      const float (&lse)[2], const float (&l)[2], int b, int h, int qb, int split) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int row = qb * BQ + f.row0 + 8 * hr;
    if (row >= p.seqlen_q) continue;
    if constexpr (Split) {
      const long long at = ((static_cast<long long>(split) * p.batch + b) * p.heads_q + h) * p.seqlen_q + row;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt)
        *reinterpret_cast<float2*>(p.o_partial + at * D + nt * 8 + 2 * f.t4) =
            make_float2(frag_at(acc, nt, 2 * hr) * inv[hr], frag_at(acc, nt, 2 * hr + 1) * inv[hr]);
      if (f.t4 == 0) {
        // the defect hands the combine log l: the max dropped
        const float merge_lse = !(l[hr] > 0.f) ? -INFINITY : logf(l[hr]);
        p.lse_partial[at] = MergeWithoutMax ? merge_lse : lse[hr];
      }
    } else {
      T* dst = p.o + ((static_cast<long long>(b) * p.seqlen_q + row) * p.heads_q + h) * D;
#pragma unroll
      for (int nt = 0; nt < D / 8; ++nt)
        *reinterpret_cast<uint32_t*>(dst + nt * 8 + 2 * f.t4) =
            pack_out(T(), frag_at(acc, nt, 2 * hr) * inv[hr], frag_at(acc, nt, 2 * hr + 1) * inv[hr]);
      if (f.t4 == 0) p.lse[(static_cast<long long>(b) * p.heads_q + h) * p.seqlen_q + row] = lse[hr];
    }
  }
}

}  // namespace zoo_attn

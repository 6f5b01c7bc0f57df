// split_gemm.cu -- the bug zoo's split-K, stream-K and grouped (MoE) GEMMs: correct, and with planted
// defects in the places these decompositions add, every variant instrumented with oracle_trace taps.
//
//   D = cast(alpha * (A @ B) + bias)        bf16 operands, fp32 accumulation, bf16 output
//
// One mainloop for all of them: a 64 x 64 output tile per CTA, k-blocks of 32; A and B tiles staged
// in shared memory (zero fill past the rows, N and K), 256 threads, each accumulating a 4 x 4 block
// in fp32 with fmaf, k increasing. What differs is who accumulates which k-blocks and who sums them:
//   serial split-K     grid (tiles_n, tiles_m, splits). CTA (tn, tm, s) accumulates its share of the
//                      k-blocks from zero (ceil(KB / splits) each, an empty share doing nothing; the
//                      _floor entry points take floor shares [s KB / splits, (s + 1) KB / splits)),
//                      writes the partial to the workspace, and bumps the tile's counter; the CTA
//                      that arrives last sums the partials in order 0, 1, ..., resets the counter,
//                      runs the epilogue and stores the tile.
//   split-K, separate  two launches: zoo_splitk_atomic_partials, grid (tiles_n, tiles_m, splits),
//   reduction          adds each partial into one fp32 tile of the workspace (atomicAdd, the
//                      workspace zeroed before the launch); zoo_splitk_atomic_reduce, grid
//                      (tiles_n, tiles_m), reads the sum, runs the epilogue and stores.
//   stream-K           grid (workers). The tiles' k-blocks in tile order (tile t = tm * tiles_n + tn)
//                      are dealt out evenly: worker w takes iterations [w T / W, (w + 1) T / W) of
//                      T = tiles x KB. Each piece of a tile is a partial (numbered in k order from the
//                      tile's first worker); the piece's worker writes it to the workspace and bumps
//                      the tile's counter, and the last one to arrive sums the tile's partials in
//                      order, resets the counter, runs the epilogue and stores. The _cutlass entry
//                      points deal as CUTLASS's stream-K does: floor(T / W) iterations each, one more
//                      for the first T mod W workers (the case's partition = "cutlass_stream_k").
//   grouped (MoE)      contiguous groups along M: group g is rows [offsets[g], offsets[g + 1]) of A
//                      and D and uses B[g] (B is [groups, K, N]) and bias[g]; a group is tiled from
//                      its first row, so tiles straddle multiples of 64 and a group may be smaller
//                      than a tile or empty. Grid (tiles_n, 1, 1): each CTA walks its column's tiles
//                      of every group from the last to the first (a batched GEMM is groups of one
//                      size).
//
// Entry points (extern "C"; A [M, K] row-major (lda), B [K, N] row-major (ldb), D [M, N] row-major
// (ldd), bias [N] or per group [groups, N], bf16; _traced only with -DORACLE_TRACE):
//   zoo_splitk_serial[_<defect>][_traced](A, B, D, bias, M, N, K, lda, ldb, ldd, alpha, splits,
//                                         float* partials, int* counters)
//       partials: tiles x splits x 64 x 64 fp32; counters: tiles ints, zero before the launch
//   zoo_splitk_atomic_partials[_<defect>][_traced](A, B, M, N, K, lda, ldb, splits, float* acc)
//   zoo_splitk_atomic_reduce[_traced](D, bias, M, N, ldd, alpha, const float* acc)
//       acc: tiles x 64 x 64 fp32, zero before the first launch
//   zoo_splitk_serial_floor[_<defect>][_traced]: the same arguments, floor shares
//   zoo_streamk[_cutlass][_<defect>][_traced](A, B, D, bias, M, N, K, lda, ldb, ldd, alpha, workers,
//                                   float* partials, int* counters, int max_partials)
//       partials: tiles x max_partials x 64 x 64 fp32; counters: tiles ints, zero
//   zoo_grouped[_<defect>][_traced](A, B, D, bias, const int* offsets, groups, N, K, lda, ldb, ldd,
//                                   alpha, group_tiles_m)
// Block (256, 1, 1); no dynamic shared memory.
//
// Taps of the traced entry points (parse with block_m = 64, block_n = 64, block_k = 32):
//   load_a [64, 32], load_b [32, 64] bf16 per k-block; mma [64, 64] fp32 after each k-block of a
//   partial (partial = its index in the tile; grouped: group = its group); reduce [64, 64] fp32 the
//   partials summed; epilogue_alpha_beta, epilogue_bias [64, 64] fp32; epilogue_cast [64, 64] bf16.
//   A tile's taps count its tiles from the group's first row for a grouped kernel.
//
// Planted defects (the stage the oracle must name):
//   partial_twice    (serial) the reduction adds partial 0 twice (floor shares: partial 1); (atomic)
//                    split 0 adds its partial twice into the workspace                -> reduce
//   partial_missing  (serial) the reduction leaves out the last partial                 -> reduce
//   overlap          (serial) every split but the first starts one k-block early: it sums the
//                    previous split's last k-block again                               -> mma
//   wrong_partial    (stream-K) the fix-up reads the partial before the last in place of the
//                    last (a tile of two partials or more)                            -> reduce
//   skip_extra       (stream-K, CUTLASS rule) a worker with the extra iteration skips its last
//                    iteration: no worker sums it (a gap in the partition)           -> mma
//   overlap_iter     (stream-K, CUTLASS rule) a worker that starts inside a tile starts one
//                    iteration early: it sums its predecessor's last one again       -> mma
//   offset           (grouped) groups after the first read A from one row past their first row
//                                                                                      -> load_a
//   wrong_b          (grouped) group 2 is multiplied by group 3's B                    -> load_b
//   cross_boundary   (grouped) a group's last tile stores all its rows, past the group's end,
//                    into the next group (which was stored before it)            -> epilogue_store
// A workspace that is not zeroed is a case defect: defects/atomic_stale_workspace.toml declares the
// separate-reduction workspace stale                                                  -> reduce
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include [-DORACLE_TRACE]

#include <cuda_bf16.h>
#include <stdint.h>

#include "oracle_trace/trace.cuh"

namespace zoo_split {

using T = __nv_bfloat16;
constexpr int kBM = 64, kBN = 64, kBK = 32;
constexpr int kThreads = 256;  // 16 x 16, each thread a 4 x 4 block of the tile
constexpr int kTM = 4, kTN = 4, kFrag = kTM * kTN;
constexpr int kTileElems = kBM * kBN;

enum Defect : int {
  kCorrect = 0,
  kPartialTwice,
  kPartialMissing,
  kOverlap,
  kWrongPartial,
  kOffset,
  kWrongB,
  kCrossBoundary,
  kSkipExtra,
  kOverlapIter,
};

// How k-blocks (split-K) or iterations (stream-K) are dealt: share w of n items over p takers.
enum Rule : int { kCeil = 0, kFloor, kCutlass };

template <Rule R>
__device__ __forceinline__ long long share_begin(long long w, long long n, long long p) {
  if constexpr (R == kCeil) return min(n, w * ((n + p - 1) / p));
  if constexpr (R == kFloor) return w * n / p;
  const long long q = n / p, r = n % p;  // kCutlass: the first n mod p takers take one more
  return w * q + min(w, r);
}

struct Frag {
  float v[kTM][kTN];
};

__device__ __forceinline__ int cdiv(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ int tid() { return static_cast<int>(threadIdx.x); }
// (row, col) in the tile of element i of this thread's 4 x 4 block
__device__ __forceinline__ int row_of(int i) { return (tid() / 16) * kTM + i / kTN; }
__device__ __forceinline__ int col_of(int i) { return (tid() % 16) * kTN + i % kTN; }

__device__ __forceinline__ void clear(Frag& f) {
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) f.v[i][j] = 0.f;
}

struct Smem {
  T a[kBM][kBK];
  T b[kBK][kBN];
  int flag;
};

// Accumulate k-blocks [kb0, kb1) of the tile into acc. A's rows are row0 + r for r < a_rows, B's
// columns n0 + c < N; everything else is zero-filled.
template <bool Trace>
__device__ void mainloop(Frag& acc, Smem& s, const T* A, const T* B, int a_rows, int row0, int n0, int N, int K,
                         int lda, int ldb, int kb0, int kb1, oracle_trace::Site site) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Stage;
  for (int kb = kb0; kb < kb1; ++kb) {
    const int k0 = kb * kBK;
    for (int e = tid(); e < kBM * kBK; e += kThreads) {
      const int r = e / kBK, c = e % kBK, gk = k0 + c;
      s.a[r][c] = (r < a_rows && gk < K) ? A[static_cast<size_t>(row0 + r) * lda + gk] : __float2bfloat16_rn(0.f);
    }
    for (int e = tid(); e < kBK * kBN; e += kThreads) {
      const int r = e / kBN, c = e % kBN, gk = k0 + r, gn = n0 + c;
      s.b[r][c] = (gk < K && gn < N) ? B[static_cast<size_t>(gk) * ldb + gn] : __float2bfloat16_rn(0.f);
    }
    __syncthreads();
    if constexpr (Tr::enabled) {
      site.k_block = kb;
      Tr::tap_smem_tile(Stage::LoadA, site, &s.a[0][0], kBM, kBK, oracle_trace::Strided{kBK, 1});
      Tr::tap_smem_tile(Stage::LoadB, site, &s.b[0][0], kBK, kBN, oracle_trace::Strided{kBN, 1});
    }
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = __bfloat162float(s.a[(tid() / 16) * kTM + i][kk]);
#pragma unroll
      for (int j = 0; j < kTN; ++j) b[j] = __bfloat162float(s.b[kk][(tid() % 16) * kTN + j]);
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc.v[i][j] = fmaf(a[i], b[j], acc.v[i][j]);
    }
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Mma, site, kBM, kBN, kFrag, [&](int i) {
        return oracle_trace::Element<float>{row_of(i), col_of(i), acc.v[i / kTN][i % kTN]};
      });
    }
    __syncthreads();  // the next k-block overwrites the tiles
  }
}

template <bool Trace>
__device__ void tap_frag(oracle_trace::Stage stage, const oracle_trace::Site& site, const Frag& f) {
  using Tr = oracle_trace::Tracer<Trace>;
  if constexpr (Tr::enabled) {
    Tr::tap_elements(stage, site, kBM, kBN, kFrag, [&](int i) {
      return oracle_trace::Element<float>{row_of(i), col_of(i), f.v[i / kTN][i % kTN]};
    });
  }
}

// alpha, bias, cast, store of one tile: rows row0 + r for r < out_rows, columns n0 + c < N.
template <bool Trace>
__device__ void epilogue(const Frag& acc, T* D, const T* bias, int out_rows, int row0, int n0, int N, int ldd,
                         float alpha, const oracle_trace::Site& site) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Stage;
  Frag v;
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) v.v[i][j] = __fmul_rn(alpha, acc.v[i][j]);
  tap_frag<Trace>(Stage::EpilogueAlphaBeta, site, v);
  if (bias != nullptr) {
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int gn = n0 + (tid() % 16) * kTN + j;
      const float bj = gn < N ? __bfloat162float(bias[gn]) : 0.f;
#pragma unroll
      for (int i = 0; i < kTM; ++i) v.v[i][j] = __fadd_rn(v.v[i][j], bj);
    }
  }
  tap_frag<Trace>(Stage::EpilogueBias, site, v);
  T out[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) out[i][j] = __float2bfloat16_rn(v.v[i][j]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueCast, site, kBM, kBN, kFrag, [&](int i) {
      return oracle_trace::Element<T>{row_of(i), col_of(i), out[i / kTN][i % kTN]};
    });
  }
#pragma unroll
  for (int i = 0; i < kFrag; ++i) {
    const int r = row_of(i), gn = n0 + col_of(i);
    if (r < out_rows && gn < N) D[static_cast<size_t>(row0 + r) * ldd + gn] = out[i / kTN][i % kTN];
  }
}

__device__ __forceinline__ void store_frag(float* dst, const Frag& f) {
#pragma unroll
  for (int i = 0; i < kFrag; ++i) __stcg(dst + row_of(i) * kBN + col_of(i), f.v[i / kTN][i % kTN]);
}

__device__ __forceinline__ void add_frag(Frag& acc, const float* src) {
#pragma unroll
  for (int i = 0; i < kFrag; ++i) acc.v[i / kTN][i % kTN] += __ldcg(src + row_of(i) * kBN + col_of(i));
}

// Publish this CTA's partial and bump the tile's counter; true for the CTA that arrives last.
__device__ bool arrive(Smem& s, int* counter, int parts) {
  __threadfence();
  __syncthreads();
  if (tid() == 0) s.flag = atomicAdd(counter, 1) == parts - 1;
  __syncthreads();
  const bool last = s.flag != 0;
  if (last) __threadfence();
  return last;
}

// -- serial split-K ---------------------------------------------------------------------------
template <Defect D, bool Trace, Rule R = kCeil>
__device__ void serial(const T* A, const T* B, T* Dst, const T* bias, int M, int N, int K, int lda, int ldb, int ldd,
                       float alpha, int splits, float* partials, int* counters) {
  __shared__ Smem s;
  const int tn = blockIdx.x, tm = blockIdx.y, split = blockIdx.z;
  const int tile = tm * gridDim.x + tn;
  const int kb_n = cdiv(K, kBK);
  const int parts = R == kCeil ? cdiv(kb_n, cdiv(kb_n, splits)) : splits;  // floor shares: none empty
  int kb0 = static_cast<int>(share_begin<R>(split, kb_n, splits));
  const int kb1 = static_cast<int>(share_begin<R>(split + 1, kb_n, splits));
  if (kb0 >= kb1) return;  // an empty share is no partial
  if (D == kOverlap && split > 0) kb0 -= 1;
  const int row0 = tm * kBM, rows = min(kBM, M - row0), n0 = tn * kBN;
  Frag acc;
  clear(acc);
  mainloop<Trace>(acc, s, A, B, rows, row0, n0, N, K, lda, ldb, kb0, kb1, oracle_trace::Site{tm, tn, 0, 0, split});
  float* ws = partials + static_cast<size_t>(tile) * splits * kTileElems;
  store_frag(ws + static_cast<size_t>(split) * kTileElems, acc);
  if (!arrive(s, counters + tile, parts)) return;
  Frag sum;
  clear(sum);
  for (int p = 0; p < parts; ++p) {
    if (D == kPartialMissing && p == parts - 1) continue;
    add_frag(sum, ws + static_cast<size_t>(p) * kTileElems);
    const int twice = R == kFloor ? 1 : 0;
    if (D == kPartialTwice && p == twice) add_frag(sum, ws + static_cast<size_t>(twice) * kTileElems);
  }
  const oracle_trace::Site site{tm, tn};
  tap_frag<Trace>(oracle_trace::Stage::Reduce, site, sum);
  if (tid() == 0) counters[tile] = 0;  // ready for the next use
  epilogue<Trace>(sum, Dst, bias, rows, row0, n0, N, ldd, alpha, site);
}

// -- split-K with a separate reduction kernel ----------------------------------------------
template <Defect D, bool Trace>
__device__ void atomic_partials(const T* A, const T* B, int M, int N, int K, int lda, int ldb, int splits,
                                float* acc_ws) {
  __shared__ Smem s;
  const int tn = blockIdx.x, tm = blockIdx.y, split = blockIdx.z;
  const int tile = tm * gridDim.x + tn;
  const int kb_n = cdiv(K, kBK), per = cdiv(kb_n, splits);
  const int kb0 = split * per, kb1 = min(kb_n, kb0 + per);
  if (kb0 >= kb1) return;
  const int row0 = tm * kBM, rows = min(kBM, M - row0), n0 = tn * kBN;
  Frag acc;
  clear(acc);
  mainloop<Trace>(acc, s, A, B, rows, row0, n0, N, K, lda, ldb, kb0, kb1, oracle_trace::Site{tm, tn, 0, 0, split});
  float* dst = acc_ws + static_cast<size_t>(tile) * kTileElems;
  const int times = (D == kPartialTwice && split == 0) ? 2 : 1;
  for (int t = 0; t < times; ++t)
#pragma unroll
    for (int i = 0; i < kFrag; ++i) atomicAdd(dst + row_of(i) * kBN + col_of(i), acc.v[i / kTN][i % kTN]);
}

template <bool Trace>
__device__ void atomic_reduce(T* Dst, const T* bias, int M, int N, int ldd, float alpha, const float* acc_ws) {
  const int tn = blockIdx.x, tm = blockIdx.y;
  const int tile = tm * gridDim.x + tn;
  const int row0 = tm * kBM, rows = min(kBM, M - row0), n0 = tn * kBN;
  Frag sum;
  clear(sum);
  add_frag(sum, acc_ws + static_cast<size_t>(tile) * kTileElems);
  const oracle_trace::Site site{tm, tn};
  tap_frag<Trace>(oracle_trace::Stage::Reduce, site, sum);
  epilogue<Trace>(sum, Dst, bias, rows, row0, n0, N, ldd, alpha, site);
}

// -- stream-K ---------------------------------------------------------------------------------
// The worker holding iteration i: the largest w with share_begin(w) <= i (starting from the
// closed form of floor shares and stepping to the rule's own boundary).
template <Rule R>
__device__ int worker_of(long long i, long long total, int workers) {
  int w = static_cast<int>(((i + 1) * workers - 1) / total);
  while (w + 1 < workers && share_begin<R>(w + 1, total, workers) <= i) ++w;
  while (w > 0 && share_begin<R>(w, total, workers) > i) --w;
  return w;
}

template <Defect D, bool Trace, Rule R = kFloor>
__device__ void streamk(const T* A, const T* B, T* Dst, const T* bias, int M, int N, int K, int lda, int ldb, int ldd,
                        float alpha, int workers, float* partials, int* counters, int max_partials) {
  __shared__ Smem s;
  const int w = blockIdx.x;
  const int tiles_n = cdiv(N, kBN), tiles_m = cdiv(M, kBM), kb_n = cdiv(K, kBK);
  const long long total = static_cast<long long>(tiles_m) * tiles_n * kb_n;
  const long long begin = share_begin<R>(w, total, workers);
  const long long end = share_begin<R>(w + 1, total, workers);
  const bool big = end - begin > total / workers;  // a worker with the extra iteration
  for (long long it = begin; it < end;) {
    const int t = static_cast<int>(it / kb_n);
    int kb0 = static_cast<int>(it % kb_n);
    const int kb1 = static_cast<int>(min(static_cast<long long>(kb_n), kb0 + (end - it)));
    const int first = worker_of<R>(static_cast<long long>(t) * kb_n, total, workers);
    const int last_w = worker_of<R>(static_cast<long long>(t) * kb_n + kb_n - 1, total, workers);
    const int parts = last_w - first + 1, p = w - first;
    const int tm = t / tiles_n, tn = t % tiles_n;
    const int row0 = tm * kBM, rows = min(kBM, M - row0), n0 = tn * kBN;
    int kb_stop = kb1;
    if (D == kSkipExtra && big && it + (kb1 - kb0) == end) kb_stop = kb1 - 1;  // its last iteration left out
    if (D == kOverlapIter && it == begin && kb0 > 0) kb0 -= 1;  // it starts inside a tile: one early
    Frag acc;
    clear(acc);
    mainloop<Trace>(acc, s, A, B, rows, row0, n0, N, K, lda, ldb, kb0, kb_stop, oracle_trace::Site{tm, tn, 0, 0, p});
    float* ws = partials + static_cast<size_t>(t) * max_partials * kTileElems;
    store_frag(ws + static_cast<size_t>(p) * kTileElems, acc);
    if (arrive(s, counters + t, parts)) {
      Frag sum;
      clear(sum);
      for (int q = 0; q < parts; ++q) {
        const int read = (D == kWrongPartial && parts > 1 && q == parts - 1) ? q - 1 : q;
        add_frag(sum, ws + static_cast<size_t>(read) * kTileElems);
      }
      const oracle_trace::Site site{tm, tn};
      tap_frag<Trace>(oracle_trace::Stage::Reduce, site, sum);
      if (tid() == 0) counters[t] = 0;
      epilogue<Trace>(sum, Dst, bias, rows, row0, n0, N, ldd, alpha, site);
    }
    __syncthreads();  // shared memory and the flag are reused by the next piece
    it += kb1 - static_cast<int>(it % kb_n);
  }
}

// -- grouped (MoE) ----------------------------------------------------------------------------
template <Defect D, bool Trace>
__device__ void grouped(const T* A, const T* B, T* Dst, const T* bias, const int* offsets, int groups, int N, int K,
                        int lda, int ldb, int ldd, float alpha, int group_tiles_m) {
  __shared__ Smem s;
  const int tn = blockIdx.x, n0 = tn * kBN;
  const int total_m = offsets[groups];
  for (int y = group_tiles_m - 1; y >= 0; --y) {  // the groups' tiles of this column, last first
    int g = 0, tm = y;
    while (g < groups && tm >= cdiv(offsets[g + 1] - offsets[g], kBM)) {
      tm -= cdiv(offsets[g + 1] - offsets[g], kBM);
      ++g;
    }
    if (g >= groups) continue;
    const int row0 = offsets[g] + tm * kBM;
    const int rows = min(kBM, offsets[g + 1] - row0);
    const int a0 = (D == kOffset && g > 0) ? row0 + 1 : row0;  // the first A row the tile reads
    const int out_rows = D == kCrossBoundary ? min(kBM, total_m - row0) : rows;
    const int a_rows = min(D == kCrossBoundary ? out_rows : rows, total_m - a0);
    const int gb = (D == kWrongB && g == 2 && groups > 3) ? 3 : g;
    const T* Bg = B + static_cast<size_t>(gb) * K * ldb;
    Frag acc;
    clear(acc);
    mainloop<Trace>(acc, s, A, Bg, a_rows, a0, n0, N, K, lda, ldb, 0, cdiv(K, kBK),
                    oracle_trace::Site{tm, tn, 0, 0, oracle_trace::kNone, g});
    epilogue<Trace>(acc, Dst, bias == nullptr ? nullptr : bias + static_cast<size_t>(g) * N, out_rows, row0, n0, N,
                    ldd, alpha, oracle_trace::Site{tm, tn, oracle_trace::kNone, oracle_trace::kNone,
                                                   oracle_trace::kNone, g});
    __syncthreads();
  }
}

}  // namespace zoo_split

#define ZS_SERIAL(NAME, DEFECT, TRACE, RULE)                                                                \
  extern "C" __global__ void __launch_bounds__(zoo_split::kThreads)                                        \
      NAME(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D, const __nv_bfloat16* bias,    \
           int M, int N, int K, int lda, int ldb, int ldd, float alpha, int splits, float* partials,         \
           int* counters) {                                                                                 \
    zoo_split::serial<zoo_split::DEFECT, TRACE, zoo_split::RULE>(A, B, D, bias, M, N, K, lda, ldb, ldd,     \
                                                                 alpha, splits, partials, counters);       \
  }
#define ZS_ATOMIC(NAME, DEFECT, TRACE)                                                                      \
  extern "C" __global__ void __launch_bounds__(zoo_split::kThreads)                                        \
      NAME(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, int lda, int ldb,            \
           int splits, float* acc) {                                                                        \
    zoo_split::atomic_partials<zoo_split::DEFECT, TRACE>(A, B, M, N, K, lda, ldb, splits, acc);             \
  }
#define ZS_REDUCE(NAME, TRACE)                                                                              \
  extern "C" __global__ void __launch_bounds__(zoo_split::kThreads)                                        \
      NAME(__nv_bfloat16* D, const __nv_bfloat16* bias, int M, int N, int ldd, float alpha, const float* acc) { \
    zoo_split::atomic_reduce<TRACE>(D, bias, M, N, ldd, alpha, acc);                                        \
  }
#define ZS_STREAMK(NAME, DEFECT, TRACE, RULE)                                                               \
  extern "C" __global__ void __launch_bounds__(zoo_split::kThreads)                                        \
      NAME(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D, const __nv_bfloat16* bias,    \
           int M, int N, int K, int lda, int ldb, int ldd, float alpha, int workers, float* partials,        \
           int* counters, int max_partials) {                                                               \
    zoo_split::streamk<zoo_split::DEFECT, TRACE, zoo_split::RULE>(A, B, D, bias, M, N, K, lda, ldb, ldd,    \
                                                                  alpha, workers, partials, counters,      \
                                                                  max_partials);                           \
  }
#define ZS_GROUPED(NAME, DEFECT, TRACE)                                                                     \
  extern "C" __global__ void __launch_bounds__(zoo_split::kThreads)                                        \
      NAME(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* D, const __nv_bfloat16* bias,    \
           const int* offsets, int groups, int N, int K, int lda, int ldb, int ldd, float alpha,            \
           int group_tiles_m) {                                                                             \
    zoo_split::grouped<zoo_split::DEFECT, TRACE>(A, B, D, bias, offsets, groups, N, K, lda, ldb, ldd,       \
                                                 alpha, group_tiles_m);                                    \
  }

#define ZS_ALL(TRACE, SUFFIX)                                                                 \
  ZS_SERIAL(zoo_splitk_serial##SUFFIX, kCorrect, TRACE, kCeil)                                \
  ZS_SERIAL(zoo_splitk_serial_partial_twice##SUFFIX, kPartialTwice, TRACE, kCeil)             \
  ZS_SERIAL(zoo_splitk_serial_partial_missing##SUFFIX, kPartialMissing, TRACE, kCeil)         \
  ZS_SERIAL(zoo_splitk_serial_overlap##SUFFIX, kOverlap, TRACE, kCeil)                        \
  ZS_SERIAL(zoo_splitk_serial_floor##SUFFIX, kCorrect, TRACE, kFloor)                         \
  ZS_SERIAL(zoo_splitk_serial_floor_partial_twice##SUFFIX, kPartialTwice, TRACE, kFloor)      \
  ZS_ATOMIC(zoo_splitk_atomic_partials##SUFFIX, kCorrect, TRACE)                              \
  ZS_ATOMIC(zoo_splitk_atomic_partials_partial_twice##SUFFIX, kPartialTwice, TRACE)           \
  ZS_REDUCE(zoo_splitk_atomic_reduce##SUFFIX, TRACE)                                          \
  ZS_STREAMK(zoo_streamk##SUFFIX, kCorrect, TRACE, kFloor)                                    \
  ZS_STREAMK(zoo_streamk_wrong_partial##SUFFIX, kWrongPartial, TRACE, kFloor)                 \
  ZS_STREAMK(zoo_streamk_cutlass##SUFFIX, kCorrect, TRACE, kCutlass)                          \
  ZS_STREAMK(zoo_streamk_cutlass_skip_extra##SUFFIX, kSkipExtra, TRACE, kCutlass)             \
  ZS_STREAMK(zoo_streamk_cutlass_overlap_iter##SUFFIX, kOverlapIter, TRACE, kCutlass)         \
  ZS_STREAMK(zoo_streamk_cutlass_wrong_partial##SUFFIX, kWrongPartial, TRACE, kCutlass)       \
  ZS_GROUPED(zoo_grouped##SUFFIX, kCorrect, TRACE)                                            \
  ZS_GROUPED(zoo_grouped_offset##SUFFIX, kOffset, TRACE)                                      \
  ZS_GROUPED(zoo_grouped_wrong_b##SUFFIX, kWrongB, TRACE)                                     \
  ZS_GROUPED(zoo_grouped_cross_boundary##SUFFIX, kCrossBoundary, TRACE)

ZS_ALL(false, )
#if defined(ORACLE_TRACE)
ZS_ALL(true, _traced)
#endif

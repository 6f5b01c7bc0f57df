// simple_gemm.cu -- a small, correct tiled GEMM instrumented with oracle_trace taps.
//
//   D = cast(act(alpha * (A @ B) + beta * C + bias))
//
// Mainloop: 64x64 output tile per CTA, k-blocks of 16; A and B tiles are staged in shared
// memory in the input type (zero fill past M, N, K), each thread accumulates a 4x4 block in
// fp32 with fmaf, k in increasing order. Epilogue, per element, in fp32:
//   alpha_beta:  v = alpha * acc;  if (beta != 0) v = fmaf(beta, float(C[m][n]), v)
//   bias:        if (bias)         v = v + float(bias[n])
//   (each product and sum rounded on its own: the sub-steps are never fused across taps)
//   activation:  0 identity, 1 relu max(v, 0), 2 gelu 0.5 v (1 + erf(v / sqrt 2)),
//                3 gelu-tanh 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
//   cast:        round to nearest even into T, stored to D[m][n] if m < M and n < N.
//
// Entry points (extern "C", for cuLaunchKernel; all layouts row-major):
//   void simple_gemm_<dt>(const T* A, const T* B, const T* C, T* D, const T* bias,
//                         int M, int N, int K, int lda, int ldb, int ldc, int ldd,
//                         float alpha, float beta, int activation)
//   <dt>: fp32 (T = float), fp16 (T = __half), bf16 (T = __nv_bfloat16).
//   A [M, K] with row stride lda >= K; B [K, N], ldb >= N; C and D [M, N], ldc, ldd >= N;
//   bias [N] (one per column) or nullptr; C is read only if beta != 0 (else may be nullptr).
//   simple_gemm_<dt>_traced: the same signature with the taps compiled in; these entry points
//   exist only when built with -DORACLE_TRACE.
// Launch: grid (ceil(N / 64), ceil(M / 64), 1), block (16, 16, 1) = 256 threads, no dynamic
//   shared memory (static: 2 * 64 * 16 * sizeof(T) bytes). M, N, K >= 1.
// Tile (tile_m, tile_n) = (blockIdx.y, blockIdx.x); k-block kb covers k in [16 kb, 16 kb + 16).
//
// Taps of the traced entry points (parse with block_m = 64, block_n = 64, block_k = 16):
//   load_a   [64, 16] T      logical A tile per k-block (slot 0), whole tile from shared memory
//   load_b   [16, 64] T      logical B tile per k-block (slot 0)
//   mma      [64, 64] fp32   accumulator after each k-block: every thread taps its 4x4
//   epilogue_alpha_beta, epilogue_bias, epilogue_activation  [64, 64] fp32
//   epilogue_cast            [64, 64] T
// Every stage is tapped for every element of the tile, padding rows/cols of a ragged tile
// included (computed from zero-filled operands, C and bias not read there).
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -cubin -I harness/include [-DORACLE_TRACE]

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "oracle_trace/trace.cuh"

namespace simple_gemm {

constexpr int kBM = 64, kBN = 64, kBK = 16;
constexpr int kThreads = 256;  // 16 x 16, each thread a 4 x 4 block of the tile
constexpr int kTM = 4, kTN = 4;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
__device__ __forceinline__ T zero() { return from_float<T>(0.f); }

__device__ __forceinline__ float activate(float v, int activation) {
  switch (activation) {
    case 1:
      return fmaxf(v, 0.f);
    case 2:
      return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case 3:
      return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    default:
      return v;
  }
}

template <class T, bool Trace>
__device__ __forceinline__ void gemm(const T* __restrict__ A, const T* __restrict__ B, const T* __restrict__ C,
                                     T* __restrict__ D, const T* __restrict__ bias, int M, int N, int K, int lda,
                                     int ldb, int ldc, int ldd, float alpha, float beta, int activation) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Stage;
  __shared__ T As[kBM][kBK];
  __shared__ T Bs[kBK][kBN];

  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tile_m = blockIdx.y, tile_n = blockIdx.x;
  const int m0 = tile_m * kBM, n0 = tile_n * kBN;

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.f;

  // The (row, col) in the tile of element i of this thread's 4x4 block.
  auto row_of = [&](int i) { return ty * kTM + i / kTN; };
  auto col_of = [&](int i) { return tx * kTN + i % kTN; };

  const int k_blocks = (K + kBK - 1) / kBK;
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int k0 = kb * kBK;
#pragma unroll
    for (int e = tid; e < kBM * kBK; e += kThreads) {
      const int r = e / kBK, c = e % kBK;
      const int gm = m0 + r, gk = k0 + c;
      As[r][c] = (gm < M && gk < K) ? A[static_cast<size_t>(gm) * lda + gk] : zero<T>();
    }
#pragma unroll
    for (int e = tid; e < kBK * kBN; e += kThreads) {
      const int r = e / kBN, c = e % kBN;
      const int gk = k0 + r, gn = n0 + c;
      Bs[r][c] = (gk < K && gn < N) ? B[static_cast<size_t>(gk) * ldb + gn] : zero<T>();
    }
    __syncthreads();

    if constexpr (Tr::enabled) {
      const oracle_trace::Site site{tile_m, tile_n, kb, 0};
      Tr::tap_smem_tile(Stage::LoadA, site, &As[0][0], kBM, kBK, oracle_trace::Strided{kBK, 1});
      Tr::tap_smem_tile(Stage::LoadB, site, &Bs[0][0], kBK, kBN, oracle_trace::Strided{kBN, 1});
    }

#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = to_float(As[ty * kTM + i][kk]);
#pragma unroll
      for (int j = 0; j < kTN; ++j) b[j] = to_float(Bs[kk][tx * kTN + j]);
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }

    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Mma, oracle_trace::Site{tile_m, tile_n, kb}, kBM, kBN, kTM * kTN, [&](int i) {
        return oracle_trace::Element<float>{row_of(i), col_of(i), acc[i / kTN][i % kTN]};
      });
    }
    __syncthreads();  // the next k-block overwrites As and Bs
  }

  // Epilogue, one sub-step at a time, so that each can be tapped.
  float v[kTM][kTN];

#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int gm = m0 + ty * kTM + i, gn = n0 + tx * kTN + j;
      float x = __fmul_rn(alpha, acc[i][j]);  // _rn: never contracted into a neighbouring add
      if (beta != 0.f && gm < M && gn < N) x = fmaf(beta, to_float(C[static_cast<size_t>(gm) * ldc + gn]), x);
      v[i][j] = x;
    }
  auto tap_step = [&](Stage stage) {
    if constexpr (Tr::enabled) {
      Tr::tap_elements(stage, oracle_trace::Site{tile_m, tile_n}, kBM, kBN, kTM * kTN, [&](int i) {
        return oracle_trace::Element<float>{row_of(i), col_of(i), v[i / kTN][i % kTN]};
      });
    }
  };
  tap_step(Stage::EpilogueAlphaBeta);

  if (bias != nullptr) {
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int gn = n0 + tx * kTN + j;
      const float bj = gn < N ? to_float(bias[gn]) : 0.f;
#pragma unroll
      for (int i = 0; i < kTM; ++i) v[i][j] = __fadd_rn(v[i][j], bj);
    }
  }
  tap_step(Stage::EpilogueBias);

#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) v[i][j] = activate(v[i][j], activation);
  tap_step(Stage::EpilogueActivation);

  T out[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) out[i][j] = from_float<T>(v[i][j]);
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueCast, oracle_trace::Site{tile_m, tile_n}, kBM, kBN, kTM * kTN, [&](int i) {
      return oracle_trace::Element<T>{row_of(i), col_of(i), out[i / kTN][i % kTN]};
    });
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int gm = m0 + ty * kTM + i, gn = n0 + tx * kTN + j;
      if (gm < M && gn < N) D[static_cast<size_t>(gm) * ldd + gn] = out[i][j];
    }
}

}  // namespace simple_gemm

#define SIMPLE_GEMM_ENTRY(NAME, T, TRACE)                                                                     \
  extern "C" __global__ void __launch_bounds__(simple_gemm::kThreads)                                         \
      NAME(const T* A, const T* B, const T* C, T* D, const T* bias, int M, int N, int K, int lda, int ldb,   \
           int ldc, int ldd, float alpha, float beta, int activation) {                                       \
    simple_gemm::gemm<T, TRACE>(A, B, C, D, bias, M, N, K, lda, ldb, ldc, ldd, alpha, beta, activation);      \
  }

SIMPLE_GEMM_ENTRY(simple_gemm_fp32, float, false)
SIMPLE_GEMM_ENTRY(simple_gemm_fp16, __half, false)
SIMPLE_GEMM_ENTRY(simple_gemm_bf16, __nv_bfloat16, false)

#if defined(ORACLE_TRACE)
SIMPLE_GEMM_ENTRY(simple_gemm_fp32_traced, float, true)
SIMPLE_GEMM_ENTRY(simple_gemm_fp16_traced, __half, true)
SIMPLE_GEMM_ENTRY(simple_gemm_bf16_traced, __nv_bfloat16, true)
#endif

#undef SIMPLE_GEMM_ENTRY

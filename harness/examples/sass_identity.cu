// Fixture for tests/cpu/test_sass_identity.py: a small tiled fp32 GEMM that uses every
// tap of oracle_trace/trace.cuh, built three ways:
//   -DSASS_IDENTITY_WITH_HEADER                  header included, tracing off
//   (nothing)                                    header and taps absent altogether
//   -DSASS_IDENTITY_WITH_HEADER -DORACLE_TRACE   tracing on
// The first two must give identical SASS; the third must differ.
//
// extern "C" __global__ void sass_identity_gemm(const float* A, const float* B, float* D,
//                                                int M, int N, int K);
//   row-major A [M, K], B [K, N], D [M, N]; grid (ceil(N/32), ceil(M/32)), block (32, 8).
// sass_identity_gemm_untraced: the same with the Trace switch off (no taps in any build).

#if defined(SASS_IDENTITY_WITH_HEADER)
#include "oracle_trace/trace.cuh"
#define SASS_IDENTITY_TAPS(...) __VA_ARGS__
#else
#define SASS_IDENTITY_TAPS(...)
#endif

namespace {

constexpr int kBM = 32, kBN = 32, kBK = 32;

template <bool Trace>
__device__ __forceinline__ void gemm_tile(const float* A, const float* B, float* D, int M, int N, int K) {
  __shared__ float As[kBM][kBK];
  __shared__ float Bs[kBK][kBN];
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8 threads, 4 rows each
  const int tile_m = blockIdx.y, tile_n = blockIdx.x;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};

  SASS_IDENTITY_TAPS(using Tr = oracle_trace::Tracer<Trace>;
                     if constexpr (Tr::enabled) {
                       if (blockIdx.x == 0 && blockIdx.y == 0 && tx == 0 && ty == 0) {
                         const uint64_t dims[2] = {uint64_t(K), uint64_t(M)};
                         const uint64_t strides[1] = {uint64_t(K) * 4};
                         const uint32_t box[2] = {kBK, kBM};
                         const uint32_t estr[2] = {1, 1};
                         Tr::tap_descriptor(oracle_trace::Operand::A, oracle_trace::DType::F32, 2, dims, strides,
                                            box, estr, 0, oracle_trace::OobFill::Zero);
                       }
                     })

  for (int kb = 0; kb * kBK < K; ++kb) {
    for (int i = 0; i < 4; ++i) {
      const int r = ty * 4 + i;
      const int gm = tile_m * kBM + r, gk = kb * kBK + tx;
      As[r][tx] = (gm < M && gk < K) ? A[size_t(gm) * K + gk] : 0.f;
      const int gk2 = kb * kBK + r, gn = tile_n * kBN + tx;
      Bs[r][tx] = (gk2 < K && gn < N) ? B[size_t(gk2) * N + gn] : 0.f;
    }
    __syncthreads();
    SASS_IDENTITY_TAPS(if constexpr (Tr::enabled) {
      const oracle_trace::Site site{tile_m, tile_n, kb, kb & 1};
      Tr::tap_smem_bytes(oracle_trace::Stage::DescriptorA, site, &As[0][0], sizeof(As), oracle_trace::DType::F32,
                         kBM, kBK);
      Tr::tap_smem_tile(oracle_trace::Stage::LoadA, site, &As[0][0], kBM, kBK, oracle_trace::Strided{kBK, 1});
      Tr::tap_smem_tile(oracle_trace::Stage::LoadB, site, &Bs[0][0], kBK, kBN, oracle_trace::Strided{kBN, 1});
    })
    for (int k = 0; k < kBK; ++k) {
      const float b = Bs[k][tx];
      for (int i = 0; i < 4; ++i) acc[i] = fmaf(As[ty * 4 + i][k], b, acc[i]);
    }
    SASS_IDENTITY_TAPS(if constexpr (Tr::enabled) {
      Tr::tap_elements(oracle_trace::Stage::Mma, oracle_trace::Site{tile_m, tile_n, kb}, kBM, kBN, 4,
                       [&](int i) { return oracle_trace::Element<float>{ty * 4 + i, tx, acc[i]}; });
    })
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int gm = tile_m * kBM + ty * 4 + i, gn = tile_n * kBN + tx;
    if (gm < M && gn < N) D[size_t(gm) * N + gn] = acc[i];
  }
  SASS_IDENTITY_TAPS(if constexpr (Tr::enabled) {
    Tr::tap_elements(oracle_trace::Stage::EpilogueCast, oracle_trace::Site{tile_m, tile_n}, kBM, kBN, 4,
                     [&](int i) { return oracle_trace::Element<float>{ty * 4 + i, tx, acc[i]}; });
  })
}

}  // namespace

extern "C" __global__ void __launch_bounds__(256)
    sass_identity_gemm(const float* A, const float* B, float* D, int M, int N, int K) {
  gemm_tile<true>(A, B, D, M, N, K);
}

extern "C" __global__ void __launch_bounds__(256)
    sass_identity_gemm_untraced(const float* A, const float* B, float* D, int M, int N, int K) {
  gemm_tile<false>(A, B, D, M, N, K);
}

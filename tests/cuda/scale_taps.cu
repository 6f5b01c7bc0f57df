// A 1d2d-style promotion step tapping the scales it applies (oracle_trace/scales.cuh), compiled by
// tests/cpu/test_scale_trace.py with ORACLE_TRACE on: the header's taps build for sm_90a.
#include "oracle_trace/scales.cuh"

template <bool Trace>
__global__ void scale_taps_promote(const float* sa, const float* sb, float* acc, int m, int groups) {
  const int row = threadIdx.x;
  const oracle_trace::Site site{static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), 0};
  float sum = 0.f;
  for (int g = 0; g < groups; ++g) {
    const float a = row < m ? sa[row * groups + g] : 0.f;
    const float b = sb[g];
    oracle_trace::scale_a<Trace>(site, blockDim.x, groups, 1, [&](int) { return oracle_trace::Element<float>{row, g, a}; });
    if (row == 0)
      oracle_trace::scale_b<Trace>(site, 1, groups, 1, [&](int) { return oracle_trace::Element<float>{0, g, b}; });
    sum += a * b;
  }
  acc[row] += sum;
}

template __global__ void scale_taps_promote<true>(const float*, const float*, float*, int, int);
template __global__ void scale_taps_promote<false>(const float*, const float*, float*, int, int);

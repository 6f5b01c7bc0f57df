// activation.cuh -- the epilogue activations of the zoo's kernels, defined once for all of them.
//   0 identity, 1 relu max(v, 0), 2 gelu 0.5 v (1 + erf(v / sqrt 2)),
//   3 gelu-tanh 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
// GeluTanhForErf plants the gelu_tanh defect: activation 2 (declared with erf) computes the tanh
// approximation.
#pragma once

namespace zoo {

__device__ __forceinline__ float gelu_tanh(float v) {
  return 0.5f * v * (1.f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
}

template <bool GeluTanhForErf>
__device__ __forceinline__ float activate(float v, int activation) {
  switch (activation) {
    case 1:
      return fmaxf(v, 0.f);
    case 2:
      if constexpr (GeluTanhForErf) return gelu_tanh(v);
      return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case 3:
      return gelu_tanh(v);
    default:
      return v;
  }
}

}  // namespace zoo

// oracle_trace/scales.cuh -- taps of the block scales a block-scaled GEMM applies.
//
// Built on trace.cuh (included here) and gated the same way: nothing is compiled in unless the
// translation unit defines ORACLE_TRACE, and then only for Trace = true; wrap taps in
// `if constexpr (oracle_trace::Tracer<Trace>::enabled)` so that not even their arguments are
// evaluated. Without the macro the functions are empty and the kernel's code is that of a build
// without them (tests/cpu/test_scale_trace.py compiles both).
//
// What a tap holds (docs/scales.md): the scale values the kernel applied to one k-block of a tile,
// as it holds them when it promotes or dequantises, decoded to fp32 (an e8m0 exponent as 2^(e - 127)):
//   scale_a   [block_m, groups]: the scale of each row of A's tile for each scale group of the k-block
//   scale_b   [block_n, groups]: the scale of each column of B's tile
// `groups` is the scale groups one k-block holds (BK / gk where the groups are narrower than the
// k-block, else 1). A thread taps the values it holds: value(i) -> Element<float>{row, group, scale}
// for i < count (row: the row of A's tile, or the column of B's; group: 0 .. groups - 1).
//
//   template <bool Trace> __global__ void gemm_1d2d(...) {
//     const oracle_trace::Site site{tile_m, tile_n, kb};
//     if constexpr (oracle_trace::Tracer<Trace>::enabled)
//       oracle_trace::scale_a<Trace>(site, BM, 1, 1, [&](int) {
//         return oracle_trace::Element<float>{row, 0, scale_a_reg};
//       });
//   }

#ifndef ORACLE_TRACE_SCALES_CUH_
#define ORACLE_TRACE_SCALES_CUH_

#include "oracle_trace/trace.cuh"

#if defined(__CUDACC__)
#define ORACLE_TRACE_SCALES_DEVICE __device__ __forceinline__
#else
#define ORACLE_TRACE_SCALES_DEVICE inline
#endif

namespace oracle_trace {

// A's scales of one k-block of a tile, the elements this thread holds.
template <bool Trace, class F>
ORACLE_TRACE_SCALES_DEVICE void scale_a(const Site& site, int block_m, int groups, int count, F&& value) {
  if constexpr (Tracer<Trace>::enabled)
    Tracer<Trace>::tap_elements(Stage::ScaleA, site, block_m, groups, count, static_cast<F&&>(value));
}

// B's scales of one k-block of a tile, the elements this thread holds (row = the column of B's tile).
template <bool Trace, class F>
ORACLE_TRACE_SCALES_DEVICE void scale_b(const Site& site, int block_n, int groups, int count, F&& value) {
  if constexpr (Tracer<Trace>::enabled)
    Tracer<Trace>::tap_elements(Stage::ScaleB, site, block_n, groups, count, static_cast<F&&>(value));
}

}  // namespace oracle_trace

#undef ORACLE_TRACE_SCALES_DEVICE

#endif  // ORACLE_TRACE_SCALES_CUH_

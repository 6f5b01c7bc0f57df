// oracle_trace/cutlass/types.hpp -- CUTLASS element types as the trace and the launch ABI name them.
//
// trace_value_t<T>: the CUDA type of the same bits that oracle_trace::dtype_of knows
// (cutlass::bfloat16_t -> __nv_bfloat16, ...); to_trace(x) reinterprets one value.
// launch_code<T>: the LaunchArgs ElementType of a CUTLASS element type (None: not one).

#ifndef ORACLE_TRACE_CUTLASS_TYPES_HPP_
#define ORACLE_TRACE_CUTLASS_TYPES_HPP_

#include <string.h>

#include "cutlass/numeric_types.h"
#include "oracle_trace/launch.hpp"

namespace oracle_trace::cutlass_sm90 {

template <class T>
struct trace_value {
  using type = T;  // float, int8_t, int32_t: already a trace type
};
template <>
struct trace_value<cutlass::bfloat16_t> {
  using type = __nv_bfloat16;
};
template <>
struct trace_value<cutlass::half_t> {
  using type = __half;
};
template <>
struct trace_value<cutlass::float_e4m3_t> {
  using type = __nv_fp8_e4m3;
};
template <>
struct trace_value<cutlass::float_e5m2_t> {
  using type = __nv_fp8_e5m2;
};
template <class T>
using trace_value_t = typename trace_value<T>::type;

template <class T>
CUTLASS_HOST_DEVICE trace_value_t<T> to_trace(T const& x) {
  static_assert(sizeof(trace_value_t<T>) == sizeof(T), "a trace type has the bits of its CUTLASS type");
  trace_value_t<T> y;
  memcpy(&y, &x, sizeof(T));
  return y;
}

template <class T>
constexpr ElementType launch_code = ElementType::None;
template <>
constexpr ElementType launch_code<float> = ElementType::F32;
template <>
constexpr ElementType launch_code<cutlass::half_t> = ElementType::F16;
template <>
constexpr ElementType launch_code<cutlass::bfloat16_t> = ElementType::BF16;
template <>
constexpr ElementType launch_code<cutlass::float_e4m3_t> = ElementType::E4M3;
template <>
constexpr ElementType launch_code<cutlass::float_e5m2_t> = ElementType::E5M2;
template <>
constexpr ElementType launch_code<int8_t> = ElementType::I8;
template <>
constexpr ElementType launch_code<int32_t> = ElementType::I32;

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_TYPES_HPP_

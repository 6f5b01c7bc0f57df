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

// One row per CUTLASS element type the adapter passes: its LaunchArgs code and the CUDA type of the
// same bits the trace names. Any other type: no code (None), and it is its own trace type.
template <class T>
struct element_row {
  static constexpr ElementType code = ElementType::None;
  using trace = T;
};
#define ORACLE_CUTLASS_ELEMENT(T, CODE, TRACE)           \
  template <>                                            \
  struct element_row<T> {                                \
    static constexpr ElementType code = ElementType::CODE; \
    using trace = TRACE;                                 \
  };
ORACLE_CUTLASS_ELEMENT(float, F32, float)
ORACLE_CUTLASS_ELEMENT(cutlass::half_t, F16, __half)
ORACLE_CUTLASS_ELEMENT(cutlass::bfloat16_t, BF16, __nv_bfloat16)
ORACLE_CUTLASS_ELEMENT(cutlass::float_e4m3_t, E4M3, __nv_fp8_e4m3)
ORACLE_CUTLASS_ELEMENT(cutlass::float_e5m2_t, E5M2, __nv_fp8_e5m2)
ORACLE_CUTLASS_ELEMENT(int8_t, I8, int8_t)
ORACLE_CUTLASS_ELEMENT(int32_t, I32, int32_t)
#undef ORACLE_CUTLASS_ELEMENT

template <class T>
using trace_value_t = typename element_row<T>::trace;
template <class T>
constexpr ElementType launch_code = element_row<T>::code;

template <class T>
CUTLASS_HOST_DEVICE trace_value_t<T> to_trace(T const& x) {
  static_assert(sizeof(trace_value_t<T>) == sizeof(T), "a trace type has the bits of its CUTLASS type");
  trace_value_t<T> y;
  memcpy(&y, &x, sizeof(T));
  return y;
}

}  // namespace oracle_trace::cutlass_sm90

#endif  // ORACLE_TRACE_CUTLASS_TYPES_HPP_

// host/dtypes.cuh -- element types: names, sizes, NaN patterns and the float formats' decoding.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "common.cuh"

namespace repro {

// ------------------------------------------------------------------------------ element types

enum class DT { F32, F16, BF16, E4M3, E5M2, I8, I32, F64, U8 };

struct DTypeInfo {
  const char* name;
  DT dt;
  int size;
};
const DTypeInfo kDTypes[] = {{"fp32", DT::F32, 4}, {"fp16", DT::F16, 2}, {"bf16", DT::BF16, 2},
                             {"e4m3", DT::E4M3, 1}, {"e5m2", DT::E5M2, 1}, {"int8", DT::I8, 1},
                             {"int32", DT::I32, 4}, {"fp64", DT::F64, 8}, {"uint8", DT::U8, 1}};

DT parse_dtype(const std::string& s, const std::string& where) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dt;
  fail(where + ": dtype '" + s + "' is unknown; known: fp32 fp16 bf16 e4m3 e5m2 int8 int32 fp64 uint8");
}

int dt_size(DT dt) {
  for (const auto& d : kDTypes)
    if (d.dt == dt) return d.size;
  return 0;
}

const char* dt_name(DT dt) {
  for (const auto& d : kDTypes)
    if (d.dt == dt) return d.name;
  return "?";
}

// The value of one element from its little-endian bits.
double decode(DT dt, const unsigned char* p) {
  switch (dt) {
    case DT::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DT::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DT::BF16: {
      uint32_t u = (uint32_t(p[0]) | uint32_t(p[1]) << 8) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DT::F16: {
      const uint32_t h = uint32_t(p[0]) | uint32_t(p[1]) << 8;
      const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
      double v = e == 0 ? std::ldexp(double(m), -24)
                 : e == 31 ? (m ? NAN : INFINITY)
                           : std::ldexp(1.0 + m / 1024.0, e - 15);
      return s ? -v : v;
    }
    case DT::E4M3: {  // e4m3fn: no infinity, S.1111.111 is NaN
      const int b = p[0], s = b >> 7, e = (b >> 3) & 15, m = b & 7;
      double v = (e == 15 && m == 7) ? NAN : e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
      return s ? -v : v;
    }
    case DT::E5M2: {
      const int b = p[0], s = b >> 7, e = (b >> 2) & 31, m = b & 3;
      double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? std::ldexp(double(m), -16) : std::ldexp(1.0 + m / 4.0, e - 15);
      return s ? -v : v;
    }
    case DT::I8:
      return double(int8_t(p[0]));
    case DT::U8:
      return double(p[0]);
    case DT::I32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return double(i);
    }
  }
  return NAN;
}

// A floating-point format: significand bits (with the implicit one), smallest normal exponent,
// largest finite value, and whether it has infinities.
struct Format {
  int p;
  int emin;
  double max;
  bool has_inf;
};

Format format_of(DT dt) {
  switch (dt) {
    case DT::F16: return {11, -14, 65504.0, true};
    case DT::BF16: return {8, -126, 3.3895313892515355e38, true};
    case DT::E4M3: return {4, -6, 448.0, false};
    case DT::E5M2: return {3, -14, 57344.0, true};
    case DT::F64: return {53, -1022, 1.7976931348623157e308, true};
    default: return {24, -126, 3.4028234663852886e38, true};  // fp32 (and int32: unused)
  }
}

// The spacing of `dt` values at magnitude |x|.
double ulp(DT dt, double x) {
  if (dt == DT::I32 || dt == DT::I8 || dt == DT::U8) return 0.0;
  const Format f = format_of(dt);
  int e = 0;
  std::frexp(std::fabs(x), &e);
  const int lead = std::max(e - 1, f.emin);
  return std::ldexp(1.0, lead - (f.p - 1));
}

// x rounded to nearest even in `dt`; saturate clamps to +-max first (NaN stays NaN); without
// it an overflow is infinity, or NaN for a format without infinities (e4m3).
double round_to(DT dt, double x, bool saturate) {
  if (dt == DT::I32) return std::isnan(x) ? 0.0 : std::nearbyint(std::max(-2147483648.0, std::min(2147483647.0, x)));
  if (std::isnan(x)) return x;
  const Format f = format_of(dt);
  if (saturate) x = std::max(-f.max, std::min(f.max, x));
  if (std::isinf(x)) return f.has_inf ? x : NAN;
  if (x == 0.0) return x;
  const double q = ulp(dt, x);
  const double r = std::nearbyint(x / q) * q;
  if (std::fabs(r) > f.max) return f.has_inf ? std::copysign(INFINITY, x) : NAN;
  return r;
}

bool all_ones_bits(const unsigned char* p, int size) {
  for (int i = 0; i < size; ++i)
    if (p[i] != 0xFF) return false;
  return true;
}

}  // namespace repro

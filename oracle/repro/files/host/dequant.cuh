// host/dequant.cuh -- a quantised B dequantised on the host: its stored codes, group scales and
// zero points -> the operand the MMA reads, as kernels_ref/dequant.py's float64 host spec computes it.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
//
// Data path: b.bin (stored codes in B's major: a packed 4-bit B is bytes [K / 2, N]; int8, e4m3,
// e5m2 one value a byte [K, N]) -> the code of each (k, n) by b_packing: k_pairs_low_first /
// k_pairs_high_first: byte k / 2 of column n, the even k in the low / high nibble; k8_interleaved:
// bytes 4w .. 4w + 3 of a column are the little-endian word w, nibble i (0 the least significant)
// holding k = 8w + (0, 2, 4, 6, 1, 3, 5, 7)[i] -> its value q (int4 -8..7, uint4 0..15, e2m1,
// int8, e4m3fn, e5m2) -> w with the scale s and zero point z of group k / b_group_size, column n
// (b_scales.bin, b_zeros.bin: [K / group, N] row-major; e8m0 scales are raw bytes 2^(b - 127),
// 255 NaN) -> w rounded to A's dtype (fp16 / bf16), the value the MMA multiplies.
//
// Arithmetic (dequant_precision), every step in double rounded as written (f32: to fp32, op: to
// A's dtype, both round-to-nearest-even):
//   fp32:     w = f32(f32(q - z) * s)               float_offset: w = f32(f32((q - c) * s) + z)
//   operand:  w = f32(op(f32(q - op(z))) * op(s))   float_offset: w = f32(op(f32((q - c) * op(s))) + op(z))
// then op(w); z = 0 without zero points; c = 8 for uint4, 0 for a signed B. Each w carries the
// bound oracle.judging.tolerance gives a kernel that runs the operand arithmetic in another order
// (dequant_bound), which the host reference's bound takes in as sum_k |a| times it.
#pragma once

#include "inputs.cuh"

namespace repro {

// ------------------------------------------------------------------------------ the quantised B

const double kFp4Magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
// k8_interleaved: nibble i of a 32-bit word holds element kK8Order[i] of its 8 k
const int kK8Order[8] = {0, 2, 4, 6, 1, 3, 5, 7};

bool is_packed(const std::string& b_dtype) { return b_dtype == "int4" || b_dtype == "uint4" || b_dtype == "fp4_e2m1"; }

// problem.txt's quantised-B fields against each other and the problem (the rules of
// oracle.problem.spec.ProblemSpec), so a hand-edited file fails here, not in the arithmetic.
void check_quantised_b(const Problem& p) {
  const std::string at = "problem.txt: a quantised B (b_scales " + p.b_scales + ")";
  const std::string& b = p.b_dtype;
  if (b != "int4" && b != "uint4" && b != "fp4_e2m1" && b != "int8" && b != "e4m3" && b != "e5m2")
    fail(at + ": b_dtype '" + b + "' is not a quantised type; known: int4 uint4 fp4_e2m1 int8 e4m3 e5m2");
  if (p.a_dtype != "fp16" && p.a_dtype != "bf16")
    fail(at + ": a_dtype '" + p.a_dtype + "': B is dequantised to A's dtype, fp16 or bf16");
  if (is_packed(b) != (p.b_packing != "none"))
    fail(at + ": b_packing '" + p.b_packing + "' for b_dtype " + b + " (a 4-bit B names its packing, another none)");
  const long long unit = p.b_packing == "k8_interleaved" ? 8 : is_packed(b) ? 2 : 1;
  if (p.b_group < 1 || p.k % p.b_group || p.b_group % unit)
    fail(at + ": b_group_size " + std::to_string(p.b_group) + " must divide K = " + std::to_string(p.k) +
         " and be a multiple of " + std::to_string(unit) + " (the k of one packing unit)");
  if ((p.b_scales == "e4m3" || p.b_scales == "e8m0") && b != "fp4_e2m1" && b != "e4m3" && b != "e5m2")
    fail(at + ": " + p.b_scales + " scales are for a float B (fp4_e2m1, e4m3, e5m2), not " + b);
  const bool integer = b == "int4" || b == "uint4" || b == "int8";
  if (p.b_zeros != "none" && !integer) fail(at + ": b_zeros " + p.b_zeros + " needs an integer B, not " + b);
  if ((p.b_zeros == "float" || p.b_zeros == "float_offset") && p.b_scales != "fp16" && p.b_scales != "bf16" &&
      p.b_scales != "fp32")
    fail(at + ": b_zeros " + p.b_zeros + " are held in the scales' dtype, which must be fp16, bf16 or fp32");
  if (p.grouped) fail(at + ": a quantised B is a single GEMM's (no groups, batch 1)");
}

// The value q of a code (0..255) of the stored dtype.
double quant_value(const std::string& b, int code) {
  if (b == "int4") return code >= 8 ? code - 16 : code;
  if (b == "uint4") return code;
  if (b == "fp4_e2m1") {
    const double mag = kFp4Magnitudes[code & 7];
    return (code & 8) ? -mag : mag;  // code 8 is -0
  }
  if (b == "int8") return double(int8_t(uint8_t(code)));
  const unsigned char byte = (unsigned char)code;
  return decode(b == "e4m3" ? DT::E4M3 : DT::E5M2, &byte);
}

// The code of element (k, n) of the stored B (`B` in its major, logical [K / per byte, N]).
int quant_code(const Problem& p, const TensorFile& B, long long k, long long n) {
  if (p.b_packing == "none") return *B.bits_in(0, k, n);
  long long row;
  int high;
  if (p.b_packing == "k8_interleaved") {
    int nib = 0;
    while (kK8Order[nib] != int(k % 8)) ++nib;
    row = 4 * (k / 8) + nib / 2;
    high = nib % 2;
  } else {
    row = k / 2;
    high = int(k % 2) ^ int(p.b_packing == "k_pairs_high_first");
  }
  const int byte = *B.bits_in(0, row, n);
  return high ? byte >> 4 : byte & 0xF;
}

double scale_value(const Problem& p, const TensorFile& S, long long g, long long n) {
  if (p.b_scales == "e8m0") {
    const int byte = *S.bits_in(0, g, n);
    return byte == 255 ? NAN : std::ldexp(1.0, byte - 127);
  }
  return S.at(g, n);
}

double f32(double x) { return double(float(x)); }

// w of one element before its final rounding to A's dtype `op` (the module comment's arithmetic).
double dequant_value(const Problem& p, DT op, double q, double z, double s) {
  auto r = [&](double x) { return round_to(op, x, false); };
  const bool fp32 = p.dequant_precision == "fp32";
  if (p.b_zeros == "float_offset") {
    const double t = q - (p.b_dtype == "uint4" ? 8.0 : 0.0);  // exact
    return fp32 ? f32(f32(t * s) + z) : f32(r(f32(t * r(s))) + r(z));
  }
  if (fp32) return f32(f32(q - z) * s);
  return f32(r(f32(q - r(z))) * r(s));
}

void require_tensor(const TensorFile* t, const char* name, const std::vector<long long>& logical,
                    const std::vector<DT>& dtypes, const std::string& why) {
  if (!t) fail(std::string("inputs.txt lists no ") + name + " (" + why + ")");
  bool dt_ok = false;
  std::string names;
  for (DT d : dtypes) {
    dt_ok |= t->dtype == d;
    names += std::string(names.empty() ? "" : " or ") + dt_name(d);
  }
  if (!dt_ok)
    fail(std::string("inputs.txt: ") + name + " has dtype " + dt_name(t->dtype) + "; " + why + " needs " + names);
  const bool col = t->major == "col";  // storage [rows, cols] in its major; padding rows may follow
  const long long rows = col ? logical[1] : logical[0], cols = col ? logical[0] : logical[1];
  if (t->logical != logical || t->shape.size() != 2 || t->shape[0] < rows || t->shape[1] != cols)
    fail(std::string("inputs.txt: ") + name + " must be " + std::to_string(logical[0]) + "x" +
         std::to_string(logical[1]) + " (logical, " + why + ")");
  if (t->data.empty()) fail(std::string(name) + " was not loaded");
}

// The bound of one w against a kernel that computes the operand arithmetic in another order (an
// fma with z * s first), as oracle.judging.tolerance.dequant_bound models it; 0 where every order
// gives the same w (fp32 precision; no zero points and scales that convert to A's dtype exactly).
double dequant_bound(const Problem& p, double q, double z, double s) {
  if (p.dequant_precision == "fp32" ||
      (p.b_zeros == "none" && (p.b_scales == p.a_dtype || p.b_scales == "e4m3" || p.b_scales == "e8m0")))
    return 0.0;
  const bool fp16 = p.a_dtype == "fp16";
  const double u = std::ldexp(1.0, fp16 ? -11 : -8), tiny = std::ldexp(1.0, fp16 ? -24 : -133);  // subnormal step
  if (p.b_zeros == "float_offset") {
    const double e = p.b_scales == p.a_dtype ? 0.0 : 1.0, c = p.b_dtype == "uint4" ? 8.0 : 0.0;
    return 2 * u * ((2 + e) * std::fabs(q - c) * std::fabs(s) + (1 + e) * std::fabs(z)) + tiny;
  }
  return 2 * u * (std::fabs(q - z) * std::fabs(s) + std::fabs(z) * std::fabs(s)) + tiny;
}

struct DequantisedB {
  std::vector<double> w;      // [K, N] row-major, each an exact value of A's dtype
  std::vector<double> bound;  // the same shape: dequant_bound of each w (all 0: exact)
};

// The whole quantised B dequantised, with each value's bound.
DequantisedB dequantise_b(const Problem& p, const TensorFile* B, const TensorFile* S, const TensorFile* Z) {
  check_quantised_b(p);
  const long long groups = p.k / p.b_group;
  const bool packed = is_packed(p.b_dtype);
  const DT own = p.b_dtype == "int8" ? DT::I8 : p.b_dtype == "e4m3" ? DT::E4M3 : DT::E5M2;
  const std::vector<DT> stored = packed ? std::vector<DT>{DT::U8} : std::vector<DT>{own, DT::U8};  // or raw bytes
  require_tensor(B, "b", {packed ? p.k / 2 : p.k, p.n}, stored, "the stored " + p.b_dtype + " B");
  const DT sdt = p.b_scales == "e8m0" ? DT::U8 : parse_dtype(p.b_scales, "problem.txt: b_scales");
  require_tensor(S, "b_scales", {groups, p.n}, {sdt}, p.b_scales + " scales, one per group of " +
                 std::to_string(p.b_group) + " k and column");
  if (p.b_zeros == "int")
    require_tensor(Z, "b_zeros", {groups, p.n}, {p.b_dtype == "uint4" ? DT::U8 : DT::I8},
                   "integer zero points of " + p.b_dtype);
  else if (p.b_zeros != "none")
    require_tensor(Z, "b_zeros", {groups, p.n}, {sdt}, p.b_zeros + " zero points in the scales' dtype");
  const DT op = parse_dtype(p.a_dtype, "problem.txt: a_dtype");
  DequantisedB out{std::vector<double>(size_t(p.k * p.n)), std::vector<double>(size_t(p.k * p.n))};
  for (long long k = 0; k < p.k; ++k) {
    const long long g = std::min(k / p.b_group, groups - 1);
    for (long long n = 0; n < p.n; ++n) {
      const double q = quant_value(p.b_dtype, quant_code(p, *B, k, n));
      const double s = scale_value(p, *S, g, n);
      const double z = p.b_zeros == "none" ? 0.0 : Z->at(g, n);
      out.w[size_t(k * p.n + n)] = round_to(op, dequant_value(p, op, q, z, s), false);
      out.bound[size_t(k * p.n + n)] = dequant_bound(p, q, z, s);
    }
  }
  return out;
}

// --dequant-b FILE: the host's dequantised B ([K, N] row-major, fp64 little-endian: each value
// exactly one of A's dtype) written for a comparison with the kernel's own; no CUDA call.
int write_dequantised_b(const std::string& dir, const std::string& out) {
  const Problem p = read_problem(dir);
  if (!p.quantised_b()) fail("--dequant-b: problem.txt has no quantised B (b_scales none)");
  auto tensors = read_inputs_manifest(dir);
  check_problem_tensors(p, tensors);
  auto get = [&](const char* name) -> TensorFile* {
    auto it = tensors.find(name);
    if (it == tensors.end()) return nullptr;
    load_file(it->second, join_path(dir, it->second.file));
    return &it->second;
  };
  TensorFile *B = get("b"), *S = get("b_scales"), *Z = get("b_zeros");
  const std::vector<double> w = dequantise_b(p, B, S, Z).w;
  write_file(out, w.data(), w.size() * sizeof(double));
  std::printf("repro: wrote %s: B dequantised on the host, %lld x %lld fp64 (row-major; %s values, %s)\n", out.c_str(),
              p.k, p.n, p.a_dtype.c_str(), p.describe.c_str());
  return kMatch;
}

}  // namespace repro

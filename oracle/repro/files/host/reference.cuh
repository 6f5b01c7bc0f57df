// host/reference.cuh -- the double-precision host reference of the whole problem and its conservative bound.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "dequant.cuh"

namespace repro {

// ------------------------------------------------------------------------------ the reference

struct Reference {
  std::vector<double> expected;  // logical [total M, N], row-major
  std::vector<double> bound;     // same; empty in exact mode
  std::vector<unsigned char> exact_bits;  // exact mode: expected in the output dtype
  bool exact = false;
  std::string source;
};

// Expected D and the oracle's bounds from the files it wrote.
Reference reference_from_files(const std::string& exp_path, const std::string& bound_path, TensorFile exp,
                               TensorFile bnd, const Problem& p) {
  load_file(exp, exp_path);
  load_file(bnd, bound_path);
  const long long n = p.total_m * p.n;
  if (exp.elements() != n || bnd.elements() != n)
    fail("expected and bound must hold M x N = " + std::to_string(n) + " elements (logical, row-major; M = " +
         std::to_string(p.total_m) + " rows of every group)");
  Reference r;
  r.expected.resize(size_t(n));
  r.bound.resize(size_t(n));
  bool all_zero = true;
  for (long long i = 0; i < n; ++i) {
    r.expected[i] = exp.at1(i);
    r.bound[i] = bnd.at1(i);
    if (!(r.bound[i] >= 0)) fail(bound_path + ": element " + std::to_string(i) + " has a negative or NaN bound");
    all_zero &= r.bound[i] == 0;
  }
  r.exact = all_zero && exp.dtype == p.out;  // the oracle's rule: zero bounds mean a bit-exact compare
  if (r.exact) r.exact_bits = exp.data;
  r.source = "the oracle's reference D and per-element bounds (" + exp.file + ", " + bnd.file + ")";
  return r;
}

// The value of block scale (r, c) of matrix g of a scale tensor (g = 0 for A's, stacked over the
// groups; B's of a grouped or batched problem are one matrix per group): e8m0 raw bytes are
// 2^(b - 127), 255 NaN; fp32 and e4m3 are their own values.
double block_scale(const TensorFile& t, const std::string& dtype, long long g, long long r, long long c) {
  if (dtype == "e8m0") {
    const int b = *t.bits_in(g, r, c);
    return b == 255 ? NAN : std::ldexp(1.0, b - 127);
  }
  return t.at_in(g, r, c);
}

double activate(const std::string& act, double x) {
  if (act == "relu") return x < 0 ? 0.0 : x;
  if (act == "gelu_erf") return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  if (act == "gelu_tanh") return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
  if (act == "silu") return x / (1.0 + std::exp(-x));
  return x;
}

// The whole problem in double precision: acc = A @ B (block scales per k-group; a quantised B
// dequantised first, host/dequant.cuh), then scale, alpha/beta, bias, activation, cast; row i of a
// grouped problem is its group g's, with B[g], the column bias bias[g] and B's block scales of
// group g (A's are per row, stacked with A's rows; a ragged K's last scale group is partial). Each
// scale group's partial sum is multiplied by fp32(sa * sb), as kernels_ref/mma.py. The bound is a
// worst-case model, deliberately looser than the oracle's (README.txt): eps * |alpha| * S + |alpha| Q
// + 2^-20 (|alpha v| + |beta c| + |bias|), times 1.25 for the activation's slope, plus 2^-14 (|x| + |y|)
// for a transcendental activation, plus one unit in the last place of the output type at |y|;
// S = sum_k |a||b| (scaled), eps = K 2^-23 for fp32 accumulation (+ 2^-10 P/32 for fp8 partial
// sums over P), 2 ceil(K/16) 2^-11 for fp16, 0 for int32; Q = sum_k |a| times the dequant bound of
// each w of a quantised B (scaled; 0 where its arithmetic is exact, host/dequant.cuh).
Reference host_reference(const std::string& dir, std::map<std::string, TensorFile>& tensors, const Problem& p) {
  for (const char* name : {"a", "b", "c", "bias", "scale_a", "scale_b", "b_scales", "b_zeros"}) {
    auto it = tensors.find(name);
    if (it != tensors.end() && it->second.data.empty()) load_file(it->second, join_path(dir, it->second.file));
  }
  auto get = [&](const char* name) -> const TensorFile* {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  };
  const TensorFile *A = get("a"), *B = get("b"), *C = get("c"), *bias = get("bias"), *SA = get("scale_a"),
                   *SB = get("scale_b");
  if (!A || !B) fail("inputs.txt must list a and b for the host reference");
  // a quantised B: dequantised once, as kernels_ref/dequant.py does, then multiplied as a dense B;
  // where its arithmetic may run in another order, sum_k |a| times each w's bound joins the bound
  const DequantisedB W = p.quantised_b() ? dequantise_b(p, B, get("b_scales"), get("b_zeros")) : DequantisedB();
  auto b_at = [&](long long grp, long long kk, long long j) {
    return W.w.empty() ? B->at_in(grp, kk, j) : W.w[size_t(kk * p.n + j)];
  };
  const bool dequant_term = std::any_of(W.bound.begin(), W.bound.end(), [](double b) { return b != 0.0; });
  if (p.declared_epilogue)
    fail("problem.txt declares an epilogue in another order (or with rounding between steps) than the host "
         "reference computes (scale, alpha/beta, bias, activation, cast): judge with expected.bin and bound.bin, "
         "which follow the declared order");
  const long long n_groups = (long long)p.group_rows.size();
  if (p.grouped && (B->shape.size() != 3 || B->shape[0] != n_groups))
    fail("b must be a stack of " + std::to_string(n_groups) + " matrices (shape " + std::to_string(n_groups) +
         "xKxN or " + std::to_string(n_groups) + "xNxK) for a grouped problem");
  if (p.grouped && p.bias == "col" && bias && (bias->shape.size() != 2 || bias->shape[0] != n_groups))
    fail("the column bias of a grouped problem must be one row per group (" + std::to_string(n_groups) + "xN)");
  std::vector<long long> group_of(size_t(p.total_m));
  for (long long g = 0; g < n_groups; ++g)
    for (long long r = 0; r < p.group_rows[size_t(g)]; ++r) group_of[size_t(p.group_row0[size_t(g)] + r)] = g;
  if (p.beta != 0 && !C) fail("beta != 0 but inputs.txt lists no c");
  if (p.bias != "none" && !bias) fail("the problem has a bias but inputs.txt lists none");
  const bool fp8 = p.a_dtype == "e4m3" || p.a_dtype == "e5m2";
  double eps = 0;
  if (p.acc == "fp32") eps = p.k * std::ldexp(1.0, -23) + (fp8 ? std::ldexp(1.0, -10) * (p.promotion ? p.promotion : p.bk) / 32.0 : 0.0);
  else if (p.acc == "fp16") eps = 2.0 * double((p.k + 15) / 16) * std::ldexp(1.0, -11);
  const bool block = p.scale_a == "block";
  if (block != (p.scale_b == "block") || (block && p.sa_k != p.sb_k))
    fail("problem.txt: block scales need both scale_a and scale_b block with the same k per group (scale_a " +
         p.scale_a + " k " + std::to_string(p.sa_k) + ", scale_b " + p.scale_b + " k " + std::to_string(p.sb_k) + ")");
  if (block && (!SA || !SB)) fail("the problem has block scales but inputs.txt lists no scale_a or no scale_b");
  if (p.grouped && (p.scale_a == "row" || p.scale_b == "col"))
    fail("the host reference of a grouped problem takes per-tensor or block scales, not per-row or per-column ones");
  if (p.grouped && block && p.sa_rows != 1)  // a block of several rows would straddle two groups
    fail("problem.txt: scale_a block " + std::to_string(p.sa_rows) + " " + std::to_string(p.sa_k) +
         ": A's block scales of a grouped problem are per row (1 x k), stacked with A's rows");
  const long long gk = block ? p.sa_k : p.k;
  const long long groups = (p.k + gk - 1) / gk;
  Reference r;
  const long long total = p.total_m * p.n;
  r.expected.assign(size_t(total), 0.0);
  r.bound.assign(size_t(total), 0.0);
  const double alpha = double(float(p.alpha)), beta = double(float(p.beta));
  auto rows = [&](long long r0, long long r1) {
    std::vector<double> acc(size_t(p.n)), sabs(size_t(p.n)), part(size_t(p.n)), pabs(size_t(p.n)), dabs(size_t(p.n));
    for (long long i = r0; i < r1; ++i) {
      const long long grp = group_of[size_t(i)];
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(sabs.begin(), sabs.end(), 0.0);
      std::fill(dabs.begin(), dabs.end(), 0.0);
      for (long long g = 0; g < groups; ++g) {
        std::fill(part.begin(), part.end(), 0.0);
        std::fill(pabs.begin(), pabs.end(), 0.0);
        for (long long kk = g * gk; kk < std::min(p.k, (g + 1) * gk); ++kk) {
          const double a = A->at(i, kk);
          for (long long j = 0; j < p.n; ++j) {
            const double b = b_at(grp, kk, j);
            part[j] += a * b;
            pabs[j] += std::fabs(a * b);
          }
          if (dequant_term)
            for (long long j = 0; j < p.n; ++j) dabs[j] += std::fabs(a) * W.bound[size_t(kk * p.n + j)];
        }
        for (long long j = 0; j < p.n; ++j) {
          double s = 1.0;
          // each scale group promoted on its own with fp32(sa * sb), as kernels_ref/mma.py's host spec;
          // B's scales are group grp's (one matrix per group of a grouped or batched problem)
          if (block)
            s = double(float(block_scale(*SA, p.sa_dtype, 0, i / p.sa_rows, g) *
                             block_scale(*SB, p.sb_dtype, p.grouped ? grp : 0, j / p.sb_rows, g)));
          acc[j] += part[j] * s;
          sabs[j] += pabs[j] * std::fabs(s);
        }
      }
      for (long long j = 0; j < p.n; ++j) {
        double v = acc[j], s = sabs[j], dq = dabs[j];
        double f = 1.0;
        if (p.scale_a == "tensor") f *= SA->at1(0);
        if (p.scale_a == "row") f *= SA->at1(i);
        if (p.scale_b == "tensor") f *= SB->at1(0);
        if (p.scale_b == "col") f *= SB->at1(j);
        v *= f;
        s *= std::fabs(f);
        dq *= std::fabs(f);
        const double av = alpha * v, bc = p.beta != 0 ? beta * C->at(i, j) : 0.0;
        const double bi = p.bias == "row" ? bias->at1(i) : p.bias == "col" ? bias->at(grp, j) : 0.0;
        const double x = av + bc + bi;
        const double y = activate(p.activation, x);
        const bool transcendental = p.activation == "gelu_erf" || p.activation == "gelu_tanh" || p.activation == "silu";
        double b = 1.25 * (eps * std::fabs(alpha) * s + std::fabs(alpha) * dq +
                           std::ldexp(1.0, -20) * (std::fabs(av) + std::fabs(bc) + std::fabs(bi)));
        if (transcendental) b += std::ldexp(1.0, -14) * (std::fabs(x) + std::fabs(y));
        const double e = round_to(p.out, y, p.saturate);
        b += std::isfinite(y) ? ulp(p.out, std::min(std::fabs(y), format_of(p.out).max)) : 0.0;
        r.expected[size_t(i * p.n + j)] = e;
        r.bound[size_t(i * p.n + j)] = b;
      }
    }
  };
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const long long step = (p.total_m + workers - 1) / workers;
  for (long long r0 = 0; r0 < p.total_m; r0 += step) pool.emplace_back(rows, r0, std::min(p.total_m, r0 + step));
  for (auto& t : pool) t.join();
  r.source = "the reproducer's own double-precision host reference with a conservative worst-case bound "
             "(expected.bin/bound.bin not used; README.txt gives the model)";
  return r;
}

}  // namespace repro

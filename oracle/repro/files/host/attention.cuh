// host/attention.cuh -- an attention problem (problem.txt: kind attention): its fields, its tensors held to it,
// its run (the launches of run.cuh, O and LSE as outputs) and the judgement of O and LSE with the oracle's
// expected values and per-element bounds (expected_o.bin, bound_o.bin, expected_lse.bin, bound_lse.bin).
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
//
// Layouts (FlashAttention's, oracle.run.attention_recording): dense O [batch, seqlen_q, heads_q, head_dim_v],
// LSE [batch, heads_q, seqlen_q]; variable-length O [total_q, heads_q, head_dim_v], LSE [heads_q, total_q].
// The element rule is the oracle's: |received - expected| <= bound for finite pairs, NaN matching NaN and
// an infinity the same infinity (a fully masked row's LSE is -inf, or +inf where the problem's empty_lse
// says so: the oracle wrote that value into expected_lse.bin).
#pragma once

#include "run.cuh"

namespace repro {

// problem.txt's kind: "gemm" (no kind line, as every GEMM reproducer's) or "attention".
std::string problem_kind(const std::string& dir) {
  const std::string path = join_path(dir, "problem.txt");
  std::string kind = "gemm";
  for (const Line& l : read_lines(path))
    if (l.tokens[0] == "kind") {
      if (l.tokens.size() != 2) fail(where(path, l) + ": kind takes one value");
      kind = one_of(l.tokens[1], "gemm attention", where(path, l), "kind");
    }
  return kind;
}

struct AttnProblem {
  long long batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = -1, seqlen_k = -1, head_dim = 0, head_dim_v = 0;
  long long block_q = 0, block_kv = 0, splits = 0, total_q = -1, total_k = -1;
  long long page_size = 0, num_pages = 0, max_pages = 0;  // 0: not paged
  std::vector<long long> seqlens_q, seqlens_k;              // empty: dense
  std::vector<long long> q_start;                           // each sequence's first query token
  bool lse = true;
  std::string q_dtype, k_dtype, v_dtype, causal, empty_lse, describe;
  DT o_dtype = DT::BF16;

  bool varlen_q() const { return !seqlens_q.empty(); }
  bool varlen_k() const { return !seqlens_k.empty(); }
  bool paged() const { return page_size > 0; }
  long long lq(long long b) const { return varlen_q() ? seqlens_q[size_t(b)] : seqlen_q; }
  long long q_blocks() const { return (seqlen_q + block_q - 1) / block_q; }
};

constexpr long long kMaxHeadDim = 512, kMaxBlock = 1024;  // oracle.problem.attention

AttnProblem read_attention_problem(const std::string& dir) {
  const std::string path = join_path(dir, "problem.txt");
  AttnProblem p;
  std::map<std::string, long long*> ints = {
      {"batch", &p.batch}, {"heads_q", &p.heads_q}, {"heads_kv", &p.heads_kv}, {"seqlen_q", &p.seqlen_q},
      {"seqlen_k", &p.seqlen_k}, {"head_dim", &p.head_dim}, {"head_dim_v", &p.head_dim_v}, {"block_q", &p.block_q},
      {"block_kv", &p.block_kv}, {"splits", &p.splits}, {"total_q", &p.total_q}, {"total_k", &p.total_k}};
  std::map<std::string, long long*> paging = {
      {"page_size", &p.page_size}, {"num_pages", &p.num_pages}, {"max_pages", &p.max_pages}};
  std::map<std::string, bool> seen;
  for (const Line& l : read_lines(path)) {
    const std::string at = where(path, l);
    const std::string& key = l.tokens[0];
    auto arg = [&](size_t i) -> const std::string& { return key_value(l, i, at); };
    if (seen[key]) fail(at + ": " + key + " is given twice");
    seen[key] = true;
    if (ints.count(key)) *ints[key] = to_int(arg(1), at);
    else if (paging.count(key)) *paging[key] = arg(1) == "none" ? 0 : to_int(arg(1), at);
    else if (key == "seqlens_q" || key == "seqlens_k") {
      auto& out = key == "seqlens_q" ? p.seqlens_q : p.seqlens_k;
      if (arg(1) != "none")
        for (size_t i = 1; i < l.tokens.size(); ++i) {
          const long long n = to_int(l.tokens[i], at);
          if (n < 0 || n > kMaxDim) fail(at + ": " + key + " length " + l.tokens[i] + " must be 0.." + std::to_string(kMaxDim));
          if (out.size() >= 65536) fail(at + ": " + key + " lists more than 65536 sequences");
          out.push_back(n);
        }
    } else if (key == "q_dtype") p.q_dtype = one_of(arg(1), "bf16 fp16 e4m3", at, key);
    else if (key == "k_dtype") p.k_dtype = one_of(arg(1), "bf16 fp16 e4m3", at, key);
    else if (key == "v_dtype") p.v_dtype = one_of(arg(1), "bf16 fp16 e4m3", at, key);
    else if (key == "o_dtype") p.o_dtype = parse_dtype(one_of(arg(1), "bf16 fp16 fp32", at, key), at);
    else if (key == "causal") p.causal = one_of(arg(1), "none top_left bottom_right", at, key);
    else if (key == "empty_lse") p.empty_lse = one_of(arg(1), "-inf +inf", at, key);
    else if (key == "lse") p.lse = one_of(arg(1), "0 1", at, key) == "1";
    else if (key == "describe") {
      for (size_t i = 1; i < l.tokens.size(); ++i) p.describe += (i > 1 ? " " : "") + l.tokens[i];
    } else if (key == "kind" || key == "window" || key == "softmax_scale" || key == "softcap" || key == "descale_q" ||
               key == "descale_k" || key == "descale_v" || key == "p_scale") {
      // the kind was read first; the others are informative: the kernel gets them through launch.txt, the
      // judgement through expected_o.bin and its bounds
    } else {
      fail(at + ": unknown key '" + key + "' in an attention problem; known: kind describe batch heads_q heads_kv "
                "seqlen_q seqlen_k head_dim head_dim_v block_q block_kv splits total_q total_k seqlens_q seqlens_k "
                "causal window softmax_scale softcap q_dtype k_dtype v_dtype o_dtype descale_q descale_k descale_v "
                "p_scale page_size num_pages max_pages lse empty_lse");
    }
  }
  for (const auto& kv : ints)
    if (!seen[kv.first]) fail(path + ": " + kv.first + " must be given (an attention problem names it)");
  for (const char* key : {"q_dtype", "k_dtype", "v_dtype", "o_dtype", "causal", "empty_lse", "lse"})
    if (!seen[key]) fail(path + ": " + std::string(key) + " must be given (an attention problem names it)");
  auto range = [&](const char* field, long long v, long long lo, long long hi) {
    if (v < lo || v > hi)
      fail(path + ": " + field + " " + std::to_string(v) + " must be " + std::to_string(lo) + ".." + std::to_string(hi));
  };
  range("batch", p.batch, 1, 65536);
  range("heads_q", p.heads_q, 1, kMaxDim);
  range("heads_kv", p.heads_kv, 1, kMaxDim);
  range("seqlen_q", p.seqlen_q, 0, kMaxDim);
  range("seqlen_k", p.seqlen_k, 0, kMaxDim);
  range("head_dim", p.head_dim, 1, kMaxHeadDim);
  range("head_dim_v", p.head_dim_v, 1, kMaxHeadDim);
  range("block_q", p.block_q, 1, kMaxBlock);
  range("block_kv", p.block_kv, 1, kMaxBlock);
  range("splits", p.splits, 1, 65536);
  if (p.heads_q % p.heads_kv)
    fail(path + ": heads_kv " + std::to_string(p.heads_kv) + " must divide heads_q " + std::to_string(p.heads_q));
  for (auto* lens : {&p.seqlens_q, &p.seqlens_k}) {
    const bool q = lens == &p.seqlens_q;
    const std::string field = q ? "seqlens_q" : "seqlens_k";
    const long long most = q ? p.seqlen_q : p.seqlen_k, total = q ? p.total_q : p.total_k;
    if (lens->empty()) {
      if (total != checked_mul(p.batch, most, path + ": batch x " + (q ? "seqlen_q" : "seqlen_k")))
        fail(path + ": " + (q ? "total_q " : "total_k ") + std::to_string(total) + " must be batch x the length of a "
             "dense problem");
      continue;
    }
    if ((long long)lens->size() != p.batch)
      fail(path + ": " + field + " lists " + std::to_string(lens->size()) + " lengths, one per sequence: batch = " +
           std::to_string(p.batch));
    long long sum = 0, longest = 0;
    for (long long n : *lens) sum += n, longest = std::max(longest, n);
    if (longest != most) fail(path + ": the longest of " + field + " is " + std::to_string(longest) + ", not " +
                              (q ? "seqlen_q " : "seqlen_k ") + std::to_string(most));
    if (sum != total) fail(path + ": " + field + " adds up to " + std::to_string(sum) + ", not " +
                           (q ? "total_q " : "total_k ") + std::to_string(total));
  }
  const int paged = (p.page_size > 0) + (p.num_pages > 0) + (p.max_pages > 0);
  if (paged != 0 && paged != 3) fail(path + ": a paged KV cache names page_size, num_pages and max_pages, each positive");
  if (paged) {
    range("page_size", p.page_size, 1, kMaxDim);
    range("num_pages", p.num_pages, 1, kMaxDim);
    range("max_pages", p.max_pages, 1, kMaxDim);
  }
  // every tensor's element count within int64, before anything is sized from them
  checked_mul(checked_mul(checked_mul(std::max(p.total_q, 1ll), p.heads_q, path + ": total_q x heads_q"),
                          std::max(p.head_dim, p.head_dim_v), path + ": x head_dim"), 8, path + ": O's bytes");
  long long token = 0;
  for (long long b = 0; b < p.batch; ++b) p.q_start.push_back(token), token += p.lq(b);
  return p;
}

// The logical shape of each tensor the problem has (oracle.run.attention_recording.shapes_of).
std::map<std::string, std::vector<long long>> attention_shapes(const AttnProblem& p) {
  auto kv = [&](long long dim) -> std::vector<long long> {
    if (p.paged()) return {p.num_pages, p.page_size, p.heads_kv, dim};
    if (p.varlen_k()) return {p.total_k, p.heads_kv, dim};
    return {p.batch, p.seqlen_k, p.heads_kv, dim};
  };
  std::map<std::string, std::vector<long long>> want;
  want["q"] = p.varlen_q() ? std::vector<long long>{p.total_q, p.heads_q, p.head_dim}
                           : std::vector<long long>{p.batch, p.seqlen_q, p.heads_q, p.head_dim};
  want["o"] = p.varlen_q() ? std::vector<long long>{p.total_q, p.heads_q, p.head_dim_v}
                           : std::vector<long long>{p.batch, p.seqlen_q, p.heads_q, p.head_dim_v};
  want["k"] = kv(p.head_dim);
  want["v"] = kv(p.head_dim_v);
  want["expected_o"] = want["bound_o"] = want["o"];
  if (p.lse) {
    want["lse"] = p.varlen_q() ? std::vector<long long>{p.heads_q, p.total_q}
                               : std::vector<long long>{p.batch, p.heads_q, p.seqlen_q};
    want["expected_lse"] = want["bound_lse"] = want["lse"];
  }
  if (p.varlen_q()) want["cu_seqlens_q"] = {p.batch + 1};
  if (p.varlen_k()) want["cu_seqlens_k"] = {p.batch + 1};
  if (p.paged()) want["page_table"] = {p.batch, p.max_pages};
  return want;
}

// inputs.txt against the problem: every tensor it needs is listed with its shape and dtype (the reference
// files among them: the host program has no attention reference of its own), none it does not have.
void check_attention_tensors(const AttnProblem& p, const std::map<std::string, TensorFile>& tensors) {
  const auto want = attention_shapes(p);
  auto shape_text = [](const std::vector<long long>& v) {
    std::string s;
    for (long long e : v) s += (s.empty() ? "" : "x") + std::to_string(e);
    return s;
  };
  for (const auto& kv : want) {
    auto it = tensors.find(kv.first);
    if (it == tensors.end())
      fail("inputs.txt lists no " + kv.first + ", which " + p.describe + " needs" +
           (kv.first.rfind("expected", 0) == 0 || kv.first.rfind("bound", 0) == 0
                ? " (the reference: write the reproducer again with python -m oracle repro)" : ""));
    if (it->second.logical != kv.second)
      fail("inputs.txt: " + kv.first + " is " + shape_text(it->second.logical) + " (logical) but problem.txt's " +
           p.describe + " needs " + shape_text(kv.second) + ": the two files disagree");
  }
  for (const auto& kv : tensors) {
    const TensorFile& t = kv.second;
    if (t.role == "inout" && t.name.rfind("ws_", 0) == 0) continue;  // a workspace: bytes, never compared
    if (!want.count(t.name)) fail("inputs.txt: " + t.name + " is not a tensor of an attention problem");
  }
  auto dtype_is = [&](const std::string& name, bool ok, const std::string& allowed) {
    const TensorFile& t = tensors.at(name);
    if (!ok) fail("inputs.txt: " + name + " is " + dt_name(t.dtype) + "; the problem's is " + allowed);
  };
  dtype_is("o", tensors.at("o").dtype == p.o_dtype, dt_name(p.o_dtype));
  if (tensors.at("o").role != "out") fail("inputs.txt: o must be the output (role=out)");
  for (const char* name : {"expected_o", "expected_lse"})
    if (tensors.count(name)) dtype_is(name, tensors.at(name).dtype == DT::F32, "fp32");
  for (const char* name : {"bound_o", "bound_lse"})
    if (tensors.count(name)) dtype_is(name, tensors.at(name).dtype == DT::F32 || tensors.at(name).dtype == DT::F64,
                                      "fp32 or fp64");
  if (p.lse) {
    dtype_is("lse", tensors.at("lse").dtype == DT::F32, "fp32");
    if (tensors.at("lse").role != "out") fail("inputs.txt: lse must be an output (role=out)");
  }
  for (const char* name : {"cu_seqlens_q", "cu_seqlens_k", "page_table"})
    if (tensors.count(name)) dtype_is(name, tensors.at(name).dtype == DT::I32, "int32");
}

struct UnitStats {
  long long compared = 0, bad = 0, nan_r = 0, nan_e = 0, inf_r = 0, inf_e = 0, poison = 0;
  double max_ratio = 0, max_abs = 0;
};

// O and LSE against the reference, element by element with the oracle's rule (the file's header), per unit
// (batch, head, query block). Prints the evidence; returns the exit code.
int judge_attention(const AttnProblem& p, const std::map<std::string, TensorFile>& t) {
  const TensorFile &O = t.at("o"), &EO = t.at("expected_o"), &BO = t.at("bound_o");
  const TensorFile* L = p.lse ? &t.at("lse") : nullptr;
  const TensorFile* EL = p.lse ? &t.at("expected_lse") : nullptr;
  const TensorFile* BL = p.lse ? &t.at("bound_lse") : nullptr;
  for (const TensorFile* b : {&BO, BL}) {
    if (b == nullptr) continue;
    for (long long i = 0; i < b->elements(); ++i)
      if (!(b->at1(i) >= 0)) fail(b->file + ": element " + std::to_string(i) + " has a negative or NaN bound");
  }
  const long long hq = p.heads_q, dv = p.head_dim_v, nqb = std::max(p.q_blocks(), 1ll);
  const long long cols = dv + (p.lse ? 1 : 0);
  std::vector<UnitStats> units(size_t(p.batch * hq * nqb));
  long long informative = 0, bad_o = 0, bad_l = 0;
  struct First {
    long long b = -1, i = 0, h = 0, c = 0;
    double received = 0, expected = 0, bound = 0;
    bool poison = false;
  } first;
  for (long long b = 0; b < p.batch; ++b)
    for (long long h = 0; h < hq; ++h)
      for (long long i = 0; i < p.lq(b); ++i) {
        const long long token = p.varlen_q() ? p.q_start[size_t(b)] + i : b * p.seqlen_q + i;
        UnitStats& u = units[size_t((b * hq + h) * nqb + i / p.block_q)];
        for (long long c = 0; c < cols; ++c) {
          const bool is_lse = c == dv;
          const long long at = is_lse ? (p.varlen_q() ? h * p.total_q + token : (b * hq + h) * p.seqlen_q + i)
                                      : (token * hq + h) * dv + c;
          const TensorFile& R = is_lse ? *L : O;
          const unsigned char* bits = R.data.data() + at * dt_size(R.dtype);
          const double rv = decode(R.dtype, bits);
          const double e = is_lse ? EL->at1(at) : EO.at1(at);
          const double bound = is_lse ? BL->at1(at) : BO.at1(at);
          const bool never = all_ones_bits(bits, dt_size(R.dtype));
          const bool rn = std::isnan(rv), en = std::isnan(e), ri = std::isinf(rv), ei = std::isinf(e);
          const bool finite = std::isfinite(rv) && std::isfinite(e);
          const double err = finite ? std::fabs(rv - e) : 0.0;
          const bool same_inf = ri && ei && std::signbit(rv) == std::signbit(e);
          const bool ok = (rn && en) || same_inf || (finite && err <= bound);
          const double ratio = (rn && en) || same_inf ? 0.0 : !finite ? INFINITY : err == 0 ? 0.0
                                                                                   : err / std::max(bound, 1e-300);
          ++u.compared;
          u.nan_r += rn, u.nan_e += en, u.inf_r += ri, u.inf_e += ei, u.poison += never;
          u.max_abs = std::max(u.max_abs, err);
          u.max_ratio = std::max(u.max_ratio, ratio);
          informative += std::fabs(e) > 1e-30;
          if (ok) continue;
          ++u.bad;
          (is_lse ? bad_l : bad_o) += 1;
          if (first.b < 0) first = {b, i, h, c, rv, e, bound, never};
        }
      }
  long long worst = 0, bad_units = 0, poison = 0, nan_r = 0, nan_e = 0, inf_r = 0, inf_e = 0;
  for (size_t k = 0; k < units.size(); ++k) {
    const UnitStats &s = units[k], &w = units[size_t(worst)];
    bad_units += s.bad > 0;
    poison += s.poison, nan_r += s.nan_r, nan_e += s.nan_e, inf_r += s.inf_r, inf_e += s.inf_e;
    const bool worse = (s.bad > 0) != (w.bad > 0) ? s.bad > 0
                       : s.max_ratio != w.max_ratio ? s.max_ratio > w.max_ratio
                       : s.bad != w.bad ? s.bad > w.bad : s.max_abs > w.max_abs;
    if (worse) worst = (long long)k;
  }
  auto unit_name = [&](long long k) {
    return "(batch " + std::to_string(k / (hq * nqb)) + ", head " + std::to_string(k / nqb % hq) + ", query block " +
           std::to_string(k % nqb) + ")";
  };
  auto dims = [](const TensorFile& f) {
    std::string s;
    for (long long e : f.shape) s += (s.empty() ? "[" : ", ") + std::to_string(e);
    return s + "]";
  };
  std::printf("reference: the oracle's expected O and LSE and per-element bounds (%s, %s%s)\n", EO.file.c_str(),
              BO.file.c_str(), p.lse ? (", " + EL->file + ", " + BL->file).c_str() : "");
  std::printf("output O: %s %s%s; %zu units (batch, head, query block of %lld query rows)\n", dims(O).c_str(),
              dt_name(O.dtype), p.lse ? (", LSE: " + dims(*L) + " fp32").c_str() : "", units.size(), p.block_q);
  const UnitStats& w = units[size_t(worst)];
  std::printf("  worst unit %s: err/bound %.3g, max |err| %.6g, bad %lld/%lld, NaN r/e %lld/%lld, Inf r/e %lld/%lld, "
              "never written %lld\n",
              unit_name(worst).c_str(), w.max_ratio, w.max_abs, w.bad, w.compared, w.nan_r, w.nan_e, w.inf_r, w.inf_e,
              w.poison);
  std::printf("  all units: bad elements %lld (O %lld, LSE %lld) in %lld of %zu units; NaN r/e %lld/%lld; Inf r/e "
              "%lld/%lld; never written (still the 0xFF poison) %lld\n",
              bad_o + bad_l, bad_o, bad_l, bad_units, units.size(), nan_r, nan_e, inf_r, inf_e, poison);
  if (first.b >= 0) {
    const std::string column = first.c == dv ? "column " + std::to_string(first.c) + " (LSE)"
                                             : "column " + std::to_string(first.c) + " (O)";
    std::printf("  first bad element: batch %lld, query %lld, head %lld, %s [unit %s, row %lld of the unit]: received "
                "%.6g%s, expected %.6g, bound %.3g\n",
                first.b, first.i, first.h, column.c_str(),
                unit_name((first.b * hq + first.h) * nqb + first.i / p.block_q).c_str(), first.i % p.block_q,
                first.received, first.poison ? " (never written: still the 0xFF poison)" : "", first.expected,
                first.bound);
  }
  return verdict(bad_o + bad_l, informative);
}

// The attention reproducer's program: the launches (unless --check-only), then O and LSE judged.
int attention_main(const Options& o) {
  if (o.host_reference)
    fail("--host-reference: the host program has no attention reference of its own; an attention reproducer "
         "judges with the oracle's (expected_o.bin, bound_o.bin, expected_lse.bin, bound_lse.bin)");
  if (!o.d_file.empty() || !o.expected_file.empty() || !o.bound_file.empty())
    fail("--d, --expected, --bound and --check-only's EXPECTED D name a GEMM's output and reference; an attention "
         "reproducer reads its O and LSE and their reference from the files inputs.txt lists");
  if (!o.dequant_b_file.empty()) fail("--dequant-b writes a quantised B; an attention problem has none");
  const AttnProblem p = read_attention_problem(o.dir);
  std::vector<std::string> outputs = {"o"};
  if (p.lse) outputs.push_back("lse");
  if (!o.check_only) {
    Launch L = read_launch(o.dir);
    auto tensors = read_inputs_manifest(o.dir);
    check_attention_tensors(p, tensors);
    run_launches(o, L, p.describe, tensors, outputs);
  }
  auto tensors = read_inputs_manifest(o.dir);
  check_attention_tensors(p, tensors);
  if (o.check_only) std::printf("repro: %s, check only (no kernel run)\n", p.describe.c_str());
  for (const char* name : {"o", "lse", "expected_o", "bound_o", "expected_lse", "bound_lse"}) {
    auto it = tensors.find(name);
    if (it != tensors.end()) load_file(it->second, join_path(o.dir, it->second.file));
  }
  const int code = judge_attention(p, tensors);
  std::fflush(stdout);
  return code;
}

}  // namespace repro

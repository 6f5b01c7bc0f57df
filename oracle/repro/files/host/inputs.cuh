// host/inputs.cuh -- inputs.txt (the tensors and their files) and problem.txt (the GEMM the reproducer judges).
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "dtypes.cuh"
#include "text.cuh"

namespace repro {

// ------------------------------------------------------------------------------ inputs.txt

struct TensorFile {
  std::string name, role, file, major;
  DT dtype = DT::F32;
  std::vector<long long> shape;    // the buffer, in storage order
  std::vector<long long> logical;  // the logical matrix (rows, cols) or vector
  long long bytes = 0;
  std::vector<unsigned char> data;

  long long elements() const {
    long long n = 1;
    for (long long d : shape) n *= d;
    return n;
  }
  // Element (r, c) of the logical matrix in a buffer stored in `major` order; the leading
  // dimension is the buffer's last extent (padding rows, if any, come after the real ones).
  double at(long long r, long long c) const { return at_in(0, r, c); }
  // The same in matrix g of a stack (B of a grouped problem: [G, K, N] stored matrix by matrix).
  double at_in(long long g, long long r, long long c) const { return decode(dtype, bits_in(g, r, c)); }
  // The raw bytes of that element (a quantised B's stored codes are read as bytes, not values).
  const unsigned char* bits_in(long long g, long long r, long long c) const {
    const long long ld = shape.back();
    const long long matrix = shape.size() > 2 ? shape[shape.size() - 2] * ld : 0;
    const long long i = g * matrix + (major == "col" ? c * ld + r : r * ld + c);
    return data.data() + i * dt_size(dtype);
  }
  double at1(long long i) const { return decode(dtype, data.data() + i * dt_size(dtype)); }
};

std::vector<long long> parse_shape(const std::string& s, const std::string& at) {
  std::vector<long long> out;
  for (const auto& p : split(s, 'x')) {
    const long long v = to_int(p, at);
    if (v < 1) fail(at + ": shape " + s + " has an extent below 1");
    out.push_back(v);
  }
  return out;
}

// The buffer holds its logical matrix in its major (at() and at_in() never index past it): the same
// rank, the same leading (stack) extents, and rows and columns within the stored ones.
void check_storage(const TensorFile& t, const std::string& at) {
  if (t.major != "row" && t.major != "col") fail(at + ": major=" + t.major + " is unknown; known: row, col");
  const size_t r = t.shape.size();
  if (r == 4 && t.major == "row" && t.logical == t.shape) return;  // an attention tensor, stored as it is
  bool ok = t.logical.size() == r && r >= 1 && r <= 3;
  for (size_t i = 0; ok && i + 2 < r; ++i) ok = t.shape[i] == t.logical[i];
  if (ok && r == 1) ok = t.shape[0] >= t.logical[0];
  if (ok && r >= 2) {
    const long long rows = t.logical[r - 2], cols = t.logical[r - 1];
    ok = t.major == "col" ? t.shape[r - 2] >= cols && t.shape[r - 1] >= rows
                          : t.shape[r - 2] >= rows && t.shape[r - 1] >= cols;
  }
  if (!ok) fail(at + ": the logical shape does not fit in the stored shape (" + t.major + "-major)");
}

std::map<std::string, TensorFile> read_inputs_manifest(const std::string& dir) {
  const std::string path = join_path(dir, "inputs.txt");
  std::map<std::string, TensorFile> out;
  for (const Line& l : read_lines(path)) {
    const std::string at = where(path, l);
    if (l.tokens[0] != "tensor") fail(at + ": expected a 'tensor name=... ' line, got '" + l.tokens[0] + "'");
    const auto kv = pairs(l, 1, at);
    TensorFile t;
    t.name = identifier(need(kv, "name", at), at, "tensor name");
    t.role = need(kv, "role", at);
    t.file = file_name(need(kv, "file", at), at, "file");
    if (out.count(t.name)) fail(at + ": tensor " + t.name + " is listed twice");
    t.dtype = parse_dtype(need(kv, "dtype", at), at);
    t.shape = parse_shape(need(kv, "shape", at), at);
    t.logical = kv.count("logical") ? parse_shape(kv.at("logical"), at) : t.shape;
    t.major = kv.count("major") ? kv.at("major") : "row";
    t.bytes = to_int(need(kv, "bytes", at), at);
    if (t.role != "in" && t.role != "out" && t.role != "inout" && t.role != "expected" && t.role != "bound")
      fail(at + ": role=" + t.role + " is unknown; known: in, out, inout (a workspace), expected, bound");
    long long elements = 1;
    for (long long e : t.shape) elements = checked_mul(elements, e, at + ": shape");
    const long long need = checked_mul(elements, dt_size(t.dtype), at + ": shape x " + dt_name(t.dtype));
    if (t.bytes != need)
      fail(at + ": bytes=" + std::to_string(t.bytes) + " but shape x " + dt_name(t.dtype) + " needs " +
           std::to_string(need));
    check_storage(t, at);
    out[t.name] = t;
  }
  return out;
}

// A tensor's file: a regular file (open_regular) of exactly the bytes inputs.txt gives it, whose
// shape check_problem_tensors holds to the problem; its size is checked before anything is allocated.
void load_file(TensorFile& t, const std::string& path) {
  struct stat st;
  const int fd = open_regular(path, t.name + ": " + std::to_string(t.bytes) + " bytes of " + dt_name(t.dtype), &st);
  const long long size = (long long)st.st_size;
  if (size != t.bytes) {
    ::close(fd);
    fail(path + " has " + std::to_string(size) + " bytes; inputs.txt says " + t.name + " has " +
         std::to_string(t.bytes) + " (" + dt_name(t.dtype) + ")");
  }
  t.data.resize(size_t(size));
  read_exactly(fd, t.data.data(), size_t(size), path);
  ::close(fd);
}

// A file the program writes (its folder's outputs, --dequant-b): a regular file with one name,
// never opened through a symbolic link, a FIFO or a device (a received folder may hold one where an
// output goes; writing through it would overwrite a file the reproducer did not make).
void write_file(const std::string& path, const void* data, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    fail("cannot write " + path + ": " + std::strerror(err) +
         (err == ELOOP ? " (a symbolic link: the reproducer writes only regular files)" : ""));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    ::close(fd);
    fail("cannot write " + path + ": not a regular file with one name (the reproducer does not write through it)");
  }
  int err = ::ftruncate(fd, 0) == 0 ? 0 : errno;
  const char* at = static_cast<const char*>(data);
  for (size_t left = bytes; err == 0 && left > 0;) {
    const ssize_t n = ::write(fd, at, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : EIO;
    else at += n, left -= size_t(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) fail("cannot write " + path + ": " + std::strerror(err));
}

void write_file(const std::string& path, const std::string& text) { write_file(path, text.data(), text.size()); }

// ------------------------------------------------------------------------------ problem.txt

struct Problem {
  long long m = 0, n = 0, k = 0;
  long long total_m = 0;              // rows of A and D (m unless grouped or batched)
  bool grouped = false;               // a grouped or batched problem: every group its own GEMM
  std::vector<long long> group_rows;  // M of each group (one group of total_m rows if not grouped)
  std::vector<long long> group_row0;  // the first row of each group in A and D
  int bm = 0, bn = 0, bk = 0;
  std::string a_dtype, acc, activation = "none", bias = "none", scale_a = "none", scale_b = "none";
  DT out = DT::BF16;
  double alpha = 1.0, beta = 0.0;
  bool saturate = false;
  bool declared_epilogue = false;     // an epilogue order other than scale, alpha/beta, bias, activation, cast
  long long sa_rows = 0, sa_k = 0, sb_rows = 0, sb_k = 0;
  std::string sa_dtype = "fp32", sb_dtype = "fp32";  // a block scale's stored dtype (e8m0: raw bytes)
  long long promotion = 0;
  // a quantised B (b_scales not none): its stored dtype, packing, k per scale group, the scales'
  // dtype, the zero points' form and the dequant arithmetic (host/dequant.cuh checks them together)
  std::string b_dtype, b_packing = "none", b_scales = "none", b_zeros = "none", dequant_precision = "fp32";
  long long b_group = 0;
  std::string describe;

  bool quantised_b() const { return b_scales != "none"; }
};

// `value` if it is one of `allowed` (space-separated words), else an error naming the key.
const std::string& one_of(const std::string& value, const std::string& allowed, const std::string& at,
                          const std::string& key) {
  std::istringstream ss(allowed);
  std::string w;
  while (ss >> w)
    if (w == value) return value;
  fail(at + ": " + key + " '" + value + "' is unknown; known: " + allowed);
}

constexpr long long kMaxDim = 2147483647;   // m, n, k and the stacked rows: the oracle's int32 sizes
constexpr long long kMaxTileDim = 65535;    // the trace format's limit (oracle.problem.spec)

// The sizes against each other and against overflow, before anything is sized from them.
void check_problem_sizes(const Problem& p, const std::string& path) {
  for (const auto& f : {std::make_pair("m", p.m), std::make_pair("n", p.n), std::make_pair("k", p.k),
                        std::make_pair("total_m", p.total_m)})
    if (f.second < 1 || f.second > kMaxDim)
      fail(path + ": " + f.first + " " + std::to_string(f.second) + " must be 1.." + std::to_string(kMaxDim));
  if (p.bm > kMaxTileDim || p.bn > kMaxTileDim || p.bk > kMaxTileDim)
    fail(path + ": tile " + std::to_string(p.bm) + " " + std::to_string(p.bn) + " " + std::to_string(p.bk) +
         " has an extent past " + std::to_string(kMaxTileDim));
  if (p.group_rows.size() > 65536) fail(path + ": more than 65536 groups");
  checked_mul(checked_mul(p.total_m, p.n, path + ": M x N"), 16, path + ": the reference of M x N elements");
  checked_mul(checked_mul(p.k, p.n, path + ": K x N"), 16, path + ": a dequantised B of K x N elements");
  checked_mul(p.total_m, p.k, path + ": M x K");
  if (p.scale_a == "block" && (p.sa_rows < 1 || p.sa_k < 1 || p.sa_rows > kMaxDim || p.sa_k > kMaxDim))
    fail(path + ": scale_a block " + std::to_string(p.sa_rows) + " " + std::to_string(p.sa_k) + " must be positive");
  if (p.scale_b == "block" && (p.sb_rows < 1 || p.sb_k < 1 || p.sb_rows > kMaxDim || p.sb_k > kMaxDim))
    fail(path + ": scale_b block " + std::to_string(p.sb_rows) + " " + std::to_string(p.sb_k) + " must be positive");
  if (p.b_group > p.k) fail(path + ": b_group_size " + std::to_string(p.b_group) + " is more than K = " + std::to_string(p.k));
}

Problem read_problem(const std::string& dir) {
  const std::string path = join_path(dir, "problem.txt");
  Problem p;
  for (const Line& l : read_lines(path)) {
    const std::string at = where(path, l);
    const std::string& key = l.tokens[0];
    auto arg = [&](size_t i) -> const std::string& { return key_value(l, i, at); };
    if (key == "m") p.m = to_int(arg(1), at);
    else if (key == "total_m") p.total_m = to_int(arg(1), at);
    else if (key == "group_sizes") {
      p.grouped = arg(1) != "none";
      if (p.grouped)
        for (size_t i = 1; i < l.tokens.size(); ++i) {
          const long long g = to_int(l.tokens[i], at);
          if (g < 0 || g > kMaxDim) fail(at + ": group size " + l.tokens[i] + " must be 0.." + std::to_string(kMaxDim));
          if (p.group_rows.size() >= 65536) fail(at + ": more than 65536 groups");
          p.group_rows.push_back(g);
        }
    }
    else if (key == "n") p.n = to_int(arg(1), at);
    else if (key == "k") p.k = to_int(arg(1), at);
    else if (key == "tile") {
      auto dim = [&](size_t i) {
        const long long v = to_int(arg(i), at);
        if (v < 1 || v > kMaxTileDim) fail(at + ": tile extent " + arg(i) + " must be 1.." + std::to_string(kMaxTileDim));
        return int(v);
      };
      p.bm = dim(1), p.bn = dim(2), p.bk = dim(3);
    }
    else if (key == "a_dtype") p.a_dtype = arg(1);
    else if (key == "acc_dtype") p.acc = arg(1);
    else if (key == "out_dtype") p.out = parse_dtype(arg(1), at);
    else if (key == "alpha") p.alpha = to_double(arg(1), at);
    else if (key == "beta") p.beta = to_double(arg(1), at);
    else if (key == "bias") p.bias = arg(1);
    else if (key == "activation") p.activation = arg(1);
    else if (key == "saturate") p.saturate = to_int(arg(1), at) != 0;
    else if (key == "epilogue_order") p.declared_epilogue = arg(1) != "default";
    else if (key == "b_dtype") p.b_dtype = one_of(arg(1), "fp32 fp16 bf16 e4m3 e5m2 int8 int4 uint4 fp4_e2m1", at, key);
    else if (key == "b_packing") p.b_packing = one_of(arg(1), "none k_pairs_low_first k_pairs_high_first k8_interleaved", at, key);
    else if (key == "b_group_size") p.b_group = arg(1) == "none" ? 0 : to_int(arg(1), at);
    else if (key == "b_scales") p.b_scales = one_of(arg(1), "none fp16 bf16 fp32 e4m3 e8m0", at, key);
    else if (key == "b_zeros") p.b_zeros = one_of(arg(1), "none int float float_offset", at, key);
    else if (key == "dequant_precision")
      p.dequant_precision = arg(1) == "none" ? "fp32" : one_of(arg(1), "fp32 operand", at, key);
    else if (key == "promotion_interval") p.promotion = arg(1) == "none" ? 0 : to_int(arg(1), at);
    else if (key == "scale_a" || key == "scale_b") {  // scale_X KIND [ROWS K [DTYPE]] (a block's, fp32 if absent)
      const bool a = key == "scale_a";
      std::string& kind = a ? p.scale_a : p.scale_b;
      kind = one_of(arg(1), "none tensor row col block", at, key);
      if (kind == "block") {
        (a ? p.sa_rows : p.sb_rows) = to_int(arg(2), at);
        (a ? p.sa_k : p.sb_k) = to_int(arg(3), at);
        if (l.tokens.size() > 4) (a ? p.sa_dtype : p.sb_dtype) = one_of(arg(4), "fp32 e8m0 e4m3", at, key + " dtype");
      }
    } else if (key == "describe") {
      for (size_t i = 1; i < l.tokens.size(); ++i) p.describe += (i > 1 ? " " : "") + l.tokens[i];
    }
    // other keys (majors, c_dtype, ...) are informative: the tensors carry their own
  }
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.bm < 1 || p.bn < 1 || p.bk < 1)
    fail(path + ": m, n, k and tile must all be given and positive");
  if (p.total_m == 0) p.total_m = p.m;
  if (!p.grouped) p.group_rows = {p.total_m};
  long long row = 0;
  for (long long g : p.group_rows) {
    p.group_row0.push_back(row);
    row += g;
  }
  if (row != p.total_m)
    fail(path + ": the group sizes add up to " + std::to_string(row) + " rows, total_m is " + std::to_string(p.total_m));
  if (p.b_group < 0) fail(path + ": b_group_size " + std::to_string(p.b_group) + " is negative");
  if (p.quantised_b() && p.b_group == 0) p.b_group = p.k;  // none: one group of all K
  check_problem_sizes(p, path);
  return p;
}

// Every tensor the problem reads has the logical shape the problem gives it, so no loop over M, N
// or K reads past a buffer (a problem.txt that disagrees with inputs.txt is refused here, before a
// file is loaded). A quantised B and its scales are checked by host/dequant.cuh.
void check_problem_tensors(const Problem& p, const std::map<std::string, TensorFile>& tensors) {
  const long long groups = (long long)p.group_rows.size();
  auto ceil_div = [](long long a, long long b) { return (a + b - 1) / b; };
  std::map<std::string, std::vector<long long>> want = {
      {"a", {p.total_m, p.k}}, {"d", {p.total_m, p.n}}, {"c", {p.total_m, p.n}},
      {"expected", {p.total_m, p.n}}, {"bound", {p.total_m, p.n}}};
  if (!p.quantised_b()) want["b"] = p.grouped ? std::vector<long long>{groups, p.k, p.n} : std::vector<long long>{p.k, p.n};
  if (p.bias == "row") want["bias"] = {p.total_m};
  if (p.bias == "col") want["bias"] = p.grouped ? std::vector<long long>{groups, p.n} : std::vector<long long>{p.n};
  if (p.scale_a == "tensor") want["scale_a"] = {1};
  if (p.scale_a == "row") want["scale_a"] = {p.total_m};
  if (p.scale_a == "block") want["scale_a"] = {ceil_div(p.total_m, p.sa_rows), ceil_div(p.k, p.sa_k)};
  if (p.scale_b == "tensor") want["scale_b"] = {1};
  if (p.scale_b == "col") want["scale_b"] = {p.n};
  if (p.scale_b == "block")  // a grouped or batched problem: one tensor per group, [G, N / gn, K / gk]
    want["scale_b"] = p.grouped ? std::vector<long long>{groups, ceil_div(p.n, p.sb_rows), ceil_div(p.k, p.sb_k)}
                                : std::vector<long long>{ceil_div(p.n, p.sb_rows), ceil_div(p.k, p.sb_k)};
  for (const auto& kv : want) {
    auto it = tensors.find(kv.first);
    if (it == tensors.end() || it->second.logical == kv.second) continue;
    std::string shape, has;
    for (long long e : kv.second) shape += (shape.empty() ? "" : "x") + std::to_string(e);
    for (long long e : it->second.logical) has += (has.empty() ? "" : "x") + std::to_string(e);
    fail("inputs.txt: " + kv.first + " is " + has + " (logical) but problem.txt's " + p.describe + " needs " + shape +
         ": the two files disagree");
  }
  // a block scale is stored in its dtype: fp32 and e4m3 as themselves, e8m0 as its raw bytes
  for (const auto& sc : {std::make_pair("scale_a", p.scale_a == "block" ? p.sa_dtype : ""),
                         std::make_pair("scale_b", p.scale_b == "block" ? p.sb_dtype : "")}) {
    auto it = tensors.find(sc.first);
    if (sc.second.empty() || it == tensors.end()) continue;
    const DT want_dt = sc.second == "e8m0" ? DT::U8 : sc.second == "e4m3" ? DT::E4M3 : DT::F32;
    if (it->second.dtype != want_dt)
      fail(std::string("inputs.txt: ") + sc.first + " has dtype " + dt_name(it->second.dtype) + " but problem.txt's " +
           sc.first + " block scales are " + sc.second + " (stored as " + dt_name(want_dt) + "): the two files disagree");
  }
}

}  // namespace repro

// repro.cu -- the host program of a standalone reproducer written by `python -m oracle repro`.
//
// Data path: the text files of its directory (launch.txt, problem.txt, inputs.txt) and the binary
// inputs -> device buffers (inputs and workspaces uploaded with their recorded bytes, outputs
// filled with 0xFF bytes first, NaN in every float format) -> TMA tensor maps encoded with
// cuTensorMapEncodeTiled from the recorded fields -> the kernels, loaded by name from the cubin the
// Makefile built from the unchanged kernel source with the oracle's flags, launched one after the
// other in launch.txt's order (each to completion before the next) with the recorded grid, block,
// cluster, dynamic shared memory and arguments -> D written to d.bin and compared tile by tile
// (a grouped problem: group by group, tiles counted from each group's first row) with the oracle's
// reference D and per-element bounds (expected.bin, bound.bin) or, when those files are absent,
// with a double-precision host reference of the whole problem and a conservative bound (README.txt
// gives its model).
// Built with -DORACLE_REPRO_TRACED=1 (make TRACE=1) it launches the traced entry points with a
// host-mapped pinned sink, set once for all of them, and writes the sink's bytes to sink.bin, also
// after a kernel fault.
//
// Constraints: nothing in this file depends on the case, so one binary serves every reproducer
// of one kernel source and flags (--dir, --cubin); the sink header is filled through the structs
// and constants of oracle_trace/trace.cuh, never by byte offsets; --check-only makes no CUDA call.
//
// Usage: repro [--dir DIR] [--cubin FILE] [--timeout S] [--host-reference]
//              [--check-only [EXPECTED D]] [--d FILE] [--expected FILE] [--bound FILE] [--dry-run]
// --dry-run reads every file, prints the argument bytes and writes the initial sink header
// (sink_init.bin, traced build) without touching CUDA: the launch can be checked on any machine.
// Exit codes (the oracle's): 0 MATCH, 1 DIVERGED, 2 bad usage or input files, 3 kernel error,
// 5 MISTRUSTED (every reference value is zero: nothing to discriminate).

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "oracle_trace/trace.cuh"

#ifndef ORACLE_REPRO_TRACED
#define ORACLE_REPRO_TRACED 0
#endif

namespace repro {

enum ExitCode { kMatch = 0, kDiverged = 1, kBadInput = 2, kKernelError = 3, kMistrusted = 5 };

[[noreturn]] void fail(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::exit(kBadInput);
}

std::string join_path(const std::string& dir, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  return dir + "/" + file;
}

bool file_exists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

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

// ------------------------------------------------------------------------------ text files

struct Line {
  int number;
  std::vector<std::string> tokens;
};

// Lines of whitespace-separated tokens; '#' starts a comment; blank lines are skipped. A control
// character other than a tab (a carriage return, a NUL, an escape) is refused, not read around.
std::vector<Line> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read " + path + " (the reproducer's directory must hold it; --dir DIR)");
  std::vector<Line> out;
  std::string text;
  int no = 0;
  while (std::getline(in, text)) {
    ++no;
    for (unsigned char c : text)
      if ((c < 0x20 && c != '\t') || c == 0x7f)
        fail(path + ":" + std::to_string(no) + ": control character " + std::to_string(int(c)) +
             " in a line; the oracle writes none");
    const auto hash = text.find('#');
    if (hash != std::string::npos) text.resize(hash);
    std::istringstream ss(text);
    Line l{no, {}};
    std::string t;
    while (ss >> t) l.tokens.push_back(t);
    if (!l.tokens.empty()) out.push_back(l);
  }
  return out;
}

std::string where(const std::string& path, const Line& l) { return path + ":" + std::to_string(l.number); }

// The names the oracle writes (harness/names.py): an entry point or tensor is a C identifier, a
// file a plain name of letters, digits and _ . + - not starting with '.' or '-' (no folder, no '..').
bool is_identifier(const std::string& s) {
  if (s.empty() || s.size() > 1024 || !(std::isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_')) return false;
  return true;
}

bool is_file_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || !(std::isalnum((unsigned char)s[0]) || s[0] == '_')) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_' || c == '.' || c == '+' || c == '-')) return false;
  return true;
}

const std::string& identifier(const std::string& s, const std::string& at, const std::string& what) {
  if (!is_identifier(s)) fail(at + ": " + what + " '" + s + "' is not a C identifier");
  return s;
}

const std::string& file_name(const std::string& s, const std::string& at, const std::string& what) {
  if (!is_file_name(s)) fail(at + ": " + what + " '" + s + "' is not a plain file name of this directory");
  return s;
}

long long to_int(const std::string& s, const std::string& at) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno) fail(at + ": '" + s + "' is not an integer");
  return v;
}

unsigned long long to_uint(const std::string& s, const std::string& at) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno) fail(at + ": '" + s + "' is not an unsigned integer");
  return v;
}

double to_double(const std::string& s, const std::string& at) {  // decimal or C99 hex float
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') fail(at + ": '" + s + "' is not a number");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// key=value tokens of a line, from token `first` on.
std::map<std::string, std::string> pairs(const Line& l, size_t first, const std::string& at) {
  std::map<std::string, std::string> kv;
  for (size_t i = first; i < l.tokens.size(); ++i) {
    const auto eq = l.tokens[i].find('=');
    if (eq == std::string::npos) fail(at + ": '" + l.tokens[i] + "' is not key=value");
    kv[l.tokens[i].substr(0, eq)] = l.tokens[i].substr(eq + 1);
  }
  return kv;
}

std::string need(const std::map<std::string, std::string>& kv, const std::string& key, const std::string& at) {
  auto it = kv.find(key);
  if (it == kv.end()) fail(at + ": missing " + key + "=...");
  return it->second;
}

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
  double at_in(long long g, long long r, long long c) const {
    const long long ld = shape.back();
    const long long matrix = shape.size() > 2 ? shape[shape.size() - 2] * ld : 0;
    const long long i = g * matrix + (major == "col" ? c * ld + r : r * ld + c);
    return decode(dtype, data.data() + i * dt_size(dtype));
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
    if (t.bytes != t.elements() * dt_size(t.dtype))
      fail(at + ": bytes=" + std::to_string(t.bytes) + " but shape x " + dt_name(t.dtype) + " needs " +
           std::to_string(t.elements() * dt_size(t.dtype)));
    out[t.name] = t;
  }
  return out;
}

void load_file(TensorFile& t, const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("cannot read " + path + " (" + t.name + ": " + std::to_string(t.bytes) + " bytes of " +
                dt_name(t.dtype) + ")");
  const long long size = in.tellg();
  if (size != t.bytes)
    fail(path + " has " + std::to_string(size) + " bytes; inputs.txt says " + t.name + " has " +
         std::to_string(t.bytes) + " (" + dt_name(t.dtype) + ")");
  in.seekg(0);
  t.data.resize(size_t(size));
  in.read(reinterpret_cast<char*>(t.data.data()), size);
  if (!in) fail("could not read all of " + path);
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), std::streamsize(bytes));
  if (!out) fail("cannot write " + path);
}

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
  long long sa_rows = 0, sa_k = 0, sb_rows = 0, sb_k = 0;
  long long promotion = 0;
  std::string describe;
};

Problem read_problem(const std::string& dir) {
  const std::string path = join_path(dir, "problem.txt");
  Problem p;
  for (const Line& l : read_lines(path)) {
    const std::string at = where(path, l);
    const std::string& key = l.tokens[0];
    auto arg = [&](size_t i) -> const std::string& {
      if (l.tokens.size() <= i) fail(at + ": " + key + " needs " + std::to_string(i) + " value(s)");
      return l.tokens[i];
    };
    if (key == "m") p.m = to_int(arg(1), at);
    else if (key == "total_m") p.total_m = to_int(arg(1), at);
    else if (key == "group_sizes") {
      p.grouped = arg(1) != "none";
      if (p.grouped)
        for (size_t i = 1; i < l.tokens.size(); ++i) {
          const long long g = to_int(l.tokens[i], at);
          if (g < 0) fail(at + ": group size " + l.tokens[i] + " is negative");
          p.group_rows.push_back(g);
        }
    }
    else if (key == "n") p.n = to_int(arg(1), at);
    else if (key == "k") p.k = to_int(arg(1), at);
    else if (key == "tile") { p.bm = int(to_int(arg(1), at)); p.bn = int(to_int(arg(2), at)); p.bk = int(to_int(arg(3), at)); }
    else if (key == "a_dtype") p.a_dtype = arg(1);
    else if (key == "acc_dtype") p.acc = arg(1);
    else if (key == "out_dtype") p.out = parse_dtype(arg(1), at);
    else if (key == "alpha") p.alpha = to_double(arg(1), at);
    else if (key == "beta") p.beta = to_double(arg(1), at);
    else if (key == "bias") p.bias = arg(1);
    else if (key == "activation") p.activation = arg(1);
    else if (key == "saturate") p.saturate = to_int(arg(1), at) != 0;
    else if (key == "promotion_interval") p.promotion = arg(1) == "none" ? 0 : to_int(arg(1), at);
    else if (key == "scale_a") {
      p.scale_a = arg(1);
      if (p.scale_a == "block") { p.sa_rows = to_int(arg(2), at); p.sa_k = to_int(arg(3), at); }
    } else if (key == "scale_b") {
      p.scale_b = arg(1);
      if (p.scale_b == "block") { p.sb_rows = to_int(arg(2), at); p.sb_k = to_int(arg(3), at); }
    } else if (key == "describe") {
      for (size_t i = 1; i < l.tokens.size(); ++i) p.describe += (i > 1 ? " " : "") + l.tokens[i];
    }
    // other keys (b_dtype, majors, c_dtype, ...) are informative: the tensors carry their own
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
  return p;
}

// ------------------------------------------------------------------------------ launch.txt

struct MapSpec {
  std::string operand, buffer, dtype;
  int data_type = 0, rank = 0, interleave = 0, swizzle = 0, l2 = 0, oob = 0;
  std::vector<cuuint64_t> dims, strides;
  std::vector<cuuint32_t> box, estr;
};

struct ArgSpec {
  std::string kind;  // ptr | tensormap | bytes (scalars become bytes)
  std::string name;  // ptr: the buffer
  int map = -1;      // tensormap: index into Launch::maps
  std::vector<unsigned char> bytes;
  std::string text;  // as written, for the printout
};

// One kernel launch: its entry points, configuration, tensor maps and arguments.
struct KernelLaunch {
  std::string entry_traced, entry_plain;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, cluster[3] = {1, 1, 1};
  size_t smem = 0;
  std::vector<ArgSpec> args;
  std::vector<MapSpec> maps;
};

// Every launch in order ("launch I" starts launch I; keys before the first one belong to launch 0),
// the cubins and the trace selection, which hold for all of them.
struct Launch {
  std::string cubin_traced, cubin_plain;
  std::vector<KernelLaunch> kernels;
  std::vector<std::pair<int, int>> tiles;  // trace selection; empty: all
  bool all_k_blocks = true;
  std::vector<int> k_blocks;
  unsigned long long capacity = 0;
  double timeout_s = 60;
};

template <class T>
std::vector<T> int_list(const std::string& s, const std::string& at) {
  std::vector<T> out;
  for (const auto& p : split(s, ',')) out.push_back(T(to_uint(p, at)));
  return out;
}

template <class T>
void put(std::vector<unsigned char>& b, T v) {
  b.resize(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
}

Launch read_launch(const std::string& dir) {
  const std::string path = join_path(dir, "launch.txt");
  Launch L;
  L.kernels.resize(1);
  bool sections = false;
  long long declared = -1;  // the "launches N" line, if any
  for (const Line& l : read_lines(path)) {
    const std::string at = where(path, l);
    const std::string& key = l.tokens[0];
    auto arg = [&](size_t i) -> const std::string& {
      if (l.tokens.size() <= i) fail(at + ": " + key + " needs " + std::to_string(i) + " value(s)");
      return l.tokens[i];
    };
    // Every key takes exactly its values: a line with more (an entry name that was two words, a
    // value that went on) is refused, as is a key given twice where one value is kept.
    auto exactly = [&](size_t n) {
      if (l.tokens.size() != n + 1)
        fail(at + ": " + key + " takes " + std::to_string(n) + " value(s), the line has " +
             std::to_string(l.tokens.size() - 1));
    };
    auto once = [&](const std::string& current) {
      if (!current.empty()) fail(at + ": " + key + " is given twice");
    };
    auto triple = [&](unsigned* d) {
      exactly(3);
      for (int i = 0; i < 3; ++i) d[i] = unsigned(to_uint(arg(i + 1), at));
    };
    KernelLaunch& K = L.kernels.back();
    const bool one_value = key == "launches" || key == "launch" || key == "entry_traced" || key == "entry_plain" ||
                           key == "cubin_traced" || key == "cubin_plain" || key == "shared_mem_bytes" ||
                           key == "timeout_s" || key == "trace_capacity_bytes";
    if (one_value) exactly(1);
    if (key == "launches") declared = to_int(arg(1), at);
    else if (key == "launch") {
      const long long index = to_int(arg(1), at);
      const long long want = sections ? (long long)L.kernels.size() : 0;
      if (index != want)
        fail(at + ": launch " + arg(1) + " out of order; the launches are numbered 0, 1, ... and this one must be " +
             std::to_string(want));
      if (sections) L.kernels.emplace_back();
      sections = true;
    }
    else if (key == "entry_traced") { once(K.entry_traced); K.entry_traced = identifier(arg(1), at, "entry point"); }
    else if (key == "entry_plain") { once(K.entry_plain); K.entry_plain = identifier(arg(1), at, "entry point"); }
    else if (key == "cubin_traced") { once(L.cubin_traced); L.cubin_traced = file_name(arg(1), at, "cubin"); }
    else if (key == "cubin_plain") { once(L.cubin_plain); L.cubin_plain = file_name(arg(1), at, "cubin"); }
    else if (key == "grid") triple(K.grid);
    else if (key == "block") triple(K.block);
    else if (key == "cluster") triple(K.cluster);
    else if (key == "shared_mem_bytes") K.smem = size_t(to_uint(arg(1), at));
    else if (key == "timeout_s") L.timeout_s = to_double(arg(1), at);
    else if (key == "trace_capacity_bytes") L.capacity = to_uint(arg(1), at);
    else if (key == "trace_tiles") {
      for (size_t i = 1; i < l.tokens.size(); ++i) {
        const auto v = split(l.tokens[i], ',');
        if (v.size() != 2) fail(at + ": trace tile '" + l.tokens[i] + "' must be TM,TN");
        L.tiles.push_back({int(to_int(v[0], at)), int(to_int(v[1], at))});
      }
    } else if (key == "trace_k_blocks") {
      L.all_k_blocks = arg(1) == "all";
      if (!L.all_k_blocks)
        for (size_t i = 1; i < l.tokens.size(); ++i) L.k_blocks.push_back(int(to_int(l.tokens[i], at)));
    } else if (key == "tensormap") {
      const auto kv = pairs(l, 1, at);
      MapSpec m;
      m.operand = need(kv, "operand", at);
      m.buffer = need(kv, "buffer", at);
      m.dtype = need(kv, "dtype", at);
      m.data_type = int(to_int(need(kv, "data_type", at), at));
      m.rank = int(to_int(need(kv, "rank", at), at));
      m.dims = int_list<cuuint64_t>(need(kv, "dims", at), at);
      m.strides = m.rank > 1 ? int_list<cuuint64_t>(need(kv, "strides", at), at) : std::vector<cuuint64_t>{};
      m.box = int_list<cuuint32_t>(need(kv, "box", at), at);
      m.estr = int_list<cuuint32_t>(need(kv, "element_strides", at), at);
      m.interleave = int(to_int(need(kv, "interleave", at), at));
      m.swizzle = int(to_int(need(kv, "swizzle", at), at));
      m.l2 = int(to_int(need(kv, "l2_promotion", at), at));
      m.oob = int(to_int(need(kv, "oob_fill", at), at));
      if (m.rank < 1 || m.rank > 5 || int(m.dims.size()) != m.rank || int(m.strides.size()) != m.rank - 1 ||
          int(m.box.size()) != m.rank || int(m.estr.size()) != m.rank)
        fail(at + ": the map's dims, strides, box and element_strides do not fit rank " + std::to_string(m.rank));
      K.maps.push_back(m);
    } else if (key == "arg") {
      ArgSpec a;
      const std::string& kind = arg(1);
      a.text = kind + " " + arg(2);
      if (l.tokens.size() > ((kind == "f32" || kind == "f64") ? 4u : 3u))
        fail(at + ": arg " + kind + " takes one value" + ((kind == "f32" || kind == "f64") ? " (its bits) and the "
             "number it is" : "") + ", the line has more");
      if (kind == "ptr") { a.kind = "ptr"; a.name = identifier(arg(2), at, "buffer"); }
      else if (kind == "tensormap") { a.kind = "tensormap"; a.map = int(to_int(arg(2), at)); }
      else {
        a.kind = "bytes";
        if (kind == "i32") put(a.bytes, int32_t(to_int(arg(2), at)));
        else if (kind == "u32") put(a.bytes, uint32_t(to_uint(arg(2), at)));
        else if (kind == "i64") put(a.bytes, int64_t(to_int(arg(2), at)));
        else if (kind == "u64") put(a.bytes, uint64_t(to_uint(arg(2), at)));
        else if (kind == "f32") put(a.bytes, uint32_t(to_uint(arg(2), at)));  // the float's bits
        else if (kind == "f64") put(a.bytes, uint64_t(to_uint(arg(2), at)));
        else if (kind == "bytes") {
          const std::string& hex = arg(2);
          if (hex.size() % 2) fail(at + ": hex bytes of odd length");
          for (unsigned char c : hex)
            if (!std::isxdigit(c)) fail(at + ": '" + hex + "' is not hex bytes");
          for (size_t i = 0; i < hex.size(); i += 2) a.bytes.push_back((unsigned char)std::stoi(hex.substr(i, 2), nullptr, 16));
        } else {
          fail(at + ": argument kind '" + kind + "' is unknown; known: ptr tensormap i32 u32 i64 u64 f32 f64 bytes");
        }
        if (l.tokens.size() > 3) a.text += " (" + l.tokens[3] + ")";
      }
      K.args.push_back(a);
    } else {
      fail(at + ": unknown key '" + key + "'; known: launches launch entry_traced entry_plain cubin_traced cubin_plain "
                "grid block cluster shared_mem_bytes timeout_s trace_capacity_bytes trace_tiles trace_k_blocks "
                "tensormap arg");
    }
  }
  if (declared >= 0 && declared != (long long)L.kernels.size())
    fail(path + ": launches " + std::to_string(declared) + " but the file describes " + std::to_string(L.kernels.size()));
  for (size_t k = 0; k < L.kernels.size(); ++k) {
    const KernelLaunch& K = L.kernels[k];
    const std::string which = "launch " + std::to_string(k);
    for (const auto& a : K.args)
      if (a.kind == "tensormap" && (a.map < 0 || a.map >= int(K.maps.size())))
        fail(path + ": " + which + ": an argument names tensor map " + std::to_string(a.map) + " of " +
             std::to_string(K.maps.size()));
    if (K.entry_traced.empty() || K.entry_plain.empty())
      fail(path + ": " + which + " needs entry_traced and entry_plain");
  }
  if (L.cubin_traced.empty() || L.cubin_plain.empty()) fail(path + ": cubin_traced and cubin_plain are both needed");
  return L;
}

const char* map_dtype_name(int v) {
  switch (v) {
    case 0: return "UINT8";
    case 3: return "INT32";
    case 6: return "FLOAT16";
    case 7: return "FLOAT32";
    case 9: return "BFLOAT16";
    default: return "?";
  }
}

template <class T>
std::string list(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string((unsigned long long)v[i]);
  return s + "]";
}

void print_map(const MapSpec& m, int i) {
  static const int swz[] = {0, 32, 64, 128};
  static const int l2[] = {0, 64, 128, 256};
  std::printf("  tensormap %d over %s (operand %s, %s): data type %s (%d), rank %d, dims %s, strides %s bytes, box %s, "
              "element strides %s, interleave %s, swizzle %dB (%d), L2 promotion %dB (%d), OOB fill %s (%d)\n",
              i, m.buffer.c_str(), m.operand.c_str(), m.dtype.c_str(), map_dtype_name(m.data_type), m.data_type, m.rank,
              list(m.dims).c_str(), list(m.strides).c_str(), list(m.box).c_str(), list(m.estr).c_str(),
              m.interleave ? "?" : "NONE", m.swizzle >= 0 && m.swizzle < 4 ? swz[m.swizzle] : -1, m.swizzle,
              m.l2 >= 0 && m.l2 < 4 ? l2[m.l2] : -1, m.l2, m.oob ? "NAN" : "ZERO", m.oob);
}

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

double activate(const std::string& act, double x) {
  if (act == "relu") return x < 0 ? 0.0 : x;
  if (act == "gelu_erf") return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  if (act == "gelu_tanh") return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
  if (act == "silu") return x / (1.0 + std::exp(-x));
  return x;
}

// The whole problem in double precision: acc = A @ B (block scales per k-group), then scale,
// alpha/beta, bias, activation, cast; row i of a grouped problem is its group g's, with B[g] and
// the column bias bias[g]. The bound is a worst-case model, deliberately looser than
// the oracle's (README.txt): eps * |alpha| * S + 2^-20 (|alpha v| + |beta c| + |bias|), times 1.25
// for the activation's slope, plus 2^-14 (|x| + |y|) for a transcendental activation, plus one
// unit in the last place of the output type at |y|; S = sum_k |a||b| (scaled), eps = K 2^-23 for
// fp32 accumulation (+ 2^-10 P/32 for fp8 partial sums over P), 2 ceil(K/16) 2^-11 for fp16, 0 for int32.
Reference host_reference(const std::string& dir, std::map<std::string, TensorFile>& tensors, const Problem& p) {
  for (const char* name : {"a", "b", "c", "bias", "scale_a", "scale_b"}) {
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
  if (p.grouped && (block || p.scale_a == "row" || p.scale_b == "col"))
    fail("the host reference of a grouped problem takes per-tensor scales only");
  const long long gk = block ? p.sa_k : p.k;
  const long long groups = (p.k + gk - 1) / gk;
  Reference r;
  const long long total = p.total_m * p.n;
  r.expected.assign(size_t(total), 0.0);
  r.bound.assign(size_t(total), 0.0);
  const double alpha = double(float(p.alpha)), beta = double(float(p.beta));
  auto rows = [&](long long r0, long long r1) {
    std::vector<double> acc(size_t(p.n)), sabs(size_t(p.n)), part(size_t(p.n)), pabs(size_t(p.n));
    for (long long i = r0; i < r1; ++i) {
      const long long grp = group_of[size_t(i)];
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(sabs.begin(), sabs.end(), 0.0);
      for (long long g = 0; g < groups; ++g) {
        std::fill(part.begin(), part.end(), 0.0);
        std::fill(pabs.begin(), pabs.end(), 0.0);
        for (long long kk = g * gk; kk < std::min(p.k, (g + 1) * gk); ++kk) {
          const double a = A->at(i, kk);
          for (long long j = 0; j < p.n; ++j) {
            const double b = B->at_in(grp, kk, j);
            part[j] += a * b;
            pabs[j] += std::fabs(a * b);
          }
        }
        for (long long j = 0; j < p.n; ++j) {
          double s = 1.0;
          if (block) s = SA->at(i / p.sa_rows, g) * SB->at(j / p.sb_rows, g);
          acc[j] += part[j] * s;
          sabs[j] += pabs[j] * std::fabs(s);
        }
      }
      for (long long j = 0; j < p.n; ++j) {
        double v = acc[j], s = sabs[j];
        double f = 1.0;
        if (p.scale_a == "tensor") f *= SA->at1(0);
        if (p.scale_a == "row") f *= SA->at1(i);
        if (p.scale_b == "tensor") f *= SB->at1(0);
        if (p.scale_b == "col") f *= SB->at1(j);
        v *= f;
        s *= std::fabs(f);
        const double av = alpha * v, bc = p.beta != 0 ? beta * C->at(i, j) : 0.0;
        const double bi = p.bias == "row" ? bias->at1(i) : p.bias == "col" ? bias->at(grp, j) : 0.0;
        const double x = av + bc + bi;
        const double y = activate(p.activation, x);
        const bool transcendental = p.activation == "gelu_erf" || p.activation == "gelu_tanh" || p.activation == "silu";
        double b = 1.25 * (eps * std::fabs(alpha) * s + std::ldexp(1.0, -20) * (std::fabs(av) + std::fabs(bc) + std::fabs(bi)));
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

// ------------------------------------------------------------------------------ the comparison

struct TileStats {
  long long compared = 0, bad = 0, nan_r = 0, nan_e = 0, inf_r = 0, inf_e = 0, informative = 0, poison = 0;
  double max_ratio = 0, max_abs = 0;
  long long first_bad = -1;  // linear logical index of the tile's first bad element (row-major)
};

// D against the reference, per BM x BN tile, with the oracle's element rule: bit-exact (NaN
// matches NaN) when every bound is zero, else |received - expected| <= bound for finite pairs,
// NaN matching NaN and an infinity matching the same infinity. A grouped problem's tiles are
// counted from each group's first row (every group its own GEMM). Prints the evidence, returns
// the exit code.
int judge(const TensorFile& d, const Reference& ref, const Problem& p) {
  const long long tn = (p.n + p.bn - 1) / p.bn;
  const size_t n_groups = p.group_rows.size();
  std::vector<long long> tile_group, tile_tm, group_tile0(n_groups), group_tiles(n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    group_tile0[g] = (long long)tile_group.size();
    group_tiles[g] = (p.group_rows[g] + p.bm - 1) / p.bm * tn;
    for (long long t = 0; t < group_tiles[g]; ++t) {
      tile_group.push_back((long long)g);
      tile_tm.push_back(t / tn);
    }
  }
  const long long n_tiles = (long long)tile_group.size();
  std::vector<TileStats> tiles(static_cast<size_t>(n_tiles));
  const int es = dt_size(d.dtype);
  const long long ld = d.shape.back();
  for (size_t g = 0; g < n_groups; ++g) {
    const long long row0 = p.group_row0[g];
    for (long long r = 0; r < p.group_rows[g]; ++r) {
      const long long i = row0 + r;
      for (long long j = 0; j < p.n; ++j) {
        const long long li = i * p.n + j;
        const long long si = d.major == "col" ? j * ld + i : i * ld + j;
        const unsigned char* bits = d.data.data() + si * es;
        const double rv = decode(d.dtype, bits);
        const double e = ref.expected[size_t(li)];
        TileStats& t = tiles[size_t(group_tile0[g] + (r / p.bm) * tn + j / p.bn)];
        ++t.compared;
        t.poison += all_ones_bits(bits, es);
        const bool rn = std::isnan(rv), en = std::isnan(e), ri = std::isinf(rv), ei = std::isinf(e);
        t.nan_r += rn;
        t.nan_e += en;
        t.inf_r += ri;
        t.inf_e += ei;
        t.informative += std::fabs(e) > 1e-30;
        const bool finite = std::isfinite(rv) && std::isfinite(e);
        const double err = finite ? std::fabs(rv - e) : 0.0;
        bool ok;
        double ratio;
        if (ref.exact) {
          ok = std::memcmp(bits, ref.exact_bits.data() + li * es, size_t(es)) == 0 || (rn && en);
          ratio = ok ? 0.0 : INFINITY;
        } else {
          const double b = ref.bound[size_t(li)];
          const bool same_inf = ri && ei && std::signbit(rv) == std::signbit(e);
          ok = (rn && en) || same_inf || (finite && err <= b);
          ratio = (rn && en) || same_inf ? 0.0 : !finite ? INFINITY : err == 0 ? 0.0 : err / std::max(b, 1e-300);
        }
        t.max_abs = std::max(t.max_abs, err);
        t.max_ratio = std::max(t.max_ratio, ratio);
        if (!ok) {
          ++t.bad;
          if (t.first_bad < 0) t.first_bad = li;
        }
      }
    }
  }
  long long bad_tiles = 0, bad = 0, poison = 0, nan_r = 0, nan_e = 0, inf_r = 0, inf_e = 0, informative = 0;
  long long worst = 0, first = -1;
  std::vector<long long> group_bad(n_groups), group_bad_tiles(n_groups);
  auto worse = [&](const TileStats& a, const TileStats& b) {  // (failed, ratio, mismatches, max |err|)
    if ((a.bad > 0) != (b.bad > 0)) return a.bad > 0;
    if (a.max_ratio != b.max_ratio) return a.max_ratio > b.max_ratio;
    if (a.bad != b.bad) return a.bad > b.bad;
    return a.max_abs > b.max_abs;
  };
  for (long long t = 0; t < n_tiles; ++t) {
    const TileStats& s = tiles[size_t(t)];
    bad_tiles += s.bad > 0;
    bad += s.bad;
    group_bad[size_t(tile_group[size_t(t)])] += s.bad;
    group_bad_tiles[size_t(tile_group[size_t(t)])] += s.bad > 0;
    poison += s.poison;
    nan_r += s.nan_r;
    nan_e += s.nan_e;
    inf_r += s.inf_r;
    inf_e += s.inf_e;
    informative += s.informative;
    if (worse(s, tiles[size_t(worst)])) worst = t;
    if (s.bad > 0 && first < 0) first = t;
  }
  // "(tm, tn)", and " of group g" for a grouped problem
  auto tile_name = [&](long long t) {
    const long long g = tile_group[size_t(t)];
    std::string s = "(" + std::to_string(tile_tm[size_t(t)]) + ", " + std::to_string((t - group_tile0[size_t(g)]) % tn) +
                    ")";
    if (p.grouped) s += " of group " + std::to_string(g);
    return s;
  };
  const TileStats& w = tiles[size_t(worst)];
  std::printf("reference: %s\n", ref.source.c_str());
  if (p.grouped) {
    std::string sizes;
    for (size_t g = 0; g < n_groups; ++g) sizes += (g ? ", " : "") + std::to_string(p.group_rows[g]);
    std::printf("output D: %lld x %lld %s (%s-major) in %zu groups of %s rows, %lld tiles of %d x %d counted from each "
                "group's first row\n",
                p.total_m, p.n, dt_name(d.dtype), d.major.c_str(), n_groups, sizes.c_str(), n_tiles, p.bm, p.bn);
  } else {
    std::printf("output D: %lld x %lld %s (%s-major), %lld x %lld tiles of %d x %d\n", p.total_m, p.n, dt_name(d.dtype),
                d.major.c_str(), n_tiles / tn, tn, p.bm, p.bn);
  }
  char ratio[64];
  if (ref.exact && w.bad == 0) std::snprintf(ratio, sizeof ratio, "exact");
  else std::snprintf(ratio, sizeof ratio, "%.3g", w.max_ratio);
  std::printf("  worst tile %s: err/bound %s, max |err| %.6g, bad %lld/%lld, NaN r/e %lld/%lld, "
              "Inf r/e %lld/%lld, never written %lld\n",
              tile_name(worst).c_str(), ratio, w.max_abs, w.bad, w.compared, w.nan_r, w.nan_e, w.inf_r, w.inf_e,
              w.poison);
  std::printf("  all tiles: bad elements %lld in %lld of %lld tiles; NaN r/e %lld/%lld; Inf r/e %lld/%lld; "
              "never written (still the 0xFF poison) %lld\n",
              bad, bad_tiles, n_tiles, nan_r, nan_e, inf_r, inf_e, poison);
  if (p.grouped)
    for (size_t g = 0; g < n_groups; ++g) {
      if (p.group_rows[g] == 0) {
        std::printf("  group %zu (empty): nothing to compare\n", g);
        continue;
      }
      std::printf("  group %zu (rows %lld..%lld): bad elements %lld in %lld of %lld tiles\n", g, p.group_row0[g],
                  p.group_row0[g] + p.group_rows[g] - 1, group_bad[g], group_bad_tiles[g], group_tiles[g]);
    }
  if (first >= 0) {
    const long long li = tiles[size_t(first)].first_bad, i = li / p.n, j = li % p.n;
    const long long r = i - p.group_row0[size_t(tile_group[size_t(first)])];
    const long long si = d.major == "col" ? j * ld + i : i * ld + j;
    const unsigned char* bits = d.data.data() + si * es;
    const double b = ref.exact ? 0.0 : ref.bound[size_t(li)];
    const std::string in_group = p.grouped ? "; row " + std::to_string(r) + " of the group" : "";
    std::printf("  first bad element: (%lld, %lld) in tile %s [(%lld, %lld) in the tile%s]: received %.6g%s, "
                "expected %.6g, bound %.3g\n",
                i, j, tile_name(first).c_str(), r % p.bm, j % p.bn, in_group.c_str(), decode(d.dtype, bits),
                all_ones_bits(bits, es) ? " (never written: still the 0xFF poison)" : "", ref.expected[size_t(li)], b);
  }
  if (bad > 0) {
    std::printf("verdict: DIVERGED\n");
    return kDiverged;
  }
  if (informative == 0) {
    std::printf("verdict: MISTRUSTED (every reference value is zero: nothing could discriminate)\n");
    return kMistrusted;
  }
  std::printf("verdict: MATCH\n");
  return kMatch;
}

// ------------------------------------------------------------------------------ the run

struct Options {
  std::string dir, cubin, d_file, expected_file, bound_file;
  bool check_only = false, host_reference = false, dry_run = false;
  double timeout_s = -1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: repro [--dir DIR] [--cubin FILE] [--timeout S] [--host-reference]\n"
               "             [--check-only [EXPECTED D]] [--d FILE] [--expected FILE] [--bound FILE] [--dry-run]\n",
               why.c_str());
  std::exit(kBadInput);
}

std::string exe_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string s(buf);
  const auto slash = s.rfind('/');
  return slash == std::string::npos ? "." : s.substr(0, slash);
}

Options parse_options(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--dir") o.dir = value();
    else if (a == "--cubin") o.cubin = value();
    else if (a == "--d") o.d_file = value();
    else if (a == "--expected") o.expected_file = value();
    else if (a == "--bound") o.bound_file = value();
    else if (a == "--timeout") o.timeout_s = to_double(value(), "--timeout");
    else if (a == "--check-only") o.check_only = true;
    else if (a == "--host-reference") o.host_reference = true;
    else if (a == "--dry-run") o.dry_run = true;
    else if (a == "-h" || a == "--help") {
      std::printf("repro: run the recorded kernel launch and judge its output D (README.txt).\n");
      std::exit(0);
    } else if (!a.empty() && a[0] == '-') usage("unknown option " + a);
    else positional.push_back(a);
  }
  if (!positional.empty()) {
    if (!o.check_only || positional.size() != 2) usage("positional arguments are EXPECTED D, with --check-only");
    o.expected_file = positional[0];
    o.d_file = positional[1];
  }
  if (o.dir.empty()) o.dir = exe_dir();
  return o;
}

// A kernel error (or a launch that did not finish): the sink so far, result.txt, exit 3. `launch`
// (with its entry) names which of the launches failed, -1 for none in particular.
[[noreturn]] void kernel_error(const std::string& what_happened, const std::string& name, const std::string& dir,
                               const oracle_trace::SinkHeader* sink, int launch = -1, const std::string& entry = "") {
  const std::string what =
      launch < 0 ? what_happened : "launch " + std::to_string(launch) + " (" + entry + "): " + what_happened;
  if (sink != nullptr) {  // host-mapped: the taps committed before the fault are still here
    const unsigned long long area = sink->capacity - sink->header_bytes;
    const unsigned long long used = std::min<unsigned long long>(sink->cursor, area);
    write_file(join_path(dir, "sink.bin"), sink, size_t(sink->header_bytes + used));
    std::printf("trace: wrote sink.bin (%llu bytes of records written before the error)\n", used);
  }
  std::ofstream res(join_path(dir, "result.txt"), std::ios::trunc);
  res << "status kernel_error\nerror " << name << "\nmessage " << what << "\n";
  if (launch >= 0) res << "launch " << launch << "\nentry " << entry << "\n";
  res.close();
  std::printf("verdict: KERNEL_ERROR: %s (%s)\n", name.c_str(), what.c_str());
  std::fflush(stdout);
  std::_Exit(kKernelError);  // after a sticky error the runtime's teardown is not worth waiting for
}

void check_cuda(cudaError_t e, const std::string& what, int code_on_error, const std::string& dir) {
  if (e == cudaSuccess) return;
  const std::string msg = what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (code_on_error == kKernelError) kernel_error(what + ": " + cudaGetErrorString(e), cudaGetErrorName(e), dir, nullptr);
  fail(msg);
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
using GetErrorName = CUresult (*)(CUresult, const char**);

void* driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || fn == nullptr || q != cudaDriverEntryPointSuccess)
    fail(std::string("the driver has no ") + name + " (" + cudaGetErrorName(e) + ")");
  return fn;
}

void init_sink(oracle_trace::SinkHeader* h, unsigned long long capacity, const Launch& L) {
  using namespace oracle_trace;
  if (capacity < sizeof(SinkHeader) + kRecordAlign || capacity % kRecordAlign)
    fail("launch.txt: trace_capacity_bytes " + std::to_string(capacity) + " must be a multiple of " +
         std::to_string(kRecordAlign) + " above the " + std::to_string(sizeof(SinkHeader)) + "-byte header");
  std::memset(static_cast<void*>(h), 0, size_t(capacity));  // the record area must be zero
  h->magic = kMagic;
  h->version = static_cast<uint16_t>(kVersion);
  h->header_bytes = static_cast<uint16_t>(kHeaderBytes);
  h->capacity = capacity;
  h->flags = L.all_k_blocks ? kFlagAllKBlocks : 0u;
  for (Stage s : {Stage::DescriptorA, Stage::DescriptorB, Stage::LoadA, Stage::LoadB, Stage::Mma, Stage::Reduce,
                  Stage::EpilogueScale, Stage::EpilogueAlphaBeta, Stage::EpilogueBias, Stage::EpilogueActivation,
                  Stage::EpilogueCast})
    h->stage_mask |= 1u << static_cast<uint32_t>(s);
  if (L.tiles.size() > kMaxTiles) fail("launch.txt selects " + std::to_string(L.tiles.size()) + " trace tiles; at most " + std::to_string(kMaxTiles));
  if (L.tiles.empty()) {
    h->n_tiles = 1;
    h->tiles[0] = TileSelector{kNone, kNone};
  } else {
    h->n_tiles = static_cast<uint32_t>(L.tiles.size());
    for (size_t i = 0; i < L.tiles.size(); ++i) h->tiles[i] = TileSelector{L.tiles[i].first, L.tiles[i].second};
  }
  if (!L.all_k_blocks && !L.k_blocks.empty()) {
    const int base = *std::min_element(L.k_blocks.begin(), L.k_blocks.end());
    h->kb_base = base;
    for (int kb : L.k_blocks) {
      const int d = kb - base;
      if (d >= int(kKBlockWindow)) fail("launch.txt: trace k-blocks span more than " + std::to_string(kKBlockWindow));
      h->kb_bits[d >> 5] |= 1u << (d & 31);
    }
  }
}

int run(const Options& o) {
  const bool traced = ORACLE_REPRO_TRACED != 0;
  const Problem p = read_problem(o.dir);
  Launch L = read_launch(o.dir);
  auto tensors = read_inputs_manifest(o.dir);
  const size_t n_launches = L.kernels.size();
  auto entry_of = [&](size_t k) -> const std::string& {
    return traced ? L.kernels[k].entry_traced : L.kernels[k].entry_plain;
  };
  std::string entries;
  for (size_t k = 0; k < n_launches; ++k) entries += (k ? "," : "") + entry_of(k);
  const std::string cubin = o.cubin.empty() ? join_path(o.dir, traced ? L.cubin_traced : L.cubin_plain) : o.cubin;
  const double timeout = o.timeout_s >= 0 ? o.timeout_s : L.timeout_s;
  if (n_launches == 1)
    std::printf("repro: %s, %s build, entry %s\n", p.describe.c_str(), traced ? "traced" : "plain", entry_of(0).c_str());
  else
    std::printf("repro: %s, %s build, %zu launches in order: %s\n", p.describe.c_str(), traced ? "traced" : "plain",
                n_launches, entries.c_str());
  std::printf("  cubin %s\n", cubin.c_str());
  for (size_t k = 0; k < n_launches; ++k) {
    const KernelLaunch& K = L.kernels[k];
    const std::string which = n_launches == 1 ? "" : " " + std::to_string(k) + " (" + entry_of(k) + ")";
    std::printf("  launch%s: grid (%u, %u, %u), block (%u, %u, %u), cluster (%u, %u, %u), dynamic shared memory %zu "
                "bytes\n",
                which.c_str(), K.grid[0], K.grid[1], K.grid[2], K.block[0], K.block[1], K.block[2], K.cluster[0],
                K.cluster[1], K.cluster[2], K.smem);
    for (size_t i = 0; i < K.maps.size(); ++i) print_map(K.maps[i], int(i));
  }

  for (auto& kv : tensors)
    if (kv.second.role == "in" || kv.second.role == "inout") load_file(kv.second, join_path(o.dir, kv.second.file));
  auto dit = tensors.find("d");
  if (dit == tensors.end() || dit->second.role != "out") fail("inputs.txt must list the output d (role=out)");
  if (o.dry_run) {
    for (size_t k = 0; k < n_launches; ++k) {
      if (n_launches > 1) std::printf("launch %zu entry %s\n", k, entry_of(k).c_str());
      const KernelLaunch& K = L.kernels[k];
      for (size_t i = 0; i < K.args.size(); ++i) {
        const ArgSpec& a = K.args[i];
        std::string hex;
        char byte[3];
        for (unsigned char c : a.bytes) {
          std::snprintf(byte, sizeof byte, "%02x", c);
          hex += byte;
        }
        if (a.kind == "ptr") std::printf("arg %zu ptr %s\n", i, a.name.c_str());
        else if (a.kind == "tensormap") std::printf("arg %zu tensormap %d\n", i, a.map);
        else std::printf("arg %zu bytes %s\n", i, hex.c_str());
      }
    }
    if (traced) {
      std::vector<unsigned long long> buf(size_t(L.capacity / 8));  // 8-byte aligned, like pinned memory
      auto* h = reinterpret_cast<oracle_trace::SinkHeader*>(buf.data());
      init_sink(h, L.capacity, L);
      write_file(join_path(o.dir, "sink_init.bin"), h, sizeof(oracle_trace::SinkHeader));
      std::printf("dry run: wrote sink_init.bin (the initial sink header)\n");
    }
    std::printf("dry run: every file read, nothing launched\n");
    std::exit(kMatch);
  }
  if (!file_exists(cubin)) fail("cubin " + cubin + " does not exist: run make" + std::string(traced ? " TRACE=1" : "") + " first");

  check_cuda(cudaSetDevice(0), "cudaSetDevice(0)", kBadInput, o.dir);
  check_cuda(cudaFree(nullptr), "CUDA initialisation", kBadInput, o.dir);
  cudaLibrary_t lib;
  check_cuda(cudaLibraryLoadFromFile(&lib, cubin.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0),
             "loading " + cubin, kBadInput, o.dir);
  std::vector<const void*> fns(n_launches);
  for (size_t k = 0; k < n_launches; ++k) {
    const KernelLaunch& K = L.kernels[k];
    const std::string which = "launch " + std::to_string(k) + ": ";
    cudaKernel_t kernel;
    check_cuda(cudaLibraryGetKernel(&kernel, lib, entry_of(k).c_str()),
               which + "entry point " + entry_of(k) + " in " + cubin, kBadInput, o.dir);
    fns[k] = reinterpret_cast<const void*>(kernel);
    if (K.smem > 48 * 1024)
      check_cuda(cudaFuncSetAttribute(fns[k], cudaFuncAttributeMaxDynamicSharedMemorySize, int(K.smem)),
                 which + "raising the dynamic shared memory limit of " + entry_of(k) + " to " + std::to_string(K.smem),
                 kBadInput, o.dir);
    if (K.cluster[0] * K.cluster[1] * K.cluster[2] > 8)
      check_cuda(cudaFuncSetAttribute(fns[k], cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                 which + "allowing a non-portable cluster size for " + entry_of(k), kBadInput, o.dir);
  }

  // every buffer once, before the first launch: inputs and workspaces (inout) with their bytes,
  // outputs poisoned; the launches share them
  std::map<std::string, void*> dev;
  for (auto& kv : tensors) {
    TensorFile& t = kv.second;
    if (t.role != "in" && t.role != "out" && t.role != "inout") continue;
    void* ptr = nullptr;
    check_cuda(cudaMalloc(&ptr, size_t(t.bytes)), "cudaMalloc of " + t.name, kBadInput, o.dir);
    dev[t.name] = ptr;
    if (t.role == "out")
      check_cuda(cudaMemset(ptr, 0xFF, size_t(t.bytes)), "poisoning " + t.name, kBadInput, o.dir);
    else
      check_cuda(cudaMemcpy(ptr, t.data.data(), size_t(t.bytes), cudaMemcpyHostToDevice), "upload of " + t.name,
                 kBadInput, o.dir);
  }

  oracle_trace::SinkHeader* sink = nullptr;
  void* sink_symbol = nullptr;
  size_t symbol_bytes = 0;
  const bool has_symbol = cudaLibraryGetGlobal(&sink_symbol, &symbol_bytes, lib, "oracle_trace_sink") == cudaSuccess;
  (void)cudaGetLastError();
  if (traced) {  // one sink for every launch: the symbol is the module's, set once
    if (!has_symbol || symbol_bytes != 8)
      fail("cubin " + cubin + " has no 8-byte oracle_trace_sink symbol: it was not built with -DORACLE_TRACE");
    void* host = nullptr;
    check_cuda(cudaHostAlloc(&host, size_t(L.capacity), cudaHostAllocMapped | cudaHostAllocPortable),
               "allocating the host-mapped sink", kBadInput, o.dir);
    sink = static_cast<oracle_trace::SinkHeader*>(host);
    init_sink(sink, L.capacity, L);
    void* sink_dev = nullptr;
    check_cuda(cudaHostGetDevicePointer(&sink_dev, host, 0), "mapping the sink", kBadInput, o.dir);
    check_cuda(cudaMemcpy(sink_symbol, &sink_dev, 8, cudaMemcpyHostToDevice), "setting oracle_trace_sink", kBadInput, o.dir);
    std::printf("  trace: host-mapped sink of %llu bytes, %zu tile selector(s), k-blocks %s%s\n", L.capacity,
                L.tiles.empty() ? size_t(1) : L.tiles.size(), L.all_k_blocks ? "all" : "selected",
                n_launches > 1 ? ", set for every launch" : "");
  } else if (has_symbol) {
    void* null_sink = nullptr;  // every tap off
    check_cuda(cudaMemcpy(sink_symbol, &null_sink, 8, cudaMemcpyHostToDevice), "clearing oracle_trace_sink", kBadInput, o.dir);
  }

  auto encode = reinterpret_cast<EncodeTiled>(driver_entry("cuTensorMapEncodeTiled"));
  auto error_name = reinterpret_cast<GetErrorName>(driver_entry("cuGetErrorName"));
  std::vector<std::vector<CUtensorMap>> maps(n_launches);
  std::vector<std::vector<std::vector<unsigned char>>> storage(n_launches);
  std::vector<std::vector<void*>> params(n_launches);
  for (size_t k = 0; k < n_launches; ++k) {
    const KernelLaunch& K = L.kernels[k];
    const std::string which = "launch " + std::to_string(k) + ": ";
    maps[k].resize(K.maps.size());
    for (size_t i = 0; i < K.maps.size(); ++i) {
      const MapSpec& m = K.maps[i];
      auto it = dev.find(m.buffer);
      if (it == dev.end())
        fail(which + "tensor map " + std::to_string(i) + " is over " + m.buffer + ", which inputs.txt does not list");
      const CUresult r = encode(&maps[k][i], CUtensorMapDataType(m.data_type), cuuint32_t(m.rank), it->second,
                                m.dims.data(), m.strides.data(), m.box.data(), m.estr.data(),
                                CUtensorMapInterleave(m.interleave), CUtensorMapSwizzle(m.swizzle),
                                CUtensorMapL2promotion(m.l2), CUtensorMapFloatOOBfill(m.oob));
      if (r != CUDA_SUCCESS) {
        const char* name = "?";
        error_name(r, &name);
        fail(which + "cuTensorMapEncodeTiled refused tensor map " + std::to_string(i) + " over " + m.buffer + ": " + name);
      }
    }
    storage[k].resize(K.args.size());
    params[k].resize(K.args.size());
    for (size_t i = 0; i < K.args.size(); ++i) {
      const ArgSpec& a = K.args[i];
      if (a.kind == "ptr") {
        auto it = dev.find(a.name);
        if (it == dev.end())
          fail(which + "argument " + std::to_string(i) + " points at " + a.name + ", which inputs.txt does not list");
        put(storage[k][i], reinterpret_cast<uint64_t>(it->second));
        params[k][i] = storage[k][i].data();
      } else if (a.kind == "tensormap") {
        params[k][i] = &maps[k][size_t(a.map)];  // CUtensorMap is 64-byte aligned
      } else {
        storage[k][i] = a.bytes;
        params[k][i] = storage[k][i].data();
      }
    }
  }

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", kBadInput, o.dir);
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t k = 0; k < n_launches; ++k) {  // in order, each to completion before the next
    const KernelLaunch& K = L.kernels[k];
    const int at = int(k);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(K.grid[0], K.grid[1], K.grid[2]);
    cfg.blockDim = dim3(K.block[0], K.block[1], K.block[2]);
    cfg.dynamicSmemBytes = K.smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    if (K.cluster[0] * K.cluster[1] * K.cluster[2] > 1) {
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = K.cluster[0];
      attr[0].val.clusterDim.y = K.cluster[1];
      attr[0].val.clusterDim.z = K.cluster[2];
      cfg.attrs = attr;
      cfg.numAttrs = 1;
    }
    cudaError_t e = cudaLaunchKernelExC(&cfg, fns[k], params[k].data());
    if (e != cudaSuccess)
      kernel_error(std::string("launch: ") + cudaGetErrorString(e), cudaGetErrorName(e), o.dir, sink, at, entry_of(k));
    for (;;) {
      e = cudaStreamQuery(stream);
      if (e != cudaErrorNotReady) break;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timeout > 0 && s > timeout)
        kernel_error("the kernel did not finish within " + std::to_string(timeout) + " s (--timeout S)", "timeout",
                     o.dir, sink, at, entry_of(k));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (e != cudaSuccess) kernel_error(cudaGetErrorString(e), cudaGetErrorName(e), o.dir, sink, at, entry_of(k));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (n_launches == 1) std::printf("kernel: finished (%.3f ms wall, launch to completion)\n", ms);
  else std::printf("kernels: all %zu finished (%.3f ms wall, first launch to last completion)\n", n_launches, ms);

  TensorFile& d = dit->second;
  d.data.resize(size_t(d.bytes));
  cudaError_t e = cudaMemcpy(d.data.data(), dev["d"], size_t(d.bytes), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) kernel_error(std::string("download of d: ") + cudaGetErrorString(e), cudaGetErrorName(e), o.dir, sink);
  write_file(join_path(o.dir, d.file), d.data.data(), d.data.size());
  if (sink != nullptr) {
    const unsigned long long area = sink->capacity - sink->header_bytes;
    const unsigned long long used = std::min<unsigned long long>(sink->cursor, area);
    write_file(join_path(o.dir, "sink.bin"), sink, size_t(sink->header_bytes + used));
    std::printf("trace: wrote sink.bin (%llu bytes of records, %u dropped); judge it with: python -m oracle compare "
                "--repro-dir %s\n",
                used, sink->dropped, o.dir.c_str());
  }
  {
    std::ofstream res(join_path(o.dir, "result.txt"), std::ios::trunc);
    res << "status ok\nentry " << entry_of(0) << "\nentries " << entries << "\nlaunches " << n_launches
        << "\ntraced " << (traced ? 1 : 0) << "\nwall_ms " << ms << "\n";
  }
  return -1;  // the caller judges D
}

Reference load_reference(const Options& o, std::map<std::string, TensorFile>& tensors, const Problem& p) {
  auto ex = tensors.find("expected");
  auto bd = tensors.find("bound");
  if (!o.host_reference && ex != tensors.end() && bd != tensors.end()) {
    const std::string ep = o.expected_file.empty() ? join_path(o.dir, ex->second.file) : o.expected_file;
    const std::string bp = o.bound_file.empty() ? join_path(o.dir, bd->second.file) : o.bound_file;
    if (file_exists(ep) || !o.expected_file.empty()) {
      if (!file_exists(bp)) fail(ep + " is there but its bounds " + bp + " are not (the oracle writes both)");
      return reference_from_files(ep, bp, ex->second, bd->second, p);
    }
  } else if (!o.host_reference && !o.expected_file.empty()) {
    fail("--expected needs inputs.txt entries for expected and bound (their dtype and shape)");
  }
  return host_reference(o.dir, tensors, p);
}

}  // namespace repro

int main(int argc, char** argv) {
  using namespace repro;
  const Options o = parse_options(argc, argv);
  if (!o.check_only) run(o);
  const Problem p = read_problem(o.dir);
  auto tensors = read_inputs_manifest(o.dir);
  auto dit = tensors.find("d");
  if (dit == tensors.end()) fail("inputs.txt must list the output d");
  TensorFile d = dit->second;
  if (o.check_only) std::printf("repro: %s, check only (no kernel run)\n", p.describe.c_str());
  load_file(d, o.d_file.empty() ? join_path(o.dir, d.file) : o.d_file);
  const Reference ref = load_reference(o, tensors, p);
  const int code = judge(d, ref, p);
  std::fflush(stdout);
  return code;
}

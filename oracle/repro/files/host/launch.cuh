// host/launch.cuh -- launch.txt: every kernel launch in order, its tensor maps and argument bytes.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "inputs.cuh"

namespace repro {

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

// One operand of a launch library's LaunchArgs ("call_tensor"): its slot, buffer and layout.
struct CallTensor {
  unsigned slot = 0;
  std::string buffer;
  unsigned dtype = 0, rank = 0;
  std::vector<long long> shape, strides;
};

struct CallWorkspace {
  unsigned index = 0;
  std::string name, buffer;
};

// A launch library's oracle_launch call ("call", "call_tensor", "call_workspace"): every field of
// oracle_trace::LaunchArgs but the addresses, the sink and the stream.
struct LibraryCall {
  bool given = false;
  long long m = 0, n = 0, k = 0, batch = 1, groups = 0;
  std::string group_offsets;  // a buffer, or empty
  uint32_t alpha_bits = 0, beta_bits = 0;
  long long splits = 1, stream_k_workers = 0;
  unsigned activation = 0, bias_kind = 0, scale_a_kind = 0, scale_b_kind = 0;
  std::vector<long long> scale_a_block, scale_b_block, tile;
  std::vector<CallTensor> tensors;
  std::vector<CallWorkspace> workspaces;
};

// Every launch in order ("launch I" starts launch I; keys before the first one belong to launch 0),
// the cubins and the trace selection, which hold for all of them. A launch library instead names
// its two builds, its ABI and its one call.
struct Launch {
  std::string cubin_traced, cubin_plain;
  std::string library_traced, library_plain, abi;
  LibraryCall call;
  bool library() const { return !library_traced.empty() || !library_plain.empty(); }
  std::vector<KernelLaunch> kernels;
  std::vector<std::pair<int, int>> tiles;  // trace selection; empty: all
  bool all_k_blocks = true;
  std::vector<int> k_blocks;
  unsigned long long capacity = 0;
  double timeout_s = 60;
  std::vector<unsigned> stages;  // trace_stages: the stage codes the sink selects; empty: GEMM's stages
  std::vector<int> groups;       // trace_groups: the groups (batch entries) the sink selects; empty: all
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
    auto arg = [&](size_t i) -> const std::string& { return key_value(l, i, at); };
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
                           key == "timeout_s" || key == "trace_capacity_bytes" || key == "library_traced" ||
                           key == "library_plain" || key == "abi";
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
    else if (key == "library_traced") { once(L.library_traced); L.library_traced = file_name(arg(1), at, "library"); }
    else if (key == "library_plain") { once(L.library_plain); L.library_plain = file_name(arg(1), at, "library"); }
    else if (key == "abi") { once(L.abi); L.abi = arg(1); }
    else if (key == "call") {
      if (L.call.given) fail(at + ": call is given twice");
      const auto kv = pairs(l, 1, at);
      LibraryCall& c = L.call;
      c.given = true;
      c.m = to_int(need(kv, "m", at), at);
      c.n = to_int(need(kv, "n", at), at);
      c.k = to_int(need(kv, "k", at), at);
      c.batch = to_int(need(kv, "batch", at), at);
      c.groups = to_int(need(kv, "groups", at), at);
      const std::string offsets = need(kv, "group_offsets", at);
      if (offsets != "-") c.group_offsets = identifier(offsets, at, "buffer");
      c.alpha_bits = uint32_t(to_uint(need(kv, "alpha", at), at));
      c.beta_bits = uint32_t(to_uint(need(kv, "beta", at), at));
      c.splits = to_int(need(kv, "splits", at), at);
      c.stream_k_workers = to_int(need(kv, "stream_k_workers", at), at);
      c.activation = unsigned(to_uint(need(kv, "activation", at), at));
      c.bias_kind = unsigned(to_uint(need(kv, "bias_kind", at), at));
      c.scale_a_kind = unsigned(to_uint(need(kv, "scale_a_kind", at), at));
      c.scale_b_kind = unsigned(to_uint(need(kv, "scale_b_kind", at), at));
      c.scale_a_block = int_list<long long>(need(kv, "scale_a_block", at), at);
      c.scale_b_block = int_list<long long>(need(kv, "scale_b_block", at), at);
      c.tile = int_list<long long>(need(kv, "tile", at), at);
      if (c.scale_a_block.size() != 2 || c.scale_b_block.size() != 2 || c.tile.size() != 3)
        fail(at + ": scale_a_block and scale_b_block take 2 values, tile 3");
    } else if (key == "call_tensor") {
      const auto kv = pairs(l, 1, at);
      CallTensor t;
      t.slot = unsigned(to_uint(need(kv, "slot", at), at));
      t.buffer = identifier(need(kv, "buffer", at), at, "buffer");
      t.dtype = unsigned(to_uint(need(kv, "dtype", at), at));
      t.rank = unsigned(to_uint(need(kv, "rank", at), at));
      t.shape = int_list<long long>(need(kv, "shape", at), at);
      t.strides = int_list<long long>(need(kv, "strides", at), at);
      if (t.slot >= oracle_trace::kTensorSlots || t.rank < 1 || t.rank > oracle_trace::kMaxRank ||
          t.shape.size() != t.rank || t.strides.size() != t.rank)
        fail(at + ": a tensor needs a slot below " + std::to_string(oracle_trace::kTensorSlots) + " and shape and "
             "strides of its rank, 1 to " + std::to_string(oracle_trace::kMaxRank));
      for (const CallTensor& u : L.call.tensors)
        if (u.slot == t.slot) fail(at + ": slot " + std::to_string(t.slot) + " is given twice");
      L.call.tensors.push_back(t);
    } else if (key == "call_workspace") {
      const auto kv = pairs(l, 1, at);
      CallWorkspace w;
      w.index = unsigned(to_uint(need(kv, "index", at), at));
      w.name = identifier(need(kv, "name", at), at, "workspace name");
      w.buffer = identifier(need(kv, "buffer", at), at, "buffer");
      if (w.index != L.call.workspaces.size() || w.index >= oracle_trace::kWorkspaceSlots ||
          w.name.size() >= oracle_trace::kWorkspaceNameBytes)
        fail(at + ": workspaces are numbered 0, 1, ... below " + std::to_string(oracle_trace::kWorkspaceSlots) +
             ", their names shorter than " + std::to_string(oracle_trace::kWorkspaceNameBytes) + " characters");
      L.call.workspaces.push_back(w);
    }
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
    } else if (key == "trace_groups") {
      if (!L.groups.empty()) fail(at + ": trace_groups is given twice");
      for (size_t i = 1; i < l.tokens.size(); ++i) L.groups.push_back(int(to_int(l.tokens[i], at)));
      if (L.groups.empty()) fail(at + ": trace_groups needs at least one group");
    } else if (key == "trace_stages") {
      if (!L.stages.empty()) fail(at + ": trace_stages is given twice");
      for (size_t i = 1; i < l.tokens.size(); ++i) {
        const unsigned long long code = to_uint(l.tokens[i], at);
        if (code < 1 || code > 31) fail(at + ": trace stage code " + l.tokens[i] + " must be 1..31 (oracle_trace::Stage)");
        L.stages.push_back(unsigned(code));
      }
      if (L.stages.empty()) fail(at + ": trace_stages needs at least one stage code");
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
                "trace_groups trace_stages tensormap arg library_traced library_plain abi call call_tensor call_workspace");
    }
  }
  if (L.library()) {  // one oracle_launch call instead of kernel launches
    if (L.library_traced.empty() || L.library_plain.empty()) fail(path + ": library_traced and library_plain are both needed");
    if (L.abi != "oracle/1") fail(path + ": abi '" + L.abi + "' is not one this program speaks (oracle/1)");
    if (!L.call.given) fail(path + ": a launch library needs its call line");
    if (sections || !L.cubin_traced.empty() || !L.cubin_plain.empty() || !L.kernels[0].args.empty())
      fail(path + ": a launch library's launch.txt has no launch sections, cubins or arguments");
    L.kernels[0].entry_traced = L.kernels[0].entry_plain = "oracle_launch";
    return L;
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

}  // namespace repro

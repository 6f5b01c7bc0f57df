// host/library.cuh -- a launch library: loaded with dlopen, its ABI checked, its LaunchArgs filled.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "launch.cuh"

namespace repro {

using LaunchFn = int (*)(const oracle_trace::LaunchArgs*);
using AbiFn = uint64_t (*)(void);

std::string describe_abi(uint64_t word) {
  return "ABI version " + std::to_string(word >> 32) + ", LaunchArgs of " + std::to_string(word & 0xFFFFFFFFull) +
         " bytes";
}

// The library's oracle_launch, after its oracle_launch_abi() matched this program's launch.hpp.
LaunchFn load_library(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) fail("loading the launch library " + path + ": " + dlerror());
  auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "oracle_launch_abi"));
  auto entry = reinterpret_cast<LaunchFn>(dlsym(handle, "oracle_launch"));
  if (abi == nullptr || entry == nullptr)
    fail(path + " exports no oracle_launch_abi() or oracle_launch(): build it with oracle_trace/launch.hpp");
  const uint64_t want = (uint64_t(oracle_trace::kLaunchAbiVersion) << 32) | uint64_t(sizeof(oracle_trace::LaunchArgs));
  if (abi() != want)
    fail(path + " was built against " + describe_abi(abi()) + "; this program speaks " + describe_abi(want));
  return entry;
}

float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// LaunchArgs over the buffers (`dev`: name -> device address; `tensors`: their sizes).
oracle_trace::LaunchArgs fill_args(const LibraryCall& c, const std::map<std::string, void*>& dev,
                                   const std::map<std::string, TensorFile>& tensors, void* sink, cudaStream_t stream,
                                   char* message, uint32_t message_bytes) {
  auto address = [&](const std::string& buffer) -> void* {
    auto it = dev.find(buffer);
    if (it == dev.end()) fail("launch.txt: the call names buffer " + buffer + ", which inputs.txt does not list");
    return it->second;
  };
  oracle_trace::LaunchArgs a;
  std::memset(static_cast<void*>(&a), 0, sizeof a);
  a.abi_version = oracle_trace::kLaunchAbiVersion;
  a.struct_bytes = uint32_t(sizeof a);
  a.m = c.m;
  a.n = c.n;
  a.k = c.k;
  a.batch = c.batch;
  a.groups = c.groups;
  a.group_offsets = c.group_offsets.empty() ? nullptr : static_cast<const int32_t*>(address(c.group_offsets));
  a.alpha = bits_to_float(c.alpha_bits);
  a.beta = bits_to_float(c.beta_bits);
  a.splits = int32_t(c.splits);
  a.stream_k_workers = int32_t(c.stream_k_workers);
  a.activation = c.activation;
  a.bias_kind = c.bias_kind;
  a.scale_a_kind = c.scale_a_kind;
  a.scale_b_kind = c.scale_b_kind;
  for (int i = 0; i < 2; ++i) {
    a.scale_a_block[i] = int32_t(c.scale_a_block[i]);
    a.scale_b_block[i] = int32_t(c.scale_b_block[i]);
  }
  a.tile_m = int32_t(c.tile[0]);
  a.tile_n = int32_t(c.tile[1]);
  a.tile_k = int32_t(c.tile[2]);
  for (const CallTensor& t : c.tensors) {
    oracle_trace::TensorRef& r = a.tensors[t.slot];
    r.data = address(t.buffer);
    r.dtype = t.dtype;
    r.rank = t.rank;
    for (unsigned d = 0; d < oracle_trace::kMaxRank; ++d) {
      r.shape[d] = d < t.rank ? t.shape[d] : 1;
      r.stride[d] = d < t.rank ? t.strides[d] : 0;
    }
  }
  a.n_workspaces = uint32_t(c.workspaces.size());
  for (const CallWorkspace& w : c.workspaces) {
    oracle_trace::WorkspaceRef& r = a.workspaces[w.index];
    r.data = address(w.buffer);
    r.bytes = uint64_t(tensors.at(w.buffer).bytes);
    std::snprintf(r.name, sizeof r.name, "%s", w.name.c_str());
  }
  a.trace_sink = sink;
  a.stream = stream;
  a.message = message;
  a.message_bytes = message_bytes;
  return a;
}

void print_call(const LibraryCall& c) {
  std::printf("  oracle_launch: m %lld, n %lld, k %lld, batch %lld, groups %lld, alpha %g, beta %g, splits %lld, "
              "stream-K workers %lld, activation %u, bias kind %u, scale kinds %u %u, tile %lld x %lld x %lld\n",
              c.m, c.n, c.k, c.batch, c.groups, double(bits_to_float(c.alpha_bits)), double(bits_to_float(c.beta_bits)),
              c.splits, c.stream_k_workers, c.activation, c.bias_kind, c.scale_a_kind, c.scale_b_kind, c.tile[0],
              c.tile[1], c.tile[2]);
  for (const CallTensor& t : c.tensors) {
    std::string shape, strides;
    for (unsigned d = 0; d < t.rank; ++d) {
      shape += (d ? "," : "") + std::to_string(t.shape[d]);
      strides += (d ? "," : "") + std::to_string(t.strides[d]);
    }
    std::printf("  tensor slot %u: %s, element type %u, shape [%s], strides [%s]\n", t.slot, t.buffer.c_str(), t.dtype,
                shape.c_str(), strides.c_str());
  }
  for (const CallWorkspace& w : c.workspaces)
    std::printf("  workspace %u %s: %s\n", w.index, w.name.c_str(), w.buffer.c_str());
}

}  // namespace repro

// host/device.cuh -- the command-line options, CUDA checks, the driver's tensor-map encoder and the sink's header.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "launch.cuh"

namespace repro {

// ------------------------------------------------------------------------------ the run

struct Options {
  std::string dir, cubin, d_file, expected_file, bound_file, dequant_b_file;
  bool check_only = false, host_reference = false, dry_run = false;
  double timeout_s = -1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: repro [--dir DIR] [--cubin FILE] [--timeout S] [--host-reference]\n"
               "             [--check-only [EXPECTED D]] [--d FILE] [--expected FILE] [--bound FILE] [--dry-run]\n"
               "             [--dequant-b FILE]\n",
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
    else if (a == "--dequant-b") o.dequant_b_file = value();
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
  std::ostringstream res;
  res << "status kernel_error\nerror " << name << "\nmessage " << what << "\n";
  if (launch >= 0) res << "launch " << launch << "\nentry " << entry << "\n";
  write_file(join_path(dir, "result.txt"), res.str());
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

// The sink header of a sink of `capacity` bytes at h, whose first `zeroed` bytes (the whole sink,
// or the header alone in a dry run) are cleared: the record area must start zero.
void init_sink(oracle_trace::SinkHeader* h, unsigned long long capacity, const Launch& L, size_t zeroed) {
  using namespace oracle_trace;
  if (capacity < sizeof(SinkHeader) + kRecordAlign || capacity % kRecordAlign)
    fail("launch.txt: trace_capacity_bytes " + std::to_string(capacity) + " must be a multiple of " +
         std::to_string(kRecordAlign) + " above the " + std::to_string(sizeof(SinkHeader)) + "-byte header");
  std::memset(static_cast<void*>(h), 0, zeroed);
  h->magic = kMagic;
  h->version = static_cast<uint16_t>(kVersion);
  h->header_bytes = static_cast<uint16_t>(kHeaderBytes);
  h->capacity = capacity;
  h->flags = L.all_k_blocks ? kFlagAllKBlocks : 0u;
  if (!L.stages.empty()) {  // launch.txt's trace_stages (an attention kernel's stages)
    for (unsigned code : L.stages) h->stage_mask |= 1u << code;
  } else {  // a GEMM's
    for (Stage s : {Stage::DescriptorA, Stage::DescriptorB, Stage::LoadA, Stage::LoadB, Stage::DequantA,
                    Stage::DequantB, Stage::Mma, Stage::Reduce, Stage::EpilogueScale, Stage::EpilogueAlphaBeta,
                    Stage::EpilogueBias, Stage::EpilogueActivation, Stage::EpilogueCast, Stage::EpilogueAlpha,
                    Stage::EpilogueBetaC, Stage::ScaleA, Stage::ScaleB})
      h->stage_mask |= 1u << static_cast<uint32_t>(s);
  }
  if (L.tiles.size() > kMaxTiles) fail("launch.txt selects " + std::to_string(L.tiles.size()) + " trace tiles; at most " + std::to_string(kMaxTiles));
  if (L.tiles.empty()) {
    h->n_tiles = 1;
    h->tiles[0] = TileSelector{kNone, kNone};
  } else {
    h->n_tiles = static_cast<uint32_t>(L.tiles.size());
    for (size_t i = 0; i < L.tiles.size(); ++i) h->tiles[i] = TileSelector{L.tiles[i].first, L.tiles[i].second};
  }
  if (L.groups.size() > kMaxGroups)
    fail("launch.txt selects " + std::to_string(L.groups.size()) + " trace groups; at most " + std::to_string(kMaxGroups));
  h->n_groups = static_cast<uint32_t>(L.groups.size());
  for (size_t i = 0; i < L.groups.size(); ++i) {
    if (L.groups[i] < 0) fail("launch.txt: trace group " + std::to_string(L.groups[i]) + " must be >= 0");
    h->groups[i] = L.groups[i];
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

}  // namespace repro

// host/run.cuh -- the run: buffers, tensor maps, the launches, the outputs and the sink written, the comparison.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "compare.cuh"
#include "device.cuh"
#include "library.cuh"

namespace repro {

// The launches of launch.txt on the buffers of inputs.txt (`tensors`, checked against the problem
// `describe` names), each of `outputs` poisoned before and written to its file after; the sink
// (traced build) and result.txt. Returns -1 after a clean run (the caller judges the outputs); a
// dry run exits here, a kernel error too (kernel_error).
int run_launches(const Options& o, Launch& L, const std::string& describe, std::map<std::string, TensorFile>& tensors,
                 const std::vector<std::string>& outputs) {
  const bool traced = kTracedBuild;
  const size_t n_launches = L.kernels.size();
  auto entry_of = [&](size_t k) -> const std::string& {
    return traced ? L.kernels[k].entry_traced : L.kernels[k].entry_plain;
  };
  std::string entries;
  for (size_t k = 0; k < n_launches; ++k) entries += (k ? "," : "") + entry_of(k);
  const bool lib = L.library();  // a launch library: one oracle_launch call instead of kernel launches
  const std::string built = lib ? (traced ? L.library_traced : L.library_plain) : (traced ? L.cubin_traced : L.cubin_plain);
  const std::string cubin = o.cubin.empty() ? join_path(o.dir, built) : o.cubin;
  const double timeout = o.timeout_s >= 0 ? o.timeout_s : L.timeout_s;
  if (n_launches == 1)
    std::printf("repro: %s, %s build, entry %s\n", describe.c_str(), traced ? "traced" : "plain", entry_of(0).c_str());
  else
    std::printf("repro: %s, %s build, %zu launches in order: %s\n", describe.c_str(), traced ? "traced" : "plain",
                n_launches, entries.c_str());
  std::printf("  %s %s\n", lib ? ("launch library (ABI " + L.abi + ")").c_str() : "cubin", cubin.c_str());
  if (lib) print_call(L.call);
  for (size_t k = 0; k < n_launches && !lib; ++k) {
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
  for (const std::string& name : outputs) {
    auto it = tensors.find(name);
    if (it == tensors.end() || it->second.role != "out")
      fail("inputs.txt must list the output " + name + " (role=out)");
  }
  if (o.dry_run) {
    if (lib && file_exists(cubin)) {  // loaded and its ABI checked: no CUDA call is made
      require_regular(cubin, "the launch library");
      load_library(cubin);
      std::printf("dry run: %s exports oracle_launch (%s)\n", cubin.c_str(),
                  describe_abi((uint64_t(oracle_trace::kLaunchAbiVersion) << 32) | sizeof(oracle_trace::LaunchArgs)).c_str());
    }
    for (size_t k = 0; k < n_launches && !lib; ++k) {
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
    if (traced) {  // the header alone: the record area is never allocated in a dry run
      std::vector<unsigned long long> buf((sizeof(oracle_trace::SinkHeader) + 7) / 8);  // 8-byte aligned
      auto* h = reinterpret_cast<oracle_trace::SinkHeader*>(buf.data());
      init_sink(h, L.capacity, L, sizeof(oracle_trace::SinkHeader));
      write_file(join_path(o.dir, "sink_init.bin"), h, sizeof(oracle_trace::SinkHeader));
      std::printf("dry run: wrote sink_init.bin (the initial sink header)\n");
    }
    std::printf("dry run: every file read, nothing launched\n");
    std::exit(kMatch);
  }
  if (!file_exists(cubin))
    fail(std::string(lib ? "launch library " : "cubin ") + cubin + " does not exist: run make" +
         std::string(traced ? " TRACE=1" : "") + " first");
  require_regular(cubin, lib ? "the launch library" : "the cubin");

  check_cuda(cudaSetDevice(0), "cudaSetDevice(0)", kBadInput, o.dir);
  check_cuda(cudaFree(nullptr), "CUDA initialisation", kBadInput, o.dir);
  // the library's own CUDA runtime uses the same primary context: these device pointers are valid there
  const LaunchFn library_entry = lib ? load_library(cubin) : nullptr;
  cudaLibrary_t module = nullptr;
  if (!lib)
    check_cuda(cudaLibraryLoadFromFile(&module, cubin.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0),
               "loading " + cubin, kBadInput, o.dir);
  std::vector<const void*> fns(n_launches);
  for (size_t k = 0; k < n_launches && !lib; ++k) {
    const KernelLaunch& K = L.kernels[k];
    const std::string which = "launch " + std::to_string(k) + ": ";
    cudaKernel_t kernel;
    check_cuda(cudaLibraryGetKernel(&kernel, module, entry_of(k).c_str()),
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
  const bool has_symbol =
      !lib && cudaLibraryGetGlobal(&sink_symbol, &symbol_bytes, module, "oracle_trace_sink") == cudaSuccess;
  (void)cudaGetLastError();
  void* sink_dev = nullptr;
  if (traced) {  // one sink for every launch: the symbol is the module's, set once (a library's: LaunchArgs)
    if (!lib && (!has_symbol || symbol_bytes != 8))
      fail("cubin " + cubin + " has no 8-byte oracle_trace_sink symbol: it was not built with -DORACLE_TRACE");
    void* host = nullptr;
    check_cuda(cudaHostAlloc(&host, size_t(L.capacity), cudaHostAllocMapped | cudaHostAllocPortable),
               "allocating the host-mapped sink", kBadInput, o.dir);
    sink = static_cast<oracle_trace::SinkHeader*>(host);
    init_sink(sink, L.capacity, L, size_t(L.capacity));
    check_cuda(cudaHostGetDevicePointer(&sink_dev, host, 0), "mapping the sink", kBadInput, o.dir);
    if (!lib)
      check_cuda(cudaMemcpy(sink_symbol, &sink_dev, 8, cudaMemcpyHostToDevice), "setting oracle_trace_sink", kBadInput,
                 o.dir);
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
  for (size_t k = 0; k < n_launches && !lib; ++k) {
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
    int returned = 0;
    std::vector<char> message(1024, '\0');
    cudaError_t e = cudaSuccess;
    if (lib) {  // the library launches its own kernels on the stream
      const oracle_trace::LaunchArgs args =
          fill_args(L.call, dev, tensors, sink_dev, stream, message.data(), uint32_t(message.size()));
      returned = library_entry(&args);
    } else {
      e = cudaLaunchKernelExC(&cfg, fns[k], params[k].data());
    }
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
    const std::string said = returned ? " (oracle_launch returned " + std::to_string(returned) + ")" : "";
    if (e != cudaSuccess) kernel_error(cudaGetErrorString(e) + said, cudaGetErrorName(e), o.dir, sink, at, entry_of(k));
    if (returned != 0)
      kernel_error("oracle_launch returned " + std::to_string(returned) + ": " + message.data(),
                   "oracle_launch_returned_" + std::to_string(returned), o.dir, sink, at, entry_of(k));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (n_launches == 1) std::printf("kernel: finished (%.3f ms wall, launch to completion)\n", ms);
  else std::printf("kernels: all %zu finished (%.3f ms wall, first launch to last completion)\n", n_launches, ms);

  for (const std::string& name : outputs) {
    TensorFile& d = tensors[name];
    d.data.resize(size_t(d.bytes));
    cudaError_t e = cudaMemcpy(d.data.data(), dev[name], size_t(d.bytes), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
      kernel_error("download of " + name + ": " + cudaGetErrorString(e), cudaGetErrorName(e), o.dir, sink);
    write_file(join_path(o.dir, d.file), d.data.data(), d.data.size());
  }
  if (sink != nullptr) {
    const unsigned long long area = sink->capacity - sink->header_bytes;
    const unsigned long long used = std::min<unsigned long long>(sink->cursor, area);
    write_file(join_path(o.dir, "sink.bin"), sink, size_t(sink->header_bytes + used));
    std::printf("trace: wrote sink.bin (%llu bytes of records, %u dropped); judge it with: python -m oracle compare "
                "--repro-dir %s\n",
                used, sink->dropped, o.dir.c_str());
  }
  {
    std::ostringstream res;
    res << "status ok\nentry " << entry_of(0) << "\nentries " << entries << "\nlaunches " << n_launches
        << "\ntraced " << (traced ? 1 : 0) << "\nwall_ms " << ms << "\n";
    write_file(join_path(o.dir, "result.txt"), res.str());
  }
  return -1;  // the caller judges the outputs
}

// The run of a GEMM's reproducer: its problem and tensors checked, then the launches; D is judged by the caller.
int run(const Options& o) {
  const Problem p = read_problem(o.dir);
  Launch L = read_launch(o.dir);
  auto tensors = read_inputs_manifest(o.dir);
  check_problem_tensors(p, tensors);
  return run_launches(o, L, p.describe, tensors, {"d"});
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

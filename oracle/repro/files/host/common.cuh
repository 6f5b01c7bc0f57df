// host/common.cuh -- the exit codes, `fail` and the path helpers every part uses; the includes.
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
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

#include "oracle_trace/launch.hpp"
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

}  // namespace repro

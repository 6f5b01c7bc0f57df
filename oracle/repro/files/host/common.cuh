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

namespace repro {

extern const bool kTracedBuild;  // the traced build (host/kind.cpp)

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

// a * b for sizes and element counts, or a failure naming `what` where the product passes int64.
long long checked_mul(long long a, long long b, const std::string& what) {
  long long r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    fail(what + ": " + std::to_string(a) + " x " + std::to_string(b) + " passes a 64-bit size");
  return r;
}

// A file of the folder opened to be read: never through a symbolic link, never waited on (a FIFO
// or a device opens without blocking and is refused), and a regular file once open, so a swap
// after a check is caught. Returns the descriptor; `st` gets the open file's stat.
int open_regular(const std::string& path, const std::string& what, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail("cannot read " + path + " (" + what + "): " + std::strerror(err) +
         (err == ELOOP ? " (a symbolic link: the reproducer reads only regular files)" : ""));
  }
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    ::close(fd);
    fail(path + " (" + what + ") is not a regular file (a FIFO, device or folder is not read)");
  }
  return fd;
}

// Exactly `bytes` bytes of an open file into `out`, or a failure naming the path.
void read_exactly(int fd, void* out, size_t bytes, const std::string& path) {
  char* at = static_cast<char*>(out);
  for (size_t left = bytes; left > 0;) {
    const ssize_t n = ::read(fd, at, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("could not read all of " + path + (n < 0 ? std::string(": ") + std::strerror(errno) : " (it shrank)"));
    }
    at += n, left -= size_t(n);
  }
}

// A file the program loads by path itself (a cubin, a launch library): a regular file first.
void require_regular(const std::string& path, const std::string& what) {
  struct stat st;
  ::close(open_regular(path, what, &st));
}

}  // namespace repro

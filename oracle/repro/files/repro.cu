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
// Built with -DORACLE_REPRO_TRACED=1 (make TRACE=1; host/kind.cpp) it launches the traced entry points with a
// host-mapped pinned sink, set once for all of them, and writes the sink's bytes to sink.bin, also
// after a kernel fault.
//
// Constraints: nothing in this file depends on the case, so one binary serves every reproducer
// of one kernel source and flags (--dir, --cubin); the sink header is filled through the structs
// and constants of oracle_trace/trace.cuh, never by byte offsets; --check-only makes no CUDA call.
//
// Usage: repro [--dir DIR] [--cubin FILE] [--timeout S] [--host-reference]
//              [--check-only [EXPECTED D]] [--d FILE] [--expected FILE] [--bound FILE] [--dry-run]
//              [--dequant-b FILE]
// --dry-run reads every file, prints the argument bytes and writes the initial sink header
// (sink_init.bin, traced build) without touching CUDA: the launch can be checked on any machine.
// --dequant-b FILE writes a quantised B as the host reference dequantises it (host/dequant.cuh:
// [K, N] row-major fp64) and exits, without touching CUDA.
// Exit codes (the oracle's): 0 MATCH, 1 DIVERGED, 2 bad usage or input files, 3 kernel error,
// 5 MISTRUSTED (every reference value is zero: nothing to discriminate).
//
// An attention problem (problem.txt: kind attention) runs the same launches with O and LSE as its
// outputs (o.bin, lse.bin) and judges them with the oracle's expected O and LSE and their bounds
// (host/attention.cuh: the first bad element by batch, query, head and column).
//
// Its parts are the headers under host/, one concern each (inputs, launches, the dequantised B, the
// reference, the comparison, the run, attention); this file is the entry point.

#include "host/attention.cuh"

int main(int argc, char** argv) {
  using namespace repro;
  const Options o = parse_options(argc, argv);
  if (problem_kind(o.dir) == "attention") return attention_main(o);
  if (!o.dequant_b_file.empty()) return write_dequantised_b(o.dir, o.dequant_b_file);
  if (!o.check_only) run(o);
  const Problem p = read_problem(o.dir);
  auto tensors = read_inputs_manifest(o.dir);
  check_problem_tensors(p, tensors);
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

#ifndef ORACLE_REPRO_KIND_LINKED  // built alone (nvcc [-DORACLE_REPRO_TRACED=1] repro.cu): the kind is this file's
#include "host/kind.cpp"
#endif

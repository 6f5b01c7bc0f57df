// oracle_trace/launch.hpp -- the launch-library ABI "oracle/1": what the harness hands a kernel's
// own host code, and the one function that code exports.
//
// A case with `[kernel] library = "my_gemm.cu"` and `[launch] abi = "oracle/1"` is built as a
// shared library; the harness's child process fills one LaunchArgs from the device buffers it
// allocated (inputs uploaded, outputs poisoned, workspaces filled) and calls
//
//   extern "C" int oracle_launch(const oracle_trace::LaunchArgs* args);
//
// on args->stream, then synchronises. 0 means launched; any other value is the library's own
// error code (reported, with args->message, as KERNEL_ERROR). The library's host code does
// what a production launcher does: checks the problem, encodes its tensor maps, fills its
// Params, launches. It calls install_sink(args) first, so that its traced kernels write into
// the harness's sink.
//
// Layout rules: C layout, fixed-width fields, no field ever moves within one ABI version.
// harness/launch_abi.py mirrors this struct field by field (tests/cpu/test_launch_library.py
// compiles a program that prints every offsetof and compares). The first two fields, the ABI
// version and the struct's size, let either side refuse the other: check_args() in the library,
// oracle_launch_abi() (exported by this header) in the harness.
//
// Element types are kernels_ref/dtypes.py's `launch_code`s; activations are
// kernels_ref/epilogue.py ACTIVATIONS in order. Include-only; needs the CUDA runtime headers.

#ifndef ORACLE_TRACE_LAUNCH_HPP_
#define ORACLE_TRACE_LAUNCH_HPP_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "trace.cuh"

namespace oracle_trace {

constexpr uint32_t kLaunchAbiVersion = 1u;  // "oracle/1"
constexpr uint32_t kMaxRank = 4u;
constexpr uint32_t kTensorSlots = 16u;
constexpr uint32_t kWorkspaceSlots = 8u;
constexpr uint32_t kWorkspaceNameBytes = 32u;  // a workspace's name, NUL-terminated

// Element type of a tensor (kernels_ref/dtypes.py launch_code).
enum class ElementType : uint32_t {
  None = 0,  // no tensor in this slot
  F32 = 1,
  F16 = 2,
  BF16 = 3,
  E4M3 = 4,
  E5M2 = 5,
  I8 = 6,
  I32 = 7,
  U8 = 8,  // raw bytes
};

// The short name of an element type (kernels_ref/dtypes.py's names), for messages: "none" for no
// tensor, "unknown" for a code past the table.
constexpr const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::None: return "none";
    case ElementType::F32: return "fp32";
    case ElementType::F16: return "fp16";
    case ElementType::BF16: return "bf16";
    case ElementType::E4M3: return "e4m3";
    case ElementType::E5M2: return "e5m2";
    case ElementType::I8: return "int8";
    case ElementType::I32: return "int32";
    case ElementType::U8: return "uint8";
  }
  return "unknown";
}
constexpr const char* element_type_name(uint32_t code) { return element_type_name(ElementType(code)); }

// Which tensor a slot holds. Slots past ScaleB are free for later use (zero today).
enum TensorSlot : uint32_t {
  kSlotA = 0,       // logical [M, K] ([total M, K] for a grouped or batched problem)
  kSlotB = 1,       // logical [K, N] ([groups, K, N] for a grouped or batched problem)
  kSlotC = 2,       // logical [M, N]; absent when beta == 0
  kSlotD = 3,       // logical [M, N], the output (poisoned with 0xFF bytes before the call)
  kSlotBias = 4,    // [N] (bias_kind Col), [M] (Row) or [groups, N]
  kSlotScaleA = 5,  // [1], [M] or [ceil(M / rows), ceil(K / k)] (scale_a_kind)
  kSlotScaleB = 6,  // [1], [N] or [ceil(N / cols), ceil(K / k)]
};

// kernels_ref/epilogue.py ACTIVATIONS, in order.
enum class Activation : uint32_t { None = 0, Relu = 1, GeluErf = 2, GeluTanh = 3, Silu = 4 };
enum class BiasKind : uint32_t { None = 0, Row = 1, Col = 2 };  // Row: one per m; Col: one per n
enum class ScaleKind : uint32_t { None = 0, Tensor = 1, Row = 2, Col = 3, Block = 4 };

// A scale kind's name as a case spells it (scale_a.kind), for messages; "unknown" past the table.
constexpr const char* scale_kind_name(uint32_t code) {
  switch (ScaleKind(code)) {
    case ScaleKind::None: return "none";
    case ScaleKind::Tensor: return "tensor";
    case ScaleKind::Row: return "row";
    case ScaleKind::Col: return "col";
    case ScaleKind::Block: return "block";
  }
  return "unknown";
}

// A bias kind's and an activation's names as a case spells them, for messages; "unknown" past the table.
constexpr const char* bias_kind_name(uint32_t code) {
  switch (BiasKind(code)) {
    case BiasKind::None: return "none";
    case BiasKind::Row: return "row";
    case BiasKind::Col: return "col";
  }
  return "unknown";
}
constexpr const char* activation_name(uint32_t code) {
  switch (Activation(code)) {
    case Activation::None: return "none";
    case Activation::Relu: return "relu";
    case Activation::GeluErf: return "gelu_erf";
    case Activation::GeluTanh: return "gelu_tanh";
    case Activation::Silu: return "silu";
  }
  return "unknown";
}

// Return codes this header's helpers produce; a library may return any other non-zero value.
constexpr int kLaunchOk = 0;
constexpr int kLaunchAbiMismatch = 1000;   // args of another ABI version or size
constexpr int kLaunchUnsupported = 1001;   // a problem the library does not handle
constexpr int kLaunchCudaError = 1002;     // a CUDA runtime call failed

// One tensor: its device address and logical layout. Element (i0, i1, ...) lives at
// data + sum(i_d * stride[d]) elements; a row-major [M, K] has stride {K, 1}, a column-major
// one {1, M}. Unused trailing dimensions have shape 1 and stride 0.
struct TensorRef {
  void* data;                // device pointer; nullptr when the problem has no such tensor
  uint32_t dtype;            // ElementType
  uint32_t rank;             // 0 when absent, else 1..kMaxRank
  int64_t shape[kMaxRank];   // logical shape, outermost first
  int64_t stride[kMaxRank];  // in elements, per logical dimension
};

// A workspace the case declares ([workspace.NAME]), in declaration order.
struct WorkspaceRef {
  void* data;                      // device pointer, filled as the case says (zero, poison, stale)
  uint64_t bytes;
  char name[kWorkspaceNameBytes];  // the case's NAME
};

struct LaunchArgs {
  uint32_t abi_version;   // kLaunchAbiVersion
  uint32_t struct_bytes;  // sizeof(LaunchArgs) on the harness's side
  // the problem
  int64_t m;              // rows of D (a grouped or batched problem: the sum over groups)
  int64_t n;
  int64_t k;
  int64_t batch;          // batch entries (1: not batched)
  int64_t groups;         // groups of a grouped GEMM (0: not grouped)
  const int32_t* group_offsets;  // device, groups + 1 row offsets (batched too), or nullptr
  float alpha;
  float beta;
  int32_t splits;            // split-K splits (1: none)
  int32_t stream_k_workers;  // stream-K work units (0: not stream-K)
  uint32_t activation;       // Activation
  uint32_t bias_kind;        // BiasKind
  uint32_t scale_a_kind;     // ScaleKind
  uint32_t scale_b_kind;
  int32_t scale_a_block[2];  // a Block scale's (rows, k); 0 otherwise
  int32_t scale_b_block[2];  // (cols, k)
  int32_t tile_m;            // the case's CTA tile and k-block: the kernel must tile this way,
  int32_t tile_n;            // the oracle judges (and the taps name) tiles of this size
  int32_t tile_k;
  uint32_t n_workspaces;     // entries of workspaces[] in use
  TensorRef tensors[kTensorSlots];  // by TensorSlot
  WorkspaceRef workspaces[kWorkspaceSlots];
  void* trace_sink;       // the sink's device address (device or host-mapped), nullptr: not tracing
  cudaStream_t stream;    // launch everything on this stream; the harness synchronises it
  char* message;          // host buffer for a sentence explaining a non-zero return
  uint32_t message_bytes;
  uint32_t reserved;
};

// The library's ABI, exported so that the harness can refuse a library built against another
// version before calling it: (version << 32) | sizeof(LaunchArgs). Weak: one definition wins when
// several translation units include this header.
extern "C" __attribute__((weak, used, visibility("default"))) inline uint64_t oracle_launch_abi(void) {
  return (uint64_t(kLaunchAbiVersion) << 32) | uint64_t(sizeof(LaunchArgs));
}

// Write a sentence into args->message (when given) and return `code`.
inline int fail_launch(const LaunchArgs* args, int code, const char* fmt, ...) {
  if (args != nullptr && args->message != nullptr && args->message_bytes > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args->message, args->message_bytes, fmt, ap);
    va_end(ap);
  }
  return code;
}

// 0 when `args` speaks this header's ABI, else kLaunchAbiMismatch with a message.
inline int check_args(const LaunchArgs* args) {
  if (args == nullptr) return kLaunchAbiMismatch;
  if (args->abi_version != kLaunchAbiVersion || args->struct_bytes != sizeof(LaunchArgs))
    return fail_launch(args, kLaunchAbiMismatch,
                "the harness passed LaunchArgs of ABI version %u (%u bytes); this library was built against "
                "version %u (%u bytes)",
                args->abi_version, args->struct_bytes, kLaunchAbiVersion, unsigned(sizeof(LaunchArgs)));
  return kLaunchOk;
}

inline const TensorRef& tensor(const LaunchArgs* args, TensorSlot slot) { return args->tensors[slot]; }

// Point this translation unit's oracle_trace_sink at args->trace_sink (nullptr: every tap off).
// Call it in the translation unit that holds the traced kernels, before launching them. Without
// ORACLE_TRACE there is no sink symbol and nothing to do.
#if defined(ORACLE_TRACE) && defined(__CUDACC__)
static inline cudaError_t install_sink(const LaunchArgs* args) { return set_sink(args->trace_sink); }
#else
static inline cudaError_t install_sink(const LaunchArgs*) { return cudaSuccess; }
#endif

}  // namespace oracle_trace

extern "C" int oracle_launch(const oracle_trace::LaunchArgs* args);

#endif  // ORACLE_TRACE_LAUNCH_HPP_

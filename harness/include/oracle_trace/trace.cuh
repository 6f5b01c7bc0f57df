// oracle_trace/trace.cuh -- in-kernel trace taps for the differential oracle.
//
// One header, no dependency but CUDA. A kernel taps operand tiles, per-k-block
// accumulators and epilogue values into a trace sink; the harness parses the sink
// (harness/trace_format.py) and compares every stage with its reference.
// The binary format is specified in docs/trace-format.md.
//
// Gating, two levels:
//   1. The macro ORACLE_TRACE compiles the machinery in at all. Without it this header
//      declares types and constants only: no __device__ variable, no function body
//      that could be emitted, so the kernel's SASS is identical to a build without the
//      header (tests/cpu/test_sass_identity.py holds us to that).
//   2. A compile-time switch per template instantiation: `oracle_trace::Tracer<Trace>`
//      is live only for Trace == true (and only with the macro), so production
//      instantiations of the same kernel template carry no taps:
//
//        template <bool Trace> __global__ void gemm(...) {
//          using Tr = oracle_trace::Tracer<Trace>;
//          ...
//          if constexpr (Tr::enabled) {
//            Tr::tap_elements(oracle_trace::Stage::Mma, {tile_m, tile_n, kb}, BM, BN, 16,
//                             [&](int i) { return oracle_trace::Element<float>{row(i), col(i), acc[i]}; });
//          }
//        }
//
// The sink: the global-namespace __device__ pointer `oracle_trace_sink` (unmangled
// name). The host points it at a buffer before the launch (cuModuleGetGlobal + a copy
// of the 8-byte pointer, or oracle_trace::set_sink() in a runtime-API program), so the
// kernel signature does not change. A null sink disables every tap. The buffer may be
// device memory or host-mapped pinned memory: records are committed with
// __threadfence_system(), so taps written before a crash can still be read.
//
// Device API (namespace oracle_trace, with ORACLE_TRACE defined):
//   selected(tile_m, tile_n, k_block = kNone)            is this tile/k-block recorded?
//   selected(stage, site)                                 ... and this stage?
//   tap_elements(stage, site, tile_rows, tile_cols, count, element_fn)
//       one thread: element_fn(i) -> Element<T>{row, col, value} for i in [0, count)
//   tap_smem_tile(stage, site, smem, rows, cols, layout [, group_thread, group_size])
//       whole warps: logical [rows, cols] values, layout(r, c) -> element offset
//   tap_smem_bytes(stage, site, smem, nbytes, dtype, tile_rows, tile_cols [, group...])
//       whole warps: the raw byte image (for descriptor_a / descriptor_b)
//   tap_descriptor(operand, dtype, rank, dims, strides, box, element_strides,
//                  swizzle_bytes, oob_fill)                one thread: TMA descriptor fields
//   set_sink(void* ptr)                                    host, runtime API, this TU's symbol
//   smem_prologue()                                        every thread, first thing: fills the dynamic
//       shared memory with the host's poison pattern when the host asked (oracle_trace_smem_poison)
//
// Site{tile_m, tile_n, k_block, slot, partial, group}: where a tap belongs; `partial` names the
// split-K split or stream-K work unit of a split tile, `group` the batch entry or group.
//
// Selection: every tap checks the sink's selection (stages, tiles, k-blocks) itself;
// call selected() first only to skip work that prepares a tap. Records that do not
// fit are counted in the header's `dropped` field and per stage in `dropped_by_stage`,
// never lost silently.

#ifndef ORACLE_TRACE_TRACE_CUH_
#define ORACLE_TRACE_TRACE_CUH_

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define ORACLE_TRACE_HD __host__ __device__
#define ORACLE_TRACE_DEVICE __device__ __forceinline__
#else
#define ORACLE_TRACE_HD
#define ORACLE_TRACE_DEVICE inline
#endif

namespace oracle_trace {

// ---------------------------------------------------------------------------------
// Format constants. harness/trace_format.py holds the same numbers and
// tests/cpu/test_trace_constants.py checks that both agree.
// ---------------------------------------------------------------------------------

constexpr uint32_t kMagic = 0x4352544Fu;  // bytes "OTRC" in little-endian order
constexpr uint32_t kVersion = 3u;  // 1: 40-byte heads, no drop counts; 2: 512-byte header, 16 drop counts
constexpr uint32_t kHeaderBytes = 576u;
constexpr uint32_t kMaxTiles = 32u;         // tile selectors in the header
constexpr uint32_t kMaxGroups = 4u;         // group (batch entry) selectors in the header
constexpr uint32_t kKBlockWindow = 1024u;   // k-blocks the bitmap covers, from kb_base
constexpr uint32_t kFlagAllKBlocks = 1u;    // header flags bit: every k-block is selected
constexpr uint32_t kCommitTag = 0xC0DEu;    // high half of a committed record's kind word
constexpr uint32_t kRecordHeadBytes = 48u;
constexpr uint32_t kRecordAlign = 8u;
constexpr uint32_t kMaxTileDim = 65535u;    // rows and cols are 16-bit
constexpr int kNone = -1;                   // no k-block / slot / partial / group; any tile
constexpr uint32_t kStageCounters = 32u;    // dropped_by_stage[] entries, indexed by stage code

// Stage codes (harness/trace_format.py STAGE_CODES); the pipeline order is harness/taps.py STAGES.
enum class Stage : uint8_t {
  DescriptorA = 1,
  DescriptorB = 2,
  LoadA = 3,
  LoadB = 4,
  Mma = 5,
  EpilogueScale = 6,
  EpilogueAlphaBeta = 7,
  EpilogueBias = 8,
  EpilogueActivation = 9,
  EpilogueCast = 10,
  Reduce = 11,  // a split tile's partials summed; in pipeline order between Mma and the epilogue
  EpilogueAlpha = 12,  // a declared epilogue that applies alpha and beta * C as two steps
  EpilogueBetaC = 13,
  DequantA = 14,  // a quantised operand's tile as the MMA reads it, after dequantisation;
  DequantB = 15,  // in pipeline order between LoadA/LoadB and Mma
  // Attention (format version 3; oracle_trace/attention.cuh taps them), in pipeline order.
  LoadQ = 16,
  LoadK = 17,
  LoadV = 18,
  S = 19,             // Q K^T of one KV block, fp32
  Mask = 20,          // the scores scaled, soft-capped and masked
  SoftmaxState = 21,  // per query row: m, rescale, l (a [rows, 3] fp32 block)
  P = 22,             // P in the second MMA's operand type
  O = 23,             // the O accumulator after a KV block
  Normalize = 24,     // O / l and the LSE (column head_dim_v)
  Combine = 25,       // split-KV partials merged by their LSE
  // The block scales a k-block applied (oracle_trace/scales.cuh taps them); in pipeline order between
  // LoadA/LoadB (DequantA/DequantB) and Mma.
  ScaleA = 26,  // [BM, S] fp32: per row of A's tile, per scale group of the k-block
  ScaleB = 27,  // [BN, S] fp32: per column of B's tile
};

// Element types (kernels_ref/dtypes.py names: fp32 fp16 bf16 e4m3 e5m2 int8 int32 uint8; uint8 holds
// the bytes of a packed operand, two 4-bit values in each).
enum class DType : uint8_t {
  F32 = 1,
  F16 = 2,
  BF16 = 3,
  E4M3 = 4,
  E5M2 = 5,
  I8 = 6,
  I32 = 7,
  U8 = 8,
};

enum class RecordKind : uint16_t {
  Elements = 1,    // N (row, col, value) triples of one tile
  Block = 2,       // a dense row-major rectangle of one tile
  Bytes = 3,       // a chunk of a shared-memory byte image
  Descriptor = 4,  // TMA descriptor fields
  Pad = 5,         // closes the record area when a record did not fit
};

enum class Operand : uint8_t { A = 0, B = 1 };
enum class OobFill : uint8_t { Zero = 0, NaN = 1 };

ORACLE_TRACE_HD constexpr uint32_t dtype_size(DType d) {
  return (d == DType::F32 || d == DType::I32) ? 4u
         : (d == DType::F16 || d == DType::BF16) ? 2u
                                                  : 1u;
}

// ---------------------------------------------------------------------------------
// Buffer layout (all little-endian). The host writes the header before the launch,
// the kernel appends records after it.
// ---------------------------------------------------------------------------------

struct TileSelector {
  int32_t tile_m;  // kNone (-1): any
  int32_t tile_n;  // kNone (-1): any
};

struct SinkHeader {
  uint32_t magic;                        // kMagic
  uint16_t version;                      // kVersion
  uint16_t header_bytes;                 // kHeaderBytes: records start here
  uint64_t capacity;                     // bytes of the whole buffer, header included
  unsigned long long cursor;             // bytes reserved in the record area (atomicAdd)
  uint32_t dropped;                      // records that did not fit
  uint32_t flags;                        // kFlagAllKBlocks
  uint32_t stage_mask;                   // bit (1 << stage code) set: stage recorded
  uint32_t n_tiles;                      // valid entries in tiles[]
  int32_t kb_base;                       // k-block of bit 0 of kb_bits
  uint32_t n_groups;                     // valid entries in groups[]; 0: every group (and batch entry)
  int32_t groups[kMaxGroups];            // a tap of a group is recorded if its group is one of these
  TileSelector tiles[kMaxTiles];         // a tile is recorded if any selector matches
  uint32_t kb_bits[kKBlockWindow / 32];  // bit i: k-block kb_base + i is recorded
  uint32_t dropped_by_stage[kStageCounters];  // records that did not fit, by stage code
};

struct RecordHead {
  uint32_t size;  // bytes of the record, head included, a multiple of kRecordAlign
  uint16_t kind;  // RecordKind; written last together with
  uint16_t commit;  // kCommitTag once the record is complete
  uint8_t stage;    // Stage
  uint8_t dtype;    // DType of the values (Bytes: of the operand the image holds)
  uint16_t reserved;
  uint32_t thread;  // linear thread index in the CTA of the writer (warp leader)
  uint32_t cta;     // linear CTA index: x + gridDim.x * (y + gridDim.y * z)
  int32_t tile_m;
  int32_t tile_n;
  int32_t k_block;  // kNone if the stage has none
  int32_t slot;     // pipeline slot, kNone if not applicable
  uint16_t shape_rows;  // shape of the whole tile the record belongs to
  uint16_t shape_cols;
  int32_t partial;  // split-K / stream-K work unit of the tile, kNone if the tile is not split
  int32_t group;    // batch entry or group of a grouped GEMM, kNone if not applicable
};

struct ElementsBody {  // then uint32 coords[count] (row | col << 16), then values
  uint32_t count;
  uint32_t reserved;
};

struct BlockBody {  // then values[rows * cols], row-major
  uint16_t row0;
  uint16_t col0;
  uint16_t rows;
  uint16_t cols;
};

struct BytesBody {  // then data[nbytes]
  uint32_t offset;       // byte offset of this chunk in the image
  uint32_t nbytes;
  uint32_t total_bytes;  // size of the whole image
  uint32_t reserved;
};

struct DescriptorBody {
  uint8_t operand;  // Operand
  uint8_t rank;     // 1..5
  uint16_t swizzle_bytes;  // 0, 32, 64, 128
  uint8_t oob_fill;        // OobFill
  uint8_t reserved[3];
  uint64_t dims[5];             // innermost first
  uint64_t strides[4];          // bytes, dims 1..rank-1
  uint32_t box[5];
  uint32_t element_strides[5];
};

static_assert(sizeof(TileSelector) == 8, "TileSelector layout");
static_assert(sizeof(SinkHeader) == kHeaderBytes, "SinkHeader layout");
static_assert(offsetof(SinkHeader, magic) == 0, "SinkHeader.magic");
static_assert(offsetof(SinkHeader, version) == 4, "SinkHeader.version");
static_assert(offsetof(SinkHeader, header_bytes) == 6, "SinkHeader.header_bytes");
static_assert(offsetof(SinkHeader, capacity) == 8, "SinkHeader.capacity");
static_assert(offsetof(SinkHeader, cursor) == 16, "SinkHeader.cursor");
static_assert(offsetof(SinkHeader, dropped) == 24, "SinkHeader.dropped");
static_assert(offsetof(SinkHeader, flags) == 28, "SinkHeader.flags");
static_assert(offsetof(SinkHeader, stage_mask) == 32, "SinkHeader.stage_mask");
static_assert(offsetof(SinkHeader, n_tiles) == 36, "SinkHeader.n_tiles");
static_assert(offsetof(SinkHeader, kb_base) == 40, "SinkHeader.kb_base");
static_assert(offsetof(SinkHeader, n_groups) == 44, "SinkHeader.n_groups");
static_assert(offsetof(SinkHeader, groups) == 48, "SinkHeader.groups");
static_assert(offsetof(SinkHeader, tiles) == 64, "SinkHeader.tiles");
static_assert(offsetof(SinkHeader, kb_bits) == 320, "SinkHeader.kb_bits");
static_assert(offsetof(SinkHeader, dropped_by_stage) == 448, "SinkHeader.dropped_by_stage");
static_assert(sizeof(RecordHead) == kRecordHeadBytes, "RecordHead layout");
static_assert(offsetof(RecordHead, size) == 0, "RecordHead.size");
static_assert(offsetof(RecordHead, kind) == 4, "RecordHead.kind");
static_assert(offsetof(RecordHead, commit) == 6, "RecordHead.commit");
static_assert(offsetof(RecordHead, stage) == 8, "RecordHead.stage");
static_assert(offsetof(RecordHead, dtype) == 9, "RecordHead.dtype");
static_assert(offsetof(RecordHead, thread) == 12, "RecordHead.thread");
static_assert(offsetof(RecordHead, cta) == 16, "RecordHead.cta");
static_assert(offsetof(RecordHead, tile_m) == 20, "RecordHead.tile_m");
static_assert(offsetof(RecordHead, tile_n) == 24, "RecordHead.tile_n");
static_assert(offsetof(RecordHead, k_block) == 28, "RecordHead.k_block");
static_assert(offsetof(RecordHead, slot) == 32, "RecordHead.slot");
static_assert(offsetof(RecordHead, shape_rows) == 36, "RecordHead.shape_rows");
static_assert(offsetof(RecordHead, shape_cols) == 38, "RecordHead.shape_cols");
static_assert(offsetof(RecordHead, partial) == 40, "RecordHead.partial");
static_assert(offsetof(RecordHead, group) == 44, "RecordHead.group");
static_assert(sizeof(ElementsBody) == 8, "ElementsBody layout");
static_assert(sizeof(BlockBody) == 8, "BlockBody layout");
static_assert(sizeof(BytesBody) == 16, "BytesBody layout");
static_assert(sizeof(DescriptorBody) == 120, "DescriptorBody layout");
static_assert(offsetof(DescriptorBody, dims) == 8, "DescriptorBody.dims");
static_assert(offsetof(DescriptorBody, strides) == 48, "DescriptorBody.strides");
static_assert(offsetof(DescriptorBody, box) == 80, "DescriptorBody.box");
static_assert(offsetof(DescriptorBody, element_strides) == 100, "DescriptorBody.element_strides");

// ---------------------------------------------------------------------------------
// Types the kernel names in its taps (declared whether or not tracing is compiled in,
// so instrumented code parses in every build).
// ---------------------------------------------------------------------------------

// Where a tap belongs: output tile (in BM x BN units), k-block (BK units), pipeline slot,
// the partial of a split tile (split-K split / stream-K work unit) and the group or batch entry.
struct Site {
  int tile_m;
  int tile_n;
  int k_block = kNone;
  int slot = kNone;
  int partial = kNone;
  int group = kNone;
};

// One element a thread holds: its (row, col) inside the tile and its value.
template <class T>
struct Element {
  int row;
  int col;
  T value;
};

// Layout of a shared-memory tile: element (r, c) lives at r * row_stride + c * col_stride.
// Any callable (int r, int c) -> element offset works in its place (e.g. a swizzle).
struct Strided {
  int row_stride;
  int col_stride;
  ORACLE_TRACE_HD constexpr int operator()(int r, int c) const { return r * row_stride + c * col_stride; }
};

template <class T>
struct dtype_of;  // undefined: a type without a trace dtype does not compile
// One row per C++ type a tap may hold: its trace dtype.
#define ORACLE_TRACE_DTYPE_OF(T, D)          \
  template <>                                \
  struct dtype_of<T> {                       \
    static constexpr DType value = DType::D; \
  };
ORACLE_TRACE_DTYPE_OF(float, F32)
ORACLE_TRACE_DTYPE_OF(int8_t, I8)
ORACLE_TRACE_DTYPE_OF(uint8_t, U8)
ORACLE_TRACE_DTYPE_OF(int32_t, I32)
#if defined(__CUDACC__)
ORACLE_TRACE_DTYPE_OF(__half, F16)
ORACLE_TRACE_DTYPE_OF(__nv_bfloat16, BF16)
ORACLE_TRACE_DTYPE_OF(__nv_fp8_e4m3, E4M3)
ORACLE_TRACE_DTYPE_OF(__nv_fp8_e5m2, E5M2)
#endif
#undef ORACLE_TRACE_DTYPE_OF

#if defined(ORACLE_TRACE)
constexpr bool compiled_in = true;
#else
constexpr bool compiled_in = false;
#endif

// The gate. Tracer<false>, and every Tracer without ORACLE_TRACE, does nothing: its
// members have the live signatures (see the functions below) and empty bodies. Prefer
// `if constexpr (Tr::enabled)` around taps so that not even the arguments are evaluated.
template <bool Requested>
struct Tracer {
  static constexpr bool enabled = false;
  ORACLE_TRACE_HD static constexpr bool selected(int, int, int = kNone) { return false; }
  ORACLE_TRACE_HD static constexpr bool selected(Stage, const Site&) { return false; }
  template <class F>
  ORACLE_TRACE_HD static void tap_elements(Stage, const Site&, int, int, int, F&&) {}
  template <class T, class Layout>
  ORACLE_TRACE_HD static void tap_smem_tile(Stage, const Site&, const T*, int, int, Layout, int = -1, int = -1) {}
  ORACLE_TRACE_HD static void tap_smem_bytes(Stage, const Site&, const void*, uint32_t, DType, int, int, int = -1,
                                             int = -1) {}
  ORACLE_TRACE_HD static void tap_descriptor(Operand, DType, int, const uint64_t*, const uint64_t*, const uint32_t*,
                                             const uint32_t*, int, OobFill) {}
  ORACLE_TRACE_HD static void smem_prologue() {}
};

}  // namespace oracle_trace

// ===================================================================================
// The machinery: only with ORACLE_TRACE, only under nvcc.
// ===================================================================================
#if defined(ORACLE_TRACE) && defined(__CUDACC__)

// The sink pointer, set by the host before the launch. Global namespace, so its name
// in the cubin is exactly "oracle_trace_sink". In relocatable-device-code builds
// (-rdc) define ORACLE_TRACE_SINK_EXTERN in every translation unit but one.
#if defined(ORACLE_TRACE_SINK_EXTERN)
extern __device__ oracle_trace::SinkHeader* oracle_trace_sink;
extern __device__ unsigned int oracle_trace_smem_poison[4];
#else
__device__ oracle_trace::SinkHeader* oracle_trace_sink;
// Shared-memory poison, set by the host before the launch: {enabled, pattern, CTAs that
// applied it, 0}. Zero (the default) leaves shared memory as the hardware hands it over.
__device__ unsigned int oracle_trace_smem_poison[4];
#endif

namespace oracle_trace {

namespace detail {

ORACLE_TRACE_DEVICE uint32_t round_up(uint32_t x, uint32_t a) { return (x + a - 1) / a * a; }

ORACLE_TRACE_DEVICE uint32_t linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

ORACLE_TRACE_DEVICE uint32_t block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

ORACLE_TRACE_DEVICE uint32_t linear_cta() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

ORACLE_TRACE_DEVICE uint32_t lane_id() {
  uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// The sink if it is set and initialised by a harness of this format version.
ORACLE_TRACE_DEVICE SinkHeader* sink() {
  SinkHeader* h = oracle_trace_sink;
  if (h == nullptr) return nullptr;
  if (h->magic != kMagic || h->version != kVersion) return nullptr;
  return h;
}

ORACLE_TRACE_DEVICE bool tile_selected(const SinkHeader* h, int tile_m, int tile_n) {
  uint32_t n = h->n_tiles < kMaxTiles ? h->n_tiles : kMaxTiles;
  for (uint32_t i = 0; i < n; ++i) {
    const TileSelector s = h->tiles[i];
    if ((s.tile_m < 0 || s.tile_m == tile_m) && (s.tile_n < 0 || s.tile_n == tile_n)) return true;
  }
  return false;
}

ORACLE_TRACE_DEVICE bool kblock_selected(const SinkHeader* h, int k_block) {
  if (k_block < 0) return true;  // the stage has no k-block (epilogue)
  if (h->flags & kFlagAllKBlocks) return true;
  const long long d = static_cast<long long>(k_block) - h->kb_base;
  if (d < 0 || d >= static_cast<long long>(kKBlockWindow)) return false;
  return (h->kb_bits[d >> 5] >> (d & 31)) & 1u;
}

ORACLE_TRACE_DEVICE bool stage_selected(const SinkHeader* h, Stage s) {
  return (h->stage_mask >> static_cast<uint32_t>(s)) & 1u;
}

ORACLE_TRACE_DEVICE bool group_selected(const SinkHeader* h, int group) {
  const uint32_t n = h->n_groups < kMaxGroups ? h->n_groups : kMaxGroups;
  if (n == 0 || group < 0) return true;  // no selection, or a site of no group
  for (uint32_t i = 0; i < n; ++i) {
    if (h->groups[i] == group) return true;
  }
  return false;
}

ORACLE_TRACE_DEVICE bool site_selected(const SinkHeader* h, Stage s, const Site& site) {
  return stage_selected(h, s) && group_selected(h, site.group) && tile_selected(h, site.tile_m, site.tile_n) &&
         kblock_selected(h, site.k_block);
}

ORACLE_TRACE_DEVICE void store_commit(unsigned char* rec, RecordKind kind) {
  __threadfence_system();  // the body reaches memory (host-mapped too) before the commit
  *reinterpret_cast<volatile uint32_t*>(rec + 4) = static_cast<uint32_t>(kind) | (kCommitTag << 16);
  __threadfence_system();
}

// Reserve `bytes` (a multiple of kRecordAlign) in the record area; nullptr if it does
// not fit, in which case the record is counted as dropped (in total and for its stage).
// The one reservation that straddles the end of the area closes it with a Pad record,
// so that every byte up to the end is accounted for.
ORACLE_TRACE_DEVICE unsigned char* reserve(SinkHeader* h, uint32_t bytes, Stage stage) {
  const unsigned long long area = h->capacity - h->header_bytes;
  const unsigned long long off = atomicAdd(&h->cursor, static_cast<unsigned long long>(bytes));
  unsigned char* base = reinterpret_cast<unsigned char*>(h) + h->header_bytes;
  if (off + bytes > area) {
    atomicAdd(&h->dropped, 1u);
    atomicAdd(&h->dropped_by_stage[static_cast<uint32_t>(stage) % kStageCounters], 1u);
    if (off < area) {
      unsigned char* pad = base + off;
      *reinterpret_cast<volatile uint32_t*>(pad) = static_cast<uint32_t>(area - off);
      store_commit(pad, RecordKind::Pad);
    }
    return nullptr;
  }
  unsigned char* rec = base + off;
  *reinterpret_cast<volatile uint32_t*>(rec) = bytes;  // size first: a crash leaves it skippable
  return rec;
}

ORACLE_TRACE_DEVICE void write_head(unsigned char* rec, Stage stage, DType dtype, const Site& site,
                                    int shape_rows, int shape_cols) {
  RecordHead* r = reinterpret_cast<RecordHead*>(rec);
  r->stage = static_cast<uint8_t>(stage);
  r->dtype = static_cast<uint8_t>(dtype);
  r->reserved = 0;
  r->thread = linear_thread();
  r->cta = linear_cta();
  r->tile_m = site.tile_m;
  r->tile_n = site.tile_n;
  r->k_block = site.k_block;
  r->slot = site.slot;
  r->shape_rows = static_cast<uint16_t>(shape_rows);
  r->shape_cols = static_cast<uint16_t>(shape_cols);
  r->partial = site.partial;
  r->group = site.group;
}

// Warp-cooperative reservation: the lowest active lane reserves, all get the pointer.
struct WarpSlot {
  unsigned mask;
  uint32_t rank;   // rank of this lane among the active lanes
  uint32_t count;  // active lanes
  uint32_t leader;
};

ORACLE_TRACE_DEVICE WarpSlot warp_slot() {
  WarpSlot w;
  w.mask = __activemask();
  const uint32_t lane = lane_id();
  w.rank = __popc(w.mask & ((1u << lane) - 1u));
  w.count = __popc(w.mask);
  w.leader = __ffs(w.mask) - 1;
  return w;
}

ORACLE_TRACE_DEVICE unsigned char* warp_reserve(SinkHeader* h, const WarpSlot& w, uint32_t bytes, Stage stage) {
  unsigned long long p = 0;
  if (w.rank == 0) p = reinterpret_cast<unsigned long long>(reserve(h, bytes, stage));
  p = __shfl_sync(w.mask, p, w.leader);
  return reinterpret_cast<unsigned char*>(p);
}

ORACLE_TRACE_DEVICE void warp_commit(const WarpSlot& w, unsigned char* rec, RecordKind kind) {
  __threadfence_system();
  __syncwarp(w.mask);
  if (w.rank == 0) store_commit(rec, kind);
}

}  // namespace detail

// Is output tile (tile_m, tile_n) at k-block k_block recorded? (k_block = kNone: any.)
ORACLE_TRACE_DEVICE bool selected(int tile_m, int tile_n, int k_block = kNone) {
  const SinkHeader* h = detail::sink();
  return h != nullptr && detail::tile_selected(h, tile_m, tile_n) && detail::kblock_selected(h, k_block);
}

// Is this stage of this site recorded?
ORACLE_TRACE_DEVICE bool selected(Stage stage, const Site& site) {
  const SinkHeader* h = detail::sink();
  return h != nullptr && detail::site_selected(h, stage, site);
}

// One thread taps `count` elements it holds: element(i) returns Element<T>{row, col,
// value} with (row, col) inside the [tile_rows, tile_cols] tile. With a constant count
// the loop unrolls and register arrays stay in registers.
template <class F>
ORACLE_TRACE_DEVICE void tap_elements(Stage stage, const Site& site, int tile_rows, int tile_cols, int count,
                                      F&& element) {
  using T = decltype(element(0).value);
  constexpr DType dtype = dtype_of<T>::value;
  static_assert(sizeof(T) == dtype_size(dtype), "value type size does not match its trace dtype");
  SinkHeader* h = detail::sink();
  if (h == nullptr || count <= 0 || !detail::site_selected(h, stage, site)) return;
  const uint32_t n = static_cast<uint32_t>(count);
  const uint32_t bytes =
      detail::round_up(kRecordHeadBytes + sizeof(ElementsBody) + n * 4u + n * sizeof(T), kRecordAlign);
  unsigned char* rec = detail::reserve(h, bytes, stage);
  if (rec == nullptr) return;
  detail::write_head(rec, stage, dtype, site, tile_rows, tile_cols);
  ElementsBody* body = reinterpret_cast<ElementsBody*>(rec + kRecordHeadBytes);
  body->count = n;
  body->reserved = 0;
  uint32_t* coords = reinterpret_cast<uint32_t*>(rec + kRecordHeadBytes + sizeof(ElementsBody));
  T* values = reinterpret_cast<T*>(rec + kRecordHeadBytes + sizeof(ElementsBody) + n * 4u);
#pragma unroll
  for (int i = 0; i < count; ++i) {
    const Element<T> e = element(i);
    coords[i] = static_cast<uint32_t>(static_cast<uint16_t>(e.row)) |
                (static_cast<uint32_t>(static_cast<uint16_t>(e.col)) << 16);
    values[i] = e.value;
  }
  detail::store_commit(rec, RecordKind::Elements);
}

// Whole warps of a group tap a logical [rows, cols] tile from shared (or global)
// memory: value (r, c) is smem[layout(r, c)]. Each warp writes one Block record with
// a band of rows. The group is the CTA unless given: group_thread is the linear index
// of this thread in the group (consecutive 32 form a warp), group_size its size. All
// threads of the group must call it with the same arguments; the caller synchronises
// before (the tile is complete) and must not overwrite it until every thread returned.
template <class T, class Layout>
ORACLE_TRACE_DEVICE void tap_smem_tile(Stage stage, const Site& site, const T* smem, int rows, int cols,
                                       Layout layout, int group_thread = -1, int group_size = -1) {
  constexpr DType dtype = dtype_of<T>::value;
  static_assert(sizeof(T) == dtype_size(dtype), "value type size does not match its trace dtype");
  SinkHeader* h = detail::sink();
  if (h == nullptr || rows <= 0 || cols <= 0 || !detail::site_selected(h, stage, site)) return;
  if (group_thread < 0) {
    group_thread = static_cast<int>(detail::linear_thread());
    group_size = static_cast<int>(detail::block_threads());
  }
  const int warps = (group_size + 31) / 32;
  const int warp = group_thread / 32;
  const int per_warp = (rows + warps - 1) / warps;
  const int r0 = warp * per_warp;
  const int r1 = (r0 + per_warp < rows) ? r0 + per_warp : rows;
  if (r0 >= r1) return;
  const detail::WarpSlot w = detail::warp_slot();
  const uint32_t n = static_cast<uint32_t>((r1 - r0) * cols);
  const uint32_t bytes = detail::round_up(kRecordHeadBytes + sizeof(BlockBody) + n * sizeof(T), kRecordAlign);
  unsigned char* rec = detail::warp_reserve(h, w, bytes, stage);
  if (rec == nullptr) return;
  if (w.rank == 0) {
    detail::write_head(rec, stage, dtype, site, rows, cols);
    BlockBody* body = reinterpret_cast<BlockBody*>(rec + kRecordHeadBytes);
    body->row0 = static_cast<uint16_t>(r0);
    body->col0 = 0;
    body->rows = static_cast<uint16_t>(r1 - r0);
    body->cols = static_cast<uint16_t>(cols);
  }
  T* values = reinterpret_cast<T*>(rec + kRecordHeadBytes + sizeof(BlockBody));
  for (uint32_t e = w.rank; e < n; e += w.count) {
    const int r = r0 + static_cast<int>(e) / cols;
    const int c = static_cast<int>(e) % cols;
    values[e] = smem[layout(r, c)];
  }
  detail::warp_commit(w, rec, RecordKind::Block);
}

// Whole warps of a group tap the raw byte image [smem, smem + nbytes) of one operand
// tile (stage DescriptorA / DescriptorB): the swizzled shared-memory layout as the
// hardware wrote it. dtype and [tile_rows, tile_cols] describe the operand tile the
// image holds. Same calling rules as tap_smem_tile.
ORACLE_TRACE_DEVICE void tap_smem_bytes(Stage stage, const Site& site, const void* smem, uint32_t nbytes,
                                        DType dtype, int tile_rows, int tile_cols, int group_thread = -1,
                                        int group_size = -1) {
  SinkHeader* h = detail::sink();
  if (h == nullptr || nbytes == 0 || !detail::site_selected(h, stage, site)) return;
  if (group_thread < 0) {
    group_thread = static_cast<int>(detail::linear_thread());
    group_size = static_cast<int>(detail::block_threads());
  }
  const uint32_t warps = static_cast<uint32_t>((group_size + 31) / 32);
  const uint32_t warp = static_cast<uint32_t>(group_thread / 32);
  const uint32_t per_warp = detail::round_up((nbytes + warps - 1) / warps, 16u);
  const uint32_t o0 = warp * per_warp;
  const uint32_t o1 = (o0 + per_warp < nbytes) ? o0 + per_warp : nbytes;
  if (o0 >= o1) return;
  const detail::WarpSlot w = detail::warp_slot();
  const uint32_t len = o1 - o0;
  const uint32_t bytes = detail::round_up(kRecordHeadBytes + sizeof(BytesBody) + len, kRecordAlign);
  unsigned char* rec = detail::warp_reserve(h, w, bytes, stage);
  if (rec == nullptr) return;
  if (w.rank == 0) {
    detail::write_head(rec, stage, dtype, site, tile_rows, tile_cols);
    BytesBody* body = reinterpret_cast<BytesBody*>(rec + kRecordHeadBytes);
    body->offset = o0;
    body->nbytes = len;
    body->total_bytes = nbytes;
    body->reserved = 0;
  }
  unsigned char* data = rec + kRecordHeadBytes + sizeof(BytesBody);
  const unsigned char* src = static_cast<const unsigned char*>(smem) + o0;
  if (((reinterpret_cast<uintptr_t>(src) | len) & 3u) == 0) {
    for (uint32_t i = w.rank; i < len / 4; i += w.count)
      reinterpret_cast<uint32_t*>(data)[i] = reinterpret_cast<const uint32_t*>(src)[i];
  } else {
    for (uint32_t i = w.rank; i < len; i += w.count) data[i] = src[i];
  }
  detail::warp_commit(w, rec, RecordKind::Bytes);
}

// One thread records the fields of a TMA descriptor as the kernel built (or received)
// them, innermost dimension first: dims[rank], strides[rank - 1] in bytes, box[rank],
// element_strides[rank]. Recorded if the stage DescriptorA/B is selected; call it
// from one thread of one CTA.
ORACLE_TRACE_DEVICE void tap_descriptor(Operand operand, DType dtype, int rank, const uint64_t* dims,
                                        const uint64_t* strides, const uint32_t* box,
                                        const uint32_t* element_strides, int swizzle_bytes, OobFill oob_fill) {
  SinkHeader* h = detail::sink();
  const Stage stage = operand == Operand::A ? Stage::DescriptorA : Stage::DescriptorB;
  if (h == nullptr || rank < 1 || rank > 5 || !detail::stage_selected(h, stage)) return;
  const uint32_t bytes = kRecordHeadBytes + sizeof(DescriptorBody);
  unsigned char* rec = detail::reserve(h, bytes, stage);
  if (rec == nullptr) return;
  detail::write_head(rec, stage, dtype, Site{kNone, kNone, kNone, kNone, kNone, kNone}, 0, 0);
  DescriptorBody* body = reinterpret_cast<DescriptorBody*>(rec + kRecordHeadBytes);
  body->operand = static_cast<uint8_t>(operand);
  body->rank = static_cast<uint8_t>(rank);
  body->swizzle_bytes = static_cast<uint16_t>(swizzle_bytes);
  body->oob_fill = static_cast<uint8_t>(oob_fill);
  body->reserved[0] = body->reserved[1] = body->reserved[2] = 0;
  for (int i = 0; i < 5; ++i) {
    body->dims[i] = i < rank ? dims[i] : 0;
    body->box[i] = i < rank ? box[i] : 0;
    body->element_strides[i] = i < rank ? element_strides[i] : 0;
    if (i < 4) body->strides[i] = i < rank - 1 ? strides[i] : 0;
  }
  detail::store_commit(rec, RecordKind::Descriptor);
}

// Shared-memory poison prologue: the kernel calls it first thing (every thread of the CTA,
// before any shared memory is written). When the host enabled it (oracle_trace_smem_poison[0]
// != 0), the CTA's whole dynamic shared memory is filled with the 32-bit pattern
// oracle_trace_smem_poison[1] and the CTA is counted in oracle_trace_smem_poison[2], so the
// host knows it happened. Two runs with two patterns then show every read of shared memory the
// kernel never wrote as a changed output. Static __shared__ arrays are not filled.
ORACLE_TRACE_DEVICE void smem_prologue() {
  const volatile unsigned int* cfg = oracle_trace_smem_poison;
  if (cfg[0] == 0u) return;
  const unsigned int pattern = cfg[1];
  extern __shared__ __align__(16) unsigned int oracle_trace_dynamic_smem[];
  uint32_t bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  const uint32_t words = bytes / 4u;
  for (uint32_t i = detail::linear_thread(); i < words; i += detail::block_threads()) oracle_trace_dynamic_smem[i] = pattern;
  __syncthreads();
  if (detail::linear_thread() == 0) atomicAdd(&oracle_trace_smem_poison[2], 1u);
}

// The live gate: forwards to the functions above.
template <>
struct Tracer<true> {
  ORACLE_TRACE_DEVICE static void smem_prologue() { oracle_trace::smem_prologue(); }
  static constexpr bool enabled = true;
  ORACLE_TRACE_DEVICE static bool selected(int tile_m, int tile_n, int k_block = kNone) {
    return oracle_trace::selected(tile_m, tile_n, k_block);
  }
  ORACLE_TRACE_DEVICE static bool selected(Stage stage, const Site& site) { return oracle_trace::selected(stage, site); }
  template <class F>
  ORACLE_TRACE_DEVICE static void tap_elements(Stage stage, const Site& site, int tile_rows, int tile_cols, int count,
                                               F&& element) {
    oracle_trace::tap_elements(stage, site, tile_rows, tile_cols, count, static_cast<F&&>(element));
  }
  template <class T, class Layout>
  ORACLE_TRACE_DEVICE static void tap_smem_tile(Stage stage, const Site& site, const T* smem, int rows, int cols,
                                                Layout layout, int group_thread = -1, int group_size = -1) {
    oracle_trace::tap_smem_tile(stage, site, smem, rows, cols, layout, group_thread, group_size);
  }
  ORACLE_TRACE_DEVICE static void tap_smem_bytes(Stage stage, const Site& site, const void* smem, uint32_t nbytes,
                                                 DType dtype, int tile_rows, int tile_cols, int group_thread = -1,
                                                 int group_size = -1) {
    oracle_trace::tap_smem_bytes(stage, site, smem, nbytes, dtype, tile_rows, tile_cols, group_thread, group_size);
  }
  ORACLE_TRACE_DEVICE static void tap_descriptor(Operand operand, DType dtype, int rank, const uint64_t* dims,
                                                 const uint64_t* strides, const uint32_t* box,
                                                 const uint32_t* element_strides, int swizzle_bytes,
                                                 OobFill oob_fill) {
    oracle_trace::tap_descriptor(operand, dtype, rank, dims, strides, box, element_strides, swizzle_bytes, oob_fill);
  }
};

// Host, CUDA runtime API: point this translation unit's sink at `ptr` (device memory,
// or the device pointer of host-mapped pinned memory already initialised with the
// header; nullptr switches tracing off). `static`: each translation unit has its own
// oracle_trace_sink (without -rdc), so call the set_sink of the unit holding the kernel.
static inline cudaError_t set_sink(void* ptr) {
  SinkHeader* p = static_cast<SinkHeader*>(ptr);
  return cudaMemcpyToSymbol(oracle_trace_sink, &p, sizeof(p));
}

}  // namespace oracle_trace

#endif  // ORACLE_TRACE && __CUDACC__

#undef ORACLE_TRACE_DEVICE
#undef ORACLE_TRACE_HD

#endif  // ORACLE_TRACE_TRACE_CUH_

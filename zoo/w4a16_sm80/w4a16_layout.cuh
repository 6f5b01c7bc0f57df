// w4a16_layout.cuh -- the index maps of the zoo's W4A16 GEMM (w4a16_gemm.cu), in one place.
//
// constexpr __host__ __device__ functions of plain ints: the kernel uses them on the device, the
// static_asserts at the bottom check them at compile time, and a host program can print them.
//
// CTA tile 64 x 128, k-block 64 (half a quantisation group of 128), 2 pipeline slots, 8 warps as
// 2 (m) x 4 (n), warp tile 32 x 32 = 2 x 4 mma.sync.m16n8k16 tiles, four k16 steps per k-block.
//
// Shared memory, per slot: the A tile [64 m][64 k] fp16, rows padded to 72 elements (144 bytes:
// 16-byte aligned rows for ldmatrix, consecutive rows in other banks), then the packed B tile
// [128 n][32 bytes]: byte j of row n holds k = 2j (low nibble) and k = 2j + 1 (high nibble) of
// column n, as in global memory.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", f16), g = lane >> 2, t = lane & 3:
//   A: ldmatrix.x4 as in the zoo's sm80 GEMM (lane row address (l & 15, 8 (l >> 4))).
//   B (16 x 8, col): reg 0 = (k 2t, 2t+1; n g), reg 1 = (k 2t+8, 2t+9; n g): each register's two
//   k values are the two nibbles of one packed byte (byte 8 ks + t, resp. 8 ks + 4 + t, of the
//   k-block's row n), so a thread dequantises its B fragment from two bytes, in registers.
//   C/D fp32: c0, c1 at (g, 2t), (g, 2t+1); c2, c3 at (g + 8, ...).

#ifndef ZOO_W4A16_LAYOUT_CUH_
#define ZOO_W4A16_LAYOUT_CUH_

#if defined(__CUDACC__)
#define ZOO_HD __host__ __device__ __forceinline__
#else
#define ZOO_HD inline
#endif

namespace zoo_w4a16 {

constexpr int kBM = 64, kBN = 128, kBK = 64;  // CTA tile and k-block
constexpr int kGroup = 128;                   // quantisation group along K
constexpr int kStages = 2;
constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kWarps = kWarpsM * kWarpsN;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;  // 32 x 32
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kFragsM = kWarpM / kMmaM;  // 2
constexpr int kFragsN = kWarpN / kMmaN;  // 4
constexpr int kKSteps = kBK / kMmaK;     // 4
constexpr int kAcc = kFragsM * kFragsN * 4;  // 32 accumulator elements per thread
constexpr int kALd = kBK + 8;                // A row stride in shared memory (elements)
constexpr int kBRowBytes = kBK / 2;          // packed B: bytes per n and k-block
constexpr int kTileABytes = kBM * kALd * 2;
constexpr int kTileBBytes = kBN * kBRowBytes;
constexpr int kStageBytes = kTileABytes + kTileBBytes;
constexpr int kSmemBytes = kStages * kStageBytes;  // 26624: dynamic shared memory
constexpr int kChunksA = kBM * kBK / 8;            // 16-byte chunks of the A tile (8 fp16)
constexpr int kChunksB = kBN * kBRowBytes / 16;    // 16-byte chunks of the packed B tile
constexpr int kCopiesA = kChunksA / kThreads;      // per thread and k-block
constexpr int kCopiesB = kChunksB / kThreads;
constexpr int kDequantTap = kFragsN * 4;           // B values a thread dequantises per k16 step

static_assert(kGroup % kBK == 0, "a k-block lies inside one group");
static_assert(kChunksA % kThreads == 0 && kChunksB % kThreads == 0, "copy split");
static_assert((kALd * 2) % 16 == 0 && kTileABytes % 16 == 0 && kBRowBytes % 16 == 0, "16-byte alignment");

ZOO_HD constexpr int a_offset(int r, int c) { return r * kALd + c; }        // elements
ZOO_HD constexpr int b_offset(int n, int kbyte) { return n * kBRowBytes + kbyte; }  // bytes

ZOO_HD constexpr int warp_row0(int warp) { return (warp / kWarpsN) * kWarpM; }
ZOO_HD constexpr int warp_col0(int warp) { return (warp % kWarpsN) * kWarpN; }

ZOO_HD constexpr int a_ldm_row(int warp, int lane, int mi) { return warp_row0(warp) + mi * kMmaM + (lane & 15); }
ZOO_HD constexpr int a_ldm_col(int lane, int ks) { return ks * kMmaK + (lane >> 4) * 8; }

// B fragment ni of `lane` at step ks, register r (0, 1): its column n in the tile and the k (in
// the k-block) of its low half; the high half is k + 1, the other nibble of the same byte.
ZOO_HD constexpr int b_frag_col(int warp, int lane, int ni) { return warp_col0(warp) + ni * kMmaN + (lane >> 2); }
ZOO_HD constexpr int b_frag_k(int lane, int ks, int r) { return ks * kMmaK + r * 8 + 2 * (lane & 3); }

// Element j of the dequantised values of one k16 step (j = (ni * 2 + r) * 2 + h): (k, n) in the tile.
ZOO_HD constexpr int dq_k(int lane, int ks, int j) { return b_frag_k(lane, ks, (j >> 1) & 1) + (j & 1); }
ZOO_HD constexpr int dq_n(int warp, int lane, int j) { return b_frag_col(warp, lane, j >> 2); }

ZOO_HD constexpr int acc_row(int warp, int lane, int i) {
  return warp_row0(warp) + (i / (kFragsN * 4)) * kMmaM + (lane >> 2) + ((i & 3) >> 1) * 8;
}
ZOO_HD constexpr int acc_col(int warp, int lane, int i) {
  return warp_col0(warp) + ((i / 4) % kFragsN) * kMmaN + ((lane & 3) << 1) + (i & 1);
}

// Copy j of thread tid: A (row, chunk of 8 elements), B (row n, chunk of 16 bytes).
ZOO_HD constexpr int copy_a_row(int tid, int j) { return (tid + j * kThreads) / (kBK / 8); }
ZOO_HD constexpr int copy_a_chunk(int tid, int j) { return (tid + j * kThreads) % (kBK / 8); }
ZOO_HD constexpr int copy_b_row(int tid, int j) { return (tid + j * kThreads) / (kBRowBytes / 16); }
ZOO_HD constexpr int copy_b_chunk(int tid, int j) { return (tid + j * kThreads) % (kBRowBytes / 16); }

namespace check {

constexpr bool acc_is_bijection() {
  bool seen[kBM * kBN] = {};
  for (int w = 0; w < kWarps; ++w)
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < kAcc; ++i) {
        const int r = acc_row(w, l, i), c = acc_col(w, l, i);
        if (r < 0 || r >= kBM || c < 0 || c >= kBN || seen[r * kBN + c]) return false;
        seen[r * kBN + c] = true;
      }
  return true;
}

// The warps of one m row (warp_m 0) dequantise every (k, n) of the B tile exactly once per k-block.
constexpr bool dequant_covers_b() {
  bool seen[kBK * kBN] = {};
  for (int w = 0; w < kWarpsN; ++w)
    for (int l = 0; l < 32; ++l)
      for (int ks = 0; ks < kKSteps; ++ks)
        for (int j = 0; j < kDequantTap; ++j) {
          const int k = dq_k(l, ks, j), n = dq_n(w, l, j);
          if (k < 0 || k >= kBK || n < 0 || n >= kBN || seen[k * kBN + n]) return false;
          seen[k * kBN + n] = true;
        }
  return true;
}

constexpr bool copies_cover() {
  bool a[kBM * (kBK / 8)] = {}, b[kBN * (kBRowBytes / 16)] = {};
  for (int t = 0; t < kThreads; ++t) {
    for (int j = 0; j < kCopiesA; ++j) {
      const int i = copy_a_row(t, j) * (kBK / 8) + copy_a_chunk(t, j);
      if (a[i]) return false;
      a[i] = true;
    }
    for (int j = 0; j < kCopiesB; ++j) {
      const int i = copy_b_row(t, j) * (kBRowBytes / 16) + copy_b_chunk(t, j);
      if (b[i]) return false;
      b[i] = true;
    }
  }
  for (bool x : a) if (!x) return false;
  for (bool x : b) if (!x) return false;
  return true;
}

static_assert(acc_is_bijection(), "the accumulator fragments do not tile the CTA tile");
static_assert(dequant_covers_b(), "the dequantised fragments do not tile the B tile");
static_assert(copies_cover(), "the copies miss or repeat a chunk");

}  // namespace check
}  // namespace zoo_w4a16

#endif  // ZOO_W4A16_LAYOUT_CUH_

// sm80_layout.cuh -- the index maps of the zoo's sm80 GEMM (sm80_gemm.cu), in one place.
//
// Everything here is a constexpr __host__ __device__ function of plain ints, so the kernel uses
// it on the device, the static_asserts at the bottom check it at compile time, and a host
// program can print it for a model of the PTX instructions (tests/cpu/test_zoo_build.py).
// No CUDA header is needed: without nvcc the functions are plain C++.
//
// CTA tile 128 x 128, k-block 32, 4 pipeline stages, 8 warps as 2 (m) x 4 (n), warp tile
// 64 x 32 = 4 x 4 mma.sync.m16n8k16 tiles, two k16 steps per k-block.
//
// Shared memory, per stage: the A tile [128 m][32 k] then the B tile [128 n][32 k], both k
// contiguous (A is row-major [M, K], B row-major [N, K]). A row of 32 two-byte elements is
// 64 bytes = four 16-byte chunks; chunk c of row r is stored at chunk c ^ ((r >> 1) & 3).
// That is the 64-byte swizzle of TMA / CuTe Swizzle<2,4,3> (byte a -> a ^ (((a >> 7) & 3) << 4))
// on 64-byte rows: the eight rows one ldmatrix 8x8 matrix reads, and the 32 chunks one warp
// copies, fall in distinct banks.
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", 16-bit A/B types), with
// g = lane >> 2 (group) and t = lane & 3 (thread in group):
//   A (16 x 16, row): 4 .b32 registers, two elements each (lower half = lower column):
//       reg 0: (g,     2t..2t+1)   reg 1: (g + 8, 2t..2t+1)
//       reg 2: (g,     2t+8..2t+9) reg 3: (g + 8, 2t+8..2t+9)
//   B (16 x 8, col): 2 .b32 registers: reg 0: (k = 2t..2t+1, n = g), reg 1: (k = 2t+8..2t+9, n = g)
//   C/D (16 x 8), fp32: c0, c1 at (g, 2t), (g, 2t+1); c2, c3 at (g + 8, 2t), (g + 8, 2t+1)
//       (fp16 accumulators: the same four elements packed as two f16x2 registers).
// ldmatrix.m8n8.x4 (b16): lanes 8j..8j+7 give the row addresses of matrix j (16 bytes each) and
// register j of lane l receives row l >> 2, columns 2(l & 3), 2(l & 3) + 1 of matrix j (with
// .trans: column l >> 2, rows 2(l & 3), 2(l & 3) + 1). So for A the lane's row address is
// (row l & 15, k 8 (l >> 4)) of the 16 x 16 fragment: matrices 0..3 = (rows 0-7, k 0-7),
// (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = registers 0..3 above. For B
// (stored n-major, one smem row per n) one x4 loads two n8 fragments: matrices 0..3 =
// (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15), i.e. the lane's address is
// (n (l & 7) + 8 (l >> 4), k 8 ((l >> 3) & 1)); registers 0, 1 are the first fragment's, 2, 3
// the second's.
// Accumulator element i of a thread (i = (mi * 4 + ni) * 4 + e, mi the m16 tile, ni the n8 tile
// of its warp, e the C-fragment element) sits at tile row
//   warp_m * 64 + 16 mi + g + 8 (e >> 1) and column warp_n * 32 + 8 ni + 2t + (e & 1).

#ifndef ZOO_SM80_LAYOUT_CUH_
#define ZOO_SM80_LAYOUT_CUH_

#if defined(__CUDACC__)
#define ZOO_HD __host__ __device__ __forceinline__
#else
#define ZOO_HD inline
#endif

namespace zoo_sm80 {

constexpr int kBM = 128, kBN = 128, kBK = 32;  // CTA tile and k-block
constexpr int kStages = 4;                     // shared-memory pipeline slots
constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kWarps = kWarpsM * kWarpsN;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;  // 64 x 32
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kFragsM = kWarpM / kMmaM;  // 4 m16 tiles per warp
constexpr int kFragsN = kWarpN / kMmaN;  // 4 n8 tiles per warp
constexpr int kKSteps = kBK / kMmaK;     // 2 k16 steps per k-block
constexpr int kAcc = kFragsM * kFragsN * 4;  // 64 accumulator elements per thread
constexpr int kChunk = 8;                    // elements of one 16-byte chunk (two-byte types)
constexpr int kChunksPerRow = kBK / kChunk;  // 4
constexpr int kTileAElems = kBM * kBK;
constexpr int kTileBElems = kBN * kBK;
constexpr int kStageElems = kTileAElems + kTileBElems;
constexpr int kElemBytes = 2;
constexpr int kSmemBytes = kStages * kStageElems * kElemBytes;  // 65536: dynamic shared memory
constexpr int kCopiesA = kBM * kChunksPerRow / kThreads;       // 16-byte chunks per thread and k-block
constexpr int kCopiesB = kBN * kChunksPerRow / kThreads;

static_assert(kBM == kBN, "the swapped_store defect stores a tile at (tn, tm): square tiles");
static_assert(kBK % kMmaK == 0 && kWarpM % kMmaM == 0 && kWarpN % (2 * kMmaN) == 0, "warp tiling");
static_assert(kChunksPerRow == 4, "the swizzle below is written for 64-byte rows");
static_assert(kBM * kChunksPerRow % kThreads == 0 && kBN * kChunksPerRow % kThreads == 0, "copy split");

// Element offset of (r, c) in an operand tile [rows][kBK] (r = m for A, n for B; c = k).
ZOO_HD constexpr int smem_offset(int r, int c) {
  return r * kBK + ((((c >> 3) ^ (r >> 1)) & 3) << 3) + (c & 7);
}

// What an MMA reading the tile with ldmatrix .trans sees at (r, c): every aligned 8 x 8 block
// transposed in place (the transposed_a defect, and its load_a tap).
ZOO_HD constexpr int smem_offset_t8(int r, int c) { return smem_offset((r & ~7) | (c & 7), (c & ~7) | (r & 7)); }

ZOO_HD constexpr int warp_row0(int warp) { return (warp / kWarpsN) * kWarpM; }
ZOO_HD constexpr int warp_col0(int warp) { return (warp % kWarpsN) * kWarpN; }

// ldmatrix.x4 row address of `lane` for A fragment mi at k16 step ks: tile (row, k).
ZOO_HD constexpr int a_ldm_row(int warp, int lane, int mi) { return warp_row0(warp) + mi * kMmaM + (lane & 15); }
ZOO_HD constexpr int a_ldm_col(int lane, int ks) { return ks * kMmaK + (lane >> 4) * 8; }

// ldmatrix.x4 row address of `lane` for the B fragments 2p and 2p + 1 at step ks: tile (n, k).
ZOO_HD constexpr int b_ldm_row(int warp, int lane, int p) {
  return warp_col0(warp) + p * 2 * kMmaN + (lane & 7) + ((lane >> 4) << 3);
}
ZOO_HD constexpr int b_ldm_col(int lane, int ks) { return ks * kMmaK + ((lane >> 3) & 1) * 8; }

// Accumulator element i of `lane` in `warp`: its (row, col) in the CTA tile.
ZOO_HD constexpr int acc_row(int warp, int lane, int i) {
  return warp_row0(warp) + (i / (kFragsN * 4)) * kMmaM + (lane >> 2) + ((i & 3) >> 1) * 8;
}
ZOO_HD constexpr int acc_col(int warp, int lane, int i) {
  return warp_col0(warp) + ((i / 4) % kFragsN) * kMmaN + ((lane & 3) << 1) + (i & 1);
}

// Global -> shared copies: chunk j of thread tid covers tile row copy_row, chunk copy_chunk
// (elements 8 copy_chunk .. 8 copy_chunk + 7 of the k-block).
ZOO_HD constexpr int copy_row(int tid, int j) { return (tid + j * kThreads) / kChunksPerRow; }
ZOO_HD constexpr int copy_chunk(int tid, int j) { return (tid + j * kThreads) % kChunksPerRow; }

namespace check {

// smem_offset maps the [rows][kBK] tile onto [0, rows * kBK) one to one, chunk by chunk.
constexpr bool smem_is_bijection(int rows) {
  bool seen[kBM * kBK] = {};
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < kBK; ++c) {
      const int o = smem_offset(r, c);
      if (o < 0 || o >= rows * kBK || seen[o]) return false;
      if ((o & 7) != (c & 7)) return false;  // a chunk stays whole and in order
      seen[o] = true;
    }
  return true;
}

// The accumulator map covers the CTA tile exactly once over all warps, lanes and elements.
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

// The copies of one k-block cover every chunk of the A and the B tile exactly once.
constexpr bool copies_cover(int rows, int copies) {
  bool seen[kBM * kChunksPerRow] = {};
  for (int t = 0; t < kThreads; ++t)
    for (int j = 0; j < copies; ++j) {
      const int r = copy_row(t, j), c = copy_chunk(t, j);
      if (r < 0 || r >= rows || seen[r * kChunksPerRow + c]) return false;
      seen[r * kChunksPerRow + c] = true;
    }
  return true;
}

// The eight row addresses of each ldmatrix matrix lie in eight distinct 16-byte bank groups
// (no bank conflict), are 16-byte aligned, and stay inside the tile.
constexpr bool ldmatrix_conflict_free() {
  for (int w = 0; w < kWarps; ++w)
    for (int f = 0; f < kFragsM; ++f)
      for (int ks = 0; ks < kKSteps; ++ks)
        for (int op = 0; op < 2; ++op)
          for (int j = 0; j < 4; ++j) {
            if (op == 1 && f >= kFragsN / 2) continue;
            unsigned groups = 0;
            for (int i = 0; i < 8; ++i) {
              const int lane = 8 * j + i;
              const int o = op == 0 ? smem_offset(a_ldm_row(w, lane, f), a_ldm_col(lane, ks))
                                    : smem_offset(b_ldm_row(w, lane, f), b_ldm_col(lane, ks));
              if (o % kChunk != 0 || o < 0 || o >= kBM * kBK) return false;
              groups |= 1u << ((o / kChunk) % 8);
            }
            if (groups != 0xffu) return false;
          }
  return true;
}

static_assert(smem_is_bijection(kBM) && smem_is_bijection(kBN), "smem_offset is not a bijection");
static_assert(acc_is_bijection(), "the accumulator fragments do not tile the CTA tile");
static_assert(copies_cover(kBM, kCopiesA) && copies_cover(kBN, kCopiesB), "the copies miss or repeat a chunk");
static_assert(ldmatrix_conflict_free(), "ldmatrix addresses are misaligned or conflict");

}  // namespace check
}  // namespace zoo_sm80

#endif  // ZOO_SM80_LAYOUT_CUH_

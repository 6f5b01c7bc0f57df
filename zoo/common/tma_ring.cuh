// tma_ring.cuh -- the shared-memory ring of the zoo's TMA GEMMs for sm_90a (hopper_gemm,
// deepgemm_sm90), defined once: the storage's place in dynamic shared memory, the slots' barriers,
// and the producer's arming and loads of one k-block.
//
// A slot has a `full` barrier (one arrival, the producer's, plus the TMA's transaction bytes) and an
// `empty` barrier (the 128 threads of the consumer warpgroup). CUTLASS's cluster barriers and CuTe's
// SM90_TMA_LOAD_2D do the work.
#pragma once

#include <stdint.h>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

namespace zoo_tma {

// The storage at the first 1024-aligned byte of dynamic shared memory (only 16-byte aligned by
// itself; the swizzled tiles need 1024); a launch without room for it traps.
template <class Storage>
__device__ __forceinline__ Storage& ring_storage(unsigned char* smem_raw) {
  auto& s = *reinterpret_cast<Storage*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint32_t smem_bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(smem_bytes));
  if (smem_bytes < sizeof(Storage) + 1024) __trap();  // launched without room for the ring
  return s;
}

// Thread 0 sets up every slot's barriers; then the whole CTA meets.
template <int Stages>
__device__ __forceinline__ void init_ring(uint64_t (&full)[Stages], uint64_t (&empty)[Stages]) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < Stages; ++i) {
      cutlass::arch::ClusterTransactionBarrier::init(&full[i], 1);
      cutlass::arch::ClusterBarrier::init(&empty[i], 128);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
}

// The producer's k-block into slot `slot` of storage `s` (members a, b, full; StageA and StageB
// elements a slot): its full barrier armed with the slot's bytes, then A's box at (k, m) and B's
// at (k, n) loaded by TMA, completing on that barrier.
template <int StageA, int StageB, class Storage>
__device__ __forceinline__ void load_k_block(const CUtensorMap* tma_a, const CUtensorMap* tma_b, Storage& s, int slot,
                                             uint32_t tx_bytes, int k, int m, int n) {
  const uint64_t hint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full[slot], tx_bytes);
  cute::SM90_TMA_LOAD_2D::copy(tma_a, &s.full[slot], hint, s.a + slot * StageA, k, m);
  cute::SM90_TMA_LOAD_2D::copy(tma_b, &s.full[slot], hint, s.b + slot * StageB, k, n);
}

}  // namespace zoo_tma

// hopper_layout.cuh -- the shared-memory layouts of the zoo's Hopper GEMM (hopper_gemm.cu), apart so
// that a host program can check them (tests/cpu/test_zoo_build.py).
//
// One pipeline slot holds BM (A) or BN (B) rows of one k-block, each row 128 bytes (BK elements),
// K-major, 128-byte swizzled: the layout a TMA box (BK, BM) with CU_TENSOR_MAP_SWIZZLE_128B writes
// at a 1024-byte-aligned address, and the one WGMMA reads with a K-major SW128 descriptor. Slots
// follow each other. The element at (row, k, slot) lives at element offset
//   byte = slot * rows * 128 + row * 128 + k * sizeof(T);   (byte ^ (((byte >> 7) & 7) << 4)) / sizeof(T)
// A swizzled CuTe layout applies its swizzle through a tensor's pointer, not when evaluated on
// its own: offsets are taken through a tensor (`element_offset`).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace zoo_hopper {

template <class T, int BM, int BN, int BK, int Stages, bool MnMajorA>
struct SmemLayouts {
  // what the TMA writes
  using A = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                         cute::Shape<cute::Int<BM>, cute::Int<BK>, cute::Int<Stages>>{}));
  using B = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                         cute::Shape<cute::Int<BN>, cute::Int<BK>, cute::Int<Stages>>{}));
  // how the MMAs read A: the same, or (the transposed_a defect) an MN-major view of the same bytes
  using AMma = cute::conditional_t<
      MnMajorA,
      decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                   cute::Shape<cute::Int<BM>, cute::Int<BK>, cute::Int<Stages>>{})),
      A>;
};

// Element offset of `tensor(r, c, slot)` from `base`, the tensor's 1024-byte-aligned start.
template <class Tensor, class T>
CUTE_HOST_DEVICE int element_offset(const Tensor& tensor, const T* base, int r, int c, int slot) {
  return static_cast<int>(cute::raw_pointer_cast(&tensor(r, c, slot)) - base);
}

}  // namespace zoo_hopper

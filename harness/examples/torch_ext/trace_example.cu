// trace_example.cu -- a torch extension with a traced kernel (see harness/torch_ext.py).
//
// Built by harness.torch_ext.load_example() with torch.utils.cpp_extension.load_inline and
// the flags of harness.torch_ext.extension_cuda_flags() (-DORACLE_TRACE, the include path).
// Exported to Python:
//   tile_gemm(a, b, traced) -> d     fp32 CUDA tensors, row-major: a [M, K], b [K, N], d [M, N]
//   set_trace_sink(sink)             point this extension's oracle_trace_sink at a uint8
//                                    CUDA tensor holding harness.trace_format.sink_init_bytes
//   clear_trace_sink()               switch tracing off again (null sink)
//
// The kernel: one 16x16 output tile per CTA of 16x16 threads, k-blocks of 16, A and B tiles
// in shared memory with zero fill, each thread one fp32 accumulator. The traced
// instantiation taps (parse with block_m = block_n = block_k = 16):
//   descriptor record for A (CTA 0, thread 0): dims {K, M}, strides {4 K} bytes, box {16, 16},
//     element strides {1, 1}, no swizzle, zero fill: the TMA-style view of the A tiles below
//   descriptor_a  the raw 1024-byte shared-memory image of the A tile, per k-block (slot 0)
//   load_a [16, 16], load_b [16, 16]  the logical operand tiles, per k-block (slot 0)
//   mma [16, 16]  each thread's accumulator after each k-block
//   epilogue_cast [16, 16]  the value stored (for a ragged tile, the padding too)

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/types.h>

#include "oracle_trace/trace.cuh"

namespace trace_example {

constexpr int kTile = 16;

template <bool Trace>
__global__ void __launch_bounds__(kTile * kTile)
    tile_gemm_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ D, int M, int N,
                     int K) {
  using Tr = oracle_trace::Tracer<Trace>;
  using oracle_trace::Stage;
  __shared__ float As[kTile][kTile];
  __shared__ float Bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tile_m = blockIdx.y, tile_n = blockIdx.x;
  const int row = tile_m * kTile + ty, col = tile_n * kTile + tx;

  if constexpr (Tr::enabled) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && tx == 0 && ty == 0) {
      const uint64_t dims[2] = {static_cast<uint64_t>(K), static_cast<uint64_t>(M)};
      const uint64_t strides[1] = {static_cast<uint64_t>(K) * sizeof(float)};
      const uint32_t box[2] = {kTile, kTile};
      const uint32_t element_strides[2] = {1, 1};
      Tr::tap_descriptor(oracle_trace::Operand::A, oracle_trace::DType::F32, 2, dims, strides, box, element_strides,
                         0, oracle_trace::OobFill::Zero);
    }
  }

  float acc = 0.f;
  for (int kb = 0; kb * kTile < K; ++kb) {
    const int ka = kb * kTile + tx, kbrow = kb * kTile + ty;
    As[ty][tx] = (row < M && ka < K) ? A[static_cast<size_t>(row) * K + ka] : 0.f;
    Bs[ty][tx] = (kbrow < K && col < N) ? B[static_cast<size_t>(kbrow) * N + col] : 0.f;
    __syncthreads();
    if constexpr (Tr::enabled) {
      const oracle_trace::Site site{tile_m, tile_n, kb, 0};
      Tr::tap_smem_bytes(Stage::DescriptorA, site, &As[0][0], sizeof(As), oracle_trace::DType::F32, kTile, kTile);
      Tr::tap_smem_tile(Stage::LoadA, site, &As[0][0], kTile, kTile, oracle_trace::Strided{kTile, 1});
      Tr::tap_smem_tile(Stage::LoadB, site, &Bs[0][0], kTile, kTile, oracle_trace::Strided{kTile, 1});
    }
    for (int k = 0; k < kTile; ++k) acc = fmaf(As[ty][k], Bs[k][tx], acc);
    if constexpr (Tr::enabled) {
      Tr::tap_elements(Stage::Mma, oracle_trace::Site{tile_m, tile_n, kb}, kTile, kTile, 1,
                       [&](int) { return oracle_trace::Element<float>{ty, tx, acc}; });
    }
    __syncthreads();
  }
  if constexpr (Tr::enabled) {
    Tr::tap_elements(Stage::EpilogueCast, oracle_trace::Site{tile_m, tile_n}, kTile, kTile, 1,
                     [&](int) { return oracle_trace::Element<float>{ty, tx, acc}; });
  }
  if (row < M && col < N) D[static_cast<size_t>(row) * N + col] = acc;
}

}  // namespace trace_example

torch::Tensor tile_gemm(torch::Tensor a, torch::Tensor b, bool traced) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "tile_gemm: a and b must be CUDA tensors");
  TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32,
              "tile_gemm: a and b must be float32");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "tile_gemm: shapes must be [M, K] and [K, N]");
  const c10::cuda::CUDAGuard guard(a.device());
  a = a.contiguous();
  b = b.contiguous();
  const int M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1)), N = static_cast<int>(b.size(1));
  auto d = torch::empty({M, N}, a.options());
  const dim3 block(trace_example::kTile, trace_example::kTile);
  const dim3 grid((N + trace_example::kTile - 1) / trace_example::kTile,
                  (M + trace_example::kTile - 1) / trace_example::kTile);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (traced) {
    trace_example::tile_gemm_kernel<true>
        <<<grid, block, 0, stream>>>(a.data_ptr<float>(), b.data_ptr<float>(), d.data_ptr<float>(), M, N, K);
  } else {
    trace_example::tile_gemm_kernel<false>
        <<<grid, block, 0, stream>>>(a.data_ptr<float>(), b.data_ptr<float>(), d.data_ptr<float>(), M, N, K);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return d;
}

void set_trace_sink(torch::Tensor sink) {
  TORCH_CHECK(sink.is_cuda() && sink.scalar_type() == torch::kUInt8 && sink.dim() == 1 && sink.is_contiguous(),
              "set_trace_sink: the sink must be a contiguous 1-D uint8 CUDA tensor");
  const c10::cuda::CUDAGuard guard(sink.device());  // the symbol of the sink's device
  C10_CUDA_CHECK(oracle_trace::set_sink(sink.data_ptr()));
}

void clear_trace_sink() { C10_CUDA_CHECK(oracle_trace::set_sink(nullptr)); }  // the current device's

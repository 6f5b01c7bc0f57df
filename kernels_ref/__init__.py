"""Reference GEMM stages: independent Triton re-implementations, each with a float64 host spec.

The stages of a GEMM kernel, one module each, in pipeline order:
  descriptor  what a TMA load writes into shared memory (swizzle, boxes, out-of-bounds fill)
  load        the operand tile the MMA reads (from the operand, or from a shared-memory image)
  mma         the accumulator after every k-block (fp32, fp16, int32; fp8 promotion; block scales)
  epilogue    scale -> alpha/beta -> bias -> activation -> cast
  gemm        all of the above fused in one kernel built from the same jit helpers
The modules `kernels_ref.gemm` and `kernels_ref.epilogue` are also callable as the functions of
the same name, so `kernels_ref.gemm(a, b, ...)` and `kernels_ref.gemm.gemm_host(...)` both work.
Every stage has a Triton launcher (runs on the input's device: CUDA, or the CPU under
TRITON_INTERPRET=1), a `*_host` specification on the CPU, and `check_supported(...)` returning
the reasons a configuration cannot be modelled. Operands are logical: A [M, K], B [K, N].

Not a stage: `kernels_ref.gemm_fast` (import it by name) is a fast TMA-persistent GEMM for
Hopper, the speed peer that benchmarks set beside cuBLAS and the kernel under test.

Depends only on triton, torch and numpy; importable by any project with plain tensors.
"""

from kernels_ref import descriptor, dtypes, epilogue, gemm, load, mma
from kernels_ref.descriptor import (image_nbytes, operand_image, operand_image_host, operand_images,
                                    operand_images_host, storage_shape, swizzle, swizzle_host, tile_shape,
                                    unswizzle, unswizzle_host)
from kernels_ref.dtypes import DTYPES, DType
from kernels_ref.epilogue import (ACTIVATIONS, OUT_DTYPES, Epilogue, EpilogueSteps, apply_activation,
                                  apply_activation_host, apply_alpha_beta, apply_alpha_beta_host, apply_bias,
                                  apply_bias_host, apply_cast, apply_cast_host, apply_scale, apply_scale_host,
                                  epilogue_host)
from kernels_ref.gemm import gemm_host
from kernels_ref.load import (load_tile, load_tile_host, load_tiles, load_tiles_host, tile_from_image,
                              tile_from_image_host)
from kernels_ref.mma import (ACCS, mma_accumulate, mma_accumulate_host, mma_step, mma_step_host, mma_trajectory,
                             mma_trajectory_host, truncate_mantissa_host)

__all__ = [
    "descriptor", "dtypes", "epilogue", "gemm", "load", "mma",
    "DTYPES", "DType", "ACCS", "ACTIVATIONS", "OUT_DTYPES",
    "swizzle", "swizzle_host", "unswizzle", "unswizzle_host", "operand_image", "operand_image_host",
    "operand_images", "operand_images_host", "image_nbytes", "storage_shape", "tile_shape",
    "load_tile", "load_tile_host", "load_tiles", "load_tiles_host", "tile_from_image", "tile_from_image_host",
    "mma_step", "mma_step_host", "mma_trajectory", "mma_trajectory_host", "mma_accumulate",
    "mma_accumulate_host", "truncate_mantissa_host",
    "Epilogue", "EpilogueSteps", "apply_scale", "apply_scale_host", "apply_alpha_beta", "apply_alpha_beta_host",
    "apply_bias", "apply_bias_host", "apply_activation", "apply_activation_host", "apply_cast", "apply_cast_host",
    "epilogue_host", "gemm_host",
]

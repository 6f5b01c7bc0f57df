"""Reference GEMM stages: independent Triton re-implementations, each with a float64 host spec.

The stages of a GEMM kernel, one module each, in pipeline order:
  descriptor  what a TMA load writes into shared memory (swizzle, boxes, out-of-bounds fill)
  load        the operand tile the MMA reads (from the operand, or from a shared-memory image)
  mma         the accumulator after every k-block (fp32, fp16, int32; fp8 promotion; block scales);
              beside it `mma_params` (check_supported, the kernels' arguments), `mma_stats` (the
              statistics the bounds read) and `mma_sample` (the cross-check's sampled host spec)
  epilogue    scale -> alpha/beta -> bias -> activation -> cast, or the order a graph declares
              (`epilogue_graph`: the steps, their order and the roundings between them)
  gemm        all of the above fused in one kernel built from the same jit helpers
The modules `kernels_ref.gemm` and `kernels_ref.epilogue` are also callable as the functions of
the same name, so `kernels_ref.gemm(a, b, ...)` and `kernels_ref.gemm.gemm_host(...)` both work.
Every stage has a Triton launcher (runs on the input's device: CUDA, or the CPU under
TRITON_INTERPRET=1), a `*_host` specification on the CPU, and `check_supported(...)` returning
the reasons a configuration cannot be modelled. Operands are logical: A [M, K], B [K, N].

Attention's stages are the subpackage `kernels_ref.attention` (scores, mask, softmax_state, p, o,
normalize, combine, and the fused attention_forward), with the same contract.

Not a stage: `kernels_ref.gemm_fast` (import it by name) is a fast TMA-persistent GEMM for
Hopper, the speed peer that benchmarks set beside cuBLAS and the kernel under test.

Depends only on triton, torch and numpy; importable by any project with plain tensors. Names are
imported on first use, so `kernels_ref.dtypes` (the one dtype table) loads without torch or triton.
"""

from kernels_ref._lazy import lazy_exports

_MODULES = ("attention", "descriptor", "dtypes", "epilogue", "epilogue_graph", "gemm", "load", "mma", "mma_params",
            "mma_sample", "mma_stats")
_NAMES = {
    "descriptor": ("image_nbytes", "operand_image", "operand_image_host", "operand_images", "operand_images_host",
                   "storage_shape", "swizzle", "swizzle_host", "tile_shape", "unswizzle", "unswizzle_host"),
    "dtypes": ("DTYPES", "DType"),
    "epilogue": ("ACTIVATIONS", "OUT_DTYPES", "Epilogue", "EpilogueSteps", "GraphSteps", "apply_activation",
                 "apply_activation_host", "apply_alpha", "apply_alpha_host", "apply_alpha_beta",
                 "apply_alpha_beta_host", "apply_beta_c", "apply_beta_c_host", "apply_bias", "apply_bias_host",
                 "apply_cast", "apply_cast_host", "apply_round", "apply_round_host", "apply_scale",
                 "apply_scale_host", "epilogue_host"),
    "gemm": ("gemm_host",),
    "load": ("load_tile", "load_tile_host", "load_tiles", "load_tiles_host", "tile_from_image",
             "tile_from_image_host"),
    "mma": ("mma_accumulate", "mma_accumulate_host", "mma_step", "mma_step_host", "mma_trajectory",
            "mma_trajectory_host", "truncate_mantissa_host"),
    "mma_params": ("ACCS",),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES, _NAMES, globals())

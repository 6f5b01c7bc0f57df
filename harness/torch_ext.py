"""Tracing a kernel that lives inside a torch extension.

Data path: `make_sink` allocates the sink as a 1-D uint8 CUDA tensor holding
`sink_init_bytes` (header with the selection, zeroed records); the extension points its own
`oracle_trace_sink` at it through a two-line function compiled in the same .cu as the kernel;
the kernel runs; `read_sink` synchronises, copies back the header and the records, and parses
them into taps.

The C++ side of an extension (the same .cu as the traced kernel, built with
`extension_cuda_flags()` and `include_paths()`):

    #include "oracle_trace/trace.cuh"
    void set_trace_sink(torch::Tensor sink) {            // export it with pybind / load_inline
      const c10::cuda::CUDAGuard guard(sink.device());
      C10_CUDA_CHECK(oracle_trace::set_sink(sink.data_ptr()));
    }

and the kernel template takes a `bool Trace` and taps under `if constexpr
(oracle_trace::Tracer<Trace>::enabled)`. `oracle_trace::set_sink` exists only with
-DORACLE_TRACE, so a forgotten flag fails the build instead of silently tracing nothing.
Each translation unit (without -rdc) has its own sink symbol: call the `set_sink` of the unit
that holds the kernel. harness/examples/torch_ext/trace_example.cu is a complete example;
`load_example()` builds it.

Constraints: one sink per device and extension at a time (the symbol is a global); reuse a
sink for another launch only after `reset_sink`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from harness.taps import DescriptorRecord
from harness.trace_format import HEADER_BYTES, TraceResult, parse_header, parse_trace, sink_init_bytes

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
EXAMPLE_SOURCE = Path(__file__).resolve().parent / "examples" / "torch_ext" / "trace_example.cu"
EXAMPLE_FUNCTIONS = ("tile_gemm", "set_trace_sink", "clear_trace_sink")
EXAMPLE_DECLARATIONS = """
torch::Tensor tile_gemm(torch::Tensor a, torch::Tensor b, bool traced);
void set_trace_sink(torch::Tensor sink);
void clear_trace_sink();
"""
DEFAULT_CAPACITY = 16 << 20


def include_paths() -> list[str]:
    """Include directories for `#include "oracle_trace/trace.cuh"`."""
    return [str(INCLUDE_DIR)]


def extension_cuda_flags(*, trace: bool = True) -> list[str]:
    """nvcc flags for an extension's .cu: the include path, and ORACLE_TRACE when tracing."""
    return [f"-I{INCLUDE_DIR}"] + (["-DORACLE_TRACE"] if trace else [])


def make_sink(capacity: int = DEFAULT_CAPACITY, *, tiles: Optional[Iterable] = None,
              k_blocks: Optional[Iterable[int]] = None, stages: Optional[Iterable[str]] = None,
              descriptors: Sequence[DescriptorRecord] = (), device: Optional[torch.device | str] = None
              ) -> torch.Tensor:
    """A sink of `capacity` bytes on a CUDA device, initialised with the selection (see
    `harness.trace_format.sink_init_bytes` for tiles, k_blocks and stages)."""
    data = sink_init_bytes(capacity, tiles, k_blocks, stages=stages, descriptors=descriptors)
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return host.to("cuda" if device is None else device)


def _check_sink(sink: torch.Tensor) -> None:
    if not isinstance(sink, torch.Tensor) or sink.dtype != torch.uint8 or sink.dim() != 1 or not sink.is_contiguous():
        raise TypeError("a trace sink must be a contiguous 1-D uint8 tensor (see make_sink)")
    if sink.numel() < HEADER_BYTES:
        raise ValueError(f"a trace sink of {sink.numel()} bytes is smaller than its {HEADER_BYTES}-byte header")


def reset_sink(sink: torch.Tensor, *, tiles: Optional[Iterable] = None, k_blocks: Optional[Iterable[int]] = None,
               stages: Optional[Iterable[str]] = None, descriptors: Sequence[DescriptorRecord] = ()) -> None:
    """Re-initialise a sink in place (same memory, so the extension's pointer stays valid),
    with a new selection. Stream-ordered on the current stream."""
    _check_sink(sink)
    data = sink_init_bytes(sink.numel(), tiles, k_blocks, stages=stages, descriptors=descriptors)
    sink.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def read_sink(sink: torch.Tensor, *, block_m: int, block_n: int, block_k: int, partial: bool = False,
              synchronize: bool = True) -> TraceResult:
    """Wait for the device, copy back the header and the records (not the unused rest) and
    parse them. Block sizes and `partial` as in `harness.trace_format.parse_trace`."""
    _check_sink(sink)
    if synchronize and sink.is_cuda:
        torch.cuda.synchronize(sink.device)
    header = parse_header(sink[:HEADER_BYTES].cpu().numpy())
    data = sink[:header.extent].cpu().numpy()
    return parse_trace(data, block_m=block_m, block_n=block_n, block_k=block_k, partial=partial)


def load_example(*, name: str = "oracle_trace_example", build_directory: Optional[str] = None,
                 verbose: bool = False):
    """Build and import harness/examples/torch_ext/trace_example.cu as an extension with
    tracing compiled in. Returns the module: tile_gemm(a, b, traced), set_trace_sink(sink),
    clear_trace_sink()."""
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name=name,
        cpp_sources=[EXAMPLE_DECLARATIONS],
        cuda_sources=[EXAMPLE_SOURCE.read_text()],
        functions=list(EXAMPLE_FUNCTIONS),
        extra_cuda_cflags=extension_cuda_flags(),
        extra_include_paths=include_paths(),
        build_directory=build_directory,
        verbose=verbose,
        with_cuda=True,
    )

"""Differential oracle for GEMM-like CUDA kernels.

Runs an independent Triton reference of every stage (descriptor, load, mma, reduce, epilogue) on
the kernel's own data and names the first stage whose results diverge beyond tolerance.

From Python (oracle.tools.api; imported on first use, so `python -m oracle` through a warm server
imports no torch):
    oracle.check(a, b, d, **problem_fields) -> Report        output-only check of any GEMM-like result
    oracle.assert_gemm_close(a, b, d, **problem_fields)       raises AssertionError with the report
    oracle.check_attention(q, k, v, o, lse, causal=...) -> Report   output-only check of an attention forward
    oracle.judge(recording) -> Report                         the differential on a recording
    oracle.load(path) -> Recording                            a dump file
    oracle.run_live(case, inputs="random:0", repeat=..., time=...) -> Report   build, run, trace, judge
    oracle.compare(RunRequest(...)) -> Report                 the one path the others walk
Errors raised for bad input are the types in oracle.errors. Tensors may be on any device and no
variable needs setting: without a GPU the references run under Triton's interpreter, which
kernels_ref selects before it defines a kernel (kernels_ref._interpret); with one, on the GPU.
"""

__version__ = "0.1.0"

_API = ("check", "assert_gemm_close", "judge", "load", "run_live", "compare", "Report", "problem_of", "recording_of",
        "check_attention", "attention_problem_of", "attention_recording_of")
__all__ = list(_API) + ["__version__"]


def __getattr__(name):
    if name in _API:
        from oracle.tools import api

        return getattr(api, name)
    raise AttributeError(f"module 'oracle' has no attribute {name!r}")

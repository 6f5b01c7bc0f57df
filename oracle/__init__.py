"""Differential oracle for GEMM-like CUDA kernels.

Runs an independent Triton reference of every stage (descriptor, load, mma, epilogue) on the
kernel's own data and names the first stage whose results diverge beyond tolerance.
"""

__version__ = "0.1.0"

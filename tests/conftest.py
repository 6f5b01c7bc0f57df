"""Test tiers. The CPU tier runs everywhere with Triton under its interpreter; the GPU tier
(marker `gpu`) needs a CUDA device and is skipped with a reason elsewhere."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # shared test helpers (compare_checks)

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # torch missing or broken: the CPU tier still reports it
    _HAS_CUDA = False

if not _HAS_CUDA:
    # Must be set before triton is imported anywhere.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the H200)")
    config.addinivalue_line("markers", "nvcc: needs the CUDA compiler nvcc on PATH (no GPU needed)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on the CPU tier")


def pytest_collection_modifyitems(config, items):
    import shutil

    skip_gpu = pytest.mark.skip(reason="This test needs a CUDA GPU, and none is visible on this machine.")
    skip_nvcc = pytest.mark.skip(reason="This test needs nvcc on PATH to compile CUDA, and it is not installed here.")
    for item in items:
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(skip_nvcc)

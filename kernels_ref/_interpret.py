"""Where the reference kernels run: compiled for a CUDA GPU, or under Triton's interpreter.

triton decides at each `@triton.jit` decoration (triton 3.9: `triton.knobs.runtime.interpret`,
read from TRITON_INTERPRET at that moment), so the choice must be made before the first kernel of
the package is defined: `kernels_ref/__init__.py` calls `choose_backend()` before it imports a
stage. Without a visible CUDA GPU nothing compiled can run, so the interpreter is selected; a
TRITON_INTERPRET already set (to anything) is the user's choice and is kept.
"""

from __future__ import annotations

import os

ENV = "TRITON_INTERPRET"


def choose_backend() -> bool:
    """Select the interpreter when no CUDA GPU is visible and TRITON_INTERPRET is unset; returns
    whether kernels defined from now on run under the interpreter."""
    if ENV not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ[ENV] = "1"
    import triton

    return bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs") else os.environ.get(ENV) == "1"

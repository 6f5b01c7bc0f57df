"""Where the reference kernels run: compiled for a CUDA GPU, or under Triton's interpreter.

triton decides at each `@triton.jit` decoration (triton 3.9: `triton.knobs.runtime.interpret`,
read from TRITON_INTERPRET at that moment), and `import triton` already decorates its own
standard library (tl.zeros, ...). So the choice is made before triton is first imported: every
module of the package that defines kernels calls `choose_backend()` above its `import triton`
(so does oracle.judging.compare_fast, and the tests' conftest). Without a visible CUDA GPU nothing
compiled can run, so the interpreter is selected. A TRITON_INTERPRET already set (to anything)
is the user's choice and is kept; when triton was imported before any of these modules, it is
too late to choose (a half-interpreted triton cannot run), and CPU tensors are then refused with
an error saying so (`_common.check_device`).
"""

from __future__ import annotations

import os
import sys

ENV = "TRITON_INTERPRET"


def choose_backend() -> None:
    """Set TRITON_INTERPRET=1 when it is unset, triton is not loaded yet, and no CUDA GPU is visible."""
    if ENV in os.environ or "triton" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ[ENV] = "1"

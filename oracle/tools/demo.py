"""The embedded demo: a real recording of a defective kernel from the bug zoo.

`python -m oracle compare --demo` judges `oracle/tools/data/demo.safetensors.gz`, a copy of the zoo's
recorded trace `hopper_bf16_kblock_twice` (tests/zoo/manifest.json): the CuTe Hopper GEMM
(zoo/hopper_gemm/hopper_gemm.cu, TMA + mbarrier ring + WGMMA) with k-block 1 multiplied into the
accumulator twice, traced live on an H200 with controlled random inputs (seed 43), 40 x 24 x 96
bf16, alpha 0.75, beta 0.5 with C, column bias, gelu. The oracle names mma, tile (0, 0), k-block 1.
"""

from __future__ import annotations

import os

DEMO_PATH = os.path.join(os.path.dirname(__file__), "data", "demo.safetensors.gz")
DEMO_ZOO_ENTRY = "hopper_bf16_kblock_twice"

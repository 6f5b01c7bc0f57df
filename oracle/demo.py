"""The embedded demo: a synthetic recording of a tiled bf16 GEMM with one injected defect.

`python -m oracle compare --demo` judges `oracle/data/demo.safetensors`; this module makes it
(`python -m oracle.demo` rewrites the file). The recording comes from a Python model of a kernel
(oracle.simulate), not from a real kernel, and says so in its report.
"""

from __future__ import annotations

import os
import sys

from oracle.inputs import Provenance, make_operands
from oracle.problem import ProblemSpec, Tile
from oracle.recording import Recording
from oracle.simulate import Injection, simulate

DEMO_PATH = os.path.join(os.path.dirname(__file__), "data", "demo.safetensors")
DEMO_SPEC = ProblemSpec(m=192, n=160, k=288, a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", a_major="row",
                        b_major="col", tile=Tile(64, 64, 64), swizzle_a=128, swizzle_b=128)
DEMO_DEFECT = Injection("mma_kblock_twice", tile=(1, 1), k_block=2)
DEMO_TAPPED_TILES = ((1, 1), (2, 2))


def build_demo_recording() -> Recording:
    ops = make_operands(DEMO_SPEC, "random", seed=0)
    rec = simulate(DEMO_SPEC, ops, Provenance("random", 0), injection=DEMO_DEFECT, tap_tiles=DEMO_TAPPED_TILES,
                   kernel="demo_tiled_gemm_bf16")
    return Recording(**{**rec.__dict__, "environment": {"made_by": "oracle.demo (synthetic)"}})


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else DEMO_PATH
    build_demo_recording().save(path)
    print(f"wrote {path}")

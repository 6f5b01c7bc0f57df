"""Every defect planted in the user's own Sm90EVT tree of the zoo's bias + GELU kernel
(zoo/cutlass_sm90/cutlass_sm90.cu with ZOO_CUTLASS_EVT and a ZOO_CUTLASS_EVT_* defect) builds traced as a
live run builds it (oracle.run.adapters.library_defines of the defect's zoo case), its declared order the
intended one: three CUTLASS compiles, in a file of their own so that --dist loadfile builds them beside
test_cutlass_evt.py's; the build tier's (--every-build).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.build import build_library, cutlass_include_dirs
from oracle.run.adapters import library_defines
from oracle.run.case import load_case
from oracle.run.library_epilogue import declared_order

pytestmark = [pytest.mark.nvcc, pytest.mark.slow, pytest.mark.every_build]

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "cutlass_sm90"
TREE_ORDER = ("alpha", "bias", "beta_c", "activation", "cast")  # CUTLASS's LinCombPerColBiasEltAct


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


@pytest.mark.parametrize("defect", ["evt_bias_row", "evt_gelu_tanh", "evt_beta_first"])
def test_every_planted_defect_of_the_user_s_tree_builds(defect):
    case = load_case(str(ZOO / "defects" / f"{defect}.toml"), allow_library=True)
    built = build_library(case.kernel.library, arch=case.kernel.arch,
                          defines=library_defines(case.kernel, case.spec, traced=True))
    assert declared_order(built.read()) == TREE_ORDER  # marked as intended

"""A server warmed for a case (`serve --warm`) compiles nothing more when that case's problem is
judged: the Triton kernels of the references, counted in their in-process caches before and after
an analysis of another recording of the same problem (other inputs, other tapped tiles)."""

import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

CASE = "zoo/hopper_gemm/hopper_gemm.toml"


def _compiled() -> int:
    from triton.runtime.jit import JITFunction

    seen, n = set(), 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith(("kernels_ref", "oracle")) or mod is None:
            continue
        for v in vars(mod).values():
            if isinstance(v, JITFunction) and id(v) not in seen:
                seen.add(id(v))
                for entry in getattr(v, "device_caches", {}).values():
                    n += len(entry[0])
    return n


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Compiles Triton kernels: needs a CUDA device.")
def test_a_warmed_case_compiles_nothing_on_its_first_judgement():
    from oracle.judging.differential import analyze
    from oracle.run.case import load_case
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import simulate
    from oracle.tools.warmup import warm_case

    w = warm_case(CASE)
    assert w.error is None and w.how == "analysis", w.describe()
    before = _compiled()
    assert before > 0, "no compiled Triton kernel found in the references' caches"
    spec = load_case(CASE).spec
    last = (spec.tiles_m - 1, spec.tiles_n - 1)
    rec = simulate(spec, make_operands(spec, "random", 7), Provenance("random", 7), tap_tiles=[(0, 1), last])
    assert analyze(rec).verdict.value == "MATCH"
    assert _compiled() == before

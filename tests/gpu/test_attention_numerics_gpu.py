"""Attention's numerics on the GPU (benchmarks/measure_attention_numerics.py, its quick slice): the
hardware's ex2 / tanh / lg2 approximations within the constants the bounds use, P's fused form within
the p stage's bound, and the online softmax chain within one side of the output model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_attention_numerics_stay_within_the_oracle_s_constants_and_bounds():
    from benchmarks.measure_attention_numerics import measure

    res = measure(quick=True)
    prim = res["primitives"]
    assert all(prim[op]["inputs"] > 10**6 for op in ("ex2.approx.ftz.f32", "tanh.approx.f32", "lg2.approx.ftz.f32"))
    assert prim["ex2.approx.ftz.f32"]["max"] > 0  # the approximation was what ran, not an exact exp2
    assert res["ok"], res

"""oracle.check on the H200, a cuBLAS output at 2048^3: the whole output judged on the device table
gives the judgement the torch comparator gives (every unit on the host), with and without planted
bad tiles; the cross-check agrees with its float64 specification; the report carries its phases.
Each test seeds its own inputs."""

import pytest
import torch

import oracle
from oracle.judging import compare as compare_mod

pytestmark = pytest.mark.gpu
DEV = "cuda"
N = 2048


def _problem(seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randn(N, N, device=DEV, generator=g).bfloat16()
    b = torch.randn(N, N, device=DEV, generator=g).bfloat16()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    return a, b, a @ b


def _summary(rep):
    st = rep.stages[-1].chained
    w = st.worst
    return (rep.verdict, rep.analysis.diagnosis, st.status, st.units, st.failing_units, st.compared, st.bad_tiles,
            w.tile, w.mismatches, w.max_abs_err, repr(w.first_bad))


@pytest.mark.parametrize("bad", [(), ((3, 5),), ((0, 0), (15, 15), (7, 2))])
def test_check_gives_the_reference_comparators_judgement(bad, monkeypatch):
    a, b, d = _problem(len(bad))
    for tm, tn in bad:
        d[tm * 128 + 17, tn * 128 + 101] += 64
    fast = oracle.check(a, b, d)
    assert fast.stages[-1].chained.tables, "the whole output should take the device table"
    assert not fast.analysis.cross_check, fast.analysis.cross_check
    with monkeypatch.context() as m:
        m.setattr(compare_mod, "FAST_MIN_ELEMENTS", 1 << 62)  # every comparison in torch, every unit on the host
        ref = oracle.check(a, b, d)
    assert not ref.stages[-1].chained.tables
    assert _summary(fast) == _summary(ref)
    assert fast.stages[-1].chained.bad_tiles == set(bad)
    doc = fast.to_json()
    assert {"cross_check", "reference_chain", "epilogue_store", "compare"} <= set(doc["phases_ms"])


def test_a_warm_check_makes_few_host_objects():
    a, b, d = _problem(7)
    oracle.check(a, b, d)
    rep = oracle.check(a, b, d)
    out = rep.stages[-1].chained
    assert out.units == (N // 128) ** 2 and len(out.tiles) <= 2


def test_the_phases_are_dated_by_the_device_and_add_up_to_the_check():
    """No synchronisation between phases: each ends when its host work and its device work are done,
    so the phases add up to at most the check's wall time and the device work is in them."""
    import time

    a, b, d = _problem(8)
    oracle.check(a, b, d)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    rep = oracle.check(a, b, d)
    wall = (time.perf_counter() - t0) * 1e3
    phases = dict(rep.analysis.phases)
    total = sum(ms for name, ms in phases.items() if name != "compare")
    assert all(ms >= 0 for ms in phases.values()) and 0 < total <= wall, (phases, wall)
    assert phases["reference_gemm"] > 0.1, phases  # the reference GEMM at 2048^3 runs in it


def test_queueing_the_references_and_the_cross_check_never_waits_for_the_gpu():
    """The analysis queues the whole output's references first (the GEMM, the epilogue and their
    bounds) and the cross-check's work behind them: the host goes on queueing while the GPU runs them
    only if nothing in between reads the device or copies from pageable memory (each of which waits
    for everything queued). Any wait raises here."""
    from oracle.judging.differential.context import Context
    from oracle.judging.differential.cross_check import start_cross_check
    from oracle.judging.differential.epilogue import reference_accumulation, reference_chain
    from oracle.tools.api import recording_of

    a, b, d = _problem(9)
    oracle.check(a, b, d)  # compiled and warm
    ctx = Context.of(recording_of(a, b, d), torch.device(DEV))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        accumulation = reference_accumulation(ctx)
        reference_chain(ctx, accumulation)
        pending = start_cross_check(ctx, [(0, 0), (N // 128 - 1, N // 128 - 1)])
        pending.watch_accumulator(accumulation[0])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert pending.result() == []

"""The timing discipline on the H200: events and CUDA graphs agree on a GEMM, short kernels get
graphs, a synchronizing callable falls back to events, the L2 flush stays out of the timed
region, verification failures raise, and interleaving pools the runs."""

import pytest
import torch

from oracle.run.timing import TimingError, time_gpu, time_interleaved, tflops

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _mm(n, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randn(n, n, device=DEV, generator=g).to(torch.bfloat16)
    b = torch.randn(n, n, device=DEV, generator=g).to(torch.bfloat16)
    return a, b


def test_events_and_graphs_agree_on_a_gemm():
    a, b = _mm(4096, 1)
    ev = time_gpu(lambda: torch.matmul(a, b), use_graph=False, max_ms=300)
    gr = time_gpu(lambda: torch.matmul(a, b), use_graph=True, max_ms=300)
    assert ev.mode == "events" and gr.mode == "cuda-graph", gr.notes
    assert ev.cold_l2 and gr.cold_l2
    assert abs(ev.median_ms - gr.median_ms) <= 0.1 * ev.median_ms, (ev, gr)
    assert 100 < tflops(2 * 4096 ** 3, ev.median_ms) < 1500  # an H200-like number, not a broken clock


def test_short_kernels_get_graphs_and_the_flush_is_not_timed():
    x = torch.randn(4096, device=DEV)
    t = time_gpu(lambda: x.mul_(1.0), use_graph="auto", max_ms=200)
    assert t.mode == "cuda-graph", t.notes
    # the flush writes twice the L2 (about 100 MB: tens of microseconds); the timed rep is far shorter
    flush = time_gpu(lambda: None, use_graph=False, cold_l2=True, max_ms=100)
    buf = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device=DEV)
    write = time_gpu(lambda: buf.zero_(), use_graph=False, cold_l2=False, max_ms=100)
    assert t.median_ms < 0.25 * write.median_ms, (t, write)
    assert flush.median_ms < 0.25 * write.median_ms, (flush, write)


def test_a_synchronizing_callable_falls_back_to_events():
    a, b = _mm(1024, 2)

    def fn():
        torch.matmul(a, b)
        torch.cuda.synchronize()
    t = time_gpu(fn, use_graph=True, max_ms=100)
    assert t.mode == "events"
    assert any("CUDA graph not used" in n for n in t.notes), t.notes
    # the context survived the failed capture
    assert torch.equal(torch.matmul(a, b), torch.matmul(a, b))


def test_rotation_among_large_input_sets_replaces_the_flush():
    sets = [_mm(4096, s) for s in range(4)]  # 4 x 64 MiB: over twice the L2
    t = time_gpu(lambda a, b: torch.matmul(a, b), rotate=sets, use_graph=False, max_ms=200)
    assert t.cold_l2 and any("rotating 4 argument sets" in n for n in t.notes), t.notes


def test_verification_after_timing_that_fails_raises():
    a, b = _mm(512, 3)
    out = torch.empty(512, 512, dtype=torch.bfloat16, device=DEV)
    calls = []

    def verify():
        calls.append(1)
        return len(calls) == 1  # right before, wrong after

    with pytest.raises(TimingError, match="after timing failed"):
        time_gpu(lambda: torch.matmul(a, b, out=out), verify=verify, max_ms=50)


def test_interleaved_runs_pool_their_samples():
    a, b = _mm(2048, 4)
    res = time_interleaved({"x": lambda: torch.matmul(a, b), "y": lambda: torch.matmul(b, a)}, rounds=4,
                           max_ms=60, warmup_ms=5)
    for name, t in res.items():
        assert t.reps >= 40 and any("pooled" in n for n in t.notes), (name, t)
    assert abs(res["x"].median_ms - res["y"].median_ms) < 0.15 * res["x"].median_ms

"""The timing discipline's logic without a GPU: statistics, the stopping rule, the adaptive loop,
and time_gpu's verify / cold-L2 / graph-fallback decisions against a fake backend with a fake clock."""

import math
import statistics

import numpy as np
import pytest
import torch

from oracle.run import timing as T
from oracle.run.timing import Policy, Timing, TimingError


class FakeBackend:
    """Stands in for the CUDA backend: per-rep times from `times(i)`, a clock that advances by
    what the reps would take plus a host overhead per rep."""

    def __init__(self, times=lambda i: 1.0, l2=1000, capture=True, graph_factor=1.0, overhead=0.01):
        self.times = times
        self.l2 = l2
        self.capture_ok = capture
        self.graph_factor = graph_factor
        self.overhead = overhead
        self.now = 0.0
        self.flushes = 0
        self.captured = 0
        self.replays = 0

    def clock_ms(self):
        return self.now

    def l2_bytes(self):
        return self.l2

    def synchronize(self):
        pass

    def time_events(self, call, first, n, flush):
        out = []
        for i in range(first, first + n):
            if flush:
                self.flushes += 1
            call(i)
            t = self.times(i)
            self.now += t + self.overhead
            out.append(t)
        return out

    def capture(self, call, n, flush):
        if self.capture_ok is not True:
            raise self.capture_ok
        for i in range(n):
            call(i)
        self.captured = n

        def replay():
            self.replays += 1
            ts = [self.times(i) * self.graph_factor for i in range(n)]
            self.now += sum(ts)
            return ts
        return replay


def _time(fn=lambda: None, backend=None, **kw):
    kw.setdefault("warmup_ms", 5.0)
    return T.time_gpu(fn, _backend=backend or FakeBackend(), **kw)


# --- statistics ------------------------------------------------------------------------------

@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_percentile_interpolates_like_numpy(q):
    xs = sorted(np.random.default_rng(3).gamma(2.0, 1.0, 37).tolist())
    assert T.percentile(xs, q) == pytest.approx(float(np.percentile(xs, 100 * q)), rel=1e-12)


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError, match="no samples"):
        T.percentile([], 0.5)
    with pytest.raises(ValueError, match="q=1.5"):
        T.percentile([1.0], 1.5)


def test_relative_standard_error_of_the_median():
    assert T.relative_standard_error([1.0]) == math.inf
    assert T.relative_standard_error([2.0] * 10) == 0.0
    xs = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    assert T.relative_standard_error(xs) == pytest.approx(1.2533 * 1.4826 * mad / math.sqrt(len(xs)) / med)
    # MAD of zero (quantised timer) falls back to the stdev rather than claiming perfection
    ys = [1.0] * 9 + [2.0] * 2
    assert T.relative_standard_error(ys) == pytest.approx(
        1.2533 * statistics.stdev(ys) / math.sqrt(len(ys)) / 1.0)


def test_rse_is_robust_to_one_preempted_rep():
    base = [1.0 + 0.001 * (i % 5) for i in range(50)]
    assert T.relative_standard_error(base + [100.0]) < 0.01


def test_timing_from_samples_statistics():
    xs = [3.0, 1.0, 2.0, 5.0, 4.0, 2.5]
    t = Timing.from_samples(xs, mode="events", cold_l2=True, stop="max_ms", notes=["n"])
    assert t.median_ms == pytest.approx(statistics.median(xs))
    assert t.mean_ms == pytest.approx(statistics.mean(xs))
    assert t.stdev_ms == pytest.approx(statistics.stdev(xs))
    assert t.min_ms == 1.0
    assert t.p10_ms == pytest.approx(np.percentile(xs, 10)) and t.p90_ms == pytest.approx(np.percentile(xs, 90))
    assert t.reps == 6 and t.samples_ms == tuple(xs) and t.notes == ("n",)
    assert t.spread == pytest.approx((t.p90_ms - t.p10_ms) / t.median_ms)
    d = t.as_dict()
    assert "samples_ms" not in d and d["mode"] == "events" and d["notes"] == ["n"]
    assert t.as_dict(samples=True)["samples_ms"] == xs
    with pytest.raises(Exception):
        t.median_ms = 0.0  # frozen


def test_timing_validates_its_fields():
    with pytest.raises(ValueError, match="Timing.mode='graph'"):
        Timing.from_samples([1.0], mode="graph", cold_l2=True)
    with pytest.raises(ValueError, match="Timing.stop='tired'"):
        Timing.from_samples([1.0], mode="events", cold_l2=True, stop="tired")
    with pytest.raises(ValueError, match="invalid samples"):
        Timing.from_samples([1.0, float("nan")], mode="events", cold_l2=True)
    with pytest.raises(ValueError, match="at least one sample"):
        Timing.from_samples([], mode="events", cold_l2=True)
    with pytest.raises(ValueError, match="2 samples but reps=3"):
        Timing(1, 1, 0, 1, 1, 1, 3, 0.0, "events", True, samples_ms=(1.0, 1.0))
    with pytest.raises(ValueError, match="quantiles out of order"):
        Timing(1, 1, 0, 2, 1, 1, 1, 0.0, "events", True)


def test_tflops_and_gemm_flops():
    assert T.gemm_flops(4096, 4096, 4096) == 2 * 4096 ** 3
    assert T.tflops(2 * 4096 ** 3, 0.2) == pytest.approx(2 * 4096 ** 3 / 0.2e-3 / 1e12)
    with pytest.raises(ValueError, match="ms=0"):
        T.tflops(1.0, 0)


# --- policy and the stopping rule ------------------------------------------------------------

@pytest.mark.parametrize("kw,field", [
    (dict(min_reps=0), "min_reps=0"), (dict(min_reps=5, max_reps=4), "max_reps=4"),
    (dict(rse_target=0), "rse_target=0"), (dict(rse_target=1.5), "rse_target=1.5"),
    (dict(max_ms=-1), "max_ms=-1"), (dict(warmup_ms=float("inf")), "warmup_ms=inf"),
    (dict(use_graph="yes"), "use_graph='yes'"), (dict(use_graph=1), "use_graph=1"),
    (dict(cold_l2="no"), "cold_l2='no'"), (dict(min_reps=True), "min_reps=True"),
])
def test_policy_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        Policy(**kw)


def test_stop_reason_rule():
    p = Policy(min_reps=10, max_reps=100, rse_target=0.02, max_ms=50)
    assert T.stop_reason(5, 0.0, 1e9, p) is None  # min_reps always run, even past max_ms
    assert T.stop_reason(10, 0.01, 0.0, p) == "converged"
    assert T.stop_reason(10, 0.02, 0.0, p) == "converged"
    assert T.stop_reason(10, 0.03, 10.0, p) is None
    assert T.stop_reason(10, 0.03, 50.0, p) == "max_ms"
    assert T.stop_reason(100, 0.5, 0.0, p) == "max_reps"
    assert T.stop_reason(100, 0.0, 0.0, p) == "max_reps"


def _loop(times, **kw):
    clock = [0.0]
    calls = []

    def run_batch(n):
        calls.append(n)
        out = [times(len(calls) * 1000 + i) for i in range(n)]
        clock[0] += sum(out)
        return out
    samples, stop = T.run_adaptive(run_batch, Policy(**kw), lambda: clock[0])
    return samples, stop, calls, clock[0]


def test_adaptive_loop_stops_at_min_reps_when_quiet():
    samples, stop, calls, _ = _loop(lambda i: 1.0 + 1e-4 * (i % 3), min_reps=10)
    assert stop == "converged" and len(samples) == 10 and calls == [10]


def test_adaptive_loop_spends_max_ms_when_noisy():
    rng = np.random.default_rng(0)
    samples, stop, calls, spent = _loop(lambda i: float(rng.choice([0.5, 1.5])), min_reps=5, max_reps=10**6,
                                        rse_target=0.001, max_ms=200.0)
    assert stop == "max_ms"
    assert 200.0 <= spent < 200.0 * 1.25  # batches are about a tenth of max_ms: small overshoot
    assert len(calls) > 3


def test_adaptive_loop_caps_at_max_reps():
    rng = np.random.default_rng(1)
    samples, stop, _, _ = _loop(lambda i: float(rng.uniform(0.5, 1.5)), min_reps=7, max_reps=23,
                                rse_target=1e-6, max_ms=1e9)
    assert stop == "max_reps" and len(samples) == 23


def test_adaptive_loop_converges_once_noise_averages_out():
    rng = np.random.default_rng(2)
    samples, stop, _, _ = _loop(lambda i: float(rng.normal(1.0, 0.05)), min_reps=4, max_reps=10**5,
                                rse_target=0.005, max_ms=1e9)
    assert stop == "converged"
    assert T.relative_standard_error(samples) <= 0.005
    assert len(samples) > 50  # needed ~ (1.25 * 0.05 / 0.005)^2 reps


# --- time_gpu against the fake backend -------------------------------------------------------

def test_events_mode_for_long_calls_and_graph_mode_for_short_ones():
    slow = _time(backend=FakeBackend(lambda i: 1.0), use_graph="auto", graph_below_ms=0.1)
    assert slow.mode == "events" and slow.median_ms == 1.0 and slow.stop == "converged"
    be = FakeBackend(lambda i: 0.01)
    fast = _time(backend=be, use_graph="auto", graph_below_ms=0.1)
    assert fast.mode == "cuda-graph" and be.captured > 1 and be.replays >= 2
    assert fast.median_ms == pytest.approx(0.01)
    forced = _time(backend=FakeBackend(lambda i: 1.0), use_graph=True)
    assert forced.mode == "cuda-graph"
    never = _time(backend=FakeBackend(lambda i: 0.01), use_graph=False)
    assert never.mode == "events"


def test_a_failed_capture_falls_back_to_events_with_a_note():
    be = FakeBackend(lambda i: 0.01, capture=RuntimeError("operation not permitted when stream is capturing"))
    t = _time(backend=be, use_graph=True)
    assert t.mode == "events"
    assert any("CUDA graph not used (RuntimeError: operation not permitted" in n for n in t.notes)


def test_a_graph_that_captured_nothing_is_not_trusted():
    t = _time(backend=FakeBackend(lambda i: 0.05, graph_factor=0.001), use_graph=True)
    assert t.mode == "events" and t.median_ms == pytest.approx(0.05)
    assert any("its work was not captured" in n for n in t.notes)


def test_verify_runs_before_and_after_and_its_failures_raise():
    seen = []
    calls = []
    t = _time(fn=lambda: calls.append(1), verify=lambda: seen.append(len(calls)))
    assert len(seen) == 2 and seen[0] == 0 and seen[1] == len(calls) > 0 and t.reps >= 10

    calls.clear()
    with pytest.raises(TimingError, match="before timing failed"):
        _time(fn=lambda: calls.append(1), verify=lambda: False)
    assert not calls  # a wrong callable is never timed

    state = iter([True, False])
    with pytest.raises(TimingError, match="after timing failed"):
        _time(verify=lambda: next(state))

    def boom():
        raise AssertionError("max |d| 3.5 at (0, 7)")
    with pytest.raises(TimingError, match="before timing raised AssertionError: max"):
        _time(verify=boom)


def test_a_raising_callable_is_a_timing_error():
    def fn():
        raise RuntimeError("CUDA error: an illegal memory access")
    with pytest.raises(TimingError, match="callable raised RuntimeError: CUDA error"):
        _time(fn=fn)


def test_cold_l2_by_flush_by_rotation_or_warm():
    be = FakeBackend(l2=1000)
    t = _time(backend=be, use_graph=False)
    assert t.cold_l2 and be.flushes > 0 and any("writing" in n for n in t.notes)

    big = [(torch.empty(300, dtype=torch.float32),) for _ in range(2)]  # 2400 bytes >= 2 * L2
    be = FakeBackend(l2=1000)
    seen = []
    t = _time(fn=lambda x: seen.append(x.data_ptr()), backend=be, rotate=big, use_graph=False)
    assert t.cold_l2 and be.flushes == 0 and any("rotating 2 argument sets" in n for n in t.notes)
    ptrs = [x.data_ptr() for (x,) in big]
    assert seen[:6] == [ptrs[0], ptrs[1]] * 3  # rep i gets set i % 2

    small = [(torch.empty(10),), (torch.empty(10),)]
    be = FakeBackend(l2=1000)
    t = _time(fn=lambda x: None, backend=be, rotate=small, use_graph=False)
    assert t.cold_l2 and be.flushes > 0

    shared = torch.empty(300)
    be = FakeBackend(l2=1000)  # the same tensor in every set counts once
    t = _time(fn=lambda x: None, backend=be, rotate=[(shared,), (shared,)], use_graph=False)
    assert be.flushes > 0

    be = FakeBackend(l2=1000)
    t = _time(backend=be, cold_l2=False)
    assert not t.cold_l2 and be.flushes == 0


def test_graph_batches_hold_whole_rotations():
    be = FakeBackend(lambda i: 0.01)
    _time(fn=lambda x: None, backend=be, rotate=[(1,), (2,), (3,)], use_graph=True)
    assert be.captured % 3 == 0


def test_time_gpu_argument_errors():
    with pytest.raises(ValueError, match="fn must be callable"):
        _time(fn=3)
    with pytest.raises(ValueError, match="rotate must be"):
        _time(rotate=[])
    with pytest.raises(ValueError, match=r"rotate\[1\] must be a tuple"):
        _time(fn=lambda x: None, rotate=[(1,), 2])
    with pytest.raises(ValueError, match="rse_target=2"):
        _time(rse_target=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="This test checks the error raised without a GPU.")
def test_time_gpu_without_a_gpu_says_so():
    with pytest.raises(TimingError, match="needs a CUDA device"):
        T.time_gpu(lambda: None)


# --- interleaving ----------------------------------------------------------------------------

def test_interleave_order_alternates():
    assert T.interleave_order(["a", "b"], 4) == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert T.interleave_order(["a"], 2) == ["a", "a"]


def test_time_interleaved_runs_in_order_and_pools_samples():
    log = []
    verified = []

    def fake_time(fn, rotate=None, **kw):
        name = fn()
        log.append((name, rotate, kw["max_ms"]))
        k = len(log)
        return Timing.from_samples([float(k), float(k) + 0.5], mode="events", cold_l2=True,
                                   notes=["cold L2 by writing", f"converged: after {k}"])
    res = T.time_interleaved({"triton": lambda: "triton", "cublas": lambda: "cublas"}, rounds=3,
                             verify={"triton": lambda: verified.append("t")},
                             rotate={"cublas": [(1,)]}, _time=fake_time, max_ms=50.0)
    assert [n for n, _, _ in log] == ["triton", "cublas", "cublas", "triton", "triton", "cublas"]
    assert all(r == ([(1,)] if n == "cublas" else None) and m == 50.0 for n, r, m in log)
    assert verified == ["t", "t"]
    tri = res["triton"]
    assert tri.reps == 6 and sorted(tri.samples_ms) == [1.0, 1.5, 4.0, 4.5, 5.0, 5.5]
    assert any("pooled 6 reps from 3 runs" in n for n in tri.notes)
    assert any("interleaved with cublas" in n for n in tri.notes)
    assert not any(n.startswith("converged") for n in tri.notes)
    assert "cold L2 by writing" in tri.notes


def test_time_interleaved_errors():
    with pytest.raises(ValueError, match="at least one callable"):
        T.time_interleaved({})
    with pytest.raises(ValueError, match="'x' in verify/rotate names no callable"):
        T.time_interleaved({"a": lambda: None}, verify={"x": lambda: None})
    with pytest.raises(ValueError, match="rounds=0"):
        T.time_interleaved({"a": lambda: None}, rounds=0)


def test_merge_of_mixed_modes_reports_events():
    a = Timing.from_samples([1.0, 1.1], mode="cuda-graph", cold_l2=True)
    b = Timing.from_samples([1.2], mode="events", cold_l2=False, stop="max_ms")
    m = T.merge([a, b])
    assert m.mode == "events" and not m.cold_l2 and m.stop == "max_ms" and m.reps == 3
    assert any("different modes" in n for n in m.notes)


def _coverage_by_counting(n: int, j: int) -> float:
    """1 - 2 P(B <= j), B ~ Binomial(n, 1/2), summed term by term."""
    import math

    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n


@pytest.mark.parametrize("n", [1, 5, 6, 10, 17, 50, 200, 1000])
def test_the_median_interval_is_the_widest_order_statistic_pair_that_still_covers_95_percent(n):
    from oracle.run.timing import median_interval

    samples = [float(i) for i in range(n)]  # x_(i) = i, so the interval names its ranks
    lo, hi, coverage = median_interval(samples)
    j = int(lo)
    assert hi == n - 1 - j
    assert coverage == pytest.approx(_coverage_by_counting(n, j), abs=1e-12)
    if n >= 6:
        assert coverage >= 0.95 and _coverage_by_counting(n, j + 1) < 0.95  # and no narrower pair covers
    else:
        assert j == 0  # (min, max): the most a handful of reps can say


def test_a_timing_carries_its_median_interval():
    from oracle.run.timing import Timing

    t = Timing.from_samples([1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 1.0, 0.98, 1.02, 1.01], mode="events", cold_l2=True)
    assert t.median_ci_ms[0] <= t.median_ms <= t.median_ci_ms[1] and t.ci_coverage >= 0.95
    assert t.as_dict()["median_ci_ms"] == list(t.median_ci_ms)


def test_the_kernel_path_and_the_performance_table_carry_the_interval():
    from oracle.problem.spec import ProblemSpec, Tile
    from oracle.report.table import performance_table
    from oracle.run.perf import Performance, kernel_path

    spec = ProblemSpec(m=64, n=64, k=64, a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", tile=Tile(64, 64, 64))
    samples = [0.5 + 0.01 * i for i in range(20)]
    path = kernel_path(spec, {"median_ms": 0.595, "reps": 20, "rse": 0.01, "cold_l2": True,
                              "samples_ms": samples}, "k")
    assert path.median_ci_ms[0] < 0.595 < path.median_ci_ms[1]
    assert path.to_json()["median_ci_ms"] == list(path.median_ci_ms)
    text = performance_table(Performance((path,)))
    assert "95% interval" in text and f"{path.median_ci_ms[0]:.4g}-{path.median_ci_ms[1]:.4g}" in text

"""One timing discipline for every GPU path: the kernel under test, the Triton references,
cuBLAS (`torch.matmul`) and cuBLASLt fp8 (`torch._scaled_mm`) are all timed by `time_gpu`.

The discipline, in order:
  1. verify   `verify()` runs before timing; a failure (False or an exception) raises TimingError.
  2. warm-up  one untimed call (compilation, autotuning, lazy init), then calls for warmup_ms of
              host time; their device times estimate the cost of one call.
  3. cold L2  before every timed rep, a buffer of twice the device's L2 is written (outside the
              timed region), unless the rotated argument sets are together at least that large:
              then rotation alone keeps the inputs out of L2. cold_l2=False times a warm L2.
  4. timing   device events around every rep. Mode "cuda-graph" captures a batch of reps (with
              their flushes and external event-record nodes around each rep) into one CUDA graph
              and replays it: no launch overhead, one sample per rep. Mode "events" launches from
              the host, after a short device sleep that lets the host queue run ahead of the GPU.
              use_graph="auto" takes graphs for calls under graph_below_ms; a capture that fails
              (a callable that synchronizes, launches from another process, ...) or a graph that
              runs implausibly fast (its work was not captured) falls back to events, with a note.
  5. stop     adaptively: at least min_reps, at most max_reps; in between, stop as soon as the
              relative standard error of the median falls under rse_target, or when max_ms of
              host time is spent (the rule is `stop_reason`, a pure function).
  6. verify   `verify()` runs again after timing; a failure raises TimingError (the timed reps may
              have computed garbage: a race, a corrupted input, a kernel that went wrong).
The result is a frozen `Timing`: median, mean, stdev, min, p10, p90, reps, rse, the mode, whether
the reps saw a cold L2, the stop reason and notes. Report the median; p10..p90 is the spread.

`time_interleaved` alternates several callables run by run (A B B A A B ...) so that clock and
thermal drift hit all of them alike, and pools each one's samples.

The GPU is reached only through a small backend object (`_CudaBackend`); tests substitute a fake
one with a fake clock, so everything but the CUDA calls is tested on the CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Optional, Sequence

MODES = ("cuda-graph", "events")
STOPS = ("converged", "max_reps", "max_ms")
GRAPH_CHOICES = (True, False, "auto")

# A graph whose per-rep time is below this fraction of the events estimate did not capture the
# callable's work (it runs elsewhere): such a graph is not trusted.
_GRAPH_PLAUSIBLE = 0.1
# Target host time of one batch of timed reps (events mode) and one graph replay.
_BATCH_MS = 20.0
_GRAPH_BATCH_MS = 5.0
_GRAPH_MAX_BATCH = 256
# Device sleep before an events batch, in clock cycles (about 0.5 ms at 2 GHz): the host
# enqueues the first reps while the GPU sleeps, so no rep waits on a launch.
_SLEEP_CYCLES = 1_000_000


from harness.stats import Policy, _is_int, percentile, relative_standard_error, stop_reason  # noqa: F401


class TimingError(RuntimeError):
    """Timing could not be done or cannot be trusted: no GPU, verification failed, the callable raised."""


NO_GPU = "timing needs a CUDA GPU; none is visible"


def require_gpu(error: type = TimingError, advice: str = "") -> None:
    """Raise `error` with NO_GPU (and `advice`) unless a CUDA device is visible: every path that
    times checks it before anything is built or run."""
    import torch

    if not torch.cuda.is_available():
        raise error(NO_GPU + (f" ({advice})" if advice else ""))


@dataclass(frozen=True)
class Timing:
    """What one timing run measured. Times in milliseconds per rep; rse is the relative standard
    error of the median; mode is "cuda-graph" or "events"; cold_l2 says whether every rep started
    with its inputs out of L2 (flushed or rotated); stop says why sampling ended."""

    median_ms: float
    mean_ms: float
    stdev_ms: float
    min_ms: float
    p10_ms: float
    p90_ms: float
    reps: int
    rse: float
    mode: str
    cold_l2: bool
    stop: str = "converged"
    notes: tuple = ()
    samples_ms: tuple = field(default=(), repr=False, compare=False)
    median_ci_ms: tuple = ()  # (low, high): a distribution-free 95 % interval of the median (median_interval)
    ci_coverage: Optional[float] = None  # the interval's exact coverage (>= 0.95 from 6 reps on)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Timing.mode={self.mode!r} is not allowed; allowed: {', '.join(MODES)}")
        if self.stop not in STOPS:
            raise ValueError(f"Timing.stop={self.stop!r} is not allowed; allowed: {', '.join(STOPS)}")
        if not _is_int(self.reps) or self.reps < 1:
            raise ValueError(f"Timing.reps={self.reps!r} is not allowed; allowed: an integer >= 1")
        if self.samples_ms and len(self.samples_ms) != self.reps:
            raise ValueError(f"Timing.samples_ms has {len(self.samples_ms)} samples but reps={self.reps}")
        for name in ("median_ms", "mean_ms", "min_ms", "p10_ms", "p90_ms"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Timing.{name}={v!r} is not allowed; allowed: a finite time >= 0")
        if not self.min_ms <= self.p10_ms <= self.median_ms <= self.p90_ms:
            raise ValueError(f"Timing quantiles out of order: min {self.min_ms}, p10 {self.p10_ms}, "
                             f"median {self.median_ms}, p90 {self.p90_ms}")
        if not isinstance(self.notes, tuple) or not all(isinstance(s, str) for s in self.notes):
            raise ValueError("Timing.notes must be a tuple of strings")

    @classmethod
    def from_samples(cls, samples: Sequence[float], *, mode: str, cold_l2: bool, stop: str = "converged",
                     notes: Sequence[str] = ()) -> "Timing":
        s = [float(x) for x in samples]
        if not s:
            raise ValueError("Timing.from_samples needs at least one sample")
        bad = [x for x in s if not (math.isfinite(x) and x >= 0)]
        if bad:
            raise ValueError(f"Timing.from_samples got {len(bad)} invalid samples (first: {bad[0]!r}); "
                             "allowed: finite times >= 0")
        srt = sorted(s)
        n = len(s)
        mean = sum(s) / n
        stdev = math.sqrt(sum((x - mean) ** 2 for x in s) / (n - 1)) if n > 1 else 0.0
        lo, hi, coverage = median_interval(srt)
        return cls(median_ms=percentile(srt, 0.5), mean_ms=mean, stdev_ms=stdev, min_ms=srt[0],
                   p10_ms=percentile(srt, 0.1), p90_ms=percentile(srt, 0.9), reps=n,
                   rse=relative_standard_error(s), mode=mode, cold_l2=cold_l2, stop=stop,
                   notes=tuple(notes), samples_ms=tuple(s), median_ci_ms=(lo, hi), ci_coverage=coverage)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative width of the middle 80 % of reps."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else math.inf

    def as_dict(self, samples: bool = False) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["rse"] = self.rse if math.isfinite(self.rse) else None
        d["median_ci_ms"] = list(self.median_ci_ms)
        if samples:
            d["samples_ms"] = list(self.samples_ms)
        else:
            d.pop("samples_ms")
        return d


def median_interval(sorted_samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval of the median from order statistics: the number of samples
    below the true median is Binomial(n, 1/2), so [x_(j), x_(n-1-j)] (0-based) covers it with
    probability 1 - 2 P(B <= j). j is the largest rank whose coverage is still at least
    `confidence` (scipy.stats.binom: the exact quantile, no normal approximation, which is off for
    the 10 to 50 reps a timing takes). Returns (low, high, exact coverage); fewer than 6 samples
    cannot reach 95 %: (min, max) and their coverage."""
    from scipy.stats import binom

    n = len(sorted_samples)
    if n == 0:
        raise ValueError("median_interval of no samples")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r} is not allowed; allowed: 0 < confidence < 1")
    alpha = 1 - confidence
    k = int(binom.ppf(alpha / 2, n, 0.5))  # the smallest k with P(B <= k) >= alpha / 2
    j = max(0, k if binom.cdf(k, n, 0.5) <= alpha / 2 else k - 1)
    coverage = 1.0 - 2.0 * float(binom.cdf(j, n, 0.5))
    return float(sorted_samples[j]), float(sorted_samples[n - 1 - j]), coverage


def tflops(flops: float, ms: float) -> float:
    """Throughput in TFLOP/s of `flops` floating-point operations done in `ms` milliseconds."""
    if not ms > 0:
        raise ValueError(f"ms={ms!r} must be > 0")
    return flops / (ms * 1e-3) / 1e12


def gemm_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an [m, k] x [k, n] GEMM (one multiply and one add per term)."""
    return 2 * m * n * k


# ---------------------------------------------------------------------------------------------
# The adaptive loop (pure: the batch runner and the clock are parameters)


def run_adaptive(run_batch: Callable[[int], Sequence[float]], policy: Policy,
                 clock_ms: Callable[[], float]) -> tuple[list[float], str]:
    """Collect per-rep samples batch by batch until `stop_reason` says stop. run_batch(n) runs
    about n reps and returns one time per rep; the first batch is min_reps, later ones take about
    a tenth of max_ms (1 to 20 ms of host time, from the time per rep so far) and at most double
    the sample count, so the rule is checked often and the budget overshoots little."""
    samples: list[float] = []
    t0 = clock_ms()
    want = policy.min_reps
    while True:
        got = list(run_batch(max(1, min(want, policy.max_reps - len(samples)))))
        if not got:
            raise TimingError("a timing batch returned no samples")
        samples.extend(got)
        del samples[policy.max_reps:]
        elapsed = clock_ms() - t0
        reason = stop_reason(len(samples), relative_standard_error(samples), elapsed, policy)
        if reason is not None:
            return samples, reason
        per_rep = max(elapsed / len(samples), 1e-6)
        if len(samples) < policy.min_reps:
            want = policy.min_reps - len(samples)
        else:
            target = min(max(policy.max_ms / 10.0, 1.0), _BATCH_MS)
            want = max(1, min(int(target / per_rep), len(samples)))


# ---------------------------------------------------------------------------------------------
# The CUDA backend (the only part that needs a GPU)


class _CudaBackend:
    """Flush buffer, events, graphs and the host clock for one CUDA device."""

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise TimingError("time_gpu needs a CUDA device, and none is visible on this machine")
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.device)
        self._l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self._flush_buf = None

    def clock_ms(self) -> float:
        return time.perf_counter() * 1e3

    def l2_bytes(self) -> int:
        return self._l2

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def flush(self) -> None:
        if self._flush_buf is None:
            self._flush_buf = self.torch.empty(2 * self._l2, dtype=self.torch.uint8, device=self.device)
        self._flush_buf.zero_()

    def _sleep(self) -> None:
        try:
            self.torch.cuda._sleep(_SLEEP_CYCLES)
        except Exception:  # a private helper: timing still works without it, a little less tightly
            pass

    def time_events(self, call: Callable[[int], None], first: int, n: int, flush: bool) -> list[float]:
        Event = self.torch.cuda.Event
        starts = [Event(enable_timing=True) for _ in range(n)]
        ends = [Event(enable_timing=True) for _ in range(n)]
        self._sleep()
        for i in range(n):
            if flush:
                self.flush()
            starts[i].record()
            call(first + i)
            ends[i].record()
        self.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def capture(self, call: Callable[[int], None], n: int, flush: bool) -> Callable[[], list[float]]:
        """Capture n reps (flush, event, call(i), event) in one graph; returns a replay function
        giving n per-rep times. Raises whatever capture raises."""
        torch = self.torch
        Event = torch.cuda.Event
        starts = [Event(enable_timing=True, external=True) for _ in range(n)]
        ends = [Event(enable_timing=True, external=True) for _ in range(n)]
        if flush:
            self.flush()  # allocate outside the capture
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # libraries initialise their workspaces outside the capture
            call(0)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n):
                if flush:
                    self.flush()
                starts[i].record()
                call(i)
                ends[i].record()
        self.synchronize()

        def replay() -> list[float]:
            graph.replay()
            self.synchronize()
            return [s.elapsed_time(e) for s, e in zip(starts, ends)]

        replay.graph = graph  # keep it (and its memory pool) alive as long as the replay function
        return replay


# ---------------------------------------------------------------------------------------------
# time_gpu


def _tensor_bytes(args, seen: Optional[set] = None) -> int:
    """Bytes of the distinct tensors among args (nested lists and tuples included)."""
    seen = set() if seen is None else seen
    total = 0
    for x in args:
        if hasattr(x, "data_ptr") and hasattr(x, "element_size") and hasattr(x, "numel"):
            key = (x.data_ptr(), x.numel() * x.element_size())
            if key not in seen:
                seen.add(key)
                total += key[1]
        elif isinstance(x, (list, tuple)):
            total += _tensor_bytes(x, seen)
    return total


def _run_verify(verify: Optional[Callable[[], object]], when: str) -> None:
    if verify is None:
        return
    try:
        ok = verify()
    except TimingError:
        raise
    except Exception as e:
        raise TimingError(f"verification {when} timing raised {type(e).__name__}: {e}") from e
    if ok is not None and not bool(ok):
        raise TimingError(f"verification {when} timing failed: the callable's output is wrong")


def _median(xs: Sequence[float]) -> float:
    return percentile(sorted(xs), 0.5)


def time_gpu(fn: Callable, *, verify: Optional[Callable[[], object]] = None,
             rotate: Optional[Sequence[Sequence]] = None, warmup_ms: float = 25.0, min_reps: int = 10,
             max_reps: int = 1000, rse_target: float = 0.02, max_ms: float = 1000.0,
             use_graph: object = "auto", cold_l2: bool = True, graph_below_ms: float = 0.1,
             _backend=None) -> Timing:
    """Time `fn` on the current CUDA device with the module's discipline and return a Timing.

    fn is called as fn() or, with rotate (a list of argument tuples), as fn(*rotate[i % len]) for
    rep i. verify() runs before and after timing; it passes by returning None or anything true
    and fails by returning something false or raising (TimingError). The other arguments are the `Policy` fields."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    if verify is not None and not callable(verify):
        raise ValueError(f"verify must be callable or None, got {type(verify).__name__}")
    policy = Policy(warmup_ms=warmup_ms, min_reps=min_reps, max_reps=max_reps, rse_target=rse_target,
                    max_ms=max_ms, use_graph=use_graph, cold_l2=cold_l2, graph_below_ms=graph_below_ms)
    if rotate is not None:
        if isinstance(rotate, (str, bytes)) or not isinstance(rotate, Sequence) or len(rotate) == 0:
            raise ValueError("rotate must be None or a non-empty list of argument tuples")
        for i, args in enumerate(rotate):
            if not isinstance(args, (tuple, list)):
                raise ValueError(f"rotate[{i}] must be a tuple or list of arguments, got {type(args).__name__}")
        sets = [tuple(a) for a in rotate]
    else:
        sets = [()]
    be = _backend if _backend is not None else _CudaBackend()
    notes: list[str] = []

    def call(i: int) -> None:
        try:
            fn(*sets[i % len(sets)])
        except Exception as e:
            raise TimingError(f"the timed callable raised {type(e).__name__}: {e}") from e

    # cold L2: rotation alone if the rotated sets together are at least twice the L2
    flush = False
    cold = False
    if policy.cold_l2:
        rotated = _tensor_bytes(sets) if len(sets) > 1 else 0
        if rotated >= 2 * be.l2_bytes():
            cold = True
            notes.append(f"cold L2 by rotating {len(sets)} argument sets ({rotated / 2**20:.0f} MiB)")
        else:
            flush = cold = True
            notes.append(f"cold L2 by writing {2 * be.l2_bytes() / 2**20:.0f} MiB before every rep")
    else:
        notes.append("warm L2: inputs may be cached between reps")

    _run_verify(verify, "before")

    # warm-up: one untimed call, then warmup_ms of host time
    call(0)
    be.synchronize()
    t0 = be.clock_ms()
    est: list[float] = []
    nxt, k = 1, 1
    while True:
        est.extend(be.time_events(call, nxt, k, flush))
        nxt += k
        if be.clock_ms() - t0 >= policy.warmup_ms and len(est) >= 2:
            break
        k = min(2 * k, 64)
    est_ms = _median(est[-16:])

    # mode
    want_graph = policy.use_graph is True or (policy.use_graph == "auto" and est_ms < policy.graph_below_ms)
    replay = None
    if want_graph:
        batch = max(1, min(_GRAPH_MAX_BATCH, math.ceil(_GRAPH_BATCH_MS / max(est_ms, 1e-4))))
        batch = len(sets) * math.ceil(batch / len(sets))
        try:
            replay = be.capture(call, batch, flush)
            probe = replay()
            if not all(math.isfinite(x) and x >= 0 for x in probe):
                raise TimingError(f"graph replay gave invalid times {probe[:4]}")
            if _median(probe) < _GRAPH_PLAUSIBLE * est_ms:
                raise TimingError(f"a graph replay took {_median(probe):.4g} ms per rep against "
                                  f"{est_ms:.4g} ms launched from the host: its work was not captured")
        except Exception as e:
            replay = None
            try:
                be.synchronize()
            except Exception:
                pass
            notes.append(f"CUDA graph not used ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                         "timed with events")
    counter = [nxt]

    if replay is not None:
        mode = "cuda-graph"

        def run_batch(n: int) -> list[float]:
            out: list[float] = []
            while len(out) < n:
                out.extend(replay())
            return out
    else:
        mode = "events"

        def run_batch(n: int) -> list[float]:
            got = be.time_events(call, counter[0], n, flush)
            counter[0] += n
            return got

    samples, stop = run_adaptive(run_batch, policy, be.clock_ms)
    rse = relative_standard_error(samples)
    if stop == "converged":
        notes.append(f"converged: rse {rse:.2%} <= {policy.rse_target:.2%} after {len(samples)} reps")
    else:
        notes.append(f"stopped by {stop} after {len(samples)} reps with rse {rse:.2%} "
                     f"(target {policy.rse_target:.2%})")
    _run_verify(verify, "after")
    return Timing.from_samples(samples, mode=mode, cold_l2=cold, stop=stop, notes=notes)


def merge(timings: Sequence[Timing], extra_notes: Sequence[str] = ()) -> Timing:
    """Pool the samples of several Timings of the same callable into one."""
    if not timings:
        raise ValueError("merge needs at least one Timing")
    samples = [x for t in timings for x in t.samples_ms]
    if not samples:
        raise ValueError("merge needs Timings that kept their samples")
    modes = {t.mode for t in timings}
    mode = modes.pop() if len(modes) == 1 else "events"
    notes = list(dict.fromkeys(n for t in timings for n in t.notes if not n.startswith(("converged", "stopped"))))
    if len({t.mode for t in timings}) > 1:
        notes.append("runs used different modes: " + ", ".join(t.mode for t in timings))
    stops = [t.stop for t in timings]
    stop = "converged" if all(s == "converged" for s in stops) else next(s for s in stops if s != "converged")
    notes.append(f"pooled {len(samples)} reps from {len(timings)} runs; run medians (ms): "
                 + ", ".join(f"{t.median_ms:.4g}" for t in timings))
    notes.extend(extra_notes)
    return Timing.from_samples(samples, mode=mode, cold_l2=all(t.cold_l2 for t in timings), stop=stop,
                               notes=notes)


def interleave_order(names: Sequence[str], rounds: int) -> list[str]:
    """Run order A B, B A, A B, ... (each round reversed from the last), so that neither
    callable always runs first, right after the other, or on a hotter GPU."""
    order: list[str] = []
    for r in range(rounds):
        order.extend(names if r % 2 == 0 else list(reversed(names)))
    return order


def time_interleaved(fns: Mapping[str, Callable], *, rounds: int = 4,
                     verify: Optional[Mapping[str, Callable[[], object]]] = None,
                     rotate: Optional[Mapping[str, Sequence[Sequence]]] = None,
                     _time: Callable[..., Timing] = time_gpu, **kwargs) -> dict[str, Timing]:
    """Time several callables in alternating runs (`interleave_order`), each run by `time_gpu`
    with kwargs, and pool each callable's samples (`merge`). verify[name] runs before the first
    run and after the last run of that callable."""
    names = list(fns)
    if not names:
        raise ValueError("fns must name at least one callable")
    if not _is_int(rounds) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} is not allowed; allowed: an integer >= 1")
    verify = dict(verify or {})
    rotate = dict(rotate or {})
    for key in list(verify) + list(rotate):
        if key not in fns:
            raise ValueError(f"{key!r} in verify/rotate names no callable; callables: {', '.join(names)}")
    for name in names:
        _run_verify(verify.get(name), f"of {name} before")
    runs: dict[str, list[Timing]] = {n: [] for n in names}
    for name in interleave_order(names, rounds):
        runs[name].append(_time(fns[name], rotate=rotate.get(name), **kwargs))
    for name in names:
        _run_verify(verify.get(name), f"of {name} after")
    order = " ".join(interleave_order(names, rounds))
    return {n: merge(runs[n], [f"interleaved with {', '.join(x for x in names if x != n)}: {order}"]
                     if len(names) > 1 else []) for n in names}

"""A live run: build the kernel, run it once in a child process with the trace sink, and turn what
came back (output, taps, or the error and the taps recovered) into a Recording.

The kernel never runs in this process: an illegal address or a trap poisons a CUDA context
for good, and a hang must not hang the oracle (harness.runner).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

from harness import trace_format
from harness._protocol import POISON_BYTE
from harness.build import build_cubin, build_library, load_cubin
from harness.errors import NoGpuError
from harness.launch import TensorMapArg
from harness.runner import KernelRun, SinkRequest, run_kernel, run_library
from kernels_ref import first_call
from kernels_ref.dtypes import DTYPES
from kernels_ref.scales import groups_of_problem as scale_groups
from oracle.problem.attention import is_attention
from oracle.run import attention_live
from oracle.run.case_types import Case, CaseError
from oracle.run.adapters import library_defines
from oracle.run.kernel_flags import build_options
from oracle.run.library_epilogue import declared_order, with_library_order
from oracle.run.inputs import Operands, Provenance, analytic_ones_value, check_operands
from oracle.run.recording import Recording, trace_warnings, without_padding_tiles
from oracle.run.launch import from_storage, is_library, launch_sequence, library_call
from oracle.run.sink import check_case, initial_sink_bytes, trace_selection


@dataclass(frozen=True)


class LiveRun:
    recording: Recording
    run: KernelRun
    build_cached: Optional[bool]
    trace_notes: tuple[str, ...]
    phases_s: dict = None  # wall seconds of build, run (the child, with transfers) and parse


NO_GPU = ("no CUDA GPU is visible (torch.cuda.is_available() is False): a live case builds and runs its kernel "
          "on one; judge a recording instead (a dump, the demo, a reproducer's run) or run on a machine with a GPU")


def require_gpu() -> None:
    """NoGpuError unless a CUDA device is visible: every live run checks it before it builds."""
    if not torch.cuda.is_available():
        raise NoGpuError(NO_GPU)


def run_live(case: Case, ops: Operands, provenance: Provenance, *, timeout_s: Optional[float] = None,
             timing: Optional[dict] = None, command: Sequence[str] = (), smem_poison: Optional[int] = None,
             while_running: Optional[Callable[[], None]] = None) -> LiveRun:
    """Build, run and trace `case` once; with `timing` (oracle.run.perf.kernel_timing_request) the
    child then times the kernel (case.kernel.time_entry if set) with the sink off. `command`: the
    command line that asked for the run, kept in the recording so a report can say how to re-run
    it with other tiles traced. `smem_poison`: fill the kernel's dynamic shared memory with this
    32-bit pattern first (the trace header's smem_prologue(); see run_kernel). Repeated runs are
    oracle.run.races.run_races. `while_running`: the caller's preparation for judging
    (kernels_ref.first_call), done while the child runs."""
    t0 = time.perf_counter()
    budget, ceiling = check_case(case)  # before building: a bad case fails fast
    (attention_live.check_operands if is_attention(case.spec) else check_operands)(case.spec, ops)
    require_gpu()  # before building: without a GPU the build would be for nothing
    if is_library(case):
        return _run_live_library(case, ops, provenance, budget, ceiling, t0, timeout_s=timeout_s, timing=timing,
                                 command=command, smem_poison=smem_poison, while_running=while_running)
    sequence, tensors = launch_sequence(case, ops)
    launch = sequence[0][1]
    if timing is not None and len(sequence) > 1:
        raise CaseError(f"the case launches {len(sequence)} kernels: timing measures one launch")
    k = case.kernel
    host_maps = tuple(a.spec.to_descriptor_record(a.tensor_name) for a in launch.args
                      if isinstance(a, TensorMapArg))
    cached = None
    if k.cubin:
        cubin = load_cubin(k.cubin)
    else:
        defines = {"ORACLE_TRACE": "1", **k.defines}
        # the trace header's folder is always searched, after the case's include_dirs
        br = build_cubin(k.source, arch=k.arch, defines=defines, **build_options(k))
        cubin, cached = br.read(), br.cached  # the verified bytes
    sel = trace_selection(case)
    capacity = initial_sink_bytes(budget, ceiling)
    prefix = trace_format.sink_prefix(capacity, tiles=sel.tiles, k_blocks=sel.k_blocks, stages=sel.stages,
                                      groups=sel.groups)
    if timing is not None and k.time_entry:
        timing = {**timing, "entry": k.time_entry}
    t1 = time.perf_counter()
    first_call.start(while_running)  # this process's first-judgement costs, paid while it waits for the child
    try:
        run = run_kernel(cubin, k.entry, launch, tensors, sink=SinkRequest(prefix, capacity=capacity,
                                                                          max_bytes=ceiling),
                         timeout_s=timeout_s, timing=timing, then=sequence[1:], smem_poison=smem_poison)
    finally:
        first_call.wait()
    t2 = time.perf_counter()
    return _recording(case, ops, provenance, run, budget, ceiling, host_maps, cached, (t0, t1, t2), command)


def _run_live_library(case: Case, ops: Operands, provenance: Provenance, budget, ceiling: int, t0: float, *,
                      timeout_s, timing, command, smem_poison, while_running) -> LiveRun:
    """run_live for a launch library: built as a shared object, called through oracle_launch."""
    if smem_poison is not None:
        raise CaseError("shared-memory poison is written through the kernel module's symbol, which a launch "
                        "library's kernels keep to themselves: not available for [kernel] library cases")
    call, tensors = library_call(case, ops)
    k = case.kernel
    br = build_library(k.library, arch=k.arch, defines=library_defines(k, case.spec, traced=True), **build_options(k))
    # the order the library's epilogue tree declares: the case's when it declares none, else refused if another
    case, order_note = with_library_order(case, declared_order(br.read()) if k.adapter is not None else None)
    sel = trace_selection(case)
    capacity = initial_sink_bytes(budget, ceiling)
    prefix = trace_format.sink_prefix(capacity, tiles=sel.tiles, k_blocks=sel.k_blocks, stages=sel.stages,
                                      groups=sel.groups)
    t1 = time.perf_counter()
    first_call.start(while_running)
    try:
        run = run_library(br, call, tensors, sink=SinkRequest(prefix, capacity=capacity, max_bytes=ceiling),
                          timeout_s=timeout_s, timing=timing)
    finally:
        first_call.wait()
    t2 = time.perf_counter()
    live = _recording(case, ops, provenance, run, budget, ceiling, (), br.cached, (t0, t1, t2), command)
    if order_note is None:
        return live
    rec = replace(live.recording, notes=live.recording.notes + (order_note,))
    return replace(live, recording=rec, trace_notes=live.trace_notes + (order_note,))


def library_descriptor_note(descriptors, taps) -> str:
    """What a launch library's descriptor stages rest on: its tensor maps are its own host code, so
    the oracle encoded none and only what its kernel tapped was observed (a stage with nothing
    tapped is NOT_RUN, never MATCH)."""
    parts, missing = [], []
    for op in ("a", "b"):
        fields = sum(1 for d in descriptors if d.operand == op)
        images = sum(1 for t in taps if t.stage == f"descriptor_{op}")
        if fields or images:
            parts.append(f"descriptor_{op}: {fields} field record(s), {images} smem image tap(s)")
        else:
            missing.append(f"descriptor_{op}")
    said = "; ".join(parts) if parts else "its kernel tapped no descriptor record"
    return ("launch library: the tensor maps are the library's own host code, so the oracle encoded none; "
            f"{said}" + (f"; not tapped, so unobserved: {', '.join(missing)}" if missing else ""))


def _recording(case: Case, ops: Operands, provenance: Provenance, run: KernelRun, budget, ceiling: int,
               host_maps: tuple, cached, times: tuple, command) -> LiveRun:
    """What came back from a run (output, taps, or the error and the taps recovered) as a Recording."""
    t0, t1, t2 = times
    k, s = case.kernel, case.spec
    notes, confounds = [], ()
    taps, descriptors, account = (), (), None
    over = run.sink_overflow or {}
    if over:
        notes.append(f"the first launch's {over['first_capacity']}-byte sink (sized from the selection: "
                     f"{budget.describe()}) overflowed; the kernel needed {over['needed']} bytes, " +
                     ("so it was launched again with a sink of that size" if over.get("relaunched") else
                      f"more than the {ceiling >> 20} MiB ceiling (ORACLE_TRACE_MAX_MB), so the trace is incomplete"))
    if is_attention(s):
        if not run.ok and not run.kernel_fault:
            raise CaseError(f"the kernel could not be run: {run.describe()}\n{run.stderr_tail}")
        rec = attention_live.recording(s, ops, run, kernel=k.entry, notes=notes, environment=_environment(run),
                                       command=command, relaunched=bool(over.get("relaunched")),
                                       first_capacity=over.get("first_capacity"))
        return LiveRun(rec, run, cached, tuple(notes), {"build": t1 - t0, "run": t2 - t1,
                                                        "parse": time.perf_counter() - t2})
    if run.sink is not None:
        trace = trace_format.parse_trace(run.sink, block_m=s.tile.bm, block_n=s.tile.bn, block_k=s.tile.bk,
                                         partial=not run.ok, scale_groups=scale_groups(s))
        taps, padding = without_padding_tiles(s, trace.taps)
        descriptors = trace.descriptors
        notes.extend(padding)
        account = trace_format.account_of(trace, relaunched=bool(over.get("relaunched")),
                                          first_capacity=over.get("first_capacity"))
        confounds, kept = trace_warnings(trace)  # a warning the judgement rests on is an open confound
        notes.extend(kept)
        notes.append(f"trace: {len(taps)} taps from {trace.records} records, {trace.used_bytes} of {trace.capacity} "
                     f"sink bytes ({run.sink_source})" + ("" if trace.complete else f", {trace.dropped} dropped"))
    if is_library(case):
        notes.append(library_descriptor_note(descriptors, taps))
        if run.launch_return:
            notes.append(f"oracle_launch returned {run.launch_return}"
                         + (f": {run.launch_message}" if run.launch_message else ""))
    descriptors = tuple(descriptors) + host_maps  # the maps the host encoded for this launch
    output = None
    if run.ok:
        output = from_storage(run.outputs["d"], s.d_major)
    kernel_error = None if run.ok else run.describe()
    if not run.ok and not run.kernel_fault:
        raise CaseError(f"the kernel could not be run: {run.describe()}\n{run.stderr_tail}")
    rec = Recording(spec=s, operands=ops, output=output, provenance=provenance, taps=taps,
                    descriptors=descriptors, kernel=k.entry, kernel_error=kernel_error,
                    environment=_environment(run), trace=account, output_poison=POISON_BYTE,
                    command=tuple(command), confounds=confounds,
                    serialised=k.adapter.serialised if k.adapter is not None else (),
                    guard_breaches=tuple(run.guard_breaches))
    if provenance.ladder == "ones" and output is not None:
        notes.append(ones_check(rec))
    rec = replace(rec, notes=tuple(notes))
    phases = {"build": t1 - t0, "run": t2 - t1, "parse": time.perf_counter() - t2}
    return LiveRun(rec, run, cached, tuple(notes), phases)


def _environment(run: KernelRun) -> dict:
    from harness.dump import environment

    env = environment()
    env["device"] = dict(run.device)
    env["function"] = dict(run.function)
    return env


def ones_check(rec: Recording) -> str:
    """With all-ones inputs every output element has one analytic value (a K-grouped problem's: one
    per group, from its K_g)."""
    s = rec.spec
    if s.k_groups is not None:
        return _ones_check_k_groups(rec)
    want = analytic_ones_value(s)
    exp = torch.tensor(want, dtype=torch.float32).to(DTYPES[s.out_dtype].torch).float()
    got = rec.output.float()
    bad = int((got != exp).sum())
    status = "holds everywhere" if bad == 0 else f"FAILS at {bad} of {got.numel()} elements"
    return f"analytic check (ones): every output element must equal {float(exp):g} (K = {s.k}); it {status}"


def _ones_check_k_groups(rec: Recording) -> str:
    s = rec.spec
    bad, said = 0, []
    for g, kg in enumerate(s.k_groups):
        exp = torch.tensor(analytic_ones_value(s, kg), dtype=torch.float32).to(DTYPES[s.out_dtype].torch).float()
        bad += int((rec.output[g * s.m:(g + 1) * s.m].float() != exp).sum())
        said.append(f"{float(exp):g} in group {g} (K = {kg})")
    status = "holds everywhere" if bad == 0 else f"FAILS at {bad} of {rec.output.numel()} elements"
    return f"analytic check (ones): every output element must equal {', '.join(said)}; it {status}"

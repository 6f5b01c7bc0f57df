"""A live run: build the kernel, run it in a child process with the trace sink, and turn what
came back (output, taps, or the error and the taps recovered) into a Recording. For races
(run_races): the traced and the untraced build run again on the same inputs, with shared-memory
poison, or under compute-sanitizer; oracle.judging.repeat compares what they gave.

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
from harness.build import build_cubin, build_library, check_cubin_file, check_source_file, load_cubin
from harness.launch import MAX_GRID, SCALAR_TYPES, LaunchSpec, ScalarArg, TensorArg, TensorMapArg
from harness.launch_abi import SLOTS, AbiError, LibraryCall, TensorSlotArg
from harness.runner import KernelRun, SinkRequest, run_kernel, run_library
from harness.taps import pipeline
from harness.tensormap import mn_dim, operand_tensormap
from harness.trace_budget import TraceBudget, trace_budget
from kernels_ref import first_call
from kernels_ref.dtypes import ALL_TYPES, DTYPES, PACKED, name_of
from oracle import knobs
from oracle.run.case import MAX_REPEAT, Case, CaseError, check_trace_selection, device_sms, evaluate, evaluate_int
from oracle.run.case_grammar import check_case_names
from oracle.run.inputs import (InputError, Operands, Provenance, analytic_ones_value, check_operands,
                           check_problem_size, expected_shapes, operand_limit_bytes)
from oracle.problem.partition import group_offsets, max_partials, tile_partials
from oracle.problem.spec import ACTIVATIONS
from oracle.run.recording import Recording, trace_warnings

@dataclass(frozen=True)
class LiveRun:
    recording: Recording
    run: KernelRun
    build_cached: Optional[bool]
    trace_notes: tuple[str, ...]
    phases_s: dict = None  # wall seconds of build, run (the child, with transfers) and parse
    races: Optional["RaceRuns"] = None  # run with repeat > 1: every run (this is the first traced one)


def _storage(x: torch.Tensor, major: str) -> torch.Tensor:
    """A logical matrix (or a stack of them: B of a grouped problem) laid out in memory by its
    major: row = as is, col = each matrix transposed."""
    return x.contiguous() if major == "row" else x.transpose(-1, -2).contiguous()


def scale_major(spec, name: str) -> Optional[str]:
    """The storage order of a block scale tensor (scale_a / scale_b of kind block), else None."""
    if name in ("scale_a", "scale_b") and getattr(spec, name).kind == "block":
        return getattr(spec, name).major
    return None


def _from_storage(x: torch.Tensor, major: str) -> torch.Tensor:
    return x if major == "row" else x.transpose(-1, -2).contiguous()


def default_trace_tiles(case: Case) -> tuple[tuple[int, int], ...]:
    """The first tile, a middle one and the last (ragged) one: where defects like to hide."""
    s = case.spec
    return tuple(dict.fromkeys([(0, 0), (s.tiles_m // 2, s.tiles_n // 2), (s.tiles_m - 1, s.tiles_n - 1)]))


def _names(case: Case) -> dict[str, int]:
    s = case.spec
    ld = {"lda": s.k if s.a_major == "row" else s.m, "ldb": s.n if s.b_major == "row" else s.k,
          "ldc": s.n if s.c_major == "row" else s.m, "ldd": s.n if s.d_major == "row" else s.m}
    names = {"m": s.m, "n": s.n, "k": s.k, "tiles_m": s.tiles_m, "tiles_n": s.tiles_n, "k_blocks": s.k_blocks,
             "tiles": s.tiles_m * s.tiles_n, "batch": s.batch, **ld}
    sizes = s.group_sizes
    names.update(total_m=s.total_m, splits=s.splits, stream_k_workers=s.stream_k_workers or 0,
                 groups=len(sizes) if sizes else 0,
                 group_tiles_m=sum(-(-g // s.tile.bm) for g in sizes) if sizes else s.tiles_m,
                 max_partials=max_partials(s))
    if sizes:  # leading dimensions of the stacked operands
        names["lda"] = s.k if s.a_major == "row" else s.total_m
        names["ldc"] = s.n if s.c_major == "row" else s.total_m
        names["ldd"] = s.n if s.d_major == "row" else s.total_m
    names["num_sms"] = device_sms()
    return names


def launch_spec(case: Case, ops: Optional[Operands]) -> tuple[LaunchSpec, dict[str, torch.Tensor]]:
    """The harness launch of the case's first kernel and the tensors in memory order."""
    sequence, used = launch_sequence(case, ops)
    if len(sequence) > 1:
        raise CaseError(f"the case launches {len(sequence)} kernels ([[launch.next]]); use launch_sequence")
    return sequence[0][1], used


def launch_sequence(case: Case, ops: Optional[Operands]) -> tuple[list[tuple[str, LaunchSpec]],
                                                                 dict[str, torch.Tensor]]:
    """Every launch of the case ((entry, LaunchSpec): [launch], then [[launch.next]] in order) and the
    tensors they share, in memory order: operands, D, the group offsets of a grouped problem and the
    declared workspaces, each filled as declared. With `ops` None, only the launches: every
    expression evaluated and checked, no tensor made (what check_case does before any input exists)."""
    if case.launch is None:
        raise CaseError("the case has no [launch] table: the oracle cannot guess the kernel's arguments")
    if is_library(case):
        raise CaseError("a launch library ([kernel] library) launches its own kernels: use library_call")
    names = _names(case)
    present, storage = _buffers(case, ops, names)
    used: dict[str, torch.Tensor] = {}
    sequence = [(case.kernel.entry if case.kernel else "",
                 _one_launch(case, case.launch, "[launch]", present, storage, names, used))]
    for i, plan in enumerate(case.launch.next):
        sequence.append((plan.entry, _one_launch(case, plan, f"[[launch.next]] #{i}", present, storage, names, used)))
    return sequence, used


def is_library(case: Case) -> bool:
    """The case's kernel is a launch library ([kernel] library, [launch] abi)."""
    return case.kernel is not None and case.kernel.library is not None


def _buffers(case: Case, ops: Optional[Operands], names: dict) -> tuple[set, dict[str, torch.Tensor]]:
    """The buffers the problem has (operands, D, group offsets, ws_NAME for each workspace) and,
    with `ops`, each of them in memory order, filled as declared (empty without `ops`)."""
    s = case.spec
    present = {n for n, shape in expected_shapes(s).items() if shape is not None} | {"d"}
    offsets = group_offsets(s)
    if offsets is not None:
        present.add("group_offsets")
    sizes = {}
    for w in case.workspaces:
        sizes[w.name] = evaluate_int(w.bytes, names, f"[workspace.{w.name}] bytes", 1, operand_limit_bytes())
        present.add(f"ws_{w.name}")
    if sizes:  # the workspaces beside the operands, against the one budget, before any is allocated
        listed = ", ".join(f"{k} {v} bytes" for k, v in sizes.items())
        try:
            check_problem_size(s, extra=sum(sizes.values()), extra_what=f"the workspaces ({listed[:200]})")
        except InputError as e:
            raise CaseError(f"[workspace] {e}") from None
    storage: dict[str, torch.Tensor] = {}
    if ops is not None:
        storage = {"a": _storage(ops.a, s.a_major), "b": _storage(ops.b, s.b_major)}
        if ops.c is not None:
            storage["c"] = _storage(ops.c, s.c_major)
        for n in ("bias", "scale_a", "scale_b", "b_scales", "b_zeros", "a_scales", "a_zeros"):  # group scales row-major
            v = getattr(ops, n)
            if v is not None:
                storage[n] = _storage(v, scale_major(s, n) or "row")
        d_shape = (s.total_m, s.n) if s.d_major == "row" else (s.n, s.total_m)
        storage["d"] = torch.empty(d_shape, dtype=DTYPES[s.out_dtype].torch)
        if offsets is not None:
            storage["group_offsets"] = torch.tensor(offsets, dtype=torch.int32)
        for w in case.workspaces:
            storage[f"ws_{w.name}"] = workspace_buffer(w, sizes[w.name])
    return present, storage


def _layout(shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    """Strides in elements of a logical `shape` stored row-major, or with its last two axes swapped
    in memory (a column-major matrix, or a stack of them)."""
    if not transposed:
        stored = shape
    else:
        stored = shape[:-2] + (shape[-1], shape[-2])
    strides, acc = [0] * len(stored), 1
    for i in range(len(stored) - 1, -1, -1):
        strides[i], acc = acc, acc * stored[i]
    if transposed:
        strides[-1], strides[-2] = strides[-2], strides[-1]
    return tuple(strides)


def library_call(case: Case, ops: Optional[Operands]) -> tuple[LibraryCall, dict[str, torch.Tensor]]:
    """What a launch library's oracle_launch receives (harness.launch_abi.LibraryCall: every
    operand the problem has, with its element type, logical shape and strides in its storage order;
    the sizes, alpha, beta, the epilogue's codes, split/stream-K, groups, the workspaces) and the
    buffers it names, filled as for a cubin launch. With `ops` None, only the call (checked)."""
    if not is_library(case):
        raise CaseError("the case's kernel is not a launch library ([kernel] library)")
    s = case.spec
    q = s.quant_op
    if q is not None:
        raise CaseError(f"a launch library takes no quantised {q.upper()} ({q}_dtype {getattr(s, f'{q}_dtype')!r}; the "
                        f"oracle/1 ABI has no slot for {q}_scales or {q}_zeros): launch the kernel from [launch] args")
    names = _names(case)
    present, storage = _buffers(case, ops, names)
    shapes = expected_shapes(s)
    shapes["d"] = (s.total_m, s.n)
    dtypes = {"a": s.a_dtype, "b": s.b_dtype, "c": s.c_dtype, "d": s.out_dtype, "bias": s.bias_dtype,
              "scale_a": "fp32", "scale_b": "fp32"}
    tensors, used = [], {}
    for op in SLOTS:
        if op not in present:
            continue
        shape = tuple(shapes[op])
        major = getattr(s, f"{op}_major") if op in ("a", "b", "c", "d") else scale_major(s, op) or "row"
        dtype = dtypes[op]
        if storage:
            used[op] = storage[op]
            dtype = name_of(storage[op].dtype)
        tensors.append(TensorSlotArg(op, op, dtype, shape, _layout(shape, major == "col"), "out" if op == "d" else "in"))
    workspaces = tuple((w.name, f"ws_{w.name}") for w in case.workspaces)
    for _, buffer in workspaces:
        if storage:
            used[buffer] = storage[buffer]
    offsets = "group_offsets" if "group_offsets" in present else None
    if offsets and storage:
        used[offsets] = storage[offsets]
    try:
        call = LibraryCall(
            m=s.total_m, n=s.n, k=s.k, tile=(s.tile.bm, s.tile.bn, s.tile.bk), tensors=tuple(tensors),
            workspaces=workspaces, batch=s.batch, groups=len(s.groups) if s.groups is not None else 0,
            group_offsets=offsets, alpha=float(s.alpha), beta=float(s.beta), splits=s.splits,
            stream_k_workers=s.stream_k_workers or 0, activation=ACTIVATIONS.index(s.activation), bias_kind=s.bias,
            scale_a_kind=s.scale_a.kind, scale_b_kind=s.scale_b.kind, scale_a_block=s.scale_a.block or (0, 0),
            scale_b_block=s.scale_b.block or (0, 0), abi=case.launch.abi)
    except AbiError as e:
        raise CaseError(f"the problem cannot be passed to a launch library ({case.launch.abi}): {e}") from None
    return call, used


def workspace_buffer(w, nbytes: int) -> torch.Tensor:
    """A workspace's bytes as declared: zeros, the 0xFF poison, or stale data."""
    if nbytes <= 0:
        raise CaseError(f"[workspace.{w.name}] bytes evaluates to {nbytes}; it must be positive")
    size = {"uint8": 1, "int32": 4, "fp32": 4}[w.dtype]
    count = -(-nbytes // size)
    if w.init == "zero":
        return torch.zeros(count * size, dtype=torch.uint8)
    if w.init == "poison":
        return torch.full((count * size,), POISON_BYTE, dtype=torch.uint8)
    g = torch.Generator().manual_seed(0x57A1E + count)
    if w.dtype == "fp32":
        junk = (torch.randn(count, generator=g) * 64).float()
    elif w.dtype == "int32":
        junk = torch.randint(1, 16, (count,), generator=g, dtype=torch.int32)
    else:
        junk = torch.randint(0, 256, (count,), generator=g, dtype=torch.int64).to(torch.uint8)
    return junk.view(torch.uint8).clone()


def _one_launch(case: Case, lp, where0: str, present: set, storage: dict, names: dict, used: dict) -> LaunchSpec:
    """One launch's arguments. `present` names the tensors the problem has; `storage` holds them
    (empty when only checking)."""
    s = case.spec

    def use(name: str) -> None:
        if storage:
            used[name] = storage[name]

    args = []
    for i, a in enumerate(lp.args):
        where = f"{where0} args[{i}]"
        if a.kind == "operand":
            if a.name in present:
                args.append(TensorArg(a.name, "out" if a.name == "d" else "in"))
                use(a.name)
            else:
                args.append(ScalarArg(0, "u64"))  # the problem does not use it: a null pointer
        elif a.kind == "workspace":
            if f"ws_{a.name}" not in present:
                raise CaseError(f"{where}: workspace {a.name!r} is not declared ([workspace.{a.name}])")
            args.append(TensorArg(f"ws_{a.name}", "inout"))
            use(f"ws_{a.name}")
        elif a.kind == "null":
            args.append(ScalarArg(0, "u64"))
        elif a.kind == "size":
            v = int(names[a.name])
            if not -(2**31) <= v < 2**31:
                raise CaseError(f"{where} = {a.name!r}: {v} does not fit the i32 a size argument is passed as")
            args.append(ScalarArg(v, "i32"))
        elif a.kind == "float":
            args.append(ScalarArg(float(getattr(s, a.name)), "f32"))
        elif a.kind == "literal":
            args.append(_literal(a, names, where))
        elif a.kind == "tensormap":
            if a.name not in present:
                raise CaseError(f"{where}: a tensor map over {a.name!r}, which the problem does not use")
            if s.group_sizes is not None:
                raise CaseError(f"{where}: tensor maps of a grouped or batched problem are not built by the harness")
            tm, padded = _tensormap(case, a, names, where)
            args.append(TensorMapArg(a.name, tm))
            if storage:
                if padded and a.name not in used:  # a later launch's map over the same operand reuses the padding
                    stored = storage[a.name]
                    junk = stale_rows(padded, stored.shape[1], stored.dtype, seed=padded + stored.shape[0])
                    storage[a.name] = torch.cat([stored, junk])
                use(a.name)
    grid = tuple(evaluate_int(g, names, f"{where0} grid[{i}]", 1, MAX_GRID[i]) for i, g in enumerate(lp.grid))
    return LaunchSpec(grid=grid, block=lp.block, args=tuple(args), shared_mem_bytes=lp.shared_mem_bytes,
                      cluster=lp.cluster)


def _literal(a, names: dict, where: str) -> ScalarArg:
    """A literal argument evaluated for its C type: an integer in the type's range, or a finite float."""
    _, lo, hi = SCALAR_TYPES[a.ctype]
    if lo is not None:
        return ScalarArg(evaluate_int(a.expr, names, f"{where} ({a.ctype})", lo, hi), a.ctype)
    return ScalarArg(float(evaluate(a.expr, names, f"{where} ({a.ctype})")), a.ctype)


def _tensormap(case: Case, a, names: dict, where: str):
    """The operand's tensor map with the case's host-side options, and how many padding rows its
    buffer needs past the operand (0 unless the map covers padding rows)."""
    s = case.spec
    op, opts = a.name, dict(a.options)
    if op == "b" and s.b_dtype in PACKED:
        raise CaseError(f"{where}: the oracle builds no tensor map over a packed {s.b_dtype} B (two values a byte); "
                        f"pass b as a pointer")
    major = getattr(s, f"{op}_major")
    rows, cols = (s.m, s.k) if op == "a" else (s.k, s.n)
    tm = operand_tensormap(op, major, rows, cols, getattr(s, f"{op}_dtype"), s.tile.bm if op == "a" else s.tile.bn,
                           s.tile.bk, opts.get("swizzle", getattr(s, f"swizzle_{op}")),
                           opts.get("oob_fill", s.oob_fill))
    changes, padded = {}, 0
    if "rows" in opts:
        # the padded extent of M (A) or N (B): rows for a row-major A, columns for a col-major B
        mn_axis = mn_dim(op, major)
        real = tm.global_dims[mn_axis]
        total = evaluate_int(opts["rows"], names, f"{where} rows", 1, 2**32)
        if total < real:
            raise CaseError(f"{where}: rows = {total} is fewer than the operand's {real}")
        if mn_axis == 0:
            raise CaseError(f"{where}: rows pads the outer dimension; operand {op} ({major}-major) has M/N "
                            f"contiguous, which this option does not pad")
        extra = (total - real) * tm.global_dims[0] * DTYPES[getattr(s, f"{op}_dtype")].itemsize
        if extra > operand_limit_bytes():
            raise CaseError(f"{where}: rows = {total} pads the operand with {extra} bytes, more than the operand "
                            f"limit (ORACLE_MAX_OPERAND_MB)")
        dims = list(tm.global_dims)
        dims[1] = total
        changes["global_dims"] = tuple(dims)
        padded = total - real
    if "stride_bytes" in opts:
        changes["global_strides"] = (evaluate_int(opts["stride_bytes"], names, f"{where} stride_bytes", 0, 2**64 - 1),)
    if "box_inner" in opts:
        changes["box_dims"] = (evaluate_int(opts["box_inner"], names, f"{where} box_inner", 0, 2**32 - 1),) \
            + tm.box_dims[1:]
    if changes:
        tm = replace(tm, **changes)  # validated again: the driver's rules still hold
    return tm, padded


def stale_rows(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Junk left in padding rows by an earlier use of the buffer: finite, large, deterministic."""
    g = torch.Generator().manual_seed(0x5EED + seed)
    junk = torch.randn(rows, cols, generator=g, dtype=torch.float32) * 64
    return junk.to(dtype) if dtype.is_floating_point else junk.clamp(-127, 127).to(dtype)


MIN_SINK_BYTES = 1 << 20


def check_case(case: Case) -> tuple[TraceBudget, int]:
    """Every check of a live case that needs no inputs, no build and no GPU, made before any of
    them: the [launch] table evaluated in full (grid, literals, tensor maps), the trace selection
    against the tile grid, the k-blocks and the sink's ceiling, the operands' size against the
    memory there is, and the kernel's files (a source or cubin that is a regular file within its
    size limit). Returns the sink budget (sink_budget). Raises CaseError, BuildError, InputError,
    LaunchError or TensorMapError naming what is wrong."""
    if case.kernel is None:
        raise CaseError("no kernel to run: give --kernel FILE.cu and --entry NAME, or a [kernel] table")
    check_case_names(case, CaseError)  # what reaches nvcc or a generated file, in its grammar
    check_problem_size(case.spec)  # first: every later check may walk the tile grid or the partition
    if is_library(case):
        library_call(case, None)
    else:
        launch_sequence(case, None)
    check_trace_selection(case)
    budget = sink_budget(case)
    k = case.kernel
    if k.library:
        check_source_file(k.library)
    elif k.cubin:
        check_cubin_file(k.cubin)
    else:
        check_source_file(k.source)
    return budget


def _problem_stages(case: Case) -> tuple[str, ...]:
    """The stages a kernel of this problem can tap: its pipeline, epilogue in the declared order."""
    return pipeline([n.step for n in case.spec.epilogue_nodes], case.spec.dequant_operands)[:-1]


def trace_selection(case: Case) -> trace_format.TraceSelection:
    tiles = case.trace.tiles if case.trace.tiles is not None else default_trace_tiles(case)
    try:
        return trace_format.TraceSelection(tiles=tiles, k_blocks=case.trace.k_blocks,
                                           stages=case.trace.stages or _problem_stages(case))
    except ValueError as e:
        raise CaseError(f"trace selection: {e}") from None


def sink_budget(case: Case) -> tuple[TraceBudget, int]:
    """The selection's size and the ceiling the sink may grow to (bytes); a selection that cannot
    fit under the ceiling is refused here, before anything is built or launched."""
    s = case.spec
    size = {f"descriptor_{op}": ALL_TYPES[getattr(s, f"{op}_dtype")].itemsize for op in "ab"}
    size.update({f"load_{op}": ALL_TYPES[getattr(s, f"{op}_dtype")].itemsize for op in "ab"})
    size.update({f"dequant_{op}": DTYPES[s.mma_dtype].itemsize for op in "ab"})
    size["epilogue_cast"] = DTYPES[s.out_dtype].itemsize
    budget = trace_budget(trace_selection(case), tiles_m=s.tiles_m, tiles_n=s.tiles_n, k_blocks=s.k_blocks,
                          block_m=s.tile.bm, block_n=s.tile.bn, block_k=s.tile.bk, itemsize=size)
    if s.group_sizes is not None:  # a tile selector matches that tile in every group
        g = len(s.group_sizes)
        budget = replace(budget, least=512 + g * (budget.least - 512), estimate=512 + g * (budget.estimate - 512))
    mb = case.trace.capacity_mb or knobs.TRACE_MAX_MB.get()
    ceiling = mb << 20
    if budget.least > ceiling:
        per_tile = max(1, (budget.least - 512) // max(budget.tiles, 1))
        raise CaseError(f"the trace selection ({budget.describe()}) cannot fit in the {mb} MiB ceiling of the sink: "
                        f"raise it (ORACLE_TRACE_MAX_MB, or [trace] capacity_mb) or narrow the selection: "
                        f"--trace-tiles with at most {max(1, ceiling // per_tile)} tile(s), fewer --trace-k-blocks, "
                        f"or --trace-stages naming only the stages the kernel taps")
    return budget, ceiling


def initial_sink_bytes(budget: TraceBudget, ceiling: int) -> int:
    """The sink a launch starts with: the selection's estimate, at least MIN_SINK_BYTES, at most the ceiling."""
    return min(ceiling, max(MIN_SINK_BYTES, -(-budget.estimate // 4096) * 4096))


def run_live(case: Case, ops: Operands, provenance: Provenance, *, timeout_s: Optional[float] = None,
             timing: Optional[dict] = None, command: Sequence[str] = (), smem_poison: Optional[int] = None,
             repeat: int = 1, while_running: Optional[Callable[[], None]] = None) -> LiveRun:
    """Build, run and trace `case` once; with `timing` (oracle.run.perf.kernel_timing_request) the
    child then times the kernel (case.kernel.time_entry if set) with the sink off. `command`: the
    command line that asked for the run, kept in the recording so a report can say how to re-run
    it with other tiles traced. `smem_poison`: fill the kernel's dynamic shared memory with this
    32-bit pattern first (the trace header's smem_prologue(); see run_kernel). `repeat` N > 1 runs
    the traced and the untraced build N times each on the same inputs (run_races, as compare
    --repeat N): the first traced run is returned, every run in `races` for
    oracle.judging.repeat.compare_runs; neither timing nor poison goes with it. `while_running`: the
    caller's preparation for judging (kernels_ref.first_call), done while the child runs."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 1 <= repeat <= MAX_REPEAT:
        raise CaseError(f"repeat {repeat!r} must be an integer from 1 to {MAX_REPEAT}")
    if repeat > 1:
        if timing is not None or smem_poison is not None:
            raise CaseError(f"repeat {repeat}: timing and shared-memory poison go with one run; time or poison the "
                            f"kernel in a run of its own")
        rr = run_races(case, ops, provenance, repeat=repeat, timeout_s=timeout_s, command=command,
                       while_running=while_running)
        return replace(rr.first, races=rr)
    t0 = time.perf_counter()
    budget, ceiling = check_case(case)  # before building: a bad case fails fast
    check_operands(case.spec, ops)
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
        br = build_cubin(k.source, arch=k.arch, defines=defines)  # the trace header's folder is always searched
        cubin, cached = br.read(), br.cached  # the verified bytes
    sel = trace_selection(case)
    capacity = initial_sink_bytes(budget, ceiling)
    prefix = trace_format.sink_prefix(capacity, tiles=sel.tiles, k_blocks=sel.k_blocks, stages=sel.stages)
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
    br = build_library(k.library, arch=k.arch, defines={"ORACLE_TRACE": "1", **k.defines})
    sel = trace_selection(case)
    capacity = initial_sink_bytes(budget, ceiling)
    prefix = trace_format.sink_prefix(capacity, tiles=sel.tiles, k_blocks=sel.k_blocks, stages=sel.stages)
    t1 = time.perf_counter()
    first_call.start(while_running)
    try:
        run = run_library(br, call, tensors, sink=SinkRequest(prefix, capacity=capacity, max_bytes=ceiling),
                          timeout_s=timeout_s, timing=timing)
    finally:
        first_call.wait()
    t2 = time.perf_counter()
    return _recording(case, ops, provenance, run, budget, ceiling, (), br.cached, (t0, t1, t2), command)


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
    if run.sink is not None:
        trace = trace_format.parse_trace(run.sink, block_m=s.tile.bm, block_n=s.tile.bn, block_k=s.tile.bk,
                                         partial=not run.ok)
        taps, descriptors = trace.taps, trace.descriptors
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
        output = _from_storage(run.outputs["d"], s.d_major)
    kernel_error = None if run.ok else run.describe()
    if not run.ok and not run.kernel_fault:
        raise CaseError(f"the kernel could not be run: {run.describe()}\n{run.stderr_tail}")
    rec = Recording(spec=s, operands=ops, output=output, provenance=provenance, taps=taps,
                    descriptors=descriptors, kernel=k.entry, kernel_error=kernel_error,
                    environment=_environment(run), trace=account, output_poison=POISON_BYTE,
                    command=tuple(command), confounds=confounds,
                    serialised=k.adapter.serialised if k.adapter is not None else ())
    if provenance.ladder == "ones" and output is not None:
        notes.append(_ones_check(rec))
    rec = replace(rec, notes=tuple(notes))
    phases = {"build": t1 - t0, "run": t2 - t1, "parse": time.perf_counter() - t2}
    return LiveRun(rec, run, cached, tuple(notes), phases)


def _environment(run: KernelRun) -> dict:
    from harness.dump import environment

    env = environment()
    env["device"] = dict(run.device)
    env["function"] = dict(run.function)
    return env


def _ones_check(rec: Recording) -> str:
    """With all-ones inputs every output element has one analytic value."""
    s = rec.spec
    want = analytic_ones_value(s)
    exp = torch.tensor(want, dtype=torch.float32).to(DTYPES[s.out_dtype].torch).float()
    got = rec.output.float()
    bad = int((got != exp).sum())
    status = "holds everywhere" if bad == 0 else f"FAILS at {bad} of {got.numel()} elements"
    return f"analytic check (ones): every output element must equal {float(exp):g} (K = {s.k}); it {status}"


@dataclass(frozen=True)
class RaceRuns:
    """A live case run for races (oracle.judging.repeat): the first traced run (the one judged), every
    traced recording, the untraced build's outputs, the two poison runs' outputs and the
    sanitizer's report."""

    first: LiveRun
    traced: tuple[Recording, ...]
    untraced: tuple[Optional[torch.Tensor], ...]
    failed: tuple[str, ...]
    poison: Optional[tuple[int, int]] = None
    poisoned: tuple[Optional[torch.Tensor], ...] = ()
    poison_note: str = ""
    sanitizer: Optional[object] = None  # harness.sanitizer.SanitizerReport
    untraced_entry: str = ""


def untraced_build(case: Case):
    """The case's kernel built without -DORACLE_TRACE, and the entry point to run in it
    ([kernel] untraced_entry, default the traced entry's name). A prebuilt cubin has no untraced
    build: CaseError."""
    k = case.kernel
    if k.cubin:
        raise CaseError("a prebuilt [kernel] cubin has no untraced build: give the source to run the untraced "
                        "kernel (--repeat, --sanitize)")
    br = build_cubin(k.source, arch=k.arch, defines=dict(k.defines))
    return br.read(), k.untraced_entry or k.entry


def _run_untraced_library(case: Case, ops: Operands, timeout_s: Optional[float]) -> KernelRun:
    """One call of the launch library built without -DORACLE_TRACE (no sink)."""
    k = case.kernel
    call, tensors = library_call(case, ops)
    br = build_library(k.library, arch=k.arch, defines=dict(k.defines))
    return run_library(br, call, tensors, timeout_s=timeout_s)


def run_untraced(case: Case, ops: Operands, *, timeout_s: Optional[float] = None) -> KernelRun:
    """One run of the untraced build on `ops` (no sink)."""
    if is_library(case):
        return _run_untraced_library(case, ops, timeout_s)
    sequence, tensors = launch_sequence(case, ops)
    cubin, entry = untraced_build(case)
    return run_kernel(cubin, entry, sequence[0][1], tensors, timeout_s=timeout_s, then=sequence[1:])


def run_races(case: Case, ops: Operands, provenance: Provenance, *, repeat: int, smem_poison: Optional[int] = None,
              sanitize: bool = False, timeout_s: Optional[float] = None, command: Sequence[str] = (),
              sanitizer_timeout_s: Optional[float] = None,
              while_running: Optional[Callable[[], None]] = None) -> RaceRuns:
    """`repeat` traced runs and `repeat` untraced runs (each a fresh child process) on the same
    inputs; with `smem_poison`, two more traced runs with that pattern and its complement; with
    `sanitize`, the untraced build once under each compute-sanitizer tool."""
    from harness.sanitizer import find_sanitizer, unavailable_report
    from harness.sanitizer import sanitize as run_sanitizer

    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise CaseError(f"repeat {repeat!r} must be a positive integer")
    if is_library(case) and (sanitize or smem_poison is not None):
        raise CaseError("--sanitize and shared-memory poison run a cubin's kernel by its entry point; a launch "
                        "library ([kernel] library) is entered only through oracle_launch: use --repeat alone")
    first = run_live(case, ops, provenance, timeout_s=timeout_s, command=command, while_running=while_running)
    traced, failed = [first.recording], []
    if first.recording.kernel_error:
        failed.append("traced run 1")
    for i in range(2, repeat + 1):
        rec = run_live(case, ops, provenance, timeout_s=timeout_s, command=command).recording
        traced.append(rec)
        if rec.kernel_error:
            failed.append(f"traced run {i}")
    untraced, entry = [], ""
    want_untraced = repeat > 1 or sanitize
    if want_untraced:
        if is_library(case):
            entry = case.kernel.entry

            def one() -> KernelRun:
                return _run_untraced_library(case, ops, timeout_s)
        else:
            cubin, entry = untraced_build(case)
            sequence, tensors = launch_sequence(case, ops)

            def one() -> KernelRun:
                return run_kernel(cubin, entry, sequence[0][1], tensors, timeout_s=timeout_s, then=sequence[1:])
        for i in range(1, repeat + 1) if repeat > 1 else ():
            run = one()
            if not run.ok and not run.kernel_fault:
                raise CaseError(f"the untraced kernel {entry!r} could not be run: {run.describe()}\n{run.stderr_tail}")
            untraced.append(_from_storage(run.outputs["d"], case.spec.d_major) if run.ok else None)
            if not run.ok:
                failed.append(f"untraced run {i}")
    if len(failed) == len(traced) + len(untraced):
        failed = []  # every run failed alike: that is a KERNEL_ERROR, not a difference between runs
    poison, poisoned, note = None, [], ""
    if smem_poison is not None:
        poison = (smem_poison, complement(smem_poison))
        for p in poison:
            live = run_live(case, ops, provenance, timeout_s=timeout_s, command=command, smem_poison=p)
            applied = (live.run.smem_poison or {}).get("ctas", 0)
            if not applied:
                note = ("the kernel never called oracle_trace smem_prologue() (0 CTAs filled their shared memory): "
                        "the poison runs show nothing")
            poisoned.append(live.recording.output)
        if note:
            poisoned = []
    report = None
    if sanitize and find_sanitizer() is None:
        report = unavailable_report()  # nothing to build for
    elif sanitize:
        cubin, entry = untraced_build(case)
        sequence, tensors = launch_sequence(case, ops)
        limit = sanitizer_timeout_s or max(120.0, 5.0 * float(timeout_s or knobs_timeout()))
        report = run_sanitizer(cubin, entry, sequence[0][1], tensors, timeout_s=limit, then=sequence[1:])
    return RaceRuns(first, tuple(traced), tuple(untraced), tuple(failed), poison, tuple(poisoned), note, report, entry)


def knobs_timeout() -> float:
    from harness import knobs as harness_knobs

    return float(harness_knobs.get("ORACLE_KERNEL_TIMEOUT_S"))


def complement(pattern: int) -> int:
    """The second poison pattern: every bit of the first flipped."""
    return (~pattern) & 0xFFFFFFFF


def parse_pattern(text) -> int:
    """A 32-bit shared-memory poison word: an int, or a string in decimal or 0x hex."""
    if isinstance(text, bool):
        raise ValueError(f"smem poison {text!r} must be a 32-bit word such as 0xFFFFFFFF")
    try:
        v = text if isinstance(text, int) else int(str(text).strip(), 0)
    except ValueError:
        raise ValueError(f"smem poison {text!r} must be a 32-bit word such as 0xFFFFFFFF or 0x7F800001") from None
    if not 0 <= v <= 0xFFFFFFFF:
        raise ValueError(f"smem poison {text!r} must be a 32-bit word (0 to 0xFFFFFFFF)")
    return v

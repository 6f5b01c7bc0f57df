"""A case's launches: the kernel arguments, grid and tensors each launch of a live case takes
(launch_sequence: [launch], then [[launch.next]]), or a launch library's call (library_call), with
the operands, D, group offsets and declared workspaces laid out in memory as declared. Every
expression of the case is evaluated and checked here, before any tensor is made when `ops` is None
(what check_case does)."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from harness._protocol import POISON_BYTE
from harness.launch import MAX_GRID, SCALAR_TYPES, LaunchSpec, ScalarArg, TensorArg, TensorMapArg
from harness.launch_abi import SLOTS, AbiError, LibraryCall, TensorSlotArg
from harness.tensormap import mn_dim, operand_tensormap
from kernels_ref.dtypes import DTYPES, PACKED, name_of
from oracle.run.case_expressions import device_sms, evaluate, evaluate_int
from oracle.run.case_types import Case, CaseError
from oracle.run.inputs import InputError, Operands, check_problem_size, expected_shapes, operand_limit_bytes
from oracle.problem.attention import OUTPUTS as ATTENTION_OUTPUTS, is_attention
from oracle.problem.partition import group_offsets, max_partials
from oracle.run import attention_live
from oracle.problem.spec import ACTIVATIONS


OUTPUT_NAMES = ("d",) + ATTENTION_OUTPUTS  # the buffers a kernel writes: poisoned before, read back after


def _storage(x: torch.Tensor, major: str) -> torch.Tensor:
    """A logical matrix (or a stack of them: B of a grouped problem) laid out in memory by its
    major: row = as is, col = each matrix transposed."""
    return x.contiguous() if major == "row" else x.transpose(-1, -2).contiguous()


def scale_major(spec, name: str) -> Optional[str]:
    """The storage order of a block scale tensor (scale_a / scale_b of kind block), else None."""
    if name in ("scale_a", "scale_b") and getattr(spec, name).kind == "block":
        return getattr(spec, name).major
    return None


def from_storage(x: torch.Tensor, major: str) -> torch.Tensor:
    return x if major == "row" else x.transpose(-1, -2).contiguous()


def launch_names(case: Case) -> dict[str, int]:
    s = case.spec
    if is_attention(s):
        return attention_live.launch_names(s, device_sms())
    ld = {"lda": s.k if s.a_major == "row" else s.m, "ldb": s.n if s.b_major == "row" else s.k,
          "ldc": s.n if s.c_major == "row" else s.m, "ldd": s.n if s.d_major == "row" else s.m}
    names = {"m": s.m, "n": s.n, "k": s.k, "tiles_m": s.tiles_m, "tiles_n": s.tiles_n, "k_blocks": s.k_blocks,
             "tiles": s.tiles_m * s.tiles_n, "batch": s.batch, **ld}
    sizes = s.group_sizes
    names.update(total_m=s.total_m, splits=s.splits, stream_k_workers=s.stream_k_workers or 0,
                 groups=len(sizes) if sizes else 0,
                 group_tiles_m=sum(-(-g // s.tile.bm) for g in sizes) if sizes else s.tiles_m,
                 max_partials=max_partials(s))
    if sizes:  # leading dimensions of the stacked operands (a K-grouped problem's A is not stacked)
        names["lda"] = s.k if s.a_major == "row" else s.a_rows
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
    names = launch_names(case)
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
    if is_attention(s):
        present = attention_live.present(s)
    else:
        present = {n for n, shape in expected_shapes(s).items() if shape is not None} | {"d"}
    # a K-grouped problem's kernel reads where each group begins along K (G + 1 entries, K last); a
    # grouped one's, along M
    offsets = None if is_attention(s) else s.k_offsets if s.k_groups is not None else group_offsets(s)
    if offsets is not None:
        present.add("group_offsets")
    sizes = {}
    for w in case.workspaces:
        sizes[w.name] = evaluate_int(w.bytes, names, f"[workspace.{w.name}] bytes", 1, operand_limit_bytes())
        present.add(f"ws_{w.name}")
    if sizes:  # the workspaces beside the operands, against the one budget, before any is allocated
        listed = ", ".join(f"{k} {v} bytes" for k, v in sizes.items())
        try:
            (attention_live.check_size if is_attention(s) else check_problem_size)(
                s, extra=sum(sizes.values()), extra_what=f"the workspaces ({listed[:200]})")
        except InputError as e:
            raise CaseError(f"[workspace] {e}") from None
    storage: dict[str, torch.Tensor] = {}
    if ops is not None and is_attention(s):
        storage = attention_live.buffers(s, ops)
    elif ops is not None:
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
    if ops is not None:
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
    if s.k_groups is not None:
        raise CaseError("a launch library takes no K-grouped problem (k_groups: the oracle/1 ABI passes groups along "
                        "M only): launch the kernel from [launch] args, which may pass group_offsets (the groups' "
                        "offsets along K)")
    names = launch_names(case)
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
                args.append(TensorArg(a.name, "out" if a.name in OUTPUT_NAMES else "in"))
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
            value = getattr(s, a.name)
            if value is None:
                raise CaseError(f"{where} = {a.name!r}: the problem has no {a.name} (set it in [problem])")
            args.append(ScalarArg(float(value), "f32"))
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

"""The reproducer's text files of its launches and its problem: launch.txt (every launch's entry
points, grid, block, shared memory, tensor maps and arguments, fully evaluated; or a launch
library's call) and problem.txt (what repro's host reference reads), with the sink's size."""

from __future__ import annotations

import struct

from harness.launch import ScalarArg, StructArg, TensorArg, TensorMapArg
from harness.launch_abi import BIAS_KINDS, LAUNCH_CODES, SCALE_KINDS, SLOTS, LibraryCall
from harness.tensormap import TensorMapSpec
from harness.trace_format import TraceSelection
from kernels_ref import epilogue_graph
from oracle.problem.attention import is_attention
from oracle.repro import attention as attn
from oracle.repro.errors import ReproError
from oracle.run.case_types import Case, LaunchPlan
from oracle.repro.makefile import BuildPlan

TIMEOUT_S = 60


def _library_launch_text(case: Case, call: LibraryCall, build: BuildPlan, selection: TraceSelection) -> str:
    """launch.txt of a launch library: the two libraries, the trace selection and every field of
    the LaunchArgs the host program fills (floats as bits, tensors by buffer name)."""
    lines = ["# launch.txt: what repro passes to the launch library's oracle_launch; every value evaluated by "
             "python -m oracle repro",
             f"library_traced {build.cubin_traced}", f"library_plain {build.cubin_plain}", f"abi {call.abi}",
             f"timeout_s {TIMEOUT_S}"]
    tiles = selection.tiles
    lines.append("trace_tiles" + ("" if tiles is None else " " + " ".join(f"{tm},{tn}" for tm, tn in tiles)))
    kbs = selection.k_blocks
    lines.append("trace_k_blocks " + ("all" if kbs is None else " ".join(map(str, kbs))))
    if selection.groups is not None:
        lines.append("trace_groups " + " ".join(map(str, selection.groups)))
    lines.append(f"trace_capacity_bytes {sink_bytes(case)}")
    fields = {"m": call.m, "n": call.n, "k": call.k, "batch": call.batch, "groups": call.groups,
              "group_offsets": call.group_offsets or "-", "alpha": _hex_bits(call.alpha, "f32"),
              "beta": _hex_bits(call.beta, "f32"), "splits": call.splits, "stream_k_workers": call.stream_k_workers,
              "activation": call.activation, "bias_kind": BIAS_KINDS.index(call.bias_kind),
              "scale_a_kind": SCALE_KINDS.index(call.scale_a_kind), "scale_b_kind": SCALE_KINDS.index(call.scale_b_kind),
              "scale_a_block": ",".join(map(str, call.scale_a_block)),
              "scale_b_block": ",".join(map(str, call.scale_b_block)), "tile": ",".join(map(str, call.tile))}
    lines.append("call " + " ".join(f"{k}={v}" for k, v in fields.items()) +
                 f"  # alpha {call.alpha!r}, beta {call.beta!r}, activation {case.spec.activation}")
    for t in call.tensors:
        lines.append(f"call_tensor slot={SLOTS[t.slot]} buffer={t.buffer} dtype={LAUNCH_CODES[t.dtype]} "
                     f"rank={len(t.shape)} shape={','.join(map(str, t.shape))} strides={','.join(map(str, t.strides))}"
                     f"  # {t.slot}: {t.dtype}")
    for i, (name, buffer) in enumerate(call.workspaces):
        lines.append(f"call_workspace index={i} name={name} buffer={buffer}")
    return "\n".join(lines) + "\n"


def _plans(case: Case) -> tuple[LaunchPlan, ...]:
    """The case's launch tables in launch order: [launch], then every [[launch.next]]."""
    return (case.launch,) + tuple(case.launch.next)


def _hex_bits(value: float, ctype: str) -> str:
    fmt, ifmt = ("<f", "<I") if ctype == "f32" else ("<d", "<Q")
    return hex(struct.unpack(ifmt, struct.pack(fmt, float(value)))[0])


def _arg_line(a, described: str) -> str:
    if isinstance(a, TensorArg):
        return f"arg ptr {a.name}  # {described}"
    if isinstance(a, ScalarArg):
        if a.ctype in ("f32", "f64"):
            return f"arg {a.ctype} {_hex_bits(a.value, a.ctype)} {float(a.value)!r}  # {described}"
        return f"arg {a.ctype} {int(a.value)}  # {described}"
    if isinstance(a, StructArg):
        return f"arg bytes {a.data.hex()}  # {described}"
    raise ReproError(f"argument {a!r} has no place in launch.txt")


def _describe_arg(case_arg) -> str:
    if case_arg is None:
        return ""
    if case_arg.kind in ("operand", "size", "float"):
        return case_arg.name
    if case_arg.kind == "literal":
        return f"{{ {case_arg.ctype} = {case_arg.expr!r} }}"
    if case_arg.kind == "workspace":
        return f"{{ workspace = {case_arg.name!r} }}"
    if case_arg.kind == "tensormap":
        opts = "".join(f", {k} = {v!r}" for k, v in case_arg.options)
        return f"{{ tensormap = {case_arg.name!r}{opts} }}"
    return case_arg.kind


def _map_line(spec: TensorMapSpec, buffer: str, operand: str) -> str:
    d = spec.driver_args(0)
    fields = dict(operand=operand, buffer=buffer, dtype=spec.dtype, data_type=d["data_type"], rank=spec.rank,
                  dims=",".join(map(str, spec.global_dims)), strides=",".join(map(str, spec.global_strides)) or "-",
                  box=",".join(map(str, spec.box_dims)), element_strides=",".join(map(str, spec.element_strides)),
                  interleave=d["interleave"], swizzle=d["swizzle"], l2_promotion=d["l2_promotion"],
                  oob_fill=d["oob_fill"])
    return "tensormap " + " ".join(f"{k}={v}" for k, v in fields.items()) + \
        f"  # swizzle {spec.swizzle}B, L2 promotion {spec.l2_promotion}B, OOB fill {spec.oob_fill}"


def map_summary(spec: TensorMapSpec) -> str:
    """The fields of a map as cuTensorMapEncodeTiled receives them, in words."""
    d = spec.driver_args(0)
    return (f"dtype {spec.dtype} (CUtensorMapDataType {d['data_type']}), rank {spec.rank}, dims "
            f"{list(spec.global_dims)}, strides {list(spec.global_strides)} bytes, box {list(spec.box_dims)}, "
            f"element strides {list(spec.element_strides)}, interleave {spec.interleave}, swizzle {spec.swizzle}B, "
            f"L2 promotion {spec.l2_promotion}B, OOB fill {spec.oob_fill}")


def _launch_text(case: Case, sequence: list, build: BuildPlan, selection: TraceSelection) -> str:
    lines = ["# launch.txt: what repro launches; every value fully evaluated by python -m oracle repro",
             "cubin_traced kernel_traced.cubin", f"cubin_plain {build.cubin_plain}", f"timeout_s {TIMEOUT_S}"]
    tiles = selection.tiles
    lines.append("trace_tiles" + ("" if tiles is None else " " + " ".join(f"{tm},{tn}" for tm, tn in tiles)))
    kbs = selection.k_blocks
    lines.append("trace_k_blocks " + ("all" if kbs is None else " ".join(map(str, kbs))))
    if selection.groups is not None:
        lines.append("trace_groups " + " ".join(map(str, selection.groups)))
    lines.append(f"trace_capacity_bytes {sink_bytes(case)}")
    if is_attention(case.spec):  # the sink header's stage mask (a GEMM's is the host program's own list)
        lines.append(attn.stages_line(selection))
    lines.append(f"launches {len(sequence)}  # run in this order on the same buffers, each to completion")
    for index, ((_, launch), plan) in enumerate(zip(sequence, _plans(case))):
        where = "[launch]" if index == 0 else f"[[launch.next]] #{index - 1}"
        lines += [f"launch {index}  # {where}", f"entry_traced {build.entries_traced[index]}",
                  f"entry_plain {build.entries_plain[index]}",
                  "grid " + " ".join(map(str, launch.grid)), "block " + " ".join(map(str, launch.block)),
                  "cluster " + " ".join(map(str, launch.cluster)), f"shared_mem_bytes {launch.shared_mem_bytes}"]
        case_args = list(plan.args)
        maps = [a for a in launch.args if isinstance(a, TensorMapArg)]
        for a in maps:
            lines.append(_map_line(a.spec, a.tensor_name, a.tensor_name))
        for i, a in enumerate(launch.args):
            described = f"args[{i}] {_describe_arg(case_args[i] if i < len(case_args) else None)}"
            if isinstance(a, TensorMapArg):
                lines.append(f"arg tensormap {maps.index(a)}  # {described}")
            elif isinstance(a, ScalarArg) and a.ctype == "u64" and a.value == 0 and i < len(case_args) \
                    and case_args[i].kind in ("operand", "null"):
                lines.append(f"arg u64 0  # {described}: a null pointer (not used by the problem)")
            else:
                lines.append(_arg_line(a, described))
    return "\n".join(lines) + "\n"


def sink_bytes(case: Case) -> int:
    """The sink the traced reproducer allocates: what a live run of the case starts with."""
    from oracle.run.sink import initial_sink_bytes, sink_budget

    return initial_sink_bytes(*sink_budget(case))


def _problem_text(case: Case) -> str:
    s = case.spec
    t = s.tile
    lines = ["# problem.txt: the problem, for repro's host reference (oracle.problem.spec.ProblemSpec)",
             f"describe {s.describe()}", f"m {s.m}", f"n {s.n}", f"k {s.k}", f"tile {t.bm} {t.bn} {t.bk}",
             f"total_m {s.total_m}  # rows of A and D"]
    sizes = s.group_sizes
    if sizes is None:
        lines.append("group_sizes none")
    else:  # each group its own GEMM: rows of A and D in order, B[g], bias[g]; tiled from its first row
        lines.append("group_sizes " + " ".join(map(str, sizes)) + ("  # groups" if s.groups is not None else
                                                                  f"  # a batch of {s.batch}"))
    for f in ("a_dtype", "b_dtype", "acc_dtype", "out_dtype", "a_major", "b_major", "c_major", "d_major", "bias",
              "bias_dtype", "activation", "oob_fill"):
        lines.append(f"{f} {getattr(s, f)}")
    lines.append(f"c_dtype {s.c_dtype or 'none'}")
    q = s.quantised_b  # dequantised by the host reference as kernels_ref.dequant does; none: a dense B
    lines += [f"b_packing {s.b_packing or 'none'}", f"b_group_size {s.group_k if q else 'none'}",
              f"b_scales {s.b_scales or 'none'}", f"b_zeros {s.b_zeros}",
              f"dequant_precision {s.resolved_dequant_precision if q else 'none'}"]
    lines.append(f"alpha {float(s.alpha).hex()}  # {s.alpha!r}")
    lines.append(f"beta {float(s.beta).hex()}  # {s.beta!r}")
    lines.append(f"saturate {int(s.saturate)}")
    nodes = s.epilogue_nodes  # the host reference computes the default order only (expected.bin follows any)
    lines.append(f"epilogue {' '.join(n.token for n in nodes)}")
    lines.append(f"epilogue_order {'default' if epilogue_graph.in_default_order(nodes) else 'declared'}")
    lines.append(f"promotion_interval {s.promotion_interval or 'none'}")
    for op in ("a", "b"):
        sc = getattr(s, f"scale_{op}")
        # a block scale's rows, k and stored dtype (e8m0: raw bytes, 2^(b - 127)); a grouped problem's B
        # scales are one [N / gn, K / gk] matrix per group, A's per row stacked with A's rows
        lines.append(f"scale_{op} {sc.kind}" + (f" {sc.block[0]} {sc.block[1]} {sc.dtype}" if sc.block else ""))
    return "\n".join(lines) + "\n"

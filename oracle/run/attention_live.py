"""A live attention case ([problem] kind = "attention"): what its [launch] table may name, its
buffers in memory, the trace it asks for and the sink's budget, and the recording of its run.

The launch names (a [launch] args string, or a name in a grid or literal expression):
- operands Q, K, V, O, LSE and the layout's offsets and page table, in FlashAttention's layouts
  (oracle.run.attention_recording.shapes_of): `q`, `k`, `v`, `o` and `lse` (written by the kernel,
  poisoned before the launch), `cu_seqlens_q`, `cu_seqlens_k` and `page_table` (int32; a null
  pointer where the problem has none);
- sizes (i32): oracle.problem.attention.LAUNCH_SIZES; `group` is heads_q / heads_kv, `total_q` / `total_k` the packed
  lengths of a variable-length problem (batch * seqlen otherwise), `units` batch x heads_q x q_blocks;
- floats (f32): oracle.problem.attention.LAUNCH_FLOATS, the problem's own values (softmax_scale resolved to 1 / sqrt(head_dim)
  when the case leaves it out).
A split-KV kernel keeps its partials in declared workspaces ([workspace.NAME]) and merges them in a
second launch ([[launch.next]]); tensor maps over attention operands are not built by the harness.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness import trace_format
from harness.trace_budget import TraceBudget, attention_trace_budget
from kernels_ref.dtypes import DTYPES
from oracle.problem.attention import CAUSAL_CODES, AttentionSpec
from oracle.run.attention_inputs import AttentionOperands, make_attention_operands
from oracle.run.attention_recording import AttentionRecording, _check_types, shapes_of
from oracle.run.inputs import ATTENTION_LADDER, InputError, Provenance, operand_limit_bytes, parse_inputs
from oracle.run.recording import RecordingError, trace_warnings


def launch_names(spec: AttentionSpec, num_sms: int) -> dict[str, int]:
    """The sizes a launch expression of an attention case may name (module docstring)."""
    return {"batch": spec.batch, "heads_q": spec.heads_q, "heads_kv": spec.heads_kv, "group": spec.group,
            "seqlen_q": spec.seqlen_q, "seqlen_k": spec.seqlen_k, "head_dim": spec.head_dim,
            "head_dim_v": spec.head_dim_v, "block_q": spec.block_q, "block_kv": spec.block_kv,
            "q_blocks": spec.q_blocks, "kv_blocks": spec.kv_blocks, "units": spec.units, "splits": spec.splits,
            "page_size": spec.page_size or 0, "num_pages": spec.num_pages or 0, "max_pages": spec.max_pages or 0,
            "total_q": sum(spec.lengths_q), "total_k": sum(spec.lengths_k), "causal": CAUSAL_CODES[spec.causal],
            "num_sms": num_sms}


def present(spec: AttentionSpec) -> set[str]:
    """The operand buffers the problem has."""
    names = {"q", "k", "v", "o"} | ({"lse"} if spec.lse else set())
    names |= {n for n, on in (("cu_seqlens_q", spec.varlen_q), ("cu_seqlens_k", spec.varlen_k),
                              ("page_table", spec.paged)) if on}
    return names


def operand_bytes(spec: AttentionSpec) -> int:
    shapes = shapes_of(spec)
    size = {"q": spec.q_dtype, "k": spec.k_dtype, "v": spec.v_dtype, "o": spec.o_dtype, "lse": "fp32"}
    return sum(_numel(shapes[n]) * DTYPES[d].itemsize for n, d in size.items())


def check_size(spec: AttentionSpec, extra: int = 0, extra_what: str = "") -> None:
    """Refuse a problem whose Q, K, V, O and LSE (plus `extra` bytes) exceed ORACLE_MAX_OPERAND_MB."""
    need, limit = operand_bytes(spec) + extra, operand_limit_bytes()
    if need > limit:
        what = f"the operands and output of {spec.describe()}" + (f" and {extra_what}" if extra_what else "")
        raise InputError(f"{what} need {need / 2**20:.1f} MiB, more than the {limit >> 20} MiB of "
                         f"ORACLE_MAX_OPERAND_MB: raise it, or run a smaller problem")


def operands(spec: AttentionSpec, inputs: str) -> AttentionOperands:
    """A live request's inputs: a controlled ladder made for the problem, or a dump's Q, K, V (and
    offsets, page table), which must fit the problem."""
    ladder, seed, path = parse_inputs(inputs, ATTENTION_LADDER)
    if ladder == "dump":
        from oracle.run.dumps import load_recording

        rec = load_recording(path)
        if not isinstance(rec, AttentionRecording):
            raise InputError(f"inputs dump:{path} holds a GEMM recording; an attention case needs an attention dump")
        ops = AttentionOperands(rec.q, rec.k, rec.v, Provenance("dump", source=path), rec.cu_seqlens_q,
                                rec.cu_seqlens_k, rec.page_table)
        check_operands(spec, ops)
        return ops
    check_size(spec)
    return make_attention_operands(spec, ladder, seed)


def check_operands(spec: AttentionSpec, ops: AttentionOperands) -> None:
    """Each tensor against the problem: InputError naming it."""
    given = {"q": ops.q, "k": ops.k, "v": ops.v, "cu_seqlens_q": ops.cu_seqlens_q, "cu_seqlens_k": ops.cu_seqlens_k,
             "page_table": ops.page_table}
    try:
        _check_types(spec, {n: (t.dtype, tuple(t.shape)) for n, t in given.items() if t is not None})
    except RecordingError as e:
        raise InputError(f"attention inputs: {e}") from None
    for name in ("cu_seqlens_q", "cu_seqlens_k", "page_table"):
        if (name in present(spec)) != (given[name] is not None):
            raise InputError(f"attention inputs: {name} is {'missing' if given[name] is None else 'given'}, and the "
                             f"problem {'needs it' if given[name] is None else 'has none'}")


def buffers(spec: AttentionSpec, ops: AttentionOperands) -> dict[str, torch.Tensor]:
    """Every operand buffer the problem has, in memory (int32 offsets and page table); O and LSE empty
    (the runner poisons outputs before the launch)."""
    shapes = shapes_of(spec)
    out = {"q": ops.q.contiguous(), "k": ops.k.contiguous(), "v": ops.v.contiguous(),
           "o": torch.empty(shapes["o"], dtype=DTYPES[spec.o_dtype].torch)}
    if spec.lse:
        out["lse"] = torch.empty(shapes["lse"], dtype=torch.float32)
    for name in ("cu_seqlens_q", "cu_seqlens_k", "page_table"):
        t = getattr(ops, name)
        if t is not None:
            out[name] = t.to(torch.int32).contiguous()
    return out


def default_tiles(spec: AttentionSpec) -> tuple[tuple[int, int], ...]:
    """(query block, query head) of the first unit, a middle one and the last (ragged) one."""
    last = (spec.q_blocks - 1, spec.heads_q - 1)
    return tuple(dict.fromkeys([(0, 0), (spec.q_blocks // 2, spec.heads_q // 2), last]))


def budget(spec: AttentionSpec, selection: trace_format.TraceSelection) -> TraceBudget:
    """The sink bytes the selection needs (harness.trace_budget.attention_trace_budget)."""
    size = {"load_q": DTYPES[spec.q_dtype].itemsize, "load_k": DTYPES[spec.k_dtype].itemsize,
            "load_v": DTYPES[spec.v_dtype].itemsize, "p": DTYPES[spec.v_dtype].itemsize}
    return attention_trace_budget(selection, batch=spec.batch, q_blocks=spec.q_blocks, heads_q=spec.heads_q,
                                  kv_blocks=spec.kv_blocks, splits=spec.splits, block_q=spec.block_q,
                                  block_kv=spec.block_kv, head_dim=spec.head_dim, head_dim_v=spec.head_dim_v,
                                  itemsize=size)


def recording(spec: AttentionSpec, ops: AttentionOperands, run, *, kernel: str, notes: list,
              environment: dict, command, relaunched: bool, first_capacity: Optional[int],
              serialised: tuple = ()) -> AttentionRecording:
    """What came back from a run of an attention kernel (O, LSE, the taps, or the error and the taps
    recovered) as an AttentionRecording."""
    taps, account, confounds = (), None, ()
    if run.sink is not None:
        trace = trace_format.parse_trace(run.sink, block_m=spec.block_q, block_n=spec.block_kv,
                                         block_k=spec.head_dim, head_dim_v=spec.head_dim_v, partial=not run.ok)
        taps = trace.taps
        account = trace_format.account_of(trace, relaunched=relaunched, first_capacity=first_capacity)
        confounds, kept = trace_warnings(trace)
        notes.extend(kept)
        notes.append(f"trace: {len(taps)} taps from {trace.records} records, {trace.used_bytes} of {trace.capacity} "
                     f"sink bytes ({run.sink_source})" + ("" if trace.complete else f", {trace.dropped} dropped"))
    o = lse = None
    if run.ok:
        o = run.outputs["o"]
        lse = run.outputs.get("lse")
    rec = AttentionRecording(spec=spec, q=ops.q, k=ops.k, v=ops.v, output=o, provenance=ops.provenance, lse=lse,
                             cu_seqlens_q=ops.cu_seqlens_q, cu_seqlens_k=ops.cu_seqlens_k, page_table=ops.page_table,
                             kernel=kernel, kernel_error=None if run.ok else run.describe(), confounds=confounds,
                             notes=tuple(notes), environment=environment, taps=tuple(taps), trace=account,
                             command=tuple(command), serialised=tuple(serialised),
                             guard_breaches=tuple(run.guard_breaches))
    rec.validate()
    return rec


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n

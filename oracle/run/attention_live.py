"""A live attention run: an attention case's kernel built traced, launched once (with the launches
after it) in a child process with the trace sink, and what came back made into the
AttentionRecording the differential judges.

Data path: AttentionCase + AttentionOperands -> attention_launches: the buffers (q, k, v,
page_table in; o [batch, seqlen_q, heads_q, head_dim_v] and lse [batch, heads_q, seqlen_q] fp32
out; ws_NAME for each workspace, filled as declared) and each launch's LaunchSpec, its arguments
in the case's order -> the cubin of [kernel] source with ORACLE_TRACE and the case's defines
(harness.build) -> harness.runner.run_kernel with a sink selecting the case's trace (a sink that
overflows is run once more at the measured size, up to the ceiling) -> parse_trace (tiles of
block_q x block_kv, head_dim, head_dim_v) -> AttentionRecording (a run that failed: its error, no
output).
Constraints: dense or paged problems (cu_seqlens are not passed yet: a varlen case is refused), one
run, no timing; q, k, v as make_attention_operands lays them out (FlashAttention's layout).
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.build import build_cubin
from harness.launch import LaunchSpec, ScalarArg, TensorArg
from harness.runner import SinkRequest, run_kernel
from harness.taps import ATTENTION_TAP_STAGES
from harness.trace_format import account_of, parse_trace, sink_prefix
from kernels_ref.dtypes import DTYPES
from oracle.run.attention_case import AttentionCase, size_names
from oracle.run.attention_inputs import AttentionOperands
from oracle.run.attention_recording import AttentionRecording
from oracle.run.case import CaseError, evaluate, evaluate_int
from oracle.run.launch import workspace_buffer

OUTPUTS = ("o", "lse")
FIRST_SINK_BYTES = 64 << 20  # the sink's first size; an overflow is run again at the size it measured
MAX_SINK_MB = 4096  # the ceiling when the case's [trace] capacity_mb does not say


def attention_launches(case: AttentionCase, ops: AttentionOperands) -> tuple[list[tuple[str, LaunchSpec]],
                                                                               dict[str, torch.Tensor]]:
    """[(entry, LaunchSpec)] of the case's launches in order, and the tensors they name (on the CPU)."""
    s = case.spec
    if s.varlen_q or s.varlen_k:
        raise CaseError(f"{s.describe()}: a live attention run passes no cu_seqlens yet; use a dense or paged problem")
    names = size_names(s)
    tensors = {"q": ops.q.contiguous(), "k": ops.k.contiguous(), "v": ops.v.contiguous(),
               "o": torch.empty(s.batch, s.seqlen_q, s.heads_q, s.head_dim_v, dtype=DTYPES[s.o_dtype].torch),
               "lse": torch.empty(s.batch, s.heads_q, s.seqlen_q, dtype=torch.float32)}
    if s.paged:
        tensors["page_table"] = ops.page_table.to(torch.int32).contiguous()
    for w in case.workspaces:
        tensors[f"ws_{w.name}"] = workspace_buffer(w, evaluate_int(w.bytes, names, f"[workspace.{w.name}] bytes", 1))
    sequence = []
    for i, plan in enumerate((case.launch,) + case.launch.next):
        where = "[launch]" if i == 0 else f"[[launch.next]] #{i - 1}"
        args = []
        for j, a in enumerate(plan.args):
            if a.kind == "operand":
                args.append(TensorArg(a.name, "out" if a.name in OUTPUTS else "in"))
            elif a.kind == "workspace":
                args.append(TensorArg(f"ws_{a.name}", "inout"))
            elif a.kind == "size":
                args.append(ScalarArg(names[a.name], "i32"))
            elif a.kind == "float":
                args.append(ScalarArg(float(s.softmax_scale), "f32"))
            elif a.kind == "null":
                args.append(ScalarArg(0, "u64"))
            else:  # a literal
                value = evaluate(a.expr, names, f"{where} args[{j}]")
                args.append(ScalarArg(float(value) if a.ctype in ("f32", "f64") else int(value), a.ctype))
        grid = tuple(evaluate_int(g, names, f"{where} grid", 1) for g in plan.grid)
        entry = case.kernel.entry if i == 0 else plan.entry
        sequence.append((entry, LaunchSpec(grid, plan.block, tuple(args), plan.shared_mem_bytes, plan.cluster)))
    return sequence, tensors


def run_attention_live(case: AttentionCase, ops: AttentionOperands, *,
                       timeout_s: Optional[float] = None) -> AttentionRecording:
    """Build, run and trace `case` once on `ops`; the recording of what came back."""
    s = case.spec
    sequence, tensors = attention_launches(case, ops)
    build = build_cubin(case.kernel.source, arch=case.kernel.arch,
                        defines={**dict(case.kernel.defines), "ORACLE_TRACE": "1"})
    stages = case.trace.stages or tuple(x for x in ATTENTION_TAP_STAGES if x != "combine" or s.splits > 1)
    ceiling = (case.trace.capacity_mb or MAX_SINK_MB) << 20
    first = min(FIRST_SINK_BYTES, ceiling)
    sink = SinkRequest(sink_prefix(first, case.trace.tiles, case.trace.k_blocks, stages=stages), capacity=first,
                       max_bytes=ceiling)
    run = run_kernel(build, sequence[0][0], sequence[0][1], tensors, sink=sink, timeout_s=timeout_s,
                     then=tuple(sequence[1:]))
    common = dict(provenance=ops.provenance, page_table=tensors.get("page_table"), kernel=case.kernel.entry)
    if not run.ok:
        return AttentionRecording(s, ops.q, ops.k, ops.v, None, kernel_error=run.describe(), **common)
    trace = parse_trace(run.sink, block_m=s.block_q, block_n=s.block_kv, block_k=s.head_dim, head_dim_v=s.head_dim_v)
    rec = AttentionRecording(s, ops.q, ops.k, ops.v, run.outputs["o"], lse=run.outputs["lse"] if s.lse else None,
                             taps=tuple(trace.taps), trace=account_of(trace), **common)
    rec.validate()
    return rec

"""An attention case file: the problem, the kernel to build, how to launch it and what to trace,
read and checked without building or running anything.

    [problem]
    kind = "attention"          # then oracle.problem.attention.AttentionSpec's fields
    batch = 1
    heads_q = 4
    heads_kv = 2
    seqlen_q = 100
    seqlen_k = 200
    head_dim = 64
    causal = "bottom_right"
    block_q = 64
    block_kv = 64

    [kernel]                    # as a GEMM case's (oracle.run.case): source, entry, untraced_entry,
    source = "fa2_sm80.cu"      # time_entry, defines, arch; the files stay inside the case's folder
    entry = "zoo_fa2_bf16_d64_traced"

    [launch]                    # grid, block, shared_mem_bytes, args; [[launch.next]] for a later
    grid = ["q_blocks", "heads_q", "batch"]       # kernel (the split-KV combine)
    block = [128, 1, 1]
    args = ["q", "k", "v", "o", "lse", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
            "softmax_scale", "causal"]

    [workspace.o_partial]       # as a GEMM case's: buffers the harness allocates for the launches
    bytes = "splits * batch * heads_q * seqlen_q * head_dim_v * 4"

    [trace]                     # tiles = [[query block, query head], ...] (the attention site's
    tiles = [[1, 0]]            # tile: docs/trace-format.md), k_blocks = the KV blocks, stages =
    k_blocks = "all"            # attention's tap stages

Launch arguments: q, k, v (the caches for a paged problem), o, lse, page_table, cu_seqlens_q,
cu_seqlens_k are device pointers (each only where the problem has it); batch, heads_q, heads_kv,
seqlen_q, seqlen_k, head_dim, head_dim_v, q_blocks, kv_blocks, splits, causal (0 none, 1 top_left,
2 bottom_right) and, for a paged problem, page_size, max_pages, num_pages are i32; softmax_scale is
f32; `{ workspace = "NAME" }`, `{ i32 = EXPR }` (u32, i64, u64, f32, f64) and "null" as in a GEMM case.
Grid entries and workspace sizes are expressions of those sizes (oracle.run.case.evaluate), checked
here. A name the problem does not have (page_table of an unpaged problem) is refused naming it.

The live run of an attention case is not built yet: this module reads and checks one (the zoo's
case files are held to it by tests/cpu/test_zoo_attention.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from harness.fields import shown
from harness.taps import ATTENTION_TAP_STAGES
from oracle.problem.attention import CAUSAL, AttentionSpec
from oracle.problem.spec import SpecError
from oracle.run.case import (LITERAL_TYPES, Arg, CaseError, CaseTrust, KernelSource, LaunchPlan, RunPlan, TracePlan,
                             Workspace, evaluate_int, kernel_source, launch_plan, read_case_document, run_plan,
                             trace_plan, workspaces_of)

OPERANDS = ("q", "k", "v", "o", "lse", "page_table", "cu_seqlens_q", "cu_seqlens_k")
SIZES = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v", "q_blocks", "kv_blocks",
         "splits", "causal")
PAGED_SIZES = ("page_size", "max_pages", "num_pages")
FLOATS = ("softmax_scale",)
SECTIONS = ("problem", "kernel", "launch", "trace", "workspace", "run")


@dataclass(frozen=True)
class AttentionCase:
    spec: AttentionSpec
    kernel: KernelSource
    launch: LaunchPlan
    trace: TracePlan
    path: Optional[str] = None
    workspaces: tuple[Workspace, ...] = ()
    run: RunPlan = RunPlan()


def size_names(spec: AttentionSpec) -> dict[str, int]:
    """The sizes a launch argument or an expression may name, for this problem."""
    names = {"batch": spec.batch, "heads_q": spec.heads_q, "heads_kv": spec.heads_kv, "seqlen_q": spec.seqlen_q,
             "seqlen_k": spec.seqlen_k, "head_dim": spec.head_dim, "head_dim_v": spec.head_dim_v,
             "q_blocks": spec.q_blocks, "kv_blocks": spec.kv_blocks, "splits": spec.splits,
             "causal": CAUSAL.index(spec.causal)}
    if spec.paged:
        names.update(page_size=spec.page_size, max_pages=spec.max_pages, num_pages=spec.num_pages)
    return names


def operands_of(spec: AttentionSpec) -> tuple[str, ...]:
    """The pointers this problem has."""
    have = ["q", "k", "v", "o"] + (["lse"] if spec.lse else [])
    have += ["page_table"] if spec.paged else []
    have += ["cu_seqlens_q"] if spec.varlen_q else []
    have += ["cu_seqlens_k"] if spec.varlen_k else []
    return tuple(have)


def _arg(a: Any, i: int) -> Arg:
    where = f"[launch] args[{i}]"
    if isinstance(a, str):
        if a in OPERANDS:
            return Arg("operand", a)
        if a in SIZES or a in PAGED_SIZES:
            return Arg("size", a)
        if a in FLOATS:
            return Arg("float", a)
        if a == "null":
            return Arg("null")
        raise CaseError(f"{where} = {shown(a)} is unknown in an attention case; pointers {', '.join(OPERANDS)}, "
                        f"sizes {', '.join(SIZES + PAGED_SIZES)}, {', '.join(FLOATS)}, null, or a table like "
                        f"{{ i32 = 3 }} / {{ workspace = \"NAME\" }}")
    if isinstance(a, dict) and "workspace" in a:
        if len(a) != 1 or not isinstance(a["workspace"], str):
            raise CaseError(f"{where}: a workspace argument is {{ workspace = \"NAME\" }}, got {shown(a)}")
        return Arg("workspace", a["workspace"])
    if isinstance(a, dict) and len(a) == 1:
        (key, val), = a.items()
        if key in LITERAL_TYPES and not isinstance(val, bool) and isinstance(val, (int, float, str)):
            return Arg("literal", ctype=key, expr=val)
    raise CaseError(f"{where} = {shown(a)} is not an argument description of an attention case")


def _check_launch(spec: AttentionSpec, plan: LaunchPlan, workspaces: tuple[Workspace, ...], where: str) -> None:
    """Every argument names something the problem has, every expression evaluates."""
    names = size_names(spec)
    have = operands_of(spec)
    declared = {w.name for w in workspaces}
    for i, a in enumerate(plan.args):
        at = f"{where} args[{i}]"
        if a.kind == "operand" and a.name not in have:
            raise CaseError(f"{at} = {a.name!r}: the problem has no {a.name} ({spec.describe()}); its pointers are "
                            f"{', '.join(have)}")
        if a.kind == "size" and a.name not in names:
            raise CaseError(f"{at} = {a.name!r}: {a.name} is a paged KV cache's size and the problem is not paged")
        if a.kind == "workspace" and a.name not in declared:
            raise CaseError(f"{at}: workspace {a.name!r} is not declared; declared: {', '.join(sorted(declared)) or 'none'}"
                            f" ([workspace.NAME] tables)")
        if a.kind == "literal" and a.ctype not in ("f32", "f64"):
            evaluate_int(a.expr, names, at, -(2**63))
    for j, g in enumerate(plan.grid):
        evaluate_int(g, names, f"{where} grid[{j}]", 1)


def _trace(spec: AttentionSpec, sec: Any) -> TracePlan:
    """[trace] with attention's stages, and its tiles and KV blocks inside the problem."""
    if not isinstance(sec, dict):
        raise CaseError(f"[trace] = {shown(sec)} must be a table")
    sec = dict(sec)
    stages = sec.pop("stages", "all")
    plan = trace_plan(sec)
    if stages != "all":
        if isinstance(stages, str):
            stages = [s.strip() for s in stages.split(",") if s.strip()]
        if not isinstance(stages, list) or not stages or not all(isinstance(s, str) for s in stages):
            raise CaseError(f"[trace] stages = {shown(stages)} must be \"all\" or a non-empty list of stage names")
        bad = [s for s in stages if s not in ATTENTION_TAP_STAGES]
        if bad:
            raise CaseError(f"[trace] stages {bad} are not attention stages; allowed: {', '.join(ATTENTION_TAP_STAGES)}")
        plan = replace(plan, stages=tuple(dict.fromkeys(stages)))
    for qb, head in plan.tiles or ():
        if qb >= spec.q_blocks or head >= spec.heads_q:
            raise CaseError(f"[trace] tile [{qb}, {head}] (query block, query head) is outside the problem's "
                            f"{spec.q_blocks} query blocks x {spec.heads_q} heads")
    for kb in plan.k_blocks or ():
        if kb >= spec.kv_blocks:
            raise CaseError(f"[trace] k_blocks: KV block {kb} is outside 0..{spec.kv_blocks - 1}")
    return plan


def load_attention_case(path: str, problem_overrides: Mapping[str, Any] = (), *, entry: Optional[str] = None,
                        allow_outside_case_dir: bool = False) -> AttentionCase:
    """The attention case of the file `path`, its [problem] updated with `problem_overrides` and its
    entry point replaced by `entry`; every section checked (CaseError naming the key)."""
    trust = CaseTrust(outside_case_dir=allow_outside_case_dir)
    doc = read_case_document(path, trust)
    unknown = sorted(set(doc) - set(SECTIONS))
    if unknown:
        raise CaseError(f"{path}: unknown section(s) {', '.join(unknown)}; allowed: {', '.join(SECTIONS)}")
    prob = dict(doc.get("problem", {}))
    prob.update(dict(problem_overrides))
    if prob.get("kind") != "attention":
        raise CaseError(f"{path}: [problem] kind = {shown(prob.get('kind'))}; an attention case says kind = "
                        f"\"attention\"")
    try:
        spec = AttentionSpec.from_json(prob)
    except SpecError as e:
        raise CaseError(f"{path}: problem: {e}") from None
    sec = dict(doc.get("kernel") or {})
    if entry is not None:
        sec["entry"] = entry
        sec.pop("time_entry", None)
    if "library" in sec or "cubin" in sec:
        raise CaseError(f"{path}: [kernel] of an attention case names a source (.cu) and its entry points")
    kernel = kernel_source(sec, os.path.dirname(os.path.abspath(path)))
    if kernel is None or "launch" not in doc:
        raise CaseError(f"{path}: an attention case needs [kernel] source and entry, and [launch]")
    launch = launch_plan(doc["launch"], _arg)
    if launch.abi is not None:
        raise CaseError(f"{path}: [launch] abi: an attention case launches its kernels itself (grid, block, args)")
    workspaces = workspaces_of(doc.get("workspace", {}))
    for i, plan in enumerate((launch,) + launch.next):
        _check_launch(spec, plan, workspaces, "[launch]" if i == 0 else f"[[launch.next]] #{i - 1}")
    names = size_names(spec)
    for w in workspaces:
        evaluate_int(w.bytes, names, f"[workspace.{w.name}] bytes", 1)
    trace = _trace(spec, doc.get("trace", {}))
    return AttentionCase(spec, kernel, launch, trace, path, workspaces, run_plan(doc.get("run", {})))

"""What an attention case's reproducer holds beyond a GEMM's (oracle.repro.generate writes both):
problem.txt's attention fields, the reference files (the expected O and LSE with their per-element
bounds), the files a run writes, the trace's stage selection and the README's problem paragraphs.

Data path: AttentionSpec + AttentionOperands -> oracle.judging.attention_expected.expected_attention
(the reference `store` judges with, cross-checked against the float64 specification) ->
expected_o.bin (fp32, O's layout), bound_o.bin (fp64; fp32 rounded up past BOUND_F64_LIMIT
elements), expected_lse.bin (fp32, LSE's layout, the declared empty_lse in a fully masked row),
bound_lse.bin (fp64) -> the host program's attention judgement (host/attention.cuh).

Constraints: the host program has no attention reference of its own, so an attention reproducer
is always written with its reference; a reference that disagrees with its float64 specification
is refused, not written. problem.txt starts with `kind attention` (a GEMM's has no kind line).
"""

from __future__ import annotations

import textwrap

from harness.trace_format import STAGE_CODES, TraceSelection
from oracle.repro.errors import ReproError

REFERENCE_FILES = ("expected_o", "bound_o", "expected_lse", "bound_lse")  # inputs.txt names, files NAME.bin
RUN_OUTPUTS = ("o.bin", "lse.bin")  # beside result.txt and sink.bin
REFERENCE_BYTES_PER_ELEMENT = 40  # the reference's fp32 O, its float64 rows and bound, and the copies written


def reference_bytes(spec) -> int:
    """What the reference takes beside the operands: O's and LSE's values and bounds, a few copies."""
    rows = spec.batch * spec.heads_q * max(spec.seqlen_q, 1)
    return REFERENCE_BYTES_PER_ELEMENT * rows * (spec.head_dim_v + 1)


def expected(spec, operands, bound_of):
    """The reference files, in inputs.txt's order: (name, role, tensor). `bound_of(bound, n)` is the
    writer's rule for a bound file's dtype (fp64, or fp32 rounded up for a large output)."""
    from oracle.judging.attention_expected import expected_attention

    exp = expected_attention(spec, operands)
    if exp.cross_check:
        raise ReproError("the oracle's attention reference disagrees with its float64 specification, so no "
                         "reference was written: " + "; ".join(exp.cross_check)[:600])
    return [("expected_o", "expected", exp.o), ("bound_o", "bound", bound_of(exp.o_bound, exp.o.numel())),
            ("expected_lse", "expected", exp.lse), ("bound_lse", "bound", bound_of(exp.lse_bound, exp.lse.numel()))]


def stages_line(selection: TraceSelection) -> str:
    """launch.txt's stage selection: the codes the sink header's stage mask holds, by name."""
    codes = " ".join(str(STAGE_CODES[s]) for s in selection.stages)
    return f"trace_stages {codes}  # {' '.join(selection.stages)}"


def _lengths(values) -> str:
    return "none" if values is None else " ".join(map(str, values))


def problem_text(s) -> str:
    """problem.txt of an attention problem (oracle.problem.attention.AttentionSpec, field by field)."""
    lines = ["# problem.txt: the attention problem, for repro's judgement (oracle.problem.attention.AttentionSpec)",
             "kind attention", f"describe {s.describe()}"]
    for f in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v", "block_q",
              "block_kv", "splits"):
        lines.append(f"{f} {getattr(s, f)}")
    lines += [f"total_q {sum(s.lengths_q)}  # rows of a variable-length Q and O", f"total_k {sum(s.lengths_k)}",
              f"seqlens_q {_lengths(s.seqlens_q)}", f"seqlens_k {_lengths(s.seqlens_k)}",
              f"causal {s.causal}", "window " + ("none" if s.window is None else f"{s.window[0]} {s.window[1]}"),
              f"softmax_scale {float(s.softmax_scale).hex()}  # {s.softmax_scale!r}",
              f"softcap {float(s.softcap).hex()}  # {s.softcap!r}"]
    for f in ("q_dtype", "k_dtype", "v_dtype", "o_dtype"):
        lines.append(f"{f} {getattr(s, f)}")
    for f in ("descale_q", "descale_k", "descale_v", "p_scale"):
        v = getattr(s, f)
        lines.append(f"{f} " + ("none" if v is None else f"{float(v).hex()}  # {v!r}"))
    for f in ("page_size", "num_pages", "max_pages"):
        v = getattr(s, f)
        lines.append(f"{f} {'none' if v is None else v}")
    lines += [f"lse {int(s.lse)}", f"empty_lse {s.empty_lse}  # the LSE of a fully masked row"]
    return "\n".join(lines) + "\n"


def readme_problem(s) -> str:
    """The README's paragraphs on an attention problem: its buffers, its reference and its judgement."""
    varlen = s.varlen_q
    o = "[total_q, heads_q, head_dim_v]" if varlen else "[batch, seqlen_q, heads_q, head_dim_v]"
    lse = "[heads_q, total_q]" if varlen else "[batch, heads_q, seqlen_q]"
    text = ("The problem is an attention forward (problem.txt: kind attention). The kernel reads q, k and v "
            "in FlashAttention's layouts" + (", the page table" if s.paged else "") +
            (", the offsets cu_seqlens_q / cu_seqlens_k" if s.varlen_q or s.varlen_k else "") +
            f" and writes O {o} ({s.o_dtype})" + (f" and LSE {lse} (fp32)" if s.lse else "") +
            "; both are poisoned with 0xFF bytes before the first launch and written to o.bin"
            + (" and lse.bin" if s.lse else "") + " after the last." +
            (f" The {s.splits} splits write their partials to the workspaces, merged by the combine launch."
             if s.splits > 1 else ""))
    ref = ("Reference: expected_o.bin and bound_o.bin hold the oracle's reference O and per-element bounds, "
           "expected_lse.bin and bound_lse.bin its LSE and bounds (oracle.judging.attention_expected: "
           "kernels_ref.attention.forward with oracle.judging.attention_tolerance.output_bound, cross-checked "
           "against the float64 specification attention_forward_host). repro compares O and LSE element by "
           "element: |received - expected| <= bound, NaN matches NaN, an infinity the same infinity; a fully "
           f"masked row expects O = 0 and LSE {s.empty_lse} (empty_lse). It prints the worst unit (batch, head, "
           f"query block of {s.block_q} rows), the first bad element (batch, query, head, column; column "
           f"head_dim_v = {s.head_dim_v} is the LSE), NaN/Inf counts and the elements still holding the 0xFF "
           "poison. There is no host reference for attention: --host-reference is refused.")
    wrap = dict(width=100, break_on_hyphens=False, break_long_words=False)
    return "\n" + textwrap.fill(text, **wrap) + "\n\n" + textwrap.fill(ref, **wrap)


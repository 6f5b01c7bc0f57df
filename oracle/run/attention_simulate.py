"""A synthetic attention recording: oracle.run.attention_model on controlled inputs, optionally
with one planted defect (an Injection, by its name), every stage tapped at every site.

A defect that changes nothing on the problem asked (its condition is absent: no split to merge,
no GQA, no ragged KV tail, ...) is refused with SimulateError naming what it needs, so that a
written dump always shows the defect it is named for.
"""

from __future__ import annotations

from typing import Optional

import torch

from harness.errors import BadInput
from oracle.problem.attention import AttentionSpec
from oracle.run.attention_inputs import make_attention_operands
from oracle.run.attention_model import Injection, to_paged
from oracle.run.attention_recording import AttentionRecording, model_recording

DEFECTS = tuple(i.value for i in Injection)
# what each defect needs of the problem to show at all
NEEDS = {
    Injection.KV_TAIL_NOT_ZEROED: "a key count that is not a multiple of the KV block (--keys)",
    Injection.CAUSAL_OFF_BY_ONE: "a causal mask (--causal) that cuts a KV block",
    Injection.MAX_NOT_UPDATED: "more than one KV block per query block",
    Injection.L_BEFORE_RESCALE: "more than one KV block per query block",
    Injection.MERGE_WITHOUT_MAX: "split KV (--splits 2 or more)",
    Injection.EMPTY_ROW_NAN: "a fully masked row (--causal bottom_right with more queries than keys)",
    Injection.GQA_HEAD_MODULO: "grouped heads (--heads-kv below --heads, and not 1)",
    Injection.PAGE_TABLE_OFF_BY_ONE: "a paged KV cache (--page-size)",
    Injection.P_NOT_ROUNDED: "P values that a 16-bit type rounds",
}


class SimulateError(BadInput, ValueError):
    """A simulation that cannot be made as asked (an unknown defect, one that would not show)."""


def simulate_attention(spec: AttentionSpec, *, defect: Optional[str] = None, inputs: str = "random", seed: int = 0,
                       page_size: Optional[int] = None) -> AttentionRecording:
    """The model's recording on `spec`'s shape, causal mask, blocks and splits (a dense problem; with
    `page_size` its K and V laid into a shuffled paged cache), with `defect` (an Injection's value)
    planted; SimulateError when the defect is unknown or changes nothing here."""
    if defect is not None and defect not in DEFECTS:
        raise SimulateError(f"defect {defect!r} is unknown; known: {', '.join(DEFECTS)}")
    injection = Injection(defect) if defect is not None else None
    ops = make_attention_operands(spec, inputs, seed)
    kw = dict(causal=spec.causal, softmax_scale=spec.softmax_scale, softcap=spec.softcap, block_q=spec.block_q,
              block_kv=spec.block_kv, splits=spec.splits)

    def record(inj: Optional[Injection]) -> AttentionRecording:
        if page_size is None:
            return model_recording(ops.q, ops.k, ops.v, ops.provenance, injection=inj, **kw)
        paged = to_paged(ops.k, ops.v, page_size, seed=seed)
        return model_recording(ops.q, None, None, ops.provenance, paged=paged, injection=inj, **kw)

    rec = record(injection)
    if injection is not None and _same(rec, record(None)):
        raise SimulateError(f"defect {defect} changes nothing on {spec.describe()}: it needs "
                            f"{NEEDS.get(injection, 'another problem')}")
    return rec


def _same(a: AttentionRecording, b: AttentionRecording) -> bool:
    """Bit for bit the same output, LSE and taps (so a NaN equals a NaN)."""
    pairs = [(a.output, b.output), (a.lse, b.lse)] + [(s.values, t.values) for s, t in zip(a.taps, b.taps)]
    return len(a.taps) == len(b.taps) and all(_bits(x, y) for x, y in pairs)


def _bits(x: Optional[torch.Tensor], y: Optional[torch.Tensor]) -> bool:
    if x is None or y is None:
        return x is y
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(
        x.contiguous().view(ints[x.dtype.itemsize]), y.contiguous().view(ints[y.dtype.itemsize]))

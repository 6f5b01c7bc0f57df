"""Guard bands around D and every output (harness.guard_bands): a write past the end (or before the
start) of a buffer is named with its byte offset, and reaches the judgement as the finding at
epilogue_store (oracle.judging.differential.out_of_bounds). The allocation and the check are pure
functions, run here on CPU tensors laid out as the child lays out device memory."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.guard_bands import (GUARD_BYTE, GUARD_BYTES, GuardBreach, GuardError, breaches_of, check_allocation,
                                 check_bands, guarded_bytes)
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.judging.judgement import judgement_of
from oracle.problem.spec import ProblemSpec, Tile
from oracle.report import table as report
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import simulate

SPEC = ProblemSpec(m=64, n=64, k=32, tile=Tile(32, 32, 16))


def _allocation(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A guarded allocation as the child makes one: both bands filled, the interior handed out."""
    alloc = torch.full((guarded_bytes(nbytes),), GUARD_BYTE, dtype=torch.uint8)
    return alloc, alloc[GUARD_BYTES:GUARD_BYTES + nbytes]


def test_a_write_past_the_end_is_named_with_its_offset():
    n = 64 * 64 * 2  # D of SPEC in bf16
    alloc, interior = _allocation(n)
    d = interior.view(torch.bfloat16).view(64, 64)
    d.fill_(1.0)  # the kernel's own writes touch no band
    assert check_allocation("d", alloc, n) == ()
    # a store one row too many, through D's storage: two bf16 values past its end
    alloc[GUARD_BYTES:GUARD_BYTES + n + 4].view(torch.bfloat16)[-2:] = torch.tensor([3.0, -2.0])
    (b,) = check_allocation("d", alloc, n)
    assert (b.tensor, b.side, b.first, b.last, b.changed, b.nbytes) == ("d", "after", n, n + 3, 4, n)
    assert f"byte offset {n}" in b.describe() and "past its end" in b.describe()


def test_a_write_before_the_start_has_a_negative_offset():
    alloc, _ = _allocation(100)
    alloc[GUARD_BYTES - 8] = 0
    (b,) = check_allocation("ws_acc", alloc, 100)
    assert (b.side, b.first, b.last, b.changed) == ("before", -8, -8, 1)
    assert "before its start" in b.describe()


def test_the_bands_alone_and_a_value_equal_to_the_pattern():
    before, after = bytes([GUARD_BYTE]) * GUARD_BYTES, bytearray([GUARD_BYTE]) * GUARD_BYTES
    assert check_bands("d", before, after, 10) == ()
    after[GUARD_BYTES - 1] = 1  # the far end of the band
    assert check_bands("d", before, after, 10)[0].first == 10 + GUARD_BYTES - 1
    assert GUARD_BYTES % 256 == 0  # the interior pointer keeps cuMemAlloc's alignment


def test_breach_records_are_checked():
    b = GuardBreach("d", "after", 10, 12, 2, 10)
    assert breaches_of([b.to_dict()]) == (b,)
    with pytest.raises(GuardError, match="do not lie in that band"):
        GuardBreach("d", "after", 3, 4, 1, 10)
    with pytest.raises(GuardError, match="must hold"):
        breaches_of([{"tensor": "d"}])


def _recording():
    ops = make_operands(SPEC, "index", seed=3)
    return simulate(SPEC, ops, Provenance("index", 3), tap_tiles=[(0, 0), (1, 1)])


def test_a_breach_is_the_finding_at_epilogue_store():
    rec = _recording()
    assert analyze(rec).verdict is Verdict.MATCH
    n = SPEC.m * SPEC.n * 2
    breach = GuardBreach("d", "after", n + 2, n + 5, 4, n)
    an = analyze(dataclasses.replace(rec, guard_breaches=(breach,)))
    assert an.verdict is Verdict.DIVERGED and an.diagnosis.stage == "epilogue_store" and an.diagnosis.root_cause
    assert an.first.stage == "epilogue_store" and an.first.fed_by == "guard band" and an.kind is Kind.VERDICT
    assert an.out_of_bounds == (breach,)
    text = report.sentence(judgement_of(an))
    assert "First divergence: epilogue_store" in text and f"byte offset {n + 2}" in text
    doc = report.to_json(judgement_of(an))
    report.validate(doc)
    assert doc["first_divergence"]["stage"] == "epilogue_store" and str(n + 2) in doc["first_divergence"]["hint"]


def test_an_earlier_finding_stays_first_and_the_breach_is_still_told():
    from oracle.run.simulate import Injection

    ops = make_operands(SPEC, "index", seed=3)
    bad = simulate(SPEC, ops, Provenance("index", 3), injection=Injection("mma_kblock_twice", (1, 1), 1),
                   tap_tiles=[(0, 0), (1, 1)])
    n = SPEC.m * SPEC.n * 2
    an = analyze(dataclasses.replace(bad, guard_breaches=(GuardBreach("d", "after", n, n, 1, n),)))
    assert an.first.stage == "mma"
    assert f"Also written out of bounds (d)" in report.sentence(judgement_of(an))

"""The zoo's W4A16 GEMM on the GPU, beyond its manifest judgements (tests/gpu/test_zoo.py): the
correct variant's traced and untraced builds agree bit for bit over repeated runs, at a decode shape
and at 4096^3, and it reads no shared memory it never wrote (two poison patterns give one output)."""

from __future__ import annotations

import pytest
from zoo_cases import entries, entry_case  # tests/ is on sys.path

from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.judging.repeat import compare_runs
from oracle.run.inputs import Provenance, make_operands
from oracle.run.races import run_races

pytestmark = pytest.mark.gpu

W4A16 = {e["name"]: e for e in entries("zoo/w4a16_sm80/")}


@pytest.mark.parametrize("name", ["w4a16_uint4_correct_decode", "w4a16_uint4_correct_4096"])
def test_w4a16_repeats_bit_for_bit_traced_and_untraced_and_reads_no_unwritten_shared_memory(name):
    entry = W4A16[name]
    case = entry_case(entry)
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    rr = run_races(case, ops, Provenance("random", seed), repeat=2, smem_poison=0xFFFFFFFF, timeout_s=300)
    res = compare_runs(rr.traced, rr.untraced, poisoned=rr.poisoned, poison=rr.poison, poison_note=rr.poison_note,
                       failed=rr.failed)
    assert not rr.failed, rr.failed
    assert rr.poison_note == "", rr.poison_note
    assert not res.nondeterministic and not res.tracing_changes and not res.poison_changes, res.to_json()
    assert analyze(rr.first.recording).verdict is Verdict.MATCH

"""The zoo manifest's verdicts for CUTLASS's GEMM run as a strided batched GEMM (zoo/cutlass_sm90/batched.cu),
on a model of the traced kernel (no GPU).

The correct run is oracle.run.simulate's model of a tiled GEMM (descriptor images, load views, the fp32
accumulator per k-block, alpha * acc + beta * C, the cast), every batch entry its own GEMM whose taps name
the entry as their group, as the adapter's traced collectives tap it (the binding's and the epilogue's
group is the entry l when L > 1). The planted defects change what the kernel reads or computes in one
entry: the user's make_arguments makes B's packed stride from A's extents (batched_host_b_stride_of_a:
entry l's B is read M * K * l elements into B's buffer, so the TMA writes another image of B from entry 1
on), and the traced mainloop issues entry 1's k-block 1 twice (batched_entry1_kblock_twice, the model's
mma_kblock_twice injected in group 1). Each entry must be judged as the manifest says: the correct ones
MATCH in every entry, each defect is found at its stage in entry 1, entry 0 judged clean. What this
cannot show, that the CUDA code does what the model does, the GPU tier (tests/gpu/test_zoo.py) does.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from zoo_cases import check_judgement, entries, entry_case  # tests/ is on sys.path

from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.run.library_epilogue import with_library_order
from oracle.run.simulate import Injection, simulate

LIBRARY_ORDER = ("alpha_beta", "cast")  # what the traced LinearCombination tree declares


def _batched_entries() -> list[dict]:
    return [e for e in entries("zoo/cutlass_sm90/batched.cu")]


def b_read_with_a_extents(spec, b: torch.Tensor) -> torch.Tensor:
    """B [L, K, N] as the kernel reads it when B's packed stride is made from A's extents (m, k, l): B is
    stored column-major ([L, N, K] in memory) and entry l starts l * M * K elements in, not l * N * K."""
    flat = b.transpose(-1, -2).contiguous().flatten()
    n, k = spec.n, spec.k
    step = spec.m * k
    assert (spec.batch - 1) * step + n * k <= flat.numel(), "the defect's reads stay inside B's buffer (M <= N)"
    return torch.stack([flat[l * step:l * step + n * k].view(n, k).t() for l in range(spec.batch)])


def model(case, ops, provenance, defect):
    """The recording the traced batched kernel makes with `defect` (None: correct)."""
    spec = case.spec
    if defect == "batched_host_b_stride_of_a":
        seen = replace(ops, b=b_read_with_a_extents(spec, ops.b))
        return replace(simulate(spec, seen, provenance, tap_tiles=case.trace.tiles), operands=ops)
    injection = None
    if defect == "batched_entry1_kblock_twice":
        injection = Injection("mma_kblock_twice", tile=(0, 0), k_block=1, group=1)
    else:
        assert defect is None, defect
    return simulate(spec, ops, provenance, injection=injection, tap_tiles=case.trace.tiles)


def test_the_manifest_has_the_batched_entries():
    names = {e["name"] for e in _batched_entries()}
    assert names == {"cutlass_sm90_batched_correct", "cutlass_sm90_batched_host_correct",
                     "cutlass_sm90_batched_host_b_stride_of_a", "cutlass_sm90_batched_entry1_kblock_twice"}, names


def test_the_wrong_batch_stride_reads_entry_0_right_and_every_later_entry_wrong():
    case = entry_case(_batched_entries()[0])
    ops = make_operands(case.spec, "random", 7)
    seen = b_read_with_a_extents(case.spec, ops.b)
    assert torch.equal(seen[0], ops.b[0])
    assert all(not torch.equal(seen[l], ops.b[l]) for l in range(1, case.spec.batch))


@pytest.mark.slow
@pytest.mark.parametrize("entry", _batched_entries(), ids=lambda e: e["name"])
def test_batched_entry_on_a_model(entry):
    case, _ = with_library_order(entry_case(entry), LIBRARY_ORDER)  # as a live run resolves it
    spec = case.spec
    assert spec.batch == 3 and spec.group_sizes == (spec.m,) * 3
    seed = entry.get("seed", 0)
    ops = make_operands(spec, "random", seed)
    rec = model(case, ops, Provenance("random", seed), entry["defect"])
    assert {t.group for t in rec.taps} == {0, 1, 2}  # every tap names its entry
    an = analyze(rec)
    check_judgement(entry["expected_stage"], case, an, entry)
    # each entry judged as its own GEMM: one outcome per entry, the defect's entry named, the others clean
    assert [o.group for o in an.groups] == [0, 1, 2], an.groups
    for o in an.groups:
        if entry["defect"] is None or o.group == 0:
            assert o.verdict is Verdict.MATCH, o.describe()
        elif o.group == 1:
            assert (o.verdict, o.stage) == (Verdict.DIVERGED, entry["expected_stage"]), o.describe()
    if entry["defect"] == "batched_entry1_kblock_twice":  # only entry 1 is touched
        assert an.groups[2].verdict is Verdict.MATCH, an.groups[2].describe()

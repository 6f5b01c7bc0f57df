"""The differential's cost does not grow with the traced k-blocks: the reference launches and the
host reads (each a device synchronisation on CUDA) of `analyze` are the same for a recording of 2
tiles x 4 k-blocks and one of 2 tiles x 16 k-blocks (benchmarks/analyze_bench.py counts them)."""

import pytest

from oracle.problem.spec import ProblemSpec, Tile
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate

import bench_scripts  # tests/ is on sys.path


def _bench():
    return bench_scripts.load("analyze_bench")


def _counts(k: int, defect=None, sparse=False):
    spec = ProblemSpec(m=128, n=128, k=k, tile=Tile(64, 64, 64), swizzle_a=128, swizzle_b=128)
    ops = make_operands(spec, "random", seed=3)
    inj = Injection(defect, (1, 1), 1) if defect else None
    rec = simulate(spec, ops, Provenance("random", 3), injection=inj, tap_tiles=[(0, 0), (1, 1)])
    if sparse:  # every other k-block left out: each teacher-forced span is two k-blocks long
        import dataclasses

        rec = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.k_block is None or t.k_block % 2 == 1))
    an, counts = _bench().counted(rec, ops=False)
    return an, counts


@pytest.mark.parametrize("defect", [None, "mma_kblock_twice"])
def test_launches_and_host_reads_do_not_grow_with_the_k_blocks(defect):
    an4, few = _counts(4 * 64, defect)
    an16, many = _counts(16 * 64, defect)
    assert an4.verdict == an16.verdict
    if defect:
        assert an4.first.stage == an16.first.stage == "mma" and an4.first.k_block == an16.first.k_block == 1
    assert many["launches_by_kernel"] == few["launches_by_kernel"], (few, many)
    assert many["host_reads"] == few["host_reads"], (few, many)


def test_sparse_taps_launch_once_per_step_of_a_span():
    _, few = _counts(4 * 64, sparse=True)
    _, many = _counts(16 * 64, sparse=True)
    assert many["launches_by_kernel"] == few["launches_by_kernel"], (few, many)
    assert few["launches_by_kernel"]["_mma_step_kernel"] == 2  # spans of two k-blocks: two steps

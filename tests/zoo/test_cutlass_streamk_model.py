"""The zoo manifest's verdicts for CUTLASS's stream-K scheduler, on a Python model of the traced kernel
(no GPU).

The model computes what zoo/cutlass_sm90/cutlass_sm90.cu with ZOO_CUTLASS_STREAMK computes and taps through
the adapter's traced scheduler (harness/include/oracle_trace/cutlass/sm90_stream_k.hpp): each work unit's
operand tiles and fp32 accumulator per k-block, from zero at the unit's first k-block of the tile, the
taps naming the unit's partial of a split tile (none, -1, for a tile one unit does whole); CUTLASS's
in-place fixup (the first unit stores its partial in the workspace, each later one adds its own into it,
the unit that runs the epilogue adds the workspace into its accumulators), tapped as reduce; then
LinearCombination's alpha * acc + beta * C (epilogue_alpha_beta) and the cast. The planted defect adds the
reducing unit's own partial once more after the fixup.

The partitions are CUTLASS's, not a rule the case declares: split-K deals KB / S k-blocks to each split and
one more to the first KB mod S (CUTLASS's set_params_basic); stream-K is modelled as CUTLASS's hybrid with
the first tiles done data-parallel and the rest dealt to units whose boundaries fall where no declared
rule puts them. The oracle must read each tile's partition from the taps and judge mma per partial and
reduce as the sum of the kernel's own partials: the correct entries MATCH, the defect is a VERDICT at
reduce. What this cannot show, that the CUDA code taps what the model taps, the GPU tier does
(tests/gpu/test_zoo.py, once the entries are recorded: dump_pending).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
import torch

from harness.taps import Tap
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.judging.differential.geometry import Geometry
from oracle.problem.spec import ProblemSpec
from oracle.run.case import load_case
from oracle.run.inputs import Operands, Provenance, make_operands
from oracle.run.library_epilogue import with_library_order
from oracle.run.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "zoo" / "manifest.json"
TREE_ORDER = ("alpha_beta", "cast")  # what the traced library declares for LinearCombination
DATA_PARALLEL_TILES = 1  # the modelled stream-K hybrid: tile 0 whole, the rest split


def _entries() -> list[dict]:
    with open(MANIFEST) as f:
        return [e for e in json.load(f) if e["name"].startswith("cutlass_sm90_streamk_")]


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def cutlass_partition(spec: ProblemSpec, tile: tuple[int, int]) -> Optional[list[tuple[int, int]]]:
    """The k-block ranges of the tile's work units in k order, as CUTLASS's scheduler hands them out;
    None where one unit does the whole tile."""
    kb = spec.k_blocks
    if spec.splits > 1:  # split-K: KB / S each, one more to the first KB mod S
        per, big = divmod(kb, spec.splits)
        starts = [s * per + min(s, big) for s in range(spec.splits)] + [kb]
        return [(a, b) for a, b in zip(starts, starts[1:]) if b > a]
    if spec.stream_k_workers is None:  # data-parallel
        return None
    t = tile[0] * spec.tiles_n + tile[1]
    if t < DATA_PARALLEL_TILES:
        return None
    # the stream-K tiles' iterations over 4 units, each unit's share ending 3 k-blocks after an even deal
    # would end it (no declared rule cuts there)
    sk_tiles = spec.tiles_m * spec.tiles_n - DATA_PARALLEL_TILES
    total, units = sk_tiles * kb, 4
    ends = sorted({min(total, (u + 1) * total // units + 3) for u in range(units - 1)} | {total})
    lo, hi = (t - DATA_PARALLEL_TILES) * kb, (t - DATA_PARALLEL_TILES + 1) * kb
    cuts = [lo] + [e for e in ends if lo < e < hi] + [hi]
    pieces = [(a - lo, b - lo) for a, b in zip(cuts, cuts[1:])]
    return None if len(pieces) == 1 else pieces


def model(spec: ProblemSpec, ops: Operands, provenance: Provenance, defect: Optional[str], tapped) -> Recording:
    """What the traced kernel records and stores, for the variant with `defect` (None: correct)."""
    bm, bn, bk = spec.tile.bm, spec.tile.bn, spec.tile.bk
    tiles_m, tiles_n, kbs = spec.tiles_m, spec.tiles_n, spec.k_blocks
    a_full = _pad(ops.a, tiles_m * bm, kbs * bk)
    b_full = _pad(ops.b, kbs * bk, tiles_n * bn)
    c_full = _pad(ops.c.float(), tiles_m * bm, tiles_n * bn)
    alpha, beta = spec.alpha, spec.beta
    out = torch.zeros(tiles_m * bm, tiles_n * bn, dtype=torch.bfloat16)
    taps: list[Tap] = []
    for tm in range(tiles_m):
        for tn in range(tiles_n):
            here, r0, c0 = (tm, tn), tm * bm, tn * bn
            pieces = cutlass_partition(spec, here)
            split = pieces is not None
            partials = []
            for index, (k0, k1) in enumerate(pieces or [(0, kbs)]):
                acc = torch.zeros(bm, bn)
                for kb in range(k0, k1):
                    a_t = a_full[r0:r0 + bm, kb * bk:(kb + 1) * bk]
                    b_t = b_full[kb * bk:(kb + 1) * bk, c0:c0 + bn]
                    acc = (acc.double() + a_t.double() @ b_t.double()).float()
                    if here in tapped:
                        p = index if split else None
                        taps += [Tap("load_a", here, a_t.clone(), k_block=kb, partial=p),
                                 Tap("load_b", here, b_t.clone(), k_block=kb, partial=p),
                                 Tap("mma", here, acc.clone(), k_block=kb, partial=p)]
                partials.append(acc)
            acc = partials[-1]
            if split:  # the in-place fixup: the workspace sums the units before the last in k order
                workspace = partials[0].clone()
                for p in partials[1:-1]:
                    workspace = workspace + p
                acc = partials[-1] + workspace
                if defect == "streamk_partial_twice":
                    acc = acc + partials[-1]
                if here in tapped:
                    taps.append(Tap("reduce", here, acc.clone()))
            c_t = c_full[r0:r0 + bm, c0:c0 + bn]
            x = (alpha * acc.double() + (beta * c_t).float().double()).float()
            cast = x.to(torch.bfloat16)
            if here in tapped:
                taps += [Tap("epilogue_alpha_beta", here, x), Tap("epilogue_cast", here, cast)]
            out[r0:r0 + bm, c0:c0 + bn] = cast
    return Recording(spec=spec, operands=ops, output=out[:spec.m, :spec.n].contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=f"model of zoo_cutlass_sm90 stream-K[{defect or 'correct'}]",
                     synthetic=True)


def _analyze(entry: dict):
    case = load_case(str(ROOT / entry["case"]), entry["problem"], allow_library=True)
    case, _ = with_library_order(case, TREE_ORDER)  # as a live run resolves it from the built library
    spec = case.spec
    seed = entry.get("seed", 0)
    ops = make_operands(spec, "random", seed)
    tapped = {tuple(t) for t in entry["trace"]["tiles"]}
    rec = model(spec, ops, Provenance("random", seed), entry["defect"], tapped)
    return spec, rec, tapped, analyze(rec)


def test_the_model_splits_tiles_where_no_declared_rule_does():
    """The stream-K model's boundaries are CUTLASS-like and follow none of the oracle's named rules, so a
    MATCH below shows the partition was read from the taps, not from the declaration."""
    from oracle.problem.partition import rules_for, tile_partials

    entry = next(e for e in _entries() if e["name"] == "cutlass_sm90_streamk_correct")
    spec = load_case(str(ROOT / entry["case"]), entry["problem"], allow_library=True).spec
    split = [(tm, tn) for tm in range(spec.tiles_m) for tn in range(spec.tiles_n)
             if cutlass_partition(spec, (tm, tn)) is not None]
    assert split and len(split) < spec.tiles_m * spec.tiles_n  # some whole (data-parallel), some split
    tiles = [(tm, tn) for tm in range(spec.tiles_m) for tn in range(spec.tiles_n)]
    ours = [cutlass_partition(spec, t) or [(0, spec.k_blocks)] for t in tiles]
    for rule in rules_for(spec):
        theirs = [[(p.kb_begin, p.kb_end) for p in tile_partials(spec, t, rule)] for t in tiles]
        assert theirs != ours, rule


@pytest.mark.slow
@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_manifest_entry_on_the_kernel_model(entry):
    spec, rec, tapped, an = _analyze(entry)
    table = {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}
    geo = Geometry.of(rec, torch.device("cpu"))
    if not spec.partitioned:  # data-parallel: whole tiles, nothing to read a partition from
        assert all(t.partial is None for t in rec.taps) and not any(t.stage == "reduce" for t in rec.taps)
    for tile in tapped if spec.partitioned else ():  # the partition judged by is the kernel's, from the taps
        pieces = cutlass_partition(spec, tile)
        part = geo.partitions[tile]
        assert part.tapped and not part.issues, (tile, part)
        if pieces is None:
            assert part.whole, (tile, part)
        else:
            assert [(p.kb_begin, p.kb_end) for p in part.partials] == pieces, (tile, part)
    want = entry["expected_stage"]
    if want is None:
        assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, table)
        if spec.partitioned:
            assert an.partition is not None and "read from the mma taps" in an.partition, an.partition
            assert table["reduce"] == ("MATCH", "MATCH"), table
        return
    assert an.verdict is Verdict.DIVERGED, (an.diagnosis.reason, table)
    assert an.first.stage == want, (an.first, table)
    assert an.first.kind.value == "VERDICT", (an.first, an.open_confounds)
    assert cutlass_partition(spec, tuple(an.first.tile)) is not None, an.first  # a split tile
    assert table["mma"][0] == "MATCH", table  # every partial's accumulation is right

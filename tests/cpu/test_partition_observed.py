"""The kernel's taps define its partition: recordings made to order for each partition rule (the
Python kernel model dealing k-blocks by a rule the problem may not declare), overlaps and gaps as
mma findings, whole tiles tagged partial -1, open confounds that cap a finding at DRAFT, and the
rules computed in O(partials) whatever the number of workers."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from oracle.report import table as report
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.problem.partition import deal, observed_partition, tile_partials
from oracle.problem.spec import MAX_STREAM_K_WORKERS, ProblemSpec, SpecError, Tile
from oracle.run.simulate import Injection, simulate
from oracle.run.confounds import ConfoundKind

SPLIT = ProblemSpec(m=40, n=24, k=256, tile=Tile(64, 64, 32), splits=3)  # 8 k-blocks: ceil 0-2 3-5 6-7
# 3 x 2 tiles of 8 k-blocks (48 iterations) over 5 workers: floor shares start at 0 9 19 28 38,
# CUTLASS's at 0 10 20 30 39
STREAM = ProblemSpec(m=130, n=70, k=256, tile=Tile(64, 64, 32), stream_k_workers=5)
# 3 x 3 tiles over 4 workers, a data-parallel remainder: tiles 0-4 stream-K, tiles 5-8 whole
HYBRID = ProblemSpec(m=130, n=130, k=256, tile=Tile(64, 64, 32), stream_k_workers=4,
                     partition="stream_k_dp_remainder", bias="col")


def _rec(spec, *, kernel_rule=None, defect=None, tile=(0, 0), kb=1, tiles=((0, 0),), seed=1, **kw):
    ops = make_operands(spec, "random", seed)
    inj = Injection(defect, tile, kb) if defect else None
    return simulate(spec, ops, Provenance("random", seed), injection=inj, tap_tiles=list(tiles), partition=kernel_rule,
                    **kw)


def _mma_units(an):
    return next(s for s in an.stages if s.name == "mma").teacher_forced


# -- the rules -----------------------------------------------------------------------------------
def test_each_rule_deals_every_iteration_to_exactly_one_worker_in_its_own_way():
    starts = {}
    for rule in ("floor_shares", "ceil_shares", "cutlass_stream_k"):
        spec = dataclasses.replace(STREAM, partition=rule)
        covered = [(t, kb) for t in [(tm, tn) for tm in range(3) for tn in range(2)]
                   for p in tile_partials(spec, t) for kb in range(p.kb_begin, p.kb_end)]
        assert len(covered) == len(set(covered)) == 48, rule
        starts[rule] = [s for s, _ in deal(48, 5, rule)]
    assert starts == {"floor_shares": [0, 9, 19, 28, 38], "ceil_shares": [0, 10, 20, 30, 40],
                      "cutlass_stream_k": [0, 10, 20, 30, 39]}


def test_the_data_parallel_remainder_leaves_whole_tiles_after_the_stream_k_ones():
    counts = [len(tile_partials(HYBRID, (tm, tn))) for tm in range(3) for tn in range(3)]
    assert counts == [1, 2, 2, 2, 1, 1, 1, 1, 1]  # tiles 0 and 4 lie inside one worker's 10 iterations
    # 5 stream-K tiles = 40 iterations, 10 per worker: worker 1 holds k-blocks 2-7 of tile 1 and 0-3 of tile 2
    assert [(p.kb_begin, p.kb_end) for p in tile_partials(HYBRID, (0, 1))] == [(0, 2), (2, 8)]


def test_two_to_the_31_workers_are_dealt_at_once_and_the_spec_refuses_them():
    t0 = time.monotonic()
    for rule in ("floor_shares", "ceil_shares", "cutlass_stream_k"):
        assert deal(48, 2**31, rule)[:2] == [(0, 1), (1, 2)] and len(deal(48, 2**31, rule)) == 48
    with pytest.raises(SpecError, match="stream_k_workers"):  # the spec refuses such a count at once
        dataclasses.replace(STREAM, stream_k_workers=2**31 - 1)
    spec = dataclasses.replace(STREAM, stream_k_workers=MAX_STREAM_K_WORKERS)  # the most it takes
    for rule in ("floor_shares", "cutlass_stream_k", "stream_k_dp_remainder"):
        parts = tile_partials(dataclasses.replace(spec, partition=rule), (2, 1))
        assert [(p.kb_begin, p.kb_end) for p in parts] == [(i, i + 1) for i in range(8)], rule
    assert time.monotonic() - t0 < 1.0


def test_a_partition_rule_is_validated():
    with pytest.raises(SpecError, match="partition"):
        dataclasses.replace(SPLIT, partition="round_robin")
    with pytest.raises(SpecError, match="split problem"):
        ProblemSpec(m=8, n=8, k=64, partition="floor_shares")
    with pytest.raises(SpecError, match="stream-K rule"):
        dataclasses.replace(SPLIT, partition="stream_k_dp_remainder")
    assert ProblemSpec.from_json(HYBRID.to_json()) == HYBRID


def test_stream_k_workers_may_be_an_expression_of_the_sizes_and_num_sms(tmp_path):
    case = tmp_path / "c.toml"
    case.write_text('[problem]\nm = 130\nn = 70\nk = 256\ntile = [64, 64, 32]\n'
                    'stream_k_workers = "min(num_sms, tiles)"\npartition = "cutlass_stream_k"\n')
    spec = load_case(str(case)).spec
    assert spec.stream_k_workers == 6 and spec.partition == "cutlass_stream_k"
    assert load_case(str(case), {"stream_k_workers": "2 * num_sms"}).spec.stream_k_workers == 264  # no GPU: 132
    with pytest.raises(CaseError, match=r"\[problem\] stream_k_workers: unknown name 'workers'"):
        load_case(str(case), {"stream_k_workers": "workers"})
    with pytest.raises(CaseError, match="outside 1"):
        load_case(str(case), {"stream_k_workers": "tiles - 6"})


# -- observed partitions -------------------------------------------------------------------------
def test_the_partition_is_read_from_the_taps_and_the_rule_only_fills_untapped_boundaries():
    floor = observed_partition(SPLIT, (0, 0), {0: {0, 1}, 1: {2, 3, 4}, 2: {5, 6, 7}})
    assert [(p.kb_begin, p.kb_end) for p in floor.partials] == [(0, 2), (2, 5), (5, 8)]
    assert floor.follows == ("floor_shares",) and not floor.issues
    # k-blocks 2 and 3 were not traced: the boundary between them is open, the declared ceil shares place it at 3
    part = observed_partition(SPLIT, (0, 0), {0: {0, 1}, 1: {4}, 2: {6, 7}}, lambda kb: kb not in (2, 3, 5))
    assert [(p.kb_begin, p.kb_end) for p in part.partials] == [(0, 3), (3, 6), (6, 8)] and not part.issues
    gap = observed_partition(SPLIT, (0, 0), {0: {0, 1, 2}, 1: {4, 5}, 2: {6, 7}})
    assert [(i.kind, i.partial, i.k_block) for i in gap.issues] == [("gap", 1, 3)]
    twice = observed_partition(SPLIT, (0, 0), {0: {0, 1, 2}, 1: {2, 3, 4, 5}, 2: {6, 7}})
    assert [(i.kind, i.partial, i.k_block) for i in twice.issues] == [("overlap", 1, 2)]


def test_a_correct_floor_share_split_k_kernel_matches_and_the_report_names_its_rule():
    an = analyze(_rec(SPLIT, kernel_rule="floor_shares"))
    assert an.verdict is Verdict.MATCH, (an.first, an.diagnosis.reason)
    assert an.partition == ("partition: the taps follow floor_shares, not the declared ceil_shares; each tile judged "
                            "by its tapped partials (read from the mma taps of 1 tile)")
    assert an.partition in report.render(an)
    assert not an.open_confounds


def test_a_floor_share_kernel_adding_partial_1_twice_is_blamed_at_reduce():
    rec = _rec(SPLIT, kernel_rule="floor_shares")
    final1 = next(t for t in rec.taps if t.stage == "mma" and t.partial == 1 and t.k_block == 4)
    taps = tuple(dataclasses.replace(t, values=t.values + final1.values) if t.stage == "reduce" else t
                 for t in rec.taps)
    an = analyze(dataclasses.replace(rec, taps=taps))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "reduce" and an.first.kind is Kind.VERDICT, an.first
    assert next(s for s in an.stages if s.name == "mma").outcome.teacher_forced.value == "MATCH"


@pytest.mark.parametrize("defect, partial, kb, kind", [
    ("partial_overlap", 1, 1, "overlap"),  # floor shares: partial 1 (2-4) starts at 1, partial 0's last
    ("partial_gap", 0, 2, "gap"),  # partial 1 starts at 3: k-block 2 summed by none (the declared ceil shares
                                   # place the open boundary at 3, so it is reported in partial 0)
])
def test_an_overlap_or_a_gap_is_an_mma_verdict_at_its_partial_and_k_block(defect, partial, kb, kind):
    an = analyze(_rec(SPLIT, kernel_rule="floor_shares", defect=defect))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma", (an.first, an.diagnosis.reason)
    assert (an.first.partial, an.first.k_block, an.first.kind) == (partial, kb, Kind.VERDICT)
    assert (kind == "gap") == ("tapped in no partial" in an.first.hint), an.first.hint
    assert f"partial {partial}, k-block {kb}" in report.sentence(an)


def test_a_correct_cutlass_rule_stream_k_kernel_matches_declared_or_not():
    tiles = [(0, 1), (1, 1), (2, 0)]  # tile 4: CUTLASS's worker 3 stops at iteration 39, ceil shares' at 40
    declared = analyze(_rec(dataclasses.replace(STREAM, partition="cutlass_stream_k"), tiles=tiles))
    assert declared.verdict is Verdict.MATCH, (declared.first, declared.diagnosis.reason)
    assert declared.partition.startswith("partition: the taps follow the declared rule cutlass_stream_k")
    undeclared = analyze(_rec(STREAM, kernel_rule="cutlass_stream_k", tiles=tiles))
    assert undeclared.verdict is Verdict.MATCH, (undeclared.first, undeclared.diagnosis.reason)
    # with 6 tiles over 5 workers there is no data-parallel remainder: that rule deals the same here
    assert "follow cutlass_stream_k or stream_k_dp_remainder (alike on these tiles), not the declared floor_shares" \
        in undeclared.partition


@pytest.mark.parametrize("defect, tile, stage, partial, kb", [
    ("partial_gap", (1, 1), "mma", 1, 6),  # tile 3 = iterations 24-31, worker 3 from 30: its first k-block skipped
    ("partial_overlap", (1, 1), "mma", 1, 5),  # worker 3 also sums worker 2's last iteration
    ("reduce_wrong_partial", (1, 1), "reduce", None, None),  # the fix-up reads partial 0 for partial 1
])
def test_cutlass_rule_stream_k_defects_are_found_where_they_are(defect, tile, stage, partial, kb):
    spec = dataclasses.replace(STREAM, partition="cutlass_stream_k")
    an = analyze(_rec(spec, defect=defect, tile=tile, tiles=[tile]))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == stage, (an.first, an.diagnosis.reason)
    assert (an.first.partial, an.first.k_block, an.first.kind) == (partial, kb, Kind.VERDICT), an.first


# -- whole tiles ---------------------------------------------------------------------------------
def test_whole_tiles_tagged_partial_minus_one_are_accepted_and_feed_their_epilogue_themselves():
    rec = _rec(HYBRID, tiles=[(0, 1), (2, 2)], whole_untagged=True)
    assert {t.partial for t in rec.taps if t.tile == (2, 2)} == {None}
    assert not any(t.stage == "reduce" and t.tile == (2, 2) for t in rec.taps)
    an = analyze(rec)
    assert an.verdict is Verdict.MATCH, (an.first, an.diagnosis.reason)
    epi = next(s for s in an.stages if s.name == "epilogue_scale").teacher_forced
    assert not epi.evidence.stand_ins and "stand-in" not in report.sentence(an)


def test_an_epilogue_defect_in_a_whole_stream_k_tile_is_a_verdict():
    an = analyze(_rec(HYBRID, defect="epilogue_bias_axis", tile=(2, 2), tiles=[(2, 2)], whole_untagged=True))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "epilogue_bias", (an.first, an.diagnosis.reason)
    assert an.first.tile == (2, 2) and an.first.kind is Kind.VERDICT


def test_a_one_worker_stream_k_tile_tagged_partial_0_feeds_its_epilogue_from_its_mma_tap():
    rec = _rec(HYBRID, tiles=[(2, 2)])  # tile 8 is whole; the model tags it partial 0 and taps a reduce
    an = analyze(dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.stage != "reduce")))
    assert an.verdict is Verdict.MATCH and not next(s for s in an.stages if s.name == "epilogue_scale") \
        .teacher_forced.evidence.stand_ins


# -- a note never contradicts a finding -----------------------------------------------------------
def test_two_disagreeing_taps_of_one_site_make_the_finding_a_draft_that_names_them():
    rec = _rec(SPLIT, defect="reduce_partial_twice")
    tap = next(t for t in rec.taps if t.stage == "mma" and t.k_block == 1)
    an = analyze(dataclasses.replace(rec, taps=rec.taps + (dataclasses.replace(tap, values=tap.values * 0.5 + 1),)))
    assert an.verdict is Verdict.DIVERGED and an.first.kind is Kind.DRAFT, an.first
    assert [(c.stage, c.field("site")) for c in an.open_confounds if c.kind is ConfoundKind.DISAGREEING_TAPS] == \
        [("mma", "mma tile (0, 0) k-block 1 partial 0")]
    assert "records disagree" in report.sentence(an)


def test_an_identical_repeated_tap_is_no_confound():
    rec = _rec(SPLIT, defect="reduce_partial_twice")
    tap = next(t for t in rec.taps if t.stage == "mma" and t.k_block == 1)
    an = analyze(dataclasses.replace(rec, taps=rec.taps + (tap,)))
    assert an.first.kind is Kind.VERDICT and not an.open_confounds


# -- the zoo's stream-K kernel, transcribed ---------------------------------------------------------
def _zoo_share_begin(rule, w, n, p):  # split_gemm.cu share_begin<R>
    if rule == "ceil_shares":
        return min(n, w * -(-n // p))
    if rule == "floor_shares":
        return w * n // p
    q, r = divmod(n, p)
    return w * q + min(w, r)


def _zoo_worker_of(rule, i, total, workers):  # split_gemm.cu worker_of<R>
    w = ((i + 1) * workers - 1) // total
    while w + 1 < workers and _zoo_share_begin(rule, w + 1, total, workers) <= i:
        w += 1
    while w > 0 and _zoo_share_begin(rule, w, total, workers) > i:
        w -= 1
    return w


def _zoo_streamk_taps(spec, rule, defect=None):
    """{tile: {partial: k-blocks tapped}} of split_gemm.cu's streamk<D, Trace, R> worker loop."""
    kb_n = spec.k_blocks
    total, workers = spec.tiles_m * spec.tiles_n * kb_n, spec.stream_k_workers
    taps: dict = {}
    for w in range(workers):
        begin, end = _zoo_share_begin(rule, w, total, workers), _zoo_share_begin(rule, w + 1, total, workers)
        big, it = end - begin > total // workers, begin
        while it < end:
            t, kb0 = divmod(it, kb_n)
            kb1 = min(kb_n, kb0 + (end - it))
            p = w - _zoo_worker_of(rule, t * kb_n, total, workers)
            stop = kb1 - 1 if defect == "skip_extra" and big and it + (kb1 - kb0) == end else kb1
            start = kb0 - 1 if defect == "overlap_iter" and it == begin and kb0 > 0 else kb0
            kbs = taps.setdefault(divmod(t, spec.tiles_n), {}).setdefault(p, set())
            kbs.update(range(start, stop))
            it += kb1 - kb0
    return {tile: {p: kbs for p, kbs in parts.items() if kbs} for tile, parts in taps.items()}


@pytest.mark.parametrize("k", [256, 1000])
def test_the_zoo_stream_k_kernel_deals_by_the_rules_and_its_defects_show_where_the_manifest_says(k):
    # zoo/split_gemm/streamk_cutlass.toml: 130 x 200 (12 tiles), min(num_sms, tiles + 2) = 14 workers
    spec = ProblemSpec(m=130, n=200, k=k, tile=Tile(64, 64, 32), stream_k_workers=14, partition="cutlass_stream_k")
    for rule in ("floor_shares", "cutlass_stream_k"):
        ruled = dataclasses.replace(spec, partition=rule)
        for tile, parts in _zoo_streamk_taps(ruled, rule).items():
            want = tuple((q.index, q.kb_begin, q.kb_end) for q in tile_partials(ruled, tile))
            assert tuple((p, min(v), max(v) + 1) for p, v in sorted(parts.items())) == want, (rule, tile)
    kb_n = spec.k_blocks
    for defect, kind, partial, kb in (("skip_extra", "gap", 0, {256: 5, 1000: 23}[k]),
                                      ("overlap_iter", "overlap", 1, {256: 5, 1000: 23}[k])):
        taps = _zoo_streamk_taps(spec, "cutlass_stream_k", defect)[(0, 1)]
        issues = observed_partition(spec, (0, 1), taps).issues
        assert [(i.kind, i.partial, i.k_block) for i in issues] == [(kind, partial, kb)], (defect, issues, kb_n)


def test_an_operand_record_outside_the_tapped_partition_is_an_open_confound():
    rec = _rec(SPLIT, defect="reduce_partial_twice")
    stray = next(t for t in rec.taps if t.stage == "load_a" and t.partial == 2 and t.k_block == 6)
    an = analyze(dataclasses.replace(rec, taps=rec.taps + (dataclasses.replace(stray, partial=1),)))
    assert an.first.stage == "reduce" and an.first.kind is Kind.DRAFT, an.first
    (odd,) = [c for c in an.open_confounds if c.kind is ConfoundKind.UNPLACED_OPERAND_TAPS]
    assert "load_a tile (0, 0) k-block 6 partial 1" in odd.field("records"), an.open_confounds


# -- partitions traced in part: boundaries over untraced k-blocks are assumed ---------------------
FLOOR = dataclasses.replace(SPLIT, partition="floor_shares")  # the floor-share kernel: 0-1 2-4 5-7


def _traced_k_blocks(rec, kbs):
    """The recording as a trace that selected only k-blocks `kbs` would have left it."""
    from harness.trace_format import TraceSelection
    from harness.trace_format.account import TraceAccount

    taps = tuple(t for t in rec.taps if t.k_block is None or t.k_block in kbs)
    return dataclasses.replace(rec, taps=taps, trace=TraceAccount(selection=TraceSelection(k_blocks=tuple(kbs))))


def test_a_boundary_over_untraced_k_blocks_is_assumed_and_never_a_gap():
    part = observed_partition(FLOOR, (0, 0), {0: {0, 1}, 1: {3, 4}, 2: {5}}, lambda kb: kb not in (2, 6, 7))
    assert [(p.kb_begin, p.kb_end) for p in part.partials] == [(0, 2), (2, 5), (5, 8)] and not part.issues
    assert [(a.partial, a.k_block, a.untraced, a.end) for a in part.assumed] == [(1, 2, (2,), False),
                                                                                 (3, 8, (6, 7), True)]
    assert part.assumed[0].describe() == ("tile (0, 0): the partition boundary between k-blocks 1 and 3 is assumed "
                                          "from the declared rule floor_shares (partial 1 begins at k-block 2): "
                                          "k-block 2 not traced")
    assert part.assumed_begin(1) == part.assumed[:1] and part.assumed_end(2) == part.assumed[1:]
    # the same taps with every k-block recorded: k-blocks 2, 6 and 7 are gaps, nothing is assumed
    full = observed_partition(FLOOR, (0, 0), {0: {0, 1}, 1: {3, 4}, 2: {5}})
    assert [i.k_block for i in full.issues] == [2, 6, 7] and not full.assumed


def test_a_partial_trace_of_a_correct_floor_share_kernel_under_its_rule_matches_and_says_what_it_assumed():
    an = analyze(_traced_k_blocks(_rec(FLOOR), [0, 1, 3, 4, 5, 6, 7]))
    assert an.verdict is Verdict.MATCH, (an.first, an.diagnosis.reason)
    assumed = "the partition boundary between k-blocks 1 and 3 is assumed from the declared rule floor_shares"
    assert any(assumed in a for a in an.assumed) and not an.open_confounds
    assert assumed in report.sentence(an) and f"assumed, not observed: tile (0, 0): {assumed}" in report.render(an)
    assert "1 boundary over untraced k-blocks placed by the declared rule, not observed" in an.partition


def test_a_correct_kernel_under_a_wrong_rule_whose_boundary_was_not_traced_is_a_draft_naming_it():
    # ceil shares put partial 1 at k-block 3; the kernel's begins at 2, which was not traced: its
    # accumulator at k-block 3 holds k-blocks 2-3, which only a boundary at 2 explains. The data
    # cannot tell that from a defect, so the disagreement is reported, as a DRAFT with the assumption.
    an = analyze(_traced_k_blocks(_rec(SPLIT, kernel_rule="floor_shares"), [0, 1, 3, 4, 5, 6, 7]))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma", (an.first, an.diagnosis.reason)
    assert (an.first.partial, an.first.k_block, an.first.kind) == (1, 3, Kind.DRAFT)
    said = ("tile (0, 0): the partition boundary between k-blocks 1 and 3 is assumed from the declared rule "
            "ceil_shares (partial 1 begins at k-block 3): k-block 2 not traced")
    assert an.first.assumed == (said,)
    assert [c.field("boundary") for c in an.open_confounds if c.kind is ConfoundKind.ASSUMED_BOUNDARY] == [said]
    assert said in report.sentence(an) and "a trace of k-block 2, where the partition boundary was assumed" \
        in report.sentence(an)
    doc = json.loads(json.dumps(report.to_json(an), default=str))
    report.validate(doc)  # the shipped schema holds the units' and the finding's assumptions
    assert doc["first_divergence"]["assumed"] == [said]
    mma = next(st for st in doc["stages"] if st["name"] == "mma")
    assert mma["details"]["teacher_forced"]["worst_tile"]["assumed"] == [said]
    # traced in full, the same kernel is judged by its own boundaries
    assert analyze(_rec(SPLIT, kernel_rule="floor_shares")).verdict is Verdict.MATCH


def test_a_gap_on_an_untraced_k_block_is_no_gap_finding_but_a_draft_on_the_assumed_boundary():
    # partial 1 starts at 3 instead of 2; k-block 2 is not traced, so nothing shows it was summed by none
    an = analyze(_traced_k_blocks(_rec(FLOOR, defect="partial_gap"), [0, 1, 3, 4, 5, 6, 7]))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma" and an.first.kind is Kind.DRAFT, an.first
    assert not "tapped in no partial" in (an.first.hint or "")
    assert an.first.assumed and "k-block 2 not traced" in an.first.assumed[0]


def test_a_defect_on_observed_taps_stays_a_verdict_beside_an_assumed_boundary():
    # k-block 4 (partial 1's last) is not traced: the boundary between partials 1 and 2 is assumed;
    # the defect at k-block 1 of partial 0 rests on k-blocks 0-1 and the boundary at 2, all traced
    an = analyze(_traced_k_blocks(_rec(FLOOR, defect="mma_kblock_twice", kb=1), [0, 1, 2, 3, 5, 6, 7]))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma", (an.first, an.diagnosis.reason)
    assert (an.first.partial, an.first.k_block, an.first.kind) == (0, 1, Kind.VERDICT), an.first
    assert not an.first.assumed and not an.open_confounds and an.assumed


def test_a_reduce_resting_on_an_assumed_boundary_is_a_draft_and_an_epilogue_fed_by_the_reduce_tap_is_not():
    spec = dataclasses.replace(FLOOR, bias="col")
    twice = analyze(_traced_k_blocks(_rec(spec, defect="reduce_partial_twice"), [0, 2, 3, 4, 5, 6, 7]))
    assert twice.first.stage == "reduce" and twice.first.kind is Kind.DRAFT, twice.first
    assert "k-block 1 not traced" in twice.first.assumed[0]  # partial 0's last tap: k-block 0 or 1?
    rec = _traced_k_blocks(_rec(spec, defect="epilogue_bias_axis"), [0, 2, 3, 4, 5, 6, 7])
    # no scale, alpha 1, beta 0: with those steps untapped the bias step is fed by the accumulator source
    rec = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.stage not in ("epilogue_scale",
                                                                                     "epilogue_alpha_beta")))
    fed = analyze(rec)
    assert fed.first.stage == "epilogue_bias" and fed.first.kind is Kind.VERDICT and not fed.first.assumed, fed.first
    summed = analyze(dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.stage != "reduce")))
    assert summed.first.stage == "epilogue_bias" and summed.first.kind is Kind.DRAFT, summed.first
    assert "k-block 1 not traced" in summed.first.assumed[0] and summed.first.assumed[0] in report.sentence(summed)


# -- a whole tile whose accumulator never reaches K ------------------------------------------------
WHOLE = ProblemSpec(m=40, n=24, k=256, tile=Tile(64, 64, 32))  # one tile, 8 k-blocks, not split


def _stopping_at(rec, last_kb, **account):
    """The recording of a kernel whose loop stops after k-block `last_kb` (K rounded down to the
    tile): its mma taps end there, and the trace recorded every k-block."""
    from harness.trace_format import TraceSelection
    from harness.trace_format.account import TraceAccount

    taps = tuple(t for t in rec.taps if not (t.stage == "mma" and t.k_block is not None and t.k_block > last_kb))
    return dataclasses.replace(rec, taps=taps, trace=TraceAccount(selection=TraceSelection(), **account))


def test_a_whole_tile_whose_accumulator_stops_short_of_k_is_named_at_mma_with_the_first_k_block_never_summed():
    an = analyze(_stopping_at(_rec(WHOLE), 6))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma" and an.first.k_block == 7, report.sentence(an)
    assert an.first.kind is Kind.VERDICT and an.first.partial is None
    assert "k-block 7 never accumulated" in report.sentence(an) + " ".join(_mma_units(an).notes)
    three_short = analyze(_stopping_at(_rec(WHOLE), 4))
    assert three_short.first.k_block == 5 and any("k-blocks 5 to 7" in n for n in _mma_units(three_short).notes)


@pytest.mark.parametrize("why", ["correct", "last k-block not selected", "records dropped", "kernel error",
                                 "only some k-blocks tapped"])
def test_a_whole_tile_that_stops_short_is_no_finding_where_the_trace_cannot_say(why):
    from harness.trace_format import TraceSelection
    from harness.trace_format.account import TraceAccount

    rec = _rec(WHOLE)
    if why == "correct":
        rec = _stopping_at(rec, 7)
    elif why == "last k-block not selected":
        rec = _stopping_at(rec, 5)
        rec = dataclasses.replace(rec, trace=TraceAccount(selection=TraceSelection(k_blocks=(0, 1, 2, 3, 4, 5))))
    elif why == "records dropped":
        rec = _stopping_at(rec, 5, dropped=3)
    elif why == "kernel error":
        rec = dataclasses.replace(_stopping_at(rec, 5), kernel_error="an illegal address at k-block 6")
    else:  # taps at k-blocks 0, 2, 4 only: no trajectory that stops, though the kernel summed all 8
        rec = _stopping_at(rec, 4)
        rec = dataclasses.replace(rec, taps=tuple(t for t in rec.taps
                                                  if not (t.stage == "mma" and t.k_block in (1, 3))))
    an = analyze(rec)
    assert not any("never accumulated" in n for n in _mma_units(an).notes), why
    if why in ("correct", "last k-block not selected"):
        assert an.verdict is Verdict.MATCH, (why, report.sentence(an))

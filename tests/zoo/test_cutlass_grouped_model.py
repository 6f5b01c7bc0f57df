"""The zoo manifest's verdicts for CUTLASS's grouped (pointer-array) GEMM (zoo/cutlass_sm90/grouped.cu), on a
model of the traced kernel (no GPU).

The correct run is oracle.run.simulate's model of a grouped problem: every group its own tiled GEMM (rows
[offset_g, offset_g + M_g) of A, C and D, B[g]) whose taps name the group, the tile within it and the
k-block, as the adapter's traced array collectives tap them (the binding's group is the one CUTLASS's kernel
tells the collective, the epilogue's the tile coordinate's l); the empty group has no tile and no tap. The
planted defects change what the kernel reads or computes in one group: the user's make_arguments gives
group 1 group 0's B pointer (grouped_host_b_of_group0: the TMA writes group 0's image of B for group 1),
group 3 A's base pointer (grouped_host_a_of_group0: its rows are read from the first rows of A), or group 1
the alpha squared through the epilogue's per-group alpha array (grouped_host_alpha_twice_group1). Each group
must be judged as the manifest says: the correct ones MATCH in every group, each defect is found at its
stage in its group, the other groups judged clean. The ping-pong entries (ZOO_GROUPED_PINGPONG) make the same
taps: which consumer warp group computes a tile changes no tap, each stage naming the group of the tile it was
loaded for; `pingpong_deal` models how CUTLASS's group scheduler deals the tiles to the CTAs and their two warp
groups, to hold those entries to what they are for (a CTA's warp groups on different groups at once, the
defect's tile on the second). The cluster entries (ZOO_GROUPED_CLUSTER_2X1) add what a 2 x 1 cluster adds: CUTLASS's
group scheduler hands out whole clusters, so a group of an odd count of M tiles gets a padding CTA whose tile
lies past its rows, tapped where the selection names it, with a zero A (TMA's fill past the group's rows), a zero
accumulator and epilogue, and B's real tile (multicast); `with_padding_ctas` adds those taps, and the live
run's rule (oracle.run.recording.without_padding_tiles) must leave them out with a note. What this cannot show, that the CUDA code does what the model does, the GPU tier
(tests/gpu/test_zoo.py) does.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from zoo_cases import check_judgement, entries, entry_case  # tests/ is on sys.path

from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.problem.partition import group_offsets
from oracle.run.inputs import Provenance, make_operands
from oracle.run.library_epilogue import with_library_order
from oracle.run.recording import Recording, RecordingError, without_padding_tiles
from oracle.run.simulate import simulate

LIBRARY_ORDER = ("alpha_beta", "cast")  # what the traced pointer-array LinearCombination tree declares
DEFECT_GROUP = {"grouped_host_b_of_group0": 1, "grouped_host_a_of_group0": 3, "grouped_host_alpha_twice_group1": 1}
GROUPED_CU = Path(__file__).resolve().parents[2] / "zoo" / "cutlass_sm90" / "grouped.cu"


def _grouped_entries() -> list[dict]:
    return entries("zoo/cutlass_sm90/grouped.cu")


def a_with_group3_at_base(spec, a: torch.Tensor) -> torch.Tensor:
    """A as the kernel reads it when group 3's pointer is A's base: group 3's rows are A's first M_3 rows."""
    offs, m3 = group_offsets(spec), spec.groups[3]
    assert m3 <= offs[3], "the defect's reads stay inside A's buffer"
    seen = a.clone()
    seen[offs[3]:offs[3] + m3] = a[:m3]
    return seen


def _spliced(correct: Recording, wrong: Recording, spec, group: int) -> Recording:
    """`correct` with group `group`'s taps and D rows taken from `wrong` (each group its own GEMM)."""
    offs = group_offsets(spec)
    out = correct.output.clone()
    out[offs[group]:offs[group + 1]] = wrong.output[offs[group]:offs[group + 1]]
    taps = tuple(t for t in correct.taps if t.group != group) + tuple(t for t in wrong.taps if t.group == group)
    return replace(correct, output=out, taps=taps)


def model(case, ops, provenance, defect) -> Recording:
    """The recording the traced grouped kernel makes with `defect` (None: correct)."""
    spec, tiles = case.spec, case.trace.tiles
    correct = simulate(spec, ops, provenance, tap_tiles=tiles)
    if defect is None:
        return correct
    if defect == "grouped_host_b_of_group0":
        b = ops.b.clone()
        b[1] = ops.b[0]
        return replace(simulate(spec, replace(ops, b=b), provenance, tap_tiles=tiles), operands=ops)
    if defect == "grouped_host_a_of_group0":
        seen = replace(ops, a=a_with_group3_at_base(spec, ops.a))
        return replace(simulate(spec, seen, provenance, tap_tiles=tiles), operands=ops)
    assert defect == "grouped_host_alpha_twice_group1", defect
    squared = simulate(replace(spec, alpha=spec.alpha * spec.alpha), ops, provenance, tap_tiles=tiles)
    return _spliced(correct, replace(squared, spec=spec), spec, 1)


def with_padding_ctas(rec: Recording, spec, selected) -> Recording:
    """`rec` with the taps a 2 x 1 cluster's padding CTAs add: in a group of an odd count of M tiles, the CTA
    beside its last M tile runs tile (tiles_m, n); where the selection names it, it taps what that CTA sees,
    the taps of tile (tiles_m - 1, n) with every value but B's zero."""
    extra = []
    for g, m in enumerate(spec.groups):
        tiles_m = -(-m // spec.tile.bm)
        if m == 0 or tiles_m % 2 == 0:
            continue
        for tm, tn in selected:
            if tm != tiles_m or tn >= spec.tiles_n:
                continue
            beside = simulate(spec, rec.operands, rec.provenance, tap_tiles=((tiles_m - 1, tn),))
            for t in beside.taps:
                if t.group == g:
                    real = t.stage in ("descriptor_b", "load_b")
                    extra.append(replace(t, tile=(tm, tn), values=t.values if real else torch.zeros_like(t.values)))
    return replace(rec, taps=rec.taps + tuple(extra))


def _cluster_entries() -> list[dict]:
    return [e for e in _grouped_entries() if "ZOO_GROUPED_CLUSTER_2X1" in entry_case(e).kernel.defines]


def _pingpong_entries() -> list[dict]:
    return [e for e in _grouped_entries() if "ZOO_GROUPED_PINGPONG" in entry_case(e).kernel.defines]


def pingpong_sm_count() -> int:
    """The SM count grouped.cu gives its ping-pong variant (kSmCount under ZOO_GROUPED_PINGPONG)."""
    found = re.search(r"#if defined\(ZOO_GROUPED_PINGPONG\)\n(?:.*\n)*?constexpr int kSmCount = (\d+);",
                      GROUPED_CU.read_text())
    assert found, "grouped.cu sets no kSmCount for ZOO_GROUPED_PINGPONG"
    return int(found.group(1))


def pingpong_deal(spec, sm_count: int) -> list[list[tuple[int, int, int]]]:
    """Each CTA's tiles in the order its consumer warp groups take them, as (warp group, group, index of the
    tile in its group): CUTLASS's group scheduler numbers the groups' tiles one group after the other (an
    empty group has none) and launches min(SMs, tiles) CTAs (cluster 1), CTA c taking tiles c, c + CTAs, ...;
    the ping-pong kernel's two warp groups take a CTA's tiles in turn, the first warp group first."""
    tiles = [(g, i) for g, m in enumerate(spec.groups)
             for i in range(-(-m // spec.tile.bm) * -(-spec.n // spec.tile.bn))]
    ctas = min(sm_count, len(tiles))
    return [[(j % 2, *tiles[t]) for j, t in enumerate(range(c, len(tiles), ctas))] for c in range(ctas)]


def test_the_manifest_has_the_grouped_entries():
    names = {e["name"] for e in _grouped_entries()}
    assert names == {"cutlass_sm90_grouped_correct", "cutlass_sm90_grouped_host_correct",
                     "cutlass_sm90_grouped_host_b_of_group0", "cutlass_sm90_grouped_host_a_of_group0",
                     "cutlass_sm90_grouped_host_alpha_twice_group1", "cutlass_sm90_grouped_pingpong_correct",
                     "cutlass_sm90_grouped_pingpong_host_a_of_group0", "cutlass_sm90_grouped_cluster_correct",
                     "cutlass_sm90_grouped_cluster_host_a_of_group0"}, names
    assert {e["name"] for e in _pingpong_entries()} == {"cutlass_sm90_grouped_pingpong_correct",
                                                        "cutlass_sm90_grouped_pingpong_host_a_of_group0"}
    for e in _grouped_entries():
        if e["defect"] is not None:
            assert e["expected_group"] == DEFECT_GROUP[e["defect"]], e["name"]


@pytest.mark.parametrize("entry", _pingpong_entries(), ids=lambda e: e["name"])
def test_the_ping_pong_entries_run_a_cta_s_two_warp_groups_on_different_groups(entry):
    """With grouped.cu's SM count, every CTA runs several tiles, its second warp group has work, and in some CTA
    the two warp groups take tiles of different groups one after the other (one in its epilogue while the other
    runs its mainloop); a defect entry's tile (its group's first) runs on a second warp group right after the
    first warp group's tile of another group."""
    spec = entry_case(entry).spec
    deal = pingpong_deal(spec, pingpong_sm_count())
    assert all(len(cta) >= 2 for cta in deal), deal
    assert any(a[1] != b[1] for cta in deal for a, b in zip(cta, cta[1:])), deal
    if entry["defect"] is not None:
        assert entry["expected_tile"] == [0, 0]
        where = [(cta, j) for cta in deal for j, t in enumerate(cta) if t[1:] == (entry["expected_group"], 0)]
        assert len(where) == 1, where
        cta, j = where[0]
        assert cta[j][0] == 1 and j > 0 and cta[j - 1][1] != entry["expected_group"], cta


def test_the_group_sizes_are_ragged_with_an_empty_group():
    spec = entry_case(_grouped_entries()[0]).spec
    assert 0 in spec.groups and len(set(spec.groups)) == len(spec.groups)
    assert any(m % spec.tile.bm for m in spec.groups if m)  # a group ends inside a tile


@pytest.mark.slow
@pytest.mark.parametrize("entry", _grouped_entries(), ids=lambda e: e["name"])
def test_grouped_entry_on_a_model(entry):
    case, _ = with_library_order(entry_case(entry), LIBRARY_ORDER)  # as a live run resolves it
    spec = case.spec
    live = [g for g, m in enumerate(spec.groups) if m > 0]
    seed = entry.get("seed", 0)
    ops = make_operands(spec, "random", seed)
    rec = model(case, ops, Provenance("random", seed), entry["defect"])
    assert {t.group for t in rec.taps} == set(live)  # every tap names its group; the empty one has none
    if entry in _cluster_entries():
        rec = _padding_left_out(rec, spec, case.trace.tiles)
    an = analyze(rec)
    check_judgement(entry["expected_stage"], case, an, entry)
    # each group judged as its own GEMM: one outcome per group (the empty one without rows), the defect's group
    # named, the others clean
    assert [o.group for o in an.groups] == list(range(len(spec.groups))), an.groups
    assert [o.rows for o in an.groups] == list(spec.groups), an.groups
    bad = DEFECT_GROUP.get(entry["defect"])
    for o in an.groups:
        if o.rows == 0:
            assert o.verdict is None, o.describe()  # the empty group: nothing to judge
        elif o.group == bad:
            assert (o.verdict, o.stage) == (Verdict.DIVERGED, entry["expected_stage"]), o.describe()
        else:
            assert o.verdict is Verdict.MATCH, o.describe()


def _padding_left_out(rec: Recording, spec, selected) -> Recording:
    """The cluster model's recording as the live run keeps it: its padding CTAs' taps (which the recording
    alone refuses) left out with a note per group that had one."""
    padded = with_padding_ctas(rec, spec, selected)
    taps, notes = without_padding_tiles(spec, padded.taps)
    added = len(padded.taps) - len(rec.taps)
    assert len(taps) == len(rec.taps), (len(taps), len(rec.taps))
    if added:
        with pytest.raises(RecordingError, match="outside the 1x2 tile grid"):
            padded.validate()
        assert len(notes) == 1 and notes[0].startswith("group 1: the taps of tile (1, 1)"), notes
    else:
        assert notes == ()
    return replace(padded, taps=taps, notes=padded.notes + notes)


def test_the_cluster_entries_select_a_padding_cta_s_tile_where_a_group_has_one_m_tile():
    """The correct cluster entry selects tile (1, 1), which group 1 (one M tile) runs only as its padding CTA's;
    a padding tap that is not all zero on A's side is kept, so the recording refuses it."""
    correct = next(e for e in _cluster_entries() if e["defect"] is None)
    case = entry_case(correct)
    spec = case.spec
    assert -(-spec.groups[1] // spec.tile.bm) == 1 and (1, 1) in case.trace.tiles
    ops = make_operands(spec, "random", correct["seed"])
    rec = with_padding_ctas(model(case, ops, Provenance("random", correct["seed"]), None), spec, case.trace.tiles)
    forged = tuple(replace(t, values=torch.ones_like(t.values)) if (t.group, t.tile, t.stage) == (1, (1, 1), "mma")
                   else t for t in rec.taps)
    taps, notes = without_padding_tiles(spec, forged)
    assert notes == () and len(taps) == len(forged)
    with pytest.raises(RecordingError, match="outside the 1x2 tile grid"):
        replace(rec, taps=taps).validate()


def test_the_cluster_recording_shows_the_padding_cta_left_out():
    """On the GPU, group 1's padding CTA ran the selected tile (1, 1): the recorded run says its taps were left
    out (the dump keeps the recorder's notes), and no tap of the dump lies outside its group's grid."""
    from oracle.run.dumps import load_dump

    entry = next(e for e in _cluster_entries() if e["defect"] is None)
    path = Path(__file__).resolve().parents[2] / entry["dump"]
    if not path.exists():
        pytest.skip(f"{entry['dump']} has not been recorded yet")
    dump = load_dump(str(path))
    notes = [n for n in dump.meta["notes"] if n.startswith("group 1: the taps of tile (1, 1)")]
    assert len(notes) == 1, dump.meta["notes"]
    spec = entry_case(entry).spec
    rec = model(entry_case(entry), make_operands(spec, "random", entry["seed"]), Provenance("random", 0), None)
    assert {(t.group, t.tile) for t in rec.taps} == {(t.group, t.tile) for t in dump.taps}

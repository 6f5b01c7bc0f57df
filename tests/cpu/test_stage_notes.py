"""The differential's stages return what they noticed (judge.StageNotes) instead of writing it into
shared state: a stage judged twice notes the same thing twice, the parts they read (geometry, tap
index, tensors) are frozen, and the analysis folds the notes in pipeline order. Under the Triton
interpreter."""

import dataclasses

import pytest
import torch

from oracle.judging.differential.context import Context
from oracle.judging.differential.judge import StageNotes, fold_notes
from oracle.judging.differential.mma import mma_stage
from oracle.judging.differential.operands import load_stage
from oracle.problem.spec import ProblemSpec, Tile
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import simulate

# batch 8 < the MMA tile: the taps' rows past M hold stale data (the padding confound)
SPEC = ProblemSpec(m=8, n=128, k=192, tile=Tile(64, 64, 64), swizzle_a=128, swizzle_b=128)


def _context() -> Context:
    ops = make_operands(SPEC, "random", seed=3)
    rec = simulate(SPEC, ops, Provenance("random", 3), tap_tiles=[(0, 0), (0, 1)], stale_padding=True)
    return Context.of(rec, torch.device("cpu"))


def test_a_stage_judged_twice_notes_its_padding_the_same_each_time():
    ctx = _context()
    (_, first), (_, again) = load_stage(ctx, "a"), load_stage(ctx, "a")
    assert [k for k, _ in first.padding] == ["load_a"] and first.padding[0][1] > 0
    assert first.padding == again.padding  # nothing accumulated between the calls
    parts = (ctx.geo, ctx.taps, ctx.ops)
    (_, mma_first, _), (_, mma_again, _) = mma_stage(*parts), mma_stage(*parts)
    assert [k for k, _ in mma_first.padding] == ["mma"] and mma_first.padding == mma_again.padding
    assert first.compare_s > 0 and not first.confounds


def test_the_parts_a_stage_reads_are_frozen():
    ctx = _context()
    for part, name in ((ctx, "geo"), (ctx.geo, "bm"), (ctx.taps, "records"), (ctx.ops, "a")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, name, None)


def test_notes_fold_in_pipeline_order():
    a = StageNotes(("x",), (("load_a", 3),), 0.5)
    b = StageNotes(("y", "x"), (("mma", 2), ("load_a", 1)), 0.25)
    assert fold_notes([a, b]) == StageNotes(("x", "y"), (("load_a", 4), ("mma", 2)), 0.75)
    assert fold_notes([]) == StageNotes()


def test_a_padding_count_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match=r"StageNotes.padding.*'mma', 0"):
        StageNotes(padding=(("mma", 0),))

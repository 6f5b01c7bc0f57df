"""Block scales on grouped (MoE) and batched problems: A's per-row scales stack with A's rows over the
groups ([total M, K / gk]), B's are one tensor per group ([groups, N / gn, K / gk]). The spec takes
the layout, the inputs make it (a B scale of another group names its group), each group is judged
with its own scales (an empty group included), and a kernel that applies group 0's B scales to a
later group is named at scale_b with that group and "the scale of group 0"."""

from __future__ import annotations

import pytest
import torch

from kernels_ref import scales as S
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile
from oracle.run.inputs import Provenance, expected_shapes, make_operands
from oracle.run.scale_model import ScaleInjection, simulate_scaled

GROUPS = (32, 40, 0, 16)  # MoE tokens per expert, one expert empty


def _grouped(**kw) -> ProblemSpec:
    kw.setdefault("groups", GROUPS)
    kw.setdefault("m", sum(kw["groups"]) if kw.get("groups") else 40)
    return ProblemSpec(n=64, k=96, a_dtype="e4m3", b_dtype="e4m3", out_dtype="bf16", tile=Tile(32, 32, 32),
                       scale_a=kw.pop("scale_a", Scale("block", (1, 32), dtype="e8m0")),
                       scale_b=kw.pop("scale_b", Scale("block", (1, 32), dtype="e8m0")), **kw)


def test_the_spec_takes_grouped_and_batched_block_scales_and_names_what_it_refuses():
    spec = _grouped()
    assert ProblemSpec.from_json(spec.to_json()) == spec
    batched = _grouped(groups=None, batch=3, scale_a=Scale("block", (1, 32)), scale_b=Scale("block", (32, 32), "col"))
    assert batched.group_sizes == (40, 40, 40)
    with pytest.raises(SpecError, match=r"scale_a.block=\(32, 32\).*per row"):
        _grouped(scale_a=Scale("block", (32, 32)), scale_b=Scale("block", (32, 32)))
    with pytest.raises(SpecError, match="scale_b.kind='col'.*per-tensor or block"):
        _grouped(scale_a=Scale("tensor"), scale_b=Scale("col"))


def test_the_inputs_stack_a_scales_and_give_each_group_its_b_scales():
    spec = _grouped()
    shapes = expected_shapes(spec)
    assert shapes["scale_a"] == (88, 3) and shapes["scale_b"] == (4, 64, 3)
    ops = make_operands(spec, "scales")
    assert tuple(ops.scale_a.shape) == (88, 3) and tuple(ops.scale_b.shape) == (4, 64, 3)
    vb = S.scale_values(ops.scale_b, "e8m0")
    for e in range(1, 4):  # the same place of another group's B scales holds another power of two
        assert bool((vb[e] != vb[0]).all()), e
    assert tuple(make_operands(spec, "random", 3).scale_b.shape) == (4, 64, 3)


def test_identify_names_a_scale_of_another_group():
    from oracle.judging.scale_hint import PeerScales, ScaleSite, identify

    own = torch.tensor([[4.0, 8.0]], dtype=torch.float64)
    peers = PeerScales("group", 1, ((0, torch.tensor([[16.0, 32.0]], dtype=torch.float64)),))
    h = identify(ScaleSite("b", (0, 0), 0, 0, 1), 32.0, own, None, 1, peers)
    assert "the scale of group 0: B's scales of group 0 applied to group 1" in h
    assert identify(ScaleSite("b", (0, 0), 0, 0, 1), 8.0, own, None, 1, peers) is None


@pytest.mark.parametrize("inputs", ["scales", "random"])
def test_a_correct_grouped_model_matches_every_group_with_its_own_scales(inputs):
    spec = _grouped()
    rec = simulate_scaled(spec, make_operands(spec, inputs, 1), Provenance(inputs, 1))
    an = analyze(rec)
    assert an.verdict is Verdict.MATCH, an.first
    assert [g.describe() for g in an.groups] == ["group 0 (rows 0..31): MATCH", "group 1 (rows 32..71): MATCH",
                                                 "group 2 (empty): nothing to judge", "group 3 (rows 72..87): MATCH"]
    judged = {s.name: (s.teacher_forced.status.name, s.chained.status.name) for s in an.stages}
    for stage in ("scale_a", "scale_b", "mma", "epilogue_store"):
        assert judged[stage] == ("MATCH", "MATCH"), (stage, judged)


def test_group_0s_b_scales_applied_to_group_1_are_named_at_scale_b():
    spec = _grouped()
    ops = make_operands(spec, "scales")
    an = analyze(simulate_scaled(spec, ops, Provenance("scales", 0), ScaleInjection("scale_group_b_not_advanced")))
    assert an.verdict is Verdict.DIVERGED and an.kind is Kind.VERDICT
    first = an.first
    assert first.stage == "scale_b" and first.group == 1, first
    assert "the scale of group 0: B's scales of group 0 applied to group 1" in first.hint, first.hint


def test_a_batched_problem_is_judged_with_each_entrys_scales():
    spec = _grouped(groups=None, batch=3, scale_a=Scale("block", (1, 32)), scale_b=Scale("block", (32, 32)))
    ops = make_operands(spec, "scales")
    assert tuple(ops.scale_a.shape) == (120, 3) and tuple(ops.scale_b.shape) == (3, 2, 3)
    assert analyze(simulate_scaled(spec, ops, Provenance("scales", 0))).verdict is Verdict.MATCH
    an = analyze(simulate_scaled(spec, ops, Provenance("scales", 0), ScaleInjection("scale_group_b_not_advanced")))
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "scale_b" and an.first.group == 1, an.first
    assert "the scale of batch entry 0" in an.first.hint, an.first.hint


def test_the_expected_output_of_a_grouped_block_scaled_problem_is_every_groups():
    """expected_output (what a reproducer's expected.bin holds) stacks each group's reference, made with
    the group's own scales: it equals the correct model's D."""
    from oracle.judging.differential.analysis import expected_output

    spec = _grouped()
    ops = make_operands(spec, "random", 2)
    y, bound = expected_output(spec, ops, torch.device("cpu"))
    d = simulate_scaled(spec, ops, Provenance("random", 2)).output
    assert tuple(y.shape) == (88, 64)
    assert bool(((y.double() - d.double()).abs() <= bound).all())

"""A block scale's storage order (oracle.problem.spec.Scale.major): validated, absent from the JSON
when it is the default, and honoured where the kernel's buffers are laid out (oracle.run.live) and in
a reproducer's tensor list; the logical scales, hence the reference, do not change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile
from oracle.run.case import load_case
from oracle.run.inputs import make_operands
from oracle.run.launch import launch_sequence, scale_major
from oracle.repro.generate import _major_of

ROOT = Path(__file__).resolve().parents[2]
MN_CASE = ROOT / "zoo" / "hopper_gemm" / "hopper_gemm_e4m3_block_mn.toml"


def _spec(major_a="row", major_b="row", **kw):
    return ProblemSpec(m=40, n=24, k=256, a_dtype="e4m3", b_dtype="e4m3", tile=Tile(128, 128, 128),
                       promotion_interval=128, scale_a=Scale("block", (1, 128), major_a),
                       scale_b=Scale("block", (128, 128), major_b), **kw)


def test_major_is_checked_and_named():
    with pytest.raises(SpecError, match="scale_a.major"):
        _spec(major_a="mn")
    with pytest.raises(SpecError, match="scale_b.major"):
        ProblemSpec(m=8, n=8, k=32, a_dtype="e4m3", b_dtype="e4m3", scale_b=Scale("col", None, "col"))
    assert _spec(major_a="col").scale_a.major == "col"


def test_default_major_is_absent_from_the_json_and_round_trips():
    row, col = _spec(), _spec(major_a="col")
    assert "major" not in row.to_json()["scale_a"] and "major" not in row.to_json()["scale_b"]
    assert col.to_json()["scale_a"]["major"] == "col"
    assert ProblemSpec.from_json(col.to_json()) == col and ProblemSpec.from_json(row.to_json()) == row
    assert col != row


def test_an_mn_major_block_scale_is_stored_transposed_for_the_kernel():
    case = load_case(str(MN_CASE), {"m": 40, "n": 24, "k": 256})
    assert scale_major(case.spec, "scale_a") == "col" and scale_major(case.spec, "scale_b") == "row"
    assert scale_major(case.spec, "bias") is None
    ops = make_operands(case.spec, "random", 3)
    _, tensors = launch_sequence(case, ops)
    assert tuple(ops.scale_a.shape) == (40, 2)  # logical [M, K / 128]
    assert torch.equal(tensors["scale_a"], ops.scale_a.t().contiguous())  # memory [K / 128, M]
    assert torch.equal(tensors["scale_b"], ops.scale_b.contiguous())
    assert _major_of(case.spec, "scale_a") == "col" and _major_of(case.spec, "scale_b") is None
    row = load_case(str(ROOT / "zoo" / "hopper_gemm" / "hopper_gemm_e4m3_block.toml"), {"m": 40, "n": 24, "k": 256})
    _, tensors = launch_sequence(row, make_operands(row.spec, "random", 3))
    assert tensors["scale_a"].shape == (40, 2)

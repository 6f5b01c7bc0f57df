"""Block scales under a ragged K with scale groups narrower than the k-block (OCP MX 1 x 32 groups
under a 64- or 128-deep k-block, K no multiple of either): the scale tensors hold ceil(K / gk)
groups, the last k-block fewer of them, the last one partial. The references never index past the
tensors and give a group wholly past K scale 0; the scale stages judge the partial group and not
the groups past K; oracle.check judges such a result with the k-block it is given."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import oracle
from kernels_ref import mma as X
from kernels_ref import mma_sample
from kernels_ref import scales as S
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, Scale, Tile
from oracle.run.inputs import Provenance, make_operands
from oracle.run.scale_model import ScaleInjection, default_problem, simulate_scaled
from ref_checks import block_scaled_operands, same  # tests/ is on sys.path

K_RAGGED = 208  # 6.5 groups of 32: groups 0..6, group 6 holds k 192..207; k-block 3 of 64 holds groups 6 and (7)


def _model(defect=None, groups=2, k=K_RAGGED, splits=1):
    """The block-scaled model on its MX problem with `groups` 1 x 32 groups per k-block and K = k."""
    spec = dataclasses.replace(default_problem(None, "e8m0", groups, splits), k=k)
    return simulate_scaled(spec, make_operands(spec, "scales", 0), Provenance("scales", 0),
                           ScaleInjection(defect) if defect else None)


def _by_hand(a, b, sa, sb, gk):
    """fp32(p_g * fp32(sa * sb)) added per group in k order, the partial last group over its k only."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for g in range(sa.shape[1]):
        ks = slice(g * gk, min((g + 1) * gk, a.shape[1]))
        p = (a.double()[:, ks] @ b.double()[ks]).float()
        acc = acc + p * (sa[:, g][:, None] * sb[:, g][None, :]).float()
    return acc


def test_the_references_accumulate_a_ragged_k_group_by_group_inside_the_tensors():
    a, b, sa, sb, grp = block_scaled_operands(24, 20, 80, 1, 32, 50, 52, pow2=False)  # 3 groups, k-blocks of 64
    assert sa.shape[1] == 3
    want = _by_hand(a, b, sa, sb, 32)
    got = X.mma_accumulate(a, b, 16, 16, 64, scale_a=sa, scale_b=sb, block_scale_group=grp)
    assert same(got, want)
    assert same(X.mma_accumulate_host(a, b, 16, 16, 64, scale_a=sa, scale_b=sb, block_scale_group=grp), want)
    sample, _ = mma_sample.mma_sample_host(a, b, torch.tensor([[0, 5, 23]]), torch.tensor([[1, 19]]), 16, 16, 64,
                                   scale_a=sa, scale_b=sb, block_scale_group=grp)
    assert same(sample[0], want[[0, 5, 23]][:, [1, 19]])


def test_tile_scales_give_zero_for_groups_past_k_and_live_groups_says_which_exist():
    vals = torch.arange(1, 8, dtype=torch.float64)[None, :]  # one row, 7 groups (K = 208, gk = 32)
    assert S.tile_scales(vals, 1, 32, 0, 1, 3, 64, 1).tolist() == [[7.0, 0.0]]
    assert S.live_groups(3, 32, 64, K_RAGGED).tolist() == [True, False]
    assert S.live_groups(1, 32, 128, 200).tolist() == [True, True, True, False]  # 200 = 6.25 groups


def test_the_spec_takes_a_ragged_k_under_narrow_groups():
    spec = ProblemSpec(64, 64, 100, "e4m3", "e4m3", tile=Tile(64, 64, 128), scale_a=Scale("block", (1, 32), dtype="e8m0"),
                       scale_b=Scale("block", (1, 32), dtype="e8m0"))
    assert spec.k_blocks == 1 and S.groups_of_problem(spec) == 4
    assert ProblemSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("kw", [dict(groups=2, k=K_RAGGED), dict(groups=4, k=200), dict(groups=2, k=K_RAGGED, splits=2)],
                         ids=["mx_bk64", "mx_bk128", "mx_bk64_split"])
def test_a_correct_model_matches_at_every_stage_whatever_it_applies_past_k(kw):
    rec = _model(**kw)
    spec = rec.spec
    assert spec.k % spec.tile.bk and spec.tile.bk > spec.scale_a.block[1]
    # past K a kernel may hold anything: the last k-block's scale taps get a value no scale has there
    last = spec.k_blocks - 1
    live = S.live_groups(last, spec.scale_a.block[1], spec.tile.bk, spec.k)
    assert not bool(live.all())
    taps = []
    for t in rec.taps:
        if t.stage.startswith("scale_") and t.k_block == last:
            v = t.values.clone()
            v[:, ~live] = 3.0
            t = dataclasses.replace(t, values=v)
        taps.append(t)
    an = analyze(dataclasses.replace(rec, taps=tuple(taps)))
    assert an.verdict is Verdict.MATCH, an.first
    judged = {s.name: (s.teacher_forced.status.name, s.chained.status.name) for s in an.stages}
    for stage in ("scale_a", "scale_b", "mma", "epilogue_store") + (("reduce",) if "splits" in kw else ()):
        assert judged[stage] == ("MATCH", "MATCH"), (stage, judged)
    assert not an.cross_check, an.cross_check


def test_a_wrong_scale_in_the_partial_last_group_is_found_and_named():
    """The trailing group (k 192..207 of K = 208, half of it past K) never loaded: the register keeps
    group 5's scale. Found at scale_a in the last k-block, named by the scale it equals."""
    an = analyze(_model("scale_trailing_skipped"))
    assert an.verdict is Verdict.DIVERGED and an.kind is Kind.VERDICT
    first = an.first
    assert first.stage == "scale_a" and first.k_block == 3, first
    assert first.element[1] == 6  # the stage's column: k-block 3 x 2 groups + group 0 of the k-block: group 6
    assert "scale group 6" in first.hint and "the scale of k-block group 5 was used for group 6" in first.hint


# -- oracle.check -----------------------------------------------------------------------------------
M, N, K = 40, 24, 80  # three 1 x 32 groups, the last one k 64..79 (half of it)


def _mx_operands(seed: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(K, N, generator=g) * 2).to(torch.float8_e4m3fn)
    va = torch.pow(2.0, torch.randint(-3, 4, (M, 3), generator=g).double())
    vb = torch.pow(2.0, torch.randint(-3, 4, (N, 3), generator=g).double())
    return a, b, va, vb


def _emulated(a, b, va, vb) -> torch.Tensor:
    """D = (A * scales) @ (B * scales), each element dequantised with its group's scale, rounded once."""
    sa = va.repeat_interleave(32, 1)[:, :K]
    sb = vb.repeat_interleave(32, 1)[:, :K]
    return ((a.double() * sa) @ (b.double() * sb.T)).to(torch.bfloat16)


def _e8m0(v: torch.Tensor) -> torch.Tensor:
    return (v.log2().long() + 127).to(torch.uint8)


@pytest.mark.parametrize("tile", [None, (32, 32, 64)], ids=["default_tile", "given_tile"])
def test_check_with_a_ragged_k_and_mx_scales_matches_a_correct_result(tile):
    a, b, va, vb = _mx_operands(7)
    kw = {} if tile is None else {"tile": tile}
    report = oracle.check(a, b, _emulated(a, b, va, vb), scale_a=_e8m0(va), scale_b=_e8m0(vb), **kw)
    assert report.verdict == "MATCH", report
    spec = report.recording.spec
    assert spec.scale_a.block == (1, 32) and spec.tile.bk == 64  # the k-block given (or the default), not one group


def test_check_with_a_ragged_k_finds_a_wrong_scale_of_the_last_partial_group():
    a, b, va, vb = _mx_operands(8)
    wrong = va.clone()
    wrong[29, 2] *= 4  # row 29's last group, k 64..79
    report = oracle.check(a, b, _emulated(a, b, wrong, vb), scale_a=_e8m0(va), scale_b=_e8m0(vb), tile=(32, 32, 64))
    assert report.verdict == "DIVERGED", report
    first = report.first_divergence
    assert first.stage == "epilogue_store" and first.element[0] == 29, first

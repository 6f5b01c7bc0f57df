"""K-grouped GEMMs (groups along K, as an MoE weight gradient): G groups share M and N, group g owns
K_g consecutive columns of A [M, K] and the same rows of B, and writes its own D_g [M, N] (D and C
hold them one after the other). The spec takes and refuses the field by name; the inputs keep each
group a controlled problem of its own; each group is judged as its own GEMM, an empty group by the
epilogue of a zero accumulator; check() and the case file take it; the reproducer refuses it."""

from __future__ import annotations

import pytest
import torch

from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile

K_GROUPS = (32, 0, 48, 16)  # ragged, one empty group


def _spec(**kw) -> ProblemSpec:
    kw.setdefault("k_groups", K_GROUPS)
    kw.setdefault("k", sum(kw["k_groups"]))
    return ProblemSpec(**{"m": 40, "n": 24, "tile": Tile(16, 16, 16), **kw})


# -- the spec ------------------------------------------------------------------------------------
def test_the_spec_takes_k_groups_and_serialises_them():
    spec = _spec()
    assert spec.group_sizes == (40,) * 4 and spec.total_m == 160 and spec.a_rows == 40
    assert spec.k_offsets == (0, 32, 32, 80, 96)
    assert "K groups [32, 0, 48, 16]" in spec.describe()
    assert ProblemSpec.from_json(spec.to_json()) == spec
    assert spec.to_json()["k_groups"] == [32, 0, 48, 16]
    assert "k_groups" not in ProblemSpec(m=8, n=8, k=8).to_json()


@pytest.mark.parametrize("kw, match", [
    (dict(k_groups=(32, 0, 48, 15), k=96), r"k_groups=\(32, 0, 48, 15\) .*add up to k = 96 \(they add up to 95\)"),
    (dict(k_groups=(32, -1, 65)), r"k_groups\[1\]=-1 is not allowed"),
    (dict(k_groups=(32, True, 63), k=96), r"k_groups\[1\]=True is not allowed"),
    (dict(k_groups=(32, 1.5, 62), k=96), r"k_groups\[1\]=1.5 is not allowed"),
    (dict(k_groups=(), k=96), r"k_groups=\(\) is not allowed: a non-empty list"),
    (dict(k_groups=[32, 64]), r"k_groups=\[32, 64\] is not allowed"),
    (dict(groups=(20, 20)), r"k_groups=.*grouped along M \(groups\) or along K \(k_groups\), not both"),
    (dict(batch=2), r"k_groups=.*no batch \(batch is 2\)"),
    (dict(splits=2), r"k_groups=.*without split-K or stream-K"),
    (dict(stream_k_workers=3), r"k_groups=.*without split-K or stream-K"),
])
def test_the_spec_names_k_groups_for_each_bad_value(kw, match):
    with pytest.raises(SpecError, match=match):
        _spec(**kw)


def test_block_scales_need_every_group_a_multiple_of_the_scale_groups_k():
    fp8 = dict(a_dtype="e4m3", b_dtype="e4m3", tile=Tile(32, 32, 32))
    ok = _spec(k_groups=(32, 0, 64), scale_a=Scale("block", (32, 32)), scale_b=Scale("block", (32, 32)), **fp8)
    assert ok.block_scaled  # A's scales need not be per row: A is not stacked
    with pytest.raises(SpecError, match=r"k_groups\[2\]=48 .*multiple of the scale group's k extent \(32\)"):
        _spec(k_groups=(32, 0, 48, 16), scale_a=Scale("block", (1, 32)), scale_b=Scale("block", (32, 32)), **fp8)


def test_the_case_file_takes_k_groups(tmp_path):
    from oracle.run.case import load_case
    from oracle.run.case_types import CaseError

    p = tmp_path / "case.toml"
    p.write_text('[problem]\nm = 40\nn = 24\nk = 96\nk_groups = [32, 0, 48, 16]\ntile = [16, 16, 16]\n')
    assert load_case(str(p)).spec.k_groups == K_GROUPS
    p.write_text('[problem]\nm = 40\nn = 24\nk = 96\nk_groups = [32, 0, 48]\n')
    with pytest.raises(CaseError, match=r"problem: k_groups=\(32, 0, 48\) .*add up to k = 96"):
        load_case(str(p))

"""K-grouped GEMMs (groups along K, as an MoE weight gradient): G groups share M and N, group g owns
K_g consecutive columns of A [M, K] and the same rows of B, and writes its own D_g [M, N] (D and C
hold them one after the other). The spec takes and refuses the field by name; the inputs keep each
group a controlled problem of its own; each group is judged as its own GEMM, an empty group by the
epilogue of a zero accumulator; check() and the case file take it; the reproducer refuses it."""

from __future__ import annotations

import pytest
import torch

from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile

K_GROUPS = (32, 48, 0, 16)  # ragged, group 2 empty


def _spec(**kw) -> ProblemSpec:
    kw.setdefault("k_groups", K_GROUPS)
    kw.setdefault("k", sum(kw["k_groups"]))
    return ProblemSpec(**{"m": 40, "n": 24, "tile": Tile(16, 16, 16), **kw})


# -- the spec ------------------------------------------------------------------------------------
def test_the_spec_takes_k_groups_and_serialises_them():
    spec = _spec()
    assert spec.group_sizes == (40,) * 4 and spec.total_m == 160 and spec.a_rows == 40
    assert spec.k_offsets == (0, 32, 80, 80, 96)
    assert "K groups [32, 48, 0, 16]" in spec.describe()
    assert ProblemSpec.from_json(spec.to_json()) == spec
    assert spec.to_json()["k_groups"] == [32, 48, 0, 16]
    assert "k_groups" not in ProblemSpec(m=8, n=8, k=8).to_json()


@pytest.mark.parametrize("kw, match", [
    (dict(k_groups=(32, 48, 0, 15), k=96), r"k_groups=\(32, 48, 0, 15\) .*add up to k = 96 \(they add up to 95\)"),
    (dict(k_groups=(32, -1, 65)), r"k_groups\[1\]=-1 is not allowed"),
    (dict(k_groups=(32, True, 63), k=96), r"k_groups\[1\]=True is not allowed"),
    (dict(k_groups=(32, 1.5, 62), k=96), r"k_groups\[1\]=1.5 is not allowed"),
    (dict(k_groups=(), k=96), r"k_groups=\(\) is not allowed: a non-empty list"),
    (dict(k_groups=[32, 64]), r"k_groups=\[32, 64\] is not allowed"),
    (dict(groups=(20, 20)), r"k_groups=.*grouped along M \(groups\) or along K \(k_groups\), not both"),
    (dict(batch=2), r"k_groups=.*no batch \(batch is 2\)"),
    (dict(splits=2), r"k_groups=.*without split-K or stream-K"),
    (dict(stream_k_workers=3), r"k_groups=.*without split-K or stream-K"),
    (dict(a_dtype="fp16", b_dtype="int4", b_packing="k_pairs_low_first", b_scales="fp16", tile=Tile(16, 16, 16)),
     r"k_groups=.*quantised operand is modelled for a single GEMM"),
])
def test_the_spec_names_k_groups_for_each_bad_value(kw, match):
    with pytest.raises(SpecError, match=match):
        _spec(**kw)


def test_block_scales_need_every_group_a_multiple_of_the_scale_groups_k():
    fp8 = dict(a_dtype="e4m3", b_dtype="e4m3", tile=Tile(32, 32, 32))
    ok = _spec(k_groups=(32, 0, 64), scale_a=Scale("block", (32, 32)), scale_b=Scale("block", (32, 32)), **fp8)
    assert ok.block_scaled  # A's scales need not be per row: A is not stacked
    with pytest.raises(SpecError, match=r"k_groups\[1\]=16 .*multiple of the scale group's k extent \(32\)"):
        _spec(k_groups=(32, 16, 48), scale_a=Scale("block", (1, 32)), scale_b=Scale("block", (32, 32)), **fp8)


def test_the_case_file_takes_k_groups(tmp_path):
    from oracle.run.case import load_case
    from oracle.run.case_types import CaseError

    p = tmp_path / "case.toml"
    p.write_text('[problem]\nm = 40\nn = 24\nk = 96\nk_groups = [32, 48, 0, 16]\ntile = [16, 16, 16]\n')
    assert load_case(str(p)).spec.k_groups == K_GROUPS
    p.write_text('[problem]\nm = 40\nn = 24\nk = 96\nk_groups = [32, 0, 48]\n')
    with pytest.raises(CaseError, match=r"problem: k_groups=\(32, 0, 48\) .*add up to k = 96"):
        load_case(str(p))


# -- the inputs ----------------------------------------------------------------------------------
def test_the_inputs_hold_a_and_b_whole_and_c_one_block_of_rows_per_group():
    from oracle.run.inputs import expected_shapes, make_operands

    spec = _spec(beta=0.5, c_dtype="bf16", bias="col")
    shapes = expected_shapes(spec)
    assert (shapes["a"], shapes["b"], shapes["c"], shapes["bias"]) == ((40, 96), (96, 24), (160, 24), (4, 24))
    for ladder in ("ones", "index", "ktag", "random"):
        ops = make_operands(spec, ladder, 2)
        assert (tuple(ops.a.shape), tuple(ops.b.shape), tuple(ops.c.shape)) == ((40, 96), (96, 24), (160, 24))


def test_the_controlled_inputs_encode_each_group_from_its_own_first_k():
    """index and ktag make each group's slice the ladder's own problem of K_g (so a hint read on the
    group's sub-problem names the group's k); the scales ladder keeps the global scale columns, so the
    same place of another group's scales holds another power of two."""
    from oracle.run.inputs import KTAG_PERIOD, index_values, make_operands

    spec = _spec()
    idx = make_operands(spec, "index")
    assert torch.equal(idx.a[:, 32:80].double(), index_values(40, 48, "bf16"))
    assert torch.equal(idx.b[80:96].double(), index_values(16, 24, "bf16"))
    ktag = make_operands(spec, "ktag").b.double()[:, 0]
    assert ktag[32].item() == 1.0 and ktag[48].item() == 2.0 and ktag[80].item() == 1.0  # k-blocks from each start
    assert KTAG_PERIOD >= 3
    fp8 = _spec(k_groups=(32, 64, 0), a_dtype="e4m3", b_dtype="e4m3", tile=Tile(32, 32, 32),
                scale_a=Scale("block", (1, 32)), scale_b=Scale("block", (32, 32)))
    sc = make_operands(fp8, "scales")
    assert tuple(sc.scale_a.shape) == (40, 3) and tuple(sc.scale_b.shape) == (1, 3)
    assert bool((sc.scale_a[:, 0] != sc.scale_a[:, 1]).all())  # group 1's first column is not group 0's
    from oracle.run.inputs import group_scales

    sa, sb = group_scales(fp8, sc, 1)  # group 1 (k 32..95): the scale columns 1 and 2
    assert torch.equal(sa, sc.scale_a[:, 1:3]) and torch.equal(sb, sc.scale_b[:, 1:3])
    assert tuple(group_scales(fp8, sc, 2)[0].shape) == (40, 0)  # the empty group has none


def test_the_ones_check_of_a_live_run_holds_each_group_to_its_own_k():
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.live import ones_check
    from oracle.run.simulate import Injection, simulate

    spec = _spec(beta=1.0, c_dtype="bf16")
    ops = make_operands(spec, "ones")
    good = simulate(spec, ops, Provenance("ones"), tap_tiles=())
    said = ones_check(good)
    assert "33 in group 0 (K = 32), 49 in group 1 (K = 48), 1 in group 2 (K = 0), 17 in group 3 (K = 16)" in said
    assert said.endswith("holds everywhere"), said
    bad = simulate(spec, ops, Provenance("ones"), injection=Injection("k_group_empty_skipped", group=2), tap_tiles=())
    assert "FAILS at 960 of 3840 elements" in ones_check(bad)


# -- judging: output only, through check() -------------------------------------------------------
def _k_grouped_gemm(a, b, c, k_groups, beta, read_from=None):
    """D of a K-grouped GEMM in plain torch: group g over A's columns (and B's rows) from
    read_from.get(g, its own first k)."""
    read_from = read_from or {}
    m, outs, k0 = a.shape[0], [], 0
    for g, kg in enumerate(k_groups):
        s = read_from.get(g, k0)
        acc = a[:, s:s + kg].double() @ b[s:s + kg].double()
        outs.append((acc + beta * c[g * m:(g + 1) * m].double()).to(torch.bfloat16))
        k0 += kg
    return torch.cat(outs)


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(40, 96, generator=g).bfloat16()
    b = torch.randn(96, 24, generator=g).bfloat16()
    c = torch.randn(160, 24, generator=g).bfloat16()
    return a, b, c


def test_a_correct_k_grouped_gemm_matches_through_check_with_its_empty_and_ragged_groups():
    import oracle

    a, b, c = _tensors()
    rep = oracle.check(a, b, _k_grouped_gemm(a, b, c, K_GROUPS, 0.5), c=c, beta=0.5, k_groups=list(K_GROUPS),
                       tile=(16, 16, 16))
    assert rep.verdict == "MATCH", rep
    assert [o.describe() for o in rep.analysis.groups] == [
        "group 0 (k 0..31; rows 0..39 of D): MATCH", "group 1 (k 32..79; rows 40..79 of D): MATCH",
        "group 2 (K = 0; rows 80..119 of D): MATCH", "group 3 (k 80..95; rows 120..159 of D): MATCH"]


@pytest.mark.parametrize("fill", ["zeros", "garbage"])
def test_an_empty_group_left_unwritten_diverges_with_the_sentence(fill):
    import oracle

    a, b, c = _tensors()
    d = _k_grouped_gemm(a, b, c, K_GROUPS, 0.5)
    d[80:120] = 0 if fill == "zeros" else torch.randn(40, 24).bfloat16() * 100
    rep = oracle.check(a, b, d, c=c, beta=0.5, k_groups=K_GROUPS, tile=(16, 16, 16))
    assert rep.verdict == "DIVERGED", rep
    f = rep.first_divergence
    assert f.stage == "epilogue_store" and f.group == 2, f
    r, col = f.element
    assert f"group 2 has K = 0: D must be beta * C (the epilogue of a zero accumulator), the kernel's D differs at " \
           f"({r}, {col}) (row {80 + r} of D)" in f.hint, f.hint
    assert "Hint: group 2 has K = 0" in str(rep)
    assert "a trace of tile" not in str(rep)  # the group runs no k-block: no trace could tell more


def test_an_empty_group_without_c_must_be_zero():
    import oracle

    a, b, _ = _tensors()
    zero_c = torch.zeros(160, 24, dtype=torch.bfloat16)
    d = _k_grouped_gemm(a, b, zero_c, K_GROUPS, 0.0)
    assert oracle.check(a, b, d, k_groups=K_GROUPS, tile=(16, 16, 16)).verdict == "MATCH"
    d[100, 3] = 1.0
    rep = oracle.check(a, b, d, k_groups=K_GROUPS, tile=(16, 16, 16))
    assert rep.verdict == "DIVERGED" and rep.first_divergence.group == 2
    assert "group 2 has K = 0: D must be 0 (the epilogue of a zero accumulator), the kernel's D differs at (20, 3) " \
           "(row 100 of D)" in rep.first_divergence.hint


def test_a_group_computed_over_another_groups_k_slice_diverges_naming_it():
    import oracle

    a, b, c = _tensors()
    d = _k_grouped_gemm(a, b, c, K_GROUPS, 0.5, read_from={1: 0})  # group 1 over group 0's first columns
    rep = oracle.check(a, b, d, c=c, beta=0.5, k_groups=K_GROUPS, tile=(16, 16, 16))
    assert rep.verdict == "DIVERGED" and rep.first_divergence.group == 1, rep
    assert [o.verdict.value for o in rep.analysis.groups] == ["MATCH", "DIVERGED", "MATCH", "MATCH"]
    assert "in group 1" in str(rep)


def test_check_names_a_d_that_is_not_one_output_per_group():
    import oracle

    a, b, c = _tensors()
    with pytest.raises(SpecError, match=r"d has shape \[40, 24\]: a K-grouped problem of 4 groups .* D \[160, 24\]"):
        oracle.check(a, b, torch.zeros(40, 24, dtype=torch.bfloat16), k_groups=K_GROUPS)


# -- judging: stage by stage, on a tapped model --------------------------------------------------
@pytest.mark.parametrize("ladder", ["ones", "index", "ktag", "random"])
def test_a_correct_tapped_model_matches_every_group(ladder):
    from oracle.judging.differential import analyze
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import simulate

    spec = _spec(beta=0.5, c_dtype="bf16")
    rec = simulate(spec, make_operands(spec, ladder, 1), Provenance(ladder, 1), tap_tiles=[(0, 0), (1, 1)])
    assert {t.group for t in rec.taps} == {0, 1, 3}
    an = analyze(rec)
    assert an.verdict.value == "MATCH", an.first
    assert [o.verdict.value for o in an.groups] == ["MATCH"] * 4


def test_a_group_reading_group_0s_k_slice_is_named_at_its_load_with_a_verdict():
    from oracle.judging.diagnose import Kind
    from oracle.judging.differential import analyze
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import Injection, simulate

    spec = _spec()
    rec = simulate(spec, make_operands(spec, "random", 1), Provenance("random", 1),
                   injection=Injection("k_group_offset", group=1), tap_tiles=[(0, 0)])
    an = analyze(rec)
    assert an.verdict.value == "DIVERGED" and an.kind is Kind.VERDICT, an.first
    assert an.first.group == 1 and an.first.stage == "descriptor_a" and an.first.k_block == 0, an.first
    assert "mma" in an.diagnosis.inherited and "epilogue_store" in an.diagnosis.inherited


def test_an_empty_group_skipped_by_a_tapped_model_is_diverged_with_the_sentence():
    from oracle.judging.differential import analyze
    from oracle.report.table import sentence
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import Injection, simulate

    spec = _spec(beta=0.5, c_dtype="bf16")
    rec = simulate(spec, make_operands(spec, "ones"), Provenance("ones"),
                   injection=Injection("k_group_empty_skipped", group=2), tap_tiles=[(0, 0)])
    an = analyze(rec)
    assert an.verdict.value == "DIVERGED" and an.first.group == 2 and an.first.stage == "epilogue_store"
    assert "group 2 has K = 0: D must be beta * C (the epilogue of a zero accumulator), the kernel's D differs at " \
           "(0, 0) (row 80 of D)" in sentence(an)


def _fp8(**kw) -> ProblemSpec:
    return _spec(**{"k_groups": (32, 64, 0, 32), "n": 48, "a_dtype": "e4m3", "b_dtype": "e4m3",
                    "tile": Tile(32, 32, 32), "scale_a": Scale("block", (1, 32)),
                    "scale_b": Scale("block", (32, 32)), **kw})


def test_a_block_scaled_model_matches_with_each_groups_scale_columns():
    from oracle.judging.differential import analyze
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.scale_model import simulate_scaled

    spec = _fp8()
    an = analyze(simulate_scaled(spec, make_operands(spec, "scales"), Provenance("scales")))
    assert an.verdict.value == "MATCH", an.first
    judged = {s.name: s.teacher_forced.status.name for s in an.stages}
    assert judged["scale_a"] == judged["scale_b"] == judged["mma"] == "MATCH", judged


def test_group_0s_first_scale_column_applied_to_a_later_group_is_named_at_scale_a():
    from oracle.judging.diagnose import Kind
    from oracle.judging.differential import analyze
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.scale_model import ScaleInjection, simulate_scaled

    spec = _fp8()
    rec = simulate_scaled(spec, make_operands(spec, "scales"), Provenance("scales"),
                          ScaleInjection("scale_k_group_not_advanced"))
    an = analyze(rec)
    assert an.verdict.value == "DIVERGED" and an.kind is Kind.VERDICT, an.first
    assert an.first.stage == "scale_a" and an.first.group == 1 and an.first.k_block == 0, an.first
    assert "the scale of group 0: A's scales of group 0 applied to group 1" in an.first.hint, an.first.hint


def test_the_expected_output_stacks_every_group_the_empty_one_included():
    from oracle.judging.differential.analysis import expected_output
    from oracle.run.inputs import make_operands

    spec = _spec(beta=0.5, c_dtype="bf16")
    ops = make_operands(spec, "random", 3)
    y, bound = expected_output(spec, ops, torch.device("cpu"))
    assert tuple(y.shape) == (160, 24)
    want = _k_grouped_gemm(ops.a, ops.b, ops.c, K_GROUPS, 0.5)
    assert bool(((y.double() - want.double()).abs() <= bound + 1e-2 * want.double().abs()).all())
    assert torch.equal(y[80:120].double(), (0.5 * ops.c[80:120].double()).to(torch.bfloat16).double())


# -- the command line, a live case's launch, the reproducer ---------------------------------------
CASE = '''[problem]
m = 40
n = 24
k = 96
k_groups = [32, 48, 0, 16]
tile = [16, 16, 16]
a_major = "col"
beta = 0.5
c_dtype = "bf16"

[kernel]
source = "k.cu"
entry = "kg_traced"

[launch]
grid = ["tiles_n", "tiles_m", "groups"]
block = [128, 1, 1]
args = ["a", "b", "c", "d", "group_offsets", "groups", "m", "n", "k", "lda", "ldb", "ldd"]
'''


def _case_dir(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void kg_traced() {}\n')
    (tmp_path / "case.toml").write_text(CASE)
    return tmp_path / "case.toml"


def test_a_live_case_passes_a_k_grouped_kernel_its_groups_offsets_along_k(tmp_path):
    from oracle.run.case import load_case
    from oracle.run.inputs import make_operands
    from oracle.run.launch import launch_names, launch_sequence
    from oracle.run.sink import check_case

    case = load_case(str(_case_dir(tmp_path)))
    check_case(case)  # every check of a live run that needs no GPU
    names = launch_names(case)
    assert (names["groups"], names["lda"], names["total_m"]) == (4, 40, 160)  # A [M, K] col-major: ld M
    _, used = launch_sequence(case, make_operands(case.spec, "ones"))
    assert used["group_offsets"].tolist() == [0, 32, 80, 80, 96]
    assert tuple(used["a"].shape) == (96, 40) and tuple(used["d"].shape) == (160, 24)


@pytest.mark.parametrize("defect, code", [(None, 0), ("k_group_empty_skipped", 1)])
def test_compare_judges_a_dump_of_a_k_grouped_run(tmp_path, capsys, defect, code):
    import json

    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import Injection, simulate
    from oracle.tools import cli

    spec = _spec(beta=0.5, c_dtype="bf16")
    inj = Injection(defect, group=2) if defect else None
    rec = simulate(spec, make_operands(spec, "random", 4), Provenance("random", 4), injection=inj, tap_tiles=[(0, 0)])
    dump, out = tmp_path / "kg.safetensors", tmp_path / "r.json"
    rec.save(str(dump))
    assert cli.main(["compare", "--dump", str(dump), "--json", str(out)]) == code
    said = capsys.readouterr().out
    assert "K groups [32, 48, 0, 16]" in said and "group 2 (K = 0; rows 80..119 of D)" in said
    report = json.loads(out.read_text())
    assert [g["verdict"] for g in report["groups"]] == ["MATCH", "MATCH", "DIVERGED" if defect else "MATCH", "MATCH"]
    assert [(g["k0"], g["k"], g["row0"]) for g in report["groups"]] == [(0, 32, 0), (32, 48, 40), (80, 0, 80),
                                                                         (80, 16, 120)]
    jsonschema = pytest.importorskip("jsonschema")
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "oracle/report/schema.json").read_text())
    jsonschema.validate(report, schema)
    if defect:
        assert "group 2 has K = 0: D must be beta * C" in report["first_divergence"]["hint"]


def test_the_reproducer_refuses_a_k_grouped_problem_by_name(tmp_path):
    from oracle.repro.errors import ReproError
    from oracle.repro.generate import write_repro
    from oracle.run.case import load_case
    from oracle.run.inputs import Provenance, make_operands

    case = load_case(str(_case_dir(tmp_path)))
    with pytest.raises(ReproError, match=r"K-grouped problem \(k_groups = \[32, 48, 0, 16\]\) has no standalone "
                                         r"reproducer"):
        write_repro(case, make_operands(case.spec, "ones"), Provenance("ones"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cutlass_adapter_names_k_groups_among_what_it_cannot_run():
    from oracle.run.adapters import CUTLASS_SM90

    why = CUTLASS_SM90.unsupported(_spec())
    assert any(w.startswith("k_groups = [32, 48, 0, 16]: the adapter traces no K-grouped GEMM") for w in why), why
    assert not any("k_groups" in w for w in CUTLASS_SM90.unsupported(ProblemSpec(m=40, n=24, k=96)))

"""Case files: `extends`, the tensormap argument's host-side options, and what the oracle makes of
the maps a case encodes (recorded as the run's descriptor fields)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.report import table as report
from oracle.judging.differential import analyze
from oracle.run.inputs import make_operands
from oracle.run.launch import launch_spec, stale_rows
from oracle.run.recording import Recording
from oracle.run.confounds import ConfoundKind

ROOT = Path(__file__).resolve().parents[2]
HOPPER = ROOT / "zoo" / "hopper_gemm"


def test_extends_merges_tables_and_keeps_the_bases_paths():
    case = load_case(str(HOPPER / "defects" / "narrow_box.toml"))
    base = load_case(str(HOPPER / "hopper_gemm.toml"))
    assert case.spec == base.spec and case.kernel == base.kernel  # inherited, the source resolved from the base
    assert Path(case.kernel.source) == HOPPER / "hopper_gemm.cu"
    assert dict(case.launch.args[0].options) == {"box_inner": 32}  # [launch] args replaced
    assert case.launch.grid == base.launch.grid  # the rest of [launch] kept
    n16 = load_case(str(HOPPER / "hopper_gemm_n16.toml"))
    assert (n16.spec.m, n16.spec.n, n16.spec.k, n16.spec.tile.bn) == (1024, 8, 6144, 16)
    assert n16.spec.alpha == base.spec.alpha  # problem keys merged one by one


def test_extends_cycles_and_bad_values_are_named(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n[problem]\nm = 1\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(CaseError, match="cycle"):
        load_case(str(tmp_path / "a.toml"))
    (tmp_path / "c.toml").write_text('extends = 3\n')
    with pytest.raises(CaseError, match="extends must be the path"):
        load_case(str(tmp_path / "c.toml"))
    (tmp_path / "d.toml").write_text('extends = "missing.toml"\n')
    with pytest.raises(CaseError, match="does not exist"):
        load_case(str(tmp_path / "d.toml"))


@pytest.mark.parametrize("arg, message", [
    ('{ tensormap = "c" }', 'tensormap must be "a" or "b"'),
    ('{ tensormap = "a", box = 3 }', "unknown tensormap option"),
    ('{ tensormap = "a", swizzle = 48 }', "swizzle must be 0, 32, 64 or 128"),
    ('{ tensormap = "a", oob_fill = "inf" }', 'oob_fill must be "zero" or "nan"'),
    ('{ tensormap = "a", rows = [1] }', "rows must be an integer or an expression"),
])
def test_bad_tensormap_options_are_named(tmp_path, arg, message):
    (tmp_path / "x.toml").write_text(f'extends = "{HOPPER / "hopper_gemm.toml"}"\n[launch]\nargs = [{arg}]\n')
    with pytest.raises(CaseError, match=message):
        load_case(str(tmp_path / "x.toml"), allow_outside_case_dir=True)


def _maps(path, **problem):
    case = load_case(str(path), problem)
    launch, tensors = launch_spec(case, make_operands(case.spec, "random", 1))
    return case, {a.tensor_name: a.spec for a in launch.args if hasattr(a, "spec")}, tensors


def test_the_options_change_the_encoded_maps():
    case, maps, _ = _maps(HOPPER / "hopper_gemm.toml", m=40, n=24, k=96)
    assert maps["a"].global_dims == (96, 40) and maps["a"].global_strides == (192,) and maps["a"].box_dims == (64, 128)
    assert maps["b"].swizzle == 128 and maps["a"].oob_fill == "zero"
    assert _maps(HOPPER / "defects" / "wrong_stride.toml", m=40, n=24, k=96)[1]["a"].global_strides == (64,)
    assert _maps(HOPPER / "defects" / "narrow_box.toml", m=40, n=24, k=96)[1]["a"].box_dims == (32, 128)
    assert _maps(HOPPER / "defects" / "no_swizzle.toml", m=40, n=24, k=96)[1]["b"].swizzle == 0
    assert _maps(HOPPER / "defects" / "nan_fill.toml", m=40, n=24, k=96)[1]["a"].oob_fill == "nan"


def test_padded_rows_extend_the_buffer_with_stale_data():
    case, maps, tensors = _maps(HOPPER / "hopper_gemm_n16.toml", m=128, n=8, k=256)
    assert maps["b"].global_dims == (256, 16)
    ops = make_operands(case.spec, "random", 1)
    b = tensors["b"]  # B stored [N, K]: the real 8 rows, then 8 rows of junk
    assert b.shape == (16, 256)
    assert torch.equal(b[:8], ops.b.t().contiguous())
    assert torch.equal(b[8:], stale_rows(8, 256, b.dtype, seed=16)) and b[8:].float().abs().max() > 8


def test_a_map_narrower_than_the_problem_is_refused(tmp_path):
    (tmp_path / "x.toml").write_text(f'extends = "{HOPPER / "hopper_gemm_n16.toml"}"\n[launch]\n'
                                     'args = [{ tensormap = "b", rows = 4 }]\n')
    case = load_case(str(tmp_path / "x.toml"), {"m": 128, "n": 8, "k": 256}, allow_outside_case_dir=True)
    with pytest.raises(CaseError, match="fewer than the operand's 8"):
        launch_spec(case, make_operands(case.spec, "random", 1))


# -- the recorded maps, judged ------------------------------------------------------------------
def _recorded(name):
    return analyze(Recording.load(str(ROOT / "tests" / "zoo" / "dumps" / f"{name}.safetensors.gz")))


def test_a_map_over_padding_rows_is_the_padding_confound_not_a_mismatch():
    an = _recorded("hopper_bf16_n16_padding_confound")
    desc_b = next(s for s in an.stages if s.name == "descriptor_b")
    assert desc_b.teacher_forced.status.value == "MATCH"
    assert any("covers 8 padding row(s) past N = 8" in n for n in desc_b.teacher_forced.notes)
    (padding,) = [c for c in an.handled_confounds if c.kind is ConfoundKind.PADDING]
    assert "descriptor_b map rows 8" in padding.field("by_stage")


def test_a_wrong_box_is_named_field_by_field():
    an = _recorded("hopper_bf16_narrow_box")
    desc_a = next(s for s in an.stages if s.name == "descriptor_a")
    (bad,) = desc_a.teacher_forced.field_mismatches
    assert (bad.field, bad.received, bad.expected) == ("box_dims", "(32, 128)", "(64, 128)")
    assert an.first.stage == "descriptor_a" and an.first.field == bad and an.first.tile is None
    assert "box_dims: (32, 128), expected (64, 128)" in report.sentence(an)


@pytest.mark.parametrize("table, message", [
    ('tiles = [[0, "1"]]', r"\[trace\] tiles must be a list of \[tile_m, tile_n\] pairs"),
    ('tiles = [[0, -1]]', r"\[trace\] tiles must be a list"),
    ('k_blocks = [true]', r"\[trace\] k_blocks must be"),
    ('capacity_mb = 0', r"\[trace\] capacity_mb must be an integer"),
])
def test_bad_trace_selections_are_named(tmp_path, table, message):
    (tmp_path / "x.toml").write_text(f'extends = "{HOPPER / "hopper_gemm.toml"}"\n[trace]\n{table}\n')
    with pytest.raises(CaseError, match=message):
        load_case(str(tmp_path / "x.toml"), allow_outside_case_dir=True)

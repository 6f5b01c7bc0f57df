"""Cases built through the CUTLASS adapter, without a GPU or nvcc (oracle/run/adapters.py):

- a launch library whose own source includes oracle_trace/cutlass.hpp is known as the cutlass_sm90
  adapter's, and a library that does not include it is not;
- what the adapter cannot run is refused when the case is loaded, every field named with what is
  supported (a bias, an activation, a split or scales with groups; a bias with batch > 1,
  scales other than per-tensor on both operands, fp8 without fp8_fast); a strided batched case (batch > 1)
  loads, and its build carries the batch as ORACLE_CASE_BATCH (a one-GEMM case's defines, hence its build,
  unchanged); a split of k (splits, stream_k_workers) loads, and its build carries ORACLE_CASE_SPLIT, so that a
  kernel without CUTLASS's stream-K scheduler stops its build (CaseSplitCheck) while an unsplit case's
  defines stay as they were; a bias, an activation and an epilogue order load (the kernel's tree says which it
  has: the build checks them), and a live build carries them as -DORACLE_CASE_* defines;
- the adapter's serialisation travels with a recording (saved and loaded), and the judgement of the
  committed CUTLASS dumps lists it under what was not seen, for a MATCH and for a finding alike,
  without opening a confound or changing the finding's kind; a reproducer's traced run carries it too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from oracle.report import table as report
from oracle.run.adapters import CUTLASS_SM90, adapter_of
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.run.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"
DUMPS = ROOT / "tests" / "zoo" / "dumps"


def test_the_adapter_is_known_from_the_library_s_own_include_line(tmp_path):
    case = load_case(str(ZOO / "cutlass_sm90.toml"), allow_library=True)
    assert case.kernel.adapter is CUTLASS_SM90
    assert load_case(str(ZOO / "e4m3.toml"), allow_library=True).kernel.adapter is CUTLASS_SM90
    plain = load_case(str(ROOT / "harness" / "examples" / "simple_gemm_lib.toml"), allow_library=True)
    assert plain.kernel.library is not None and plain.kernel.adapter is None
    src = tmp_path / "k.cu"
    src.write_text('// #include "oracle_trace/cutlass.hpp" in a comment is not an include\n')
    assert adapter_of(str(src)) is None
    src.write_text('  #  include <oracle_trace/cutlass.hpp>\n')
    assert adapter_of(str(src)) is CUTLASS_SM90
    assert adapter_of(str(tmp_path / "missing.cu")) is None


@pytest.mark.parametrize("case_file, over, words", [
    ("grouped.toml", {"bias": "col", "bias_dtype": "bf16"},
     "[problem] groups with bias = 'col', activation = 'none': the adapter traces a grouped kernel's LinearCombination "
     "epilogue only"),
    ("batched.toml", {"bias": "col", "bias_dtype": "bf16"},
     "[problem] bias = 'col' with batch = 3: the adapter passes one bias vector, not one per batch entry"),
    ("cutlass_sm90.toml", {"scale_a": {"kind": "row"}, "scale_b": {"kind": "tensor"}},
     "[problem] scale_a.kind = 'row': supported: none (LinearCombination) or tensor on both A and B"),
    ("cutlass_sm90.toml", {"scale_a": {"kind": "tensor"}},
     "[problem] scale_b.kind = 'none' beside a per-tensor scale of the other operand"),
    ("e4m3.toml", {"acc_model": None}, "[problem] acc_model = 'fp32': the adapter traces fp8 through CUTLASS's "
                                       "FP8FastAccum mainloop only"),
    ("e4m3.toml", {"acc_model": "fp8_promoted", "promotion_interval": 128}, "acc_model = 'fp8_promoted'"),
])
def test_what_the_adapter_cannot_run_is_refused_when_the_case_is_loaded(case_file, over, words):
    over = {k: v for k, v in over.items()}
    with pytest.raises(CaseError) as e:
        load_case(str(ZOO / case_file), over)
    msg = str(e.value)
    assert "is built through the cutlass_sm90 adapter (oracle_trace/cutlass.hpp)" in msg, msg
    assert words in msg, msg


def test_what_the_adapter_runs_loads_and_a_library_without_it_is_not_limited():
    for case_file in ("cutlass_sm90.toml", "pingpong.toml", "e4m3.toml", "pingpong_e4m3.toml"):
        load_case(str(ZOO / case_file), allow_library=True)
    load_case(str(ZOO / "cutlass_sm90.toml"), {"epilogue": ["alpha_beta", "cast"]}, allow_library=True)
    load_case(str(ZOO / "e4m3.toml"), {"epilogue": ["scale", "alpha_beta", "cast"]}, allow_library=True)
    # a bias, an activation and another order load: the kernel's tree says which it has (the build's
    # ORACLE_CASE_* checks, the order read from the built library: tests/cpu/test_cutlass_evt.py)
    load_case(str(ZOO / "bias_gelu.toml"), {"epilogue": ["alpha", "bias", "beta_c", "activation", "cast"]},
              allow_library=True)
    load_case(str(ZOO / "cutlass_sm90.toml"), {"bias": "row", "activation": "relu"}, allow_library=True)
    # the hand-written library example has a bias: no adapter, no limit
    lib = load_case(str(ROOT / "harness" / "examples" / "simple_gemm_lib.toml"), {"bias": "col"}, allow_library=True)
    assert lib.spec.bias == "col"


def test_a_batched_case_loads_and_its_build_carries_the_batch():
    one = load_case(str(ZOO / "cutlass_sm90.toml"), allow_library=True)
    assert "ORACLE_CASE_BATCH" not in one.kernel.adapter.expected_defines(one.spec)  # its build is shared as before
    for case_file in ("batched.toml", "batched_host.toml"):
        case = load_case(str(ZOO / case_file), allow_library=True)
        assert case.kernel.adapter is CUTLASS_SM90 and case.spec.batch == 3
        assert case.kernel.adapter.expected_defines(case.spec)["ORACLE_CASE_BATCH"] == "3"
    moved = load_case(str(ZOO / "cutlass_sm90.toml"), {"batch": 2}, allow_library=True)
    assert moved.spec.total_m == 2 * moved.spec.m


def test_a_grouped_case_loads_and_its_build_carries_the_group_count():
    one = load_case(str(ZOO / "cutlass_sm90.toml"), allow_library=True)
    assert "ORACLE_CASE_GROUPS" not in one.kernel.adapter.expected_defines(one.spec)  # its build is shared as before
    for case_file in ("grouped.toml", "grouped_host.toml"):
        case = load_case(str(ZOO / case_file), allow_library=True)
        assert case.kernel.adapter is CUTLASS_SM90 and case.spec.groups == (130, 72, 0, 200)
        assert case.kernel.adapter.expected_defines(case.spec)["ORACLE_CASE_GROUPS"] == "4"


def test_a_split_case_loads_and_its_build_says_it_splits():
    from oracle.run.adapters import library_defines

    plain = load_case(str(ZOO / "cutlass_sm90.toml"), allow_library=True)
    assert "ORACLE_CASE_SPLIT" not in library_defines(plain.kernel, plain.spec, traced=True)
    for case_file, over in (("splitk.toml", {}), ("streamk.toml", {}), ("cutlass_sm90.toml", {"splits": 2}),
                            ("cutlass_sm90.toml", {"stream_k_workers": 8})):
        case = load_case(str(ZOO / case_file), over, allow_library=True)
        assert case.spec.partitioned, (case_file, over)
        assert library_defines(case.kernel, case.spec, traced=True)["ORACLE_CASE_SPLIT"] == "1", (case_file, over)
    dp = load_case(str(ZOO / "streamk_dp.toml"), allow_library=True)
    assert dp.kernel.defines == {"ZOO_CUTLASS_STREAMK": "1"} and not dp.spec.partitioned


def test_the_serialisation_travels_with_the_recording(tmp_path):
    rec = Recording.load(str(DUMPS / "cutlass_sm90_coop_alpha_twice.safetensors.gz"))
    assert rec.serialised == ()  # recorded before recordings carried it
    marked = dataclasses.replace(rec, serialised=CUTLASS_SM90.serialised)
    marked.save(str(tmp_path / "marked.safetensors.gz"))
    assert Recording.load(str(tmp_path / "marked.safetensors.gz")).serialised == CUTLASS_SM90.serialised
    with pytest.raises(Exception, match="serialised must be a list of strings"):
        dataclasses.replace(rec, serialised=(3,)).validate()


@pytest.mark.slow
@pytest.mark.parametrize("name, stage", [("cutlass_sm90_coop_correct", None),
                                         ("cutlass_sm90_pingpong_kblock_twice", "mma")])
def test_a_cutlass_run_says_it_did_not_see_the_production_timing(name, stage):
    # the committed dumps, marked as a live run of their case now marks them (oracle.run.live)
    from oracle.judging.differential import analyze

    rec = Recording.load(str(DUMPS / f"{name}.safetensors.gz"))
    case = load_case(str(ZOO / ("cutlass_sm90.toml" if "coop" in name else "pingpong.toml")), allow_library=True)
    plain = analyze(rec)
    rec = dataclasses.replace(rec, serialised=case.kernel.adapter.serialised)
    an = analyze(rec)
    said = [u for u in an.unobserved if u.startswith("the production build's timing (traced build serialised: ")]
    assert len(said) == 1 and "a MATCH does not show the production kernel free of races" in said[0], an.unobserved
    assert an.open_confounds == plain.open_confounds, an.open_confounds  # the declaration opens no confound
    if stage is None:
        assert an.verdict.value == "MATCH"
        assert "Not seen: the production build's timing (traced build serialised" in report.sentence(an)
    else:  # a finding keeps its kind: the divergent value is what the traced build computed
        assert an.verdict.value == "DIVERGED" and an.first.stage == stage
        assert an.first.kind.value == "VERDICT", (an.first, an.open_confounds)
    assert report.to_json(an)["unobserved"] == list(an.unobserved)


def test_a_cutlass_reproducer_s_traced_run_carries_the_serialisation(tmp_path):
    import json

    from harness.trace_format import TraceWriter
    from oracle.repro.generate import sink_bytes, write_repro
    from oracle.repro.readback import load_repro_run
    from oracle.run.case_types import with_trace

    rec = Recording.load(str(DUMPS / "cutlass_sm90_coop_alpha_twice.safetensors.gz"))
    case = with_trace(load_case(str(ZOO / "defects" / "alpha_twice.toml"), {"m": 300, "n": 392, "k": 520},
                                allow_library=True), ((0, 0),), None)
    out = write_repro(case, rec.operands, rec.provenance, tmp_path / "r", reference=False).path
    assert json.loads((out / "repro.json").read_text())["library"]["serialised"] == list(CUTLASS_SM90.serialised)
    (out / "d.bin").write_bytes(rec.output.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    (out / "sink.bin").write_bytes(TraceWriter(sink_bytes(case), tiles=[(0, 0)]).to_bytes())
    (out / "result.txt").write_text("status ok\nentry oracle_launch\ntraced 1\n")
    assert load_repro_run(out).serialised == CUTLASS_SM90.serialised
    (out / "result.txt").write_text("status ok\nentry oracle_launch\ntraced 0\n")
    assert load_repro_run(out).serialised == ()  # the untraced build is CUTLASS's production kernel


def test_a_live_build_carries_what_the_case_expects_of_the_kernel():
    from oracle.run.adapters import library_defines

    case = load_case(str(ZOO / "pingpong.toml"), {"tile": [128, 64, 64], "b_major": "row", "a_dtype": "fp16",
                                                  "b_dtype": "fp16"}, allow_library=True)
    traced = library_defines(case.kernel, case.spec, traced=True)
    assert traced == {"ORACLE_TRACE": "1", "ZOO_CUTLASS_PINGPONG": "1",
                      "ORACLE_CASE_TILE_M": "128", "ORACLE_CASE_TILE_N": "64", "ORACLE_CASE_TILE_K": "64",
                      "ORACLE_CASE_A": "2", "ORACLE_CASE_B": "2", "ORACLE_CASE_D": "3", "ORACLE_CASE_C": "3",
                      "ORACLE_CASE_A_UNIT_MODE": "1", "ORACLE_CASE_B_UNIT_MODE": "0", "ORACLE_CASE_D_UNIT_MODE": "1",
                      "ORACLE_CASE_C_UNIT_MODE": "1", "ORACLE_CASE_BIAS": "0", "ORACLE_CASE_ACTIVATION": "0"}
    assert library_defines(case.kernel, case.spec, traced=False) == {k: v for k, v in traced.items()
                                                                      if k != "ORACLE_TRACE"}
    no_c = load_case(str(ZOO / "cutlass_sm90.toml"), {"beta": 0.0, "c_dtype": None}, allow_library=True)
    assert not any(k.startswith("ORACLE_CASE_C") for k in library_defines(no_c.kernel, no_c.spec, traced=True))
    biased = load_case(str(ZOO / "bias_gelu.toml"), {"bias": "row", "activation": "silu"}, allow_library=True)
    assert {k: v for k, v in library_defines(biased.kernel, biased.spec, traced=True).items()
            if k in ("ORACLE_CASE_BIAS", "ORACLE_CASE_ACTIVATION", "ORACLE_CASE_BIAS_DTYPE")} == \
        {"ORACLE_CASE_BIAS": "1", "ORACLE_CASE_ACTIVATION": "4", "ORACLE_CASE_BIAS_DTYPE": "3"}
    plain = load_case(str(ROOT / "harness" / "examples" / "simple_gemm_lib.toml"), allow_library=True)
    assert library_defines(plain.kernel, plain.spec, traced=True) == {"ORACLE_TRACE": "1", **plain.kernel.defines}


def test_a_trace_tile_outside_the_problem_is_refused_before_the_build():
    """A 2 x 1 cluster pads 3 M tiles to 4: the fourth CTA's tile exists on the device but not in the
    problem, so a selection naming it is refused with the grid, before anything is built; the
    problem's own tiles are traced."""
    from oracle.run.case_types import with_trace
    from oracle.run.sink import sink_budget

    case = load_case(str(ZOO / "cluster.toml"), {"m": 300, "n": 392, "k": 520}, allow_library=True)
    assert case.kernel.defines == {"ZOO_CUTLASS_CLUSTER_2X1": "1"} and case.spec.tiles_m == 3
    with pytest.raises(CaseError, match=r"tile \(3, 0\) is outside the problem's 3 x 4 tile grid"):
        sink_budget(with_trace(case, tiles=((0, 0), (3, 0))))
    assert sink_budget(with_trace(case, tiles=((2, 3),)))[0].tiles == 1

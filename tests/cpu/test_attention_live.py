"""A live attention case ([problem] kind = "attention"): the case file, its launch (arguments, roles,
sizes), the checks made before a build, and a run whose child is stood in for (no GPU): the
attention model plays the kernel, writing O, LSE and its taps into the sink the oracle sized, and
the request's judgement names what the model planted, as for a GEMM."""

import math

import pytest
import torch

from attention_cases import ENTRY, case_text, write_case  # tests/ is on sys.path
from harness.launch import ScalarArg, TensorArg
from harness.runner import KernelRun, RunStatus
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.judgement import judge
from oracle.problem.attention import AttentionSpec
from oracle.run import execute, live
from oracle.run.attention_model import INJECTION_STAGE, Injection, run_attention_model
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.run.launch import launch_sequence
from oracle.run.request import RunRequest
from oracle.run.sink import check_case, sink_budget, trace_selection

CASE = case_text("""
batch = 1
heads_q = 2
heads_kv = 1
seqlen_q = 40
seqlen_k = 72
head_dim = 32
causal = "bottom_right"
block_q = 32
block_kv = 32
""", ["q", "k", "v", "o", "lse", "seqlen_q", "seqlen_k", "group", "softmax_scale"])


def _case_file(tmp_path, text=CASE, extra=""):
    return write_case(tmp_path, text + extra, "fa.toml")


def test_an_attention_case_loads_and_launches_with_its_own_names(tmp_path):
    case = load_case(_case_file(tmp_path))
    assert isinstance(case.spec, AttentionSpec) and case.spec.group == 2
    check_case(case)
    ops = execute.operands_for(RunRequest(case=case, inputs="one_hot"))[0]
    ((entry, launch),), tensors = launch_sequence(case, ops)
    assert entry == ENTRY and launch.grid == (2, 2, 1)
    tensor_args = [a for a in launch.args if isinstance(a, TensorArg)]
    assert [(a.name, a.role) for a in tensor_args] == [("q", "in"), ("k", "in"), ("v", "in"), ("o", "out"),
                                                       ("lse", "out")]
    scalars = [a for a in launch.args if isinstance(a, ScalarArg)]
    assert [(a.value, a.ctype) for a in scalars[:3]] == [(40, "i32"), (72, "i32"), (2, "i32")]
    assert scalars[3].ctype == "f32" and scalars[3].value == pytest.approx(1 / math.sqrt(32))
    assert tuple(tensors["q"].shape) == (1, 40, 2, 32) and tuple(tensors["k"].shape) == (1, 72, 1, 32)
    assert tuple(tensors["o"].shape) == (1, 40, 2, 32) and tensors["lse"].dtype == torch.float32
    assert trace_selection(case).tiles == ((0, 0), (1, 1))  # first unit, middle and last coincide
    assert sink_budget(case)[0].tiles == 2


@pytest.mark.parametrize("args, match", [
    ('["a", "q"]', r"args\[0\] = 'a' is unknown; operands q, k, v, o, lse"),
    ('[{ tensormap = "a" }]', "no tensor map over an attention operand"),
    ('["q", "descale_q"]', r"the problem has no descale_q"),
])
def test_a_launch_names_what_an_attention_problem_has(tmp_path, args, match):
    text = CASE.replace('args = ["q", "k", "v", "o", "lse", "seqlen_q", "seqlen_k", "group", "softmax_scale"]',
                        f"args = {args}")
    with pytest.raises(CaseError, match=match):
        check_case(load_case(_case_file(tmp_path, text)))


def test_an_attention_selection_outside_the_problem_is_refused_before_the_build(tmp_path):
    with pytest.raises(CaseError, match=r"trace tile \(5, 0\) is outside the problem's 2 query block"):
        check_case(load_case(_case_file(tmp_path, extra="\n[trace]\ntiles = [[5, 0]]\n")))
    with pytest.raises(CaseError, match=r"trace stage 'mma' is not a stage of this attention problem"):
        check_case(load_case(_case_file(tmp_path, extra='\n[trace]\nstages = ["mma"]\n')))
    with pytest.raises(CaseError, match="attention field"):
        load_case(_case_file(tmp_path, CASE.replace("head_dim = 32", "head_dim = 32\nm = 3")))


def _stand_in_kernel(monkeypatch, injection=None, breaches=()):
    """The child stood in for by the attention model, run on the buffers the oracle laid out, with
    the selection the sink header asks for."""
    seen = {}

    def fake_run(cubin, entry, launch, tensors, *, sink, **_):
        from harness.trace_format import parse_header

        header = parse_header(sink.init_bytes)
        spec = seen["spec"]
        run = run_attention_model(tensors["q"], tensors["k"], tensors["v"],
                                  causal=spec.causal, block_q=spec.block_q, block_kv=spec.block_kv,
                                  sites=header.selection.tiles, stages=header.selection.stages, injection=injection,
                                  capacity=sink.capacity)
        seen["entry"] = entry
        return KernelRun(RunStatus.OK, outputs={"o": run.out.to(tensors["o"].dtype), "lse": run.lse},
                         sink=bytes(run.sink), sink_source="test", guard_breaches=tuple(breaches))

    monkeypatch.setattr(live, "build_cubin", lambda *a, **k: type("B", (), {"cached": True,
                                                                          "read": lambda self: b"cubin"})())
    monkeypatch.setattr(live, "run_kernel", fake_run)
    monkeypatch.setattr(live, "require_gpu", lambda: None)  # the stand-in needs none
    return seen


def test_a_correct_attention_kernel_matches_through_the_request_path(tmp_path, monkeypatch):
    case = load_case(_case_file(tmp_path))
    seen = _stand_in_kernel(monkeypatch)
    seen["spec"] = case.spec
    outcome = execute.run(RunRequest(case=case, inputs="random:3"))
    j = judge(outcome)
    assert seen["entry"] == ENTRY
    assert j.verdict is Verdict.MATCH and j.analysis.first is None, j
    assert outcome.recording.taps and {t.stage for t in outcome.recording.taps} >= {"s", "mask", "p", "o"}


@pytest.mark.parametrize("injection", [Injection.CAUSAL_OFF_BY_ONE, Injection.MAX_NOT_UPDATED])
def test_a_planted_defect_is_named_at_its_stage_through_the_request_path(tmp_path, monkeypatch, injection):
    case = load_case(_case_file(tmp_path))
    seen = _stand_in_kernel(monkeypatch, injection)
    seen["spec"] = case.spec
    j = judge(execute.run(RunRequest(case=case, inputs="random:3")))
    assert j.verdict is Verdict.DIVERGED, j
    assert j.analysis.first.stage == INJECTION_STAGE[injection] and j.kind is Kind.VERDICT, j


def test_the_command_line_compares_an_attention_case(tmp_path, monkeypatch, capsys):
    from oracle.tools import cli

    path = _case_file(tmp_path)
    seen = _stand_in_kernel(monkeypatch, Injection.CAUSAL_OFF_BY_ONE)
    seen["spec"] = load_case(path).spec
    code = cli.main(["compare", path, "--inputs", "random:3", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "First divergence: mask" in out and "VERDICT" in out
    import json

    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verdict"] == "DIVERGED" and doc["problem"]["kind"] == "attention"


def test_repeated_runs_of_an_attention_kernel_name_where_they_differ(tmp_path, monkeypatch):
    """--repeat on an attention case: the traced runs and the untraced build's runs compared bit for
    bit; a second untraced run that changes one O element is a difference named by its output tile."""
    from oracle.run import races

    case = load_case(_case_file(tmp_path))
    seen = _stand_in_kernel(monkeypatch)
    seen["spec"] = case.spec
    traced_run = live.run_kernel
    untraced = []

    def fake_kernel(cubin, entry, launch, tensors, *, sink=None, **kw):
        if sink is not None:
            return traced_run(cubin, entry, launch, tensors, sink=sink, **kw)
        run = traced_run(cubin, entry, launch, tensors, sink=races_sink(), **kw)
        o = run.outputs["o"].clone()
        if untraced:
            o[0, 33, 1, 5] += 1  # query 33 (query block 1), head 1
        untraced.append(o)
        return KernelRun(RunStatus.OK, outputs={"o": o, "lse": run.outputs["lse"]})

    def races_sink():
        from harness.runner import SinkRequest
        from harness.trace_format import sink_prefix

        return SinkRequest(sink_prefix(1 << 20), capacity=1 << 20)

    monkeypatch.setattr(races, "build_cubin", live.build_cubin)
    monkeypatch.setattr(races, "run_kernel", fake_kernel)
    j = judge(execute.run(RunRequest(case=case, inputs="random:3", repeat=2)))
    assert j.verdict is Verdict.NONDETERMINISTIC, j
    (change,) = j.races.changes
    assert change.between == ("untraced run 1", "untraced run 2") and change.tiles == ((1, 1),), change
    assert change.first == ((33, 1 * 32 + 5),)


def test_bench_runs_an_attention_case_and_tells_its_peer(tmp_path, monkeypatch):
    from oracle.tools import bench

    path = _case_file(tmp_path)
    seen = _stand_in_kernel(monkeypatch, Injection.MAX_NOT_UPDATED)
    seen["spec"] = load_case(path).spec
    (tmp_path / "cases.toml").write_text('[[case]]\nname = "fa"\ncase = "fa.toml"\ninputs = "random:3"\ntime = false\n'
                                         '[[case]]\nname = "fa1"\ncase = "fa.toml"\ninputs = "one_hot"\n')
    bc, one_hot = bench.load_cases(str(tmp_path / "cases.toml"))  # an attention ladder is a bench case's input
    assert one_hot.inputs == "one_hot"
    row = bench.run_case(bc)
    assert row["verdict"] == "DIVERGED" and row["first_divergence"]["stage"] == "softmax_state", row
    fake_timed = dict(row, performance={"paths": [{"name": "kernel", "median_ms": 2.0, "TFLOPs": 1.0},
                                                  {"name": "sdpa", "median_ms": 1.0, "TFLOPs": 2.0}],
                                        "kernel_speed_vs": {"sdpa": 0.5}})
    text = bench.table([fake_timed])
    assert "0.5 (SDPA)" in text and "sdpa ms" in text


def test_a_write_past_the_end_of_o_is_named_at_store(tmp_path, monkeypatch):
    """A correct computation whose kernel also wrote 2 bytes past the end of O (seen in the guard band
    the harness put after it): the run diverges at store, and the report names the offset."""
    from harness.guard_bands import GuardBreach

    case = load_case(_case_file(tmp_path))
    o_bytes = 1 * 40 * 2 * 32 * 2
    seen = _stand_in_kernel(monkeypatch, breaches=(GuardBreach("o", "after", o_bytes, o_bytes + 1, 2, o_bytes),))
    seen["spec"] = case.spec
    j = judge(execute.run(RunRequest(case=case, inputs="random:3")))
    assert j.verdict is Verdict.DIVERGED and j.analysis.first.stage == "store", j
    assert str(o_bytes) in j.analysis.first.hint and j.analysis.out_of_bounds

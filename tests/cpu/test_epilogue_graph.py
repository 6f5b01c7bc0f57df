"""A declared epilogue graph (`[problem] epilogue`): its grammar and the problem's checks, the
references and their host specs computing the declared order, and the differential judging each
node as its stage, on recordings of kernels whose epilogue is not the default one."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import oracle
from harness.taps import STAGES, TAP_STAGES, Tap, pipeline
from harness.trace_format import STAGE_CODES, parse_trace
from harness.trace_format.writer import TraceWriter
from kernels_ref import epilogue as E
from kernels_ref import epilogue_graph as G
from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec, Scale, SpecError, Tile
from oracle.report import table as report
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import Injection, simulate
from oracle.tools.api import Report
from oracle.run.confounds import ConfoundKind

BASE = ProblemSpec(m=128, n=128, k=128, tile=Tile(64, 64, 64))
# CUTLASS LinCombPerColBias: alpha * acc + bias, then + beta * C
LINCOMB = dataclasses.replace(BASE, alpha=1.5, beta=0.75, c_dtype="bf16", bias="col", activation="relu")
G_LINCOMB = ("alpha", "bias", "beta_c", "activation", "cast")
# the bias on the raw accumulator, the dequant scale, alpha (a second scale), then the activation
SECOND = dataclasses.replace(BASE, alpha=2.0, scale_b=Scale("col"), bias="col", activation="gelu_erf")
G_SECOND = ("bias", "scale", "alpha", "activation", "cast")
# the default order, rounded to bf16 after alpha/beta and after the bias
ROUNDED = dataclasses.replace(BASE, alpha=1.25, beta=0.5, c_dtype="bf16", bias="col", activation="silu",
                              out_dtype="fp16")
G_ROUNDED = ("alpha_beta:bf16", "bias:bf16", "activation", "cast")
SHAPES = [(LINCOMB, G_LINCOMB, "epilogue_bias"), (SECOND, G_SECOND, "epilogue_scale"),
          (ROUNDED, G_ROUNDED, "epilogue_alpha_beta")]
IDS = ["lincomb_per_col_bias", "activation_after_second_scale", "rounded_between_steps"]


def _run(spec, kernel_epilogue=None, defect=None, tile=(1, 0), tap_tiles=None):
    ops = make_operands(spec, "random", seed=3)
    inj = Injection(defect, tile, 1) if defect else None
    rec = simulate(spec, ops, Provenance("random", 3), injection=inj, tap_tiles=tap_tiles or [tile],
                   kernel_epilogue=kernel_epilogue)
    return analyze(rec)


def _statuses(an):
    return [(s.name, s.teacher_forced.status.value, s.chained.status.value) for s in an.stages]


# -- the field: grammar and the problem's checks ------------------------------------------------


def test_absent_field_is_the_default_order():
    assert BASE.epilogue is None and BASE.epilogue_nodes == G.DEFAULT_NODES
    assert [n.step for n in BASE.epilogue_nodes] == ["scale", "alpha_beta", "bias", "activation", "cast"]
    assert pipeline() == STAGES and pipeline([n.step for n in BASE.epilogue_nodes]) == STAGES
    assert "epilogue" not in BASE.to_json()  # a recording of a default problem reads as before


def test_declared_graph_round_trips_and_names_its_stages():
    spec = dataclasses.replace(LINCOMB, epilogue=list(G_LINCOMB))
    assert spec.epilogue == G_LINCOMB  # a list is held as a tuple
    assert ProblemSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert [n.stage for n in spec.epilogue_nodes] == ["epilogue_alpha", "epilogue_bias", "epilogue_beta_c",
                                                      "epilogue_activation", "epilogue_cast"]
    assert all(n.stage in TAP_STAGES for n in spec.epilogue_nodes)
    r = dataclasses.replace(ROUNDED, epilogue=G_ROUNDED).epilogue_nodes
    assert [(n.step, n.round, n.rounds) for n in r[:2]] == [("alpha_beta", "bf16", True), ("bias", "bf16", True)]
    assert "epilogue alpha > bias > beta_c" in spec.describe()


@pytest.mark.parametrize("spec, graph, match", [
    (LINCOMB, ["alpha", "bias", "beta_c", "activation", "store"], r"epilogue\[4\]='store': step 'store' is unknown; "
                                                                   r"allowed: scale, alpha_beta"),
    (LINCOMB, ["alpha", "bias", "bias", "beta_c", "activation", "cast"], r"epilogue\[2\]='bias'.*given twice"),
    (LINCOMB, ["alpha", "bias", "beta_c", "cast", "activation"], r"epilogue\[3\]='cast': cast must be the last"),
    (LINCOMB, ["alpha", "bias", "beta_c", "activation"], r"has no 'cast'"),
    (LINCOMB, ["alpha_beta", "beta_c", "bias", "activation", "cast"], r"epilogue\[1\]='beta_c'.*either alpha_beta"),
    (LINCOMB, ["alpha", "bias:tf32", "beta_c", "activation", "cast"], r"epilogue\[1\]='bias:tf32'.*rounding to "
                                                                      r"'tf32' is not allowed; allowed: fp32, fp16, bf16"),
    (LINCOMB, ["alpha", "bias", "beta_c", "activation", "cast:fp16"], r"cast rounds to out_dtype; it takes no suffix"),
    (LINCOMB, "alpha bias cast", r"epilogue='alpha bias cast' is not allowed: give a non-empty list"),
    (LINCOMB, [], r"non-empty list"),
    (LINCOMB, ["alpha", "bias", 3, "cast"], r"epilogue\[2\]=3 is not allowed: a step name"),
    (BASE, ["bias", "cast"], r"epilogue\[0\]='bias' is not allowed: the problem has bias = 'none'"),
    (BASE, ["beta_c", "cast"], r"epilogue\[0\]='beta_c' is not allowed: the problem has beta = 0"),
    (BASE, ["scale", "cast"], r"epilogue\[0\]='scale' is not allowed: the problem has no epilogue scale"),
    (BASE, ["activation", "cast"], r"epilogue\[0\]='activation'.*activation = 'none'"),
    (LINCOMB, ["alpha", "beta_c", "activation", "cast"], r"applies bias \(bias = 'col'\) but the graph has no bias"),
    (LINCOMB, ["bias", "beta_c", "activation", "cast"], r"applies alpha \(alpha = 1.5\).*no alpha or alpha_beta"),
    (LINCOMB, ["alpha", "bias", "activation", "cast"], r"applies beta_c \(beta = 0.75\).*no beta_c or alpha_beta"),
    (SECOND, ["bias", "alpha", "activation", "cast"], r"applies scale .*no scale step"),
])
def test_bad_declarations_name_the_field_value_and_what_is_allowed(spec, graph, match):
    with pytest.raises(SpecError, match=match):
        dataclasses.replace(spec, epilogue=graph)


def test_case_file_declares_the_graph(tmp_path):
    p = tmp_path / "case.toml"
    p.write_text('[problem]\nm = 128\nn = 128\nk = 128\ntile = [64, 64, 64]\nalpha = 1.5\nbeta = 0.75\n'
                 'c_dtype = "bf16"\nbias = "col"\nactivation = "relu"\n'
                 'epilogue = ["alpha", "bias", "beta_c:bf16", "activation", "cast"]\n')
    case = load_case(str(p))
    assert case.spec.epilogue == ("alpha", "bias", "beta_c:bf16", "activation", "cast")
    p.write_text(p.read_text().replace('"beta_c:bf16"', '"beta_c", "beta_c"'))
    with pytest.raises(CaseError, match=r"problem: epilogue\[3\]='beta_c'.*given twice"):
        load_case(str(p))


def test_in_default_order():
    assert G.in_default_order(G.parse(["alpha_beta", "bias", "cast"]))
    assert G.in_default_order(G.parse(["scale", "alpha", "beta_c", "bias", "cast"]))
    assert not G.in_default_order(G.parse(G_LINCOMB))
    assert not G.in_default_order(G.parse(G_SECOND))
    assert not G.in_default_order(G.parse(G_ROUNDED))


# -- the references: Triton against the float64 host spec, per graph shape -----------------------


def _operands(seed=0, r=40, c=24):
    g = torch.Generator().manual_seed(seed)
    return dict(acc=torch.randn(r, c, generator=g) * 50, c=torch.randn(r, c, generator=g).bfloat16(),
                bias=torch.randn(c, generator=g), col_scale=torch.rand(c, generator=g) + 0.5)


@pytest.mark.parametrize("graph", [G_LINCOMB, G_SECOND, G_ROUNDED, ("scale", "alpha", "beta_c", "bias", "activation",
                                                                    "cast")],
                         ids=IDS + ["split_default"])
def test_triton_reference_matches_its_host_spec(graph):
    o = _operands()
    acts = "gelu_erf"
    ep = E.Epilogue(alpha=1.5, beta=0.75 if "beta_c" in graph or "alpha_beta" in graph[:2] else 0.0,
                    bias_axis="col", activation=acts, out_dtype="bf16", graph=graph)
    kw = dict(c=o["c"] if ep.beta else None, bias=o["bias"], col_scale=o["col_scale"] if "scale" in graph else None)
    got = E.epilogue(o["acc"], ep, return_steps=True, **kw)
    want = E.epilogue_host(o["acc"], ep, return_steps=True, **kw)
    assert got.steps == want.steps == tuple(n.step for n in ep.nodes)
    after_act = False
    for step in got.steps:
        g, w = got[step].double(), want[step].double()
        after_act |= step == "activation"
        if after_act:  # erf: a few fp32 ulps between the GPU/interpreter and the host
            rtol = 2**-7 if step == "cast" else 2**-18  # the bf16 cast of values a few ulps apart: one bf16 ulp
            assert torch.allclose(g, w, rtol=rtol, atol=2**-20), step
        else:
            assert torch.equal(g, w), step
    assert torch.equal(E.epilogue(o["acc"], ep, **kw).float(), got["cast"].float())


def test_rounding_between_steps_holds_the_rounded_value():
    o = _operands()
    ep = E.Epilogue(alpha=1.5, beta=0.75, bias_axis="col", out_dtype="fp32", graph=["alpha_beta:bf16", "bias",
                                                                                       "cast"])
    s = E.epilogue(o["acc"], ep, c=o["c"], bias=o["bias"], return_steps=True)
    ab = s["alpha_beta"]
    assert torch.equal(ab, ab.bfloat16().float())
    fused = E.apply_alpha_beta(o["acc"], 1.5, 0.75, o["c"])
    assert not torch.equal(ab, fused) and torch.equal(ab, fused.bfloat16().float())


def test_split_alpha_beta_is_the_fused_default_bit_for_bit():
    o = _operands()
    kw = dict(alpha=1.5, beta=0.75, bias_axis="col", activation="relu", out_dtype="bf16")
    fused = E.epilogue(o["acc"], E.Epilogue(**kw), c=o["c"], bias=o["bias"])
    split = E.epilogue(o["acc"], E.Epilogue(**kw, graph=["alpha", "beta_c", "bias", "activation", "cast"]),
                       c=o["c"], bias=o["bias"])
    assert torch.equal(fused.view(torch.int16), split.view(torch.int16))
    kw["out_dtype"] = "fp32"
    fused = E.epilogue(o["acc"], E.Epilogue(**kw), c=o["c"], bias=o["bias"])
    other = E.epilogue(o["acc"], E.Epilogue(**kw, graph=G_LINCOMB), c=o["c"], bias=o["bias"])
    assert not torch.equal(fused, other)  # the order changes the rounding


def test_epilogue_rejects_a_bad_graph():
    with pytest.raises(ValueError, match=r"Epilogue.graph\[1\]='alpha'.*given twice"):
        E.Epilogue(graph=["alpha", "alpha", "cast"])


# -- the differential on recordings made to order --------------------------------------------------


@pytest.mark.parametrize("spec, graph, _", SHAPES, ids=IDS)
def test_right_declaration_matches(spec, graph, _):
    an = _run(dataclasses.replace(spec, epilogue=graph), tap_tiles=[(0, 0), (1, 1)])
    assert an.verdict is Verdict.MATCH, _statuses(an)
    assert not an.cross_check and not an.open_confounds
    names = [s.name for s in an.stages]
    assert names == list(pipeline([n.split(":")[0] for n in graph]))
    for s in an.stages:
        if s.name.startswith("epilogue_") and s.name != "epilogue_store":
            assert s.teacher_forced.status.value == "MATCH", s.name  # every node judged on the kernel's own tap


@pytest.mark.parametrize("spec, graph, stage", SHAPES, ids=IDS)
def test_default_declaration_names_the_epilogue(spec, graph, stage):
    an = _run(spec, kernel_epilogue=graph)
    assert an.verdict is Verdict.DIVERGED
    assert an.first.stage == stage, _statuses(an)
    for s in an.stages[:[x.name for x in an.stages].index("epilogue_scale")]:  # nothing upstream is blamed
        assert {s.teacher_forced.status.value, s.chained.status.value} <= {"MATCH", "NOT_RUN"}, s.name
    if spec is LINCOMB:  # its taps name stages the default lacks: said, and the finding stays a draft
        (undeclared,) = [c for c in an.open_confounds if c.kind is ConfoundKind.UNDECLARED_EPILOGUE]
        assert undeclared.field("tapped") == "epilogue_alpha, epilogue_beta_c"
        assert "[problem] epilogue" in undeclared.sentence
        assert an.kind is Kind.DRAFT


@pytest.mark.parametrize("spec, graph, defect, stage", [
    (LINCOMB, G_LINCOMB, "epilogue_beta_c_twice", "epilogue_beta_c"),
    (LINCOMB, G_LINCOMB, "epilogue_bias_axis", "epilogue_bias"),
    (SECOND, G_SECOND, "epilogue_scale_twice", "epilogue_scale"),
    (SECOND, G_SECOND, "epilogue_gelu_tanh", "epilogue_activation"),
    (ROUNDED, G_ROUNDED, "epilogue_bias_axis", "epilogue_bias"),
], ids=["lincomb-beta_c", "lincomb-bias", "second-scale", "second-activation", "rounded-bias"])
def test_planted_defect_in_one_node_is_named(spec, graph, defect, stage):
    an = _run(dataclasses.replace(spec, epilogue=graph), defect=defect)
    assert an.verdict is Verdict.DIVERGED
    assert an.first.stage == stage, _statuses(an)
    assert an.first.tile == (1, 0) and an.kind is Kind.VERDICT and an.diagnosis.root_cause
    assert not an.cross_check


def test_report_of_a_declared_graph_follows_the_schema():
    an = _run(dataclasses.replace(LINCOMB, epilogue=G_LINCOMB), defect="epilogue_beta_c_twice")
    doc = json.loads(json.dumps(Report(an).to_json(), default=str))
    report.validate(doc)
    assert doc["problem"]["epilogue"] == list(G_LINCOMB)
    assert [s["name"] for s in doc["stages"]][-6:] == ["epilogue_alpha", "epilogue_bias", "epilogue_beta_c",
                                                     "epilogue_activation", "epilogue_cast", "epilogue_store"]


def test_split_stages_travel_through_the_trace_format():
    assert STAGE_CODES["epilogue_alpha"] == 12 and STAGE_CODES["epilogue_beta_c"] == 13
    taps = [Tap("epilogue_beta_c", (0, 0), torch.arange(16.0).reshape(4, 4)),
            Tap("epilogue_alpha", (0, 0), torch.ones(4, 4))]
    w = TraceWriter(1 << 16)
    for t in taps:
        w.tap(t)
    parsed = parse_trace(w.to_bytes(), block_m=4, block_n=4, block_k=4)
    got = {t.stage: t.values for t in parsed.taps}
    assert torch.equal(got["epilogue_beta_c"], taps[0].values) and torch.equal(got["epilogue_alpha"], taps[1].values)


# -- output only ------------------------------------------------------------------------------------


def test_check_output_only_follows_the_declared_order():
    g = torch.Generator().manual_seed(5)
    m, n, k = 96, 80, 64
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    bias = torch.randn(n, generator=g) * 4
    sb = torch.rand(n, generator=g) + 0.5
    acc = a.float() @ b.float()
    ep = E.Epilogue(alpha=2.0, bias_axis="col", activation="relu", out_dtype="bf16", graph=G_SECOND)
    d = E.epilogue_host(acc, ep, bias=bias, col_scale=sb)  # relu(2 * sb * (acc + bias))
    kw = dict(bias=bias, scale_b=sb, alpha=2.0, activation="relu", tile=(32, 32, 32))
    rep = oracle.check(a, b, d, epilogue=list(G_SECOND), **kw)
    assert rep.ok, rep
    wrong = oracle.check(a, b, d, **kw)  # judged in the default order: relu(2 * sb * acc + bias)
    assert not wrong.ok and wrong.analysis.first.stage == "epilogue_store"

"""Attention recordings as dumps: save -> load gives back the same problem, tensors and taps (plain
and .gz), through oracle.load and oracle.run.dumps.load_recording as through
AttentionRecording.load; a dump whose document disagrees with its tensors (a changed problem kind,
a tap past the grid, a tensor of the wrong shape or dtype) is refused with a DumpError naming the
problem; and the command line: `simulate --attention` then `compare --dump` MATCHes the correct
model (exit 0), names each defect's stage (exit 1), and its --json validates against the schema;
--save-dump writes the judged attention recording again."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import oracle
from harness.dump import DumpError
from oracle.problem.attention import AttentionSpec
from oracle.report.table import validate
from oracle.run.attention_recording import AttentionRecording
from oracle.run.attention_simulate import simulate_attention
from oracle.run.dumps import load_recording
from oracle.run.recording import Recording
from oracle.tools import cli
from tests.cli_checks import one_error_line

SPEC = AttentionSpec(batch=1, heads_q=2, heads_kv=1, seqlen_q=40, seqlen_k=50, head_dim=16, causal="bottom_right",
                     block_q=16, block_kv=16, splits=2)


@pytest.fixture(scope="module")
def rec() -> AttentionRecording:
    return simulate_attention(SPEC, seed=5)


def _same(a: AttentionRecording, b: AttentionRecording) -> None:
    assert a.spec == b.spec and a.kernel == b.kernel and a.provenance.ladder == b.provenance.ladder
    assert a.provenance.seed == b.provenance.seed and a.synthetic == b.synthetic and a.notes == b.notes
    for name, t in a.tensors().items():
        u = b.tensors()[name]
        assert t.dtype == u.dtype and torch.equal(t, u), name
    assert set(a.tensors()) == set(b.tensors())
    assert len(a.taps) == len(b.taps) > 0
    for s, t in zip(a.taps, b.taps):
        assert (s.stage, s.tile, s.k_block, s.partial, s.group) == (t.stage, t.tile, t.k_block, t.partial, t.group)
        assert s.values.dtype == t.values.dtype and torch.equal(s.values.nan_to_num(), t.values.nan_to_num())
    assert a.trace == b.trace


@pytest.mark.parametrize("suffix", [".safetensors", ".safetensors.gz"])
def test_save_then_load_gives_the_same_recording(rec, tmp_path, suffix):
    path = str(tmp_path / f"a{suffix}")
    rec.save(path)
    for load in (AttentionRecording.load, load_recording, oracle.load):
        _same(rec, load(path))


def test_a_paged_recording_keeps_its_page_table(tmp_path):
    spec = AttentionSpec(batch=2, heads_q=2, heads_kv=2, seqlen_q=20, seqlen_k=45, head_dim=16, block_q=16,
                         block_kv=16)
    paged = simulate_attention(spec, seed=2, page_size=8)
    assert paged.page_table is not None
    paged.save(str(tmp_path / "p.safetensors"))
    _same(paged, load_recording(str(tmp_path / "p.safetensors")))


def _rewrite(src: str, dst: str, doc=None, tensors=None) -> None:
    """A copy of a dump with its document and tensors edited (doc(d), tensors(t) change them in place)."""
    with safe_open(src, framework="pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    d = json.loads(meta["oracle.dump"])
    if doc:
        doc(d)
    if tensors:
        tensors(t)
    save_file(t, dst, metadata={"oracle.dump": json.dumps(d)})


def _tap(d: dict, stage: str) -> dict:
    return next(tm for tm in d["taps"] if tm["stage"] == stage)


MUTATIONS = {
    "kind_changed": (dict(doc=lambda d: d["meta"]["problem"].update(kind="gemm")), "unknown problem field"),
    "kind_unknown": (dict(doc=lambda d: d["meta"]["problem"].update(kind="conv")), "problem.kind"),
    "problem_disagrees": (dict(doc=lambda d: d["meta"]["problem"].update(seqlen_q=48)), "q has shape"),
    "tap_past_the_grid": (dict(doc=lambda d: _tap(d, "s").update(tile=[3, 0])), "outside 3 query blocks"),
    "tap_past_the_kv_blocks": (dict(doc=lambda d: _tap(d, "s").update(k_block=4)), "KV block 4 is outside"),
    "tap_of_a_gemm_stage": (dict(doc=lambda d: _tap(d, "o").update(stage="mma")), "holds only taps of"),
    "k_wrong_shape": (dict(tensors=lambda t: t.update({"input.k": t["input.k"][:, :48].contiguous()})), "k has shape"),
    "o_wrong_dtype": (dict(tensors=lambda t: t.update({"output.o": t["output.o"].float()})), "o has dtype"),
    "unknown_tensor": (dict(tensors=lambda t: t.update({"input.d": t["input.q"].clone()})), "unknown input tensor"),
    "no_v": (dict(tensors=lambda t: t.pop("input.v")), "missing v"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_dump_that_disagrees_with_itself_is_refused(rec, tmp_path, name):
    changes, says = MUTATIONS[name]
    good, bad = str(tmp_path / "good.safetensors"), str(tmp_path / "bad.safetensors")
    rec.save(good)
    _rewrite(good, bad, **changes)
    with pytest.raises(DumpError, match=says):
        load_recording(bad)


def test_each_kind_reads_only_its_own_dumps(rec, tmp_path):
    path = str(tmp_path / "a.safetensors")
    rec.save(path)
    with pytest.raises(DumpError, match="holds an attention problem"):
        Recording.load(path)
    demo = oracle.load(cli.DEMO_DUMP)
    assert isinstance(demo, Recording)
    with pytest.raises(DumpError, match="kind is not 'attention'"):
        AttentionRecording.load(cli.DEMO_DUMP)


def _simulate_and_compare(tmp_path, capsys, *flags):
    dump, report = tmp_path / "a.safetensors", tmp_path / "a.json"
    assert cli.main(["simulate", "--attention", *flags, "--out", str(dump)]) == 0
    assert f"wrote {dump}" in capsys.readouterr().out
    code = cli.main(["compare", "--dump", str(dump), "--json", str(report)])
    out = capsys.readouterr().out
    doc = json.loads(report.read_text())
    validate(doc)
    return code, out.strip().splitlines()[-1], doc


def test_the_correct_model_matches_from_the_command_line(tmp_path, capsys):
    code, sentence, doc = _simulate_and_compare(tmp_path, capsys)
    assert code == 0 and sentence.startswith("MATCH"), sentence
    assert doc["verdict"] == "MATCH"


@pytest.mark.parametrize("defect, stage, flags", [
    ("max_not_updated_before_rescale", "softmax_state", ()),
    ("split_merge_without_max", "combine", ("--splits", "2")),
])
def test_a_defect_is_named_at_its_stage_from_the_command_line(tmp_path, capsys, defect, stage, flags):
    code, sentence, doc = _simulate_and_compare(tmp_path, capsys, "--defect", defect, *flags)
    assert code == 1 and sentence.startswith(f"First divergence: {stage} "), sentence
    assert doc["verdict"] == "DIVERGED"


def test_compare_saves_a_judged_attention_recording(tmp_path, capsys):
    dump, again = tmp_path / "a.safetensors", tmp_path / "b.safetensors.gz"
    assert cli.main(["simulate", "--attention", "--queries", "20", "--keys", "33", "--out", str(dump)]) == 0
    assert cli.main(["compare", "--dump", str(dump), "--save-dump", str(again), "--quiet"]) == 0
    _same(load_recording(str(dump)), load_recording(str(again)))


@pytest.mark.parametrize("argv, says", [
    (["--attention", "--defect", "no_such_defect"], "is unknown"),
    (["--attention", "--defect", "gqa_head_modulo"], "changes nothing"),
    (["--attention", "--shape", "64", "64", "64"], "are a GEMM's"),
    (["--keys", "40"], "go with --attention"),
])
def test_simulate_refuses_what_it_cannot_make(tmp_path, capsys, argv, says):
    assert says in one_error_line(capsys, ["simulate", *argv, "--out", tmp_path / "x.safetensors"])


def test_p_tapped_in_two_types_is_judged_not_a_crash(rec, tmp_path, capsys):
    """One KV block's P tapped in e4m3 beside the others' bf16 (a kernel that casts one block
    differently, or a hand-edited dump): the o stage stacks the sites' P in fp32 and computes with the
    float64 specification, and the p stage names the block whose P is not V's type."""
    import dataclasses

    taps = list(rec.taps)
    i = next(n for n, t in enumerate(taps) if t.stage == "p")
    taps[i] = dataclasses.replace(taps[i], values=taps[i].values.to(torch.float8_e4m3fn))
    path = tmp_path / "mixed_p.safetensors"
    dataclasses.replace(rec, taps=tuple(taps) if isinstance(rec.taps, tuple) else taps).save(str(path))
    code = cli.main(["compare", "--dump", str(path)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "torch.bfloat16, torch.float8_e4m3fn beside V in torch.bfloat16" in out, out
    assert out.strip().splitlines()[-1].startswith("First divergence: p "), out

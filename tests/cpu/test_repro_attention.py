"""Track B for attention without a GPU: `python -m oracle repro` writes an attention case's reproducer
(q, k, v, offsets and page table as the kernel reads them, every launch with a split-KV case's combine
and its workspaces, problem.txt's attention fields, the trace's attention stages, the expected O and
LSE with the oracle's per-element bounds), `compare --repro-dir` reads a run of it back as an
AttentionRecording and judges it stage by stage, and (marker nvcc) the host program packs the
launch and the sink header as the harness does and judges O and LSE the oracle's way.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.launch import TensorArg
from harness.trace_format import HEADER_BYTES, STAGE_CODES, sink_init_bytes
from oracle.judging.attention_analysis import analyze_attention
from oracle.judging.attention_expected import expected_attention
from oracle.repro.generate import ReproError, sink_bytes, write_repro
from oracle.repro.readback import load_repro_run
from oracle.run.attention_inputs import make_attention_operands
from oracle.run.attention_model import Injection, run_attention_model
from oracle.run.attention_recording import AttentionRecording
from oracle.run.case import load_case
from oracle.run.inputs import InputError, Provenance
from oracle.run.launch import launch_sequence
from oracle.run.sink import trace_selection
from oracle.tools import cli
from host_programs import host_from, shared_host_programs  # tests/ is on sys.path
from repro_files import input_manifest

ROOT = Path(__file__).resolve().parents[2]
FA2 = ROOT / "zoo" / "fa2_sm80"
SMALL = {"batch": 2, "seqlen_q": 70, "seqlen_k": 90}  # two query blocks, a K tail of 26 keys


def _case(name="fa2_sm80.toml", problem=None):
    return load_case(str(FA2 / name), SMALL if problem is None else problem)


def _write(case, out, ladder="random", seed=1):
    ops = make_attention_operands(case.spec, ladder, seed)
    return write_repro(case, ops, Provenance(ladder, seed), out), ops


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _launch_lines(d: Path, key: str) -> list[list[str]]:
    return [line.split("#")[0].split()[1:] for line in (d / "launch.txt").read_text().splitlines()
            if line.split() and line.split()[0] == key]


def _problem(d: Path) -> dict[str, str]:
    out = {}
    for line in (d / "problem.txt").read_text().splitlines():
        toks = line.split("#")[0].split()
        if toks:
            out[toks[0]] = " ".join(toks[1:])
    return out


# -- what the files say ---------------------------------------------------------------------------
def test_an_attention_reproducer_holds_the_inputs_launch_problem_and_reference(tmp_path, capsys):
    out = tmp_path / "fa2"
    assert cli.main(["repro", "--problem", str(FA2 / "fa2_sm80.toml"), "--set", "batch=2", "--set", "seqlen_q=70",
                     "--set", "seqlen_k=90", "--inputs", "random:1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "expected_o.bin, bound_o.bin, expected_lse.bin, bound_lse.bin" in printed
    assert "k.bin, q.bin, v.bin" in printed  # the reference files are not listed among the inputs
    case = _case()
    ops = make_attention_operands(case.spec, "random", 1)
    (_, launch), = launch_sequence(case, ops)[0]
    man = input_manifest(out)
    assert set(man) == {"q", "k", "v", "o", "lse", "expected_o", "bound_o", "expected_lse", "bound_lse"}
    for name, t in (("q", ops.q), ("k", ops.k), ("v", ops.v)):
        assert man[name]["role"] == "in" and man[name]["shape"] == "x".join(map(str, t.shape))
        assert (out / f"{name}.bin").read_bytes() == _raw(t)
    assert man["o"]["role"] == "out" and man["o"]["shape"] == "2x70x4x64" and man["o"]["dtype"] == "bf16"
    assert man["lse"]["role"] == "out" and man["lse"]["shape"] == "2x4x70" and man["lse"]["dtype"] == "fp32"
    assert not (out / "o.bin").exists() and not (out / "lse.bin").exists()  # written by a run

    exp = expected_attention(case.spec, ops)
    assert np.array_equal(np.fromfile(out / "expected_o.bin", dtype=np.float32).reshape(2, 70, 4, 64),
                          exp.o.numpy())
    assert np.array_equal(np.fromfile(out / "bound_o.bin", dtype=np.float64).reshape(2, 70, 4, 64),
                          exp.o_bound.numpy())
    assert np.array_equal(np.fromfile(out / "expected_lse.bin", dtype=np.float32).reshape(2, 4, 70),
                          exp.lse.numpy())
    assert np.array_equal(np.fromfile(out / "bound_lse.bin", dtype=np.float64).reshape(2, 4, 70),
                          exp.lse_bound.numpy())
    assert bool((exp.o_bound > 0).all()) and bool((exp.lse_bound > 0).all())

    prob = _problem(out)
    assert prob["kind"] == "attention"
    for f in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v", "block_q", "block_kv",
              "splits"):
        assert prob[f] == str(getattr(case.spec, f)), f
    assert prob["causal"] == "bottom_right" and prob["o_dtype"] == "bf16" and prob["empty_lse"] == "-inf"
    assert float.fromhex(prob["softmax_scale"]) == case.spec.softmax_scale

    args = _launch_lines(out, "arg")
    assert len(args) == len(launch.args) == 12
    for (kind, value, *_), a in zip(args, launch.args):
        if isinstance(a, TensorArg):
            assert (kind, value) == ("ptr", a.name)
        elif kind == "f32":
            assert int(value, 16).to_bytes(4, "little") == a.to_bytes()
        else:
            assert (kind, int(value)) == (a.ctype, a.value)
    assert _launch_lines(out, "grid") == [[str(g) for g in launch.grid]] == [["2", "4", "2"]]
    sel = trace_selection(case)
    assert _launch_lines(out, "trace_tiles") == [["1,1"]]
    assert _launch_lines(out, "trace_stages") == [[str(STAGE_CODES[s]) for s in sel.stages]]
    assert "combine" not in sel.stages and "load_q" in sel.stages
    doc = json.loads((out / "repro.json").read_text())
    assert doc["version"] == 4 and doc["problem"]["kind"] == "attention"
    assert "o.bin lse.bin" in (out / "Makefile").read_text()  # make clean removes a run's outputs
    readme = " ".join((out / "README.txt").read_text().split())
    assert "expected_lse.bin" in readme and "column head_dim_v = 64 is the LSE" in readme


def test_a_split_kv_reproducer_carries_the_combine_launch_and_its_workspaces(tmp_path):
    case = _case("split.toml", {"batch": 2, "heads_q": 4, "seqlen_k": 300})
    out, ops = _write(case, tmp_path / "split")
    sequence, tensors = launch_sequence(case, ops)
    assert [e for e, _ in sequence] == ["zoo_fa2_split_bf16_d64_traced", "zoo_fa2_combine_bf16_d64_traced"]
    assert _launch_lines(out.path, "launches") == [["2"]]
    assert [v[0] for v in _launch_lines(out.path, "entry_traced")] == [e for e, _ in sequence]
    assert _launch_lines(out.path, "grid") == [["1", "4", "8"], ["1", "4", "2"]]  # batch * splits, then batch
    man = input_manifest(out.path)
    for ws in ("ws_o_partial", "ws_lse_partial"):
        assert man[ws]["role"] == "inout" and man[ws]["init"] == "poison"
        assert (out.path / f"{ws}.bin").read_bytes() == _raw(tensors[ws])  # the bytes the harness fills it with
    assert int(man["ws_o_partial"]["bytes"]) == 4 * 2 * 4 * 1 * 64 * 4
    assert _problem(out.path)["splits"] == "4"
    assert "combine" in trace_selection(case).stages
    assert str(STAGE_CODES["combine"]) in _launch_lines(out.path, "trace_stages")[0]


def test_a_paged_reproducer_carries_its_page_table(tmp_path):
    case = _case("paged.toml", {"batch": 2, "seqlen_q": 70, "seqlen_k": 100, "max_pages": 7, "num_pages": 16})
    out, ops = _write(case, tmp_path / "paged")
    man = input_manifest(out.path)
    assert man["page_table"]["dtype"] == "int32" and man["page_table"]["shape"] == "2x7"
    assert (out.path / "page_table.bin").read_bytes() == _raw(ops.page_table.to(torch.int32))
    assert man["k"]["shape"] == "16x16x2x64"
    assert _problem(out.path)["page_size"] == "16"


def test_bad_input_is_refused_naming_the_field(tmp_path, capsys):
    case = _case()
    ops = make_attention_operands(case.spec, "random", 1)
    with pytest.raises(ReproError, match="no attention reference of its own.*--no-reference"):
        write_repro(case, ops, Provenance("random", 1), tmp_path / "a", reference=False)
    bad = type(ops)(ops.q[:, :60], ops.k, ops.v, ops.provenance)
    with pytest.raises(InputError, match=r"\bq has shape \[2, 60, 4, 64\]"):
        write_repro(case, bad, Provenance("random", 1), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # refused before a file is written
    assert cli.main(["repro", "--problem", str(FA2 / "fa2_sm80.toml"), "--set", "heads_kv=3", "--out",
                     str(tmp_path / "c")]) != 0
    assert "heads_kv" in capsys.readouterr().err


# -- a run read back -----------------------------------------------------------------------------
def _fake_run(out: Path, case, ops, injection=None, *, ok=True) -> None:
    """What repro_traced leaves in the folder, made by oracle.run.attention_model: o.bin, lse.bin,
    sink.bin (the case's trace selection) and result.txt."""
    s, sel = case.spec, trace_selection(case)
    run = run_attention_model(ops.q, ops.k, ops.v, causal=s.causal, softmax_scale=s.softmax_scale,
                              block_q=s.block_q, block_kv=s.block_kv, splits=s.splits, sites=sel.tiles,
                              kv_blocks=sel.k_blocks, stages=sel.stages, injection=injection)
    (out / "sink.bin").write_bytes(run.sink)
    if ok:
        (out / "o.bin").write_bytes(_raw(run.out.to(torch.bfloat16)))
        (out / "lse.bin").write_bytes(_raw(run.lse.float()))
        (out / "result.txt").write_text(f"status ok\nentry {case.kernel.entry}\nlaunches 1\ntraced 1\n")
    else:
        for f in ("o.bin", "lse.bin"):
            (out / f).unlink(missing_ok=True)
        (out / "result.txt").write_text(f"status kernel_error\nerror cudaErrorIllegalAddress\nmessage launch 0 ("
                                        f"{case.kernel.entry}): an illegal memory access was encountered\n")


def test_compare_judges_an_attention_reproducer_run_stage_by_stage(tmp_path, capsys):
    case = _case()
    out, ops = _write(case, tmp_path / "r")
    _fake_run(out.path, case, ops)
    rec = load_repro_run(out.path)
    assert isinstance(rec, AttentionRecording) and rec.spec == case.spec
    assert torch.equal(rec.q, ops.q) and torch.equal(rec.k, ops.k) and torch.equal(rec.v, ops.v)
    assert rec.taps and {t.stage for t in rec.taps} == set(trace_selection(case).stages)
    assert {t.tile for t in rec.taps} == {(1, 1)} and {t.group for t in rec.taps} == {0, 1}
    report = tmp_path / "match.json"
    assert cli.main(["compare", "--repro-dir", str(out.path), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["verdict"] == "MATCH"
    capsys.readouterr()

    _fake_run(out.path, case, ops, Injection.MAX_NOT_UPDATED)  # the rescale reads the old max
    report = tmp_path / "bad.json"
    assert cli.main(["compare", "--repro-dir", str(out.path), "--json", str(report)]) == 1
    first = json.loads(report.read_text())["first_divergence"]
    assert first["stage"] == "softmax_state" == analyze_attention(load_repro_run(out.path)).first.stage
    assert first["tile"] == [1, 1]
    capsys.readouterr()

    _fake_run(out.path, case, ops, ok=False)  # a fault: the taps before it, no O
    assert cli.main(["compare", "--repro-dir", str(out.path)]) == 3
    assert "cudaErrorIllegalAddress" in capsys.readouterr().out


def test_a_split_kv_run_read_back_names_the_combine(tmp_path):
    case = _case("split.toml", {"batch": 2, "heads_q": 4, "seqlen_k": 300})
    out, ops = _write(case, tmp_path / "split")
    _fake_run(out.path, case, ops, Injection.MERGE_WITHOUT_MAX)
    a = analyze_attention(load_repro_run(out.path))
    assert a.first is not None and a.first.stage == "combine"


@pytest.mark.parametrize("edit, message", [
    (lambda d, doc: doc["tensors"]["q"].update(dtype="fp16"), r"tensors\.q: dtype 'fp16' is not the problem's 'bf16'"),
    (lambda d, doc: doc["tensors"]["k"].update(shape=[2, 90, 2, 32]), r"tensors\.k: shape \[2, 90, 2, 32\]"),
    (lambda d, doc: doc["problem"].update(heads_kv=3), r"problem: heads_kv"),
    (lambda d, doc: doc.update(version=3), r"version 3 holds no attention problem"),
    (lambda d, doc: (d / "o.bin").write_bytes(b"\0" * 10), r"o\.bin has 10 bytes"),
])
def test_a_malformed_attention_reproducer_is_a_repro_error_naming_the_field(tmp_path, edit, message):
    case = _case()
    out, ops = _write(case, tmp_path / "r")
    _fake_run(out.path, case, ops)
    doc = json.loads((out.path / "repro.json").read_text())
    edit(out.path, doc)
    (out.path / "repro.json").write_text(json.dumps(doc))
    with pytest.raises(ReproError, match=message):
        load_repro_run(out.path)


# -- the host program, built with nvcc once per session: no GPU needed -----------------------------
def _run(cmd) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)


@pytest.mark.nvcc
def test_the_host_program_packs_the_launch_and_judges_o_and_lse(tmp_path_factory, tmp_path):
    """The session's one build of repro / repro_traced (tests/host_programs.py) on an attention folder:
    the dry run packs the harness's argument bytes and the sink header of the attention selection;
    --check-only judges O and LSE as written by a run: MATCH, a wrong O element named by batch, query,
    head and column, a never-written LSE element, and problem.txt refused naming its field."""
    shared = shared_host_programs(tmp_path_factory)
    case = _case()
    out, ops = _write(case, tmp_path / "r")
    d = out.path
    host_from(shared, d, "repro", "repro_traced")

    proc = _run([d / "repro_traced", "--dry-run"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (_, launch), = launch_sequence(case, ops)[0]
    printed = dict(re.findall(r"^arg (\d+) (.+)$", proc.stdout, re.M))
    assert len(printed) == len(launch.args)
    for i, a in enumerate(launch.args):
        assert printed[str(i)] == (f"ptr {a.name}" if isinstance(a, TensorArg) else f"bytes {a.to_bytes().hex()}"), i
    sel = trace_selection(case)
    want = sink_init_bytes(sink_bytes(case), tiles=sel.tiles, k_blocks=sel.k_blocks, stages=sel.stages)
    assert (d / "sink_init.bin").read_bytes() == want[:HEADER_BYTES]

    _fake_run(d, case, ops)
    proc = _run([d / "repro", "--check-only"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: MATCH" in proc.stdout and "bad elements 0 (O 0, LSE 0) in 0 of 16 units" in proc.stdout

    o = torch.frombuffer(bytearray((d / "o.bin").read_bytes()), dtype=torch.bfloat16).reshape(2, 70, 4, 64).clone()
    o[1, 66, 3, 5] += 0.5  # batch 1, query 66 (query block 1, row 2), head 3, column 5
    (d / "o.bin").write_bytes(_raw(o))
    proc = _run([d / "repro", "--check-only"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first bad element: batch 1, query 66, head 3, column 5 (O) [unit (batch 1, head 3, query block 1), " \
           "row 2 of the unit]" in proc.stdout
    assert "verdict: DIVERGED" in proc.stdout

    _fake_run(d, case, ops)
    lse = bytearray((d / "lse.bin").read_bytes())
    lse[4 * 5:4 * 6] = b"\xff" * 4  # batch 0, head 0, query 5: still the poison
    (d / "lse.bin").write_bytes(bytes(lse))
    proc = _run([d / "repro", "--check-only"])
    assert proc.returncode == 1
    assert "first bad element: batch 0, query 5, head 0, column 64 (LSE)" in proc.stdout
    assert "(never written: still the 0xFF poison)" in proc.stdout and "never written (still the 0xFF poison) 1" \
        in proc.stdout

    assert _run([d / "repro", "--check-only", "--host-reference"]).returncode == 2
    text = (d / "problem.txt").read_text()
    (d / "problem.txt").write_text(text.replace("heads_kv 2", "heads_kv 3"))
    proc = _run([d / "repro", "--check-only"])
    assert proc.returncode == 2 and "heads_kv 3 must divide heads_q 4" in proc.stderr
    (d / "problem.txt").write_text(text.replace("seqlen_q 70", "seqlen_q 60").replace("total_q 140", "total_q 120"))
    proc = _run([d / "repro", "--check-only"])
    assert proc.returncode == 2 and re.search(r"inputs\.txt: \w+ is 2x(70x4x64|4x70) \(logical\) but problem\.txt's .* "
                                              r"needs 2x(60x4x64|4x60): the two files disagree", proc.stderr)

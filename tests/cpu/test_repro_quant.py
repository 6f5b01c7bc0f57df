"""Track B for a quantised B (W4A16-style) without a GPU: `python -m oracle repro` writes B's stored
codes, its scales and zero points as input files with their roles (the launch passes them as the
live run does), problem.txt carries the quant fields, README.txt names them, repro.json reads them
back so `compare --repro-dir` judges the dequant stage; and (marker nvcc) the host program (the
session's one build, tests/host_programs.py) dequantises B bit for bit as kernels_ref.dequant's
float64 host spec does, for every packing, zero-point form, stored dtype, scale dtype and dequant
precision here, and judges the oracle's D a MATCH with its own host reference (whose bound takes in
the dequant bound of an operand-dtype dequant run in another order). A build of it with the nibble
order swapped (both k_pairs and k8_interleaved) is held to fail on every packed case, and only on
those.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.build import build_slot
from harness.launch import TensorArg
from harness.trace_format import TraceWriter
from kernels_ref.dequant import dequant_host
from kernels_ref.dtypes import DTYPES
from oracle.judging.differential import expected_output
from oracle.repro.generate import ReproError, write_repro
from oracle.repro.readback import load_repro_run
from oracle.run.case import load_case
from oracle.run.inputs import Provenance, make_operands
from oracle.run.launch import launch_sequence
from oracle.tools import cli
from host_programs import host_from, shared_host_programs  # tests/ is on sys.path
from repro_files import input_manifest

ROOT = Path(__file__).resolve().parents[2]
W4A16 = ROOT / "zoo" / "w4a16_sm80" / "w4a16_gemm.toml"
BASE = {"m": 24, "n": 48, "k": 256, "b_group_size": 64}
SEED = 3
# id -> problem overrides of the zoo's W4A16 case (uint4, k_pairs_low_first, fp16 scales, int zeros,
# fp32 dequant, fp16 A, B column-major): every packing, zero-point form, quantised dtype, scale
# dtype and dequant precision, both A dtypes and both majors of B
CASES = {
    "uint4_low_int": {},
    "uint4_high_none_bf16_row": {"a_dtype": "bf16", "b_packing": "k_pairs_high_first", "b_zeros": "none",
                                 "b_scales": "bf16", "b_major": "row"},
    "int4_k8_int_operand": {"b_dtype": "int4", "b_packing": "k8_interleaved", "dequant_precision": "operand"},
    "int4_low_int_fp32_scales_operand": {"b_dtype": "int4", "b_scales": "fp32", "dequant_precision": "operand"},
    "uint4_k8_float_offset_fp32_scales": {"b_packing": "k8_interleaved", "b_zeros": "float_offset",
                                          "b_scales": "fp32", "b_major": "row"},
    "int4_low_float_operand_bf16": {"b_dtype": "int4", "a_dtype": "bf16", "b_zeros": "float", "b_scales": "bf16",
                                    "dequant_precision": "operand"},
    "uint4_high_float_offset_operand": {"b_packing": "k_pairs_high_first", "b_zeros": "float_offset",
                                        "dequant_precision": "operand"},
    "fp4_k8_e8m0": {"b_dtype": "fp4_e2m1", "b_packing": "k8_interleaved", "b_zeros": "none", "b_scales": "e8m0"},
    "fp4_low_e4m3_scales_row": {"b_dtype": "fp4_e2m1", "b_zeros": "none", "b_scales": "e4m3", "b_major": "row"},
    "int8_int": {"b_dtype": "int8", "b_packing": None},
    "e4m3_fp16_scales_row": {"b_dtype": "e4m3", "b_packing": None, "b_zeros": "none", "b_major": "row"},
    "e5m2_e8m0_operand_bf16": {"b_dtype": "e5m2", "b_packing": None, "b_zeros": "none", "b_scales": "e8m0",
                               "a_dtype": "bf16", "dequant_precision": "operand"},
}
# cases whose operand-dtype arithmetic gives another B than the fp32 one (so it is tested, not assumed)
OPERAND_DIFFERS = ("int4_low_int_fp32_scales_operand", "int4_low_float_operand_bf16",
                   "uint4_high_float_offset_operand")
# the nibble order swapped in the host program: k_pairs read the other nibble first, k8_interleaved
# words read in plain order (the defect the zoo plants in its kernel, here in the reference)
WRONG_NIBBLES = (
    ('high = int(k % 2) ^ int(p.b_packing == "k_pairs_high_first");',
     'high = int(k % 2) ^ int(p.b_packing != "k_pairs_high_first");'),
    ("const int kK8Order[8] = {0, 2, 4, 6, 1, 3, 5, 7};", "const int kK8Order[8] = {0, 1, 2, 3, 4, 5, 6, 7};"),
)


def _case(name: str):
    return load_case(str(W4A16), {**BASE, **CASES[name]})


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Each case's reproducer (random inputs), written once: {name: (path, case, operands)}."""
    root = tmp_path_factory.mktemp("quant")
    out = {}
    for name in CASES:
        case = _case(name)
        ops = make_operands(case.spec, "random", SEED)
        r = write_repro(case, ops, Provenance("random", SEED), root / name)
        out[name] = (r.path, case, ops)
    return out


def _u8(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _problem(d: Path) -> dict[str, str]:
    return {line.split()[0]: " ".join(line.split("#")[0].split()[1:])
            for line in (d / "problem.txt").read_text().splitlines() if line.split() and not line.startswith("#")}


# -- what the files say ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_a_quantised_b_travels_as_its_stored_codes_scales_and_zero_points(written, name):
    d, case, ops = written[name]
    s = case.spec
    man = input_manifest(d)
    packed = s.b_packing is not None
    want = {"b": (s.k // 2 if packed else s.k, s.n), "b_scales": (s.k // 64, s.n)}
    if s.b_zeros != "none":
        want["b_zeros"] = (s.k // 64, s.n)
    assert set(man) == {"a", "d", "expected", "bound", *want}
    for part, t in (("b", ops.b), ("b_scales", ops.b_scales), ("b_zeros", ops.b_zeros)):
        if part not in want:
            continue
        kv = man[part]
        assert kv["role"] == "in" and kv["logical"] == "x".join(map(str, want[part]))
        assert int(kv["bytes"]) == t.numel() * t.element_size() == (d / kv["file"]).stat().st_size
        major = s.b_major if part == "b" else "row"
        stored = t if major == "row" else t.t()
        assert kv["shape"] == "x".join(map(str, stored.shape)) and kv.get("major", "row") == major
        assert (d / kv["file"]).read_bytes() == _u8(stored)  # the bytes the kernel reads, in its order
    assert man["b"]["dtype"] == ("uint8" if packed else s.b_dtype)
    assert (man["b"]["quant"], man["b"]["values"], man["b"]["packing"]) == ("stored", s.b_dtype, s.b_packing or "none")
    assert (man["b_scales"]["quant"], man["b_scales"]["values"], man["b_scales"]["group_size"]) == \
        ("scales", s.b_scales, "64")
    assert man["b_scales"]["dtype"] == ("uint8" if s.b_scales == "e8m0" else s.b_scales)
    if s.b_zeros != "none":
        zdt = {"int4": "int8", "int8": "int8", "uint4": "uint8"}[s.b_dtype] if s.b_zeros == "int" else s.b_scales
        assert (man["b_zeros"]["quant"], man["b_zeros"]["form"], man["b_zeros"]["dtype"]) == ("zeros", s.b_zeros, zdt)
    p = _problem(d)
    assert (p["b_dtype"], p["b_packing"], p["b_group_size"], p["b_scales"], p["b_zeros"], p["dequant_precision"]) == \
        (s.b_dtype, s.b_packing or "none", "64", s.b_scales, s.b_zeros, s.resolved_dequant_precision)
    readme = " ".join((d / "README.txt").read_text().split())
    assert (f"Quantised B (problem.txt): b_dtype {s.b_dtype}, b_packing {s.b_packing or 'none'}, b_group_size 64, "
            f"b_scales {s.b_scales}, b_zeros {s.b_zeros}, dequant_precision {s.resolved_dequant_precision}. b.bin "
            f"holds B's stored codes") in readme
    assert "./repro --dequant-b FILE" in readme
    doc = json.loads((d / "repro.json").read_text())
    assert doc["tensors"]["b"]["quant"] == {"part": "stored", "values": s.b_dtype, "packing": s.b_packing or "none"}
    assert doc["problem"]["b_scales"] == s.b_scales
    y, b = expected_output(s, ops)  # the oracle's reference D, unchanged
    assert np.array_equal(np.fromfile(d / "expected.bin", dtype=np.float32).reshape(s.m, s.n), y.float().numpy())


def test_the_zoo_w4a16_case_s_launch_passes_the_quant_buffers_by_name(tmp_path, capsys):
    case = load_case(str(W4A16))
    ops = make_operands(case.spec, "random", 1)
    d = tmp_path / "zoo"
    assert cli.main(["repro", "--problem", str(W4A16), "--inputs", "random:1", "--out", str(d)]) == 0
    assert "b_scales.bin, b_zeros.bin" in capsys.readouterr().out
    ((_, launch),), _ = launch_sequence(case, ops)
    lines = [ln.split("#")[0].split()[1:] for ln in (d / "launch.txt").read_text().splitlines()
             if ln.startswith("arg ")]
    ptrs = [a.name for a in launch.args if isinstance(a, TensorArg)]
    assert ptrs == ["a", "b", "b_scales", "b_zeros", "d"]  # the case's args, as the live run passes them
    assert [v for k, v, *_ in lines if k == "ptr"] == ptrs
    man = input_manifest(d)
    assert (man["b"]["shape"], man["b"]["logical"], man["b"]["major"]) == ("256x256", "256x256", "col")
    assert (d / "b.bin").read_bytes() == _u8(ops.b.t())  # [N, K / 2]: k contiguous
    assert (d / "b_scales.bin").read_bytes() == _u8(ops.b_scales)
    assert man["b_zeros"]["dtype"] == "uint8" and man["b_scales"]["shape"] == "4x256"


def test_a_dense_b_says_so_in_problem_txt(tmp_path):
    case = load_case(str(ROOT / "harness" / "examples" / "simple_gemm.toml"), {"m": 8, "n": 8, "k": 16})
    out = write_repro(case, make_operands(case.spec, "ones"), Provenance("ones"), tmp_path / "dense")
    p = _problem(out.path)
    assert [p[k] for k in ("b_packing", "b_group_size", "b_scales", "b_zeros", "dequant_precision")] == ["none"] * 5
    assert "quant=" not in (out.path / "inputs.txt").read_text()
    assert "Quantised B" not in (out.path / "README.txt").read_text()


# -- read back ------------------------------------------------------------------------------------
def _fake_run(out: Path, rec) -> None:
    """What repro_traced leaves: sink.bin with the recording's taps, d.bin, result.txt."""
    launch = (out / "launch.txt").read_text()
    tiles = [tuple(map(int, t.split(","))) for t in re.search(r"^trace_tiles (.*)$", launch, re.M).group(1).split()]
    cap = int(re.search(r"^trace_capacity_bytes (\d+)", launch, re.M).group(1))
    w = TraceWriter(cap, tiles=tiles)
    for tap in rec.taps:
        w.tap(tap)
    (out / "sink.bin").write_bytes(w.to_bytes())
    (out / "d.bin").write_bytes(_u8(rec.output))
    (out / "result.txt").write_text("status ok\nentry zoo_w4a16_uint4_traced\ntraced 1\n")


@pytest.mark.parametrize("name, defect", [("uint4_low_int", "dequant_nibble_order"),
                                          ("int4_k8_int_operand", "dequant_plain_pairs"),
                                          ("uint4_high_float_offset_operand", "dequant_group_index")])
def test_compare_repro_dir_reads_the_quantised_b_back_and_names_the_dequant_stage(tmp_path, capsys, name, defect):
    from oracle.run.simulate import Injection, simulate

    case = load_case(str(W4A16), {**BASE, "m": 16, "n": 128, **CASES[name]})
    ops = make_operands(case.spec, "random", SEED)
    prov = Provenance("random", SEED)
    out = write_repro(case, ops, prov, tmp_path / "r")
    rec = simulate(case.spec, ops, prov, injection=Injection(defect, (0, 0), 1), tap_tiles=[(0, 0)])
    _fake_run(out.path, rec)
    got = load_repro_run(out.path)
    assert got.spec == case.spec
    for part in ("a", "b", "b_scales", "b_zeros"):
        mine, theirs = getattr(got.operands, part), getattr(ops, part)
        assert (mine is None) == (theirs is None) and (mine is None or torch.equal(mine, theirs)), part
    report = tmp_path / "report.json"
    assert cli.main(["compare", "--repro-dir", str(out.path), "--json", str(report)]) == 1
    first = json.loads(report.read_text())["first_divergence"]
    assert first["stage"] == "dequant_b" and first["k_block"] == 1
    capsys.readouterr()


def test_a_quant_tag_that_is_not_the_problem_s_is_a_repro_error(written, tmp_path):
    d, case, _ = written["uint4_low_int"]
    r = tmp_path / "r"
    shutil.copytree(d, r)
    (r / "result.txt").write_text("status kernel_error\nerror cudaErrorIllegalAddress\n")
    load_repro_run(r)  # as written: reads back
    doc = json.loads((r / "repro.json").read_text())
    doc["tensors"]["b"]["quant"]["packing"] = "k_pairs_high_first"
    (r / "repro.json").write_text(json.dumps(doc))
    with pytest.raises(ReproError, match=r"tensors.b: quant .*k_pairs_high_first.* is not the problem's"):
        load_repro_run(r)
    doc["tensors"]["b"]["quant"]["packing"] = "k_pairs_low_first"
    doc["tensors"]["b_zeros"]["dtype"] = "int8"  # a uint4 B's zero points are uint8
    (r / "repro.json").write_text(json.dumps(doc))
    with pytest.raises(ReproError, match="b_zeros"):
        load_repro_run(r)


# -- the host program, built with nvcc: its dequant against the oracle's ------------------------
def _run(cmd, timeout=600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def host_programs(written, tmp_path_factory) -> dict[str, Path]:
    """repro as the reproducer's own Makefile builds it (the session's shared build, tests/host_programs.py:
    the host program is the same for every case and takes --dir), copied into this case's folder, and a
    build with WRONG_NIBBLES by `make repro` (at -O0: it only has to run, not to be fast)."""
    shared = shared_host_programs(tmp_path_factory)
    base = tmp_path_factory.mktemp("repro_quant_host")
    good, bad = base / "good", base / "wrong_nibbles"
    for d in (good, bad):
        shutil.copytree(written["uint4_low_int"][0], d)
    host_from(shared, good, "repro")
    dq = bad / "host" / "dequant.cuh"
    text = dq.read_text()
    for old, new in WRONG_NIBBLES:
        assert text.count(old) == 1, f"host/dequant.cuh no longer holds {old!r}: update WRONG_NIBBLES"
        text = text.replace(old, new)
    dq.write_text(text)
    with build_slot():
        proc = _run(["make", "-C", bad, "repro", "REPRO_NEEDS=", "HOST_FLAGS=-std=c++17 -O0"], timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"good": good / "repro", "wrong_nibbles": bad / "repro"}


def _dequant_dump(program: Path, d: Path, shape) -> torch.Tensor:
    out = d / f"w_{program.parent.name}.bin"
    proc = _run([program, "--dir", d, "--dequant-b", out])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.from_numpy(np.fromfile(out, dtype=np.float64).reshape(shape).copy())


def _bits_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal to the bit (so -0 is not +0), NaN matching NaN."""
    nan = x.isnan()
    return bool(torch.equal(nan, y.isnan()) and torch.equal(x[~nan].view(torch.int64), y[~nan].view(torch.int64)))


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_the_host_reference_dequantises_b_as_the_oracle_and_matches_its_d(written, host_programs, name):
    d, case, ops = written[name]
    s = case.spec
    cfg = s.dequant_config
    want = dequant_host(ops.b, ops.b_scales, ops.b_zeros, cfg).double()
    got = _dequant_dump(host_programs["good"], d, (s.k, s.n))
    assert _bits_equal(got, want), f"{int((got != want).sum())} of {got.numel()} dequantised values differ"
    if name in OPERAND_DIFFERS:  # the operand arithmetic is tested, not the fp32 one standing in for it
        fp32 = dequant_host(ops.b, ops.b_scales, ops.b_zeros, dataclasses.replace(cfg, precision="fp32")).double()
        assert not _bits_equal(fp32, want)
    y, _ = expected_output(s, ops)
    (d / "d.bin").write_bytes(_u8(y.to(DTYPES[s.out_dtype].torch)))  # the oracle's D, as a kernel would store it
    for flags in ((), ("--host-reference",)):
        proc = _run([host_programs["good"], "--dir", d, "--check-only", *flags])
        assert proc.returncode == 0 and "verdict: MATCH" in proc.stdout, proc.stdout + proc.stderr
    assert "own double-precision host reference" in proc.stdout

    # the same program with the nibble order swapped: wrong on every packed B, right on the others
    wrong = _dequant_dump(host_programs["wrong_nibbles"], d, (s.k, s.n))
    proc = _run([host_programs["wrong_nibbles"], "--dir", d, "--check-only", "--host-reference"])
    if s.b_packing is None:
        assert _bits_equal(wrong, want) and proc.returncode == 0, proc.stdout
    else:
        assert not _bits_equal(wrong, want)
        assert proc.returncode == 1 and "verdict: DIVERGED" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.nvcc
def test_a_bad_quant_field_or_file_is_an_error_line(written, host_programs, tmp_path):
    d = tmp_path / "q"
    shutil.copytree(written["uint4_low_int"][0], d)
    problem = (d / "problem.txt").read_text()
    cases = [
        (problem.replace("b_packing k_pairs_low_first", "b_packing k_pairs_sideways"),
         "b_packing 'k_pairs_sideways' is unknown"),
        (problem.replace("b_group_size 64", "b_group_size 48"), "b_group_size 48 must divide K = 256"),
        (problem.replace("b_packing k_pairs_low_first", "b_packing none"), "b_packing 'none' for b_dtype uint4"),
        (problem.replace("a_dtype fp16", "a_dtype fp32"), "a_dtype 'fp32': B is dequantised to A's dtype"),
    ]
    for text, message in cases:
        (d / "problem.txt").write_text(text)
        proc = _run([host_programs["good"], "--dir", d, "--dequant-b", d / "w.bin"])
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    (d / "problem.txt").write_text(problem)
    man = (d / "inputs.txt").read_text()
    (d / "inputs.txt").write_text("\n".join(ln for ln in man.splitlines() if "name=b_zeros" not in ln) + "\n")
    proc = _run([host_programs["good"], "--dir", d, "--dequant-b", d / "w.bin"])
    assert proc.returncode == 2 and "inputs.txt lists no b_zeros" in proc.stderr, proc.stderr
    (d / "inputs.txt").write_text(man.replace("name=b_scales role=in dtype=fp16 shape=4x48 bytes=384",
                                              "name=b_scales role=in dtype=bf16 shape=4x48 bytes=384"))
    proc = _run([host_programs["good"], "--dir", d, "--dequant-b", d / "w.bin"])
    assert proc.returncode == 2 and "b_scales has dtype bf16; fp16 scales" in proc.stderr, proc.stderr


@pytest.mark.nvcc
@pytest.mark.parametrize("name, defect", [("uint4_low_int", "dequant_nibble_order"),
                                          ("fp4_k8_e8m0", "dequant_plain_pairs")])
def test_repro_judges_a_kernel_s_d_with_the_oracle_s_bound(written, host_programs, tmp_path, name, defect):
    """The model kernel's D (oracle.run.simulate) is a MATCH; with its nibbles read in the wrong
    order at one k-block, DIVERGED, against expected.bin / bound.bin and the host reference alike."""
    from oracle.run.simulate import Injection, simulate

    src, case, ops = written[name]
    d = tmp_path / "d"
    shutil.copytree(src, d)
    prov = Provenance("random", SEED)
    for injection, code in ((None, 0), (Injection(defect, (0, 0), 1), 1)):
        rec = simulate(case.spec, ops, prov, injection=injection, tap_tiles=[(0, 0)])
        (d / "d.bin").write_bytes(_u8(rec.output))
        for flags in ((), ("--host-reference",)):
            proc = _run([host_programs["good"], "--dir", d, "--check-only", *flags])
            assert proc.returncode == code, (injection, flags, proc.stdout + proc.stderr)


def _dequant_q(s, ops) -> torch.Tensor:
    """sum_k |a_mk| times the dequant bound of w_kn (oracle.judging.tolerance.dequant_bound): what a
    kernel whose operand arithmetic runs in another order may add to the accumulator."""
    from kernels_ref import dequant as dq
    from oracle.judging.tolerance import dequant_bound

    cfg = s.dequant_config
    q = dq.values_of_codes(dq.unpack_host(ops.b, cfg), s.b_dtype)
    g = torch.arange(s.k) // s.group_k
    sc = dq.scale_values_host(ops.b_scales, s.b_scales)[g]
    z = ops.b_zeros.double()[g] if ops.b_zeros is not None else torch.zeros_like(sc)
    wb = dequant_bound(q, z, sc, out_dtype=s.a_dtype, precision=cfg.precision, zeros=s.b_zeros,
                       scale_dtype=s.b_scales, centre=cfg.centre)
    return ops.a.double().abs() @ wb


@pytest.mark.nvcc
@pytest.mark.parametrize("name", OPERAND_DIFFERS)
def test_the_host_bound_holds_an_operand_dequant_in_another_order(written, host_programs, tmp_path, name):
    """With dequant_precision "operand" a kernel may compute w in another order (an fma with z * s
    first): the host reference's bound takes |alpha| sum_k |a| times each w's dequant bound, as the
    oracle's does, so half of that off is a MATCH and four times it DIVERGED."""
    src, case, ops = written[name]
    s = case.spec
    d = tmp_path / "d"
    shutil.copytree(src, d)
    y, _ = expected_output(s, ops)
    extra = abs(s.alpha) * _dequant_q(s, ops)
    assert bool((extra > 0).all())
    for times, code in ((0.5, 0), (4.0, 1)):
        (d / "d.bin").write_bytes(_u8((y.double() + times * extra).to(DTYPES[s.out_dtype].torch)))
        proc = _run([host_programs["good"], "--dir", d, "--check-only", "--host-reference"])
        assert proc.returncode == code, (times, proc.stdout + proc.stderr)


@pytest.mark.nvcc
def test_the_host_program_writes_no_file_through_a_link_a_fifo_or_a_second_name(written, host_programs, tmp_path):
    # a received folder may hold a link where an output goes (sink.bin, result.txt, d.bin): every file the
    # host program writes goes through one function, exercised here through --dequant-b
    d = tmp_path / "q"
    shutil.copytree(written["uint4_low_int"][0], d)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    (d / "link.bin").symlink_to(victim)
    (d / "dangling.bin").symlink_to(tmp_path / "not_there.bin")
    os.link(victim, d / "second_name.bin")
    os.mkfifo(d / "fifo.bin")
    for name, words in (("link.bin", "a symbolic link"), ("dangling.bin", "a symbolic link"),
                        ("second_name.bin", "not a regular file with one name"),
                        ("fifo.bin", "cannot write")):
        proc = _run([host_programs["good"], "--dir", d, "--dequant-b", d / name])
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and words in proc.stderr, (name, proc.stderr)
    assert victim.read_text() == "the user's file\n" and not (tmp_path / "not_there.bin").exists()
    proc = _run([host_programs["good"], "--dir", d, "--dequant-b", d / "fresh.bin"])
    assert proc.returncode == 0 and (d / "fresh.bin").stat().st_size > 0, proc.stderr

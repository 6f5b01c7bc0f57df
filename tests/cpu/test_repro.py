"""Track B without a GPU: `python -m oracle repro` writes a reproducer whose files say exactly
what the oracle's own launches are (every launch of a case in order, workspaces with the bytes
the harness fills them with, a grouped problem's stacked B and group offsets), `python -m oracle
compare --repro-dir` reads a run of it back as a live run records it, and (marker nvcc) the
directory builds with make alone and its host program judges D the oracle's way: a wrong tile, a
NaN, a never-written element, a bit-exact reference, its own host reference (group by group for
a grouped problem); its argument bytes and initial sink header are the harness's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.build import build_slot
from harness.launch import ScalarArg, TensorArg, TensorMapArg
from harness.trace_format import HEADER_BYTES, TraceWriter, parse_header, sink_init_bytes
from oracle.tools import cli
from oracle.run.case import load_case
from oracle.run.case_types import with_trace
from oracle.judging.differential import analyze, expected_output
from oracle.run.inputs import Provenance, make_operands
from oracle.run.launch import launch_sequence, launch_spec, stale_rows, workspace_buffer
from oracle.repro.generate import ReproError, sink_bytes, write_repro
from oracle.repro.readback import load_repro_run
from oracle.run.confounds import ConfoundKind
from host_programs import host_from, shared_host_programs  # tests/ is on sys.path
from repro_files import input_manifest

ROOT = Path(__file__).resolve().parents[2]
SIMPLE = ROOT / "harness" / "examples" / "simple_gemm.toml"
HOPPER = ROOT / "zoo" / "hopper_gemm"
SPLIT = ROOT / "zoo" / "split_gemm"


def _launch_lines(d: Path, key: str) -> list[list[str]]:
    return [line.split("#")[0].split()[1:] for line in (d / "launch.txt").read_text().splitlines()
            if line.split() and line.split()[0] == key]


def _single(d: Path, key: str) -> list[str]:
    (vals,) = _launch_lines(d, key)
    return vals


def _write(case, ladder="ones", seed=0, out=None, **kw):
    ops = make_operands(case.spec, ladder, seed)
    prov = Provenance(ladder, seed if ladder == "random" else None)
    return write_repro(case, ops, prov, out, **kw), ops


def _storage_bytes(x: torch.Tensor, major: str) -> bytes:
    x = x.contiguous() if major == "row" else x.transpose(-1, -2).contiguous()
    return x.reshape(-1).view(torch.uint8).numpy().tobytes()


def _launch_sections(d: Path) -> list[dict[str, list[list[str]]]]:
    """launch.txt's launches in order, each key's lines (comments dropped)."""
    out: list[dict] = []
    for line in (d / "launch.txt").read_text().splitlines():
        toks = line.split("#")[0].split()
        if toks and toks[0] == "launch":
            assert int(toks[1]) == len(out), line
            out.append({})
        elif toks and out:
            out[-1].setdefault(toks[0], []).append(toks[1:])
    return out


def _assert_args(lines: list[list[str]], launch) -> None:
    """launch.txt's arg lines are the harness's arguments: pointers by name, scalars by value or bits."""
    assert len(lines) == len(launch.args)
    for (kind, value, *_), a in zip(lines, launch.args):
        if isinstance(a, TensorArg):
            assert (kind, value) == ("ptr", a.name)
        elif kind in ("f32", "f64"):
            assert int(value, 16).to_bytes(4 if kind == "f32" else 8, "little") == a.to_bytes()
        else:
            assert (kind, int(value)) == (a.ctype, a.value)


def _zoo_case(name: str, problem=None):
    from zoo_cases import entries, entry_case  # tests/ is on sys.path

    return entry_case(next(e for e in entries() if e["name"] == name), problem)


def _u8(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# -- what the files say ---------------------------------------------------------------------------
def test_simple_gemm_reproducer_files(tmp_path, capsys):
    out = tmp_path / "sg"
    assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ones", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"make -C {out} && {out}/repro" in printed
    case = load_case(str(SIMPLE))
    ops = make_operands(case.spec, "ones")
    launch, tensors = launch_spec(case, ops)

    man = input_manifest(out)
    assert set(man) == {"a", "b", "d", "bias", "expected", "bound"}  # beta = 0: no C
    for name, t in tensors.items():
        kv = man[name]
        assert kv["shape"] == "x".join(map(str, t.shape)) and int(kv["bytes"]) == t.numel() * t.element_size()
        if kv["role"] == "in":
            assert (out / kv["file"]).read_bytes() == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert np.all(np.fromfile(out / "a.bin", dtype=np.uint16) == 0x3F80)  # bf16 ones
    assert not (out / "d.bin").exists()  # written by a run

    assert _single(out, "grid") == [str(g) for g in launch.grid] == ["3", "4", "1"]
    assert _single(out, "block") == ["16", "16", "1"]
    args = _launch_lines(out, "arg")
    assert len(args) == 15
    _assert_args(args, launch)
    assert _single(out, "launches") == ["1"] and len(_launch_sections(out)) == 1
    assert _single(out, "entry_traced") == ["simple_gemm_bf16_traced"]
    assert _single(out, "entry_plain") == ["simple_gemm_bf16"]  # the case's time_entry, built without taps
    assert _single(out, "cubin_plain") == ["kernel.cubin"]

    y, b = expected_output(case.spec, ops)
    assert np.array_equal(np.fromfile(out / "expected.bin", dtype=np.float32).reshape(200, 136), y.float().numpy())
    assert np.array_equal(np.fromfile(out / "bound.bin", dtype=np.float64).reshape(200, 136), b.numpy())

    make = (out / "Makefile").read_text()
    assert "KERNEL_FLAGS := -cubin -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --expt-relaxed-constexpr " \
           "-lineinfo" in make
    assert re.search(r"^TRACED_DEFINES := -DORACLE_TRACE=1$", make, re.M)
    assert re.search(r"^PLAIN_DEFINES := $", make, re.M)
    assert "CUTLASS_INCLUDE ?=" in make
    assert (out / "kernel" / "src" / "simple_gemm.cu").read_bytes() == (SIMPLE.parent / "simple_gemm.cu").read_bytes()
    assert (out / "kernel" / "include" / "oracle_trace" / "trace.cuh").read_bytes() == \
        (ROOT / "harness" / "include" / "oracle_trace" / "trace.cuh").read_bytes()
    assert (out / "repro.cu").read_bytes() == (ROOT / "oracle" / "repro" / "files" / "repro.cu").read_bytes()
    assert "compute-sanitizer --tool memcheck" in (out / "README.txt").read_text()


@pytest.mark.parametrize("case_file, problem", [
    ("defects/wrong_stride.toml", {"m": 40, "n": 24, "k": 96}),
    ("defects/narrow_box.toml", {"m": 40, "n": 24, "k": 96}),
    ("defects/no_swizzle.toml", {"m": 40, "n": 24, "k": 96}),
    ("defects/nan_fill.toml", {"m": 40, "n": 24, "k": 96}),
    ("hopper_gemm_n16.toml", {"m": 128, "n": 8, "k": 256}),
])
def test_tensor_maps_are_the_ones_the_harness_encodes(tmp_path, case_file, problem):
    case = load_case(str(HOPPER / case_file), problem)
    out, ops = _write(case, "random", 1, tmp_path / "r")
    launch, tensors = launch_spec(case, ops)
    maps = [a for a in launch.args if isinstance(a, TensorMapArg)]
    lines = _launch_lines(out.path, "tensormap")
    assert len(lines) == len(maps) == 2
    for toks, a in zip(lines, maps):
        kv = dict(t.split("=", 1) for t in toks)
        want = a.spec.driver_args(0)
        assert kv["buffer"] == a.tensor_name
        assert int(kv["data_type"]) == want["data_type"] and int(kv["rank"]) == a.spec.rank
        assert tuple(map(int, kv["dims"].split(","))) == want["global_dims"]
        assert tuple(map(int, kv["strides"].split(","))) == want["global_strides"]
        assert tuple(map(int, kv["box"].split(","))) == want["box_dims"]
        assert tuple(map(int, kv["element_strides"].split(","))) == want["element_strides"]
        for field in ("interleave", "swizzle", "l2_promotion", "oob_fill"):
            assert int(kv[field]) == want[field], field
        # the buffer the map reads is the one the harness uploads (padding rows included)
        t = tensors[a.tensor_name]
        assert (out.path / f"{a.tensor_name}.bin").read_bytes() == t.reshape(-1).view(torch.uint8).numpy().tobytes()
    arg_maps = [vals for vals in _launch_lines(out.path, "arg") if vals[0] == "tensormap"]
    assert [v[1] for v in arg_maps] == ["0", "1"]
    if case_file == "hopper_gemm_n16.toml":  # B covers 16 rows: 8 real, then 8 of stale data
        b = np.fromfile(out.path / "b.bin", dtype=np.uint16).reshape(16, 256)
        real = ops.b.t().contiguous().view(torch.int16).numpy().view(np.uint16)
        stale = stale_rows(8, 256, torch.bfloat16, seed=16).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(b[:8], real) and np.array_equal(b[8:], stale)
        listed = input_manifest(out.path)["b"]
        assert listed["shape"] == "16x256" and listed["logical"] == "256x8"
    readme = (out.path / "README.txt").read_text()
    assert f"strides {list(maps[0].spec.global_strides)} bytes" in readme


def test_the_command_line_trace_selection_reaches_launch_txt(tmp_path):
    out = tmp_path / "t"
    assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ktag", "--trace-tiles", "1,2 3,0",
                     "--trace-k-blocks", "4,2", "--out", str(out)]) == 0
    assert _single(out, "trace_tiles") == ["1,2", "3,0"]
    assert _single(out, "trace_k_blocks") == ["2", "4"]
    assert json.loads((out / "repro.json").read_text())["provenance"]["ladder"] == "ktag"


def test_a_large_output_s_float32_bound_is_never_below_the_oracle_s():
    from oracle.repro.generate import BOUND_F64_LIMIT, _bound_tensor

    b = torch.rand(4096, dtype=torch.float64) * 10.0 ** torch.randint(-30, 5, (4096,)).double()
    small, large = _bound_tensor(b, 4096), _bound_tensor(b, BOUND_F64_LIMIT + 1)
    assert small.dtype == torch.float64 and torch.equal(small, b)
    assert large.dtype == torch.float32 and bool((large.double() >= b).all())
    assert bool((large.double() - b <= b * 2.0 ** -23).all())  # one float32 ulp at most


def test_a_zoo_entry_without_time_entry_shares_one_cubin(tmp_path):
    from zoo_cases import entries, entry_case  # tests/ is on sys.path

    entry = next(e for e in entries() if e["name"] == "hopper_bf16_stale_slot")
    out, _ = _write(entry_case(entry), "ones", out=tmp_path / "z")
    assert out.entry_plain == out.entry_traced == "zoo_hopper_bf16_stale_slot_traced"
    assert _single(out.path, "cubin_plain") == ["kernel_traced.cubin"]
    make = (out.path / "Makefile").read_text()
    assert "kernel.cubin:" not in make and "PLAIN_CUBIN := kernel_traced.cubin" in make
    assert _single(out.path, "trace_tiles") == ["0,0"]
    assert sorted(p.name for p in (out.path / "kernel" / "src").rglob("*") if p.is_file()) == \
        ["activation.cuh", "hopper_gemm.cu", "hopper_layout.cuh", "tma_ring.cuh"]


def test_a_recording_gives_problem_inputs_and_entry(tmp_path):
    from oracle.run.recording import Recording

    dump = ROOT / "tests" / "zoo" / "dumps" / "hopper_bf16_kblock_twice.safetensors.gz"
    rec = Recording.load(str(dump))
    out = tmp_path / "d"
    assert cli.main(["repro", "--dump", str(dump), "--problem", str(HOPPER / "hopper_gemm.toml"),
                     "--out", str(out)]) == 0
    assert _single(out, "entry_traced") == [rec.kernel]
    assert (out / "a.bin").read_bytes() == _storage_bytes(rec.operands.a, rec.spec.a_major)
    assert (out / "b.bin").read_bytes() == _storage_bytes(rec.operands.b, rec.spec.b_major)
    doc = json.loads((out / "repro.json").read_text())
    assert doc["problem"] == rec.spec.to_json()
    assert doc["provenance"]["ladder"] == rec.provenance.ladder and doc["provenance"]["seed"] == rec.provenance.seed


# -- split-K, stream-K, several launches, grouped problems -----------------------------------------
def test_a_serial_split_k_reproducer_carries_its_workspaces_as_the_harness_fills_them(tmp_path):
    case = _zoo_case("splitk_serial_correct_ragged")  # 40 x 136 x 1000 in 3 splits: 1 x 3 tiles
    out, ops = _write(case, "random", 1, tmp_path / "s")
    sequence, tensors = launch_sequence(case, ops)
    (sec,) = _launch_sections(out.path)
    assert sec["entry_traced"] == sec["entry_plain"] == [["zoo_splitk_serial_traced"]]
    assert sec["grid"] == [["3", "1", "3"]]
    _assert_args(sec["arg"], sequence[0][1])
    assert sec["arg"][-2:] == [["ptr", "ws_partials"], ["ptr", "ws_counters"]]
    man = input_manifest(out.path)
    declared = {w.name: w for w in case.workspaces}
    for name, nbytes, init, fill in (("partials", 3 * 3 * 64 * 64 * 4, "poison", {0xFF}),
                                     ("counters", 3 * 4, "zero", {0})):
        kv = man[f"ws_{name}"]
        assert (kv["role"], kv["dtype"], int(kv["bytes"]), kv["workspace"], kv["init"]) == \
            ("inout", "uint8", nbytes, name, init)
        data = (out.path / kv["file"]).read_bytes()
        assert data == _u8(workspace_buffer(declared[name], nbytes)) == _u8(tensors[f"ws_{name}"])
        assert set(data) == fill
    assert not (out.path / "d.bin").exists()
    doc = json.loads((out.path / "repro.json").read_text())
    assert doc["version"] == 3 and doc["tensors"]["ws_partials"]["workspace"]["init"] == "poison"
    assert "partials: 147456 bytes, the 0xFF poison, ws_partials.bin" in (out.path / "README.txt").read_text()


def test_the_two_launch_split_k_case_describes_both_launches_in_order(tmp_path, capsys):
    out = tmp_path / "a"
    assert cli.main(["repro", "--problem", str(SPLIT / "splitk_atomic.toml"), "--inputs", "random:1",
                     "--out", str(out)]) == 0
    assert "2 launches, in order: zoo_splitk_atomic_partials_traced, zoo_splitk_atomic_reduce_traced (traced)" \
        in capsys.readouterr().out
    case = load_case(str(SPLIT / "splitk_atomic.toml"))
    sequence, tensors = launch_sequence(case, make_operands(case.spec, "random", 1))
    assert _single(out, "launches") == ["2"]
    sections = _launch_sections(out)
    assert [s["entry_traced"] for s in sections] == [[[e]] for e, _ in sequence] == \
        [[["zoo_splitk_atomic_partials_traced"]], [["zoo_splitk_atomic_reduce_traced"]]]
    assert [s["entry_plain"] for s in sections] == [s["entry_traced"] for s in sections]  # no time_entry
    assert [s["grid"] for s in sections] == [[["2", "1", "4"]], [["2", "1", "1"]]]
    for sec, (_, launch) in zip(sections, sequence):
        assert sec["block"] == [["256", "1", "1"]] and sec["cluster"] == [["1", "1", "1"]]
        assert sec["shared_mem_bytes"] == [["0"]]
        _assert_args(sec["arg"], launch)
    man = input_manifest(out)
    assert man["d"]["role"] == "out" and man["ws_acc"]["role"] == "inout" and man["ws_acc"]["init"] == "zero"
    assert (out / "ws_acc.bin").read_bytes() == bytes(2 * 64 * 64 * 4)
    doc = json.loads((out / "repro.json").read_text())
    assert [launch["entry_traced"] for launch in doc["launches"]] == [e for e, _ in sequence]
    assert [launch["grid"] for launch in doc["launches"]] == [list(spec.grid) for _, spec in sequence]
    assert "The launches run in this order on the same buffers" in (out / "README.txt").read_text()

    stale = load_case(str(SPLIT / "defects" / "atomic_stale_workspace.toml"))
    st, _ = _write(stale, "random", 1, tmp_path / "stale")
    kv = input_manifest(st.path)["ws_acc"]
    assert (kv["init"], kv["init_dtype"]) == ("stale", "fp32")
    data = (st.path / "ws_acc.bin").read_bytes()
    acc = next(w for w in stale.workspaces if w.name == "acc")
    assert data == _u8(workspace_buffer(acc, 2 * 64 * 64 * 4))
    junk = np.frombuffer(data, dtype=np.float32)
    assert np.isfinite(junk).all() and np.count_nonzero(junk) > junk.size // 2  # what an earlier use left


def test_a_time_entry_of_a_multi_launch_case_leaves_the_untraced_build_traced(tmp_path):
    toml = tmp_path / "timed.toml"
    toml.write_text(f'extends = "{SPLIT / "splitk_atomic.toml"}"\n[kernel]\ntime_entry = "zoo_splitk_atomic_partials"\n')
    out, _ = _write(load_case(str(toml), allow_outside_case_dir=True), out=tmp_path / "t")
    assert out.entries_plain == out.entries_traced and out.cubin_plain == "kernel_traced.cubin"
    assert "kernel.cubin:" not in (out.path / "Makefile").read_text()
    assert "time_entry (zoo_splitk_atomic_partials) names the untraced kernel of one launch" in \
        " ".join((out.path / "README.txt").read_text().split())


def test_a_stream_k_reproducer_evaluates_its_workers_and_partials(tmp_path):
    from oracle.problem.partition import tile_partials

    case = _zoo_case("streamk_correct")  # 130 x 200 x 1000: 3 x 4 tiles of 32 k-blocks, 7 workers
    out, ops = _write(case, "ones", out=tmp_path / "k", reference=False)
    ((_, launch),), _ = launch_sequence(case, ops)
    (sec,) = _launch_sections(out.path)
    assert sec["grid"] == [["7", "1", "1"]]
    _assert_args(sec["arg"], launch)
    most = max(len(tile_partials(case.spec, (tm, tn))) for tm in range(3) for tn in range(4))
    assert most >= 2 and sec["arg"][-1] == ["i32", str(most)]
    man = input_manifest(out.path)
    assert int(man["ws_partials"]["bytes"]) == 12 * most * 64 * 64 * 4 and int(man["ws_counters"]["bytes"]) == 48
    assert set((out.path / "ws_partials.bin").read_bytes()) == {0xFF}


@pytest.mark.parametrize("b_major", ["row", "col"])
def test_a_grouped_reproducer_stores_b_as_its_stack_and_the_group_offsets(tmp_path, b_major):
    case = _zoo_case("grouped_correct", {"m": 218, "n": 136, "k": 64, "groups": [40, 0, 100, 8, 70],
                                         "b_major": b_major})
    out, ops = _write(case, "random", 1, tmp_path / b_major)
    man = input_manifest(out.path)
    assert (man["b"]["shape"], man["b"]["logical"], man["b"]["major"]) == \
        ("5x64x136" if b_major == "row" else "5x136x64", "5x64x136", b_major)
    assert (out.path / "b.bin").read_bytes() == _storage_bytes(ops.b, b_major)
    stored = np.fromfile(out.path / "b.bin", dtype=np.uint16).reshape([int(v) for v in man["b"]["shape"].split("x")])
    b2 = ops.b[2] if b_major == "row" else ops.b[2].t()
    assert np.array_equal(stored[2], b2.contiguous().view(torch.int16).numpy().view(np.uint16))  # matrix 2 is B[2]
    assert (man["group_offsets"]["role"], man["group_offsets"]["dtype"]) == ("in", "int32")
    assert np.fromfile(out.path / "group_offsets.bin", dtype=np.int32).tolist() == [0, 40, 40, 140, 148, 218]
    assert man["bias"]["shape"] == "5x136" and man["d"]["shape"] == man["d"]["logical"] == "218x136"
    problem = (out.path / "problem.txt").read_text()
    assert re.search(r"^total_m 218\b", problem, re.M) and re.search(r"^group_sizes 40 0 100 8 70\b", problem, re.M)
    y, b = expected_output(case.spec, ops)
    assert np.array_equal(np.fromfile(out.path / "expected.bin", dtype=np.float32).reshape(218, 136), y.numpy())
    assert np.array_equal(np.fromfile(out.path / "bound.bin", dtype=np.float64).reshape(218, 136), b.numpy())
    _assert_args(_launch_sections(out.path)[0]["arg"], launch_sequence(case, ops)[0][0][1])


def test_a_batched_reproducer_holds_every_entry_s_rows(tmp_path):
    case = _zoo_case("batched_correct")  # 3 entries of 40 x 136 x 256
    out, ops = _write(case, "random", 1, tmp_path / "b")
    man = input_manifest(out.path)
    assert man["a"]["shape"] == "120x256" and man["b"]["shape"] == "3x256x136" and man["d"]["shape"] == "120x136"
    assert np.fromfile(out.path / "group_offsets.bin", dtype=np.int32).tolist() == [0, 40, 80, 120]
    assert re.search(r"^group_sizes 40 40 40\b", (out.path / "problem.txt").read_text(), re.M)
    assert man["expected"]["shape"] == "120x136"


def test_a_grouped_case_with_a_tensor_map_is_an_error_line(tmp_path, capsys):
    toml = tmp_path / "mapped.toml"
    toml.write_text(f'extends = "{SPLIT / "grouped.toml"}"\n[launch]\nargs = [{{ tensormap = "a" }}, "b", "d"]\n')
    assert cli.main(["repro", "--problem", str(toml), "--inputs", "ones", "--out", str(tmp_path / "x"),
                     "--allow-outside-case-dir"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "args[0]" in err and "grouped" in err and "Traceback" not in err


# -- a run read back ------------------------------------------------------------------------------
def _fake_run(out: Path, rec, *, ok: bool = True, traced: bool = True, error: str = "") -> None:
    """What repro_traced leaves behind, made from a simulated recording: d.bin, sink.bin (the
    capacity and tile selection of launch.txt), result.txt."""
    s = rec.spec
    tiles = [tuple(map(int, t.split(","))) for t in _single(out, "trace_tiles")]
    w = TraceWriter(int(_single(out, "trace_capacity_bytes")[0]), tiles=tiles)
    for tap in rec.taps:
        w.tap(tap)
    (out / "sink.bin").write_bytes(w.to_bytes())
    if ok:
        (out / "d.bin").write_bytes(_storage_bytes(rec.output, s.d_major))
        (out / "result.txt").write_text(f"status ok\nentry x_traced\ntraced {int(traced)}\n")
    else:
        (out / "result.txt").write_text("status kernel_error\nerror cudaErrorIllegalAddress\nmessage " +
                                        (error or "an illegal memory access was encountered") + "\n")


def test_compare_judges_a_reproducer_run_stage_by_stage(tmp_path, capsys):
    from oracle.run.simulate import Injection, simulate

    case = load_case(str(SIMPLE), {"m": 64, "n": 64, "k": 48})
    out, ops = _write(case, "random", 1, tmp_path / "r")
    prov = Provenance("random", 1)
    rec = simulate(case.spec, ops, prov, injection=Injection("mma_kblock_twice", (0, 0), 1), tap_tiles=[(0, 0)])
    _fake_run(out.path, rec)
    report = tmp_path / "report.json"
    assert cli.main(["compare", "--repro-dir", str(out.path), "--json", str(report)]) == 1
    doc = json.loads(report.read_text())
    assert doc["first_divergence"]["stage"] == "mma" == analyze(rec).first.stage
    assert doc["first_divergence"]["k_block"] == 1
    back = load_repro_run(out.path)
    assert torch.equal(back.operands.a, ops.a) and torch.equal(back.output, rec.output)
    assert {t.key for t in back.taps} == {t.key for t in rec.taps}
    capsys.readouterr()

    _fake_run(out.path, rec, ok=False)  # a fault: the taps before it, no D
    assert cli.main(["compare", "--repro-dir", str(out.path)]) == 3
    assert "cudaErrorIllegalAddress" in capsys.readouterr().out


def _sink_with(out: Path, taps, extra) -> None:
    """sink.bin holding `taps`, then what `extra(writer)` adds, under launch.txt's capacity and tiles."""
    tiles = [tuple(map(int, t.split(","))) for t in _single(out, "trace_tiles")]
    w = TraceWriter(int(_single(out, "trace_capacity_bytes")[0]), tiles=tiles)
    for tap in taps:
        w.tap(tap)
    extra(w)
    (out / "sink.bin").write_bytes(w.to_bytes())


def test_a_parser_warning_the_judgement_rests_on_is_an_open_confound_and_one_it_cannot_change_a_note(tmp_path):
    from oracle.report import table as report
    from oracle.run.simulate import Injection, simulate

    case = with_trace(load_case(str(SIMPLE), {"m": 128, "n": 64, "k": 48}), tiles=((0, 0),))
    out, ops = _write(case, "random", 1, tmp_path / "r")
    rec = simulate(case.spec, ops, Provenance("random", 1), injection=Injection("mma_kblock_twice", (0, 0), 1),
                   tap_tiles=[(0, 0), (1, 0)])
    mine = [t for t in rec.taps if t.tile == (0, 0)]
    stray = next(t for t in rec.taps if t.tile == (1, 0) and t.stage == "mma" and t.k_block == 0)
    (out.path / "d.bin").write_bytes(_storage_bytes(rec.output, case.spec.d_major))
    (out.path / "result.txt").write_text("status ok\nentry x_traced\ntraced 1\n")

    _sink_with(out.path, mine, lambda w: None)  # as selected: a VERDICT, no confound
    clean = analyze(load_repro_run(out.path))
    assert clean.first.kind.value == "VERDICT" and not clean.open_confounds

    # a record of tile (1, 0), which the header did not select: the selection cannot be trusted
    _sink_with(out.path, mine, lambda w: w.tap(stray))
    back = load_repro_run(out.path)
    assert [c.kind for c in back.confounds] == [ConfoundKind.UNSELECTED_TAPS]
    assert "tile (1, 0)" in back.confounds[0].field("examples")
    assert not any("did not select" in n for n in back.notes)
    an = analyze(back)
    assert an.first.stage == "mma" and an.first.kind.value == "DRAFT" and back.confounds[0] in an.open_confounds
    assert "did not select" in report.sentence(an)

    # the same mma record written again by a second CTA: no value changes, so a note and still a VERDICT
    tap = next(t for t in mine if t.stage == "mma" and t.k_block == 2)
    rows, cols = zip(*[(r, c) for r in range(64) for c in range(64)])
    _sink_with(out.path, mine, lambda w: w.elements("mma", (0, 0), rows, cols, tap.values.reshape(-1),
                                                    shape=(64, 64), k_block=2, cta=7))
    back = load_repro_run(out.path)
    assert not back.confounds and any("several CTAs" in n for n in back.notes)
    assert analyze(back).first.kind.value == "VERDICT"

    # a kernel that stopped while writing a record: the torn record is an open confound through the account
    (out.path / "result.txt").write_text("status kernel_error\nerror cudaErrorIllegalAddress\nmessage stopped\n")
    _sink_with(out.path, mine, lambda w: w.elements("mma", (0, 0), [0], [0], tap.values[0, :1], shape=(64, 64),
                                                    k_block=2, commit=False))
    back = load_repro_run(out.path)
    assert back.trace.torn == 1 and any("not committed" in n for n in back.notes) and not back.confounds
    assert [(c.kind, c.fields) for c in analyze(back).incomplete_trace] == [(ConfoundKind.TORN_RECORDS, (("torn", 1),))]


def test_compare_judges_a_grouped_reproducer_run_group_by_group(tmp_path):
    from oracle.run.simulate import Injection, simulate

    case = with_trace(_zoo_case("grouped_correct", {"m": 110, "n": 64, "k": 64, "groups": [40, 0, 70]}),
                      tiles=((0, 0), (1, 0)))
    out, ops = _write(case, "random", 1, tmp_path / "g", reference=False)
    rec = simulate(case.spec, ops, Provenance("random", 1), injection=Injection("group_wrong_b", (0, 0), 1, group=2),
                   tap_tiles=[(0, 0), (1, 0)])
    _fake_run(out.path, rec)
    report = tmp_path / "report.json"
    assert cli.main(["compare", "--repro-dir", str(out.path), "--json", str(report)]) == 1
    doc = json.loads(report.read_text())
    live = analyze(rec)
    assert (doc["first_divergence"]["stage"], doc["first_divergence"]["group"]) == (live.first.stage, 2)
    back = load_repro_run(out.path)
    assert torch.equal(back.operands.b, ops.b) and back.operands.b.shape == (3, 64, 64)
    assert torch.equal(back.operands.bias, ops.bias) and torch.equal(back.output, rec.output)
    assert sorted((t.site, t.group) for t in back.taps) == sorted((t.site, t.group) for t in rec.taps)
    assert {t.group for t in back.taps} == {0, 2}
    assert back.output_poison == 0xFF and back.trace is not None and back.trace.dropped == 0
    assert back.trace.selection.tiles == ((0, 0), (1, 0))


def test_compare_judges_a_two_launch_split_k_run_partial_by_partial(tmp_path, capsys):
    from oracle.run.simulate import Injection, simulate

    case = load_case(str(SPLIT / "splitk_atomic.toml"), {"m": 40, "n": 64, "k": 256, "splits": 4})
    out, ops = _write(case, "random", 1, tmp_path / "a", reference=False)
    rec = simulate(case.spec, ops, Provenance("random", 1), injection=Injection("reduce_partial_twice", (0, 0)),
                   tap_tiles=[(0, 0)])
    _fake_run(out.path, rec)
    report = tmp_path / "report.json"
    assert cli.main(["compare", "--repro-dir", str(out.path), "--json", str(report)]) == 1
    assert json.loads(report.read_text())["first_divergence"]["stage"] == "reduce" == analyze(rec).first.stage
    back = load_repro_run(out.path)
    assert {t.partial for t in back.taps if t.stage == "mma"} == {0, 1, 2, 3}
    assert any(t.stage == "reduce" for t in back.taps) and back.trace.dropped == 0
    capsys.readouterr()

    _fake_run(out.path, rec, ok=False, error="launch 1 (zoo_splitk_atomic_reduce_traced): an illegal memory access "
                                             "was encountered")
    assert cli.main(["compare", "--repro-dir", str(out.path)]) == 3
    assert "launch 1 (zoo_splitk_atomic_reduce_traced)" in capsys.readouterr().out
    assert "launch 1 (zoo_splitk_atomic_reduce_traced)" in load_repro_run(out.path).kernel_error


def test_compare_reads_the_maps_repro_encoded_as_descriptor_records(tmp_path):
    case = load_case(str(HOPPER / "defects" / "narrow_box.toml"), {"m": 40, "n": 24, "k": 96})
    out, ops = _write(case, "ones", out=tmp_path / "n")
    launch, _ = launch_spec(case, ops)
    (out.path / "d.bin").write_bytes(bytes(40 * 24 * 2))  # an all-zero D of the untraced build
    (out.path / "result.txt").write_text("status ok\nentry zoo_hopper_bf16\ntraced 0\n")
    rec = load_repro_run(out.path)
    want = [a.spec.to_descriptor_record(a.tensor_name) for a in launch.args if isinstance(a, TensorMapArg)]
    assert list(rec.descriptors) == want and want[0].box_dims == (32, 128)
    assert not rec.taps and any("untraced build" in n for n in rec.notes)
    assert any(n.startswith("analytic check (ones)") and "FAILS at 960 of 960" in n for n in rec.notes)


def test_bad_input_is_an_error_line_not_a_traceback(tmp_path, capsys):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ones", "--out", str(busy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "holds no reproducer" in err and "Traceback" not in err
    assert (busy / "notes.txt").read_text() == "mine"
    assert cli.main(["repro", "--dump", "x.safetensors", "--out", str(tmp_path / "x")]) == 2
    assert "give the case TOML with --problem" in capsys.readouterr().err
    assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ones:3", "--out", str(tmp_path / "y")]) == 2
    assert "only random takes a seed" in capsys.readouterr().err
    assert cli.main(["repro", "--problem", str(SIMPLE), "--trace-tiles", "a,b", "--out", str(tmp_path / "t")]) == 2
    assert "--trace-tiles 'a,b'" in capsys.readouterr().err
    out, _ = _write(load_case(str(SIMPLE), {"m": 8, "n": 8, "k": 16}), out=tmp_path / "never_run")
    assert cli.main(["compare", "--repro-dir", str(out.path)]) == 2
    assert "run the reproducer first" in capsys.readouterr().err
    assert cli.main(["compare", "--demo", "--sink", "s.bin"]) == 2
    with pytest.raises(ReproError, match="no repro.json"):
        load_repro_run(tmp_path / "busy")


@pytest.mark.parametrize("edit, message", [
    (lambda doc: doc["tensors"]["a"].update(file="../../outside.bin"), "tensors.a: file='../../outside.bin' is not "
                                                                       "allowed: the name of a file in the reproducer"),
    (lambda doc: doc["tensors"]["a"].update(storage_shape="8x16"), "tensors.a: storage_shape='8x16' is not allowed"),
    (lambda doc: doc["tensors"]["a"].update(dtype="fp64"), "tensors.a: dtype='fp64' is not allowed"),
    (lambda doc: doc.update(tensormaps=5), "tensormaps=5 is not allowed"),
    (lambda doc: doc.update(provenance=[]), "provenance=[] is not allowed"),
    (lambda doc: doc["problem"].update(m=10 ** 9, n=10 ** 9), "more than the 32768 MiB limit of ORACLE_MAX_OPERAND_MB"),
])
def test_a_malformed_reproducer_directory_is_a_repro_error(tmp_path, edit, message):
    out, _ = _write(load_case(str(SIMPLE), {"m": 8, "n": 8, "k": 16}), out=tmp_path / "r")
    (out.path / "result.txt").write_text("status kernel_error\nerror cudaErrorIllegalAddress\n")
    doc = json.loads((out.path / "repro.json").read_text())
    edit(doc)
    (out.path / "repro.json").write_text(json.dumps(doc))
    with pytest.raises(ReproError, match=re.escape(message)):
        load_repro_run(out.path)


def test_a_reproducer_s_files_are_read_only_when_they_can_be_theirs(tmp_path):
    out, _ = _write(load_case(str(SIMPLE), {"m": 8, "n": 8, "k": 16}), out=tmp_path / "r")
    (out.path / "result.txt").write_text("status kernel_error\nerror cudaErrorIllegalAddress\n")
    (out.path / "sink.bin").symlink_to("/dev/zero")
    with pytest.raises(ReproError, match="sink.bin is not a regular file"):
        load_repro_run(out.path)
    (out.path / "sink.bin").unlink()
    (out.path / "a.bin").write_bytes(bytes(10 ** 6))
    with pytest.raises(ReproError, match=r"a.bin has 1000000 bytes, more than the 256 bytes of bf16 \[8, 16\]"):
        load_repro_run(out.path)


# -- built with nvcc: the host program's own logic, no GPU needed ------------------------------
def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def _make(d: Path, *targets: str) -> None:
    with build_slot():  # make's nvcc takes a compile slot as the oracle's builds do
        proc = _run(["make", "-C", d, *targets], timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def simple_build(tmp_path_factory) -> Path:
    """simple_gemm with ones, built with `make` and `make TRACE=1` as a user would; the host programs
    are the session's one build by a reproducer's own `make host` (tests/host_programs.py), copied in
    first, so make finds them up to date and builds the two cubins."""
    shared = shared_host_programs(tmp_path_factory)
    d = tmp_path_factory.mktemp("repro") / "simple"
    assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ones", "--out", str(d)]) == 0
    host_from(shared, d, "repro", "repro_traced")
    _make(d)
    _make(d, "TRACE=1")
    return d


def _make_line_is_the_oracle_s_build(d: Path, target: str, source: Path, oracle_command) -> None:
    """`make -n TRACE=1 target`'s nvcc line is the oracle's own build of `source` (its command, flag
    for flag and include directory for include directory, ptxas -v aside, the reproducer's kernel/include
    for the harness's), and the reproducer's kernel/ copy of the source reaches the same headers, byte
    for byte, as the original does."""
    from harness.build import HARNESS_INCLUDE_DIR, local_includes

    dry = _run(["make", "-C", d, "-n", "TRACE=1", target])
    assert dry.returncode == 0, dry.stdout + dry.stderr
    (line,) = [x for x in dry.stdout.splitlines() if f"-o {target}" in x]

    def flags(words):
        return [w for w in words if w.startswith("-") and not w.startswith("--ptxas-options") and w != "-o"]

    def harness_include(w):  # a cached build's command names the tree that built it (the key is content, not path)
        return w == f"-I{HARNESS_INCLUDE_DIR}" or (w.startswith("-I") and Path(w[2:]).parts[-2:] == ("harness", "include"))

    oracle = [("-Ikernel/include" if harness_include(w) else w) for w in oracle_command]
    assert flags(line.split()) == flags(oracle), (line, oracle_command)
    main = line.split()[-1]
    assert main.startswith("kernel/src/") and Path(main).name == source.name, line
    copy = d / main
    assert copy.read_bytes() == source.read_bytes()
    ours = local_includes(copy.read_text(), copy.parent, [d / "kernel" / "include"])
    theirs = local_includes(source.read_text(), source.parent, [HARNESS_INCLUDE_DIR])
    assert sorted(ours.values()) == sorted(theirs.values()) and theirs, (sorted(ours), sorted(theirs))


def _data_copy(src: Path, dst: Path) -> Path:
    """The data files of a reproducer (not its binaries): the host program runs on them with --dir."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("repro", "repro_traced", "repro.o", "*.cubin", "kernel"))
    return dst


def _set_d(d: Path, values: torch.Tensor, dtype=torch.bfloat16) -> None:
    (d / "d.bin").write_bytes(values.to(dtype).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def _expected(d: Path, shape=(200, 136)) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(d / "expected.bin", dtype=np.float32).reshape(shape).copy())


@pytest.mark.nvcc
def test_make_builds_the_oracle_s_cubins(simple_build):
    from cuda_tools import cuobjdump, sass_by_function  # tests/ is on sys.path
    from harness.build import build_cubin

    for f in ("kernel.cubin", "kernel_traced.cubin", "repro", "repro_traced"):
        assert (simple_build / f).is_file(), f
    if cuobjdump() is None:
        pytest.skip("cuobjdump is needed to compare the SASS")
    src = SIMPLE.parent / "simple_gemm.cu"
    for cubin, defines in (("kernel.cubin", {}), ("kernel_traced.cubin", {"ORACLE_TRACE": "1"})):
        ours = sass_by_function(simple_build / cubin)
        oracle = sass_by_function(build_cubin(src, defines=defines).cubin_path)
        assert ours == oracle, cubin  # the same machine code the oracle's live run launches
    syms = _run([cuobjdump(), "-symbols", simple_build / "kernel_traced.cubin"]).stdout
    assert "simple_gemm_bf16_traced" in syms and "oracle_trace_sink" in syms


def test_make_compiles_the_host_program_once_for_both_builds(tmp_path):
    """`make host` compiles repro.cu once and links the object twice, with host/kind.cpp saying which
    entry points each program launches; a program copied in newer than its sources needs no object."""
    if shutil.which("make") is None:
        pytest.skip("This test needs make on PATH to read the Makefile, and it is not installed here.")
    d = tmp_path / "simple"
    assert cli.main(["repro", "--problem", str(SIMPLE), "--inputs", "ones", "--out", str(d)]) == 0
    dry = _run(["make", "-C", d, "-n", "repro", "repro_traced", "REPRO_NEEDS=", "TRACED_NEEDS=", "NVCC=nvcc"])
    assert dry.returncode == 0, dry.stderr
    lines = [x for x in dry.stdout.splitlines() if x.startswith("nvcc ")]
    assert [x for x in lines if "repro.cu" in x] == [
        "nvcc -std=c++17 -O2 -g -Ikernel/include -DORACLE_REPRO_KIND_LINKED -c -o repro.o repro.cu"]
    assert [x for x in lines if "repro.cu" not in x] == [
        f"nvcc -std=c++17 -O2 -g -DORACLE_REPRO_TRACED={t} -o {p} repro.o host/kind.cpp -ldl"
        for t, p in ((0, "repro"), (1, "repro_traced"))]
    for p in ("repro", "repro_traced"):
        (d / p).write_bytes(b"")  # newer than the sources, as host_from copies them in
    up_to_date = _run(["make", "-C", d, "-q", "repro", "repro_traced", "REPRO_NEEDS=", "TRACED_NEEDS="])
    assert up_to_date.returncode == 0, up_to_date.stdout + up_to_date.stderr


@pytest.mark.nvcc
def test_each_host_program_launches_its_own_entry_points(simple_build, tmp_path):
    """The two links of the one object (make host) announce their build and entry point, and only the
    traced one writes the sink's header (repro.cu compiled alone, as tests/gpu/test_repro_gpu.py's
    prebuilt programs are, takes its kind from ORACLE_REPRO_TRACED)."""
    for program, kind, entry in (("repro", "plain", "simple_gemm_bf16"),
                                 ("repro_traced", "traced", "simple_gemm_bf16_traced")):
        d = _data_copy(simple_build, tmp_path / program)
        proc = _run([simple_build / program, "--dir", d, "--dry-run"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f", {kind} build, entry {entry}\n" in proc.stdout, proc.stdout
        assert (d / "sink_init.bin").is_file() == (kind == "traced"), program


@pytest.mark.nvcc
def test_check_only_match_and_a_wrong_tile(simple_build, tmp_path):
    d = _data_copy(simple_build, tmp_path / "d")
    exp = _expected(d)
    _set_d(d, exp)
    proc = _run([simple_build / "repro", "--dir", d, "--check-only"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: MATCH" in proc.stdout and "the oracle's reference D" in proc.stdout
    bad = exp.clone()
    bad[70, 130] += 1.0  # 73 -> 74 in tile (1, 2): exact in bf16, far past the bound
    _set_d(d, bad)
    proc = _run([simple_build / "repro", "--dir", d, "--check-only"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "worst tile (1, 2)" in proc.stdout and "bad 1/512" in proc.stdout
    assert "first bad element: (70, 130) in tile (1, 2) [(6, 2) in the tile]: received 74, expected 73" in proc.stdout
    assert proc.stdout.rstrip().endswith("verdict: DIVERGED")


@pytest.mark.nvcc
def test_check_only_counts_nan_and_never_written(simple_build, tmp_path):
    d = _data_copy(simple_build, tmp_path / "d")
    exp = _expected(d)
    raw = bytearray(exp.to(torch.bfloat16).view(torch.uint8).numpy().tobytes())
    i = (5 * 136 + 5) * 2
    raw[i:i + 2] = b"\xc0\x7f"  # a quiet NaN (0x7fc0), not the poison's bits
    (d / "d.bin").write_bytes(bytes(raw))
    proc = _run([simple_build / "repro", "--check-only", "--dir", d])
    assert proc.returncode == 1 and "NaN r/e 1/0" in proc.stdout and "never written 0" in proc.stdout
    raw = bytearray(exp.to(torch.bfloat16).view(torch.uint8).numpy().tobytes())
    i = (199 * 136 + 135) * 2
    raw[i:i + 2] = b"\xff\xff"  # the poison, never overwritten
    (d / "d.bin").write_bytes(bytes(raw))
    proc = _run([simple_build / "repro", "--check-only", "--dir", d])
    assert proc.returncode == 1
    assert "worst tile (3, 2)" in proc.stdout and "never written 1" in proc.stdout
    assert "(199, 135) in tile (3, 2)" in proc.stdout and "never written: still the 0xFF poison" in proc.stdout


@pytest.mark.nvcc
def test_check_only_bit_exact_reference(simple_build, tmp_path):
    # zero bounds and an expected D in the output type: bits must match (so -0 is not +0)
    d = _data_copy(simple_build, tmp_path / "d")
    exp = _expected(d).to(torch.bfloat16)
    man = (d / "inputs.txt").read_text()
    man = man.replace("name=expected role=expected dtype=fp32 shape=200x136 bytes=108800",
                      "name=expected role=expected dtype=bf16 shape=200x136 bytes=54400")
    (d / "inputs.txt").write_text(man)
    zero = exp.clone()
    zero[0, 0] = 0.0
    (d / "expected.bin").write_bytes(zero.view(torch.uint8).numpy().tobytes())
    (d / "bound.bin").write_bytes(bytes(200 * 136 * 8))
    _set_d(d, zero)
    assert _run([simple_build / "repro", "--check-only", "--dir", d]).returncode == 0
    neg = zero.clone()
    neg[0, 0] = -0.0
    _set_d(d, neg)
    proc = _run([simple_build / "repro", "--check-only", "--dir", d])
    assert proc.returncode == 1 and "first bad element: (0, 0)" in proc.stdout


@pytest.mark.nvcc
def test_check_only_own_host_reference_and_bad_files(simple_build, tmp_path):
    d = _data_copy(simple_build, tmp_path / "d")
    exp = _expected(d)
    _set_d(d, exp)
    (d / "expected.bin").unlink()
    (d / "bound.bin").unlink()
    proc = _run([simple_build / "repro", "--check-only", "--dir", d])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "own double-precision host reference" in proc.stdout
    bad = exp.clone()
    bad[64:128, 0:64] *= 1.5  # a whole tile 1.5x too large
    _set_d(d, bad)
    proc = _run([simple_build / "repro", "--check-only", "--dir", d])
    assert proc.returncode == 1 and "bad elements 4096 in 1 of 12 tiles" in proc.stdout
    (d / "d.bin").write_bytes(b"\0" * 10)
    proc = _run([simple_build / "repro", "--check-only", "--dir", d])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "d.bin has 10 bytes" in proc.stderr
    proc = _run([simple_build / "repro", "--check-only", "--bogus"])
    assert proc.returncode == 2 and "unknown option --bogus" in proc.stderr


HOST_REFERENCE_CASES = [
    ("simple_gemm", SIMPLE, {"m": 70, "n": 72, "k": 200}),
    ("sm80_c_bias_gelu", ROOT / "zoo" / "sm80_gemm" / "sm80_gemm.toml", {"m": 40, "n": 24, "k": 104}),
    ("hopper_fp16", HOPPER / "hopper_gemm.toml",
     {"m": 40, "n": 24, "k": 96, "a_dtype": "fp16", "b_dtype": "fp16"}),
    ("e4m3_tensor", HOPPER / "hopper_gemm_e4m3.toml", {"m": 40, "n": 24, "k": 256}),
    ("e4m3_rowcol", HOPPER / "hopper_gemm_e4m3.toml",
     {"m": 40, "n": 24, "k": 256, "scale_a": {"kind": "row"}, "scale_b": {"kind": "col"}}),
    ("e4m3_block", HOPPER / "hopper_gemm_e4m3.toml",
     {"m": 40, "n": 24, "k": 256, "scale_a": {"kind": "block", "block": [1, 128]},
      "scale_b": {"kind": "block", "block": [128, 128]}}),
    ("e4m3_out_saturating", HOPPER / "hopper_gemm_e4m3.toml",
     {"m": 40, "n": 24, "k": 256, "out_dtype": "e4m3", "saturate": True, "alpha": 96.0}),
    ("splitk_serial", SPLIT / "splitk_serial.toml", {"m": 40, "n": 72, "k": 256, "splits": 3}),
    ("streamk", SPLIT / "streamk.toml", {"m": 70, "n": 72, "k": 256, "stream_k_workers": 3}),
    ("grouped", SPLIT / "grouped.toml", {"m": 218, "n": 136, "k": 64, "groups": [40, 0, 100, 8, 70]}),
    ("grouped_b_col", SPLIT / "grouped.toml",
     {"m": 218, "n": 136, "k": 64, "groups": [40, 0, 100, 8, 70], "b_major": "col"}),
    ("batched", SPLIT / "grouped.toml", {"m": 70, "n": 136, "k": 64, "batch": 3, "groups": None}),
]


@pytest.mark.nvcc
@pytest.mark.parametrize("name, case_file, problem", HOST_REFERENCE_CASES, ids=[c[0] for c in HOST_REFERENCE_CASES])
def test_own_host_reference_agrees_with_the_oracle(simple_build, tmp_path, name, case_file, problem):
    from kernels_ref.dtypes import DTYPES

    case = load_case(str(case_file), problem)
    s = case.spec
    out, ops = _write(case, "random", 7, tmp_path / name)
    y, _ = expected_output(s, ops)
    want = y.to(DTYPES[s.out_dtype].torch)
    _set_d(out.path, want, want.dtype)
    proc = _run([simple_build / "repro", "--dir", out.path, "--check-only", "--host-reference"])
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the oracle's D is inside the host bound
    assert "own double-precision host reference" in proc.stdout
    bad = want.float().clone()
    v, top = float(bad[s.m - 1, s.n - 1]), float(bad.abs().max()) + 1
    bad[s.m - 1, s.n - 1] = -(abs(v) + top) if v >= 0 else abs(v) + top  # another sign, far off
    _set_d(out.path, bad, want.dtype)
    proc = _run([simple_build / "repro", "--dir", out.path, "--check-only", "--host-reference"])
    assert proc.returncode == 1 and f"first bad element: ({s.m - 1}, {s.n - 1})" in proc.stdout, proc.stdout


@pytest.mark.nvcc
def test_check_only_judges_a_grouped_d_group_by_group(simple_build, tmp_path):
    case = _zoo_case("grouped_correct", {"m": 218, "n": 136, "k": 64, "groups": [40, 0, 100, 8, 70]})
    out, _ = _write(case, "random", 1, tmp_path / "g")
    exp = _expected(out.path, (218, 136))
    _set_d(out.path, exp)
    proc = _run([simple_build / "repro", "--dir", out.path, "--check-only"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "218 x 136 bf16 (row-major) in 5 groups of 40, 0, 100, 8, 70 rows, 18 tiles of 64 x 64" in proc.stdout
    assert "group 1 (empty): nothing to compare" in proc.stdout and "verdict: MATCH" in proc.stdout
    bad = exp.clone()
    bad[150, 70] += 64.0  # row 2 of group 4 (rows 148..217): its tile (0, 1)
    _set_d(out.path, bad)
    proc = _run([simple_build / "repro", "--dir", out.path, "--check-only"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "worst tile (0, 1) of group 4" in proc.stdout
    assert "group 4 (rows 148..217): bad elements 1 in 1 of 6 tiles" in proc.stdout
    assert "group 2 (rows 40..139): bad elements 0 in 0 of 6 tiles" in proc.stdout
    assert "first bad element: (150, 70) in tile (0, 1) of group 4 [(2, 6) in the tile; row 2 of the group]" \
        in proc.stdout


@pytest.mark.nvcc
def test_the_two_launch_reproducer_builds_traced_and_packs_both_launches(simple_build, tmp_path):
    """split_gemm.cu, every variant of the source: the Makefile's nvcc line is the oracle's own build
    (checked with make -n), so the cubin is that build, shared with tests/cpu/test_zoo_build_split.py
    through the oracle's build cache and copied in through KERNEL_TRACED_CUBIN_FROM; the host program
    is the session's (host_from)."""
    from cuda_tools import cuobjdump, zoo_build

    d = tmp_path / "atomic"
    assert cli.main(["repro", "--problem", str(SPLIT / "splitk_atomic.toml"), "--inputs", "random:1",
                     "--out", str(d)]) == 0
    traced = zoo_build(SPLIT / "split_gemm.cu", traced=True)
    _make_line_is_the_oracle_s_build(d, "kernel_traced.cubin", SPLIT / "split_gemm.cu", traced.command)
    host_from(simple_build, d, "repro_traced")
    _make(d, "TRACE=1", f"KERNEL_TRACED_CUBIN_FROM={traced.cubin_path}")
    if cuobjdump():
        syms = _run([cuobjdump(), "-symbols", d / "kernel_traced.cubin"]).stdout
        for name in ("zoo_splitk_atomic_partials_traced", "zoo_splitk_atomic_reduce_traced", "oracle_trace_sink"):
            assert name in syms, name
    proc = _run([d / "repro_traced", "--dry-run"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 launches in order: zoo_splitk_atomic_partials_traced,zoo_splitk_atomic_reduce_traced" in proc.stdout
    assert "launch 1 (zoo_splitk_atomic_reduce_traced): grid (2, 1, 1), block (256, 1, 1)" in proc.stdout
    case = load_case(str(SPLIT / "splitk_atomic.toml"))
    sequence, _ = launch_sequence(case, make_operands(case.spec, "random", 1))
    printed, current = [], None
    for line in proc.stdout.splitlines():
        m = re.match(r"^launch (\d+) entry (\S+)$", line)
        if m:
            current = {}
            printed.append((m.group(2), current))
        m = re.match(r"^arg (\d+) (.+)$", line)
        if m:
            current[int(m.group(1))] = m.group(2)
    assert [e for e, _ in printed] == [e for e, _ in sequence]
    for (_, args), (_, launch) in zip(printed, sequence):
        assert len(args) == len(launch.args)
        for i, a in enumerate(launch.args):
            assert args[i] == (f"ptr {a.name}" if isinstance(a, TensorArg) else f"bytes {a.to_bytes().hex()}"), i
    want = sink_init_bytes(sink_bytes(case), tiles=[(0, 0), (0, 1)], k_blocks=None)
    assert (d / "sink_init.bin").read_bytes() == want[:HEADER_BYTES]


@pytest.mark.nvcc
def test_dry_run_packs_the_harness_s_argument_bytes_and_sink_header(simple_build, tmp_path):
    case = with_trace(load_case(str(HOPPER / "hopper_gemm_n16.toml"), {"m": 128, "n": 8, "k": 256}),
                      tiles=((0, 0),), k_blocks=(1, 3))
    out, ops = _write(case, "random", 2, tmp_path / "n16")
    launch, _ = launch_spec(case, ops)
    proc = _run([simple_build / "repro_traced", "--dir", out.path, "--dry-run"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = dict(re.findall(r"^arg (\d+) (.+)$", proc.stdout, re.M))
    assert len(printed) == len(launch.args)
    for i, a in enumerate(launch.args):
        if isinstance(a, ScalarArg):
            assert printed[str(i)] == f"bytes {a.to_bytes().hex()}", i
        elif isinstance(a, TensorArg):
            assert printed[str(i)] == f"ptr {a.name}"
        else:
            assert printed[str(i)].startswith("tensormap ")
    header = (out.path / "sink_init.bin").read_bytes()
    want = sink_init_bytes(sink_bytes(case), tiles=[(0, 0)], k_blocks=[1, 3])
    assert header == want[:HEADER_BYTES]
    h = parse_header(header)
    assert h.selection.tiles == ((0, 0),) and h.selection.k_blocks == (1, 3)


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.every_build
def test_a_hopper_descriptor_defect_builds_traced(hopper_builds, simple_build, tmp_path):
    """The CuTe Hopper GEMM: the Makefile's nvcc line is the oracle's own build (checked with make -n);
    the cubin is the session's traced build of the same source (tests/conftest.py: shared with
    tests/cpu/test_zoo_build.py, a CuTe build takes minutes on two cores), copied in through
    KERNEL_TRACED_CUBIN_FROM; the host program is the session's (host_from)."""
    from cuda_tools import cuobjdump

    d = tmp_path / "wrong_stride"
    assert cli.main(["repro", "--problem", str(HOPPER / "defects" / "wrong_stride.toml"), "--problem",
                     "m=40,n=24,k=96", "--inputs", "random:1", "--out", str(d)]) == 0
    _make_line_is_the_oracle_s_build(d, "kernel_traced.cubin", HOPPER / "hopper_gemm.cu",
                                     hopper_builds["traced"].command)
    host_from(simple_build, d, "repro_traced")
    _make(d, "TRACE=1", f"KERNEL_TRACED_CUBIN_FROM={hopper_builds['traced'].cubin_path}")
    assert (d / "kernel_traced.cubin").is_file()  # repro_traced is the session's, copied in by host_from
    if cuobjdump():
        syms = _run([cuobjdump(), "-symbols", d / "kernel_traced.cubin"]).stdout
        assert "zoo_hopper_bf16_traced" in syms and "oracle_trace_sink" in syms
    proc = _run([d / "repro_traced", "--dry-run"])  # its own directory by default
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tensormap 0 over a (operand a, bf16): data type BFLOAT16 (9), rank 2, dims [96, 40], strides [64] bytes" \
        in proc.stdout  # (k - 64) * 2 bytes: the planted stride
    assert "dynamic shared memory 133120 bytes" in proc.stdout


def test_a_group_selection_reaches_launch_txt_and_a_single_gemm_refuses_one(tmp_path):
    grouped = ROOT / "zoo" / "split_gemm" / "grouped.toml"
    out = tmp_path / "g"
    assert cli.main(["repro", "--problem", str(grouped), "--inputs", "ones", "--trace-groups", "3,1",
                     "--out", str(out)]) == 0
    assert _single(out, "trace_groups") == ["1", "3"]
    assert json.loads((out / "repro.json").read_text())["trace"]["groups"] == [1, 3]
    assert cli.main(["repro", "--problem", str(SIMPLE), "--trace-groups", "0", "--out", str(tmp_path / "s")]) == 2

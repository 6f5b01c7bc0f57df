"""Every size is bounded before anything is computed or allocated from it: the partition's
workers, batch and groups, workspaces, operands (against the address-space limit too), taps,
sinks and gzip dumps (header first). Each test runs under a time limit (signal.alarm, or a child
process with a timeout and an address-space limit), so a regression fails instead of hanging."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest

from harness import budget
from harness.dump import DumpError, load_dump
from oracle.tools import cli
from oracle.run import launch, live
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.problem.spec import MAX_GROUPS, MAX_STREAM_K_WORKERS, ProblemSpec, SpecError
from time_limits import deadline  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]
SIMPLE = ROOT / "harness" / "examples" / "simple_gemm.toml"
BASE = SIMPLE.read_text().replace('source = "simple_gemm.cu"', f'source = "{SIMPLE.parent / "simple_gemm.cu"}"')


def _child(code: str, as_gib: float = 4.0, timeout: float = 240, env: dict | None = None):
    """Run `code` in a fresh interpreter under an address-space limit and a time limit."""
    limit = int(as_gib * 2**30)

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    full = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1", **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limits, env=full, cwd=str(ROOT))


# -- stream-K workers, batch, groups ---------------------------------------------------------
def test_stream_k_workers_past_the_maximum_is_refused_at_once_from_the_api():
    with deadline(10), pytest.raises(SpecError, match=rf"stream_k_workers=2147483648 .*at most {MAX_STREAM_K_WORKERS}"):
        ProblemSpec(m=256, n=256, k=256, stream_k_workers=2**31)


def test_stream_k_workers_past_the_maximum_is_refused_at_once_from_toml(tmp_path):
    case = tmp_path / "c.toml"
    case.write_text(BASE.replace("[problem]\n", "[problem]\nstream_k_workers = 2147483648\n"))
    with deadline(10), pytest.raises(CaseError, match="stream_k_workers=2147483648"):
        load_case(str(case), allow_outside_case_dir=True)


def test_stream_k_workers_past_the_maximum_is_refused_at_once_from_set(capsys, monkeypatch):
    monkeypatch.setattr(live, "build_cubin", lambda *a, **k: pytest.fail("the build was reached"))
    with deadline(20):
        code = cli.main(["compare", "--problem", str(SIMPLE), "--inputs", "ones", "--set",
                         "stream_k_workers=2147483648"])
    err = capsys.readouterr().err
    assert code == 2 and "stream_k_workers=2147483648" in err and "Traceback" not in err, err


def test_the_most_stream_k_workers_still_partition_quickly():
    from oracle.problem.partition import tile_partials

    spec = ProblemSpec(m=256, n=256, k=256, tile=ProblemSpec(m=1, n=1, k=1).tile, stream_k_workers=MAX_STREAM_K_WORKERS)
    with deadline(30):
        parts = [tile_partials(spec, (tm, tn)) for tm in range(spec.tiles_m) for tn in range(spec.tiles_n)]
    assert sum(p.kb_end - p.kb_begin for ps in parts for p in ps) == spec.tiles_m * spec.tiles_n * spec.k_blocks


def test_a_huge_batch_is_refused_before_any_tuple_is_built():
    with deadline(10), pytest.raises(SpecError, match=rf"batch=2147483648 .*at most {MAX_GROUPS}"):
        ProblemSpec(m=8, n=8, k=8, batch=2**31)
    with deadline(10), pytest.raises(SpecError, match="int32 size"):
        ProblemSpec(m=2**20, n=8, k=8, batch=4096)


def test_too_many_groups_are_refused_from_the_api_and_from_json():
    sizes = [1] * (MAX_GROUPS + 1)
    with deadline(10), pytest.raises(SpecError, match=f"at most {MAX_GROUPS} group sizes"):
        ProblemSpec(m=len(sizes), n=8, k=8, groups=tuple(sizes))
    with deadline(10), pytest.raises(SpecError, match=f"at most {MAX_GROUPS} group sizes"):
        ProblemSpec.from_json({"m": len(sizes), "n": 8, "k": 8, "groups": sizes})


@pytest.mark.parametrize("field", ["m", "n", "k"])
def test_a_size_past_int32_is_refused(field):
    kw = {"m": 64, "n": 64, "k": 64, field: 2**31}
    with pytest.raises(SpecError, match=f"{field}=2147483648 is not allowed"):
        ProblemSpec(**kw)


# -- workspaces and operands against one budget ----------------------------------------------
def _need_memory(gib: int) -> None:
    phys = budget.physical_memory()
    if phys is None or phys.bytes < gib << 30:
        pytest.skip(f"the machine has less than {gib} GiB of memory: its own limit would refuse the request first")


def test_a_workspace_is_checked_against_the_budget_before_allocation(tmp_path):
    _need_memory(10)
    case = tmp_path / "ws.toml"
    case.write_text(BASE + '\n[workspace.big]\nbytes = 8589934592\n')
    r = _child(f"""
        from oracle.run.case import load_case, CaseError
        from oracle.run.launch import launch_sequence
        case = load_case({str(case)!r}, allow_outside_case_dir=True)
        try:
            launch_sequence(case, None)
        except CaseError as e:
            print("REFUSED", e)
        else:
            print("ACCEPTED")
    """, env={"ORACLE_MAX_OPERAND_MB": str(1 << 20)})
    assert "REFUSED" in r.stdout and "workspaces (big 8589934592 bytes)" in r.stdout, r.stdout + r.stderr
    assert "RLIMIT_AS" in r.stdout, r.stdout


def test_a_workspace_counts_with_the_operands_against_the_knob(tmp_path, monkeypatch):
    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", "1")
    case = tmp_path / "ws.toml"
    case.write_text(BASE + '\n[workspace.big]\nbytes = 1048576\n')
    with pytest.raises(CaseError, match="the 1 MiB limit of ORACLE_MAX_OPERAND_MB"):
        launch.launch_sequence(load_case(str(case), allow_outside_case_dir=True), None)


def test_operands_are_checked_against_the_address_space_limit():
    _need_memory(8)
    r = _child("""
        from oracle.run.inputs import InputError, check_problem_size
        from oracle.problem.spec import ProblemSpec
        spec = ProblemSpec(m=73728, n=32768, k=64)   # D alone takes 4.5 GiB, less than the machine has
        try:
            check_problem_size(spec)
        except InputError as e:
            print("REFUSED", e)
        else:
            print("ACCEPTED")
    """)
    assert "REFUSED" in r.stdout and "RLIMIT_AS" in r.stdout, r.stdout + r.stderr


def test_the_budget_names_every_limit_it_applies(monkeypatch):
    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match=r"X takes 2\.0 MiB, more than the knob: go"):
        budget.require(2 << 20, "X", Refused, knob=budget.Limit(1 << 20, "the knob"), advice="go")
    monkeypatch.setattr(budget, "device_limits", lambda: (budget.Limit(10, "the 10 bytes free on the GPU"),))
    with pytest.raises(Refused, match="the 10 bytes free on the GPU"):
        budget.require(11, "Y", Refused, host=False, device=True)
    budget.require(11, "Y", Refused, host=False)  # no device asked: the device's limit does not apply
    if budget.address_space() is None:
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY


# -- taps and sinks --------------------------------------------------------------------------
def test_a_small_trace_claiming_a_huge_tile_is_refused_before_allocating():
    r = _child("""
        import time
        from harness.trace_format import TraceWriter, TraceLimitError, parse_trace
        w = TraceWriter(1024)
        w.elements("mma", (0, 0), [0], [0], [1.0], shape=(32768, 32768), dtype="fp32")
        buf = w.to_bytes()
        t0 = time.time()
        try:
            parse_trace(buf, block_m=32768, block_n=32768, block_k=64)
        except TraceLimitError as e:
            print("REFUSED", len(buf), round(time.time() - t0, 2), e)
        else:
            print("ACCEPTED")
    """)
    assert "REFUSED 1024" in r.stdout and "claim a 32768x32768 tap" in r.stdout, r.stdout + r.stderr


def test_a_sparse_tap_of_a_real_tile_is_still_assembled():
    from harness.trace_format import TraceWriter, parse_trace

    w = TraceWriter(4096)
    w.elements("mma", (0, 0), [0, 5], [0, 7], [1.0, 2.0], shape=(256, 256), dtype="fp32")
    tap, = parse_trace(w.to_bytes(), block_m=256, block_n=256, block_k=64).taps
    assert tap.values.shape == (256, 256) and int(tap.mask.sum()) == 2


def test_a_sink_with_a_bad_header_is_not_read_whole(tmp_path):
    from harness.runner import _read_sink
    from harness.trace_format import HEADER_BYTES

    p = tmp_path / "sink.bin"
    with open(p, "wb") as f:
        f.write(b"NOPE" * 64)
        f.truncate(256 << 20)  # sparse: 256 MiB a reader must not take in
    tracemalloc.start()
    try:
        data = _read_sink(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data) <= HEADER_BYTES and peak < 16 << 20


# -- dumps: header first ---------------------------------------------------------------------
def _gzip(path: Path, head: bytes, zeros: int) -> None:
    c = zlib.compressobj(1, zlib.DEFLATED, 31)  # level 1: the same bytes inflated, made in a quarter of the time
    chunk = bytes(1 << 20)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(zeros >> 20):
            f.write(c.compress(chunk))
        f.write(c.flush())


def _load_measured(path: Path):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with deadline(60), pytest.raises(DumpError) as e:
            load_dump(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return str(e.value), peak, time.perf_counter() - t0


def test_a_gzip_of_zeros_is_refused_from_its_first_bytes_at_the_default_limit(tmp_path):
    p = tmp_path / "zeros.safetensors.gz"
    _gzip(p, b"", 1 << 30)
    message, peak, took = _load_measured(p)
    assert "the safetensors header is not valid JSON" in message and peak < 32 << 20 and took < 10, (message, peak)


def test_a_gzip_whose_header_claims_past_the_limit_is_refused_before_its_body(tmp_path, monkeypatch):
    monkeypatch.setenv("ORACLE_DUMP_MAX_MB", "256")
    header = json.dumps({"x": {"dtype": "U8", "shape": [512 << 20], "data_offsets": [0, 512 << 20]}}).encode()
    p = tmp_path / "claim.safetensors.gz"
    _gzip(p, struct.pack("<Q", len(header)) + header, 512 << 20)
    message, peak, took = _load_measured(p)
    assert "more than the 256 MiB limit of ORACLE_DUMP_MAX_MB" in message and peak < 32 << 20, (message, peak)


# the document a dump's header carries (oracle.dump), read before its data
_DOC = {"__metadata__": {"oracle.dump": json.dumps({"format": "oracle-dump", "version": 1, "meta": {}, "taps": [],
                                                    "descriptors": []})}}


def test_a_gzip_with_bytes_after_its_tensors_is_refused(tmp_path):
    header = json.dumps({**_DOC, "input.x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    p = tmp_path / "tail.safetensors.gz"
    _gzip(p, struct.pack("<Q", len(header)) + header + b"abcd" + b"junk", 0)
    message, _, _ = _load_measured(p)
    assert "bytes after the 4 data bytes" in message, message


def test_a_truncated_gzip_body_is_named(tmp_path):
    header = json.dumps({**_DOC, "input.x": {"dtype": "U8", "shape": [4096], "data_offsets": [0, 4096]}}).encode()
    p = tmp_path / "short.safetensors.gz"
    _gzip(p, struct.pack("<Q", len(header)) + header + b"ab", 0)
    message, _, _ = _load_measured(p)
    assert "the stream ends 4094 bytes into the 4096 data bytes" in message, message


# -- the partition of a huge split problem is sized before it is walked ------------------------
@pytest.mark.parametrize("case", ["splitk_serial.toml", "streamk.toml"])
def test_a_huge_split_problem_is_refused_at_once_from_set(capsys, monkeypatch, case):
    monkeypatch.setattr(live, "build_cubin", lambda *a, **k: pytest.fail("the build was reached"))
    with deadline(30):
        code = cli.main(["compare", "--problem", str(ROOT / "zoo" / "split_gemm" / case), "--set",
                         "m=2000000,n=2000000"])
    err = capsys.readouterr().err
    assert code == 2 and "ORACLE_MAX_OPERAND_MB" in err and "Traceback" not in err, err


def test_the_most_partials_of_any_tile_agrees_with_every_tile_s_partition():
    import random

    from oracle.problem.partition import max_partials, rules_for, tile_partials
    from oracle.problem.spec import Tile

    rng = random.Random(7)
    for _ in range(150):
        m, n, k = rng.randint(1, 300), rng.randint(1, 300), rng.randint(1, 600)
        tile = Tile(rng.choice([16, 32, 64]), rng.choice([16, 32, 64]), rng.choice([8, 16, 32]))
        split = dict(stream_k_workers=rng.randint(1, 200)) if rng.random() < 0.6 else \
            dict(splits=rng.randint(1, -(-k // tile.bk)))
        base = ProblemSpec(m=m, n=n, k=k, tile=tile, **split)
        for rule in (rules_for(base) if base.partitioned else (None,)):
            spec = ProblemSpec(m=m, n=n, k=k, tile=tile, partition=rule, **split) if rule else base
            every = max(len(tile_partials(spec, (tm, tn))) for tm in range(spec.tiles_m) for tn in range(spec.tiles_n))
            assert max_partials(spec) == every, (spec.describe(), rule)


def test_the_most_partials_of_a_million_tiles_is_found_without_visiting_them():
    from oracle.problem.partition import max_partials
    from oracle.problem.spec import Tile

    spec = ProblemSpec(m=1 << 20, n=1 << 20, k=4096, tile=Tile(16, 16, 16), stream_k_workers=1000)
    with deadline(10):
        assert max_partials(spec) >= 2


def test_splits_past_the_maximum_are_refused_at_once():
    from oracle.problem.spec import MAX_SPLITS, Tile

    with deadline(10), pytest.raises(SpecError, match=rf"splits=2147483647 .*at most {MAX_SPLITS}"):
        ProblemSpec(m=8, n=8, k=2**31 - 1, tile=Tile(8, 8, 1), splits=2**31 - 1)


# -- the bounded reader costs the file's size, not its limit -----------------------------------
def test_a_small_file_is_read_under_a_tight_address_space_limit_whatever_the_read_limit(tmp_path):
    p = tmp_path / "small.bin"
    p.write_bytes(bytes(range(100)))
    r = _child(f"""
        import resource
        from harness.files import read_bounded
        class Refused(Exception):
            pass
        soft = 1 << 30
        resource.setrlimit(resource.RLIMIT_AS, (soft, soft))
        try:
            data = read_bounded({str(p)!r}, "small", 4 << 30, "4 GiB", Refused)
        except MemoryError:
            print("MEMORYERROR")
        else:
            print("READ", len(data), data == bytes(range(100)))
    """, as_gib=8.0)
    assert "READ 100 True" in r.stdout, r.stdout + r.stderr


def test_a_file_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    from harness.files import read_bounded

    class Refused(Exception):
        pass

    p = tmp_path / "fifo"
    os.mkfifo(p)
    with deadline(10), pytest.raises(Refused, match="not a regular file"):
        read_bounded(p, "fifo", 1 << 20, "1 MiB", Refused)


# -- the reproducer's host program: every file regular and of the size the problem implies -------
@pytest.fixture(scope="module")
def host_programs(tmp_path_factory):
    """A reproducer of simple_gemm with the session's one build of repro and repro_traced beside it
    (tests/host_programs.py); each test mutates a copy of the folder."""
    from host_programs import host_from, shared_host_programs  # tests/ is on sys.path
    from oracle.repro.generate import write_repro
    from oracle.run.inputs import Provenance, make_operands

    shared = shared_host_programs(tmp_path_factory)
    d = tmp_path_factory.mktemp("bounds_host") / "r"
    case = load_case(str(SIMPLE))
    write_repro(case, make_operands(case.spec, "ones", 0), Provenance("ones", None), d)
    host_from(shared, d, "repro", "repro_traced")
    for p in ("repro", "repro_traced"):
        (d / p).rename(d.parent / p)  # beside the reproducer, not in it: the tests copy its folder
    return d, d.parent / "repro", d.parent / "repro_traced"


def _mutated(src: Path, dst: Path, edit) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("kernel"))
    (dst / "d.bin").write_bytes(bytes(200 * 136 * 2))  # a D of the right size for --check-only
    edit(dst)
    return dst


def _edit_text(name: str, old: str, new: str):
    def edit(d: Path) -> None:
        text = (d / name).read_text()
        assert old in text, (name, old)
        (d / name).write_text(text.replace(old, new, 1))
    return edit


def _run_host(exe: Path, d: Path, *flags: str, limit_gib: float = 2.0) -> subprocess.CompletedProcess:
    limit = int(limit_gib * 2**30)
    return subprocess.run([str(exe), "--dir", str(d), *flags], capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))


def _short_a(d: Path) -> None:
    _edit_text("inputs.txt", "shape=200x72 bytes=28800 file=a.bin logical=200x72",
               "shape=200x8 bytes=3200 file=a.bin logical=200x8")(d)
    (d / "a.bin").write_bytes((d / "a.bin").read_bytes()[:3200])


def _fifo_a(d: Path) -> None:
    (d / "a.bin").unlink()
    os.mkfifo(d / "a.bin")


@pytest.mark.nvcc
@pytest.mark.parametrize("edit, flags, message", [
    (_edit_text("problem.txt", "\nk 72\n", "\nk 2147483648\n"), ("--check-only", "--host-reference"),
     "k 2147483648 must be 1..2147483647"),
    (_edit_text("problem.txt", "\nk 72\n", "\nk 2147483647\n"), ("--check-only", "--host-reference"),
     "a is 200x72 (logical) but problem.txt's"),
    (_short_a, ("--check-only", "--host-reference"), "a is 200x8 (logical) but problem.txt's"),
    (_short_a, ("--dry-run",), "a is 200x8 (logical) but problem.txt's"),
    (_edit_text("inputs.txt", "shape=200x72 bytes=28800", "shape=200x8 bytes=3200"), ("--dry-run",),
     "the logical shape does not fit in the stored shape"),
    (_edit_text("inputs.txt", "shape=200x72 bytes=28800", "shape=4294967296x4294967296 bytes=28800"), ("--dry-run",),
     "passes a 64-bit size"),
    (_edit_text("problem.txt", "tile 64 64 16", "tile 64 64 4294967312"), ("--dry-run",), "tile extent 4294967312"),
    (_fifo_a, ("--dry-run",), "a.bin (a: 28800 bytes of bf16) is not a regular file"),
    (_fifo_a, ("--check-only", "--host-reference"), "is not a regular file"),
])
def test_the_host_program_refuses_files_that_disagree_with_the_problem(host_programs, tmp_path, edit, flags, message):
    d, repro, traced = host_programs
    bad = _mutated(d, tmp_path / "bad", edit)
    proc = _run_host(traced if "--dry-run" in flags else repro, bad, *flags)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and message in out and "error: " in out, (proc.returncode, out)


@pytest.mark.nvcc
def test_a_fifo_in_place_of_the_problem_text_is_refused_without_waiting(host_programs, tmp_path):
    d, repro, _ = host_programs

    def edit(x: Path) -> None:
        (x / "problem.txt").unlink()
        os.mkfifo(x / "problem.txt")
    proc = _run_host(repro, _mutated(d, tmp_path / "bad", edit), "--check-only")
    assert proc.returncode == 2 and "problem.txt" in proc.stderr and "not a regular file" in proc.stderr, proc.stderr


@pytest.mark.nvcc
def test_a_dry_run_with_a_huge_trace_capacity_allocates_only_the_header(host_programs, tmp_path):
    d, _, traced = host_programs

    def edit(x: Path) -> None:
        text = (x / "launch.txt").read_text()
        line = next(w for w in text.splitlines() if w.startswith("trace_capacity_bytes "))
        (x / "launch.txt").write_text(text.replace(line, "trace_capacity_bytes 3150000128"))
    bad = _mutated(d, tmp_path / "cap", edit)
    proc = _run_host(traced, bad, "--dry-run", limit_gib=1.0)
    assert proc.returncode == 0 and "wrote sink_init.bin" in proc.stdout, (proc.returncode, proc.stdout + proc.stderr)
    assert (bad / "sink_init.bin").stat().st_size < 1 << 20


@pytest.mark.nvcc
def test_the_host_program_still_reads_a_clean_folder(host_programs, tmp_path):
    d, repro, traced = host_programs
    ok = _mutated(d, tmp_path / "ok", lambda x: None)
    assert _run_host(traced, ok, "--dry-run").returncode == 0
    proc = _run_host(repro, ok, "--check-only", "--host-reference")
    assert proc.returncode == 1 and "verdict: DIVERGED" in proc.stdout, proc.stdout + proc.stderr  # D is all zero


# -- the draws that make the inputs, and a reproducer's reference D, count against the budget ---
def test_the_float64_draws_of_a_quantised_a_count_against_the_knob(monkeypatch):
    from oracle.problem.spec import Tile
    from oracle.run.inputs import InputError, make_operands, operand_bytes

    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", "8")
    spec = ProblemSpec(2048, 16, 2048, a_dtype="int4", b_dtype="fp16", out_dtype="fp16", a_packing="k_pairs_low_first",
                       a_group_size=32, a_scales="fp16", a_zeros="int", tile=Tile(32, 16, 32))
    assert operand_bytes(spec) < 8 << 20  # the operands alone fit: only the draws pass the limit
    with deadline(20), pytest.raises(InputError, match=r"with the draws that make them .*the 8 MiB limit of "
                                                       r"ORACLE_MAX_OPERAND_MB"):
        make_operands(spec, "random", 0)


def test_the_draws_of_a_plain_problem_count_against_the_knob(monkeypatch):
    from oracle.run.inputs import InputError, make_operands, operand_bytes

    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", "5")
    spec = ProblemSpec(m=64, n=64, k=16384)  # bf16 A and B: 4 MiB; their float64 draws: 16 MiB
    assert operand_bytes(spec) <= 5 << 20
    with deadline(20), pytest.raises(InputError, match="with the draws that make them"):
        make_operands(spec, "random", 0)
    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", "64")
    assert make_operands(spec, "random", 0).a.shape == (64, 16384)


def test_a_reproducer_s_reference_d_counts_against_the_knob_before_it_is_made(tmp_path, monkeypatch):
    import oracle.judging.differential as differential
    from oracle.repro.generate import write_repro
    from oracle.run.inputs import InputError, Provenance, make_operands, operand_bytes

    case = load_case(str(SIMPLE), {"m": 2048, "n": 2048, "k": 16})
    ops = make_operands(case.spec, "ones", 0)
    assert operand_bytes(case.spec) < 16 << 20
    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", "64")  # the operands fit; the reference D (32 B an element) does not
    monkeypatch.setattr(differential, "expected_output", lambda *a, **k: pytest.fail("the reference D was made"))
    with deadline(30), pytest.raises(InputError, match=r"reference D and its per-element bound .*the 64 MiB limit"):
        write_repro(case, ops, Provenance("ones", None), tmp_path / "r")
    assert not (tmp_path / "r").exists()


def _dump_claiming(tmp_path: Path, edit) -> Path:
    """A gzip dump of a real recording whose header `edit` changes (name -> (dtype, shape)), its data zeros."""
    import torch

    import oracle
    from harness import _tensorio
    from harness.dump import META_KEY
    from safetensors import safe_open

    a = torch.ones(64, 32, dtype=torch.bfloat16)
    b = torch.ones(32, 48, dtype=torch.bfloat16)
    src = tmp_path / "real.safetensors"
    oracle.check(a, b, (a.float() @ b.float()).bfloat16()).recording.save(str(src))
    with safe_open(str(src), framework="pt") as f:
        meta = f.metadata()
        entries = {k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()}
    edit(entries)
    head, laid = _tensorio.layout(((k, d, s) for k, (d, s) in entries.items()), {META_KEY: meta[META_KEY]})
    size = sum(e.nbytes for e in laid)
    p = tmp_path / "claim.safetensors.gz"
    c = zlib.compressobj(1, zlib.DEFLATED, 31)  # level 1, as _gzip
    chunk = bytes(1 << 20)
    with open(p, "wb") as out:
        out.write(c.compress(head))
        for at in range(0, size, len(chunk)):
            out.write(c.compress(chunk[:min(len(chunk), size - at)]))
        out.write(c.flush())
    return p


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.update({"input.a": ("BF16", [64, 4 << 20])}),
     "is inconsistent: operand 'a' has shape [64, 4194304], the problem needs [64, 32]"),
    (lambda e: e.update({"output.d": ("BF16", [4 << 20, 64])}), "is inconsistent: output D is torch.bfloat16"),
    (lambda e: e.update({"input.zz": ("U8", [512 << 20])}), "unknown input tensor(s)"),
    (lambda e: e.update({"stray": ("U8", [512 << 20])}), "are not described by the metadata"),
])
def test_a_gzip_dump_whose_tensors_disagree_with_its_metadata_is_refused_before_its_body(tmp_path, edit, message):
    from oracle.run.recording import Recording

    p = _dump_claiming(tmp_path, edit)
    tracemalloc.start()
    try:
        with deadline(60), pytest.raises(DumpError) as e:
            Recording.load(str(p))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message in str(e.value) and peak < 32 << 20, (str(e.value), peak)


def test_a_plain_dump_is_checked_from_its_header_before_a_tensor_is_read(tmp_path, monkeypatch):
    import gzip

    import safetensors

    from oracle.run.recording import Recording

    gz = _dump_claiming(tmp_path, lambda e: e.update({"input.a": ("BF16", [64, 1 << 20])}))
    plain = tmp_path / "claim.safetensors"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("the tensors were opened"))
    with deadline(60), pytest.raises(DumpError, match="operand 'a' has shape \\[64, 1048576\\]"):
        Recording.load(str(plain))


def test_a_consistent_gzip_dump_still_loads(tmp_path):
    from oracle.run.recording import Recording

    p = _dump_claiming(tmp_path, lambda e: None)
    rec = Recording.load(str(p))
    assert tuple(rec.operands.a.shape) == (64, 32) and tuple(rec.output.shape) == (64, 48)

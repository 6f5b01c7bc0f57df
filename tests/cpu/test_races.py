"""Races told apart from defects, without a GPU: repeated runs compared bit for bit (recordings
made to order by the kernel model), tracing that changes the result, a stage finding that does
not repeat, shared-memory poison, the compute-sanitizer report parser on fixtures written in the
tool's two layouts, --sanitize without the tool, a stand-in sanitizer run through its argv, and
the CLI's exit code."""

import dataclasses
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from harness.launch import LaunchSpec, ScalarArg, TensorArg
from harness.sanitizer import Location, SanitizerReport, parse_report, sanitize, sanitizer_argv
from oracle.report import table as report
from oracle.judging.diagnose import EXIT_CODES, Kind, Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.problem.spec import ProblemSpec, Tile
from oracle.run.races import complement, parse_pattern
from oracle.judging.judgement import final_verdict, judgement_of
from oracle.judging.repeat import as_draft, compare_runs
from oracle.run.simulate import Injection, simulate

ROOT = Path(__file__).resolve().parents[2]
SPEC = ProblemSpec(m=128, n=128, k=128, a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", tile=Tile(64, 64, 64),
                   swizzle_a=128, swizzle_b=128)
TILES = [(0, 0), (1, 1)]


@pytest.fixture(scope="module")
def runs():
    ops = make_operands(SPEC, "random", 3)
    prov = Provenance("random", 3)
    good = simulate(SPEC, ops, prov, tap_tiles=TILES)
    bad = simulate(SPEC, ops, prov, injection=Injection("mma_kblock_twice", (1, 1), 1), tap_tiles=TILES)
    return good, bad


def _flip(t: torch.Tensor, row: int, col: int) -> torch.Tensor:
    out = t.clone()
    out[row, col] = out[row, col] + 1
    return out


def test_identical_runs_are_deterministic(runs):
    good, _ = runs
    res = compare_runs([good, good], [good.output, good.output.clone()])
    assert not res.nondeterministic and res.changes == () and res.tracing_changes == ()
    assert final_verdict(analyze(good), res) is Verdict.MATCH


def test_two_runs_whose_recordings_differ_are_nondeterministic(runs):
    good, _ = runs
    # run 2 differs in one output element of tile (1, 0) and in one mma tap element of tile (1, 1)
    taps = list(good.taps)
    i = next(j for j, t in enumerate(taps) if t.stage == "mma" and t.tile == (1, 1) and t.k_block == 1)
    v = taps[i].values.clone()
    v[5, 7] += 1.0
    taps[i] = dataclasses.replace(taps[i], values=v)
    other = dataclasses.replace(good, output=_flip(good.output, 70, 3), taps=tuple(taps))
    res = compare_runs([good, other])
    assert res.nondeterministic
    by = {c.what: c for c in res.changes}
    assert set(by) == {"output", "mma"}
    assert by["output"].tiles == ((1, 0),) and by["output"].elements == 1 and by["output"].first == ((70, 3),)
    assert by["mma"].tiles == ((1, 1),) and by["mma"].k_blocks == (1,) and by["mma"].first == ((5, 7),)
    assert by["mma"].between == ("traced run 1", "traced run 2")
    an = analyze(good)
    assert final_verdict(an, res) is Verdict.NONDETERMINISTIC
    text = report.render(judgement_of(an, res))
    assert "runs differ: output: traced run 1 vs traced run 2: 1 of 16384 elements differ in tile(s) (1, 0)" in text
    assert text.splitlines()[-1].startswith("NONDETERMINISTIC: repeated runs on the same inputs differ (mma, output)")
    # the earliest stage that differed, where: not only in the JSON's races.changes
    assert "First difference: mma between traced run 1 and traced run 2, tile (1, 1), k-block 1, element (5, 7) " \
           "in the tile." in text
    assert res.differing_traced == (2,)
    doc = report.to_json(judgement_of(an, res))
    report.validate(doc)
    assert doc["verdict"] == "NONDETERMINISTIC" and doc["races"]["stage_verdict"] == "MATCH"
    assert {c["what"] for c in doc["races"]["changes"]} == {"output", "mma"}


def test_a_tap_made_in_one_run_only_is_a_difference(runs):
    good, _ = runs
    fewer = dataclasses.replace(good, taps=tuple(t for t in good.taps if not (t.stage == "load_a" and t.k_block == 1)))
    res = compare_runs([good, fewer])
    (c,) = res.changes
    assert c.what == "load_a" and "in one run only" in c.note and c.k_blocks == (1,)


def test_untraced_output_that_differs_is_tracing_changes_the_result(runs):
    good, _ = runs
    res = compare_runs([good, good], [_flip(good.output, 1, 2), _flip(good.output, 1, 2)])
    assert res.changes == () and len(res.tracing_changes) == 1
    assert res.tracing_changes[0].between == ("traced run 1", "untraced run 1")
    assert res.nondeterministic
    assert "tracing changes the result" in res.reasons()[0]
    an = analyze(good)
    text = report.render(judgement_of(an, res))
    assert "tracing changes the result: output: traced run 1 vs untraced run 1: 1 of 16384" in text
    last = text.splitlines()[-1]
    assert last.startswith("NONDETERMINISTIC: tracing changes the result")
    assert json.dumps(report.to_json(judgement_of(an, res))["races"]["tracing_changes_result"]) == "true"


def test_untraced_runs_that_differ_from_each_other(runs):
    good, _ = runs
    res = compare_runs([good], [good.output, _flip(good.output, 127, 127)])
    assert [c.between for c in res.changes] == [("untraced run 1", "untraced run 2")]
    assert res.changes[0].tiles == ((1, 1),)


def test_a_stage_finding_in_one_run_of_two_is_a_draft(runs):
    good, bad = runs
    an = analyze(bad)
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "mma" and an.first.kind is Kind.VERDICT
    res = compare_runs([bad, good])
    assert res.nondeterministic
    drafted = as_draft(an, res)
    assert drafted.first.kind is Kind.DRAFT and drafted.first.stage == "mma"
    assert as_draft(drafted, res) == drafted  # telling it twice adds nothing
    last = report.render(judgement_of(an, res)).splitlines()[-1]
    assert last.startswith("NONDETERMINISTIC: repeated runs on the same inputs differ")
    assert "First divergence: mma at tile (1, 1), k-block 1" in last and "DRAFT (" in last
    assert "does not repeat" in last and "VERDICT" not in last
    doc = report.to_json(judgement_of(an, res))
    report.validate(doc)
    assert doc["first_divergence"]["kind"] == "DRAFT" and doc["verdict"] == "NONDETERMINISTIC"
    assert doc["races"]["stage_verdict"] == "DIVERGED"


def test_a_finding_that_repeats_stays_a_verdict(runs):
    _, bad = runs
    an = analyze(bad)
    res = compare_runs([bad, bad], [bad.output])
    assert not res.nondeterministic
    assert as_draft(an, res).first.kind is Kind.VERDICT
    assert final_verdict(an, res) is Verdict.DIVERGED
    assert "every output and tap is bit for bit the same" in report.render(judgement_of(an, res))


def test_poison_patterns_that_change_the_output(runs):
    good, _ = runs
    p = parse_pattern("0xFFFFFFFF")
    assert complement(p) == 0 and parse_pattern(0x7F800001) == 0x7F800001
    res = compare_runs([good], poisoned=[good.output, _flip(good.output, 0, 64)], poison=(p, complement(p)))
    assert res.nondeterministic and res.poison_changes[0].tiles == ((0, 1),)
    assert "reads shared memory it never wrote" in " ".join(res.reasons())
    assert "reads never-written shared memory" in report.render(judgement_of(analyze(good), res))
    for bad in ("0x1FFFFFFFF", "-1", "ones", True):
        with pytest.raises(ValueError, match="32-bit"):
            parse_pattern(bad)


def test_a_run_that_fails_once_is_a_difference(runs):
    good, _ = runs
    res = compare_runs([good, good], failed=["traced run 2"])
    assert res.nondeterministic and "did not complete" in res.reasons()[0]


def test_exit_code_of_nondeterministic_is_its_own():
    assert EXIT_CODES[Verdict.NONDETERMINISTIC] == 6
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)


# --------------------------------------------------------------------------- the sanitizer's report
# Fixtures in the layouts compute-sanitizer prints: the older `at 0xPC in FILE:LINE:FUNCTION`
# and the newer `at FUNCTION+0xPC in FILE:LINE`, with the program's own output mixed in.

RACECHECK_OLD = """\
========= COMPUTE-SANITIZER
gemm done
========= Error: Race reported between Write access at 0x1f30 in /src/zoo/sm80_gemm.cu:402:void zoo_sm80::gemm<__nv_bfloat16, (bool)0, (int)13>(...)
=========     and Read access at 0x2040 in /src/zoo/sm80_gemm.cu:410:void zoo_sm80::gemm<__nv_bfloat16, (bool)0, (int)13>(...) [4096 hazards]
=========
========= WARNING: Race reported between Write access at 0x1f30 in /src/zoo/sm80_gemm.cu:402:void zoo_sm80::gemm<__nv_bfloat16, (bool)0, (int)13>(...)
=========     and Read access at 0x2040 in /src/zoo/sm80_gemm.cu:410:void zoo_sm80::gemm<__nv_bfloat16, (bool)0, (int)13>(...) [512 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

RACECHECK_NEW = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at zoo_sm80_bf16_race_store+0x1f30 in sm80_gemm.cu:402
=========     and Read access at zoo_sm80_bf16_race_store+0x2040 in sm80_gemm.cu:410 [8192 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

HAZARD = """\
========= ERROR: Potential WAR hazard detected at __shared__ 0x100 in block (3, 0, 0) :
=========     Read Thread (31, 0, 0) at 0x000000b0 in race.cu:18:kern(void)
=========     Write Thread (32, 0, 0) at 0x000000d0 in race.cu:21:kern(void)
=========     Current Value : 0, Incoming Value : 1
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 2 bytes
=========     at zoo_sm80_bf16_swapped_store+0x3a70 in sm80_gemm.cu:395
=========     by thread (64,0,0) in block (1,0,0)
=========     Access at 0x7f3a5e200400 is out of bounds
=========     and is 1024 bytes after the nearest allocation at 0x7f3a5e1f0000 of size 65536 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2c1d3] in libcuda.so.1
=========
========= Invalid __global__ write of size 2 bytes
=========     at zoo_sm80_bf16_swapped_store+0x3a70 in sm80_gemm.cu:395
=========     by thread (65,0,0) in block (1,0,0)
=========     Access at 0x7f3a5e200402 is out of bounds
=========
========= Invalid __shared__ read of size 16 bytes
=========     at 0x6320 in /src/kern.cu:118:kern(float*)
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x8 is misaligned
=========     Device Frame:/src/kern.cu:50:outer(float*) [0xc0]
=========
========= ERROR SUMMARY: 3 errors
"""

INITCHECK = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at 0x00000060 in /tmp/init.cu:5:kern(int*)
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f65e5204710
=========
========= ERROR SUMMARY: 1 error
"""

SYNCCHECK = """\
========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in warp
=========     at 0x00000058 in /tmp/divergence.cu:12:myKernel(int*)
=========     by thread (37,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 1 error
"""

CLEAN = """\
========= COMPUTE-SANITIZER
========= ERROR SUMMARY: 0 errors
"""


def test_racecheck_old_layout_merges_repeats_and_counts_hazards():
    findings, summary = parse_report("racecheck", RACECHECK_OLD)
    (f,) = findings
    assert f.kind == "race between write and read accesses" and f.space == "shared"
    assert f.location == Location("void zoo_sm80::gemm<__nv_bfloat16, (bool)0, (int)13>(...)", 0x1f30,
                                  "/src/zoo/sm80_gemm.cu", 402)
    assert f.other.line == 410 and f.other.pc == 0x2040
    assert f.count == 4096 + 512 and summary == 2


def test_racecheck_new_layout():
    (f,), summary = parse_report("racecheck", RACECHECK_NEW)
    assert f.location == Location("zoo_sm80_bf16_race_store", 0x1f30, "sm80_gemm.cu", 402)
    assert f.other == Location("zoo_sm80_bf16_race_store", 0x2040, "sm80_gemm.cu", 410)
    assert f.count == 8192 and summary == 1
    assert "zoo_sm80_bf16_race_store+0x1f30 (sm80_gemm.cu:402)" in f.describe()


def test_racecheck_hazard_layout_has_the_shared_address():
    (f,), _ = parse_report("racecheck", HAZARD)
    assert f.kind == "WAR hazard" and f.space == "shared" and f.address == 0x100
    assert f.location == Location("kern(void)", 0xb0, "race.cu", 18) and f.other.line == 21


def test_memcheck_findings_with_global_and_shared_addresses():
    findings, summary = parse_report("memcheck", MEMCHECK)
    assert summary == 3 and len(findings) == 2
    g, s = findings
    assert g.kind == "Invalid __global__ write of size 2 bytes" and g.space == "global" and g.count == 2
    assert g.address == 0x7f3a5e200400 and g.location == Location("zoo_sm80_bf16_swapped_store", 0x3a70,
                                                                     "sm80_gemm.cu", 395)
    assert g.thread == "thread (64,0,0) in block (1,0,0)"
    assert s.space == "shared" and s.address == 0x8 and s.location == Location("kern(float*)", 0x6320, "/src/kern.cu",
                                                                               118)


def test_initcheck_and_synccheck():
    (i,), n = parse_report("initcheck", INITCHECK)
    assert i.kind == "Uninitialized __global__ memory read of size 4 bytes" and i.space == "global"
    assert i.address == 0x7f65e5204710 and i.location.line == 5 and n == 1
    (y,), _ = parse_report("synccheck", SYNCCHECK)
    assert y.kind == "Barrier error detected. Divergent thread(s) in warp" and y.space is None
    assert y.location == Location("myKernel(int*)", 0x58, "/tmp/divergence.cu", 12)


def test_a_clean_report_has_no_findings():
    assert parse_report("memcheck", CLEAN) == ((), 0)
    assert parse_report("racecheck", "") == ((), None)


def test_sanitizer_argv_is_a_list_and_unknown_tools_are_refused():
    argv = sanitizer_argv("/opt/cs", "racecheck", "/tmp/x.log")
    assert argv[:3] == ["/opt/cs", "--tool", "racecheck"] and "--log-file" in argv
    with pytest.raises(ValueError, match="not one of"):
        sanitizer_argv("/opt/cs", "leakcheck", "/tmp/x.log")


LAUNCH = LaunchSpec(grid=1, block=32, args=[TensorArg("x"), TensorArg("z", "out"), ScalarArg(4)])
TENSORS = {"x": torch.ones(4), "z": torch.empty(4)}
CUBIN = b"\x7fELF" + b"\0" * 60


def test_sanitize_without_the_tool_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr("harness.sanitizer.find_sanitizer", lambda: None)
    rep = sanitize(CUBIN, "k", LAUNCH, TENSORS)
    assert rep.results == () and rep.unavailable and "\n" not in rep.unavailable
    assert "compute-sanitizer is not on PATH" in rep.unavailable
    assert report.races_section(None, rep) == ["compute-sanitizer (untraced build): " + rep.unavailable]


STAND_IN_CHILD = r'''
import json, sys
from pathlib import Path
from harness import _protocol as P
run = Path(sys.argv[1])
prog = P.Progress(run)
prog.mark("launch"); prog.mark("sync"); prog.mark("download")
P.write_json_atomic(run / P.STATUS, {"status": "OK", "phase": "done"})
prog.mark("done")
'''


def test_a_stand_in_sanitizer_is_run_through_its_argv(tmp_path):
    # compute-sanitizer's place: a script that writes a report to --log-file and runs the child
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"#!{sys.executable}\n" + r'''
import os, subprocess, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
log = args[args.index("--log-file") + 1]
child = args[args.index("device") + 1:]
if child and child[0] == "--racecheck-report":
    child = child[2:]
rc = subprocess.call(child)
text = {"racecheck": """''' + RACECHECK_NEW + '''""", "memcheck": """''' + CLEAN + r'''"""}.get(tool, "========= ERROR SUMMARY: 0 errors\n")
open(log, "w").write(text)
sys.exit(rc)
''')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    rep = sanitize(CUBIN, "k", LAUNCH, TENSORS, tools=("racecheck", "memcheck"), executable=str(fake),
                   child_prefix=[sys.executable, "-c", STAND_IN_CHILD], timeout_s=60)
    assert [r.tool for r in rep.results] == ["racecheck", "memcheck"] and all(r.ran for r in rep.results)
    (f,) = rep.findings
    assert f.tool == "racecheck" and f.location.line == 402 and f.count == 8192
    lines = report.races_section(None, rep)
    assert lines[0] == "compute-sanitizer (untraced build):"
    assert any("racecheck: race between write and read accesses" in x for x in lines)
    assert "  memcheck: no findings" in lines
    doc = rep.to_json()
    assert doc["results"][0]["findings"][0]["location"]["line"] == 402


def test_sanitizer_findings_are_in_the_report_beside_the_stage_table(runs):
    good, _ = runs
    findings, n = parse_report("racecheck", RACECHECK_NEW)
    from harness.sanitizer import SanitizerResult

    rep = SanitizerReport((SanitizerResult("racecheck", True, findings, n, "OK"),), executable="/opt/cs")
    an = analyze(good)
    text = report.render(judgement_of(an, None, rep))
    table_end = text.index("compute-sanitizer (untraced build):")
    assert "racecheck: race between write and read accesses at zoo_sm80_bf16_race_store+0x1f30" in text[table_end:]
    assert "racecheck" not in text[:table_end]  # not mixed into the stage table
    doc = report.to_json(judgement_of(an, None, rep))
    report.validate(doc)
    f = doc["sanitizer"]["results"][0]["findings"][0]
    assert f["space"] == "shared" and f["count"] == 8192 and f["other"]["line"] == 410
    assert doc["verdict"] == "MATCH"  # a sanitizer finding is reported, not turned into a stage verdict
    assert "compute-sanitizer reported 1 finding(s) in the untraced build (racecheck)" in doc["summary"]
    assert text.splitlines()[-1] == doc["summary"]


# --------------------------------------------------------------------------- the case and the CLI

def test_case_run_table_and_untraced_entry(tmp_path):
    from oracle.run.case import load_case
    from oracle.run.case_types import CaseError

    p = tmp_path / "c.toml"
    p.write_text(f'extends = "{ROOT}/zoo/sm80_gemm/sm80_gemm.toml"\n[kernel]\nuntraced_entry = "zoo_sm80_bf16"\n'
                 f'[run]\nrepeat = 5\nsmem_poison = "0x7F800001"\n')
    case = load_case(str(p), allow_outside_case_dir=True)
    assert case.run.repeat == 5 and case.run.smem_poison == 0x7F800001
    assert case.kernel.untraced_entry == "zoo_sm80_bf16"
    traced = load_case(str(p), allow_outside_case_dir=True, entry="zoo_sm80_bf16_traced")
    assert traced.kernel.untraced_entry == "zoo_sm80_bf16"
    assert load_case(str(p), allow_outside_case_dir=True, entry="other_traced").kernel.untraced_entry is None
    for body, msg in (("[run]\nrepeat = 0\n", "repeat"), ("[run]\nrepeat = true\n", "repeat"),
                      ("[run]\nsmem_poison = \"red\"\n", "smem_poison"), ("[run]\ntimes = 2\n", "unknown key")):
        p.write_text(f'extends = "{ROOT}/zoo/sm80_gemm/sm80_gemm.toml"\n' + body)
        with pytest.raises(CaseError, match=msg):
            load_case(str(p), allow_outside_case_dir=True)


class _Run:
    """What the CLI reads of a KernelRun."""

    status = type("S", (), {"value": "OK"})()
    message, elapsed_s, kernel_s, ok, timing, phases_s, started_ahead = "", 0.0, 0.0, True, None, {}, None


def _fake_race_runs(monkeypatch, untraced_flip: bool, seen: dict):
    from oracle.run import live, races

    def fake(case, ops, prov, *, repeat, smem_poison=None, sanitize=False, timeout_s=None, command=(), **_):
        seen.update(repeat=repeat, smem_poison=smem_poison, sanitize=sanitize)
        rec = simulate(case.spec, ops, prov, tap_tiles=[(0, 0)])
        out = _flip(rec.output, 3, 4) if untraced_flip else rec.output
        first = live.LiveRun(rec, _Run(), True, (), {})
        rep = SanitizerReport(unavailable="--sanitize: compute-sanitizer is not on PATH") if sanitize else None
        return races.RaceRuns(first, (rec,) * repeat, (out,) * repeat, (), sanitizer=rep)

    monkeypatch.setattr(races, "run_races", fake)


CASE_ARGS = ["compare", "--problem", str(ROOT / "zoo/sm80_gemm/sm80_gemm.toml"), "--problem",
             "m=128,n=128,k=64,activation=none,bias=none,beta=0", "--inputs", "ones"]


def test_cli_exit_code_for_tracing_that_changes_the_result(monkeypatch, tmp_path, capsys):
    from oracle.tools import cli

    seen = {}
    _fake_race_runs(monkeypatch, True, seen)
    out = tmp_path / "r.json"
    code = cli.main(CASE_ARGS + ["--repeat", "3", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == EXIT_CODES[Verdict.NONDETERMINISTIC] == 6, text
    assert seen["repeat"] == 3 and "tracing changes the result" in text
    doc = json.loads(out.read_text())
    report.validate(doc)
    assert doc["verdict"] == "NONDETERMINISTIC" and doc["races"]["untraced_runs"] == 3


def test_cli_repeat_that_agrees_keeps_the_stage_verdict_and_sanitize_without_the_tool(monkeypatch, capsys):
    from oracle.tools import cli

    seen = {}
    _fake_race_runs(monkeypatch, False, seen)
    code = cli.main(CASE_ARGS + ["--repeat", "2", "--sanitize", "--smem-poison", "0xFFFFFFFF"])
    captured = capsys.readouterr()
    assert code == 0, captured.out
    assert seen == {"repeat": 2, "smem_poison": 0xFFFFFFFF, "sanitize": True}
    assert captured.err.count("compute-sanitizer is not on PATH") == 1
    assert "every output and tap is bit for bit the same" in captured.out


@pytest.mark.parametrize("extra, msg", [(["--repeat", "0"], "must be from 1"), (["--smem-poison", "red"], "32-bit")])
def test_cli_bad_race_options_exit_2(extra, msg, capsys, monkeypatch):
    from oracle.tools import cli

    seen = {}
    _fake_race_runs(monkeypatch, False, seen)
    assert cli.main(CASE_ARGS + extra) == 2
    assert msg in capsys.readouterr().err


def test_cli_race_options_need_a_live_kernel(capsys):
    from oracle.tools import cli

    assert cli.main(["compare", "--demo", "--repeat", "2"]) == 2
    assert "need a live kernel" in capsys.readouterr().err


# --------------------------------------------------------------------------- the poison symbol, in the real child
# The real child with the driver emulated in host memory (tests/cpu/test_harness_child.py), plus
# the trace header's poison symbol and a stand-in kernel that stores a shared word it never wrote.

def _poison_child() -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_emulated", Path(__file__).with_name("test_harness_child.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = mod.EMULATED_CHILD
    for old, new in (
            ("SYMBOL = ctypes.create_string_buffer(8)\n",
             "SYMBOL = ctypes.create_string_buffer(8)\nPOISON = ctypes.create_string_buffer(16)\n"),
            ("    def global_(self, name):\n",
             "    def global_(self, name):\n"
             "        if name == 'oracle_trace_smem_poison' and not os.environ.get('EMULATED_NO_POISON_SYMBOL'):\n"
             "            return ctypes.addressof(POISON), 16\n"),
            ('KERNELS = {"vadd": vadd,',
             "def reads_smem(params):\n"
             "    a = args(params, 4)\n"
             "    n = i32(a[3])\n"
             "    z = (ctypes.c_uint32 * n).from_address(q(a[2]))\n"
             "    cfg = (ctypes.c_uint32 * 4).from_address(ctypes.addressof(POISON))\n"
             "    word = cfg[1] if cfg[0] else 0x5A5A5A5A  # what the prologue left in shared memory\n"
             "    for i in range(n):\n"
             "        z[i] = word\n"
             "    if cfg[0]:\n"
             "        cfg[2] += 1\n"
             "\n"
             'KERNELS = {"reads_smem": reads_smem, "vadd": vadd,')):
        assert old in src, old
        src = src.replace(old, new, 1)
    return [sys.executable, "-c", src]


def _smem_run(**kw):
    from harness.runner import run_kernel

    launch = LaunchSpec(grid=1, block=32, args=[TensorArg("x"), TensorArg("y"), TensorArg("z", "out"), ScalarArg(8)])
    tensors = {"x": torch.zeros(8, dtype=torch.int32), "y": torch.zeros(8, dtype=torch.int32),
               "z": torch.zeros(8, dtype=torch.int32)}
    return run_kernel(CUBIN, "reads_smem", launch, tensors, child_cmd=_poison_child(), timeout_s=60, **kw)


def test_the_child_sets_the_poison_symbol_and_reports_the_ctas_that_applied_it():
    a = _smem_run(smem_poison=0xDEADBEEF)
    assert a.ok, a.describe() + a.stderr_tail
    assert a.smem_poison == {"pattern": 0xDEADBEEF, "ctas": 1}
    assert (a.outputs["z"].view(torch.int32) == torch.tensor(0xDEADBEEF).to(torch.int32)).all()
    b = _smem_run(smem_poison=complement(0xDEADBEEF))
    d = compare_runs([dataclasses.replace(_rec8(), output=a.outputs["z"].view(torch.float32).reshape(1, 8))],
                     poisoned=[a.outputs["z"].reshape(1, 8), b.outputs["z"].reshape(1, 8)],
                     poison=(0xDEADBEEF, complement(0xDEADBEEF)))
    assert d.poison_changes and d.poison_changes[0].elements == 8
    plain = _smem_run()
    assert plain.ok and plain.smem_poison is None


def _rec8():
    spec = ProblemSpec(m=1, n=8, k=8, a_dtype="fp32", b_dtype="fp32", out_dtype="fp32", tile=Tile(64, 64, 32),
                       swizzle_a=0, swizzle_b=0)
    ops = make_operands(spec, "ones", 0)
    return simulate(spec, ops, Provenance("ones"))


def test_poison_without_the_symbol_is_a_load_error_naming_it(monkeypatch):
    from harness.runner import RunnerError, RunStatus

    monkeypatch.setenv("EMULATED_NO_POISON_SYMBOL", "1")
    run = _smem_run(smem_poison=1)
    assert run.status is RunStatus.LOAD_ERROR and "oracle_trace_smem_poison" in run.message
    assert "-DORACLE_TRACE" in run.message
    with pytest.raises(RunnerError, match="32-bit"):
        _smem_run(smem_poison=1 << 32)


def test_run_races_runs_each_build_as_asked(monkeypatch, runs):
    # the orchestration with the runs faked: N traced, N untraced (one of them faulting), two
    # poison runs with a pattern and its complement, and --sanitize without the tool (no build)
    from harness.runner import KernelRun, RunStatus
    from oracle.run import live, races
    from oracle.run.case import load_case

    good, _ = runs
    case = load_case(str(ROOT / "zoo/sm80_gemm/sm80_race_store.toml"))
    calls = {"traced": [], "untraced": 0, "builds": 0}

    def fake_live(case_, ops, prov, *, timeout_s=None, command=(), smem_poison=None, **_):
        calls["traced"].append(smem_poison)
        out = good.output if smem_poison in (None, 0xFFFF0000) else _flip(good.output, 0, 0)
        run = KernelRun(RunStatus.OK, smem_poison=None if smem_poison is None else {"pattern": smem_poison, "ctas": 2})
        return live.LiveRun(dataclasses.replace(good, output=out), run, True, (), {})

    def fake_kernel(cubin, entry, launch, tensors, **_):
        calls["untraced"] += 1
        assert entry == "zoo_sm80_bf16_race_store"
        if calls["untraced"] == 2:
            return KernelRun(RunStatus.CUDA_ERROR, message="illegal address")
        return KernelRun(RunStatus.OK, outputs={"d": good.output})

    def fake_build(case_):
        calls["builds"] += 1
        return b"cubin", case_.kernel.untraced_entry

    monkeypatch.setattr(races, "run_live", fake_live)
    monkeypatch.setattr(races, "run_kernel", fake_kernel)
    monkeypatch.setattr(races, "untraced_build", fake_build)
    monkeypatch.setattr(races, "launch_sequence", lambda c, o: ([("e", None)], {}))
    monkeypatch.setattr("harness.sanitizer.find_sanitizer", lambda: None)
    rr = races.run_races(case, good.operands, good.provenance, repeat=3, smem_poison=0x0000FFFF, sanitize=True)
    assert calls["traced"] == [None, None, None, 0x0000FFFF, 0xFFFF0000] and calls["untraced"] == 3
    assert calls["builds"] == 1  # the untraced build for the repeats; none for a sanitizer that is not there
    assert len(rr.traced) == 3 and rr.untraced[1] is None and rr.failed == ("untraced run 2",)
    assert rr.poison == (0x0000FFFF, 0xFFFF0000) and len(rr.poisoned) == 2 and rr.poison_note == ""
    assert rr.sanitizer.unavailable and rr.untraced_entry == "zoo_sm80_bf16_race_store"
    res = compare_runs(rr.traced, rr.untraced, poisoned=rr.poisoned, poison=rr.poison, failed=rr.failed)
    assert res.poison_changes and res.failed == ("untraced run 2",) and res.nondeterministic


def test_poison_that_no_cta_applied_is_said_and_shows_nothing(monkeypatch, runs):
    from harness.runner import KernelRun, RunStatus
    from oracle.run import live, races
    from oracle.run.case import load_case

    good, _ = runs
    case = load_case(str(ROOT / "zoo/sm80_gemm/sm80_race_store.toml"))

    def fake_live(case_, ops, prov, *, smem_poison=None, **_):
        run = KernelRun(RunStatus.OK, smem_poison=None if smem_poison is None else {"pattern": smem_poison, "ctas": 0})
        return live.LiveRun(good, run, True, (), {})

    monkeypatch.setattr(races, "run_live", fake_live)
    rr = races.run_races(case, good.operands, good.provenance, repeat=1, smem_poison=0xFFFFFFFF)
    assert rr.poisoned == () and "never called" in rr.poison_note and rr.untraced == ()
    res = compare_runs(rr.traced, rr.untraced, poisoned=rr.poisoned, poison=rr.poison, poison_note=rr.poison_note)
    assert not res.nondeterministic
    assert "poison: the kernel never called oracle_trace smem_prologue()" in report.render(judgement_of(analyze(good), res))


# --------------------------------------------------------------------------- the one path (RunRequest)

def test_compare_takes_the_case_file_as_its_argument(monkeypatch, capsys):
    from oracle.tools import cli

    seen = {}
    _fake_race_runs(monkeypatch, False, seen)
    args = [CASE_ARGS[0], CASE_ARGS[2]] + CASE_ARGS[3:]  # compare CASE.toml --problem m=... --inputs ones
    assert cli.main(args + ["--repeat", "2"]) == 0, capsys.readouterr()
    assert seen["repeat"] == 2
    assert cli.main(args + ["--problem", str(ROOT / "zoo/sm80_gemm/sm80_gemm.toml")]) == 2
    assert "at most one case TOML" in capsys.readouterr().err


def test_the_python_api_runs_every_option_the_command_line_has(monkeypatch):
    import oracle

    seen = {}
    _fake_race_runs(monkeypatch, True, seen)
    rep = oracle.run_live(ROOT / "zoo/sm80_gemm/sm80_gemm.toml", "ones", repeat=3, smem_poison=0xFFFFFFFF,
                          sanitize=True, trace_tiles=[(0, 0)], m=128, n=128, k=64, activation="none", bias="none",
                          beta=0)
    assert seen == {"repeat": 3, "smem_poison": 0xFFFFFFFF, "sanitize": True}
    assert rep.verdict == "NONDETERMINISTIC" and rep.exit_code == 6
    assert rep.judgement.races.tracing_changes and rep.judgement.notices  # the sanitizer that could not run
    assert "First difference: output between traced run 1 and untraced run 1" in str(rep)


@pytest.mark.parametrize("fields, msg", [
    ({}, "got none"), ({"dump": "x", "recording": "r"}, "dump and recording"),
    ({"dump": "x", "repeat": 2}, "need a live kernel"), ({"dump": "x", "time": True}, "need a live kernel"),
])
def test_a_request_that_cannot_be_run_is_refused_in_one_place(fields, msg):
    from oracle.run.request import RequestError, RunRequest

    with pytest.raises(RequestError, match=msg):
        RunRequest(**fields)


def test_a_timed_request_runs_once():
    from oracle.run.case import load_case
    from oracle.run.request import RequestError, RunRequest

    case = load_case(str(ROOT / "zoo/sm80_gemm/sm80_gemm.toml"))
    for extra in ({"repeat": 2}, {"smem_poison": 1}, {"sanitize": True}):
        with pytest.raises(RequestError, match="timing measures one run"):
            RunRequest(case=case, time=True, **extra)
    with pytest.raises(RequestError, match="repeat"):
        RunRequest(case=case, repeat=0)

"""Malformed case files, bench lists and flags: exit 2 and one `error:` line naming the field,
the value and what is allowed, found before anything is built (the build here fails the test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oracle.tools import cli
from oracle.run import live

ROOT = Path(__file__).resolve().parents[2]
SIMPLE = ROOT / "harness" / "examples" / "simple_gemm.toml"
SOURCE = 'source = "simple_gemm.cu"'  # the case's own source, copied beside the case file
BASE = SIMPLE.read_text()
assert SOURCE in BASE
GRID = 'grid = ["tiles_n", "tiles_m", 1]'


@pytest.fixture(autouse=True)
def no_build(monkeypatch):
    def build(*args, **kwargs):
        raise AssertionError("the build was reached")

    monkeypatch.setattr(live, "build_cubin", build)
    monkeypatch.setattr(live, "load_cubin", build)


def _run(capsys, argv) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("text, message", [
    ("problem = 5\n", "problem = 5 must be a table ([problem])"),
    ("kernel = 5\n[problem]\nm = 8\nn = 8\nk = 8\n", "kernel = 5 must be a table ([kernel])"),
    (BASE.replace('args = ["a"', 'args = 5\nxargs = ["a"').replace("xargs", "#"), "args = 5 must be a list"),
    (BASE.replace(SOURCE, "source = 5"), "source = 5 must be the path"),
    (BASE.replace('time_entry = "simple_gemm_bf16"', "defines = [1, 2]"), "defines = [1, 2] must be a table"),
    ('extends = "."\n' + BASE, "is not a regular file"),
    ('extends = "/dev/zero"\n' + BASE, "extends = '/dev/zero' is an absolute path"),
    ('extends = "zero"\n' + BASE, "extends = 'zero' goes through a symbolic link to /dev/zero"),  # a link there
    (BASE.replace(GRID, 'grid = ["1 // 0", 1, 1]'), "grid[0]: '1 // 0' divides by zero"),
    (BASE.replace(GRID, 'grid = ["cdiv(m, 0)", 1, 1]'), "grid[0]: 'cdiv(m, 0)' divides by zero"),
    (BASE.replace(GRID, 'grid = ["min()", 1, 1]'), "min() in 'min()' takes at least 2 arguments, got 0"),
    (BASE.replace(GRID, 'grid = ["1e308 * 1e308", 1, 1]'), "reaches inf: an expression's values must be finite"),
    (BASE.replace(GRID, 'grid = ["' + "+".join(["1"] * 3000) + '", 1, 1]'), "has 5999 characters; at most 512"),
    (BASE.replace(GRID, 'grid = ["m / 2", 1, 1]'), "uses something other than numbers, names"),
    (BASE.replace(GRID, 'grid = ["2.5", 1, 1]'), "grid[0]: '2.5' = 2.5 is not an integer"),
    (BASE.replace(GRID, 'grid = [1, "m * 100000000", 1]'), "grid[1]: 'm * 100000000' = 20000000000 is outside 1..65535"),
    (BASE.replace("{ i32 = 2 }", "{ i32 = 1.5 }"), "args[14] (i32): 1.5 is not an integer"),
    (BASE.replace("{ i32 = 2 }", '{ u32 = "-1" }'), "(u32): '-1' = -1 is outside 0..4294967295"),
    (BASE.replace("{ i32 = 2 }", "{ i32 = true }"), "{ i32 = True } must hold a number or an expression"),
    (BASE.replace("m = 200", "m = " + "9" * 5000), "is not valid TOML"),
    (BASE.replace('k_blocks = "all"', "k_blocks = [0, 5000]"), "k-blocks span 0..5000; they must fit in a window"),
    (BASE.replace('k_blocks = "all"', "tiles = [" + ", ".join(["[0, 0]"] * 33) + "]"),
     "selection has 33 tiles; at most 32"),
    (BASE.replace(SOURCE, 'cubin = "/dev/zero"'), "[kernel] cubin = '/dev/zero' is an absolute path"),
    (BASE.replace(SOURCE, 'source = "folder.cu"'), "folder.cu' is not a regular file"),
    (BASE.replace('entry = "simple_gemm_bf16_traced"', 'entry = "simple_gemm_bf16_traced"\narch = "sm_1000x"'),
     "arch = 'sm_1000x' must look like sm_90a"),
])
def test_a_malformed_case_file_is_one_error_line(tmp_path, capsys, text, message):
    (tmp_path / "simple_gemm.cu").write_bytes((SIMPLE.parent / "simple_gemm.cu").read_bytes())
    (tmp_path / "folder.cu").mkdir()
    (tmp_path / "zero").symlink_to("/dev/zero")
    p = tmp_path / "case.toml"
    p.write_text(text)
    line = _run(capsys, ["compare", "--problem", str(p), "--inputs", "ones"])
    assert message in line, line


@pytest.mark.parametrize("flags, message", [
    (["--trace-tiles", "a,b"], "--trace-tiles 'a,b': 'a' is not a non-negative integer"),
    (["--trace-k-blocks", "x"], "--trace-k-blocks 'x': 'x' is not a non-negative integer"),
    (["--trace-k-blocks", "-3"], "--trace-k-blocks '-3': '-3' is not a non-negative integer"),
    (["--trace-tiles", "999,999"], "trace tile (999, 999) is outside the 4 x 3 tile grid"),
    (["--trace-k-blocks", "99"], "trace k-block 99 is outside 0..4"),
    (["--set", "m=100000,n=100000,k=100000"], "more than the 32768 MiB limit of ORACLE_MAX_OPERAND_MB"),
    (["--timeout", "nan"], "--timeout: 'nan' must be a positive, finite number of seconds"),
    (["--inputs", "random:x"], "the seed must be a non-negative integer"),
    (["--inputs", "bogus"], "'bogus' is not an input ladder"),
])
def test_a_malformed_flag_is_refused_before_any_input_is_made(capsys, monkeypatch, flags, message):
    import oracle.run.inputs

    monkeypatch.setattr(oracle.run.inputs, "make_operands", lambda *a, **k: pytest.fail("inputs were made"))
    inputs = [] if flags[0] == "--inputs" else ["--inputs", "ones"]
    line = _run(capsys, ["compare", "--problem", str(SIMPLE), *inputs, *flags])
    assert message in line, line


def test_a_dump_of_another_problem_is_refused_before_the_launch(tmp_path, capsys):
    dump = tmp_path / "other.safetensors"
    assert cli.main(["simulate", "--out", str(dump), "--shape", "40", "24", "96"]) == 0
    capsys.readouterr()
    line = _run(capsys, ["compare", "--problem", str(SIMPLE), "--inputs", f"dump:{dump}"])
    assert "operand 'a' has shape [40, 96], the problem needs [200, 72]" in line


def test_repro_checks_the_selection_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "r"
    line = _run(capsys, ["repro", "--problem", str(SIMPLE), "--inputs", "ones", "--trace-tiles", "999,999",
                         "--out", str(out)])
    assert "trace tile (999, 999) is outside" in line and not out.exists()


@pytest.mark.parametrize("text, message", [
    ("case = 5\n", "case = 5 must be a list of tables ([[case]])"),
    ("[defaults]\nset = 5\n[[case]]\ncase = 'a.toml'\n", "[defaults]: set = 5 must be a table"),
    ("[[case]]\ncase = 5\n", "case #0: case = 5 must be a non-empty string"),
    ("[[case]]\ncase = 'a.toml'\ntime = 'yes'\n", "case #0: time = 'yes' must be true or false"),
    ("[[case]]\ncase = 'a.toml'\ntimeout = -1\n", "case #0: timeout = -1 must be a positive number"),
    ("[[case]]\ncase = 'a.toml'\ninputs = 'dump:x'\n", "a bench case makes its inputs"),
])
def test_a_malformed_bench_list_is_one_error_line(tmp_path, capsys, text, message):
    p = tmp_path / "cases.toml"
    p.write_text(text)
    assert message in _run(capsys, ["bench", "--cases", str(p), "--workers", "1"])


def test_a_bench_case_that_fails_its_checks_is_a_row_before_any_case_runs(tmp_path, capsys, monkeypatch):
    import oracle.tools.bench

    ran = []
    monkeypatch.setattr(oracle.tools.bench, "run_case", lambda c: ran.append(c.name) or {"name": c.name, "verdict": "MATCH"})
    p = tmp_path / "cases.toml"
    p.write_text(f"[defaults]\ncase = '{SIMPLE}'\n[[case]]\nname = 'good'\n[[case]]\nname = 'bad'\n"
                 f"trace_k_blocks = [99]\n")
    assert cli.main(["bench", "--cases", str(p), "--workers", "1", "--no-time"]) == 2
    err = capsys.readouterr().err
    assert ran == ["good"] and re.search(r"bad: CaseError: trace k-block 99 is outside 0..4", err)


def test_operand_sizes_are_checked_against_the_knob_and_the_machine(monkeypatch):
    from oracle.run.inputs import InputError, check_problem_size, make_operands
    from oracle.problem.spec import ProblemSpec

    spec = ProblemSpec(m=1024, n=1024, k=1024)
    check_problem_size(spec)
    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", "1")
    with pytest.raises(InputError, match=r"take 6.0 MiB, more than the 1 MiB limit of ORACLE_MAX_OPERAND_MB"):
        make_operands(spec, "ones")
    monkeypatch.setenv("ORACLE_MAX_OPERAND_MB", str(1 << 40))
    huge = ProblemSpec(m=1 << 20, n=1 << 20, k=1 << 16)
    with pytest.raises(InputError, match=r"more than this machine's [0-9.]+ GiB of memory"):
        make_operands(huge, "random")

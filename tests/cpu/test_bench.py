import os

import pytest

from oracle.tools.bench import BenchCase, load_cases, parse_shard, shard
from oracle.run.case_types import CaseError
from oracle.tools.cli import main


def test_shipped_case_list_loads_and_shards():
    cases = load_cases("benchmarks/cases_simple_gemm.toml")
    assert len(cases) == 5 and cases[3].entry == "simple_gemm_fp16_traced"
    assert cases[0].overrides == {"m": 200, "n": 136, "k": 72}
    parts = [shard(cases, i, 2) for i in range(2)]
    assert [c.name for c in parts[0]] == [cases[0].name, cases[2].name, cases[4].name]
    assert sorted(c.name for p in parts for c in p) == sorted(c.name for c in cases)
    assert not set(c.name for c in parts[0]) & set(c.name for c in parts[1])


@pytest.mark.parametrize("text", ["3/2", "a/b", "1", "-1/2", "0/0"])
def test_bad_shards_are_refused(text):
    with pytest.raises(CaseError):
        parse_shard(text)


@pytest.mark.parametrize("text, match", [
    ("[[case]]\nname = 'x'\nflavour = 1\n", "unknown key"),
    ("[[case]]\nname = 'x'\n", "no live case file"),
    ("[defaults]\ncase = 'a.toml'\n[[case]]\nname = 'x'\n[[case]]\nname = 'x'\n", "duplicate"),
    ("[[case]]\ncase = 'a.toml'\ntrace_tiles = [1, 2]\n", "case #0: trace tiles must be a list"),
    ("[[case]]\ncase = 'a.toml'\ntrace_k_blocks = [-1]\n", "case #0: trace k_blocks must be"),
])
def test_bad_case_lists_are_named(tmp_path, text, match):
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(CaseError, match=match):
        load_cases(str(p))


def test_a_broken_case_is_a_row_and_exit_2(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text("[defaults]\ncase = 'missing.toml'\n[[case]]\nname = 'x'\n")
    assert main(["bench", "--cases", str(p), "--workers", "1", "--jsonl", str(tmp_path / "r.jsonl")]) == 2
    line = (tmp_path / "r.jsonl").read_text().splitlines()[0]
    assert '"verdict": "ERROR"' in line and "environment" in line


def test_zoo_case_list_loads_with_its_trace_selection():
    cases = {c.name: c for c in load_cases("benchmarks/cases_zoo.toml")}
    assert len(cases) == 6
    big = cases["hopper-bf16-4096"]
    assert big.overrides == {"m": 4096, "n": 4096, "k": 4096} and big.trace_k_blocks == (0, 1, 32, 63)
    assert cases["hopper-bf16-ragged-1000x1000x2048"].trace_k_blocks == (0, 1, 16, 31)  # from [defaults]
    assert cases["hopper-e4m3-block-2048"].entry == "zoo_hopper_e4m3_block_traced"
    from oracle.run.case import load_case

    for c in cases.values():  # every case makes a valid problem for its kernel
        spec = load_case(c.case, c.overrides, entry=c.entry).spec
        assert max(c.trace_k_blocks) < spec.k_blocks, c.name


SIMPLE = "harness/examples/simple_gemm.toml"


def test_a_case_may_repeat_and_a_bad_repeat_is_named(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(f"[defaults]\ncase = '{SIMPLE}'\nrepeat = 3\n[[case]]\nname = 'a'\n[[case]]\nname = 'b'\nrepeat = 1\n")
    assert [c.repeat for c in load_cases(str(p))] == [3, 1]
    for bad in ("0", "true", "101", "'2'"):
        p.write_text(f"[[case]]\ncase = '{SIMPLE}'\nrepeat = {bad}\n")
        with pytest.raises(CaseError, match=r"case #0: repeat = .* must be an integer from 1 to 100"):
            load_cases(str(p))


def _runs():
    import dataclasses

    from oracle.run.case import load_case
    from oracle.run.inputs import Provenance, make_operands
    from oracle.run.simulate import simulate

    case = load_case(SIMPLE, {"m": 64, "n": 64, "k": 48})
    ops = make_operands(case.spec, "random", 0)
    rec = simulate(case.spec, ops, Provenance("random", 0), tap_tiles=[(0, 0)])
    out = rec.output.clone()
    out[3, 5] = out[3, 5] + 1
    return case, ops, rec, dataclasses.replace(rec, output=out)


def test_a_repeated_request_runs_the_races(monkeypatch):
    from harness.runner import KernelRun, RunStatus
    from oracle.run import live, races
    from oracle.run.execute import run
    from oracle.run.request import RunRequest

    case, ops, rec, _ = _runs()
    first = live.LiveRun(rec, KernelRun(RunStatus.OK), True, (), {})
    seen = {}

    def fake_races(case_, ops_, prov, *, repeat, **kw):
        seen.update(repeat=repeat, **kw)
        return races.RaceRuns(first, (rec, rec), (rec.output, rec.output), ())

    monkeypatch.setattr(races, "run_races", fake_races)
    got = run(RunRequest(case=case, repeat=2, timeout_s=9.0))
    assert got.recording is rec and got.races.traced == (rec, rec) and seen["repeat"] == 2 and seen["timeout_s"] == 9.0


def test_a_bench_case_whose_repeated_runs_differ_is_nondeterministic_and_exits_6(monkeypatch, tmp_path):
    from harness.runner import KernelRun, RunStatus
    from oracle.run import live, races
    from oracle.tools import bench

    case, ops, rec, other = _runs()
    calls = []

    def fake_races(case_, ops_, prov, *, repeat, smem_poison=None, sanitize=False, **_):
        calls.append((repeat, smem_poison, sanitize))
        first = live.LiveRun(rec, KernelRun(RunStatus.OK), True, (), {})
        return races.RaceRuns(first, (rec, other), (rec.output, rec.output), ())

    def fake_live(*_, **__):
        raise AssertionError("a repeated case is verified by run_races, and a diverging one is not timed")

    monkeypatch.setattr(races, "run_races", fake_races)
    monkeypatch.setattr(live, "run_live", fake_live)
    from oracle.run import timing

    monkeypatch.setattr(timing, "require_gpu", lambda *a, **k: None)  # the run is faked: so is the GPU timing needs
    bc = BenchCase("x", SIMPLE, overrides={"m": 64, "n": 64, "k": 48}, repeat=2)
    row = bench.run_case(bc)
    assert row["verdict"] == "NONDETERMINISTIC" and row["repeat"]["nondeterministic"], row
    assert calls == [(2, None, False)] and "performance" not in row  # verified by repeating, not timed
    assert row["repeat"]["reasons"][0] == "repeated runs on the same inputs differ (output)"

    p = tmp_path / "c.toml"
    p.write_text(f"[[case]]\ncase = '{os.path.abspath(SIMPLE)}'\nrepeat = 2\n")
    monkeypatch.setattr(bench, "run_case", lambda c: {"name": c.name, "verdict": "NONDETERMINISTIC"})
    assert bench.run_bench(str(p), workers=1, stream=open(tmp_path / "log", "w"))[1] == 6

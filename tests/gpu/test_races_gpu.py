"""Races on the GPU: the zoo's race entry must come out NONDETERMINISTIC within the runs its
manifest entry names (tests/zoo/manifest.json `expected_race`), a correct variant's repeated runs
must agree bit for bit, shared-memory poison must show the reads of never-written shared memory of
uninit_padding (and none of a correct variant), and compute-sanitizer's racecheck must find the
race in the untraced build (where the tool is installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from zoo_cases import ROOT, entries, entry_case  # tests/ is on sys.path

from oracle import knobs as oracle_knobs
from oracle.judging.diagnose import EXIT_CODES, Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.run.races import run_races
from oracle.judging.judgement import final_verdict
from oracle.judging.repeat import compare_runs

pytestmark = pytest.mark.gpu

RACES = [e for e in entries() if "expected_race" in e]
SM80 = {e["name"]: e for e in entries("zoo/sm80_gemm/")}


def _inputs(case, seed):
    return make_operands(case.spec, "random", seed), Provenance("random", seed)


def _races(case, seed, **kw):
    ops, prov = _inputs(case, seed)
    rr = run_races(case, ops, prov, timeout_s=120, **kw)
    res = compare_runs(rr.traced, rr.untraced, poisoned=rr.poisoned, poison=rr.poison, poison_note=rr.poison_note,
                       failed=rr.failed)
    return rr, res


def test_the_manifest_has_a_race_entry():
    assert RACES, "tests/zoo/manifest.json has no entry with expected_race"


@pytest.mark.parametrize("entry", RACES, ids=lambda e: e["name"])
def test_race_entry_is_nondeterministic_within_its_runs(entry):
    case = entry_case(entry)
    runs = entry["expected_race"]["within_runs"]
    rr, res = _races(case, entry.get("seed", 0), repeat=runs)
    rec = rr.first.recording
    record_dir = oracle_knobs.ZOO_RECORD_DIR.get()
    if record_dir:  # run 1, as tests/gpu/test_zoo.py records every entry
        out = Path(record_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        rec.save(str(out / Path(entry["dump"]).name))
    assert rr.first.run.ok, rr.first.run.describe()
    an = analyze(rec)
    assert final_verdict(an, res) is Verdict[entry["expected_race"]["verdict"]], (res.to_json(), an.diagnosis)
    assert res.changes or res.tracing_changes, res.to_json()
    print(json.dumps(res.to_json(), indent=1)[:4000])


def test_race_entry_from_the_command_line_exits_nondeterministic(tmp_path):
    entry = RACES[0]
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "oracle", "compare", "--problem", str(ROOT / entry["case"]), "--problem",
           ",".join(f"{k}={v}" for k, v in entry["problem"].items()), "--inputs", f"random:{entry.get('seed', 0)}",
           "--json", str(out), "--timeout", "120"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == EXIT_CODES[Verdict.NONDETERMINISTIC], proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "NONDETERMINISTIC" and doc["races"]["traced_runs"] == 10
    assert "NONDETERMINISTIC" in proc.stdout.strip().splitlines()[-1]


def test_a_correct_variant_repeats_bit_for_bit():
    entry = SM80["sm80_bf16_correct"]
    case = entry_case(entry)
    rr, res = _races(case, entry.get("seed", 0), repeat=3)
    assert not res.nondeterministic, res.to_json()
    assert analyze(rr.first.recording).verdict is Verdict.MATCH


def test_poison_shows_never_written_shared_memory_and_not_in_a_correct_variant():
    # uninit_padding never zero-fills B's K tail: with K = 104 the last k-block's slot was never
    # written before, so the MMA reads the poison there (NaN * 0 with 0xFFFFFFFF, 0 with its complement)
    bad = entry_case(SM80["sm80_bf16_uninit_padding"], {"m": 256, "n": 128, "k": 104})  # 2 x 1 tiles: the entry traces tile (1, 0)
    rr, res = _races(bad, 5, repeat=1, smem_poison=0xFFFFFFFF)
    assert rr.poison_note == "", rr.poison_note
    assert res.poison_changes and res.nondeterministic, res.to_json()
    good = entry_case(SM80["sm80_bf16_correct"], {"m": 256, "n": 128, "k": 104})  # 2 x 1 tiles: the entry traces tile (1, 0)
    rr, res = _races(good, 5, repeat=1, smem_poison=0xFFFFFFFF)
    assert rr.poison_note == "" and not res.poison_changes, res.to_json()


def test_racecheck_finds_the_race_in_the_untraced_build():
    from harness.sanitizer import find_sanitizer

    if find_sanitizer() is None:
        pytest.skip("compute-sanitizer is not installed on this machine, so the sanitizer run cannot be checked.")
    entry = RACES[0]
    case = entry_case(entry, {"m": 128, "n": 128, "k": 64})
    ops, prov = _inputs(case, 1)
    rr = run_races(case, ops, prov, repeat=1, sanitize=True, timeout_s=120)
    rep = rr.sanitizer
    by_tool = {r.tool: r for r in rep.results}
    assert by_tool["racecheck"].ran, by_tool["racecheck"]
    races = [f for f in by_tool["racecheck"].findings if f.space == "shared"]
    assert races, rep.describe()
    assert all(r.ran for r in rep.results), rep.describe()
    print("\n".join(rep.describe()))

import json
import os
import subprocess
import sys

import pytest

from oracle.tools.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_names_the_planted_defect(tmp_path, capsys):
    j = tmp_path / "r.json"
    code = main(["compare", "--demo", "--json", str(j)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith("kernel zoo_hopper_bf16_kblock_twice_traced:")  # a real kernel, not a model
    assert "First divergence: mma at tile (0, 0), k-block 1" in out and "VERDICT" in out
    doc = json.loads(j.read_text())
    assert doc["schema"] == "oracle.report.table/2" and doc["verdict"] == "DIVERGED" and doc["synthetic"] is False
    fd = doc["first_divergence"]
    assert (fd["stage"], fd["tile"], fd["k_block"], fd["kind"]) == ("mma", [0, 0], 1, "VERDICT")
    assert set(fd) >= {"stage", "tile", "k_block", "element", "received", "expected", "kind"}
    names = [s["name"] for s in doc["stages"]]
    assert all(n.split("_")[0] in ("descriptor", "load", "mma", "reduce", "epilogue") for n in names)
    assert all({"name", "teacher_forced", "chained", "worst_tile"} <= set(s) for s in doc["stages"])


def test_shipped_demo_is_the_zoo_recording():
    import json as _json

    from oracle.tools.demo import DEMO_PATH, DEMO_ZOO_ENTRY

    with open(os.path.join(ROOT, "tests", "zoo", "manifest.json")) as f:
        entry = next(e for e in _json.load(f) if e["name"] == DEMO_ZOO_ENTRY)
    assert entry["expected_stage"] == "mma"
    with open(DEMO_PATH, "rb") as a, open(os.path.join(ROOT, entry["dump"]), "rb") as b:
        assert a.read() == b.read(), "oracle/tools/data/demo.safetensors.gz is not the zoo's recording"


@pytest.mark.parametrize("argv", [[], ["compare"], ["compare", "--demo", "--dump", "x"], ["nonsense"]])
def test_bad_usage_exits_2(argv, capsys):
    assert main(argv) == 2


def test_bad_dump_exits_2_with_a_named_problem(tmp_path, capsys):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"not a dump at all")
    assert main(["compare", "--dump", str(p)]) == 2
    err = capsys.readouterr().err
    assert "bad.safetensors" in err and "error:" in err


def test_simulate_then_compare_round_trip(tmp_path, capsys):
    p = tmp_path / "sim.safetensors"
    assert main(["simulate", "--out", str(p), "--defect", "epilogue_scale_twice"]) == 2  # the spec has no scale
    assert "needs a per-column scale" in capsys.readouterr().err
    assert main(["simulate", "--out", str(p), "--defect", "load_stale_slot", "--defect-tile", "1", "0"]) == 0
    assert main(["compare", "--dump", str(p), "--quiet"]) == 1
    assert main(["simulate", "--out", str(p)]) == 0
    assert main(["compare", "--dump", str(p), "--quiet"]) == 0


def test_live_mode_without_a_launch_is_a_usage_error(tmp_path, capsys):
    case = tmp_path / "c.toml"
    case.write_text('[problem]\nm = 8\nn = 8\nk = 8\n[kernel]\nsource = "k.cu"\nentry = "k"\n')
    assert main(["compare", "--problem", str(case)]) == 2
    assert "[launch]" in capsys.readouterr().err
    with open(case, "a") as f:
        f.write('[launch]\ngrid = [1]\nblock = [32]\nargs = ["d"]\n')
    assert main(["compare", "--problem", str(case)]) == 2
    assert "cannot read CUDA source" in capsys.readouterr().err


def test_knobs_lists_every_knob(capsys):
    assert main(["knobs"]) == 0
    out = capsys.readouterr().out
    for name in ("ORACLE_DEVICE", "ORACLE_CACHE_DIR", "ORACLE_KERNEL_TIMEOUT_S"):
        assert name in out


def test_the_process_exits_with_the_code_after_the_exit_handlers_and_the_output(tmp_path):
    marker = tmp_path / "exit-handler-ran"
    code = ("import atexit, sys; atexit.register(lambda p=sys.argv[1]: open(p, 'w').write('ran')); "
            "sys.argv = ['oracle', 'compare', '--demo', '--json', sys.argv[2]]; "
            "from oracle.__main__ import run; run(); print('not reached')")
    report = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-c", code, str(marker), str(report)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 1, r.stderr  # the demo's divergence
    assert "First divergence" in r.stdout and "not reached" not in r.stdout
    assert marker.read_text() == "ran"
    assert json.loads(report.read_text())["verdict"]


@pytest.mark.parametrize("argv, live", [
    (["compare", "--problem", "case.toml"], True), (["compare", "--kernel=k.cu", "--entry", "k"], True),
    (["compare", "--problem=m=64,n=64,k=64"], True), (["compare", "--demo"], False),
    (["compare", "--dump", "d.safetensors"], False), (["repro", "--problem", "case.toml"], False), ([], False)])
def test_a_child_is_started_ahead_only_for_a_live_compare(argv, live):
    from oracle.tools.startup import runs_a_kernel as _runs_a_kernel

    assert _runs_a_kernel(argv) is live


def test_a_command_run_in_process_starts_its_child_ahead_and_stops_it_if_no_kernel_ran(monkeypatch, tmp_path):
    """cli.main in a process already up (a script, the server), with a GPU: a live compare starts
    the kernel's child ahead; one that fails before its run stops it again, and a command that
    runs no kernel starts none."""
    from harness import child_process
    from oracle.tools import cli

    calls = []
    monkeypatch.setattr(cli, "_gpu_visible", lambda: True)
    monkeypatch.setattr(child_process, "prestart", lambda *a: calls.append("prestart") or True)
    monkeypatch.setattr(child_process, "discard", lambda *a: calls.append("discard"))
    assert cli.main(["compare", "--problem", str(tmp_path / "missing.toml")]) == 2
    assert calls == ["prestart", "discard"]
    calls.clear()
    assert cli.main(["knobs"]) == 0
    assert calls == []


def test_a_process_that_runs_on_keeps_a_child_ahead_and_the_plain_command_does_not(monkeypatch):
    """A live run's request path, with a GPU, keeps the next run's child started ahead
    (harness.child_process.keep_ahead); the plain command (`python -m oracle compare`) said first
    that it runs one, so it keeps none; without a GPU nothing changes."""
    import torch

    from harness import child_process
    from oracle.run import execute
    from oracle.tools import startup

    monkeypatch.setattr(child_process, "_ahead", "unsaid")
    monkeypatch.setattr(child_process, "prestart", lambda *a, **kw: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    execute._keep_a_child_ahead()
    assert child_process._ahead == "unsaid", "no GPU: no child to keep"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    execute._keep_a_child_ahead()
    assert child_process._ahead == "on", "a script or the server"
    monkeypatch.setattr(child_process, "_ahead", "unsaid")
    assert startup.prestart_for(["compare", "--problem", "case.toml"], last=True)
    execute._keep_a_child_ahead()
    assert child_process._ahead == "never", "the plain command"


def test_module_entry_point_runs_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-m", "oracle", "compare", "--demo", "--quiet"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr


def test_a_reader_that_leaves_early_leaves_the_verdict_s_exit_code_and_no_error(tmp_path):
    """`python -m oracle compare --demo | head -c 1` or `| true`: the pipe closes under the report,
    which is the reader's choice, not an error of the command (here it is closed before the report
    is written, so every write meets it)."""
    r, w = os.pipe()
    os.close(r)  # the reader has left
    proc = subprocess.Popen([sys.executable, "-m", "oracle", "compare", "--demo", "--json", str(tmp_path / "r.json")],
                            cwd=ROOT, stdout=w, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})  # each write meets it
    os.close(w)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 1, err  # the demo's divergence
    assert "Broken pipe" not in err and "error" not in err, err
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "DIVERGED"

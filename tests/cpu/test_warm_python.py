"""The tests' warm interpreter (tests/warm_python.py) runs a command as a fresh `python` does: the same
exit status, output, argv, sys.path, environment, working directory and stdin, non-daemon threads
joined and exit handlers run before it leaves; a time limit raises as subprocess.run does; a command it
cannot serve (another environment, `-c`) runs fresh."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import warm_python  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import atexit, json, os, sys, threading, time
with open(os.path.join(os.path.dirname(__file__), "ran.txt"), "a") as f:  # torch loaded: a warm process
    print("torch" in sys.modules, file=f)
atexit.register(lambda: print("exit handler ran"))
def late():
    time.sleep(0.2)
    print("thread joined")
threading.Thread(target=late).start()
print(json.dumps({"argv": sys.argv, "path": sys.path[:3], "cwd": os.getcwd(), "stdin": sys.stdin.read(),
                  "knob": os.environ.get("WARM_PYTHON_TEST"), "interpret": os.environ.get("TRITON_INTERPRET"),
                  "main": __name__}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
'''


def _both(argv, **kw):
    fresh = subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)
    warm = warm_python.run(argv, text=True, timeout=120, **kw)
    return fresh, warm


def test_a_script_runs_as_it_does_in_a_fresh_process(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    extra = tmp_path / "extra"
    env = dict(os.environ, PYTHONPATH=str(extra), TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    fresh, warm = _both([sys.executable, str(script), "3", "word"], cwd=ROOT, env=env, input="given on stdin")
    assert (warm.returncode, warm.stdout, warm.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.returncode == 3 and '"stdin": "given on stdin"' in fresh.stdout
    assert f'"path": ["{tmp_path}", "{extra}"' in fresh.stdout
    assert fresh.stdout.endswith("thread joined\nexit handler ran\n") and fresh.stderr == "to stderr\n"
    assert (tmp_path / "ran.txt").read_text().split() == ["False", "True"], "fresh, then in the warm process"


def test_a_module_runs_as_it_does_in_a_fresh_process():
    fresh, warm = _both([sys.executable, "-m", "oracle", "knobs"], cwd=ROOT)
    assert fresh.returncode == 0 and (warm.returncode, warm.stdout, warm.stderr) == (0, fresh.stdout, fresh.stderr)
    fresh, warm = _both([sys.executable, "-m", "oracle", "no-such-command"], cwd=ROOT)
    assert fresh.returncode == 2 and (warm.returncode, warm.stdout, warm.stderr) == (2, fresh.stdout, fresh.stderr)


def test_a_time_limit_raises_and_the_command_is_killed(tmp_path):
    script = tmp_path / "sleeps.py"
    pid = tmp_path / "pid"
    script.write_text(f"import os, pathlib, time\npathlib.Path({str(pid)!r}).write_text(str(os.getpid()))\n"
                      "time.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run([sys.executable, str(script)], cwd=ROOT, timeout=3)
    with pytest.raises(ProcessLookupError):  # killed and reaped before the limit was reported
        os.kill(int(pid.read_text()), 0)
    assert warm_python.run([sys.executable, "-m", "oracle", "knobs"], cwd=ROOT).returncode == 0, "it serves on"


def test_each_environment_has_its_own_warm_process_and_what_it_cannot_serve_runs_fresh(tmp_path):
    """A variable a module could read at import time keys another warm process (started with it);
    PYTHONPATH, PYTEST_CURRENT_TEST and TRITON_INTERPRET do not; a TRITON_INTERPRET other than the
    warm process's choice, and `-c`, run as fresh processes."""
    base = dict(os.environ)
    key = warm_python._key
    assert key(dict(base, WARM_PYTHON_TEST="set"), str(ROOT)) != key(base, str(ROOT))
    assert key(base, str(tmp_path)) != key(base, str(ROOT))
    assert key(dict(base, PYTHONPATH="x", PYTEST_CURRENT_TEST="y", TRITON_INTERPRET="1"), str(ROOT)) == \
        key(base, str(ROOT))
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    chosen = warm_python.run([sys.executable, str(script), "0"], cwd=ROOT, text=True)
    other = "0" if '"interpret": "1"' in chosen.stdout else "1"
    fresh, warm = _both([sys.executable, str(script), "0"], cwd=ROOT, env=dict(base, TRITON_INTERPRET=other))
    assert f'"interpret": "{other}"' in warm.stdout and warm.stdout == fresh.stdout
    assert (tmp_path / "ran.txt").read_text().split() == ["True", "False", "False"], "the other value ran fresh"
    code = "import sys; print(sys.argv, 'torch' in sys.modules)"
    assert warm_python.run([sys.executable, "-c", code], text=True).stdout == "['-c'] False\n", "-c ran fresh"

"""The tests' `python -m oracle ...` commands (and `python -m pytest`, `python SCRIPT`), started from a
warm interpreter: importing torch is most of such a command's time on the CPU tier (seconds each).

Data path: run(argv, ...) -> the warm process of this test process for that working directory and
environment (started on first use: it imports torch, triton and the package's command line there as
a fresh `python` would, then waits) -> a fork per command, which takes the command's environment,
stdin, stdout and stderr (files), its sys.argv and sys.path as `python` sets them (the folder of the
module's search or the script first, then PYTHONPATH's entries), runs the module or script as
__main__, and leaves as the interpreter does (non-daemon threads joined, exit handlers run, streams
flushed) with the command's exit status -> that status and the output, as subprocess.run gives them.

Constraints: only a command run by this interpreter (argv[0] is sys.executable) as `-m MODULE` or a
script; its environment may differ from the warm process's only in PYTHONPATH (read by the child as
`python` reads it), TRITON_INTERPRET (unset, or the value the warm process chose as the package
does) and PYTEST_CURRENT_TEST, since anything else could be read at import time (another environment
or working directory has a warm process of its own). Anything else, or a warm process that cannot be
started, runs as a fresh process through subprocess.run. Only the call sites that use run() go
through it: the tests whose subject is a process's own start (the backend choice, the module entry
point, an import from the current folder) keep fresh processes. The socket is an anonymous pair and
the output's folder is private (tempfile), so no other user can reach either.

Not the oracle's own warm server (oracle.tools.server): it runs `oracle` commands only (no scripts),
with only the caller's ORACLE_* variables (no PYTHONPATH), all in one long-lived process whose state
one command leaves to the next; a fork per command starts each from the same imported state.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

# What the commands' processes import anyway: the libraries, the command line and what a compare reaches
# (the backend is chosen first, as the package's first import does: before triton loads).
WARM_MODULES = ("kernels_ref._interpret", "torch", "triton", "numpy", "scipy", "oracle.tools.cli",
                "oracle.tools.api", "oracle.tools.server", "oracle.judging.differential", "oracle.report.table",
                "oracle.repro.generate", "harness.runner", "harness.dump")
TESTS = str(Path(__file__).resolve().parent)
# what a request's environment may set its own way (pytest names the running test in the last)
PER_COMMAND = ("PYTHONPATH", "TRITON_INTERPRET", "PYTEST_CURRENT_TEST")

_warm: dict = {}  # (working directory, environment less PER_COMMAND) -> _Warm, or None: it did not start


class _Warm:
    """A warm process: its Popen, the socket its requests and answers go through, and the
    TRITON_INTERPRET it chose (None: unset)."""

    def __init__(self, env: dict, cwd: str):
        mine, theirs = socket.socketpair()
        self.log = tempfile.TemporaryFile()  # its own stderr (the commands' go to their files)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {TESTS!r}); import warm_python; "
                                   f"warm_python._serve({theirs.fileno()})"],
            env=env, cwd=cwd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.log)
        theirs.close()
        self.sock = mine
        self.lines = mine.makefile("r")
        ready = self.lines.readline().split(" ", 1)
        if ready[0].strip() != "ready":
            self.close()
            raise OSError("the warm process did not start")
        self.interpret = json.loads(ready[1])

    def ask(self, request: dict) -> dict:
        self.sock.sendall((json.dumps(request) + "\n").encode())
        line = self.lines.readline()
        if not line:
            raise OSError("the warm process is gone")
        return json.loads(line)

    def close(self) -> None:
        self.lines.close()
        self.sock.close()
        self.log.close()
        try:
            self.proc.kill()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _command(argv: list[str]) -> Optional[list[str]]:
    """The argv's `-m MODULE args` or `SCRIPT args` (None: a command this does not run)."""
    if not argv or argv[0] != sys.executable or len(argv) < 2:
        return None
    if argv[1] == "-m":
        return argv[1:] if len(argv) > 2 else None
    return None if argv[1].startswith("-") else argv[1:]


def run(argv: list, *, cwd=None, env: Optional[dict] = None, timeout: Optional[float] = None,
        input: Optional[str] = None, capture_output: bool = True, text: bool = False,
        check: bool = False) -> subprocess.CompletedProcess:
    """subprocess.run(argv, ...) for the arguments it takes, through a warm process where it applies
    (module docstring). The output is always captured."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd or os.getcwd())
    command = _command(argv)
    warm = _warm_for(env, cwd) if command is not None else None
    if warm is None or env.get("TRITON_INTERPRET", warm.interpret) != warm.interpret:
        return subprocess.run(argv, cwd=cwd, env=env, timeout=timeout, input=input, capture_output=True,
                              text=text, check=check)
    if warm.interpret is not None:
        env.setdefault("TRITON_INTERPRET", warm.interpret)  # what the command's own first import would set
    with tempfile.TemporaryDirectory(prefix="warm-python-") as d:
        paths = {name: os.path.join(d, name) for name in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w") as f:
            f.write(input or "")
        try:
            answer = warm.ask({"argv": command, "cwd": cwd, "env": env, "timeout": timeout, **paths})
        except OSError as e:  # the warm process is gone mid-command: said, not run again; the next run fresh
            warm.close()
            _warm[_key(env, cwd)] = None
            raise OSError(f"the warm process running {' '.join(argv)} is gone") from e
        out, err = (Path(paths[k]).read_bytes() for k in ("stdout", "stderr"))
    if text:
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
    if answer.get("timed_out"):
        raise subprocess.TimeoutExpired(argv, timeout, out, err)
    done = subprocess.CompletedProcess(argv, answer["returncode"], out, err)
    if check:
        done.check_returncode()
    return done


def _warm_for(env: dict, cwd: str) -> Optional[_Warm]:
    """The warm process for this working directory (`-m` puts it first on sys.path, so a fresh
    process finds its modules there) and environment."""
    key = _key(env, cwd)
    if key not in _warm:
        try:
            _warm[key] = _Warm(dict(key[1]), cwd)
        except OSError:
            _warm[key] = None
    got = _warm[key]
    if got is not None and got.proc.poll() is not None:
        got.close()
        got = _warm[key] = None
    return got


def _key(env: dict, cwd: str) -> tuple:
    """(the working directory, the environment less PER_COMMAND): what a warm process serves."""
    return cwd, frozenset((k, v) for k, v in env.items() if k not in PER_COMMAND)


def close_all() -> None:
    for warm in _warm.values():
        if warm is not None:
            warm.close()
    _warm.clear()


atexit.register(close_all)


# -- the warm process -------------------------------------------------------------------------------
def _serve(fd: int) -> None:
    """Import, say ready, then run each request in a fork of this process and answer its status."""
    import importlib

    sys.path.remove(TESTS)
    for name in WARM_MODULES:
        importlib.import_module(name)
        if name == "kernels_ref._interpret":
            sys.modules[name].choose_backend()  # as the package's first import does
    import threading

    sock = socket.socket(fileno=fd)
    if threading.active_count() != 1:  # a fork would not take the other threads along
        sock.sendall(b"threads\n")
        return
    lines = sock.makefile("r")
    sock.sendall(f"ready {json.dumps(os.environ.get('TRITON_INTERPRET'))}\n".encode())
    for line in lines:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            lines.close()
            sock.close()
            _child(request)
        sock.sendall((json.dumps(_wait(pid, request["timeout"])) + "\n").encode())


def _wait(pid: int, timeout: Optional[float]) -> dict:
    import signal
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG if deadline is not None else 0)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"returncode": -signal.SIGKILL, "timed_out": True}
        time.sleep(0.01)


def _child(request: dict) -> None:
    """Become the command: its streams, folder, environment, argv and sys.path, then run it as
    __main__ and leave as the interpreter would."""
    import runpy
    import threading
    import traceback

    code = 1
    try:
        written = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, name, flags in ((0, "stdin", os.O_RDONLY), (1, "stdout", written), (2, "stderr", written)):
            opened = os.open(request[name], flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        # sys.path as `python` makes it: the search's folder, PYTHONPATH's entries, then the rest
        # (this process's sys.path past its own first entry, as it had no PYTHONPATH)
        first = os.getcwd() if argv[0] == "-m" else os.path.dirname(os.path.abspath(argv[0]))
        given = [os.path.abspath(p) for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [first, *given, *sys.path[1:]]
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]  # runpy sets argv[0] to the module's file
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # as the interpreter reports an uncaught exception
            traceback.print_exc()
            code = 1
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

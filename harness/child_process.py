"""How the kernel child is started: its command and environment, and one child started ahead of
its run (`prestart`), so that its interpreter, its imports and its CUDA context come up while the
caller is still importing torch and preparing the inputs.

A pre-started child (`harness._child --wait DEVICE`, started as harness.python_start starts every
Python: never importing from the caller's folder, in a private 0700 folder of its own until its run
directory comes) initialises CUDA, retains the device's primary context and blocks reading its
stdin. `take(device)` hands it to one run: the run writes the run directory's path to its stdin
and from then on it is that run's child, exactly as a
freshly started one (same request, same files, same time limit from the hand-over on). A child
never taken sees end-of-file when its parent exits, or is killed at exit, and leaves. Standard
library only: this module is imported before torch.

Every child `start` makes has a done pipe (`ChildProcess.done`; the child finds its end in
DONE_FD_VARIABLE): the child writes one byte there once everything it reports is on disk, right
before it exits, so that its parent reads the results while the driver tears the child's CUDA
context down.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from harness.python_start import python_command, python_env

DEFAULT_CHILD = python_command("harness._child", ("-X", "faulthandler"))
WAIT_FLAG = "--wait"
DONE_FD_VARIABLE = "ORACLE_CHILD_DONE_FD"


class ChildProcess(NamedTuple):
    """A started child and the read end of its done pipe (None: it has none, its exit is the end)."""

    proc: subprocess.Popen
    done: Optional[int] = None


_lock = threading.Lock()
# (device, command, the child, its private working folder)
_waiting: Optional[tuple[int, tuple, ChildProcess, Path]] = None


def child_env() -> dict[str, str]:
    env = python_env()
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    env.pop(DONE_FD_VARIABLE, None)  # only `start` names one: the pipe it made
    return env


def start(argv: Sequence[str], *, done_pipe: bool = True, **popen) -> ChildProcess:
    """Popen(argv, **popen) in its own session, with the child's environment and (`done_pipe`) a
    done pipe; raises OSError when it cannot be started."""
    if not done_pipe:
        return ChildProcess(subprocess.Popen(list(argv), env=child_env(), start_new_session=True, **popen))
    done, theirs = os.pipe()
    try:
        env = {**child_env(), DONE_FD_VARIABLE: str(theirs)}
        proc = subprocess.Popen(list(argv), env=env, pass_fds=(theirs,), start_new_session=True, **popen)
    except BaseException:
        os.close(done)
        raise
    finally:
        os.close(theirs)
    return ChildProcess(proc, done)


def close_done(child: ChildProcess) -> None:
    """Close the parent's end of the child's done pipe (once it has been waited on)."""
    if child.done is not None:
        try:
            os.close(child.done)
        except OSError:
            pass


def prestart(device: int = 0, command: Sequence[str] = DEFAULT_CHILD) -> bool:
    """Start one child (`command` + --wait DEVICE) that waits for its run, at most one per process;
    False when one already waits or it could not be started (a run then starts its own)."""
    global _waiting
    with _lock:
        if _waiting is not None:
            return False
        try:
            home = Path(tempfile.mkdtemp(prefix="oracle-child-"))  # 0700, this user's own
        except OSError:
            return False
        try:
            child = start(list(command) + [WAIT_FLAG, str(int(device))], stdin=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(home))
        except OSError:
            shutil.rmtree(home, ignore_errors=True)
            return False
        _waiting = (int(device), tuple(command), child, home)
        return True


def take(device: int, command: Sequence[str] = DEFAULT_CHILD) -> Optional[ChildProcess]:
    """The waiting child, when it was started for `device` with `command` and is still alive; it is
    then the caller's (give it its run directory with `hand_over`). None otherwise."""
    global _waiting
    with _lock:
        if _waiting is None or _waiting[:2] != (int(device), tuple(command)):
            return None
        child, home, _waiting = _waiting[2], _waiting[3], None
    shutil.rmtree(home, ignore_errors=True)  # the child moves to its run directory, made by then
    if child.proc.poll() is not None:
        _stop(child)
        return None
    return child


def hand_over(child: ChildProcess, run_dir: Path) -> bool:
    """Give `child` its run directory; False when it is gone (the caller starts a child instead)."""
    try:
        child.proc.stdin.write(os.fsencode(str(run_dir)) + b"\n")
        child.proc.stdin.close()
    except (OSError, ValueError):
        _stop(child)
        return False
    return True


def discard(device: int = 0, command: Sequence[str] = DEFAULT_CHILD) -> None:
    """Stop the waiting child started for `device` with `command`, if it was not taken (a command
    that started it ahead and then ran no kernel)."""
    child = take(device, command)
    if child is not None:
        _stop(child)


def _stop(child: ChildProcess) -> None:
    close_done(child)
    proc = child.proc
    try:
        proc.stdin.close()
    except (OSError, ValueError, AttributeError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


@atexit.register
def _stop_waiting() -> None:
    global _waiting
    with _lock:
        waiting, _waiting = _waiting, None
    if waiting is not None:
        _stop(waiting[2])
        shutil.rmtree(waiting[3], ignore_errors=True)

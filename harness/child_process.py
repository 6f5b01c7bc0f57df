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

A process that runs on after a live run (the server, a script or notebook calling the oracle) can
keep one child started ahead for its next run (`keep_ahead`): when a run's child has said done and
is gone, `after_run` starts the next one, which is stopped if no run takes it within
ORACLE_CHILD_AHEAD_S seconds. The plain command, which exits after its run, keeps none.

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


class _Waiting(NamedTuple):
    """The child started ahead: for which device and command, its private working folder, the
    process that started it (a forked copy of that process does not own it) and its idle timer."""

    device: int
    command: tuple
    child: ChildProcess
    home: Path
    owner: int
    timer: Optional[threading.Timer]


_lock = threading.Lock()
_waiting: Optional[_Waiting] = None
_exiting = False  # the exit handler has run: no child is started any more
_ahead = "unsaid"  # after a run, start the next run's child: "on" (keep_ahead), "never" (one_run_only)


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


def prestart(device: int = 0, command: Sequence[str] = DEFAULT_CHILD, idle_s: Optional[float] = None) -> bool:
    """Start one child (`command` + --wait DEVICE) that waits for its run, at most one per process;
    False when one already waits or it could not be started (a run then starts its own). With
    `idle_s`, it is stopped if no run has taken it that many seconds later."""
    global _waiting
    with _lock:
        if _exiting or (_waiting is not None and _waiting.owner == os.getpid()):
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
        timer = None
        if idle_s is not None:
            timer = threading.Timer(idle_s, _expire, args=(child,))
            timer.daemon = True
        _waiting = _Waiting(int(device), tuple(command), child, home, os.getpid(), timer)
        if timer is not None:
            timer.start()
        return True


def _expire(child: ChildProcess) -> None:
    """The idle timer of a child started ahead: stop it unless a run took it meanwhile."""
    global _waiting
    with _lock:
        if _waiting is None or _waiting.child is not child:
            return
        waiting, _waiting = _waiting, None
    _drop(waiting)


def take(device: int, command: Sequence[str] = DEFAULT_CHILD) -> Optional[ChildProcess]:
    """The waiting child, when this process started it for `device` with `command` and it is still
    alive; it is then the caller's (give it its run directory with `hand_over`). None otherwise."""
    global _waiting
    with _lock:
        if (_waiting is None or _waiting.owner != os.getpid()
                or (_waiting.device, _waiting.command) != (int(device), tuple(command))):
            return None
        waiting, _waiting = _waiting, None
    if waiting.timer is not None:
        waiting.timer.cancel()
    child = waiting.child
    shutil.rmtree(waiting.home, ignore_errors=True)  # the child moves to its run directory, made by then
    if child.proc.poll() is not None:
        _stop(child)
        return None
    return child


def keep_ahead() -> None:
    """From now on, keep a child started ahead for this process's next run (`after_run`), unless
    the process said it runs one only."""
    global _ahead
    with _lock:
        if _ahead != "never":
            _ahead = "on"


def one_run_only() -> None:
    """This process exits after its run (the plain command): it never keeps a child ahead."""
    global _ahead
    with _lock:
        _ahead = "never"


def after_run(device: int, command: Sequence[str]) -> bool:
    """A run's child said done and is gone: start the next run's child ahead when this process
    keeps one (`keep_ahead`) and ORACLE_CHILD_AHEAD_S is not 0; whether one was started."""
    if _ahead != "on":
        return False
    from harness import knobs

    try:
        idle = knobs.get("ORACLE_CHILD_AHEAD_S")
    except knobs.KnobError:  # the next run reports the malformed knob, if it reads it
        return False
    return idle > 0 and prestart(device, command, idle_s=idle)


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


def _stop_waiting() -> None:
    """Stop the child waiting for a run, if this process started one."""
    global _waiting
    with _lock:
        waiting, _waiting = _waiting, None
    if waiting is not None and waiting.owner == os.getpid():
        _drop(waiting)


def _drop(waiting: _Waiting) -> None:
    """A child that no run took: its timer cancelled, the child stopped, its folder removed."""
    if waiting.timer is not None:
        waiting.timer.cancel()
    _stop(waiting.child)
    shutil.rmtree(waiting.home, ignore_errors=True)


@atexit.register
def _at_exit() -> None:
    """No child is started from now on (a run's reaper thread may still finish), and the waiting
    one is stopped."""
    global _exiting
    with _lock:
        _exiting = True
    _stop_waiting()

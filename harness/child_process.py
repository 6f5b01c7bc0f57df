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
from typing import Optional, Sequence

from harness.python_start import python_command, python_env

DEFAULT_CHILD = python_command("harness._child", ("-X", "faulthandler"))
WAIT_FLAG = "--wait"

_lock = threading.Lock()
# (device, command, process, its private working folder)
_waiting: Optional[tuple[int, tuple, subprocess.Popen, Path]] = None


def child_env() -> dict[str, str]:
    env = python_env()
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


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
            proc = subprocess.Popen(list(command) + [WAIT_FLAG, str(int(device))], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                                    cwd=str(home), start_new_session=True)
        except OSError:
            shutil.rmtree(home, ignore_errors=True)
            return False
        _waiting = (int(device), tuple(command), proc, home)
        return True


def take(device: int, command: Sequence[str] = DEFAULT_CHILD) -> Optional[subprocess.Popen]:
    """The waiting child, when it was started for `device` with `command` and is still alive; it is
    then the caller's (give it its run directory with `hand_over`). None otherwise."""
    global _waiting
    with _lock:
        if _waiting is None or _waiting[:2] != (int(device), tuple(command)):
            return None
        proc, home, _waiting = _waiting[2], _waiting[3], None
    shutil.rmtree(home, ignore_errors=True)  # the child moves to its run directory, made by then
    if proc.poll() is not None:
        _stop(proc)
        return None
    return proc


def hand_over(proc: subprocess.Popen, run_dir: Path) -> bool:
    """Give `proc` its run directory; False when it is gone (the caller starts a child instead)."""
    try:
        proc.stdin.write(os.fsencode(str(run_dir)) + b"\n")
        proc.stdin.close()
    except (OSError, ValueError):
        _stop(proc)
        return False
    return True


def _stop(proc: subprocess.Popen) -> None:
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

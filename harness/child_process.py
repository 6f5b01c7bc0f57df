"""How the kernel child is started: its command and environment, and one child started ahead of
its run (`prestart`), so that its interpreter, its imports and its CUDA context come up while the
caller is still importing torch and preparing the inputs.

A pre-started child (`python -m harness._child --wait DEVICE`) initialises CUDA, retains the
device's primary context and blocks reading its stdin. `take(device)` hands it to one run: the run
writes the run directory's path to its stdin and from then on it is that run's child, exactly as a
freshly started one (same request, same files, same time limit from the hand-over on). A child
never taken sees end-of-file when its parent exits, or is killed at exit, and leaves. Standard
library only: this module is imported before torch.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHILD = (sys.executable, "-X", "faulthandler", "-m", "harness._child")
WAIT_FLAG = "--wait"

_lock = threading.Lock()
_waiting: Optional[tuple[int, tuple, subprocess.Popen]] = None  # (device, command, process)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
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
            proc = subprocess.Popen(list(command) + [WAIT_FLAG, str(int(device))], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
                                    start_new_session=True)
        except OSError:
            return False
        _waiting = (int(device), tuple(command), proc)
        return True


def take(device: int, command: Sequence[str] = DEFAULT_CHILD) -> Optional[subprocess.Popen]:
    """The waiting child, when it was started for `device` with `command` and is still alive; it is
    then the caller's (give it its run directory with `hand_over`). None otherwise."""
    global _waiting
    with _lock:
        if _waiting is None or _waiting[:2] != (int(device), tuple(command)):
            return None
        proc, _waiting = _waiting[2], None
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

"""The references' once-per-process costs, paid on a background thread while a kernel runs.

A fresh process pays, on its first judgement, for things that do not depend on the case: torch's
CUDA initialisation in this process, Triton's own key (a hash of its compiler and of libtriton,
which every kernel's disk-cache lookup needs: about 0.4 s on the H200's host) and the imports of
the judgement's modules (Triton parses every kernel's source as its module loads). While the
kernel's child process runs, this process only waits for it, so `start()` pays them on a daemon
thread then, and `wait()` joins it before the judgement goes on (so no two threads import at once).
Nothing here changes a result: each item is what the first judgement would do anyway, and a
failure is left for that judgement to meet and report. Under Triton's interpreter nothing
compiles and no thread is started.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

_started: Optional[threading.Thread] = None
_lock = threading.Lock()


def _pay(then: Optional[Callable[[], None]]) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()  # process-wide; cuBLAS's handles are per thread, so none is made here
    except Exception:  # the judgement itself meets and reports whatever failed here
        pass
    try:
        from triton.runtime.cache import triton_key

        triton_key()
    except Exception:  # another Triton keeps its key elsewhere: the first compile pays for it
        pass
    if then is not None:
        try:
            then()
        except Exception:  # the judgement's own import reports it
            pass


def start(then: Optional[Callable[[], None]] = None) -> Optional[threading.Thread]:
    """Start paying the first-call costs, and then the caller's own (`then`: the judgement's
    imports, oracle.tools.startup), on a daemon thread, once per process; the thread, or None when
    there is nothing to pay (Triton's interpreter)."""
    global _started
    from kernels_ref._common import interpreting

    if interpreting():
        return None
    with _lock:
        if _started is None:
            _started = threading.Thread(target=_pay, args=(then,), name="oracle-first-call", daemon=True)
            _started.start()
        return _started


def wait() -> None:
    """Join the thread `start` started (at once when none was, or it has finished)."""
    with _lock:
        thread = _started
    if thread is not None and thread is not threading.current_thread():
        thread.join()

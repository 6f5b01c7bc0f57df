"""A time limit for a block of a test, so that a regression fails instead of hanging."""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Hung(TimeoutError):
    """The block ran past its limit."""


@contextmanager
def deadline(seconds: int):
    """Raise Hung (a TimeoutError) when the block runs longer than `seconds` (main thread only)."""
    def ring(*_):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)

"""The build's error types, apart so that the build (harness.build) and its cache on disk
(harness.build_cache) both raise them without importing each other. harness.build re-exports them.
"""

from __future__ import annotations

from typing import Sequence

from harness.errors import BadInput


class BuildError(BadInput, RuntimeError):
    """nvcc failed (or could not run). `stderr` holds nvcc's own words, `command` the argv."""

    def __init__(self, message: str, *, stderr: str = "", command: Sequence[str] = ()):
        self.stderr = stderr
        self.command = tuple(command)
        full = message if not stderr else f"{message}\n--- nvcc output ---\n{stderr.rstrip()}"
        super().__init__(full)


class DefineError(BuildError, ValueError):
    """A define's name or value outside harness.names' grammar (a C identifier; a safe word)."""


class CacheDirError(BuildError):
    """A folder of the build cache that another user could write: owned by someone else, group- or
    world-writable, a symbolic link, or not a folder. Nothing in it is used."""


class LockTimeoutError(BuildError):
    """A build lock or build slot was still held by another process after ORACLE_BUILD_LOCK_TIMEOUT_S."""

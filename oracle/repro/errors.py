"""The reproducer's error."""

from harness.errors import BadInput


class ReproError(BadInput, ValueError):
    """A reproducer that cannot be written or read back; the message names the file or field."""

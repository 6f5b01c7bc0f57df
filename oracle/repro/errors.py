"""The reproducer's error."""


class ReproError(ValueError):
    """A reproducer that cannot be written or read back; the message names the file or field."""

"""Input files read with a bound: a regular file, its size checked before a byte is read.

`name` is how a message calls the file (e.g. "cubin /x.cubin"), `limit_text` what the limit is
(e.g. "ORACLE_CUBIN_MAX_MB (64 MiB)"); every failure is `error` (the reader's own error type).
"""

from __future__ import annotations

import os
import stat
from typing import Union

Path = Union[str, os.PathLike]


def regular_file_size(path: Path, name: str, limit: int, limit_text: str, error: type) -> int:
    """The size of `path`, a regular file of at most `limit` bytes."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{name} is not a regular file")
    if st.st_size > limit:
        raise error(f"{name} has {st.st_size} bytes, more than {limit_text}")
    return st.st_size


def read_bounded(path: Path, name: str, limit: int, limit_text: str, error: type) -> bytes:
    """The bytes of `path` (regular_file_size's checks first); never more than `limit` + 1 are read,
    so a file that grows after the check is still caught by its caller's length check."""
    regular_file_size(path, name, limit, limit_text, error)
    try:
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None

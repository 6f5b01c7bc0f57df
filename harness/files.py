"""Input files read with a bound: a regular file, its size checked before a byte is read.

`name` is how a message calls the file (e.g. "cubin /x.cubin"), `limit_text` what the limit is
(e.g. "ORACLE_CUBIN_MAX_MB (64 MiB)"); every failure is `error` (the reader's own error type).
With `nofollow`, a symbolic link is refused instead of followed (the file itself is opened with
O_NOFOLLOW and checked again once open, so a swap after the check is caught); files of the kernel's
pseudo-filesystems (/proc, /sys, /dev) are refused too: they claim a size of 0 or 4096 and hold
something else. Every file is checked to be a regular one before it is opened, and opened with
O_NONBLOCK (a FIFO swapped in after the check cannot make the open wait for a writer).
"""

from __future__ import annotations

import os
import stat
from typing import Union

Path = Union[str, os.PathLike]

PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


def _pseudo(path: Path) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + "/") for r in PSEUDO_ROOTS)


def regular_file_size(path: Path, name: str, limit: int, limit_text: str, error: type, *,
                      nofollow: bool = False) -> int:
    """The size of `path`, a regular file of at most `limit` bytes."""
    try:
        st = os.lstat(path) if nofollow else os.stat(path)
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise error(f"{name} is not a regular file but a symbolic link, which is not followed")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{name} is not a regular file")
    if nofollow and _pseudo(path):
        raise error(f"{name} is a file of {', '.join(PSEUDO_ROOTS)}, not a regular file")
    if st.st_size > limit:
        raise error(f"{name} has {st.st_size} bytes, more than {limit_text}")
    return st.st_size


def read_bounded(path: Path, name: str, limit: int, limit_text: str, error: type, *,
                 nofollow: bool = False) -> bytes:
    """The bytes of `path` (regular_file_size's checks first); never more than the open file's size
    (at most `limit`) + 1 are read, and a file that grew past its size while it was read is refused."""
    return read_bounded_stat(path, name, limit, limit_text, error, nofollow=nofollow)[0]


def read_bounded_stat(path: Path, name: str, limit: int, limit_text: str, error: type, *,
                      nofollow: bool = False) -> tuple[bytes, os.stat_result]:
    """read_bounded, with the open file's stat (its mtime, to keep it on a copy). The bytes are read
    in chunks up to the open file's own size + 1, never `limit` at once: a small file costs its size
    whatever the limit (a single read of `limit` + 1 reserves that much before reading)."""
    return _read_regular(path, name, limit, limit_text, error, nofollow, None)


def read_head(path: Path, name: str, count: int, limit: int, limit_text: str, error: type, *,
              nofollow: bool = False) -> bytes:
    """The first `count` bytes of `path` (regular_file_size's checks first): enough to tell what
    kind of file it is without reading it all."""
    return _read_regular(path, name, limit, limit_text, error, nofollow, count)[0]


def _read_regular(path: Path, name: str, limit: int, limit_text: str, error: type, nofollow: bool,
                  count) -> tuple[bytes, os.stat_result]:
    """The whole file (count None: refused when it grew while read) or its first `count` bytes."""
    regular_file_size(path, name, limit, limit_text, error, nofollow=nofollow)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)  # a FIFO never blocks
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{name} is not a regular file")
        with os.fdopen(fd, "rb", buffering=0) as f:
            fd = -1
            if count is not None:
                return _read_chunks(f, count), st
            data = _read_chunks(f, min(limit, st.st_size) + 1)
        if len(data) > st.st_size:
            raise error(f"{name} grew while it was read (more than its {st.st_size} bytes)")
        return data, st
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)


_CHUNK = 1 << 20


def _read_chunks(f, most: int) -> bytes:
    """At most `most` bytes of `f`, read a chunk at a time."""
    parts, left = [], most
    while left > 0:
        piece = f.read(min(_CHUNK, left))
        if not piece:
            break
        parts.append(piece)
        left -= len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)

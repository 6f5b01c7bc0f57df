"""Output files written whole and without following anyone's link: a dump, a report, JSON lines, a
picture, wherever the user points them (a shared /tmp included).

`write_atomically(path, write, name, error)`: the destination is refused when it is a symbolic
link, a FIFO, a directory or anything but a regular file (nothing is opened through it); the bytes
go to a new file of an unpredictable name in the destination's folder, created with
O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 (tempfile.mkstemp), given the mode open() would have
given it (0666 less the umask) through its descriptor, then renamed over the destination, which
replaces a directory entry and never writes into an existing file. A reader never sees half a file;
on any failure the new file is removed and the destination is as it was. Every failure is `error`
(the caller's own error type; OutputFileError by default), naming the file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import BinaryIO, Callable, Union

from harness.errors import BadInput

Path = Union[str, os.PathLike]


class OutputFileError(BadInput, OSError):
    """An output file that cannot be written where it was pointed: a link, a FIFO, a directory
    there, or a folder that is missing or not writable."""


def _umask() -> int:
    """The process's umask, read without changing it (another thread may be creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def check_destination(path: Path, name: str, error: type = OutputFileError) -> None:
    """`path` may be written: it does not exist or is a regular file (a link is not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise error(f"cannot write {name} {os.fspath(path)!r}: {exc.strerror or exc}") from None
    kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else
            "a directory" if stat.S_ISDIR(st.st_mode) else None if stat.S_ISREG(st.st_mode) else
            "not a regular file")
    if kind is not None:
        raise error(f"will not write {name} {os.fspath(path)!r}: it is {kind} (only a new or a regular file is "
                    f"replaced, and nothing is written through a link)")


def write_atomically(path: Path, write: Callable[[BinaryIO], None], name: str,
                     error: type = OutputFileError) -> None:
    """Call `write` with a binary file that becomes `path` once `write` returns."""
    path = os.fspath(path)
    check_destination(path, name, error)
    folder, base = os.path.split(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise error(f"cannot write {name} {path!r}: {exc.strerror or exc}") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # a plain file, as open() would make it
        with os.fdopen(fd, "wb") as f:
            fd = -1
            write(f)
        check_destination(path, name, error)  # again: one planted meanwhile is refused (later ones are replaced)
        os.replace(tmp, path)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise error(f"cannot write {name} {path!r}: {exc.strerror or exc}") from None
        raise


def write_text_atomically(path: Path, text: str, name: str, error: type = OutputFileError) -> None:
    data = text.encode()
    write_atomically(path, lambda f: f.write(data), name, error)

"""The build cache on disk, private to its user: the root folder, its entries, its lock and slot files.

Data path: ORACLE_CACHE_DIR -> the root, opened with O_NOFOLLOW and checked on its descriptor (this
user's, not group- or world-writable) -> sub-folders walked from that descriptor, one name at a time,
each checked the same way (created 0700) -> files opened relative to their folder's descriptor, never
through a symbolic link. An entry is `<key>.<suffix>` (the built file) and `<key>.json` (its record:
the built file's sha256, or nvcc's exit code for a failed build, with the command and the log), both
written 0600 to a temp file of unpredictable name (O_EXCL | O_NOFOLLOW) renamed into place. A hit is a
record and a built file that are regular files of this user that nobody else can write, the built
file's bytes hashing to the recorded digest; anything else is a miss, rebuilt and renamed over.

Lock and slot files are regular files of this user opened O_NOFOLLOW | O_NONBLOCK (created 0600): a
link, a FIFO, another owner's file or one others can write there is removed and made again (safe: the
root passed the checks, so only this user could have put it there). Waiting for one ends after
ORACLE_BUILD_LOCK_TIMEOUT_S with a LockTimeoutError naming the file (and its holder when /proc/locks
says).

Constraints: POSIX (descriptor-relative opens); where flock is missing, locks and slots are no-ops
(builds race, writes stay atomic). An existing root or sub-folder that fails the checks is refused
with CacheDirError, never repaired or worked around: a private fallback would hide the problem and
lose the cache each time. The root's parent folders are not checked; everything after the root's
open goes through its descriptor, so a parent renamed later cannot redirect it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional

from harness.build_errors import BuildError, CacheDirError, LockTimeoutError

DIR_MODE = 0o700
FILE_MODE = 0o600
ENTRY_FORMAT = 2  # the .json's layout: sha256 of the built file, failed builds recorded
LOCK_POLL_S = 0.05
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_FIX = "set ORACLE_CACHE_DIR to a private folder (one the oracle creates is made 0700)"


def _mode_text(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"


def _unsafe(st: os.stat_result) -> Optional[str]:
    """Why another user could change this file or folder, or None."""
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & _OTHERS_WRITE:
        return "its group or other users may write it"
    return None


def _check_dir(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    reason = _unsafe(st)
    if reason is not None:
        raise CacheDirError(f"build cache folder {path} ({_mode_text(st)}) is refused: {reason}, so another user "
                            f"could plant builds in it that the oracle would load; {_FIX}, or make {path} "
                            f"yours with no group/other write (chmod 700)")


def _open_dir(name: str, dir_fd: Optional[int], path: Path) -> int:
    """Create `name` 0700 when missing, open it without following a link and check it."""
    created = True
    try:
        os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
    except FileExistsError:
        created = False
    except OSError as exc:
        raise CacheDirError(f"cannot create build cache folder {path}: {exc.strerror or exc}; {_FIX}") from None
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                kind = "a symbolic link" if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode) else "not a folder"
            except OSError:
                kind = "not a folder"
            raise CacheDirError(f"build cache folder {path} is refused: it is {kind}, which is never followed "
                                f"(another user could point it at a folder of theirs); {_FIX}") from None
        raise CacheDirError(f"cannot open build cache folder {path}: {exc.strerror or exc}; {_FIX}") from None
    try:
        if created:
            os.fchmod(fd, DIR_MODE)  # exactly 0700, whatever the umask
        _check_dir(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class CacheDir:
    """An open, checked folder of the cache: its descriptor, and its path for messages and results.
    Close it (or use it in a with-block); `sub` opens a folder below it."""
    fd: int
    path: Path

    def __enter__(self) -> "CacheDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        os.close(self.fd)

    def sub(self, *names: str) -> "CacheDir":
        """The folder `names` below this one, each part created 0700 when missing and checked."""
        fd, path = os.dup(self.fd), self.path
        try:
            for name in names:
                if not name or "/" in name or name in (".", ".."):
                    raise ValueError(f"cache folder name {name!r} must be one plain name")
                path = path / name
                nfd = _open_dir(name, fd, path)
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return CacheDir(fd, path)

    def read_private(self, name: str, limit: int) -> Optional[bytes]:
        """The bytes of `name`, or None unless it is a regular file of this user that nobody else may
        write, of at most `limit` bytes. Never follows a link, never waits on a FIFO."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or _unsafe(st) is not None or st.st_size > limit:
                return None
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(limit + 1)
            return data if len(data) <= limit else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def write_private(self, name: str, data: bytes) -> None:
        """Write `name` atomically, 0600: a temp file of unpredictable name created O_EXCL | O_NOFOLLOW,
        renamed over whatever was there (a link is replaced, not followed)."""
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, FILE_MODE,
                         dir_fd=self.fd)
        except OSError as exc:
            raise BuildError(f"cannot write to the build cache folder {self.path}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            if isinstance(exc, OSError):
                raise BuildError(f"cannot write {self.path / name}: {exc.strerror or exc}") from None
            raise

    def open_lock(self, name: str, what: str) -> int:
        """A descriptor of the lock file `name`: a regular file of this user that nobody else may write,
        created 0600. A link, FIFO or other bad file there is removed and made again."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
        path = self.path / name
        for _ in range(3):
            try:
                fd = os.open(name, flags, FILE_MODE, dir_fd=self.fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM, errno.ENOTDIR):
                    raise BuildError(f"cannot open the {what} {path}: {exc.strerror or exc}") from None
                self._remove_bad(name, what)
                continue
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and _unsafe(st) is None:
                return fd
            os.close(fd)
            self._remove_bad(name, what)
        raise BuildError(f"the {what} {path} is not a regular file of this user, and removing it did not help "
                         f"(it came back each time)")

    def _remove_bad(self, name: str, what: str) -> None:
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise BuildError(f"the {what} {self.path / name} is a folder; remove it")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)


def open_root(path: os.PathLike) -> CacheDir:
    """The cache's root, created 0700 when missing (its parents as usual), opened without following a
    link and checked; CacheDirError when it belongs to another user, others may write it, or it is a
    link or not a folder."""
    root = Path(os.path.abspath(Path(path).expanduser()))
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheDirError(f"cannot create the build cache's parent folder {root.parent}: "
                            f"{exc.strerror or exc}; {_FIX}") from None
    return CacheDir(_open_dir(str(root), None, root), root)


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    """One cache entry: a built file (ok, with its verified bytes and sha256) or a failed build (nvcc's
    exit code). `path` is the built file, or the record of a failure."""
    key: str
    ok: bool
    log: str
    command: tuple[str, ...]
    path: Path
    returncode: int = 0
    sha256: str = ""
    data: bytes = field(default=b"", repr=False, compare=False)

    def __post_init__(self):
        if self.ok and self.sha256 != sha256(self.data):
            raise ValueError(f"entry {self.key}: sha256 {self.sha256!r} is not the digest of its data")
        if not self.ok and self.returncode == 0:
            raise ValueError(f"entry {self.key}: a failed build needs nvcc's non-zero exit code, got 0")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


RECORD_LIMIT = 64 << 20  # a record holds nvcc's log; more than this is not one of ours


def read_entry(folder: CacheDir, key: str, suffix: str, limit: int) -> Optional[Entry]:
    """The entry `key` of `folder` when it passes every check (see the module docstring), else None."""
    raw = folder.read_private(f"{key}.json", RECORD_LIMIT)
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("format") != ENTRY_FORMAT or rec.get("key") != key:
        return None
    log, command, ok = rec.get("log"), rec.get("command"), rec.get("ok")
    if not (isinstance(log, str) and isinstance(command, list) and all(isinstance(c, str) for c in command)
            and isinstance(ok, bool)):
        return None
    if not ok:
        rc = rec.get("returncode")
        if not isinstance(rc, int) or isinstance(rc, bool) or rc == 0:
            return None
        return Entry(key, False, log, tuple(command), folder.path / f"{key}.json", returncode=rc)
    digest = rec.get("sha256")
    if not isinstance(digest, str) or not _SHA256_RE.match(digest):
        return None
    data = folder.read_private(f"{key}.{suffix}", limit)
    if data is None or sha256(data) != digest:
        return None
    return Entry(key, True, log, tuple(command), folder.path / f"{key}.{suffix}", sha256=digest, data=data)


def write_entry(folder: CacheDir, suffix: str, entry: Entry, *, source: str, key_parts: Mapping[str, object],
                seconds: float) -> None:
    """Write `entry`: the built file first, then its record (the record is what makes a hit)."""
    rec = {"format": ENTRY_FORMAT, "key": entry.key, "ok": entry.ok, "source": source,
           "command": list(entry.command), "log": entry.log, "key_parts": dict(key_parts),
           "seconds": round(seconds, 3)}
    if entry.ok:
        folder.write_private(f"{entry.key}.{suffix}", entry.data)
        rec.update(sha256=entry.sha256, size=len(entry.data))
    else:
        rec["returncode"] = entry.returncode
    folder.write_private(f"{entry.key}.json", json.dumps(rec, indent=1).encode())


# --------------------------------------------------------------------------- locks and slots


def _holders(fd: int) -> list[int]:
    """The processes /proc/locks says hold a flock on `fd`'s file (best effort; [] when unknown)."""
    st = os.fstat(fd)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == ident:
                    pids.append(int(parts[4]))
    except (OSError, ValueError):
        return []
    return pids


def _held_by(pids: list[int]) -> str:
    return f"held by process {', '.join(map(str, pids))}" if pids else "held by another process"


def _timeout_advice(timeout: float) -> str:
    return (f"raise ORACLE_BUILD_LOCK_TIMEOUT_S (now {timeout:g} s) if that build is slow, or end the "
            f"process holding it")


def _fcntl():
    try:
        import fcntl
    except ImportError:
        return None
    return fcntl


@contextlib.contextmanager
def hold_lock(folder: CacheDir, name: str, what: str, timeout: float) -> Iterator[None]:
    """Hold the lock file `name` of `folder`, waiting at most `timeout` seconds (LockTimeoutError)."""
    fcntl = _fcntl()
    if fcntl is None:
        yield
        return
    fd = folder.open_lock(name, what)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeoutError(f"waited {timeout:g} s for the {what} {folder.path / name}, "
                                           f"{_held_by(_holders(fd))}; {_timeout_advice(timeout)}") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def hold_slot(folder: CacheDir, jobs: int, timeout: float) -> Iterator[None]:
    """Hold one of the `jobs` slot files `0.lock`... of `folder`, waiting at most `timeout` seconds."""
    fcntl = _fcntl()
    if fcntl is None:
        yield
        return
    first = os.getpid() % jobs  # processes start their search at different slots
    deadline = time.monotonic() + timeout
    while True:
        holders: list[int] = []
        for i in range(jobs):
            fd = folder.open_lock(f"{(first + i) % jobs}.lock", "build slot")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holders += _holders(fd)
                os.close(fd)
                continue
            try:
                yield
            finally:
                os.close(fd)
            return
        if time.monotonic() >= deadline:
            raise LockTimeoutError(f"waited {timeout:g} s for one of the {jobs} build slots in {folder.path} "
                                   f"(ORACLE_BUILD_JOBS), all {_held_by(holders)}; {_timeout_advice(timeout)}")
        time.sleep(LOCK_POLL_S)

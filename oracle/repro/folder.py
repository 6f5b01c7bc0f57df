"""A reproducer's folder on disk: where the oracle may write one, how it writes and copies files
there, and the manifest that proves which files are its own.

The rules:
- `--out DIR` is used only when it is new (created here), empty, or holds exactly what the oracle
  wrote there before: every file listed in its manifest (MANIFEST, written last) with the same
  size and sha256, plus the files a build or run of the reproducer makes (BUILD_OUTPUTS, regular files at the
  top). Anything else (a bare repro.json, a file not in the manifest, a changed file, a symbolic
  link, a fifo, a folder it did not write) refuses the folder in one line, with nothing touched.
- Nothing is followed: DIR itself, its kernel/ tree and every file are opened relative to the
  folder's own descriptor with O_NOFOLLOW, new files with O_EXCL (a name that reappeared is an
  error, never a write through it).
- The kernel's files are copied from regular files only (harness.files with nofollow: no links,
  no /proc, /sys or /dev): the translation unit and the local headers a conservative scan of its
  quoted #include lines reaches (see kernel_files), never a folder's whole contents; every one is a
  CUDA/C++ source by its suffix and its content (harness.source_files: no object, archive, cubin or
  any file holding a NUL byte), so nothing but source text is handed on in a reproducer.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness import names
from harness.files import read_bounded, read_bounded_stat
from harness.source_files import HEADER_SUFFIXES, SOURCE_SUFFIXES, check_source_bytes, check_source_suffix

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "oracle-repro-manifest"
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20
MAX_KERNEL_FILE_BYTES = 64 << 20  # a source or header larger than this is not one (harness.build's limit)
MAX_KERNEL_FILES = 4096
# What `make`, ./repro and ./repro_traced create in the folder: removed when a reproducer is written again.
BUILD_OUTPUTS = ("repro", "repro_traced", "repro.o", "kernel.cubin", "kernel_traced.cubin", "libkernel.so",
                 "libkernel_traced.so", "d.bin", "sink.bin", "result.txt", "o.bin", "lse.bin")
# How far above the source's folder a quoted #include may reach ("../common/x.cuh" beside the kernel's folder).
INCLUDE_LEVELS_UP = 1

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.MULTILINE)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class KernelFile:
    """A file to copy: where it is read from, its name under the copy's root, and its bytes."""

    path: Path
    rel: str
    data: bytes
    mtime_ns: int


class ReproFolder:
    """An open reproducer folder (see the module doc); `error` is the caller's error type."""

    def __init__(self, path, error: type):
        self.path = Path(path)
        self.error = error
        self.hashes: dict[str, dict] = {}  # what was written: {name: {"bytes": n, "sha256": hex}}
        self.fd, self.created = self._open_root()
        try:
            self._old = self._survey() if not self.created else ({}, set())
        except BaseException:
            os.close(self.fd)
            raise

    # ------------------------------------------------------------------ opening and checking

    def _refuse(self, why: str):
        raise self.error(f"--out {self.path}: refused, nothing was touched: {why}")

    def _open_root(self) -> tuple[int, bool]:
        p = self.path
        created = False
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            st = None
        except OSError as e:
            self._refuse(f"cannot read it ({e.strerror or e})")
        if st is not None and stat.S_ISLNK(st.st_mode):
            self._refuse("it is a symbolic link; give the folder itself")
        if st is not None and not stat.S_ISDIR(st.st_mode):
            self._refuse("it exists and is not a folder")
        if st is None:
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(p)
                created = True
            except OSError as e:
                self._refuse(f"cannot create it ({e.strerror or e})")
        try:
            return os.open(p, _DIR_FLAGS), created
        except OSError as e:
            self._refuse(f"cannot open it ({e.strerror or e})")

    def _walk(self, fd: int, prefix: str, files: dict, dirs: set, depth: int = 0) -> None:
        if depth > names.MAX_DEPTH:
            self._refuse(f"{prefix} is nested deeper than {names.MAX_DEPTH} folders")
        for entry in os.scandir(fd):
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                self._refuse(f"it holds a symbolic link, {rel!r}, which the oracle did not write")
            if stat.S_ISDIR(st.st_mode):
                dirs.add(rel)
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                try:
                    self._walk(sub, rel + "/", files, dirs, depth + 1)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                files[rel] = st
            else:
                self._refuse(f"it holds {rel!r}, which is not a regular file")

    def _survey(self) -> tuple[dict, set]:
        """The earlier reproducer's files ({name: listed sha256} plus its build outputs) and folders;
        refuses the folder unless that is all it holds."""
        files: dict[str, os.stat_result] = {}
        dirs: set[str] = set()
        self._walk(self.fd, "", files, dirs)
        if not files and not dirs:
            return {}, set()
        if MANIFEST not in files:
            what = "a repro.json" if "repro.json" in files else "files"
            self._refuse(f"it holds no reproducer the oracle wrote ({what}, but no {MANIFEST} of its own); "
                         f"choose a new or empty folder")
        listed = self._manifest()
        for rel, st in files.items():
            if rel == MANIFEST or rel in BUILD_OUTPUTS and rel not in listed:
                continue
            if rel not in listed:
                self._refuse(f"it holds {rel!r}, which its {MANIFEST} does not list")
            if st.st_size != listed[rel]["bytes"] or self._hash(rel) != listed[rel]["sha256"]:
                self._refuse(f"{rel!r} is not the file the oracle wrote (its sha256 differs from {MANIFEST}'s)")
        parents = {"/".join(rel.split("/")[:i]) for rel in listed for i in range(1, rel.count("/") + 1)}
        extra = sorted(dirs - parents)
        if extra:
            self._refuse(f"it holds the folder {extra[0]!r}, which the oracle did not write")
        present = {rel: listed.get(rel) for rel in files if rel != MANIFEST}
        return present, dirs

    def _manifest(self) -> dict[str, str]:
        data = self.read(MANIFEST, MAX_MANIFEST_BYTES)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            self._refuse(f"its {MANIFEST} is not valid JSON")
        files = doc.get("files") if isinstance(doc, dict) else None
        if not (isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT
                and doc.get("version") == MANIFEST_VERSION and isinstance(files, dict)
                and all(names.is_file_name(k) and k != MANIFEST and isinstance(v, dict) and set(v) == {"bytes", "sha256"}
                        and isinstance(v["bytes"], int) and not isinstance(v["bytes"], bool) and v["bytes"] >= 0
                        and isinstance(v["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", v["sha256"])
                        for k, v in files.items())):
            self._refuse(f"its {MANIFEST} is not a manifest the oracle writes ({MANIFEST_FORMAT!r} version "
                         f"{MANIFEST_VERSION}: files, each a file name with its bytes and sha256)")
        return files

    # ------------------------------------------------------------------ file operations

    def _parent_fd(self, rel: str, create: bool) -> tuple[int, str]:
        """An open descriptor of the folder holding `rel` (the caller closes it unless it is self.fd)."""
        parts = rel.split("/")
        fd = self.fd
        for part in parts[:-1]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if fd != self.fd:
                    os.close(fd)
                why = "a symbolic link" if e.errno in (errno.ELOOP, errno.ENOTDIR) else (e.strerror or str(e))
                raise self.error(f"{self.path}: cannot open the folder of {rel!r}: {why}") from None
            if fd != self.fd:
                os.close(fd)
            fd = nfd
        return fd, parts[-1]

    def _open_read(self, rel: str) -> int:
        fd, base = self._parent_fd(rel, create=False)
        try:
            nfd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            raise self.error(f"{self.path}: cannot read {rel!r}: {e.strerror or e}") from None
        finally:
            if fd != self.fd:
                os.close(fd)
        if not stat.S_ISREG(os.fstat(nfd).st_mode):
            os.close(nfd)
            raise self.error(f"{self.path}: {rel!r} is not a regular file")
        return nfd

    def _hash(self, rel: str) -> str:
        h = hashlib.sha256()
        with os.fdopen(self._open_read(rel), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()

    def read(self, rel: str, limit: int) -> bytes:
        """A regular file of the folder, not followed if it is a link, at most `limit` bytes."""
        with os.fdopen(self._open_read(rel), "rb") as f:
            return f.read(limit)

    def write(self, rel: str, data, mtime_ns: Optional[int] = None) -> None:
        """A new file `rel` (a name of harness.names' grammar) holding `data`; listed in the manifest."""
        names.check_file_name(rel, "a reproducer file", self.error)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        fd, base = self._parent_fd(rel, create=True)
        try:
            try:
                nfd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
            except OSError as e:
                raise self.error(f"{self.path}: cannot write {rel!r}: {e.strerror or e}") from None
        finally:
            if fd != self.fd:
                os.close(fd)
        with os.fdopen(nfd, "wb") as f:
            f.write(raw)
            f.flush()
            if mtime_ns is not None:  # an unchanged source keeps its mtime, so make does not rebuild
                os.utime(f.fileno(), ns=(mtime_ns, mtime_ns))
        self.hashes[rel] = {"bytes": len(raw), "sha256": sha256(raw)}

    def clear(self) -> None:
        """Remove the earlier reproducer's files (its manifest last) and the folders they leave empty."""
        for rel in sorted(self._old[0]) + ([MANIFEST] if self._old[0] or self._old[1] else []):
            self._remove(rel, os.unlink, FileNotFoundError)
        for rel in sorted(self._old[1], key=lambda r: -r.count("/")):
            self._remove(rel, os.rmdir, OSError)  # a folder not left empty stays
        self._old = ({}, set())

    def _remove(self, rel: str, remove, tolerated: type) -> None:
        """`remove` (os.unlink or os.rmdir) of `rel`, relative to its folder's descriptor, never followed."""
        fd, base = self._parent_fd(rel, create=False)
        try:
            remove(base, dir_fd=fd)
        except tolerated:
            pass
        finally:
            if fd != self.fd:
                os.close(fd)

    def finish(self) -> str:
        """Write the manifest (the last file) and close the folder; returns its name."""
        doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
               "files": dict(sorted(self.hashes.items()))}
        raw = (json.dumps(doc, indent=1) + "\n").encode()
        fd = self.fd
        nfd = os.open(MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        with os.fdopen(nfd, "wb") as f:
            f.write(raw)
        self.close()
        return MANIFEST

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ---------------------------------------------------------------------- the kernel's files


def read_kernel_file(path: Path, error: type) -> tuple[bytes, int]:
    """A source or header to copy: a regular file (no link, nothing of /proc, /sys, /dev) within
    MAX_KERNEL_FILE_BYTES; its bytes and mtime."""
    limit = f"the {MAX_KERNEL_FILE_BYTES >> 20} MiB a kernel file may have"
    data, st = read_bounded_stat(path, f"kernel file {str(path)!r}", MAX_KERNEL_FILE_BYTES, limit, error,
                                 nofollow=True)
    if len(data) > MAX_KERNEL_FILE_BYTES:
        raise error(f"kernel file {str(path)!r} has more than {limit}")
    return data, st.st_mtime_ns


def read_source_file(path: Path, error: type, suffixes: tuple[str, ...] = SOURCE_SUFFIXES,
                     where: str = "") -> tuple[bytes, int]:
    """read_kernel_file of a source or header: its suffix checked before it is opened, its content
    after (source text, never an object, archive or other binary); `where` says what named it."""
    name = f"kernel file {str(path)!r}" + (f" ({where})" if where else "")
    check_source_suffix(path, name, error, suffixes)
    data, mtime = read_kernel_file(path, error)
    check_source_bytes(data, name, error)
    return data, mtime


def kernel_files(source: Path, skip_dirs: tuple[Path, ...], error: type) -> tuple[str, list[KernelFile]]:
    """The translation unit and the local headers it includes, found by a conservative scan (not
    nvcc's dependency output, so no compiler is needed to write a reproducer): every quoted
    `#include "name"` of the source and of each header found, #if ignored, resolved as nvcc does
    against the including file's folder; a name found in one of `skip_dirs` (the trace header's
    tree, copied on its own) or nowhere there (CUDA, CUTLASS, the standard library) is not copied.
    A header that is found must be a regular file reached without a symbolic link, inside the tree
    of the source's folder or at most INCLUDE_LEVELS_UP folders above it, with a path there in
    harness.names' file grammar (no hidden '.name' parts); otherwise `error` names it and the file
    that includes it. The source ends in a source suffix, a header in a header suffix, and both hold
    source text (harness.source_files). Returns the source's name relative to the copy's root and the files."""
    if os.path.lexists(source) and stat.S_ISLNK(os.lstat(source).st_mode):
        raise error(f"kernel file {str(source)!r} is a symbolic link: the reproducer copies regular files only")
    src_dir = Path(os.path.realpath(source.parent))
    bound = src_dir
    for _ in range(INCLUDE_LEVELS_UP):
        if bound.parent != bound:
            bound = bound.parent
    main = src_dir / source.name
    data, mtime = read_source_file(main, error)
    found: dict[Path, KernelFile] = {main: KernelFile(main, "", data, mtime)}
    pending = [main]
    while pending:
        here = pending.pop()
        text = found[here].data.decode(errors="replace")
        for name in _INCLUDE_RE.findall(text):
            candidate = Path(os.path.normpath(here.parent / name))
            if not os.path.lexists(candidate):
                continue  # nvcc looks in the -I folders next: CUTLASS, CUDA, the trace header
            if any(d == candidate or d in candidate.parents for d in skip_dirs):
                continue
            if candidate in found:
                continue
            where = f"#include \"{name}\" of {str(here)!r}"
            if os.path.isabs(name):
                raise error(f"{where}: an absolute include path; the reproducer copies files beside the source only")
            if bound not in candidate.parents:
                raise error(f"{where} reaches {str(candidate)!r}, outside {str(bound)!r} (the source's folder and "
                            f"{INCLUDE_LEVELS_UP} above it): the reproducer copies nothing from there")
            if os.path.realpath(candidate) != str(candidate):
                raise error(f"{where} goes through a symbolic link: the reproducer copies regular files only")
            rel = str(candidate.relative_to(bound))
            names.check_file_name(rel, where, error)
            if len(found) >= MAX_KERNEL_FILES:
                raise error(f"{source}: more than {MAX_KERNEL_FILES} local headers")
            data, mtime = read_source_file(candidate, error, HEADER_SUFFIXES, where)
            found[candidate] = KernelFile(candidate, rel, data, mtime)
            pending.append(candidate)
    used = [f.path for f in found.values()]
    root = Path(os.path.commonpath([str(p.parent) for p in used]))
    out = []
    for f in found.values():
        rel = str(f.path.relative_to(root))
        names.check_file_name(rel, f"kernel file {str(f.path)!r}", error)
        out.append(KernelFile(f.path, rel, f.data, f.mtime_ns))
    return str(main.relative_to(root)), out


def read_folder_file(root: Path, name: str, limit: int, limit_text: str, error: type) -> bytes:
    """A file of a reproducer folder for the reader (oracle.repro.readback): the folder not a link, the
    file a regular one opened without following a link."""
    try:
        st = os.lstat(root)
    except OSError as e:
        raise error(f"cannot read {root}: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise error(f"{root} is a symbolic link: give the reproducer's folder itself")
    return read_bounded(root / name, str(root / name), limit, limit_text, error, nofollow=True)

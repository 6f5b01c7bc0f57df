"""Build CUDA sources to cubins (or launch libraries, shared objects) with nvcc, cached on disk.

Data path: source (a file or text) -> its local includes, resolved and hashed -> a cache key over
source, local headers, the whole `harness/include` tree, the trace header version, flags, defines,
the CUTLASS wheel's version and its headers' content (not their folder: two venvs with the same headers
share builds) and `nvcc --version` -> `<cache>/cubin/<kk>/<key>.cubin` (a library:
`<cache>/so/<kk>/<key>.so`) (+ `.json`: the built file's sha256 and the build log, or the exit code
and output of a failed build, which then fails again at once). A hit never runs nvcc, not even
`nvcc --version` (that answer is cached too, keyed by the nvcc binary's path, size and mtime; so is
the CUTLASS headers' digest, keyed by their folders' paths, sizes and mtimes); it hands out the bytes
it hashed (BuildResult.read), not the path to open again.

Constraints: needs nvcc (no GPU); the cache is private to its user and every entry is checked before
use (harness.build_cache: a cache another user could write is refused); writes are atomic (temp file
+ os.replace), so builds racing on one key never expose half a cubin; one build per key at a time,
and at most ORACLE_BUILD_JOBS compiles at once among the processes sharing a cache (build_slot), each
wait bounded by ORACLE_BUILD_LOCK_TIMEOUT_S; nvcc runs in a private temp folder outside the cache;
CUTLASS/CuTe headers come from the `nvidia-cutlass` wheel when it is installed (found without
importing it), and their absence only matters to sources that use them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from harness import knobs as _knobs
from harness.build_cache import sha256 as _sha256
from harness.build_cache import CacheDir, Entry, hold_lock, hold_slot, open_root, read_entry, write_entry
from harness.build_errors import BuildError, CacheDirError, DefineError, LockTimeoutError  # noqa: F401  (re-exported)
from harness.files import read_bounded, read_head
from harness.source_files import MAX_SOURCE_BYTES, check_source_file as _check_source
from harness.names import check_macro_name, check_macro_value

# Bump when the meaning of a cache entry changes (flags added by default, layout of the key...).
BUILD_KEY_VERSION = 3  # 2: entries record their sha256, failed builds are cached; 3: CUTLASS headers hashed

HARNESS_INCLUDE_DIR = Path(__file__).resolve().parent / "include"
TRACE_HEADER = HARNESS_INCLUDE_DIR / "oracle_trace" / "trace.cuh"

DEFAULT_FLAGS = ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-lineinfo")
# A launch library: position-independent, shared, with the CUDA runtime linked in (static), so
# loading it needs no libcudart of a matching version on the machine that runs it.
LIBRARY_FLAGS = ("-shared", "-Xcompiler", "-fPIC", "-cudart", "static")
CUBIN_OUTPUT = ("cubin", ("-cubin",))
LIBRARY_OUTPUT = ("so", LIBRARY_FLAGS)

_ARCH_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.MULTILINE)
_TRACE_VERSION_RES = (
    re.compile(r"^[ \t]*#[ \t]*define[ \t]+ORACLE_TRACE_VERSION[ \t]+(\S+)", re.MULTILINE),
    re.compile(r"\bconstexpr[ \t]+[\w:]+[ \t]+kVersion[ \t]*=[ \t]*([^;]+);"),
)

CUBIN_MAGICS = {b"\x7fELF": "ELF cubin", b"\x50\xed\x55\xba": "fatbin"}
MAX_LIBRARY_BYTES = 1 << 30  # a launch library larger than this is not one


@dataclass(frozen=True)
class BuildResult:
    cubin_path: Path  # the built file: a cubin, or a launch library's .so (build_library)
    cached: bool
    key: str
    log: str = ""  # nvcc's stdout+stderr of the build that produced the cubin (warnings)
    command: tuple[str, ...] = field(default=(), compare=False)
    sha256: str = ""  # the built file's digest ("" for a result made by hand: then nothing to check)
    # The bytes hashed when the entry was checked or built: read() hands these out, so what a run
    # loads is what was verified, not the path opened again later.
    data: Optional[bytes] = field(default=None, repr=False, compare=False)

    def read(self) -> bytes:
        """The built file's bytes: the verified ones this result holds, else the file at cubin_path
        (no link followed), checked against `sha256` when there is one."""
        if self.data is not None:
            return self.data
        limit, limit_name = _entry_limit(self.cubin_path.suffix.lstrip("."))
        data = read_bounded(self.cubin_path, f"built file {self.cubin_path}", limit, limit_name, BuildError,
                            nofollow=True)
        if len(data) > limit:
            raise BuildError(f"built file {self.cubin_path} has more than {limit_name}")
        if self.sha256 and _sha256(data) != self.sha256:
            raise BuildError(f"built file {self.cubin_path} changed since it was built (its sha256 is "
                             f"{_sha256(data)}, the build recorded {self.sha256}); build it again")
        if self.cubin_path.suffix == ".cubin":
            _check_magic(self.cubin_path, data)
        return data


# --------------------------------------------------------------------------- locations


def cutlass_include_dirs() -> tuple[Path, ...]:
    """CUTLASS/CuTe include dirs of the `nvidia-cutlass` wheel, or () when it is not installed."""
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    for loc in spec.submodule_search_locations:
        src = Path(loc) / "source"
        dirs = [d for d in (src / "include", src / "tools" / "util" / "include") if d.is_dir()]
        if dirs and (dirs[0] / "cute").is_dir():
            return tuple(dirs)
    return ()


def cutlass_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def trace_header_version() -> str:
    """The trace header's version (`#define ORACLE_TRACE_VERSION n` or `constexpr ... kVersion = n;`),
    "absent" / "unversioned" otherwise. The whole include tree is hashed too; this names the part."""
    try:
        text = TRACE_HEADER.read_text(errors="replace")
    except OSError:
        return "absent"
    for pattern in _TRACE_VERSION_RES:
        m = pattern.search(text)
        if m:
            return m.group(1).strip()
    return "unversioned"


def default_cache_dir() -> Path:
    return _knobs.get("ORACLE_CACHE_DIR")


# --------------------------------------------------------------------------- small helpers


def arch_flags(arch: str) -> tuple[str, ...]:
    """`sm_90a` -> ('-gencode=arch=compute_90a,code=sm_90a',)."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise ValueError(f"arch {arch!r} must look like sm_90a, sm_90 or sm_100a")
    num, suffix = m.groups()
    return (f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}",)


def define_flags(defines: Mapping[str, object]) -> tuple[str, ...]:
    """-D flags in sorted order; a value of None or True gives `-DNAME`. Names and values must be
    in harness.names' grammar (DefineError otherwise): the flags reach nvcc as argv words and the
    reproducer's Makefile as they are."""
    out = []
    for name in sorted(defines):
        check_macro_name(name, "define name", DefineError)
        value = defines[name]
        if value is None or value is True:
            out.append(f"-D{name}")
        elif value is False:
            out.append(f"-D{name}=0")
        else:
            out.append(f"-D{name}={check_macro_value(str(value), f'define {name}', DefineError)}")
    return tuple(out)


def _cubin_limit() -> tuple[int, str]:
    mb = _knobs.get("ORACLE_CUBIN_MAX_MB")
    return mb << 20, f"the {mb} MiB limit of ORACLE_CUBIN_MAX_MB"


def check_cubin_file(path: Union[str, os.PathLike]) -> None:
    """A prebuilt cubin (or fatbin): a regular file within ORACLE_CUBIN_MAX_MB that starts with a
    cubin's magic. Reads four bytes."""
    head = read_head(path, f"cubin {path}", 4, *_cubin_limit(), BuildError)
    _check_magic(path, head)


def _check_magic(path, head: bytes) -> None:
    if head[:4] not in CUBIN_MAGICS:
        raise BuildError(f"{path} is not a cubin or fatbin (first bytes {head[:4]!r}, "
                         f"expected one of {', '.join(CUBIN_MAGICS.values())})")


def check_source_file(path: Union[str, os.PathLike]) -> None:
    """A CUDA source to build (harness.source_files): a regular file of at most MAX_SOURCE_BYTES with a
    source's suffix and text, never an object, archive or library that nvcc would link."""
    _check_source(path, f"CUDA source {path}", BuildError)


def load_cubin(path: Union[str, os.PathLike]) -> bytes:
    """The bytes of a prebuilt cubin (or fatbin), checked by magic so a wrong file fails early;
    never more than ORACLE_CUBIN_MAX_MB of them are read."""
    limit, limit_name = _cubin_limit()
    data = read_bounded(path, f"cubin {path}", limit, limit_name, BuildError)
    if len(data) > limit:
        raise BuildError(f"cubin {path} has more than {limit_name}")
    _check_magic(path, data)
    return data


def _text(data: Union[str, bytes, None]) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _entry_limit(suffix: str) -> tuple[int, str]:
    """The most bytes a built file of this kind may have (a cubin: ORACLE_CUBIN_MAX_MB)."""
    if suffix == LIBRARY_OUTPUT[0]:
        return MAX_LIBRARY_BYTES, f"the {MAX_LIBRARY_BYTES >> 20} MiB a launch library may have"
    return _cubin_limit()


def _lock_timeout() -> float:
    return _knobs.get("ORACLE_BUILD_LOCK_TIMEOUT_S")


def tree_digest(root: Path) -> str:
    """Hash of every file's relative path and content under `root` ("" when it does not exist)."""
    if not root.is_dir():
        return ""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode() + b"\0" + _sha256(p.read_bytes()).encode() + b"\n")
    return h.hexdigest()


def local_includes(text: str, source_dir: Optional[Path], search_dirs: Sequence[Path]) -> dict[str, str]:
    """Every header reachable through #include that resolves to a file in `source_dir` (quoted
    includes only) or `search_dirs`, recursively: {resolved path: sha256}. Headers not found there
    (CUDA, the standard library, CUTLASS) are left to the version parts of the key. #if is ignored,
    so this over-approximates, which only costs a rebuild."""
    found: dict[str, str] = {}
    pending: list[tuple[str, Optional[Path]]] = [(text, source_dir)]
    while pending:
        body, here = pending.pop()
        for quote, name in _INCLUDE_RE.findall(body):
            candidates = ([here] if (quote == '"' and here is not None) else []) + list(search_dirs)
            for d in candidates:
                p = (d / name)
                if p.is_file():
                    key = str(p.resolve())
                    if key not in found:
                        data = p.read_bytes()
                        found[key] = _sha256(data)
                        pending.append((data.decode(errors="replace"), p.resolve().parent))
                    break
    return found


def _nvcc_path(nvcc: Optional[str]) -> str:
    name = nvcc or _knobs.get("ORACLE_NVCC")
    path = shutil.which(name)
    if path is None:
        raise BuildError(f"nvcc not found (looked for {name!r} on PATH; set ORACLE_NVCC to its path)")
    return path


NVCC_VERSION_LIMIT = 1 << 20  # `nvcc --version` says a few lines


def nvcc_version(nvcc_path: str, cache_dir: Union[CacheDir, str, os.PathLike]) -> str:
    """`nvcc --version`, cached in the build cache (a checked private file, as entries are) by the
    binary's real path, size and mtime. `cache_dir` is the cache's path or its open root."""
    if not isinstance(cache_dir, CacheDir):
        with open_root(cache_dir) as root:
            return nvcc_version(nvcc_path, root)
    real = os.path.realpath(nvcc_path)
    st = os.stat(real)
    ident = f"{real}\0{st.st_size}\0{st.st_mtime_ns}"
    name = f"{_sha256(ident.encode())[:32]}.txt"
    with cache_dir.sub("nvcc-version") as memo:
        known = memo.read_private(name, NVCC_VERSION_LIMIT)
        if known:
            return known.decode(errors="replace")
        try:
            proc = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"could not run {nvcc_path} --version: {exc}") from None
        if proc.returncode != 0:
            raise BuildError(f"{nvcc_path} --version failed with exit code {proc.returncode}",
                             stderr=proc.stderr, command=[nvcc_path, "--version"])
        memo.write_private(name, proc.stdout.encode())
        return proc.stdout


def _tree_files(root: Path) -> list[tuple[str, str]]:
    """(path relative to `root`, full path) of every file under it, in pathlib's order of their parts;
    symlinked folders are not entered and __pycache__ is left out (as rglob would list them). One
    os.walk: pathlib's rglob and relative_to took a quarter of a second over CUTLASS's ~900 headers."""
    out = []
    for here, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f != "__pycache__"]
        rel = os.path.relpath(here, root)
        for f in files:
            full = os.path.join(here, f)
            if os.path.isfile(full):
                out.append((f if rel == "." else os.path.join(rel, f), full))
    return sorted(out, key=lambda x: x[0].split(os.sep))


def cutlass_headers_digest(dirs: Sequence[Path], cache_dir: CacheDir) -> str:
    """The content of the CUTLASS include folders `dirs` (each file's relative path and bytes, folder by
    folder), "" for none. Hashing ~25 MB of headers takes a while, so the digest is kept in the build
    cache (a checked private file, as nvcc's version is) under the folders' real paths and each file's
    relative path, size and mtime: a header changed, added or removed is hashed again."""
    if not dirs:
        return ""
    listing = [(Path(d), _tree_files(Path(d))) for d in dirs]
    stamp = hashlib.sha256()
    for d, files in listing:
        stamp.update(f"{os.path.realpath(d)}\0".encode())
        for rel, full in files:
            st = os.stat(full)
            stamp.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    name = f"{stamp.hexdigest()[:32]}.txt"
    with cache_dir.sub("cutlass-headers") as memo:
        known = (memo.read_private(name, 64) or b"").decode(errors="replace")
        if _SHA256_HEX.match(known):
            return known
        h = hashlib.sha256()
        for i, (d, files) in enumerate(listing):
            for rel, full in files:
                h.update(f"{i}\0{rel}\0".encode() + _sha256(Path(full).read_bytes()).encode() + b"\n")
        digest = h.hexdigest()
        memo.write_private(name, digest.encode())
        return digest


# --------------------------------------------------------------------------- build


def _resolve_source(source: Union[str, os.PathLike]) -> tuple[str, Optional[Path], str]:
    """(text, directory of the file or None, display name). A str with a newline is source text;
    any other str or a PathLike is a path."""
    if isinstance(source, str) and "\n" in source:
        return source, None, "<source text>"
    path = Path(source)
    check_source_file(path)
    limit = f"the {MAX_SOURCE_BYTES >> 20} MiB a CUDA source may have"
    data = read_bounded(path, f"CUDA source {path}", MAX_SOURCE_BYTES, limit, BuildError)
    if len(data) > MAX_SOURCE_BYTES:
        raise BuildError(f"CUDA source {path} has more than {limit}")
    return data.decode(errors="replace"), path.resolve().parent, str(path)


@contextlib.contextmanager
def _slot(root: CacheDir):
    with root.sub("build-slots") as folder, hold_slot(folder, _knobs.get("ORACLE_BUILD_JOBS"), _lock_timeout()):
        yield


@contextlib.contextmanager
def build_slot(cache_dir: Optional[Union[str, os.PathLike]] = None):
    """One of the ORACLE_BUILD_JOBS compile slots of a build cache, held while one compile runs: the
    processes that share the cache (test workers, parallel oracles) run at most that many compiles at
    once, the others wait for a free slot, at most ORACLE_BUILD_LOCK_TIMEOUT_S (LockTimeoutError).
    A compile is a large process: more of them than cores cost CPU time, not only waiting (four
    CUTLASS compiles on two cores took 40 % more CPU than two). Callers that run nvcc themselves
    (make, a test's host program) take a slot the same way; a process must not wait for a build lock
    while it holds a slot. The cache's checks apply (harness.build_cache). Where flock is missing: no
    limit."""
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    with open_root(cache) as root, _slot(root):
        yield


def _result(entry: Entry, cached: bool, display: str, command: tuple[str, ...]) -> BuildResult:
    """The BuildResult of an entry; a failed build's entry raises nvcc's saved words again. `command` is
    this call's nvcc line: the key is content, not paths, so an entry written from another environment
    (another venv's CUTLASS, another checkout) is the same build, and its saved command names that
    environment's folders."""
    if not entry.ok:
        raise BuildError(f"nvcc failed to compile {display} (exit code {entry.returncode}; an identical build "
                         f"failed before and its output is cached in {entry.path}: delete that file to compile "
                         f"again)", stderr=entry.log, command=command)
    return BuildResult(cubin_path=entry.path, cached=cached, key=entry.key, log=entry.log, command=command,
                       sha256=entry.sha256, data=entry.data)


def build_cubin(source: Union[str, os.PathLike], **options) -> BuildResult:
    """Compile `source` (a path, or CUDA source text containing a newline) to a cubin, or return
    the cached one. Raises BuildError with nvcc's output when the compile fails. The options (the
    same for build_library): arch ("sm_90a"), defines, include_dirs, extra_flags, cache_dir, nvcc."""
    return _build(source, CUBIN_OUTPUT, **options)


def build_library(source: Union[str, os.PathLike], **options) -> BuildResult:
    """Compile `source` to a shared library (a launch library: it exports `oracle_launch`, see
    oracle_trace/launch.hpp), or return the cached one; the same key rules, arch, flags and
    defines as build_cubin. The CUDA runtime is linked statically (LIBRARY_FLAGS): the library
    needs no libcudart at load time and cannot pick up another version of it."""
    return _build(source, LIBRARY_OUTPUT, **options)


def _build(
    source: Union[str, os.PathLike],
    output: tuple[str, tuple[str, ...]],
    *,
    arch: str = "sm_90a",
    defines: Optional[Mapping[str, object]] = None,
    include_dirs: Sequence[Union[str, os.PathLike]] = (),
    extra_flags: Sequence[str] = (),
    cache_dir: Optional[Union[str, os.PathLike]] = None,
    nvcc: Optional[str] = None,
) -> BuildResult:
    suffix, output_flags = output
    text, source_dir, display = _resolve_source(source)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    user_dirs = tuple(Path(d).expanduser().resolve() for d in include_dirs)
    cutlass_dirs = cutlass_include_dirs()
    search = user_dirs + (HARNESS_INCLUDE_DIR,)

    flags = (output_flags + arch_flags(arch) + DEFAULT_FLAGS + define_flags(defines or {})
             + tuple(extra_flags))
    # nvcc itself looks next to a source file for quoted includes.
    include_flags = tuple(f"-I{d}" for d in search + cutlass_dirs)

    nvcc_path = _nvcc_path(nvcc)
    with open_root(cache) as root:
        key_parts = {
            "key_version": BUILD_KEY_VERSION,
            "source": _sha256(text.encode()),
            "local_headers": sorted(local_includes(text, source_dir, search).values()),
            "harness_include": tree_digest(HARNESS_INCLUDE_DIR),
            "trace_header_version": trace_header_version(),
            "flags": list(flags),
            # Directories matter only through what they contain (hashed above); their number and
            # order matter because they decide which header wins.
            "include_dirs": [str(d) for d in user_dirs],
            "cutlass": cutlass_version() if cutlass_dirs else "absent",
            # the headers themselves: another install of the same version may differ (patched, edited)
            "cutlass_headers": cutlass_headers_digest(cutlass_dirs, root),
            "nvcc": nvcc_version(nvcc_path, root),
        }
        key = _sha256(json.dumps(key_parts, sort_keys=True).encode())
        limit = _entry_limit(suffix)
        src_name = str(Path(source).resolve()) if source_dir is not None else "source.cu"
        with root.sub(suffix, key[:2]) as folder:
            command = (nvcc_path, *flags, *include_flags, "-o", str(folder.path / f"{key}.{suffix}"), src_name)
            hit = read_entry(folder, key, suffix, limit[0])
            if hit is None:
                with hold_lock(folder, f"{key}.lock", "build lock", _lock_timeout()):
                    hit = read_entry(folder, key, suffix, limit[0])  # built by another process meanwhile
                    if hit is None:
                        hit = _compile(root, folder, key, key_parts, suffix, text, source, source_dir, display,
                                       nvcc_path, flags + include_flags, limit, command)
                        return _result(hit, False, display, command)
            return _result(hit, True, display, command)


def _compile(root: CacheDir, folder: CacheDir, key: str, key_parts: dict, suffix: str, text: str, source,
             source_dir: Optional[Path], display: str, nvcc_path: str, flags: tuple[str, ...],
             limit: tuple[int, str], reported: tuple[str, ...]) -> Entry:
    """Run nvcc in a private temp folder (mkdtemp: 0700, outside the cache) and write the entry: the
    built file, or nvcc's failure (an exit code > 0: the same inputs fail the same way; a signal or a
    timeout may not, so those are not cached). Errors carry `reported`, the line a hit reports."""
    timeout = _knobs.get("ORACLE_NVCC_TIMEOUT_S")
    with tempfile.TemporaryDirectory(prefix="oracle-build-") as tmp:
        tmpdir = Path(tmp)
        if source_dir is None:
            src_file = tmpdir / "source.cu"
            src_file.write_text(text)
        else:
            src_file = Path(source).resolve()
        tmp_out = tmpdir / f"out.{suffix}"
        run = (nvcc_path, *flags, "-o", str(tmp_out), str(src_file))
        try:
            with _slot(root):
                started = time.monotonic()
                proc = subprocess.run(run, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BuildError(f"nvcc did not finish compiling {display} within {timeout:g} s "
                             f"(ORACLE_NVCC_TIMEOUT_S)", stderr=_text(exc.stderr), command=reported) from None
        except OSError as exc:
            raise BuildError(f"could not run nvcc ({nvcc_path}): {exc}", command=reported) from None
        seconds = time.monotonic() - started
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0:
            if proc.returncode > 0:
                write_entry(folder, suffix, Entry(key, False, log, reported, folder.path / f"{key}.json",
                                                  returncode=proc.returncode),
                            source=display, key_parts=key_parts, seconds=seconds)
            raise BuildError(f"nvcc failed to compile {display} (exit code {proc.returncode})",
                             stderr=log, command=reported)
        if not tmp_out.is_file():
            raise BuildError(f"nvcc reported success for {display} but wrote no {suffix}", stderr=log,
                             command=reported)
        data = read_bounded(tmp_out, f"built file {tmp_out}", *limit, BuildError, nofollow=True)
        if len(data) > limit[0]:
            raise BuildError(f"nvcc built {display} into more than {limit[1]}", stderr=log, command=reported)
    entry = Entry(key, True, log, reported, folder.path / f"{key}.{suffix}", sha256=_sha256(data), data=data)
    write_entry(folder, suffix, entry, source=display, key_parts=key_parts, seconds=seconds)
    return entry

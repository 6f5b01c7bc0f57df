"""The files a case file names, and what the user allowed a case to do (CaseTrust).

Where the files may be: a case file names its kernel's files ([kernel] source, library, cubin)
relative to its own folder, and they stay inside it: no absolute path, no `..` that leaves it, no
symbolic link whose target lies outside (the resolved path is checked). `extends` names another
case file the same way, inside the folder of the case file the user named or the folder directly
above it (a defect case in defects/ extends its base one level up); the base's own kernel files stay
inside the base's folder. --allow-outside-case-dir (allow_outside_case_dir=True from Python) lifts
these limits; a file named on the command line (--kernel FILE) is the user's own choice and is not
held to them.

What the files must be, wherever they are: source and library a CUDA/C++ source, cubin a CUDA
device image (harness.source_files: a regular file checked before it is opened, by suffix and by
its first bytes), so an object, archive, shared library or FIFO named there is refused when the
case is loaded. A file that does not exist yet is left to oracle.run.sink.check_case, which runs
before anything is built.

The code a case runs: a live case builds its kernel's device code ([kernel] source, or a prebuilt
[kernel] cubin) and runs it on the GPU in a child process; running that kernel is what a live
compare, repro or bench is asked to do. A launch library ([kernel] library) is host code as well:
it is compiled into a shared library that the kernel's child process loads and calls, so it runs
with the user's rights. A case that names one is refused unless the user allows it:
--allow-library (allow_library=True from Python).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from harness import knobs, source_files
from harness.fields import shown

EXTENDS_LEVELS_UP = 1  # how far above the named case file's folder an extends chain may reach
ALLOW_OUTSIDE_FLAG = "--allow-outside-case-dir (allow_outside_case_dir=True from Python)"
ALLOW_LIBRARY_FLAG = "--allow-library (allow_library=True from Python)"


@dataclass(frozen=True)
class CaseTrust:
    """What the user allowed beyond the default, from the command line or the Python API."""

    library: bool = False  # build a launch library and run its host code in the kernel's child
    outside_case_dir: bool = False  # let a case file name files outside its folder

    def __post_init__(self) -> None:
        for name in ("library", "outside_case_dir"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CaseTrust.{name} = {getattr(self, name)!r} must be True or False")


def shown_path(path: str) -> str:
    """A path as an error shows it: whole up to PATH_MAX, else cut."""
    return repr(path) if len(path) <= 4096 else shown(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def case_path(value: str, field: str, case_file: str, root: str, trust: CaseTrust, error: type) -> str:
    """The path `value` that `case_file` gives for `field`, joined to the case file's folder; it must
    stay inside `root`, also once resolved, unless the user allowed otherwise. Returns the joined path."""
    where = f"{case_file}: {field} = {shown_path(value)}"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):  # NUL, newline...: no file the case may name
        raise error(f"{where} holds a control character; a path has none")
    joined = os.path.join(os.path.dirname(os.path.abspath(case_file)), value)
    if trust.outside_case_dir:
        return joined
    if os.path.isabs(value):
        why = f"{where} is an absolute path; a case file names its files relative to its own folder"
    elif not _inside(os.path.normpath(joined), os.path.normpath(root)):
        why = f"{where} leads out of {root}"
    elif not _inside(os.path.realpath(joined), os.path.realpath(root)):
        why = f"{where} goes through a symbolic link to {os.path.realpath(joined)}, outside {root}"
    else:
        return joined
    raise error(f"{why}: the files a case file names stay inside {root} unless you give {ALLOW_OUTSIDE_FLAG}")


def extends_root(case_file: str) -> str:
    """The folder an extends chain starting at `case_file` stays inside."""
    root = os.path.dirname(os.path.abspath(case_file))
    for _ in range(EXTENDS_LEVELS_UP):
        root = os.path.dirname(root)
    return root


def check_kernel_file(field: str, path: Optional[str], error: type) -> None:
    """A [kernel] source or library that exists is a CUDA/C++ source, a cubin a device image; `error`
    names the field and the value."""
    if path is None or not os.path.lexists(path):
        return
    name = f"[kernel] {field} = {shown_path(path)}"
    if field == "cubin":
        mb = knobs.get("ORACLE_CUBIN_MAX_MB")
        source_files.check_device_image_file(path, name, mb << 20, f"the {mb} MiB limit of ORACLE_CUBIN_MAX_MB",
                                             error)
    else:
        source_files.check_source_file(path, name, error)


def check_library_allowed(library: Optional[str], case_file: Optional[str], trust: CaseTrust, error: type) -> None:
    """A launch library is host code: refused unless the user allowed one."""
    if library is None or trust.library:
        return
    where = f"{case_file}: " if case_file else ""
    raise error(f"{where}[kernel] library = {shown_path(library)} is a launch library: the oracle would compile its "
                f"host code and run it in the kernel's child process, with your rights, not only device code on "
                f"the GPU; give {ALLOW_LIBRARY_FLAG} if you trust this case")

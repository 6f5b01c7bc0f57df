"""[kernel] include_dirs and nvcc_flags: what a DeepGEMM- or CUTLASS-based kernel needs beyond its
source and defines, held to the same rules as the kernel's files and defines.

include_dirs: folders searched for headers (-I, before the trace header's and CUTLASS's). A case
file names them relative to its own folder and they stay inside it, also once resolved (no absolute
path, no `..` that leaves it, no symbolic link that leads out; oracle.run.case_files.case_path), unless
--allow-outside-case-dir; each must exist and be a directory, and no link inside it may lead out of
the case's folder either (a header reached through one would be read from anywhere). The build cache
hashes every header a source reaches through them (harness.build.local_includes).

nvcc_flags: an allow-list. A flag is one word, a value joined with `=` (`--maxrregcount=128`,
`-Xptxas=-v`); anything not on the list is refused, naming the flag. The list holds flags that
change code generation or warnings only. What it leaves out, and why: flags that run or load
another program or file (-ccbin/--compiler-bindir, -Xcompiler/--compiler-options, whose host
compiler options include -fplugin and -wrapper; --run; response files --options-file/-optf/@file;
--pre-include/-include, which reads any file), flags that link (-l, -L, -Xlinker/--linker-options,
-Xnvlink), flags that write elsewhere (-o, --output-directory, --keep, -MF), and -I / -D, which
have their own keys (include_dirs, defines) and rules.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from harness.fields import shown
from kernels_ref._items import named_strings
from oracle.run.case_files import CaseTrust, case_path, shown_path

MAX_FLAGS = 64
MAX_INCLUDE_DIRS = 32
MAX_INCLUDE_ENTRIES = 200_000  # files and folders walked under one include dir for links that lead out

_BOOL = r"(true|false)"
_INT = r"\d{1,6}"
_PTXAS = r"(-v|--verbose|--warn-on-spills|--warn-on-local-memory-usage|--allow-expensive-optimizations=" + _BOOL + \
    r"|-O[0-3])"
# flag name -> the value it takes after '=' (a regex), or None: a flag alone
ALLOWED_FLAGS: dict[str, Optional[str]] = {
    "-lineinfo": None, "--generate-line-info": None, "-G": None, "--device-debug": None,
    "--use_fast_math": None, "-use_fast_math": None, "--expt-relaxed-constexpr": None,
    "--expt-extended-lambda": None, "--extended-lambda": None, "-extended-lambda": None,
    "-w": None, "--disable-warnings": None, "--restrict": None, "-restrict": None,
    "--resource-usage": None, "-res-usage": None, "-Wno-deprecated-gpu-targets": None,
    "-Wno-deprecated-declarations": None,
    "-O0": None, "-O1": None, "-O2": None, "-O3": None,
    "-std": r"c\+\+(14|17|20)", "--std": r"c\+\+(14|17|20)",
    "--ftz": _BOOL, "-ftz": _BOOL, "--prec-div": _BOOL, "-prec-div": _BOOL, "--prec-sqrt": _BOOL,
    "-prec-sqrt": _BOOL, "--fmad": _BOOL, "-fmad": _BOOL,
    "--maxrregcount": _INT, "-maxrregcount": _INT,
    "--diag-suppress": r"\d{1,5}(,\d{1,5})*", "-diag-suppress": r"\d{1,5}(,\d{1,5})*",
    "--Werror": r"(cross-execution-space-call|reorder|default-stream-launch|all-warnings)",
    "--ptxas-options": _PTXAS, "-Xptxas": _PTXAS,
    "-Xcudafe": r"--diag_suppress=[A-Za-z0-9_]{1,64}",
}
# refused flags with the reason the error gives (every other flag off the list: "not on the list")
WHY_REFUSED = {
    ("-ccbin", "--compiler-bindir"): "it runs another program as the host compiler",
    ("-Xcompiler", "--compiler-options"): "it passes options to the host compiler, which can load plugins "
                                          "(-fplugin) or run a wrapper",
    ("--run", "-run"): "it runs the program it builds",
    ("--options-file", "-optf"): "it reads more flags from a file",
    ("--pre-include", "-include"): "it includes a file from anywhere",
    ("-l", "--library", "-L", "--library-path", "-Xlinker", "--linker-options", "-Xnvlink", "--nvlink-options",
     "-Xarchive", "--archive-options", "--dlink-time-opt", "-dlto"): "it links or loads libraries",
    ("-o", "--output-file", "-odir", "--output-directory", "--keep", "-keep", "--keep-dir", "-keep-dir", "-MF",
     "--dependency-output"): "it writes files elsewhere than the build cache",
    ("-I", "--include-path", "-isystem", "--system-include"): "use [kernel] include_dirs, held to the case's folder",
    ("-D", "--define-macro", "-U", "--undefine-macro"): "use [kernel] defines, held to the define grammar",
}


def _why(flag: str) -> str:
    if flag.startswith("@"):
        return "a response file: it reads more flags from a file"
    name = flag.split("=", 1)[0]
    for names, why in WHY_REFUSED.items():
        for n in names:
            # -lcuda, -L/x, -I/x, -DX: one-letter options glue their value on
            if name == n or (len(n) == 2 and flag.startswith(n)):
                return why
    return "it is not on the allow-list"


def check_nvcc_flags(raw: Any, error: type) -> tuple[str, ...]:
    """[kernel] nvcc_flags = ["-lineinfo", "--maxrregcount=128"]: each on the allow-list, or `error`
    naming the flag and why it is refused."""
    if not isinstance(raw, list) or len(raw) > MAX_FLAGS:
        raise error(f"[kernel] nvcc_flags = {shown(raw)} must be a list of at most {MAX_FLAGS} flags")
    out = []
    for where, flag in named_strings(raw, "[kernel] nvcc_flags", error, "one flag, its value joined with '='",
                                     shown, " = "):
        name, eq, value = flag.partition("=")
        pattern = ALLOWED_FLAGS.get(name, "") if name in ALLOWED_FLAGS else ""
        ok = name in ALLOWED_FLAGS and ((pattern is None and not eq) or
                                        (pattern is not None and eq and re.fullmatch(pattern, value)))
        if not ok:
            if name in ALLOWED_FLAGS:
                takes = "no value" if pattern is None else f"a value matching {pattern} after '='"
                raise error(f"{where} is not allowed: {name} takes {takes}")
            raise error(f"{where} is not allowed: {_why(flag)}; the allowed flags are "
                        f"{', '.join(sorted(ALLOWED_FLAGS))} (docs/security.md)")
        out.append(flag)
    return tuple(out)


def resolve_include_dirs(raw: Any, case_file: str, trust: CaseTrust, error: type) -> list[str]:
    """[kernel] include_dirs of `case_file`: each joined to its folder, inside it (or anywhere with
    trust.outside_case_dir), an existing directory, with no link inside it that leads out."""
    if not isinstance(raw, list) or len(raw) > MAX_INCLUDE_DIRS:
        raise error(f"{case_file}: [kernel] include_dirs = {shown(raw)} must be a list of at most "
                    f"{MAX_INCLUDE_DIRS} folders")
    here = os.path.dirname(os.path.abspath(case_file))
    out = []
    for i, value in enumerate(raw):
        field = f"[kernel] include_dirs[{i}]"
        if not isinstance(value, str) or not value:
            raise error(f"{case_file}: {field} = {shown(value)} must be the path of a folder (a string)")
        path = case_path(value, field, case_file, here, trust, error)
        if not os.path.isdir(path):
            what = "does not exist" if not os.path.lexists(path) else "is not a directory"
            raise error(f"{case_file}: {field} = {shown_path(value)} {what}: an include dir is a folder")
        if not trust.outside_case_dir:
            _no_link_out(path, here, f"{case_file}: {field} = {shown_path(value)}", error)
        out.append(path)
    return out


def _no_link_out(folder: str, root: str, where: str, error: type) -> None:
    """No symbolic link under `folder` resolves outside `root` (os.walk follows none)."""
    real_root = os.path.realpath(root)
    seen = 0
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            seen += 1
            if seen > MAX_INCLUDE_ENTRIES:
                raise error(f"{where} holds more than {MAX_INCLUDE_ENTRIES} files and folders: too many to check")
            p = os.path.join(top, name)
            if os.path.islink(p):
                target = os.path.realpath(p)
                if not (target == real_root or target.startswith(real_root.rstrip(os.sep) + os.sep)):
                    raise error(f"{where}: {shown_path(p)} is a symbolic link to {shown_path(target)}, outside "
                                f"{root}; give --allow-outside-case-dir (allow_outside_case_dir=True from Python) "
                                f"if you trust it")


def build_options(kernel) -> dict:
    """The keyword arguments of harness.build.build_cubin / build_library for a case's KernelSource."""
    return {"include_dirs": tuple(kernel.include_dirs), "extra_flags": tuple(kernel.nvcc_flags)}

"""How the oracle starts a Python process: one command and one environment under which the new
interpreter never imports from the folder it was started in.

`python -m X` and `python -c` put the current folder first on sys.path (and an empty PYTHONPATH
entry does too), so a `json.py` or `torch.py` someone left in the user's folder would run as the
user. Every Python the oracle starts (the kernel child, a sweep's workers) is
`python_command(module)` with `python_env()`, in a working directory the oracle made:

- the module runs through a `-c` bootstrap that takes the current folder's entry ('') out of
  sys.path before anything is imported (Python 3.10 has no -P), then runs it as `-m` would;
  PYTHONSAFEPATH=1 keeps 3.11 and later from adding that entry at all;
- PYTHONPATH is the repository root, then the caller's own entries in order, relative ones made
  absolute against the caller's folder (where they were meant); empty entries, which stand for the
  current folder, are dropped.

Standard library only: imported before torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent

# `-c` code: drop the current folder's entry, then run sys.argv[1] as `python -m` runs a module.
BOOTSTRAP = ("import sys\n"
             "if sys.path[:1] == ['']:\n"
             "    del sys.path[0]\n"
             "import runpy\n"
             "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n")


def python_command(module: str, options: Sequence[str] = ()) -> tuple[str, ...]:
    """`python [options] -c BOOTSTRAP module`: run `module` (a package runs its __main__) with
    the arguments appended after it, never importing from the working directory."""
    if not module or not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"module {module!r} must be a dotted module name")
    return (sys.executable, *options, "-c", BOOTSTRAP, module)


def python_path(base: Optional[str], cwd: Optional[str] = None) -> str:
    """PYTHONPATH for a started interpreter: the repository root, then `base`'s non-empty entries
    made absolute against `cwd` (default: this process's working directory), each once."""
    here = os.getcwd() if cwd is None else cwd
    entries = [str(REPO_ROOT)]
    for entry in (base or "").split(os.pathsep):
        if entry:
            full = os.path.normpath(os.path.join(here, entry))
            if full not in entries:
                entries.append(full)
    return os.pathsep.join(entries)


def python_env(base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """`base` (default os.environ) with PYTHONPATH from `python_path` and PYTHONSAFEPATH=1."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH"))
    env["PYTHONSAFEPATH"] = "1"
    return env

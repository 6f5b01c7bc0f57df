"""`python -m oracle` and the `oracle` command: forwarded to a warm server when ORACLE_SERVER names
one (oracle.tools.server), else run here (oracle.tools.cli). A live compare starts its kernel's
child process first (oracle.tools.startup), so that the child comes up while this one imports
torch; it keeps none ahead for a next run, as the process exits after this one. The process
leaves without tearing the interpreter down (`run`): the exit handlers run and the output is
flushed, but torch's and CUDA's teardown (0.3-0.6 s on the H200's host) is skipped, as the
operating system frees all of it anyway."""

import atexit
import os
import sys

from oracle.tools.server import forward
from oracle.tools.startup import prestart_for


def entry() -> int:
    argv = sys.argv[1:]
    code = forward(argv)
    if code is None:
        prestart_for(argv, last=True)
        from oracle.tools.cli import main

        code = main()
    return code


def run() -> None:
    """The command's process: `entry()`, then exit with its code once the output is flushed and
    the exit handlers have run (no interpreter teardown)."""
    code = entry()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said there
            pass
    atexit._run_exitfuncs()
    os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


if __name__ == "__main__":
    run()

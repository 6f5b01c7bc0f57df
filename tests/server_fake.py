"""A command line for the warm server's tests: `knobs fake MODE TAG [ARG]` is a fake command that
writes by every path a command can write (print, a stream kept since import, sys.__stderr__,
fd 2 directly, a logging handler made at import, warnings, a thread, a child process), sleeps or
raises; anything else is the real command line. Run as a script it is a server:
`python tests/server_fake.py SOCKET DEADLINE_S` (the request deadline shortened for the tests)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import warnings

EARLY_STDERR = sys.stderr  # kept at import, as some modules keep it
_LOG = logging.getLogger("server_fake")
_LOG.addHandler(logging.StreamHandler(sys.stderr))  # a handler made at import holds the stream of then
_LOG.propagate = False
SAME_WARNING = "the same warning every time"


def fake(mode: str, tag: str, arg: str = "0") -> int:
    if mode == "print":
        print(f"out:{tag}")
        EARLY_STDERR.write(f"early:{tag}\n")
        sys.__stderr__.write(f"dunder:{tag}\n")
        os.write(2, f"fd:{tag}\n".encode())
        _LOG.warning("log:%s", tag)
        warnings.warn(f"warn:{tag}")
        warnings.warn(SAME_WARNING)
        t = threading.Thread(target=lambda: print(f"thread:{tag}", file=sys.stderr))
        t.start()
        t.join()
        subprocess.run(["sh", "-c", f"echo child:{tag} >&2"], check=True)
        return int(arg)
    if mode == "sleep":
        for _ in range(5):
            os.write(2, f"fd:{tag}\n".encode())
            time.sleep(float(arg) / 5)
        print(f"out:{tag}")
        return 0
    if mode == "raise":
        raise RuntimeError(f"boom:{tag}")
    raise SystemExit(f"unknown fake mode {mode}:{tag}")


def main(argv: list) -> int:
    if argv[1:2] == ["fake"]:
        return fake(*argv[2:])
    from oracle.tools.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    import signal

    from oracle.tools import server

    server.REQUEST_DEADLINE_S = float(sys.argv[2])

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    sys.exit(server.serve(sys.argv[1], main))

"""A warm oracle: one long-lived process that keeps torch, Triton and the compiled references
loaded, and a thin client that hands it command lines.

    python -m oracle serve --socket /tmp/oracle.sock &      # once
    export ORACLE_SERVER=/tmp/oracle.sock
    python -m oracle compare ...                            # runs in the server, prints here

Every command pays `import torch` (seconds on some machines) before the oracle does anything; the
server pays it once. The client side (`forward`) imports only the standard library and the knob
table, sends `{"argv", "cwd", "env"}` (the ORACLE_* variables of the caller) as one JSON line over
a Unix socket and prints what comes back (`{"exit", "stdout", "stderr"}`). When no server answers
it says so on stderr and the command runs in the calling process instead. The server runs one
command at a time, in the caller's working directory and with the caller's ORACLE_* variables;
kernels still run in their own child processes, so a crashing kernel cannot take the server down.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
from typing import Callable, Optional, Sequence

MAX_REQUEST_BYTES = 1 << 20
FORWARDED = ("compare", "bench", "simulate", "knobs", "repro")  # `serve` itself never is


def _send(conn: socket.socket, doc: dict) -> None:
    conn.sendall(json.dumps(doc).encode() + b"\n")


def _receive(conn: socket.socket, limit: Optional[int] = None) -> dict:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
        if limit is not None and len(buf) > limit:
            raise ValueError(f"request larger than {limit} bytes")
    if not buf:
        raise ConnectionError("the peer closed the connection without a message")
    return json.loads(buf)


# -- client ----------------------------------------------------------------------------------------
def forward(argv: Sequence[str]) -> Optional[int]:
    """Run `argv` in the server named by ORACLE_SERVER; None when there is none to run it."""
    from oracle import knobs

    path = knobs.SERVER.get()
    if not path or not argv or argv[0] not in FORWARDED:
        return None
    env = {k: v for k, v in os.environ.items() if k.startswith("ORACLE_") and k != "ORACLE_SERVER"}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(path)
            _send(conn, {"argv": list(argv), "cwd": os.getcwd(), "env": env})
            reply = _receive(conn)
    except (OSError, ValueError, ConnectionError) as e:
        print(f"note: no oracle server answered at {path} ({e}); running here", file=sys.stderr)
        return None
    sys.stdout.write(reply.get("stdout", ""))
    sys.stderr.write(reply.get("stderr", ""))
    sys.stdout.flush()
    return int(reply.get("exit", 1))


# -- server ----------------------------------------------------------------------------------------
def _run(request: dict, main: Callable[[list], int]) -> dict:
    argv, cwd, env = request.get("argv"), request.get("cwd"), request.get("env") or {}
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv and argv[0] in FORWARDED):
        return {"exit": 2, "stdout": "", "stderr": f"error: the server runs {', '.join(FORWARDED)}, got {argv!r}\n"}
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        return {"exit": 2, "stdout": "", "stderr": f"error: working directory {cwd!r} does not exist here\n"}
    env = {k: v for k, v in env.items() if isinstance(k, str) and k.startswith("ORACLE_") and isinstance(v, str)}
    out, err = io.StringIO(), io.StringIO()
    saved_cwd = os.getcwd()
    saved_env = {k: os.environ.get(k) for k in env}
    try:
        os.chdir(cwd)
        os.environ.update(env)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # a command that exits instead of returning
                code = e.code if isinstance(e.code, int) else 1
            except Exception as e:  # main() reports what it knows; anything else is the oracle's bug
                import traceback

                traceback.print_exc()
                print(f"error: the oracle failed: {type(e).__name__}: {e}", file=sys.stderr)
                code = 4
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"exit": int(code), "stdout": out.getvalue(), "stderr": err.getvalue()}


def serve(path: str, main: Callable[[list], int], *, max_requests: Optional[int] = None, ready=None,
          warm: Optional[Callable[[], object]] = None) -> int:
    """Answer requests on the Unix socket `path` with `main` (the command line's, given by it, so this
    module never imports the command line) until interrupted (or `max_requests` answered). `warm`
    runs once the socket listens and before the first request is taken (oracle.tools.warmup):
    a command sent meanwhile waits for it instead of running cold in its own process."""
    if os.path.exists(path):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket from a server that is gone
            else:
                print(f"error: a server already answers at {path}", file=sys.stderr)
                return 2
    done = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        os.chmod(path, 0o600)  # the server runs the caller's commands: the caller's user only
        srv.listen(8)
        print(f"oracle server: listening on {path}", file=sys.stderr, flush=True)
        if warm is not None:
            warm()
        if ready is not None:
            ready()
        try:
            while max_requests is None or done < max_requests:
                conn, _ = srv.accept()
                with conn:
                    try:
                        reply = _run(_receive(conn, MAX_REQUEST_BYTES), main)
                    except (ValueError, ConnectionError) as e:
                        reply = {"exit": 2, "stdout": "", "stderr": f"error: bad request: {e}\n"}
                    try:
                        _send(conn, reply)
                    except OSError:
                        pass  # the client went away; the next one may not
                done += 1
        except KeyboardInterrupt:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return 0

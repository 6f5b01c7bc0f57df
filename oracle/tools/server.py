"""A warm oracle: one long-lived process that keeps torch, Triton and the compiled references
loaded, and a thin client that hands it command lines.

    python -m oracle serve &                  # once; listens on the default socket (below)
    export ORACLE_SERVER=auto                 # or the path that `serve --socket PATH` was given
    python -m oracle compare ...              # runs in the server, prints here

Every command pays `import torch` (seconds on some machines) before the oracle does anything; the
server pays it once. The client side (`forward`) imports only the standard library and the knob
table, sends `{"argv", "cwd", "env"}` (the ORACLE_* variables of the caller) as one JSON line over
a Unix socket and prints what comes back (`{"exit", "stdout", "stderr"}`).

Where the socket lives. The default is `$XDG_RUNTIME_DIR/oracle/server.sock` when XDG_RUNTIME_DIR
is a folder of the user's with mode 0700, else `<tmp>/oracle-<uid>/server.sock`; the oracle
creates that folder with mode 0700 and refuses one that is a link, not a folder, not the user's
or open to others. ORACLE_SERVER=auto (or 1) names the default; unset, empty or 0: no server.
`serve --socket PATH` uses PATH as given, in a folder that is the user's or root's and not
writable by others unless sticky; it deletes nothing there but a socket of the user's on which
nobody answers.

Whom it talks to. Both ends read the other's uid from the kernel (SO_PEERCRED): the server answers
only its own uid (others get exit 2 saying so), and the client sends nothing (no argv, cwd, env)
to a server of another uid: it warns, naming the socket and the uid, and runs the command itself,
as it does when no server answers. Without SO_PEERCRED (not Linux) neither end uses a socket.

Requests. One JSON line of at most MAX_REQUEST_BYTES, nested at most MAX_DEPTH deep, complete
within REQUEST_DEADLINE_S, of the shape above; anything else gets `{"exit": 2, "stderr": "error:
..."}` and nothing runs. Each connection has its own thread (at most MAX_CONNECTIONS), so a silent
client delays nobody; commands run one at a time (they chdir, set os.environ and take file
descriptors 1 and 2), in the caller's working directory with the caller's ORACLE_* variables.
Everything a command writes (sys.stdout/err, sys.__stderr__, fd 1 and 2 directly, logging,
warnings, its threads and child processes while it runs) goes to its own client; the server's own
lines go to the terminal it started on. A client that leaves mid-command does not stop the command
or the server. Kernels still run in their own child processes, so a crashing kernel cannot take
the server down.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TextIO

MAX_REQUEST_BYTES = 1 << 20
MAX_DEPTH = 4  # {"argv": [...], "env": {...}} is 2 deep
MAX_ARGS = 1024
MAX_ENV = 256
REQUEST_DEADLINE_S = 10.0  # a client has this long to send its whole request
REPLY_DEADLINE_S = 60.0  # and this long to take its reply
MAX_CONNECTIONS = 64
SOCKET_NAME = "server.sock"
FORWARDED = ("compare", "bench", "simulate", "knobs", "repro")  # `serve` itself never is
EXIT_USAGE, EXIT_INTERNAL = 2, 4


class ServerError(Exception):
    """A socket or folder the oracle refuses to use, or a server it will not talk to."""


class NoServer(ServerError):
    """Nobody answers at the socket."""


class ForeignServer(ServerError):
    """The process at the socket runs as another user: nothing was sent to it."""


class LostServer(ServerError):
    """The request went out and no well-formed reply came back."""


class BadRequest(ValueError):
    """A request that is too big, too slow, too deep or of the wrong shape."""


# -- peer credentials --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_credentials(conn: socket.socket) -> Peer:
    """The process at the other end of a connected Unix socket, as the kernel knows it."""
    size = struct.calcsize("3i")
    return Peer(*struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, _peercred_option(), size)))


def _peercred_option() -> int:
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        raise ServerError("this system gives no peer credentials (SO_PEERCRED): the oracle cannot tell who is at "
                          "the other end of a socket, so it uses none")
    return opt


# -- where the socket lives --------------------------------------------------------------------------
def _private_dir(path: str, *, create: bool) -> None:
    """Create (if asked) and check a folder only the user can enter; ServerError if it is not one."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if create:
            raise
        return  # nothing there: no server either
    me = os.getuid()
    why = ("is a link" if stat.S_ISLNK(st.st_mode) else "is not a folder" if not stat.S_ISDIR(st.st_mode)
           else f"belongs to uid {st.st_uid}, not to you (uid {me})" if st.st_uid != me
           else f"has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0700" if st.st_mode & 0o077 else None)
    if why:
        raise ServerError(f"the oracle's socket folder {path} {why}: refusing to use it (remove it, or give "
                          "`serve --socket PATH` and ORACLE_SERVER=PATH)")


def _usable_runtime_dir() -> Optional[str]:
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if not os.path.isabs(xdg):
        return None
    try:
        st = os.lstat(xdg)
    except OSError:
        return None
    ok = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
    return xdg if ok else None


def default_socket(*, create: bool = False) -> str:
    """The socket `serve` uses without --socket and ORACLE_SERVER=auto names: in
    $XDG_RUNTIME_DIR/oracle/ (when that runtime folder is the user's, mode 0700), else in
    <tmp>/oracle-<uid>/; the folder is checked (and made, with `create`), ServerError if unfit."""
    xdg = _usable_runtime_dir()
    folder = os.path.join(xdg, "oracle") if xdg else os.path.join(tempfile.gettempdir(), f"oracle-{os.getuid()}")
    _private_dir(folder, create=create)
    return os.path.join(folder, SOCKET_NAME)


def server_path(value: Optional[str]) -> Optional[str]:
    """The socket ORACLE_SERVER's value names: None for no server (unset, empty, 0), the default
    socket for `auto` or 1, else the path as given."""
    if value is None or value.strip() in ("", "0"):
        return None
    if value.strip().lower() in ("auto", "1"):
        return default_socket(create=False)
    return value


# -- the messages ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    argv: tuple
    cwd: str
    env: tuple  # (name, value) pairs, all ORACLE_*

    def to_json(self) -> dict:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": dict(self.env)}


@dataclass(frozen=True)
class Reply:
    exit: int
    stdout: str = ""
    stderr: str = ""

    def __post_init__(self):
        if not (isinstance(self.exit, int) and not isinstance(self.exit, bool) and 0 <= self.exit < 256):
            raise ValueError(f"reply exit={self.exit!r} is not an exit code (an int 0-255)")
        for field in ("stdout", "stderr"):
            if not isinstance(getattr(self, field), str):
                raise ValueError(f"reply {field}={getattr(self, field)!r:.40} is not a string")

    def to_json(self) -> dict:
        return {"exit": self.exit, "stdout": self.stdout, "stderr": self.stderr}


def _refusal(message: str) -> Reply:
    return Reply(EXIT_USAGE, "", f"error: {message}\n")


# a string (to its end when unterminated) or one bracket: each byte is looked at once, never again
_TOKENS = re.compile(rb'"(?:[^"\\]+|\\.)*"?|[\[\]{}]', re.S)


def _depth(data: bytes, stop_past: int) -> int:
    """How deep the brackets of a JSON text nest (strings skipped), without parsing it; the count
    stops once past `stop_past`."""
    depth = deepest = 0
    for m in _TOKENS.finditer(data):
        ch = m.group()
        if ch in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > stop_past:
                break
        elif ch in (b"]", b"}"):
            depth -= 1
    return deepest


def _text(value, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a string, got {type(value).__name__}")
    if "\0" in value or len(value) > limit:
        raise BadRequest(f"{what} {value[:40]!r} holds a NUL character or is longer than {limit} characters")
    return value


def parse_request(data: bytes) -> Request:
    """A request line checked for size, depth and shape; BadRequest naming what is wrong."""
    if len(data) > MAX_REQUEST_BYTES:
        raise BadRequest(f"request larger than {MAX_REQUEST_BYTES} bytes")
    if _depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise BadRequest(f"request nested deeper than {MAX_DEPTH} levels")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadRequest(f"not a JSON line: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"a request is a JSON object, got {type(doc).__name__}")
    extra = sorted(set(doc) - {"argv", "cwd", "env"})
    if extra or "argv" not in doc or "cwd" not in doc:
        raise BadRequest(f"a request has argv, cwd and env; got keys {sorted(doc)[:10]}")
    argv = doc["argv"]
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGS:
        raise BadRequest(f"argv must be a list of 1 to {MAX_ARGS} strings, got {type(argv).__name__}"
                         + (f" of {len(argv)}" if isinstance(argv, list) else ""))
    argv = tuple(_text(a, f"argv[{i}]", 1 << 16) for i, a in enumerate(argv))
    if argv[0] not in FORWARDED:
        raise BadRequest(f"the server runs {', '.join(FORWARDED)}, got {argv[0][:40]!r}")
    cwd = _text(doc["cwd"], "cwd", 4096)
    if not os.path.isabs(cwd):
        raise BadRequest(f"cwd {cwd[:40]!r} is not an absolute path")
    env = doc.get("env", {})
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        raise BadRequest(f"env must be an object of at most {MAX_ENV} ORACLE_* strings, got {type(env).__name__}")
    for k, v in env.items():
        if not (k.startswith("ORACLE_") and k.isidentifier()):
            raise BadRequest(f"env names {k[:40]!r}, which is not an ORACLE_* variable")
        _text(v, f"env[{k}]", 1 << 16)
    return Request(argv, cwd, tuple(sorted(env.items())))


def _send(conn: socket.socket, doc: dict) -> None:
    conn.sendall(json.dumps(doc).encode() + b"\n")


def _receive_line(conn: socket.socket, limit: Optional[int], deadline: Optional[float]) -> bytes:
    """Bytes up to the first newline (or the peer's end); socket.timeout past `deadline` (monotonic)."""
    buf = bytearray()
    while b"\n" not in buf:
        if deadline is not None:
            left = deadline - _now()
            if left <= 0:
                raise socket.timeout("deadline passed")
            conn.settimeout(left)
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
        if limit is not None and len(buf) > limit:
            raise BadRequest(f"request larger than {limit} bytes")
    if not buf:
        raise ConnectionError("the peer closed the connection without a message")
    return bytes(buf[:buf.index(b"\n")] if b"\n" in buf else buf)


def _now() -> float:
    return time.monotonic()


# -- client ----------------------------------------------------------------------------------------
def request(path: str, req: Request, *, timeout: Optional[float] = None) -> Reply:
    """Send `req` to the server at `path` and wait for its reply. NoServer when nobody answers,
    ForeignServer (nothing sent) when the server is another user's, LostServer when no reply came."""
    _peercred_option()  # without it, no server can be told from a stranger's
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(path)
        except OSError as e:
            raise NoServer(f"no oracle server answered at {path} ({e})") from None
        peer = peer_credentials(conn)
        if peer.uid != os.getuid():
            raise ForeignServer(f"the process listening at {path} runs as uid {peer.uid}, not as you (uid "
                                f"{os.getuid()}): nothing was sent to it")
        with contextlib.suppress(OSError):  # a server that refuses may close first: its reply says why
            _send(conn, req.to_json())
        try:
            doc = json.loads(_receive_line(conn, None, None))
            return Reply(**doc) if isinstance(doc, dict) else Reply(doc)
        except (OSError, ValueError, TypeError) as e:
            raise LostServer(f"the oracle server at {path} gave no answer ({type(e).__name__}: {e})") from None


def forward(argv: Sequence[str]) -> Optional[int]:
    """Run `argv` in the server named by ORACLE_SERVER; None when there is none to run it (or none
    this process will use): then the caller runs the command itself."""
    from oracle import knobs

    if not argv or argv[0] not in FORWARDED:
        return None
    try:
        path = server_path(knobs.SERVER.get())
        if path is None:
            return None
        env = {k: v for k, v in os.environ.items() if k.startswith("ORACLE_") and k != "ORACLE_SERVER"}
        reply = request(path, Request(tuple(argv), os.getcwd(), tuple(sorted(env.items()))))
    except NoServer as e:
        print(f"note: {e}; running here", file=sys.stderr)
        return None
    except LostServer as e:  # the command may have run in part: running it again here could surprise
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INTERNAL
    except (ServerError, OSError) as e:
        print(f"warning: not using the oracle server: {e}; running here", file=sys.stderr)
        return None
    sys.stdout.write(reply.stdout)
    sys.stdout.flush()
    sys.stderr.write(reply.stderr)
    sys.stderr.flush()
    return reply.exit


# -- running one command ----------------------------------------------------------------------------
class _Capture:
    """File descriptors 1 and 2, sys.stdout and sys.stderr sent to two temporary files for the
    duration of one command, so that whatever writes there (print, sys.__stderr__, os.write(2),
    a logging handler made at import, a child process, a thread) lands in that command's reply.
    `streams` are long-lived text streams on fds 1 and 2: a reference a command keeps writes
    later wherever those fds point then, never into a closed or reused descriptor."""

    def __init__(self, streams: tuple):
        self.streams = streams
        self.stdout = self.stderr = ""

    def __enter__(self):
        self._flush()
        self.files = (tempfile.TemporaryFile(), tempfile.TemporaryFile())
        self.saved_fds = []
        for fd, f in zip((1, 2), self.files):
            try:
                self.saved_fds.append(os.dup(fd))
            except OSError:  # the server was started with that fd closed
                self.saved_fds.append(None)
            os.dup2(f.fileno(), fd)
        self.saved_streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self.streams
        return self

    def __exit__(self, *exc):
        self._flush()
        sys.stdout, sys.stderr = self.saved_streams
        for fd, saved in zip((1, 2), self.saved_fds):
            if saved is None:
                os.close(fd)
            else:
                os.dup2(saved, fd)
                os.close(saved)
        texts = []
        for f in self.files:
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
            f.close()
        self.stdout, self.stderr = texts
        return False

    def _flush(self):
        for s in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, *self.streams)}.values():
            with contextlib.suppress(Exception):
                s.flush()


def _fd_stream(fd: int, *, own: bool = False) -> TextIO:
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=own), encoding="utf-8", errors="backslashreplace",
                            line_buffering=True, write_through=True)


def _run(req: Request, main: Callable[[list], int], streams: tuple) -> Reply:
    """One command in the caller's working directory and ORACLE_* variables, its output captured."""
    if not os.path.isdir(req.cwd):
        return _refusal(f"working directory {req.cwd!r} does not exist here")
    env = dict(req.env)
    saved_cwd = os.getcwd()
    saved_env = {k: os.environ.get(k) for k in env}
    cap = _Capture(streams)
    try:
        os.chdir(req.cwd)
        os.environ.update(env)
        with cap, warnings.catch_warnings():  # each command sees its warnings, as a fresh process would
            try:
                code = main(list(req.argv))
            except SystemExit as e:  # a command that exits instead of returning
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except BaseException as e:  # main() reports what it knows; anything else is the oracle's bug
                import traceback

                traceback.print_exc()
                print(f"error: the oracle failed: {type(e).__name__}: {e}", file=sys.stderr)
                code = EXIT_INTERNAL
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    code = code if isinstance(code, int) and not isinstance(code, bool) and 0 <= code < 256 else 1
    return Reply(code, cap.stdout, cap.stderr)


# -- the server -------------------------------------------------------------------------------------
def claim_socket_path(path: str) -> None:
    """Make `path` free for a new socket, or ServerError saying why not: its folder must be the
    user's or root's and not writable by others unless sticky; only a socket of the user's on which
    nobody answers is deleted, nothing else ever is."""
    folder = os.path.dirname(os.path.abspath(path))
    st = os.stat(folder)
    me = os.getuid()
    if st.st_uid not in (me, 0):
        raise ServerError(f"the socket's folder {folder} belongs to uid {st.st_uid}: its owner could replace the "
                          "socket; choose a folder of yours")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ServerError(f"the socket's folder {folder} (mode {stat.S_IMODE(st.st_mode):04o}) is writable by other "
                          "users and not sticky: they could replace the socket; choose a private folder")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServerError(f"{path} exists and is not a socket: the server deletes only a stale socket of its own, "
                          "so it leaves it alone; choose another --socket path")
    if st.st_uid != me:
        raise ServerError(f"{path} is a socket of uid {st.st_uid}, not yours (uid {me}): leaving it alone; choose "
                          "another --socket path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # a stale socket of ours from a server that is gone
            return
        except OSError as e:
            raise ServerError(f"cannot tell whether a server answers at {path} ({e}); leaving it alone") from None
    raise ServerError(f"a server already answers at {path}")


class _Server:
    def __init__(self, srv: socket.socket, main: Callable[[list], int], log: TextIO):
        self.srv, self.main, self.log = srv, main, log
        self.lock = threading.Lock()  # one command at a time
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.threads: set = set()
        self.streams = (_fd_stream(1), _fd_stream(2))

    def say(self, line: str) -> None:
        with contextlib.suppress(Exception):
            print(f"oracle server: {line}", file=self.log, flush=True)

    def take(self, conn: socket.socket) -> None:
        if not self.slots.acquire(blocking=False):
            with conn, contextlib.suppress(OSError):
                conn.settimeout(0.5)
                _send(conn, _refusal(f"the server is busy with {MAX_CONNECTIONS} connections; try again").to_json())
            return
        t = threading.Thread(target=self.handle, args=(conn,), name="oracle-server-connection", daemon=True)
        self.threads = {x for x in self.threads if x.is_alive()} | {t}
        t.start()

    def handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                reply = self.answer(conn)
                if reply is not None:
                    conn.settimeout(REPLY_DEADLINE_S)
                    _send(conn, reply.to_json())
        except OSError:
            pass  # the client went away; the command, if any, has run to its end
        except BaseException as e:  # nothing a client does may take the server down
            self.say(f"a connection failed: {type(e).__name__}: {str(e)[:200]}")
        finally:
            self.slots.release()

    def answer(self, conn: socket.socket) -> Optional[Reply]:
        try:
            peer = peer_credentials(conn)
        except (ServerError, OSError) as e:
            return _refusal(str(e))
        if peer.uid != os.getuid():
            self.say(f"refused a connection from uid {peer.uid} (pid {peer.pid})")
            return _refusal(f"this oracle server answers only uid {os.getuid()}, and you are uid {peer.uid}")
        try:
            req = parse_request(_receive_line(conn, MAX_REQUEST_BYTES, _now() + REQUEST_DEADLINE_S))
        except socket.timeout:
            return _refusal(f"bad request: no complete request within {REQUEST_DEADLINE_S:g} s")
        except ConnectionError:
            return None
        except OSError:
            raise
        except Exception as e:  # BadRequest, and whatever else a hostile line provokes (MemoryError, ...)
            return _refusal(f"bad request: {str(e)[:300] or type(e).__name__}")
        with self.lock:
            return _run(req, self.main, self.streams)

    def join(self, timeout: float) -> None:
        end = _now() + timeout
        for t in list(self.threads):
            t.join(max(0.0, end - _now()))


def serve(path: str, main: Callable[[list], int], *, max_requests: Optional[int] = None, ready=None,
          warm: Optional[Callable[[], object]] = None, stop: Optional[threading.Event] = None,
          log: Optional[TextIO] = None) -> int:
    """Answer requests on the Unix socket `path` with `main` (the command line's, given by it, so this
    module never imports the command line) until interrupted, `stop` is set, or `max_requests`
    connections were taken. `warm` runs once the socket listens and before the first request is
    taken (oracle.tools.warmup): a command sent meanwhile waits for it instead of running cold in
    its own process. The server's own lines go to `log` (default: the stderr it started with)."""
    own_log = log is None
    log = log if log is not None else _fd_stream(os.dup(2), own=True) if _fd_open(2) else open(os.devnull, "w")
    try:
        return _serve(path, main, max_requests, ready, warm, stop, log)
    finally:
        if own_log:
            log.close()


def _serve(path, main, max_requests, ready, warm, stop, log) -> int:
    try:
        _peercred_option()
        claim_socket_path(path)
    except (ServerError, OSError) as e:
        print(f"error: {e}", file=log, flush=True)
        return EXIT_USAGE
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: the caller's user only
    try:
        srv.bind(path)
    except OSError as e:
        srv.close()
        print(f"error: cannot listen at {path}: {e}", file=log, flush=True)
        return EXIT_USAGE
    finally:
        os.umask(old_umask)
    mine = os.lstat(path)
    server = _Server(srv, main, log)
    taken, interrupted = 0, False
    try:
        with srv:
            srv.listen(64)
            server.say(f"listening on {path}")
            if warm is not None:
                warm()
            if ready is not None:
                ready()
            while (max_requests is None or taken < max_requests) and not (stop is not None and stop.is_set()):
                if not select.select([srv], [], [], 0.2)[0]:
                    continue
                conn, _ = srv.accept()
                taken += 1
                server.take(conn)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        with contextlib.suppress(OSError):
            now = os.lstat(path)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):  # still ours
                os.unlink(path)
        # the connections already taken finish (bounded by the deadlines and the command's own time);
        # an interrupted server leaves a running command to the process's end
        server.join(1.0 if interrupted else REQUEST_DEADLINE_S + REPLY_DEADLINE_S + 600)
    return 0


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False

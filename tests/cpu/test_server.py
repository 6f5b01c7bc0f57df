"""The warm server: a command forwarded over its socket prints and exits as it would in place;
without a server the command runs in place; bad requests are refused; the socket lives in a
private folder, only a stale socket of the user's is ever deleted, and each end talks only to its
own user (the other uid is simulated through the credential function, as the tests run as root)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import types

import pytest

from oracle.tools import server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def warm(tmp_path):
    path = str(tmp_path / "o.sock")
    ready = threading.Event()
    from oracle.tools.cli import main

    t = threading.Thread(target=server.serve, args=(path, main), kwargs={"max_requests": 3, "ready": ready.set},
                         daemon=True)
    t.start()
    assert ready.wait(10)
    yield path
    for _ in range(3):  # let the thread finish its request budget
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(path)
                c.sendall(b'{"argv": ["knobs"], "cwd": "/", "env": {}}\n')
                c.recv(1 << 20)
        except OSError:
            break
    t.join(10)


def test_a_forwarded_compare_prints_and_exits_as_in_place(warm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORACLE_SERVER", warm)
    monkeypatch.chdir(tmp_path)
    code = server.forward(["compare", "--demo", "--json", "r.json"])
    forwarded = capsys.readouterr()
    assert code == 1 and (tmp_path / "r.json").is_file()  # written in the caller's directory
    assert json.loads((tmp_path / "r.json").read_text())["first_divergence"]["stage"] == "mma"
    from oracle.tools.cli import main

    assert main(["compare", "--demo"]) == 1
    assert forwarded.out == capsys.readouterr().out


def test_no_server_means_in_place(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ORACLE_SERVER", raising=False)
    assert server.forward(["compare", "--demo"]) is None
    monkeypatch.setenv("ORACLE_SERVER", str(tmp_path / "nobody.sock"))
    assert server.forward(["compare", "--demo"]) is None
    assert "no oracle server answered" in capsys.readouterr().err
    assert server.forward(["serve"]) is None  # never forwarded


def test_bad_requests_are_refused(warm):
    for req, message in ((b'{"argv": ["rm", "-rf"], "cwd": "/", "env": {}}\n', "the server runs"),
                         (b'{"argv": ["knobs"], "cwd": "/no/such/dir", "env": {}}\n', "does not exist"),
                         (b'not json\n', "bad request")):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(warm)
            c.sendall(req)
            reply = json.loads(c.recv(1 << 20))
        assert reply["exit"] == 2 and message in reply["stderr"]


def test_the_client_does_not_import_torch():
    code = ("import sys; from oracle.tools.server import forward; forward(['compare', '--demo']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "ORACLE_SERVER": "/nonexistent/o.sock"}).stdout
    assert out.strip() == "False"


# -- who is at the other end -----------------------------------------------------------------------
def _foreign(conn):
    return types.SimpleNamespace(pid=1, uid=65534, gid=65534)


def _ask(path, payload: bytes, timeout=20.0) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(timeout)
        c.connect(path)
        try:
            c.sendall(payload)
        except BrokenPipeError:  # refused before it read the request: the reply still waits
            pass
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = c.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf)


@pytest.fixture
def running(tmp_path):
    """start(main) -> socket path of a server in a thread, stopped (and joined) at the end."""
    started = []

    def start(main):
        path = str(tmp_path / "s.sock")
        ready, stop = threading.Event(), threading.Event()
        t = threading.Thread(target=server.serve, args=(path, main), kwargs={"ready": ready.set, "stop": stop},
                             daemon=True)
        t.start()
        started.append((t, stop))
        assert ready.wait(10), "the server did not start"
        return path

    yield start
    for t, stop in started:
        stop.set()
        t.join(30)
        assert not t.is_alive()


def test_the_client_sends_nothing_to_a_server_of_another_user(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "theirs.sock")
    got = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lst:
        lst.bind(path)
        lst.listen(1)

        def listen():
            conn, _ = lst.accept()
            with conn:
                conn.settimeout(2)
                try:
                    got.append(conn.recv(1 << 20))
                except OSError:
                    got.append(b"")

        t = threading.Thread(target=listen, daemon=True)
        t.start()
        monkeypatch.setattr(server, "peer_credentials", _foreign, raising=False)
        monkeypatch.setenv("ORACLE_SERVER", path)
        monkeypatch.setenv("ORACLE_SECRET_THING", "x")
        assert server.forward(["compare", "--demo"]) is None  # runs here instead
        t.join(10)
    assert got == [b""], f"the client sent {got!r} to another user's server"
    err = capsys.readouterr().err
    assert path in err and "65534" in err and "warning" in err


def test_the_server_answers_only_its_own_user(running, monkeypatch):
    calls = []
    path = running(lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(server, "peer_credentials", _foreign, raising=False)
    reply = _ask(path, b'{"argv": ["knobs"], "cwd": "/", "env": {}}\n')
    assert reply["exit"] == 2 and "65534" in reply["stderr"] and "answers only uid" in reply["stderr"]
    assert calls == []


def test_without_peer_credentials_no_socket_is_used(tmp_path, monkeypatch, capfd):
    monkeypatch.delattr(socket, "SO_PEERCRED", raising=False)
    path = str(tmp_path / "s.sock")
    assert server.serve(path, lambda argv: 0, max_requests=0) == 2
    assert "SO_PEERCRED" in capfd.readouterr().err and not os.path.exists(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lst:  # someone listens: the client still won't
        lst.bind(path)
        lst.listen(1)
        monkeypatch.setenv("ORACLE_SERVER", path)
        assert server.forward(["knobs"]) is None
        lst.settimeout(0.5)
        try:
            conn, _ = lst.accept()
        except socket.timeout:
            pass  # it did not even connect
        else:
            with conn:
                conn.settimeout(2)
                assert conn.recv(1 << 16) == b"", "the client sent a request"
    assert "SO_PEERCRED" in capfd.readouterr().err


# -- where the socket lives -------------------------------------------------------------------------
def test_serve_leaves_a_file_that_is_not_a_socket_alone(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert server.serve("notes.txt", lambda argv: 0, max_requests=0) == 2
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert "notes.txt exists and is not a socket" in capfd.readouterr().err


def test_only_a_stale_socket_of_the_users_own_is_deleted(tmp_path, capfd):
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)  # closed unlistened: stale
    os.chown(path, 65534, 65534)
    assert server.serve(path, lambda argv: 0, max_requests=0) == 2
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and "uid 65534" in capfd.readouterr().err
    os.chown(path, os.getuid(), os.getgid())  # now ours and stale: replaced, and removed at the end
    assert server.serve(path, lambda argv: 0, max_requests=0) == 0 and not os.path.exists(path)


def test_a_socket_folder_others_can_write_is_refused(tmp_path, capfd):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    assert server.serve(str(folder / "s.sock"), lambda argv: 0, max_requests=0) == 2
    assert "writable by other users" in capfd.readouterr().err and not os.listdir(folder)
    folder.chmod(0o1777)  # sticky, as /tmp: nobody else can remove or rename the socket
    assert server.serve(str(folder / "s.sock"), lambda argv: 0, max_requests=0) == 0


def test_the_default_socket_is_in_a_private_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    path = server.default_socket(create=True)
    assert path == str(runtime / "oracle" / "server.sock")
    assert stat.S_IMODE(os.lstat(runtime / "oracle").st_mode) == 0o700
    assert server.server_path("auto") == server.server_path("1") == path  # the client finds the same one
    assert server.server_path("0") is None and server.server_path("") is None
    assert server.server_path("/some/where.sock") == "/some/where.sock"

    runtime.chmod(0o755)  # a runtime folder others can enter is not used: the fallback is
    fallback = tmp_path / f"oracle-{os.getuid()}"
    assert server.default_socket(create=True) == str(fallback / "server.sock")
    assert stat.S_IMODE(os.lstat(fallback).st_mode) == 0o700


@pytest.mark.parametrize("unfit", ["mode 0755", "owned by 65534", "a link", "a file"])
def test_an_unfit_private_folder_is_refused(tmp_path, monkeypatch, unfit):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    folder = tmp_path / f"oracle-{os.getuid()}"
    if unfit == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    elif unfit == "a file":
        folder.write_text("")
    else:
        folder.mkdir(mode=0o700)
        if unfit == "mode 0755":
            folder.chmod(0o755)
        else:
            os.chown(folder, 65534, 65534)
    with pytest.raises(server.ServerError, match="refusing to use it"):
        server.default_socket(create=True)
    with pytest.raises(server.ServerError):
        server.server_path("auto")
    from oracle.tools.cli import main

    assert main(["serve"]) == 2  # and `serve` says why instead of listening


# -- requests ---------------------------------------------------------------------------------------
def test_malformed_requests_neither_kill_nor_block_the_server(running, monkeypatch):
    monkeypatch.setattr(server, "REQUEST_DEADLINE_S", 3.0)
    path = running(lambda argv: print("ran", argv[-1]) or 0)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(path)  # connects and says nothing: dropped at the deadline, blocking nobody
    t0 = time.monotonic()
    for line, phrase in ((b"[1]\n", "JSON object"),
                         (b"[" * 100_000 + b"\n", "nested deeper"),
                         (b'{"argv": ["knobs"], "cwd": "/", "env": "ORACLE_X=1"}\n', "env must be"),
                         (b'{"argv": ["knobs"], "cwd": "/", "env": {"PATH": "/tmp"}}\n', "not an ORACLE_"),
                         (b'{"argv": ["knobs", 3], "cwd": "/"}\n', "argv[1] must be a string"),
                         (b'{"argv": ["knobs"], "cwd": "/", "env": {"ORACLE_X": 1' + b"0" * 50_000 + b"}}\n",
                          "not a JSON line"),
                         (b'"\\"' * 300_000 + b"\n", "not a JSON line"),  # unterminated, quote after quote
                         (b"\xff\n", "not a JSON line")):
        reply = _ask(path, line)
        assert reply["exit"] == 2 and reply["stderr"].startswith("error: bad request") and phrase in reply["stderr"], \
            (line[:40], reply)
    assert _ask(path, b'{"argv": ["knobs", "alive"], "cwd": "/", "env": {}}\n') == \
        {"exit": 0, "stdout": "ran alive\n", "stderr": ""}
    assert time.monotonic() - t0 < 3.0, "a silent client held the others up"
    with silent:
        silent.settimeout(10)
        assert b"no complete request" in silent.recv(1 << 16)


def test_a_failing_request_gets_its_error_while_the_server_is_busy(running, monkeypatch, tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import server_fake

    monkeypatch.setattr(server, "REQUEST_DEADLINE_S", 2.0)
    path = running(server_fake.main)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(path)
    replies = {}

    def ask(name, argv):
        replies[name] = _ask(path, json.dumps({"argv": argv, "cwd": str(tmp_path), "env": {}}).encode() + b"\n")

    busy = threading.Thread(target=ask, args=("busy", ["knobs", "fake", "sleep", "tag-busy", "1.5"]))
    busy.start()
    time.sleep(0.3)
    case = os.path.join(ROOT, "zoo", "sm80_gemm", "sm80_gemm.toml")
    failing = [threading.Thread(target=ask, args=("flag", ["compare", "--no-such-flag"])),
               threading.Thread(target=ask, args=("dump", ["compare", "--dump", "missing.npz"])),
               threading.Thread(target=ask, args=("problem", ["compare", "--problem", "m=-7,n=8,k=8",
                                                              "--kernel", case.replace(".toml", ".cu"),
                                                              "--entry", "zoo_sm80_bf16_traced"])),
               threading.Thread(target=ask, args=("live", ["compare", "--problem", case, "--inputs", "ones"]))]
    for t in failing:
        t.start()
    for t in (busy, *failing):
        t.join(300)
    silent.close()
    assert replies["busy"] == {"exit": 0, "stdout": "out:tag-busy\n", "stderr": "fd:tag-busy\n" * 5}
    assert replies["flag"]["exit"] == 2 and "--no-such-flag" in replies["flag"]["stderr"]
    assert replies["dump"]["exit"] == 2 and "missing.npz" in replies["dump"]["stderr"]
    assert replies["problem"]["exit"] == 2 and "m=-7" in replies["problem"]["stderr"], replies["problem"]
    import torch

    from oracle.judging.diagnose import EXIT_NO_GPU

    if not torch.cuda.is_available():  # a live compare without a GPU: its own error and exit code
        assert replies["live"]["exit"] == EXIT_NO_GPU and "no CUDA GPU is visible" in replies["live"]["stderr"], \
            replies["live"]
    else:
        assert replies["live"]["exit"] in (0, 1) and "epilogue_store" in replies["live"]["stdout"]
    for name in ("flag", "dump", "problem", "live"):  # nobody else's output
        others = {"flag": "--no-such-flag", "dump": "missing.npz", "problem": "m=-7", "busy": "tag-busy"}
        assert not [o for n, o in others.items() if n != name and o in replies[name]["stderr"]], (name, replies[name])


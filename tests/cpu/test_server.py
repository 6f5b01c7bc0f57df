"""The warm server: a command forwarded over its socket prints and exits as it would in place;
without a server the command runs in place; bad requests are refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

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

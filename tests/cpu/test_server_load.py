"""The warm server under load: one real server process (tests/server_fake.py, on a socket in a
private tmp folder) and 42 clients at once, some well-formed (fake commands that print by every
path, real commands that succeed or fail), some silent, slow, garbled, deeply nested, huge, or
gone mid-way. Every well-formed client gets exactly its own stdout, stderr and exit code; the
server survives all of it, answers afterwards, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEADLINE_S = 1.5  # the server's request deadline in this test
BOUND_S = 60.0
TAG = re.compile(r"tag-\d{3}")


def _doc(argv, env=None, cwd="/") -> bytes:
    return json.dumps({"argv": argv, "cwd": cwd, "env": env or {}}).encode() + b"\n"


def _talk(path, plan, timeout=40.0):
    """Run one client's plan: a list of ("send", bytes) / ("sleep", s) / ("close",); then read the
    reply. Returns the reply as a dict, or the name of what went wrong."""
    failed = None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(timeout)
        c.connect(path)
        for step in plan:
            if step[0] == "send":
                try:
                    c.sendall(step[1])
                except OSError as e:  # the server may refuse (and close) before a request is all sent
                    failed = f"send: {type(e).__name__}"
                    break
            elif step[0] == "sleep":
                time.sleep(step[1])
            else:
                return "closed"
        buf = b""
        try:
            while not buf.endswith(b"\n"):
                chunk = c.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
        except OSError as e:
            return failed or f"recv: {type(e).__name__}"
        return json.loads(buf) if buf else failed or "eof"


def _clients(tmp):
    """(name, plan, check) for each client; check(result) asserts what that client must get."""
    out = []

    def fake_print(i):
        tag, code = f"tag-{i:03d}", (0, 1, 3)[i % 3]

        def check(r):
            assert isinstance(r, dict) and r["exit"] == code, r
            assert set(TAG.findall(r["stdout"] + r["stderr"])) == {tag}, r
            assert r["stdout"] == f"out:{tag}\n"
            for path in ("early", "dunder", "fd", "log", "warn", "thread", "child"):
                assert f"{path}:{tag}" in r["stderr"], (path, r["stderr"])
            assert "the same warning every time" in r["stderr"]  # each command sees its warnings afresh
        return f"print {tag}", [("send", _doc(["knobs", "fake", "print", tag, str(code)]))], check

    def fake_sleep(i):
        tag = f"tag-{i:03d}"

        def check(r):
            assert isinstance(r, dict) and r["exit"] == 0 and r["stdout"] == f"out:{tag}\n", r
            assert r["stderr"] == f"fd:{tag}\n" * 5
        return f"sleep {tag}", [("send", _doc(["knobs", "fake", "sleep", tag, "0.2"]))], check

    def fake_raise(i):
        tag = f"tag-{i:03d}"

        def check(r):
            assert isinstance(r, dict) and r["exit"] == 4 and f"boom:{tag}" in r["stderr"], r
            assert set(TAG.findall(r["stdout"] + r["stderr"])) == {tag}, r
        return f"raise {tag}", [("send", _doc(["knobs", "fake", "raise", tag]))], check

    def real_knobs(i):
        value = str(7000 + i)

        def check(r):
            assert isinstance(r, dict) and r["exit"] == 0, r
            row = next(line for line in r["stdout"].splitlines() if line.startswith("ORACLE_MAX_DETAIL_TILES"))
            assert row.split()[2] == value, row  # the caller's variable, not another client's
        return f"knobs {value}", [("send", _doc(["knobs"], {"ORACLE_MAX_DETAIL_TILES": value}))], check

    def real_bad_flag(i):
        tag = f"tag-{i:03d}"

        def check(r):
            assert isinstance(r, dict) and r["exit"] == 2 and f"--bogus-{tag}" in r["stderr"], r
            assert set(TAG.findall(r["stdout"] + r["stderr"])) == {tag}, r
        return f"bad flag {tag}", [("send", _doc(["compare", f"--bogus-{tag}"]))], check

    def real_missing_dump(i):
        tag = f"tag-{i:03d}"

        def check(r):
            assert isinstance(r, dict) and r["exit"] == 2 and f"missing-{tag}.npz" in r["stderr"], r
            assert set(TAG.findall(r["stdout"] + r["stderr"])) == {tag}, r
        return f"missing dump {tag}", [("send", _doc(["compare", "--dump", f"missing-{tag}.npz"], cwd=str(tmp)))], \
            check

    def refused(phrase):
        def check(r):
            assert isinstance(r, dict) and r["exit"] == 2 and r["stderr"].startswith("error:"), r
            assert phrase in r["stderr"], r
        return check

    def refused_or_cut(r):  # a huge request: refused, or cut off while still sending
        assert (isinstance(r, dict) and r["exit"] == 2 and "larger than" in r["stderr"]) or \
            (isinstance(r, str) and r.startswith(("send", "recv"))), r

    def gone(r):
        assert r == "closed"

    makers = [fake_print] * 12 + [fake_sleep] * 4 + [fake_raise] * 2 + [real_knobs] * 2 + [real_bad_flag] * 2 \
        + [real_missing_dump] * 2
    out.extend(make(i) for i, make in enumerate(makers))
    for _ in range(4):
        out.append(("silent", [], refused("no complete request")))
    for _ in range(2):
        out.append(("slow", [("send", b'{"argv"'), ("sleep", DEADLINE_S + 1), ("send", b': ["knobs"]')],
                    refused("no complete request")))
    for name, line, phrase in (("list", b"[1]\n", "JSON object"),
                               ("not utf-8", b"\xff\xfe\xfd\n", "not a JSON line"),
                               ("env a list", b'{"argv": ["knobs"], "cwd": "/", "env": []}\n', "env must be"),
                               ("empty argv", b'{"argv": [], "cwd": "/", "env": {}}\n', "argv must be"),
                               ("huge number", b'{"argv": ["knobs"], "cwd": "/", "env": {"ORACLE_X": 1'
                                + b"9" * 100_000 + b"}}\n", "not a JSON line")):
        out.append((name, [("send", line)], refused(phrase)))
    out.append(("nested list", [("send", b"[" * 200_000 + b"\n")], refused("nested deeper")))
    out.append(("nested env", [("send", b'{"argv": ["knobs"], "cwd": "/", "env": ' + b'{"a": ' * 50_000 + b"\n")],
                refused("nested deeper")))
    out.append(("huge", [("send", b" " * (3 << 20) + b"\n")], refused_or_cut))
    for _ in range(2):
        out.append(("half a request, then gone", [("send", b'{"argv": ["knobs"], "cw'), ("close",)], gone))
    for j in range(2):
        tag = f"tag-{900 + j:03d}"
        out.append((f"gone mid-command {tag}", [("send", _doc(["knobs", "fake", "sleep", tag, "0.5"])),
                                                 ("sleep", 0.1), ("close",)], gone))
    return out


def test_forty_clients_at_once_each_get_their_own_answer(tmp_path):
    t0 = time.monotonic()
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    sock = str(folder / "s.sock")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.path.join(ROOT, "tests")}
    env.pop("ORACLE_SERVER", None)
    srv = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "server_fake.py"), sock, str(DEADLINE_S)],
                           cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    threads = []
    try:
        assert "listening on" in srv.stderr.readline()
        clients = _clients(tmp_path)
        assert len(clients) >= 40
        results = [None] * len(clients)
        start = threading.Barrier(len(clients))

        def client(k, plan):
            start.wait(10)
            try:
                results[k] = _talk(sock, plan)
            except Exception as e:  # noqa: BLE001  (reported by the check below)
                results[k] = f"{type(e).__name__}: {e}"

        threads = [threading.Thread(target=client, args=(k, plan), daemon=True) for k, (_, plan, _) in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, BOUND_S - (time.monotonic() - t0)))
        assert not any(t.is_alive() for t in threads), "clients still waiting at the time bound"
        failures = []
        for (name, _, check), r in zip(clients, results):
            try:
                check(r)
            except AssertionError as e:
                failures.append(f"{name}: {e}")
        assert not failures, "\n".join(failures)
        # the server lived through it all, and answers as before
        r = _talk(sock, [("send", _doc(["knobs", "fake", "print", "tag-999", "0"]))], timeout=20)
        assert isinstance(r, dict) and r["exit"] == 0 and r["stdout"] == "out:tag-999\n"
        assert srv.poll() is None
    finally:
        srv.terminate()
        try:
            _, err = srv.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.communicate()
            raise
    assert srv.returncode == 0 and not os.path.exists(sock), err
    assert not TAG.search(err), f"a command's output reached the server's terminal:\n{err}"
    assert time.monotonic() - t0 < BOUND_S

"""Warming a server for its cases (oracle.tools.warmup): the case's judgement runs once, shrunk
under the interpreter; a case that cannot be warmed is reported, not fatal; `serve --warm` warms
before it takes the first command."""

from __future__ import annotations

import os
import socket
import threading

from oracle.problem.spec import ProblemSpec, Tile
from oracle.tools import server, warmup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIMPLE = os.path.join(ROOT, "harness", "examples", "simple_gemm.toml")


def test_a_shrunk_problem_keeps_each_extent_s_residue_mod_16():
    spec = ProblemSpec(m=4095, n=4096, k=1000, tile=Tile(128, 128, 64))
    small = warmup.shrink(spec)
    assert (small.m, small.n, small.k) == (255, 256, 120)
    assert [v % 16 for v in (small.m, small.n, small.k)] == [4095 % 16, 0, 1000 % 16]
    assert small.tiles_m == small.tiles_n == small.k_blocks == 2
    tiny = ProblemSpec(m=1, n=64, k=32, tile=Tile(128, 128, 64))
    assert warmup.shrink(tiny) == tiny


def test_a_split_problem_keeps_what_its_split_needs():
    spec = ProblemSpec(m=512, n=512, k=1024, tile=Tile(128, 128, 64), splits=3)
    small = warmup.shrink(spec)
    assert small.splits == 3 and small.k_blocks >= 3 and (small.m, small.n) == (256, 256)


def test_a_case_warms_through_its_analysis():
    w = warmup.warm_case(SIMPLE)
    assert w.error is None and w.how == "analysis", w.describe()
    assert "warmed" in w.describe() and "bf16" in w.problem


def test_a_case_that_cannot_load_is_reported(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[problem]\nm = 0\n")
    lines = []
    out = warmup.warm([str(bad), str(tmp_path / "missing.toml")], log=lines.append)
    assert all(w.error for w in out) and len(lines) == 2
    assert all(line.startswith("could not warm") for line in lines)


def test_serve_warms_before_it_takes_the_first_command(tmp_path):
    path = str(tmp_path / "o.sock")
    order, ready = [], threading.Event()

    def warm():
        order.append("warm")
        try:  # the socket listens while warming: a client waits instead of running cold
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(path)
                order.append("connectable")
        except OSError:
            order.append("not listening")

    def main(argv):
        order.append(argv[0])
        return 0

    t = threading.Thread(target=server.serve, args=(path, main),
                         kwargs={"max_requests": 2, "ready": ready.set, "warm": warm}, daemon=True)
    t.start()
    assert ready.wait(10)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(path)
        c.sendall(b'{"argv": ["knobs"], "cwd": "/", "env": {}}\n')
        c.recv(1 << 20)
    t.join(10)
    assert order[:2] == ["warm", "connectable"] and order[-1] == "knobs"

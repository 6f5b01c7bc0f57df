"""One worker per GPU, with stand-in workers: every case runs once on the GPU its worker owns, the
rows come back in case order, a worker that dies loses no row silently, and two shards run as two
commands give the same set of rows as one run."""

from __future__ import annotations

import sys

from oracle.tools.bench import parse_shard
from oracle.tools.workers import run_workers, sub_shard

# a stand-in worker: writes one row per case of its shard, naming the GPU it was given
WORKER = r"""
import json, os, sys
shard, out, n_cases, die = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
i, n = (int(v) for v in shard.split("/"))
if die == os.environ["CUDA_VISIBLE_DEVICES"]:
    sys.exit(137)  # this GPU's worker is killed before it writes anything
with open(out, "w") as f:
    for j in range(n_cases):
        if j % n == i:
            f.write(json.dumps({"index": j, "name": f"case{j}", "verdict": "MATCH",
                                "gpu": os.environ["CUDA_VISIBLE_DEVICES"],
                                "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
                                "server": os.environ.get("ORACLE_SERVER")}) + "\n")
"""


def _run(n_cases, gpus, shard=(0, 1), die="none"):
    expected = [j for j in range(n_cases) if j % shard[1] == shard[0]]
    return run_workers(lambda sub, out: [sub, out, str(n_cases), die], shard, gpus, expected,
                       prefix=(sys.executable, "-c", WORKER), stream=open("/dev/null", "w"))


def test_every_case_runs_once_in_case_order_on_its_gpu():
    rows = _run(11, 4)
    assert [r["index"] for r in rows] == list(range(11))
    for r in rows:  # case j of the whole list goes to GPU j % 4
        assert r["gpu"] == str(r["index"] % 4) and r["worker"] == r["index"] % 4
    assert all(r["nvls"] == "0" for r in rows)  # NVLink multicast stays off in the workers


def test_a_worker_runs_its_shard_itself_not_through_a_warm_server(monkeypatch):
    """A bench run in the warm server starts workers; forwarded back to that server, which runs
    one command at a time, they would wait on their own parent."""
    monkeypatch.setenv("ORACLE_SERVER", "auto")
    assert all(r["server"] is None for r in _run(4, 2))


def test_a_dead_worker_loses_no_row_silently():
    rows = _run(9, 3, die="1")
    assert [r["index"] for r in rows] == list(range(9))
    dead = [r for r in rows if r["verdict"] == "ERROR"]
    assert [r["index"] for r in dead] == [1, 4, 7] and all("worker 1" in r["error"] for r in dead)


def test_two_shards_run_apart_give_the_rows_of_one_run():
    whole = _run(13, 2)
    halves = _run(13, 2, shard=(0, 2)) + _run(13, 2, shard=(1, 2))
    key = (lambda r: (r["index"], r["name"], r["verdict"]))
    assert sorted(map(key, halves)) == sorted(map(key, whole))
    assert len({r["index"] for r in halves}) == 13


def test_sub_shards_partition_a_shard():
    for i, n, gpus in ((0, 1, 4), (1, 3, 2), (2, 5, 3)):
        cases = [j for j in range(60) if j % n == i]
        parts = []
        for g in range(gpus):
            si, sn = parse_shard(sub_shard((i, n), gpus, g))
            parts += [j for j in range(60) if j % sn == si]
        assert sorted(parts) == cases

"""One worker process per visible GPU for a sweep (`bench`, `verify`), and the merge of their rows.

A sweep's shard i/n keeps cases j with j % n == i; with G GPUs each worker g runs the sub-shard
(i + n g)/(n G) of the whole list, alone on its GPU (CUDA_VISIBLE_DEVICES), with its own kernel
child processes and caches, and writes JSON lines. The parent merges them into case order (every
row carries `index`, its position in the whole list) and says which rows are missing, so a worker
that died loses nothing silently.

A worker is started as harness.python_start starts every Python: in a private folder (the one that
holds its JSON lines), never importing from the caller's folder, with PYTHONPATH kept. So paths on
its command line must be absolute (`absolute`), and the path-valued ORACLE_* knobs of its
environment are made absolute against the caller's folder (harness.knobs.absolute_paths).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, Optional, Sequence

from harness.knobs import absolute_paths
from harness.python_start import python_command, python_env

ENV_KEEP = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def device_of_this_process() -> dict:
    """The GPU this process runs on, for a result row."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None}
    i = torch.cuda.current_device()
    return {"gpu": {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "index": i,
                    "name": torch.cuda.get_device_name(i)}}


def sub_shard(shard: tuple[int, int], gpus: int, g: int) -> str:
    i, n = shard
    return f"{i + n * g}/{n * gpus}"


def absolute(path: str) -> str:
    """A path of the caller's command line as a worker (in its own folder) must be given it."""
    return os.path.abspath(os.path.expanduser(path))


def run_workers(argv_for: Callable[[str, str], Sequence[str]], shard: tuple[int, int], gpus: int,
                expected: Sequence[int], *, stream=None, env: dict = None,
                prefix: Optional[Sequence[str]] = None) -> list[dict]:
    """Start one worker per GPU: prefix (default: the oracle's own command, python_command("oracle"))
    + argv_for(sub_shard_text, jsonl_path) is its command line. Returns every row in `index` order;
    a case whose row is missing gets an ERROR row naming its worker."""
    rows: list[dict] = []
    stream = sys.stderr if stream is None else stream  # looked up at the call: a caller may have swapped it
    prefix = python_command("oracle") if prefix is None else tuple(prefix)
    base = absolute_paths(python_env(os.environ if env is None else env), os.getcwd())
    base.pop("ORACLE_SERVER", None)  # a worker runs its shard itself: forwarded, it would wait on its parent's server
    with tempfile.TemporaryDirectory(prefix="oracle-workers-") as tmp:  # 0700, this user's own
        procs = []
        for g in range(gpus):
            out = os.path.join(tmp, f"worker{g}.jsonl")
            argv = [*prefix, *argv_for(sub_shard(shard, gpus, g), out)]
            wenv = dict(base, CUDA_VISIBLE_DEVICES=str(g), **ENV_KEEP)
            procs.append((g, subprocess.Popen(argv, env=wenv, cwd=tmp, stdout=subprocess.DEVNULL), out))
        for g, p, out in procs:
            code = p.wait()
            got = []
            if os.path.exists(out):
                with open(out) as f:
                    for line in f:
                        if line.strip():
                            try:
                                got.append(json.loads(line))
                            except json.JSONDecodeError:
                                pass
            for r in got:
                r.setdefault("worker", g)
            rows.extend(got)
            if code not in (0, 1):
                print(f"worker {g} (GPU {g}) exited with {code}", file=stream, flush=True)
    seen = {r.get("index") for r in rows}
    i, n = shard
    for j in expected:
        if j not in seen:
            g = ((j - i) // n) % gpus
            rows.append({"index": j, "name": f"case{j}", "verdict": "ERROR", "worker": g,
                         "error": f"no result from worker {g} (it died or was killed)"})
    return sorted(rows, key=lambda r: r.get("index", 0))

"""The files through which the runner (parent) and the kernel child process talk. No torch here.

A run directory holds:

| file                 | written by | content                                                       |
|----------------------|------------|---------------------------------------------------------------|
| request.json         | parent     | entry, launch (LaunchSpec.to_dict), tensors {name: dtype, shape, role}, sink, device, poison |
| kernel.cubin         | parent     | the module image                                               |
| kernel.so            | parent     | or a launch library (request "library": harness.launch_abi)    |
| inputs.safetensors   | parent     | the 'in' and 'inout' tensors                                   |
| progress.jsonl       | child      | one JSON object per line, appended as the child advances       |
| outputs.safetensors  | child      | the 'out' and 'inout' tensors after the kernel (only when OK)  |
| status.json          | child      | the final word: status, error code/name/call, message, timings |
| child.stdout/.stderr | child      | its output streams                                             |

The sink file named in the request lives outside the run directory when possible (/dev/shm), so the
parent can read what the kernel wrote even after killing a hung child.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

PROTOCOL_VERSION = 1

REQUEST = "request.json"
CUBIN = "kernel.cubin"
LIBRARY = "kernel.so"
INPUTS = "inputs.safetensors"
OUTPUTS = "outputs.safetensors"
PROGRESS = "progress.jsonl"
STATUS = "status.json"
STDOUT = "child.stdout"
STDERR = "child.stderr"

# The child's phases, in order. The parent reports the last one reached when the child dies or hangs.
PHASES = ("start", "init", "context", "load", "alloc", "upload", "sink", "encode", "launch", "sync",
          "download", "done")

# Statuses the child can write (the parent adds TIMEOUT and CRASHED).
CHILD_STATUSES = ("OK", "CUDA_ERROR", "LOAD_ERROR", "SETUP_ERROR", "HARNESS_ERROR", "LIBRARY_ERROR")

# Where the sink bytes the parent reads come from.
SINK_FILE = "host_mapped_file"  # the kernel wrote straight into the shared file's pages
SINK_PINNED_COPY = "host_pinned_copy"  # pinned host memory, copied into the file by the child after the run
SINK_DEVICE_COPY = "device_copy"  # device memory, copied into the file after a successful run

SMEM_POISON_SYMBOL = "oracle_trace_smem_poison"  # the trace header's {enabled, pattern, ctas, 0} words

POISON_BYTE = 0xFF  # NaN in fp32/fp16/bf16/e4m3/e5m2, -1 in integers


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


class Progress:
    """Append-only log of the child's phases; each line is written with one os.write."""

    def __init__(self, run_dir: Path):
        self._fd = os.open(run_dir / PROGRESS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._t0 = time.monotonic()

    def mark(self, phase: str, **info) -> None:
        line = json.dumps({"phase": phase, "t": round(time.monotonic() - self._t0, 6), **info}) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


def read_progress(run_dir: Path) -> list[dict]:
    """The progress records; a torn or malformed line (a child killed mid-write) is skipped."""
    try:
        text = (run_dir / PROGRESS).read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("phase"), str):
            out.append(rec)
    return out


def read_status(run_dir: Path) -> tuple[Optional[dict], str]:
    """(status document, "") or (None, why it is unusable)."""
    path = run_dir / STATUS
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "the child wrote no status"
    except (OSError, ValueError) as exc:
        return None, f"the child's status file is unreadable: {exc}"
    if not isinstance(doc, dict) or doc.get("status") not in CHILD_STATUSES:
        return None, f"the child's status file is malformed: {str(doc)[:200]}"
    return doc, ""

"""One reader for a dump of either problem kind: a GEMM `Recording` (oracle.run.recording) or an
`AttentionRecording` (oracle.run.attention_recording), as the document's problem kind says.

The kind is read from the document inside harness.dump.load_dump's header check, so the header
and the document are checked for that kind (every tensor's dtype and shape against the problem)
before any data is read; the recording is then validated whole against its problem.
"""

from __future__ import annotations

from typing import Union

from harness.dump import load_dump
from harness.taps import ALL_TAP_STAGES
from oracle.run.attention_recording import AttentionRecording, check_attention_header
from oracle.run.recording import Recording, check_header, problem_kind


def load_recording(path: str) -> Union[Recording, AttentionRecording]:
    """The recording a dump file (safetensors, or its .gz) holds. Raises DumpError naming the
    problem (the file, the field, the value), nothing else."""
    kinds: list[str] = []

    def check(meta, inputs, outputs) -> None:
        kinds.append(problem_kind(meta, f"dump {path!r}"))
        (check_attention_header if kinds[-1] == "attention" else check_header)(path, meta, inputs, outputs)

    dump = load_dump(path, check, stages=ALL_TAP_STAGES)  # each kind's validate refuses the other's taps
    if kinds[-1] == "attention":
        return AttentionRecording.of_dump(path, dump)
    return Recording.of_dump(path, dump)

"""Attention case files ([problem] kind = "attention") for the CPU tests: a case's text, and the file
written beside a stand-in kernel source whose entry does nothing (no GPU builds or runs it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

SOURCE = "fa.cu"
ENTRY = "fa_fwd_traced"


def case_text(problem: str, args: Sequence[str]) -> str:
    """The case: `problem`'s TOML lines after kind = "attention", ENTRY of SOURCE launched with the
    operands and scalars `args` over one CTA of 128 threads per query block, query head and batch."""
    return (f'[problem]\nkind = "attention"\n{problem.strip()}\n\n'
            f'[kernel]\nsource = "{SOURCE}"\nentry = "{ENTRY}"\n\n'
            f'[launch]\ngrid = ["q_blocks", "heads_q", "batch"]\nblock = [128, 1, 1]\n'
            f'args = {json.dumps(list(args))}\n')


def write_case(folder: Path, text: str, name: str = "case.toml") -> str:
    """`text` written as folder/`name` beside a stand-in SOURCE that defines ENTRY; the case file's path."""
    (folder / SOURCE).write_text(f'extern "C" __global__ void {ENTRY}() {{}}\n')
    path = folder / name
    path.write_text(text)
    return str(path)

"""The oracle's environment knobs, declared in the one table the harness keeps
(harness.knobs): name, type, default, one line of doc. `python -m oracle knobs` lists them all;
the README does too."""

from __future__ import annotations

from harness.knobs import KNOBS, Knob, KnobError, positive_int, register  # noqa: F401  (KnobError is re-exported)


def _choice(*allowed: str):
    def parse(s: str) -> str:
        if s not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return s
    return parse


DEVICE = register(Knob("ORACLE_DEVICE", _choice("auto", "cpu", "cuda"), lambda: "auto",
                       "Where the Triton references run: cuda when a GPU is visible (auto), or forced."))
def _count(s: str) -> int:
    v = int(s)
    if v < 0:
        raise ValueError("expected a non-negative integer")
    return v


CROSS_CHECK_TILES = register(Knob("ORACLE_CROSS_CHECK_TILES", _count, lambda: 2,
                                  "Tiles on which the Triton references are checked against the float64 host "
                                  "specs on every run (0: none)."))
MAX_DETAIL_TILES = register(Knob("ORACLE_MAX_DETAIL_TILES", positive_int, lambda: 64,
                                 "Failing tiles per stage for which the first bad elements are extracted."))

TRACE_MAX_MB = register(Knob("ORACLE_TRACE_MAX_MB", positive_int, lambda: 2048,
                             "The most a live run's trace sink may take, in MiB (a case's [trace] capacity_mb "
                             "overrides it): the sink is sized to the selection up to this."))

MAX_OPERAND_MB = register(Knob("ORACLE_MAX_OPERAND_MB", positive_int, lambda: 32768,
                               "The most memory, in MiB, a problem's operands, output and declared workspaces may "
                               "take (A, B, C, D, bias, scales, [workspace.X]), with the draws that make the inputs "
                               "and a reproducer's reference D and bound; a larger problem is refused before any "
                               "input is made. The machine's memory, the address-space limit (RLIMIT_AS) and, "
                               "with a GPU, the device's free memory also bound it (harness.budget)."))

def _seconds(s: str) -> float:
    v = float(s)
    if not 0 < v < float("inf"):
        raise ValueError("expected a positive, finite number of seconds")
    return v


CPU_MAX_S = register(Knob("ORACLE_CPU_MAX_S", _seconds, lambda: 900.0,
                          "The longest a verify sweep may be estimated to take on a machine with no GPU (the "
                          "Triton interpreter judges it on the CPU), in seconds; a sweep estimated longer is "
                          "refused before any case runs, naming the case."))

ZOO_RECORD_DIR = register(Knob("ORACLE_ZOO_RECORD_DIR", lambda s: s, lambda: None,
                               "Where the GPU zoo tests save each live recording under its manifest name "
                               "(unset: not saved).", path="path"))

SERVER = register(Knob("ORACLE_SERVER", lambda s: s, lambda: None,
                       "The warm `python -m oracle serve` that commands run in: `auto` (or 1) for its "
                       "default socket, else the path of its --socket (unset, empty or 0: commands run in "
                       "the calling process).", path="command"))

ALL = tuple(KNOBS.values())

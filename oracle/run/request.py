"""What one judgement asks to be run: a frozen RunRequest, the first step of the one path every
entry point walks (request -> oracle.run.execute.run -> oracle.judging.judgement.judge -> the
renderers of oracle.report).

A request names exactly one source of a recording:
    case        a live case (oracle.run.case_types.Case): built, run and traced on `inputs`
    dump        a dump file (safetensors, or its .gz)
    recording   a Recording already in memory (oracle.check, a reproducer's run read back by
                oracle.repro.readback, a model, a caller's own); `source` says where it came from
and, for a live case only, how to run it: `repeat` N traced and N untraced runs compared bit for
bit, `smem_poison` (a 32-bit pattern, and then its complement), `sanitize` (compute-sanitizer on
the untraced build), `time` (the kernel and its peers under the timing discipline), `timeout_s`.
Every combination that cannot be run is refused here, in one place, with a RequestError.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from oracle.run.case import load_case, parse_assignments, trace_stages
from oracle.run.case_types import MAX_REPEAT, Case, CaseError, with_trace
from oracle.problem.attention import is_attention
from oracle.run.inputs import ATTENTION_LADDER, LADDER, parse_inputs
from oracle.run.recording import Recording


class RequestError(CaseError):
    """A request that cannot be run as asked (two sources, race options on a recording, ...)."""


@dataclass(frozen=True)
class RunRequest:
    case: Optional[Case] = None
    inputs: str = "random"  # ones | index | ktag | random[:seed] | dump:PATH (a live case's inputs)
    dump: Optional[str] = None
    recording: Optional[Recording] = None
    source: str = ""  # where a recording came from, for the report (default: the dump's path)
    repeat: Optional[int] = None  # None: the case's [run] repeat
    smem_poison: Optional[int] = None  # None: the case's [run] smem_poison
    sanitize: bool = False
    time: bool = False
    timeout_s: Optional[float] = None
    command: tuple[str, ...] = ()  # the command line that asked, kept so a report can say how to re-run it

    def __post_init__(self) -> None:
        sources = [name for name in ("case", "dump", "recording") if getattr(self, name) is not None]
        if len(sources) != 1:
            raise RequestError("a request names one source: a live case, a dump or a recording; "
                               + (f"got {' and '.join(sources)}" if sources else "got none"))
        live_only = [name for name, on in (("repeat", self.repeat is not None), ("smem_poison", self.smem_poison is not None),
                                           ("sanitize", self.sanitize), ("time", self.time)) if on]
        if self.case is None and live_only:
            raise RequestError(f"{', '.join(live_only)} need a live kernel: a recording cannot be run again")
        if self.case is not None:  # InputError naming what is wrong
            parse_inputs(self.inputs, ATTENTION_LADDER if is_attention(self.case.spec) else LADDER)
        r = self.repeat
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPEAT):
            raise RequestError(f"repeat = {r!r} must be an integer from 1 to {MAX_REPEAT}")
        p = self.smem_poison
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 0xFFFFFFFF):
            raise RequestError(f"smem_poison = {p!r} must be a 32-bit word (0 to 0xFFFFFFFF)")
        t = self.timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
            raise RequestError(f"timeout_s = {t!r} must be a positive, finite number of seconds")
        if self.time and (self.races or self.sanitize):
            raise RequestError("timing measures one run: ask for it without repeat, smem_poison and sanitize")
        object.__setattr__(self, "command", tuple(self.command))

    @property
    def runs(self) -> int:
        """How many times each build runs (the request's repeat, else the case's)."""
        if self.repeat is not None:
            return self.repeat
        return self.case.run.repeat if self.case is not None else 1

    @property
    def poison(self) -> Optional[int]:
        if self.smem_poison is not None:
            return self.smem_poison
        return self.case.run.smem_poison if self.case is not None else None

    @property
    def races(self) -> bool:
        """The run looks for races: repeated runs or shared-memory poison."""
        return self.runs > 1 or self.poison is not None


def resolve_case(path: Optional[str] = None, overrides: Optional[dict] = None, *, assignments: Sequence[str] = (),
                 kernel: Optional[str] = None, entry: Optional[str] = None, untraced_entry: Optional[str] = None,
                 trace_tiles: Optional[Sequence[tuple[int, int]]] = None,
                 trace_k_blocks: Optional[Sequence[int]] = None, trace_stages_text: Optional[str] = None,
                 trace_groups: Optional[Sequence[int]] = None,
                 trace_stages_where: str = "trace_stages", untraced_entry_where: str = "untraced_entry",
                 allow_library: bool = False,
                 allow_outside_case_dir: bool = False) -> Case:
    """The live case a request runs: the case file (or none), problem fields (`overrides`, then
    `assignments` such as "m=256"), the kernel's source and entry point, the untraced entry, and
    the trace selection (`*_where`: how the caller names the option in a message, a flag or a
    keyword). Every entry point (command line, Python, bench) builds its case here. A case
    file that names a launch library needs `allow_library`, one that names files outside its folder
    `allow_outside_case_dir` (oracle.run.case_files)."""
    fields = {**(overrides or {}), **parse_assignments(list(assignments))}
    case = load_case(path, fields, source=kernel, entry=entry, allow_library=allow_library,
                     allow_outside_case_dir=allow_outside_case_dir)
    if untraced_entry:
        if case.kernel is None:
            raise RequestError(f"{untraced_entry_where} goes with a kernel (a source and its entry, or [kernel])")
        if case.kernel.library is not None:
            raise RequestError(f"{untraced_entry_where} names a cubin's entry point; a launch library ([kernel] "
                               "library) is entered only through oracle_launch (its untraced build is the source "
                               "without ORACLE_TRACE)")
        case = replace(case, kernel=replace(case.kernel, untraced_entry=untraced_entry))
    if trace_tiles or trace_k_blocks or trace_stages_text or trace_groups:
        stages = trace_stages(trace_stages_text, trace_stages_where) if trace_stages_text else None
        case = with_trace(case, tuple(trace_tiles) if trace_tiles else None,
                          tuple(trace_k_blocks) if trace_k_blocks else None, stages,
                          tuple(trace_groups) if trace_groups else None)
    return case

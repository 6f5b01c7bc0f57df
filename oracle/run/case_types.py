"""What a case is: the problem, the kernel to build, how to launch it, what to trace, the workspaces
and how often to run, as frozen values (oracle.run.case reads them from TOML and checks them).

Constraints: a value here is already checked by the loader, except RunPlan, which checks itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Union

from harness.errors import BadInput
from harness.fields import shown
from oracle.run.adapters import Adapter
from oracle.problem.spec import ProblemSpec


class CaseError(BadInput, ValueError):
    """A case description that cannot be used; the message names the key."""


@dataclass(frozen=True)
class KernelSource:
    source: Optional[str]  # a .cu file
    entry: str
    defines: Mapping[str, str] = field(default_factory=dict)
    arch: str = "sm_90a"
    cubin: Optional[str] = None  # a prebuilt cubin instead of the source
    time_entry: Optional[str] = None  # the untraced entry point to time (default: `entry`, sink off)
    untraced_entry: Optional[str] = None  # the entry in the build without -DORACLE_TRACE (default: `entry`)
    library: Optional[str] = None  # a launch library's source (entry is then its oracle_launch)
    adapter: Optional[Adapter] = None  # the shipped adapter the library includes (oracle.run.adapters)
    include_dirs: tuple[str, ...] = ()  # folders searched for headers, checked (oracle.run.kernel_flags)
    nvcc_flags: tuple[str, ...] = ()  # extra nvcc flags, each on the allow-list (oracle.run.kernel_flags)


@dataclass(frozen=True)
class Arg:
    kind: str  # "operand" | "size" | "float" | "literal" | "tensormap" | "workspace" | "null"
    name: str = ""
    ctype: str = ""
    expr: Union[str, int, float, None] = None
    options: tuple[tuple[str, Any], ...] = ()  # tensormap: host-side choices (see the module doc)


@dataclass(frozen=True)
class LaunchPlan:
    grid: tuple[Union[int, str], ...]
    block: tuple[int, int, int]
    args: tuple[Arg, ...]
    shared_mem_bytes: int = 0
    cluster: tuple[int, int, int] = (1, 1, 1)
    entry: Optional[str] = None  # a later launch's kernel (the first launch runs [kernel] entry)
    next: tuple["LaunchPlan", ...] = ()  # kernels launched after this one, in order, on the same buffers
    abi: Optional[str] = None  # a launch library's ABI ([launch] abi); it launches its own kernels
    untraced_entry: Optional[str] = None  # a later launch's entry in the untraced build (oracle.run.races)


@dataclass(frozen=True)
class Workspace:
    """A buffer the harness allocates for every launch and fills before it: zeros, the 0xFF poison,
    or stale data (a deterministic junk pattern, as an earlier use of the buffer leaves it)."""

    name: str
    bytes: Union[int, str]  # an expression of the problem's sizes
    init: str = "zero"
    dtype: str = "uint8"  # what stale data looks like: bytes, small int32s, or finite fp32 values


@dataclass(frozen=True)
class TracePlan:
    tiles: Optional[tuple[tuple[int, int], ...]] = None  # None: a default sample
    k_blocks: Optional[tuple[int, ...]] = None  # None: all
    stages: Optional[tuple[str, ...]] = None  # None: every tap stage
    capacity_mb: Optional[int] = None  # the sink's ceiling; None: the ORACLE_TRACE_MAX_MB knob
    groups: Optional[tuple[int, ...]] = None  # groups / batch entries traced (at most 4); None: all


@dataclass(frozen=True)
class RunPlan:
    """[run]: how often and how the kernel runs (oracle.judging.repeat): `repeat` runs of the traced and
    of the untraced build on the same inputs, and an optional shared-memory poison pattern."""

    repeat: int = 1
    smem_poison: Optional[int] = None

    def __post_init__(self) -> None:
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or not 1 <= self.repeat <= MAX_REPEAT:
            raise CaseError(f"[run] repeat = {shown(self.repeat)} must be an integer from 1 to {MAX_REPEAT}")
        if self.smem_poison is not None and (isinstance(self.smem_poison, bool) or not isinstance(self.smem_poison, int)
                                             or not 0 <= self.smem_poison <= 0xFFFFFFFF):
            raise CaseError(f"[run] smem_poison = {shown(self.smem_poison)} must be a 32-bit word (0 to 0xFFFFFFFF)")


MAX_REPEAT = 100


@dataclass(frozen=True)
class Case:
    spec: ProblemSpec
    kernel: Optional[KernelSource]
    launch: Optional[LaunchPlan]
    trace: TracePlan
    path: Optional[str] = None
    workspaces: tuple[Workspace, ...] = ()
    run: RunPlan = RunPlan()


def with_trace(case: Case, tiles=None, k_blocks=None, stages=None, groups=None) -> Case:
    t = case.trace
    return replace(case, trace=replace(t, tiles=tiles if tiles is not None else t.tiles,
                                       k_blocks=k_blocks if k_blocks is not None else t.k_blocks,
                                       stages=stages if stages is not None else t.stages,
                                       groups=groups if groups is not None else t.groups))

"""What a run's trace covered and lost (TraceAccount): records, bytes, drops by stage, the sink's
capacity, and whether the child relaunched with a bigger sink."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


from harness.taps import TAP_STAGES
from harness.trace_format.format import STAGE_CODES
from harness.trace_format.header import TraceSelection
from harness.trace_format.parser import TraceResult


@dataclass(frozen=True)
class TraceAccount:
    """The selection a run recorded under, the records it lost (dropped because the sink was
    full, in total and by stage; torn by a kernel that stopped), the bytes the kernel reserved and
    the bytes the sink had. `relaunched`: the first launch overflowed its sink and this trace is
    from a second launch with a sink of the measured size (`first_capacity` bytes before)."""

    selection: TraceSelection = field(default_factory=TraceSelection)
    dropped: int = 0
    dropped_by_stage: Optional[tuple[tuple[str, int], ...]] = None  # None: the sink's version does not say
    needed_bytes: int = 0
    capacity: int = 0
    torn: int = 0
    relaunched: bool = False
    first_capacity: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("dropped", "needed_bytes", "capacity", "torn"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"trace account {name}={v!r} must be a non-negative int")
        if self.dropped_by_stage is not None:
            for item in self.dropped_by_stage:
                if (not isinstance(item, (tuple, list)) or len(item) != 2 or item[0] not in STAGE_CODES
                        or isinstance(item[1], bool) or not isinstance(item[1], int) or item[1] < 0):
                    raise ValueError(f"trace account dropped_by_stage entry {item!r} must be [stage, count]")
            object.__setattr__(self, "dropped_by_stage", tuple((s, n) for s, n in self.dropped_by_stage))

    @property
    def complete(self) -> bool:
        return self.dropped == 0 and self.torn == 0

    def to_json(self) -> dict:
        sel = self.selection
        return {"tiles": None if sel.tiles is None else [list(t) for t in sel.tiles],
                "k_blocks": None if sel.k_blocks is None else list(sel.k_blocks), "stages": list(sel.stages),
                "groups": None if sel.groups is None else list(sel.groups), "dropped": self.dropped,
                "dropped_by_stage": None if self.dropped_by_stage is None else dict(self.dropped_by_stage),
                "needed_bytes": self.needed_bytes, "capacity": self.capacity, "torn": self.torn,
                "relaunched": self.relaunched, "first_capacity": self.first_capacity}

    @classmethod
    def from_json(cls, d) -> "TraceAccount":
        """Raises ValueError naming the field for anything malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"a trace account must be a JSON object, got {type(d).__name__}")
        known = {"tiles", "k_blocks", "stages", "groups", "dropped", "dropped_by_stage", "needed_bytes", "capacity", "torn",
                 "relaunched", "first_capacity"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"trace account has unknown field(s) {', '.join(unknown)}")
        tiles, kbs, stages = d.get("tiles"), d.get("k_blocks"), d.get("stages", list(TAP_STAGES))
        groups = d.get("groups")
        for name, v in (("tiles", tiles), ("k_blocks", kbs), ("groups", groups)):
            if v is not None and not isinstance(v, list):
                raise ValueError(f"trace account {name} must be a list or null, got {v!r}")
        if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
            raise ValueError(f"trace account stages must be a list of stage names, got {stages!r}")
        by_stage = d.get("dropped_by_stage")
        if by_stage is not None and not isinstance(by_stage, dict):
            raise ValueError(f"trace account dropped_by_stage must be an object or null, got {by_stage!r}")
        first = d.get("first_capacity")
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 0):
            raise ValueError(f"trace account first_capacity={first!r} must be a non-negative int or null")
        relaunched = d.get("relaunched", False)
        if not isinstance(relaunched, bool):
            raise ValueError(f"trace account relaunched={relaunched!r} must be true or false")
        selection = TraceSelection(tiles=None if tiles is None else tuple(tuple(t) if isinstance(t, list) else t
                                                                          for t in tiles),
                                   k_blocks=None if kbs is None else tuple(kbs), stages=tuple(stages),
                                   groups=None if groups is None else tuple(groups))
        return cls(selection=selection, dropped=d.get("dropped", 0),
                   dropped_by_stage=None if by_stage is None else tuple(by_stage.items()),
                   needed_bytes=d.get("needed_bytes", 0), capacity=d.get("capacity", 0), torn=d.get("torn", 0),
                   relaunched=relaunched, first_capacity=first)


def account_of(result: TraceResult, *, relaunched: bool = False,
               first_capacity: Optional[int] = None) -> TraceAccount:
    """The accounting of a parsed trace."""
    return TraceAccount(selection=result.selection, dropped=result.dropped, dropped_by_stage=result.dropped_by_stage,
                        needed_bytes=result.needed_bytes, capacity=result.capacity, torn=result.torn,
                        relaunched=relaunched, first_capacity=first_capacity)

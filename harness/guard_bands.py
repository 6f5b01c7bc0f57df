"""Guard bands around every buffer a kernel writes: a write past either end of D (or of any output
or in-out buffer) changes bytes the kernel was never given, and is named with its offset.

Data path: the child allocates GUARD_BYTES + nbytes + GUARD_BYTES (guarded_bytes), hands the kernel
the interior pointer (base + GUARD_BYTES), fills both bands with GUARD_BYTE before every launch,
and after the last launch reads the two bands back; check_bands compares them with the pattern and
gives a GuardBreach per band a kernel wrote. Offsets count from the buffer's first byte: a write
before it is negative, a write past its end is >= nbytes.

Constraints: GUARD_BYTES is a multiple of 256, so the interior pointer keeps the alignment cuMemAlloc
gives (TMA needs 16 bytes, vector stores 16). A write that lands in a band with the band's own
byte, or past the band, is not seen (compute-sanitizer's memcheck sees those: --sanitize). The
functions here are pure: bytes (or a CPU uint8 tensor) in, breaches out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

GUARD_BYTES = 4096
GUARD_BYTE = 0x5A  # not the output poison (0xFF): a band copied from unwritten D still shows
SIDES = ("before", "after")


class GuardError(ValueError):
    """A guard-band record that does not describe one (a malformed child status)."""


@dataclass(frozen=True)
class GuardBreach:
    """Bytes of a guard band a kernel changed: `tensor` (d, ws_NAME, ...), the band's `side`, the
    first and last changed byte's offset from the buffer's first byte, and how many bytes changed."""

    tensor: str
    side: str
    first: int
    last: int
    changed: int
    nbytes: int  # the buffer's own size

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, str) or not self.tensor:
            raise GuardError(f"GuardBreach.tensor = {self.tensor!r} must be a buffer's name")
        if self.side not in SIDES:
            raise GuardError(f"GuardBreach.side = {self.side!r} must be one of {', '.join(SIDES)}")
        for name in ("first", "last", "changed", "nbytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise GuardError(f"GuardBreach.{name} = {v!r} must be an integer")
        inside = (lambda o: o < 0) if self.side == "before" else (lambda o: o >= self.nbytes)
        if not (inside(self.first) and inside(self.last) and self.first <= self.last and self.changed >= 1):
            raise GuardError(f"GuardBreach {self.side} of {self.tensor}: bytes {self.first}..{self.last} "
                             f"({self.changed} changed) do not lie in that band of a {self.nbytes}-byte buffer")

    def describe(self) -> str:
        if self.side == "after":
            where = (f"past its end: {self.changed} byte(s) changed from byte offset {self.first} "
                     f"({self.first - self.nbytes + 1} past its last byte, {self.nbytes - 1}) to {self.last}")
        else:
            where = (f"before its start: {self.changed} byte(s) changed from byte offset {self.first} to "
                     f"{self.last} ({-self.last} before its first byte)")
        return f"the kernel wrote {self.tensor} {where}"

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "side": self.side, "first": self.first, "last": self.last,
                "changed": self.changed, "nbytes": self.nbytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GuardBreach":
        if not isinstance(d, Mapping) or set(d) != {"tensor", "side", "first", "last", "changed", "nbytes"}:
            raise GuardError(f"a guard breach record must hold tensor, side, first, last, changed and nbytes, "
                             f"got {d!r}"[:300])
        return cls(**d)


def guarded_bytes(nbytes: int) -> int:
    """What to allocate for a buffer of `nbytes` with its two bands."""
    return GUARD_BYTES + nbytes + GUARD_BYTES


def _band(data: Any) -> bytes:
    if hasattr(data, "numpy"):  # a CPU uint8 tensor
        return data.contiguous().numpy().tobytes()
    return bytes(data)


def check_bands(tensor: str, before: Any, after: Any, nbytes: int,
                pattern: int = GUARD_BYTE) -> tuple[GuardBreach, ...]:
    """The breaches of the two bands as read back (`before`: the GUARD_BYTES below the buffer,
    `after`: those above it), each bytes or a CPU uint8 tensor."""
    out = []
    for side, data in (("before", _band(before)), ("after", _band(after))):
        bad = [i for i, b in enumerate(data) if b != pattern]
        if not bad:
            continue
        base = -len(data) if side == "before" else nbytes
        out.append(GuardBreach(tensor, side, base + bad[0], base + bad[-1], len(bad), nbytes))
    return tuple(out)


def check_allocation(tensor: str, allocation: Any, nbytes: int, guard: int = GUARD_BYTES,
                     pattern: int = GUARD_BYTE) -> tuple[GuardBreach, ...]:
    """check_bands over a whole guarded allocation (guard + nbytes + guard bytes)."""
    data = _band(allocation)
    if len(data) != guard + nbytes + guard:
        raise GuardError(f"the allocation of {tensor} has {len(data)} bytes, not {guard} + {nbytes} + {guard}")
    return check_bands(tensor, data[:guard], data[guard + nbytes:], nbytes, pattern)


def breaches_of(records: Optional[list]) -> tuple[GuardBreach, ...]:
    """A child status's guard_breaches list as GuardBreach values."""
    return tuple(GuardBreach.from_dict(r) for r in records or ())

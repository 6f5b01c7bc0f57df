"""The one memory budget every size taken from a case, a dump, a trace or an argument is checked
against before anything is allocated from it.

A request of `need` bytes must fit every limit that applies: the knob that bounds that kind of
memory (passed in by the caller, with its name), this machine's physical memory, the headroom
left under this process's address-space limit (`RLIMIT_AS` minus what the process has mapped
already) and, for memory on the GPU, the device's free memory. A request past one of them raises
the caller's error type with one sentence naming what was asked for, how many bytes, and the
limit it passed. Nothing here allocates.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Limit:
    """A ceiling in bytes and the words that name it in a refusal ("the 32768 MiB limit of ...")."""

    bytes: int
    name: str

    def __post_init__(self) -> None:
        if isinstance(self.bytes, bool) or not isinstance(self.bytes, int) or self.bytes < 0:
            raise ValueError(f"Limit.bytes={self.bytes!r} must be a non-negative int")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def physical_memory() -> Optional[Limit]:
    """This machine's physical memory (None where the system does not say)."""
    try:
        n = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return Limit(n, f"this machine's {_gib(n)} of memory") if n > 0 else None


def _mapped_bytes() -> int:
    """The process's virtual size now (0 where /proc does not say)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read(64).split()[0])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def address_space() -> Optional[Limit]:
    """The headroom under this process's address-space limit (None: no limit is set)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = _mapped_bytes()
    left = max(0, soft - used)
    return Limit(left, f"the {_gib(left)} left under this process's address-space limit (RLIMIT_AS "
                       f"{_gib(soft)}, {_gib(used)} mapped)")


def device_free() -> Optional[Limit]:
    """Free memory on the current CUDA device (None without a visible GPU)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info()
        name = torch.cuda.get_device_name()
    except Exception:  # a driver that cannot answer: the allocation itself will say
        return None
    return Limit(int(free), f"the {_gib(int(free))} free on the {name}")


def host_limits() -> tuple[Limit, ...]:
    """What bounds memory on the host: physical memory and the address-space headroom."""
    return tuple(x for x in (physical_memory(), address_space()) if x is not None)


def device_limits() -> tuple[Limit, ...]:
    return tuple(x for x in (device_free(),) if x is not None)


def require(need: int, what: str, error: type, *, knob: Optional[Limit] = None, host: bool = True,
            device: bool = False, host_need: Optional[int] = None, advice: str = "choose a smaller problem",
            limits: Sequence[Limit] = (), verb: str = "takes") -> None:
    """Refuse `need` bytes of `what` past any limit: the knob, the host's (with `host_need`, the
    host holds that many bytes instead: a staging copy, say), the device's, and any `limits`
    given. Raises `error(message)`; the message reads "WHAT takes N MiB, more than LIMIT: ADVICE"
    (`verb` replaces "takes" for a plural WHAT)."""
    if isinstance(need, bool) or not isinstance(need, int) or need < 0:
        raise error(f"{what}: {need!r} is not a size in bytes")
    checks: list[tuple[int, Limit]] = []
    if knob is not None:
        checks.append((need, knob))
    checks.extend((need, x) for x in limits)
    if host:
        checks.extend((need if host_need is None else host_need, x) for x in host_limits())
    if device:
        checks.extend((need, x) for x in device_limits())
    for n, lim in checks:
        if n > lim.bytes:
            raise error(f"{what} {verb} {n / 2**20:.1f} MiB, more than {lim.name}: {advice}")

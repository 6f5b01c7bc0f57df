"""Checks of values read from untrusted documents (a dump's JSON metadata, a tensor file's header).

Each check is a predicate on one JSON value; `require` raises the caller's error type with the
field, a bounded rendering of the value and what is allowed, so a malformed file gives one short
message, never a traceback. Integers never include bools (JSON `true` is not a count).
"""

from __future__ import annotations

import reprlib
from typing import Any, Optional

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
_SHOWN = reprlib.Repr()  # how much of a value an error message repeats: a few levels, a few dozen characters
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 3, 60, 60, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 8


def shown(value: Any) -> str:
    """repr(value), cut to a readable length and depth (safe for values nested past repr's recursion)."""
    return _SHOWN.repr(value)


def require(ok: bool, error: type, where: str, field: str, value: Any, allowed: str) -> None:
    """Raise `error` naming `where`, the field, the value and what is allowed, unless `ok`."""
    if not ok:
        raise error(f"{where}: {field}={shown(value)} is not allowed: {allowed}")


def is_int(v: Any, lo: int = 0, hi: int = INT64_MAX) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def is_opt_int(v: Any, lo: int = 0, hi: int = INT64_MAX) -> bool:
    return v is None or is_int(v, lo, hi)


def is_int_list(v: Any, n: Optional[int] = None, lo: int = 0, hi: int = INT64_MAX) -> bool:
    return isinstance(v, list) and (n is None or len(v) == n) and all(is_int(x, lo, hi) for x in v)


def is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def is_opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)

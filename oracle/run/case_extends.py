"""`unset` in a case that extends a base: the base's keys it drops before its own tables are laid over.

    extends = "base.toml"
    unset = ["kernel.defines.FOO", "launch.next", "kernel.time_entry"]

Each entry is a dotted path into the base as merged so far (its whole extends chain): a section
(`trace`), a key of one (`kernel.time_entry`) or a key of a table inside one (`kernel.defines.FOO`).
A path the base does not hold is a CaseError naming it and what the base holds there; `unset`
without `extends` is one too. The case's own tables are laid over the base after the removal, so a
case may drop a base key and set it anew in the same file.
"""

from __future__ import annotations

from typing import Any

from harness.fields import shown

MAX_UNSET = 256


def apply_unset(base: dict, unset: Any, case_file: str, error: type) -> dict:
    """`base` without the keys `unset` names (a new dict; `base` is left as it was)."""
    if not isinstance(unset, list) or len(unset) > MAX_UNSET or not all(isinstance(p, str) for p in unset):
        raise error(f"{case_file}: unset = {shown(unset)} must be a list of at most {MAX_UNSET} dotted paths "
                    f"such as \"kernel.defines.FOO\"")
    out = _copy(base)
    for i, path in enumerate(unset):
        parts = path.split(".")
        if not all(parts):
            raise error(f"{case_file}: unset[{i}] = {shown(path)} is not a dotted path such as \"kernel.defines.FOO\"")
        table = out
        for depth, key in enumerate(parts):
            where = ".".join(parts[:depth]) or "the base"
            if not isinstance(table, dict) or key not in table:
                held = ", ".join(sorted(table)) if isinstance(table, dict) and table else "nothing"
                raise error(f"{case_file}: unset[{i}] = {shown(path)}: {where} has no {key!r} to remove "
                            f"(it holds {held[:400]})")
            if depth == len(parts) - 1:
                del table[key]
            else:
                table = table[key]
    return out


def _copy(d: Any) -> Any:
    """Tables copied all the way down (lists and values shared: unset never changes them)."""
    return {k: _copy(v) for k, v in d.items()} if isinstance(d, dict) else d

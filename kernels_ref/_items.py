"""Lists read from a user's document (a problem's epilogue steps, a case's nvcc flags), item by item:
each item is a string, named in an error by its list and index."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence


def named_strings(items: Sequence[Any], field: str, error: type, what: str, shown: Callable[[Any], str] = repr,
                  sep: str = "=") -> Iterator[tuple[str, str]]:
    """Each item with the words that name it, `field[i]` `sep` its shown value; an item that is not a
    string raises `error` saying it must be `what`."""
    for i, item in enumerate(items):
        where = f"{field}[{i}]{sep}{shown(item)}"
        if not isinstance(item, str):
            raise error(f"{where} is not allowed: {what} (a string)")
        yield where, item

"""Who asked, and advice spelt for them: the command line writes `--trace-tiles 0,1`, Python
`trace_tiles=[(0, 1)]` (the keywords of oracle.run_live and RunRequest).

Judging says what a finding needs as `Advice`: words and `Option`s named by their Python keyword,
with a value in each spelling. A renderer (oracle.report) spells it for the caller it is given
(`Advice.say`); the command line passes Caller.COMMAND_LINE, every other entry point is Python's.
The same `Caller.option` names an option in a refusal of a request (oracle.run.request.resolve_case's
`*_where`), so a message never names a flag to a Python caller or a keyword to a shell.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Optional, Union

_KEYWORD = re.compile(r"[a-z][a-z0-9_]*")


class Caller(enum.Enum):
    COMMAND_LINE = "command line"
    PYTHON = "Python"

    def option(self, name: str, value: Optional[str] = None) -> str:
        """Option `name` (a Python keyword) as this caller writes it, with `value` already in its spelling."""
        if self is Caller.COMMAND_LINE:
            flag = "--" + name.replace("_", "-")
            return flag if value is None else f"{flag} {value}"
        return f"{name}=" if value is None else f"{name}={value}"


@dataclass(frozen=True)
class Option:
    """An option of a live compare: its Python keyword, and its value as each caller writes it
    (None: the option alone). `command`: a whole command line that sets it, which the command line
    caller is shown instead (the recorded command with the option replaced)."""

    name: str
    cli: Optional[str] = None
    python: Optional[str] = None
    command: Optional[str] = None

    def __post_init__(self) -> None:
        if not _KEYWORD.fullmatch(self.name):
            raise ValueError(f"option name {self.name!r} must be a Python keyword (lower case, digits, _)")

    def say(self, caller: Caller) -> str:
        if caller is Caller.COMMAND_LINE:
            return self.command or caller.option(self.name, self.cli)
        return caller.option(self.name, self.python)

    @classmethod
    def tiles(cls, tiles, command: Optional[str] = None) -> "Option":
        tiles = [tuple(int(x) for x in t) for t in tiles]
        return cls("trace_tiles", " ".join(f"{tm},{tn}" for tm, tn in tiles), repr(tiles), command)

    @classmethod
    def k_blocks(cls, kbs) -> "Option":
        kbs = [int(k) for k in kbs]
        return cls("trace_k_blocks", ",".join(map(str, kbs)), repr(kbs))

    @classmethod
    def stages(cls, stages) -> "Option":
        text = ",".join(stages)
        return cls("trace_stages", text, repr(text))

    @classmethod
    def choices(cls, name: str, *choices: str) -> "Option":
        """One of `choices` (their command-line words; Python quotes each)."""
        return cls(name, "|".join(choices), " | ".join(f'"{c}"' for c in choices))


@dataclass(frozen=True)
class Advice:
    """Words and options, told as one phrase for a caller (`say`)."""

    parts: tuple[Union[str, Option], ...]

    def __post_init__(self) -> None:
        for p in self.parts:
            if not isinstance(p, (str, Option)):
                raise TypeError(f"an Advice part must be a str or an Option, got {type(p).__name__}")

    @classmethod
    def of(cls, *parts: Union[str, Option]) -> "Advice":
        return cls(tuple(parts))

    def say(self, caller: Caller) -> str:
        return "".join(p if isinstance(p, str) else p.say(caller) for p in self.parts)

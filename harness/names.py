"""The grammar of every name and value that a case passes on to nvcc, make or a generated file.

A value from a case file, `--set` or the command line that reaches an nvcc argument, a Makefile,
launch.txt or any other file the reproducer writes must match one of these, or it is refused
before anything is built or written:

  macro name     a C identifier                 [A-Za-z_][A-Za-z0-9_]*
  macro value    a word of safe characters      [A-Za-z0-9_.+-]*   (no whitespace, quotes, $, ;, #, \\)
  entry point    a C identifier (mangled C++ names are identifiers too)
  file name      a relative path of components [A-Za-z0-9_][A-Za-z0-9_.+-]*, joined by '/'
                 (no leading dot or dash, so no '..', no hidden files and nothing nvcc reads as a flag)

None of these characters means anything to a shell, to make (no `$`, no `#`, no newline, no
whitespace) or to the line-and-token parser of repro.cu. Every check names the field and the value
(shown with repr, so a newline stays on one line) and raises the caller's error type.
"""

from __future__ import annotations

import re
from typing import Any

from harness.fields import shown

MACRO_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MACRO_VALUE_RE = re.compile(r"[A-Za-z0-9_.+\-]*\Z")
ENTRY_RE = MACRO_NAME_RE
FILE_COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-]*\Z")

MAX_NAME = 1024  # characters of a macro name, macro value or entry point
MAX_COMPONENT = 255  # characters of one file-name component (a Linux NAME_MAX)
MAX_DEPTH = 32  # components of a relative file name

MACRO_VALUE_TEXT = "letters, digits and _ . + - only (no whitespace, quotes, $, ;, # or newline)"
FILE_NAME_TEXT = ("a relative file name of letters, digits and _ . + - (each part starting with a letter, digit or "
                  "_), parts joined by '/'")


def _fail(error: type, field: str, value: Any, allowed: str):
    raise error(f"{field} = {shown(value)} is not allowed: {allowed}")


def check_macro_name(name: Any, field: str, error: type) -> str:
    if not (isinstance(name, str) and len(name) <= MAX_NAME and MACRO_NAME_RE.match(name)):
        _fail(error, field, name, "a C macro name, a C identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def check_macro_value(value: Any, field: str, error: type) -> str:
    if not (isinstance(value, str) and len(value) <= MAX_NAME and MACRO_VALUE_RE.match(value)):
        _fail(error, field, value, MACRO_VALUE_TEXT)
    return value


def check_entry(name: Any, field: str, error: type) -> str:
    if not (isinstance(name, str) and len(name) <= MAX_NAME and ENTRY_RE.match(name)):
        _fail(error, field, name, "a kernel's entry point name, a C identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def is_file_name(name: Any) -> bool:
    """A relative file name in the grammar above (one component or several)."""
    if not isinstance(name, str) or not name:
        return False
    parts = name.split("/")
    return len(parts) <= MAX_DEPTH and all(len(p) <= MAX_COMPONENT and FILE_COMPONENT_RE.match(p) for p in parts)


def check_file_name(name: Any, field: str, error: type) -> str:
    if not is_file_name(name):
        _fail(error, field, name, FILE_NAME_TEXT)
    return name


def check_path_text(path: Any, field: str, error: type) -> str:
    """A path given by the user (any folder, any printable characters): no control characters,
    so it prints on one line; its last component must be a file name of the grammar."""
    if not isinstance(path, str) or not path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        _fail(error, field, path, "a path without control characters (newline, tab, ...)")
    base = path.rstrip("/").rsplit("/", 1)[-1]
    if not is_file_name(base):
        _fail(error, field, path, f"a path whose file name is {FILE_NAME_TEXT}")
    return path

"""The case's kernel names held to harness.names' grammar: the source, cubin and library paths, the entry
points and the defines, everything of [kernel] and [[launch.next]] that reaches nvcc, a Makefile
or a reproducer's files. Called when a case is read (oracle.run.case) and again by
oracle.run.sink.check_case, before anything is built or written."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from harness import names


def check_kernel_names(source: Optional[str], cubin: Optional[str], entry: str, time_entry: Optional[str],
                       defines: Mapping[str, str], error: type, later_entries: Sequence[Optional[str]] = (),
                       library: Optional[str] = None) -> None:
    """Raise `error` naming the first field outside the grammar."""
    for key, path in (("source", source), ("cubin", cubin), ("library", library)):
        if path is not None:
            names.check_path_text(str(path), f"[kernel] {key}", error)
    names.check_entry(entry, "[kernel] entry", error)
    if time_entry is not None:
        names.check_entry(time_entry, "[kernel] time_entry", error)
    for i, e in enumerate(later_entries):
        if e is not None:
            names.check_entry(e, f"[[launch.next]] #{i} entry", error)
    for name, value in defines.items():
        names.check_macro_name(name, "[kernel] defines: name", error)
        names.check_macro_value(value, f"[kernel] defines.{name}", error)


def check_case_names(case, error: type) -> None:
    """check_kernel_names over a whole case (its kernel and every later launch's entry)."""
    k = case.kernel
    if k is None:
        return
    check_kernel_names(k.source, k.cubin, k.entry, k.time_entry, dict(k.defines), error,
                       [plan.entry for plan in case.launch.next] if case.launch is not None else (),
                       library=getattr(k, "library", None))
    for w in getattr(case, "workspaces", ()):  # ws_NAME.bin and inputs.txt's name=ws_NAME
        names.check_macro_name(w.name, f"[workspace.{w.name}] name", error)

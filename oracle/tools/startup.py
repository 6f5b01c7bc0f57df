"""Start-up work, in one place: what a command does ahead of time so that its first judgement is
not slowed by costs that do not depend on the case.

- `prestart_for(argv)`: a live compare starts its kernel's child process before this process
  imports torch (harness.child_process), so the child's interpreter, imports and CUDA context come
  up meanwhile. A process that runs on after its live runs (the server, a script) also keeps the
  next run's child started ahead (oracle.run.execute); the plain command says it runs one only.
  Standard library only: `python -m oracle` calls it before anything heavy loads, and
  `oracle.tools.cli.main` for a command run in a process already up (a script, the server), where
  the child comes up while the command builds its inputs and looks up its build.
- `import_judgement()`: the judgement's modules (the differential, whose Triton kernels are parsed
  as they load, and the report), imported on the thread that waits for the kernel's child
  (kernels_ref.first_call, through oracle.run.execute.run's `while_running`).
- A warm server compiles the references of the cases it will judge before its first command
  (oracle.tools.warmup, `python -m oracle serve --warm CASE`).
"""

from __future__ import annotations

from typing import Sequence


def runs_a_kernel(argv: Sequence[str]) -> bool:
    """A live compare: the command line names a case or a kernel source."""
    if not argv or argv[0] != "compare":
        return False
    words = argv[1:]
    return any(a in ("--problem", "--kernel") or a.startswith(("--problem=", "--kernel=")) for a in words) or \
        any(a.endswith(".toml") and not a.startswith("-") for a in words)


def prestart_for(argv: Sequence[str], *, last: bool = False) -> bool:
    """Start the kernel's child ahead when `argv` runs a kernel; whether this call started one
    (False: none needed, one already waits, or it could not start). `last`: the process exits
    after this command (the plain command), so it keeps no child ahead for a next run."""
    if runs_a_kernel(argv):
        from harness.child_process import one_run_only, prestart

        if last:
            one_run_only()
        return prestart()
    return False


def import_judgement() -> None:
    """Import what judging a recording loads (run while a live kernel runs)."""
    import oracle.judging.differential  # noqa: F401
    import oracle.report.table  # noqa: F401

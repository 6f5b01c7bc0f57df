"""The error types the oracle raises for bad usage or bad input, in one place.

Every one of them derives from harness.errors.BadInput, "the input is wrong" (a case file, a flag,
a dump, a trace, a kernel's files, a limit passed), and the CLI turns it into exit code 2 with one
`error:` line; any other exception is the oracle's own bug (exit 4, with its traceback). The
documented types are importable from here by name (`from oracle.errors import CaseError`), each
loaded on first use (they pull in torch).
"""

from __future__ import annotations

from harness.errors import BadInput


def input_errors() -> tuple[type, ...]:
    """What a command catches as bad input: BadInput (every documented type derives from it)."""
    return (BadInput,)


def documented_errors() -> tuple[type, ...]:
    """The documented error types."""
    from harness.build import BuildError
    from harness.dump import DumpError
    from harness.knobs import KnobError
    from harness.launch import LaunchError
    from harness.output_files import OutputFileError
    from harness.runner import RunnerError
    from harness.taps import TapError
    from harness.tensormap import TensorMapError
    from harness.trace_format import TraceFormatError
    from oracle.run.case_types import CaseError
    from oracle.run.inputs import InputError
    from oracle.problem.spec import SpecError
    from oracle.run.recording import RecordingError
    from oracle.repro.generate import ReproError

    return (DumpError, SpecError, RecordingError, InputError, KnobError, CaseError, BuildError, LaunchError,
            RunnerError, TraceFormatError, TensorMapError, ReproError, TapError, OutputFileError)


def __getattr__(name: str) -> type:
    """`from oracle.errors import CaseError` and the like, imported on first use."""
    for t in documented_errors():
        if t.__name__ == name:
            return t
    raise AttributeError(f"module 'oracle.errors' has no attribute {name!r}")

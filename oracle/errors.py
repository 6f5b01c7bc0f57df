"""Every error type the oracle raises for bad input, in one place (the README's Errors table).

Each is a ValueError (or RuntimeError for a build) with a message naming the field, the value and
what is allowed; the command line turns them into one `error:` line and exit code 2.
"""

from harness.build import BuildError
from harness.dump import DumpError
from harness.knobs import KnobError
from harness.launch import LaunchError
from harness.runner import RunnerError
from harness.tensormap import TensorMapError
from harness.taps import TapError
from harness.trace_format import TraceFormatError
from oracle.case import CaseError
from oracle.inputs import InputError
from oracle.problem import SpecError
from oracle.recording import RecordingError

INPUT_ERRORS = (BuildError, DumpError, KnobError, LaunchError, RunnerError, TensorMapError, TapError,
                TraceFormatError, CaseError, InputError, SpecError, RecordingError)

__all__ = [e.__name__ for e in INPUT_ERRORS] + ["INPUT_ERRORS"]

"""The one base of every error that means "the input is wrong": a case file, a flag, a dump, a
trace, a kernel's files, a limit passed. The command line turns any of them into exit code 2 with
one `error:` line; any other exception is the oracle's own bug. A leaf module: it imports nothing,
so every layer (harness, and each of oracle's) derives its own error types from it. NoGpuError,
the one error that is no one's fault (this machine has no GPU), lives here beside it."""


class BadInput(Exception):
    """Bad usage or bad input, named in the message (the field, the value, what is allowed)."""


class NoGpuError(Exception):
    """A live run needs a CUDA GPU and none is visible: not bad input, so a command of its own exit
    code (oracle.judging.diagnose.EXIT_NO_GPU), raised before anything is built."""

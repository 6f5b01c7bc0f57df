"""Running a kernel and recording what it did: case files (case), controlled inputs (inputs), the
live run in a child process (live), the recording a run or a dump makes (recording), and Python
models of kernels that make recordings without a GPU (simulate). May import `oracle.problem`
and `harness`; never `oracle.judging` or anything above it."""

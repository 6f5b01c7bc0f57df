"""The problem: what GEMM a kernel computes (ProblemSpec) and how its tiles' k-blocks and rows split
into partials and groups (partition). Imports nothing else of the oracle but `oracle.knobs`."""

from oracle.problem.spec import *  # noqa: F401,F403  (`oracle.problem.ProblemSpec` and friends)

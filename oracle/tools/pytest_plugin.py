"""The oracle in a project's own test suite (pytest plugin, entry point group `pytest11`).

    def test_my_gemm(gemm_oracle):                 # or: from oracle import assert_gemm_close
        d = my_ext.gemm(a, b)
        gemm_oracle.assert_close(a, b, d)          # AssertionError with the stage table on failure

`pytest --oracle-dump-dir DIR` saves a dump of every failing check in DIR, to replay with
`python -m oracle compare --dump FILE`. The plugin imports torch and the oracle only when a test
uses them; CPU tensors work with no variable set (the references then run under Triton's
interpreter, chosen by kernels_ref itself when no GPU is visible).
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("oracle", "the GEMM differential oracle")
    group.addoption("--oracle-dump-dir", metavar="DIR", default=None,
                    help="save a dump of every failing oracle check in DIR (replay: python -m oracle compare --dump)")


def pytest_configure(config):
    directory = config.getoption("oracle_dump_dir", None)
    if directory:
        from oracle.tools.api import DUMP_DIR_ENV

        os.environ[DUMP_DIR_ENV] = os.path.abspath(directory)


class GemmOracle:
    """What the `gemm_oracle` fixture hands a test: the oracle's checks."""

    def check(self, a, b, d, **kwargs):
        from oracle.tools.api import check

        return check(a, b, d, **kwargs)

    def assert_close(self, a, b, d, **kwargs):
        from oracle.tools.api import assert_gemm_close

        return assert_gemm_close(a, b, d, **kwargs)


@pytest.fixture
def gemm_oracle() -> GemmOracle:
    return GemmOracle()

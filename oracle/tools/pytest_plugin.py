"""The oracle in a project's own test suite (pytest plugin, entry point group `pytest11`).

    def test_my_gemm(gemm_oracle):                 # or: from oracle import assert_gemm_close
        d = my_ext.gemm(a, b)
        gemm_oracle.assert_close(a, b, d)          # AssertionError with the stage table on failure

`pytest --oracle-dump-dir DIR` saves a dump of every failing check in DIR, to replay with
`python -m oracle compare --dump FILE`. Every failing check writes its HTML page (oracle.report.html)
to `--oracle-html DIR`, else under pytest's base temporary folder (oracle-html/), and the failure's
message names it (so does the test's `user_properties`, as `oracle_html`, for JUnit XML). The plugin imports torch and the oracle only when a test
uses them; CPU tensors work with no variable set (the references then run under Triton's
interpreter, chosen by kernels_ref itself when no GPU is visible).
"""

from __future__ import annotations

import os
import re
from typing import Optional

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("oracle", "the GEMM differential oracle")
    group.addoption("--oracle-dump-dir", metavar="DIR", default=None,
                    help="save a dump of every failing oracle check in DIR (replay: python -m oracle compare --dump)")
    group.addoption("--oracle-html", metavar="DIR", default=None,
                    help="write the HTML page of every failing oracle check to DIR (default: under pytest's "
                         "base temporary folder, oracle-html/)")


def pytest_configure(config):
    directory = config.getoption("oracle_dump_dir", None)
    if directory:
        from oracle.tools.api import DUMP_DIR_ENV

        os.environ[DUMP_DIR_ENV] = os.path.abspath(directory)


class GemmOracle:
    """What the `gemm_oracle` fixture hands a test: the oracle's checks. A failing assert_close
    writes its HTML page in `html_dir` (one page per failing check of the test, named after it)."""

    def __init__(self, html_dir: Optional[str] = None, test_name: str = "test", node=None):
        self.html_dir = html_dir
        self.test_name = test_name
        self.node = node
        self.pages: list[str] = []

    def check(self, a, b, d, **kwargs):
        from oracle.tools.api import check

        return check(a, b, d, **kwargs)

    def assert_close(self, a, b, d, **kwargs):
        from oracle.tools.api import check, failure_message

        rep = check(a, b, d, **kwargs)
        if not rep.ok:
            page = self._next_page()
            message = failure_message(rep, page)
            if page is not None and self.node is not None:
                self.node.user_properties.append(("oracle_html", page))
            raise AssertionError(message)
        return rep

    def _next_page(self) -> Optional[str]:
        if self.html_dir is None:
            return None
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.test_name).strip("._")[:100] or "test"
        page = os.path.join(self.html_dir, f"{slug}-{len(self.pages) + 1}.html")
        self.pages.append(page)
        return page


@pytest.fixture
def gemm_oracle(request, tmp_path_factory) -> GemmOracle:
    directory = request.config.getoption("oracle_html", None)
    directory = os.path.abspath(directory) if directory else str(tmp_path_factory.getbasetemp() / "oracle-html")
    return GemmOracle(directory, request.node.nodeid, request.node)

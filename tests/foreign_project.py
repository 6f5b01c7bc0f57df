"""A foreign project that uses the pytest plugin's `gemm_oracle` fixture, run by pytester in a
subprocess: one check of a correct GEMM and one whose expected result is doubled (it diverges at
epilogue_store)."""

from __future__ import annotations

GOOD = '''
def test_good(gemm_oracle):
    a = torch.randn(40, 64).bfloat16(); b = torch.randn(64, 24).bfloat16()
    gemm_oracle.assert_close(a, b, (a.float() @ b.float()).bfloat16())
'''

BAD = '''
def test_bad(gemm_oracle):
    a = torch.randn(40, 64).bfloat16(); b = torch.randn(64, 24).bfloat16()
    gemm_oracle.assert_close(a, b, (2 * a.float() @ b.float()).bfloat16())
'''


def run_foreign_tests(pytester, *options: str, tests: tuple[str, ...] = (GOOD, BAD)):
    """`tests` written as the project's test_foreign.py and run with the plugin's `options`; pytester's result."""
    pytester.makepyfile(test_foreign="import torch\n" + "".join(tests))
    return pytester.runpytest_subprocess("-q", *options, "-p", "no:cacheprovider")

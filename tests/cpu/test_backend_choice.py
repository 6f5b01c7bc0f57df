"""The Triton backend chooses itself: with TRITON_INTERPRET unset, a process without a visible GPU
runs the references under the interpreter, so `oracle.check`, `assert_gemm_close`, the pytest
fixture and `kernels_ref` work on CPU tensors with no variable set (the README's promise); a
TRITON_INTERPRET that is set is kept. Each case runs in a child process whose environment has no
TRITON_INTERPRET (this test process has it: the conftest sets it)."""

import os
import subprocess
import sys
import textwrap

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU = torch.cuda.is_available()


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def _python(code, tmp_path, **extra):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=_env(**extra),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# Prints "refused True" when a CPU tensor's cast is refused for {reason} (only without a GPU).
_CAST_REFUSED = """
        if not torch.cuda.is_available():
            try:
                E.apply_cast(torch.ones(1, 4), "bf16")
            except ValueError as e:
                print("refused", {reason!r} in str(e))
"""

CHECK = """
    import torch, oracle
    from kernels_ref._common import interpreting
    g = torch.Generator().manual_seed(0)
    a = torch.randn(40, 48, generator=g).bfloat16()
    b = torch.randn(48, 24, generator=g).bfloat16()
    d = (a.float() @ b.float()).bfloat16()
    rep = oracle.check(a, b, d)
    print("verdict", rep.verdict, "interpreting", interpreting(), "env", __import__("os").environ.get("TRITON_INTERPRET"))
    oracle.assert_gemm_close(a, b, d)
    try:
        oracle.assert_gemm_close(a, b, (d.float() * 2).bfloat16())
    except AssertionError as e:
        print("caught", "epilogue_store" in str(e))
"""


def test_check_and_assert_on_cpu_tensors_without_any_variable(tmp_path):
    out = _python(CHECK, tmp_path)
    assert f"verdict MATCH interpreting {not GPU} env {None if GPU else '1'}" in out, out
    assert "caught True" in out, out


def test_the_pytest_fixture_without_any_variable(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import torch

        def test_mine(gemm_oracle):
            a = torch.ones(16, 32, dtype=torch.bfloat16)
            b = torch.ones(32, 8, dtype=torch.bfloat16)
            gemm_oracle.assert_close(a, b, torch.full((16, 8), 32.0, dtype=torch.bfloat16))

        def test_mine_wrong(gemm_oracle):
            a = torch.ones(16, 32, dtype=torch.bfloat16)
            b = torch.ones(32, 8, dtype=torch.bfloat16)
            assert not gemm_oracle.check(a, b, torch.full((16, 8), 33.0, dtype=torch.bfloat16)).ok
    """))
    from importlib.metadata import entry_points

    registered = any(e.value == "oracle.tools.pytest_plugin" for e in entry_points(group="pytest11"))
    args = [] if registered else ["-p", "oracle.tools.pytest_plugin"]  # a checkout that is not pip-installed
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_user.py"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout and "error" not in proc.stdout.lower(), proc.stdout[-2000:]


def test_kernels_ref_alone_on_cpu_tensors(tmp_path):
    out = _python("""
        import torch
        from kernels_ref import epilogue as E
        x = torch.tensor([[1.5, 2.5, float("nan"), 3e9]])
        print(E.apply_cast(x, "int32").tolist())
    """, tmp_path)
    assert "[[2, 2, 0, 2147483647]]" in out, out


def test_a_set_variable_is_kept(tmp_path):
    out = _python("""
        import torch
        from kernels_ref import epilogue as E
        from kernels_ref._common import interpreting
        print("interpreting", interpreting())
    """ + _CAST_REFUSED.format(reason="TRITON_INTERPRET=0"), tmp_path, TRITON_INTERPRET="0")
    assert "interpreting False" in out, out
    if not GPU:
        assert "refused True" in out, out


def test_too_late_to_choose_is_said_not_half_done(tmp_path):
    """triton imported first, no variable: the choice cannot be made any more (a triton whose own
    library is compiled cannot run interpreted kernels), so nothing is set and CPU tensors are
    refused with the reason."""
    out = _python("""
        import os, triton, torch
        from kernels_ref import epilogue as E
        print("env", os.environ.get("TRITON_INTERPRET"))
    """ + _CAST_REFUSED.format(reason="triton was imported before"), tmp_path)
    assert "env None" in out, out
    if not GPU:
        assert "refused True" in out, out

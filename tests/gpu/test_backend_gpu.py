"""A CUDA build of torch on a machine with a GPU, given CPU tensors and no TRITON_INTERPRET: the
kernels are compiled (no interpreter), and `oracle.check` judges the CPU tensors with the
references on the GPU. Run in a child process with TRITON_INTERPRET removed from its environment."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cpu_tensors_on_a_gpu_machine_without_any_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    code = textwrap.dedent("""
        import os, torch, oracle
        from kernels_ref._common import interpreting
        g = torch.Generator().manual_seed(0)
        a = torch.randn(300, 256, generator=g).bfloat16()
        b = torch.randn(256, 200, generator=g).bfloat16()
        d = (a.float() @ b.float()).bfloat16()
        rep = oracle.check(a, b, d)
        print("verdict", rep.verdict, "interpreting", interpreting(), "env", os.environ.get("TRITON_INTERPRET"),
              "device", rep.analysis.device)
        oracle.assert_gemm_close(a, b, d)
        bad = d.clone()
        bad[128:256, 128:200] = 0
        print("bad", oracle.check(a, b, bad).verdict)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verdict MATCH interpreting False env None device cuda" in proc.stdout, proc.stdout
    assert "bad DIVERGED" in proc.stdout, proc.stdout

"""Without a GPU a live compare says so before anything is built, with its own exit code
(EXIT_NO_GPU), and does not send the user to install cuda-bindings."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from harness.errors import NoGpuError
from oracle.judging.diagnose import EXIT_CODES, EXIT_NO_GPU, EXIT_USAGE
from oracle.run import live, races
from oracle.tools import cli

ROOT = Path(__file__).resolve().parents[2]
SIMPLE = ROOT / "harness" / "examples" / "simple_gemm.toml"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for module in (live, races):
        for name in ("build_cubin", "build_library"):
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a kernel was built without a GPU"))


def test_the_no_gpu_exit_code_is_its_own():
    assert EXIT_NO_GPU not in set(EXIT_CODES.values()) | {EXIT_USAGE}


@pytest.mark.parametrize("extra", [[], ["--repeat", "2"]])
def test_a_live_compare_without_a_gpu_says_so_before_building(no_gpu, capsys, extra):
    t0 = time.perf_counter()
    code = cli.main(["compare", str(SIMPLE), "--inputs", "ones", *extra])
    err = capsys.readouterr().err
    assert code == EXIT_NO_GPU, err
    assert time.perf_counter() - t0 < 30
    assert err.startswith("error: no CUDA GPU is visible") and err.count("\n") == 1, err
    assert "cuda-bindings" not in err and "Traceback" not in err


def test_run_live_from_python_raises_no_gpu_error(no_gpu):
    import oracle

    with pytest.raises(NoGpuError, match="no CUDA GPU is visible"):
        oracle.run_live(str(SIMPLE), inputs="ones")

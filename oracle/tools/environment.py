"""What a bug report needs, in one place: the machine, the GPU and its driver, CUDA, nvcc, torch,
triton, cuda-python, the CUTLASS wheel, the oracle's version and every ORACLE_* knob."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess


def _version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvcc() -> dict:
    from harness.knobs import get

    exe = shutil.which(get("ORACLE_NVCC"))
    if exe is None:
        return {"path": None, "version": None}
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
        line = next((ln for ln in out.splitlines() if "release" in ln), out.strip().splitlines()[-1] if out else "")
    except (OSError, subprocess.TimeoutExpired) as e:
        line = f"could not run: {e}"
    return {"path": exe, "version": line.strip()}


def report_environment() -> dict:
    import torch

    from oracle import __version__, knobs

    env = {"oracle": __version__, "python": platform.python_version(), "platform": platform.platform(),
           "torch": torch.__version__, "torch_cuda": torch.version.cuda, "triton": _version("triton"),
           "cuda_bindings": _version("cuda-bindings"), "nvidia_cutlass": _version("nvidia-cutlass"),
           "numpy": _version("numpy"), "safetensors": _version("safetensors"), "nvcc": _nvcc(),
           "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1", "gpus": []}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            env["gpus"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1)})
        try:
            from harness import cuda_driver

            cuda_driver.init()
            env["driver"] = int(cuda_driver.call("cuDriverGetVersion"))
        except Exception as e:  # no cuda-python, or a driver that will not answer: say so
            env["driver"] = f"unknown ({type(e).__name__})"
    env["knobs"] = {k.name: {"value": os.environ.get(k.name), "default": str(k.default())} for k in knobs.ALL}
    return env


def describe(env: dict) -> str:
    lines = [f"oracle {env['oracle']} on Python {env['python']} ({env['platform']})",
             f"torch {env['torch']} (CUDA {env['torch_cuda']}), triton {env['triton']}"
             f"{' (interpreter)' if env['triton_interpret'] else ''}, cuda-bindings {env['cuda_bindings']}, "
             f"nvidia-cutlass {env['nvidia_cutlass']}, numpy {env['numpy']}, safetensors {env['safetensors']}",
             f"nvcc: {env['nvcc']['version'] or 'not found'}" + (f" ({env['nvcc']['path']})" if env['nvcc']['path'] else "")]
    if env["gpus"]:
        lines.append(f"driver: {env.get('driver')}")
        lines += [f"GPU {g['index']}: {g['name']}, sm_{g['capability'].replace('.', '')}, {g['sms']} SMs, "
                  f"{g['memory_gib']} GiB" for g in env["gpus"]]
    else:
        lines.append("GPU: none visible")
    set_knobs = {k: v["value"] for k, v in env["knobs"].items() if v["value"] is not None}
    lines.append("knobs set: " + (", ".join(f"{k}={v}" for k, v in set_knobs.items()) or "none (all defaults)"))
    return "\n".join(lines)

"""benchmarks/measure_numerics.py is the driver over benchmarks/numerics/: the parts import one way and
never the driver, and the driver still offers every name its tests and benchmarks/false_alarms.py
reach through it."""

import ast
import pathlib

import bench_scripts  # tests/ is on sys.path

ROOT = pathlib.Path(__file__).resolve().parents[2]
PARTS = ("probes", "engines", "fits", "families", "summary")
# the parts each part may import (the package docstring's order)
MAY_IMPORT = {"probes": set(), "engines": {"probes"}, "fits": {"probes", "engines"},
              "families": {"probes", "engines"}, "summary": {"fits"}}
# what tests/cpu/test_measure_numerics.py, test_measured_numerics.py, tests/gpu/test_numerics_gpu.py and
# benchmarks/false_alarms.py use from the driver
DRIVER_NAMES = ("measure", "measure_engine", "measure_splitk", "emulated_adapters", "failures", "resummarise",
                "KNOWN", "OPTYPES", "step_probes", "ladder_probes", "_engine_of", "_inputs", "DEV", "_mm", "main",
                "summary", "constants_snippet", "environment")


def _imported(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_parts_import_one_way_and_never_the_driver():
    for part in PARTS:
        got = _imported(ROOT / "benchmarks" / "numerics" / f"{part}.py")
        assert not {m for m in got if "measure_numerics" in m}, f"{part} imports the driver"
        parts = {m.split(".")[2] for m in got if m.startswith("benchmarks.numerics.") and m.split(".")[2] in PARTS}
        assert parts <= MAY_IMPORT[part], f"{part} imports {sorted(parts - MAY_IMPORT[part])}"


def test_the_driver_offers_the_names_it_always_had():
    m = bench_scripts.load("measure_numerics")
    assert [n for n in DRIVER_NAMES if not hasattr(m, n)] == []
    assert m.DEV == "cuda" and m._mm is m.cublas_mm  # what the split-K probes run unless a test points them elsewhere


def test_the_split_k_probes_run_on_what_the_driver_holds(monkeypatch):
    """measure_splitk reads DEV and _mm from the driver at call time (the CPU test patches them there)."""
    m = bench_scripts.load("measure_numerics")
    seen = []

    def mm(a, b, reduced):
        seen.append((a.device.type, reduced))
        return (a.double() @ b.double()).to(a.dtype)

    monkeypatch.setattr(m, "DEV", "cpu")
    monkeypatch.setattr(m, "_mm", mm)
    res = m.measure_splitk("bf16", [(8, 16, 256)])
    assert res["shapes"][0]["boundaries"] == [] and res["ok"]
    assert seen and {d for d, _ in seen} == {"cpu"} and {r for _, r in seen} == {True, False}

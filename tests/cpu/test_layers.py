"""The imports run one way: kernels_ref <- oracle -> harness, and inside oracle/ by job
(problem < run < judging < report < repro < tools); no two modules import each other.

Every import counts, at module level or inside a function: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kernels_ref", "harness", "oracle")
# oracle's sub-packages from the bottom up; a module may import its own layer and those below
ORACLE_LAYERS = ("problem", "run", "judging", "report", "repro", "tools")
# modules every layer may use: the knobs, and the package itself only for them
ORACLE_BASE = {"oracle.knobs"}
# the public faces (the package, the error catalogue, old import paths kept for other projects):
# they may import anything, and only the tools (and other projects) import them
HARNESS_MAY = {"kernels_ref", "kernels_ref.dtypes"}  # the dtype table (and its package, whose names load lazily)
ORACLE_FACES = {"oracle", "oracle.__main__", "oracle.errors"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The project module an imported name lands in (a package's __init__ for a package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(mod: str) -> set[str]:
    tree = ast.parse(MODULES[mod].read_text(), str(MODULES[mod]))
    pkg = mod if MODULES[mod].name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for n in names:
            if n.split(".")[0] in PACKAGES:
                target = _resolve(n)
                if target and target != mod:
                    found.add(target)
    return found


IMPORTS = {m: _imports(m) for m in MODULES}


def _layer(mod: str):
    parts = mod.split(".")
    if parts[0] != "oracle" or mod in ORACLE_BASE or mod in ORACLE_FACES:
        return None
    assert len(parts) > 1 and parts[1] in ORACLE_LAYERS, (
        f"{mod}: every oracle module belongs to a sub-package by job ({', '.join(ORACLE_LAYERS)}), "
        f"or is a base module ({', '.join(sorted(ORACLE_BASE))}) or a public face")
    return ORACLE_LAYERS.index(parts[1])


def test_the_three_layers_point_one_way():
    bad = [f"{m} imports {t}" for m, ts in IMPORTS.items() for t in ts
           if (m.startswith("kernels_ref") and t.split(".")[0] in ("oracle", "harness"))
           or (m.startswith("harness") and (t.startswith("oracle") or t.startswith("kernels_ref") and t not in HARNESS_MAY))]
    assert not bad, ("kernels_ref imports neither oracle nor harness, harness never imports oracle and of kernels_ref "
                     "only the dtype table:\n" + "\n".join(bad))


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m.startswith("oracle.")))
def test_oracle_modules_import_only_their_layer_and_below(mod):
    here = _layer(mod)
    for t in sorted(IMPORTS[mod]):
        if not t.startswith("oracle"):
            continue
        if t in ORACLE_FACES:
            assert here is None or ORACLE_LAYERS[here] == "tools", (
                f"{mod} imports the public face {t}: import the module that defines the name instead")
            continue
        there = _layer(t)
        if here is None or there is None:
            continue
        assert there <= here, (f"{mod} ({ORACLE_LAYERS[here]}) imports {t} ({ORACLE_LAYERS[there]}), a layer above it: "
                               f"what both need belongs in the lower one")


def test_no_two_modules_import_each_other():
    pairs = sorted({tuple(sorted((m, t))) for m, ts in IMPORTS.items() for t in ts
                    if m in IMPORTS.get(t, ()) and not (m in ORACLE_FACES or t in ORACLE_FACES)
                    and not (t.startswith(m + ".") or m.startswith(t + "."))})
    assert not pairs, "modules that import each other (what both need belongs below them): " + ", ".join(
        f"{a} <-> {b}" for a, b in pairs)


def test_the_check_sees_imports():
    # the walk itself: a known lazy import and a known module-level one are found
    assert "oracle.run.recording" in IMPORTS["oracle.judging.differential.analysis"]
    assert "harness.trace_format" in IMPORTS["oracle.run.live"]
    # modules cut by job are modules of their layer like any other: the loader's types, the bound's tables
    assert {"oracle.run.case_types", "oracle.run.case_expressions"} <= IMPORTS["oracle.run.case"]
    assert {"oracle.judging.accumulation_models", "oracle.judging.bound_stats"} <= \
        IMPORTS["oracle.judging.accumulation_bound"]
    assert "oracle.run.confounds" in IMPORTS["oracle.judging.differential.findings"]


def test_no_sub_package_hides_a_name_of_the_public_api():
    # `import oracle.X` sets the attribute oracle.X, so a sub-package named like an API function
    # (oracle.judge, oracle.check, ...) would replace the function for everyone after the import
    import oracle

    clash = sorted(set(oracle._API) & {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and m.startswith("oracle.")})
    assert not clash, f"oracle sub-packages or modules named like the API's functions: {clash}"


def test_every_documented_error_type_is_bad_input():
    """One base for "the input is wrong", in a leaf module: a command catches it alone."""
    from harness.errors import BadInput
    from oracle.errors import documented_errors, input_errors

    assert input_errors() == (BadInput,)
    assert len(documented_errors()) == 14
    for t in documented_errors():
        assert issubclass(t, BadInput), t
    assert IMPORTS["harness.errors"] == set()  # a leaf: it imports nothing of the project

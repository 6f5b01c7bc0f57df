"""The comparator's modules: imports that run one way (oracle.judging.comparison below oracle.judging.compare and the
oracle.judging.compare_fast package, compare_fast never importing compare), and the public names
oracle.judging.compare_fast and oracle.judging.compare have always offered. Read from the source (every import
statement, at module or function level), so a lazy import inside a function counts too."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# what `from oracle.judging.compare_fast import X` has offered (benchmarks/compare_bench.py, the GPU tests)
COMPARE_FAST_NAMES = {
    "compare_fast", "tile_stats", "check_supported", "inline_bound", "TileStats", "FastConfig", "DEFAULT_CONFIG",
    "CANDIDATE_CONFIGS", "MAX_PROGRAMS_PER_TILE", "NSTAT",
    "S_COMPARED", "S_BAD", "S_NAN_R", "S_NAN_E", "S_INF_R", "S_INF_E", "S_INFO", "S_MAX_ABS", "S_MAX_REL",
    "S_MAX_RATIO", "S_RATIO_NAN", "S_D2", "S_E2", "S_R2", "S_DOT", "S_SUM_R", "S_SUM_E", "S_FIRST_BAD", "S_GENERAL",
    "K_F32", "K_F16", "K_BF16", "K_LUT", "K_INT", "K_F64", "K_WIDE_INT", "B_EXACT", "B_INLINE", "B_TENSOR",
    "SUB_ALWAYS", "SUB_SCALED", "SUB_TWOSUM",
}
# what other modules and tests import from oracle.judging.compare
COMPARE_NAMES = {"Status", "Comparison", "TileMetrics", "BadElement", "combine", "compare", "compare_reference",
                 "FAST_MIN_ELEMENTS", "FIRST_BAD", "TRIVIAL", "NOT_RUN", "_num"}


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Dotted name -> file, for oracle/judging/compar*.py and the oracle/judging/compare_fast package."""
    out = {}
    for p in sorted((root / "oracle" / "judging").glob("compar*.py")):
        out[f"oracle.judging.{p.stem}"] = p
    for p in sorted((root / "oracle" / "judging" / "compare_fast").glob("*.py")):
        out["oracle.judging.compare_fast" if p.stem == "__init__" else f"oracle.judging.compare_fast.{p.stem}"] = p
    return out


def _imports(path: pathlib.Path) -> set[str]:
    """Every module an import statement anywhere in the file names (`from P import m` names P.m
    too, when P.m is a module of the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    mods = _modules(root)
    return {m: {x for x in _imports(p) if x in mods and x != m} for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle of the graph, once (found by depth-first search)."""
    found, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_the_comparator_modules_import_one_way():
    graph = import_graph(ROOT)
    assert "oracle.judging.comparison" in graph and "oracle.judging.compare_fast.results" in graph, sorted(graph)
    assert cycles(graph) == []
    assert graph["oracle.judging.comparison"] == set()  # below both comparators
    for m, deps in graph.items():
        if m.startswith("oracle.judging.compare_fast"):
            assert "oracle.judging.compare" not in deps, f"{m} imports oracle.judging.compare"


def test_cycles_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_public_names_stay():
    import oracle.judging.compare as c
    import oracle.judging.compare_fast as cf

    assert set(cf.__all__) == COMPARE_FAST_NAMES
    assert [n for n in sorted(COMPARE_FAST_NAMES) if not hasattr(cf, n)] == []
    assert [n for n in sorted(COMPARE_NAMES) if not hasattr(c, n)] == []
    import oracle.judging.comparison as base

    for n in ("Status", "Comparison", "TileMetrics", "BadElement", "combine"):
        assert getattr(c, n) is getattr(base, n)  # one type, whichever module it is imported from


@pytest.mark.parametrize("module", ["oracle.judging.compare_fast.plan", "oracle.judging.compare_fast.launch"])
def test_the_knobs_tests_patch_are_read_where_they_live(module):
    """MAX_PROGRAMS_PER_TILE (plan) and _FUSED_IN_INTERPRETER (launch) are read by the module that
    defines them, so a test that patches them there changes what the pass does."""
    name = {"oracle.judging.compare_fast.plan": "MAX_PROGRAMS_PER_TILE",
            "oracle.judging.compare_fast.launch": "_FUSED_IN_INTERPRETER"}[module]
    path = _modules(ROOT)[module]
    tree = ast.parse(path.read_text())
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    assert reads, f"{module} does not read {name}"
    others = [m for m, p in _modules(ROOT).items() if m != module and name in p.read_text()]
    assert others == [] or others == ["oracle.judging.compare_fast"], others  # the package only re-exports it

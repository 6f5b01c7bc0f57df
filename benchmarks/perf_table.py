"""The results table of docs/benchmarks.md, made from the committed results files.

    python benchmarks/perf_table.py             # rewrite the table between the page's markers
    python benchmarks/perf_table.py --check     # exit 1 if the page's table is not what the files give

Reads every *.json and *.jsonl file in benchmarks/results/ (logs and profiles are not results). A
file's kind comes from its provenance stamp's `benchmark` (benchmarks/provenance.py), else, for
files written before the stamp, from its own keys; a file no reader knows is an error naming it, so
a new kind of results file cannot be left out. One row per measurement: the benchmark, its goal,
what was measured, the ratio against the peer measured in the same run (and which peer), the
machine, the date and commit, the file. A field the file does not hold reads "not recorded":
nothing is guessed, not even from the file's name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
NR = "not recorded"
KEY = "provenance"  # benchmarks/provenance.py's KEY, read here without importing torch
HEADERS = ("benchmark", "goal", "measured", "ratio vs the peer", "machine", "date / commit", "file")


class PerfTableError(ValueError):
    """A results file or the page that cannot be read into the table (names the file and why)."""


@dataclasses.dataclass(frozen=True)
class Measure:
    """What one reader takes from one measurement of a file; None: the file does not hold it."""

    what: str  # the benchmark and the measurement's label
    goal: str | None
    measured: str
    ratio: str | None  # the ratio's value; None: the file holds none
    peer: str | None  # the peer as the measurement itself names it (else the stamp's)


@dataclasses.dataclass(frozen=True)
class Row:
    benchmark: str
    goal: str
    measured: str
    ratio: str
    machine: str
    when: str
    file: str

    def cells(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))


def _g(doc, *path, default=None):
    """doc[path[0]][path[1]]..., or default where a key is missing."""
    for p in path:
        if not isinstance(doc, (dict, list)):
            return default
        try:
            doc = doc[p]
        except (KeyError, IndexError, TypeError):
            return default
    return default if doc is None else doc


def _n(x, fmt: str) -> str:
    return NR if x is None else format(x, fmt)


def _met(flag) -> str:
    return "" if flag is None else (": met" if flag else ": NOT met")


# --- one reader per kind of file: doc -> [Measure] -------------------------------------------------

def _gemm(doc) -> list[Measure]:
    out = []
    for r in doc.get("rows", []):
        size = f"{r['M']}^3" if r.get("M") == r.get("N") == r.get("K") else f"{r.get('M')}x{r.get('N')}x{r.get('K')}"
        label = f"Triton TMA GEMM, {r.get('dtype')}{' ' + r['fp8_acc'] if 'fp8_acc' in r else ''} {size}"
        goal = None if "goal_ratio" not in r else f"ratio >= {r['goal_ratio']}{_met(r.get('meets_goal'))}"
        measured = (f"error: {r['error'][:100]}" if r.get("error") else
                    f"Triton {_n(r.get('triton_TFLOPs'), '.1f')}, cuBLAS {_n(r.get('cublas_TFLOPs'), '.1f')} TFLOP/s")
        out.append(Measure(label, goal, measured, _n(r.get("ratio"), ".3f"), r.get("cublas_path")))
    return out


def _check(doc) -> list[Measure]:
    out = []
    for r in doc.get("sizes", []):
        w = r.get("warm_ms") or {}
        goal = None if r.get("goal_ms") is None else f"warm <= {r['goal_ms']:g} ms{_met(r.get('meets_goal'))}"
        if r.get("goal_ratio") is not None:
            goal = f"{goal}; " if goal else ""
            goal += f"<= {r['goal_ratio']:g}x the GEMM{_met(r.get('meets_goal_ratio'))}"
        measured = (f"warm {_n(w.get('median'), '.1f')} ms (median of {len(w.get('all', []))}, "
                    f"{_n(w.get('min'), '.1f')}-{_n(w.get('max'), '.1f')}), first call "
                    f"{_n(r.get('first_ms'), '.0f')} ms, {r.get('verdict')}")
        out.append(Measure(f"oracle.check, bf16 {r.get('n')}^3", goal, measured,
                           _n(r.get("ratio_to_gemm"), ".1f"), "the GEMM timed beside it (`gemm_ms`)"))
    return out


def _compare(doc) -> list[Measure]:
    goals = _g(doc, "details", "goals", default={})
    goal = "; ".join(f"{k}{_met(v.get('met'))}" for k, v in goals.items()) or None
    if "error" in doc:
        return [Measure("comparator (compare_fast)", goal, f"error: {doc['error'][:100]}", None, None)]
    measured = (f"{_n(doc.get('elements'), 'd')} {doc.get('dtype')} elements: device pass "
                f"{_n(doc.get('oracle_ms'), '.3f')} ms, {_n(doc.get('effective_TBps'), '.2f')} TB/s, "
                f"{_n(doc.get('fraction_of_read_bw'), '.2f')} of the read ceiling")
    return [Measure("comparator (compare_fast)", goal, measured, _n(doc.get("speedup_vs_assert_close"), ".1f"),
                    "torch.testing.assert_close (`assert_close_ms`)")]


def _warm_path(doc) -> list[Measure]:
    cli = f" (its own part <= {doc['goal_cli_own_s']:g} s)" if doc.get("goal_cli_own_s") is not None else ""
    goal = None if doc.get("goal_s") is None else (
        f"<= {doc['goal_s']:g} s: plain command{cli}{_met(doc.get('goal_met_cli'))}, served"
        f"{_met(doc.get('goal_met_served'))}, in-process{_met(doc.get('goal_met_in_process'))}")
    own = doc.get("cli_own_s_median")
    measured = (f"plain command {_n(doc.get('warm_wall_s_median'), '.1f')} s"
                f"{'' if own is None else f' (its own part {own:.1f} s)'}, served "
                f"{_n(doc.get('served_warm_s_median'), '.1f')} s, in-process "
                f"{_n(doc.get('in_process_warm_s_median'), '.1f')} s; {doc.get('problem')}")
    imp = doc.get("import_torch_wall_s")
    peer = None if not imp else f"a bare `import torch` before each warm run, {statistics.median(imp):.1f} s median"
    return [Measure("warm `oracle compare`", goal, measured, None, peer)]


def _ci_time(doc) -> list[Measure]:
    met = "" if doc.get("wall_s") is None else _met(doc["wall_s"] <= doc.get("goal_s", 0))
    top = ", ".join(f"{k} {v:.0f} s" for k, v in list((doc.get("compile_s_by_source") or {}).items())[:3])
    measured = (f"{_n(doc.get('wall_s'), '.0f')} s in all, pytest {_n(doc.get('pytest_s'), '.0f')} s on "
                f"{doc.get('cores')} cores; {doc.get('compiles')} compiles, {_n(doc.get('compile_s'), '.0f')} s of nvcc"
                f"{f' ({top})' if top else ''}")
    return [Measure("the README's test command, cold", f"<= {doc.get('goal_s', 600):g} s{met}", measured, None, None)]


def _analyze(doc) -> list[Measure]:
    counts = doc.get("counts") or {}
    extra = f", {counts['launches']} launches, {counts['host_reads']} host reads" if "launches" in counts else ""
    measured = (f"{_n(doc.get('median_ms'), '.0f')} ms median on {doc.get('device')}, {len(doc.get('tiles', []))} "
                f"tiles x {doc.get('k_blocks')} k-blocks{extra}, {doc.get('verdict')}")
    return [Measure("the differential alone (analyze)", None, measured, None, None)]


def _parse(doc) -> list[Measure]:
    d = doc.get("after", doc)
    before = _g(doc, "before", "parse_s_median")
    measured = (f"parse {_n(d.get('parse_s_median'), '.2f')} s wall, {_n(d.get('parse_cpu_s_median'), '.2f')} s CPU; "
                f"{_n((d.get('record_bytes') or 0) / 1e6 if 'record_bytes' in d else None, '.0f')} MB of records"
                + ("" if before is None else f" (before: {before:.2f} s wall)"))
    return [Measure("parsing the warm path's trace", None, measured, None, None)]


def _false_alarms(doc) -> list[Measure]:
    measured = (f"{doc.get('correct_cases')} correct judgements, {doc.get('false_diverged')} false DIVERGED, worst "
                f"err/bound {_n(doc.get('worst_ratio'), '.3f')}; planted {doc.get('detected_right_tile')}/"
                f"{doc.get('planted')} at the right tile; {doc.get('cases_left_by_budget')} left by the budget")
    return [Measure("GEMM false alarms", None, measured, None, None)]


def _attention(doc) -> list[Measure]:
    judged = sum(p.get("cases", 0) for p in (doc.get("per_backend") or {}).values())
    measured = (f"{judged} judged of {doc.get('cases_run')} run ({doc.get('cases_made')} made), "
                f"{doc.get('false_diverged')} false DIVERGED, worst err/bound {_n(doc.get('worst_ratio'), '.2f')}; "
                f"planted {doc.get('planted_right_unit')}/{len(doc.get('planted', []))} at the right unit")
    return [Measure("attention false alarms", None, measured, None, None)]


def _numerics(doc) -> list[Measure]:
    measured = (f"{len(doc.get('engines', {}))} engines fitted, {len(doc.get('failures', []))} without a model that "
                f"fits{' (emulated)' if doc.get('emulated') else ''}")
    return [Measure("accumulation numerics", None, measured, None, None)]


def _attention_numerics(doc) -> list[Measure]:
    prims = {k: v for k, v in (doc.get("primitives") or {}).items() if isinstance(v, dict)}
    within = [k.split(".")[0] for k, v in prims.items() if v.get("within")]
    beyond = [k.split(".")[0] for k, v in prims.items() if not v.get("within")]
    p_form = {k: v for k, v in (doc.get("p_form") or {}).items() if isinstance(v, dict)}
    worst_p = max((v.get("max_err_over_bound", 0) for v in p_form.values()), default=None)
    chains = (doc.get("chain") or {}).get("cases") or []
    worst_o = max((c.get("o_err_over_one_side_bound", 0) for c in chains), default=None)
    measured = (f"primitives within their constants: {', '.join(within) or 'none'}"
                f"{'; beyond: ' + ', '.join(beyond) if beyond else ''}; P's worst err/bound "
                f"{_n(worst_p, '.3g')} over {len(p_form)} cases; {len(chains)} online-softmax chain(s), worst O err / one "
                f"side of its bound {_n(worst_o, '.2f')}")
    return [Measure("attention numerics", f"every error within its bound{_met(doc.get('ok'))}", measured, None, None)]


def _zoo_at_size(doc) -> list[Measure]:
    runs = doc.get("runs") or []
    other = [f"{r.get('name')} {r.get('verdict') or 'no report'}" for r in runs
             if r.get("wall_s") is not None and r.get("verdict") != "MATCH"]
    left = sum(1 for r in runs if r.get("wall_s") is None)
    measured = (f"{doc.get('matched')} of {doc.get('started')} correct zoo kernels MATCH at realistic sizes"
                + (f"; not MATCH: {', '.join(other)}" if other else "") + (f"; {left} not started" if left else ""))
    return [Measure("zoo at size", f"every run MATCHes{_met(doc.get('all_match'))}", measured, None, None)]


def _chain_traffic(doc) -> list[Measure]:
    measured = (f"{doc.get('operations')} torch operations on D-sized tensors, "
                f"{_n(doc.get('bytes_per_element'), '.0f')} bytes per element of D ({doc.get('verdict')} at "
                f"{doc.get('size')}^3 on {doc.get('device')}); at 4096^2 over {doc.get('bandwidth_tbps')} TB/s: "
                f"{_n(doc.get('estimate_ms_4096'), '.2f')} ms")
    return [Measure("oracle.check's reference chain, traffic", None, measured, None, None)]


def _w4a16(doc) -> list[Measure]:
    return [Measure("tinygemm W4A16 dequantisation", None,
                    f"{len(doc.get('rows', []))} probes; dequant_precision chosen: {doc.get('choice')}", None, None)]


def _fuzz(doc) -> list[Measure]:
    def line(t):
        return (f"{t.get('inputs')} inputs: {t.get('untyped')} untyped errors, {t.get('hangs')} hangs, "
                f"{t.get('limit_breaches')} limit breaches")

    out = []
    if doc.get("tallies") is not None:
        total = {k: sum(t.get(k, 0) for t in doc["tallies"]) for k in ("inputs", "untyped", "hangs", "limit_breaches")}
        out.append(Measure("fuzzing: " + ", ".join(t["kind"] for t in doc["tallies"] if t.get("inputs")),
                           None, line(total), None, None))
    for key, entry in doc.items():  # entries added by --entries or by hand: one campaign each
        if isinstance(entry, dict) and "kind" in entry and "inputs" in entry:
            out.append(Measure(f"fuzzing: {entry['kind']} (`{key}`)", None, line(entry), None, None))
    return out


def _bench_lines(rows) -> list[Measure]:
    verdicts = Counter(r.get("verdict") for r in rows)
    speeds = [s for r in rows if (s := _g(r, "performance", "kernel_speed_vs", "cublas")) is not None]
    ratio = None if not speeds else f"{statistics.median(speeds):.2f} (median of {len(speeds)} cases)"
    measured = f"{len(rows)} cases: " + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items(), key=str))
    return [Measure("`oracle bench` sweep", None, measured, ratio, "cuBLAS (`kernel_speed_vs.cublas`)" if speeds
                    else None)]


def _verify_lines(rows) -> list[Measure]:
    verdicts = Counter(r.get("verdict") for r in rows)
    speeds = [s for r in rows if (s := _g(r, "performance", "op_speed_vs_peer")) is not None]
    peers = sorted({p for r in rows if (p := _g(r, "performance", "peer"))})
    ratio = None if not speeds else f"{statistics.median(speeds):.2f} (median of {len(speeds)} cases)"
    ops = sorted({r.get("op") for r in rows if r.get("op")})
    measured = f"{len(rows)} cases of {', '.join(ops)}: " + ", ".join(f"{n} {v}" for v, n in verdicts.items())
    return [Measure("`oracle verify` sweep", None, measured, ratio, ", ".join(peers) or None)]


# The readers by the stamp's `benchmark` (the script's name), and how to know an older file.
READERS: dict[str, Callable] = {
    "gemm_bench": _gemm, "check_bench": _check, "compare_bench": _compare, "warm_path": _warm_path,
    "analyze_bench": _analyze, "parse_bench": _parse, "false_alarms": _false_alarms,
    "attention_false_alarms": _attention, "measure_numerics": _numerics, "probe_w4a16": _w4a16,
    "fuzz_inputs": _fuzz, "ci_time": _ci_time, "measure_attention_numerics": _attention_numerics,
    "zoo_at_size": _zoo_at_size, "chain_traffic": _chain_traffic,
}
LEGACY: tuple[tuple[str, Callable[[dict], bool]], ...] = (
    ("gemm_bench", lambda d: isinstance(d.get("rows"), list) and any("triton_TFLOPs" in r for r in d["rows"])),
    ("check_bench", lambda d: "sizes" in d and "seed" in d),
    ("compare_bench", lambda d: "oracle_ms" in d or "speedup_vs_assert_close" in d),
    ("warm_path", lambda d: "warm_wall_s_median" in d),
    ("analyze_bench", lambda d: "analyze_ms" in d),
    ("parse_bench", lambda d: "parse_s_median" in d or "parse_s_median" in (d.get("after") or {})),
    ("false_alarms", lambda d: d.get("schema") == "oracle.false_alarms/1"),
    ("attention_false_alarms", lambda d: d.get("schema") == "attention_false_alarms/1"),
    ("measure_numerics", lambda d: d.get("schema") == "oracle.numerics/1"),
    ("probe_w4a16", lambda d: d.get("schema") == "oracle.probe_w4a16/1"),
    ("fuzz_inputs", lambda d: d.get("schema") == "oracle.fuzz_inputs/1"),
)
# Where an older file of each kind keeps its machine and its date (the stamp holds both for newer ones).
LEGACY_MACHINE = {"gemm_bench": ("machine", "gpu"), "check_bench": ("machine",), "compare_bench": ("machine",),
                  "warm_path": ("machine",), "parse_bench": ("machine",), "fuzz_inputs": ("machine",),
                  "false_alarms": ("environment", "gpu"), "attention_false_alarms": ("environment", "gpu"),
                  "measure_numerics": ("environment", "gpu"), "probe_w4a16": ("environment", "gpu")}
LEGACY_DATE = {"gemm_bench": ("machine", "date"), "check_bench": ("date",), "compare_bench": ("details", "date"),
               "false_alarms": ("environment", "date"), "measure_numerics": ("environment", "date"),
               "probe_w4a16": ("environment", "date")}


def kind_of(doc: dict, name: str) -> str:
    stamped = _g(doc, KEY, "benchmark")
    if stamped is not None:
        if stamped not in READERS:
            raise PerfTableError(f"{name}: its stamp names the benchmark {stamped!r}, which no reader knows "
                                 f"(known: {', '.join(READERS)}); add one to benchmarks/perf_table.py")
        return stamped
    for kind, test in LEGACY:
        if test(doc):
            return kind
    raise PerfTableError(f"{name}: no reader knows this results file (no provenance stamp, and its keys "
                         f"{sorted(doc)[:8]} match no older kind); add one to benchmarks/perf_table.py")


def _machine(doc: dict, kind: str) -> str:
    m = _g(doc, KEY, "machine")
    if m is not None:
        if m.get("gpu_name"):
            return m["gpu_name"] + (f" (x{m['gpu_count']})" if (m.get("gpu_count") or 0) > 1 else "")
        cpu = m.get("cpu_model") or "CPU"
        return f"no GPU: {cpu}, {m.get('cpu_cores')} cores"
    path = LEGACY_MACHINE.get(kind)
    if path is None:
        return NR
    found = _g(doc, *path)
    if found is None and kind == "parse_bench":
        found = _g(doc, "after", "machine")
    if found is None and kind == "false_alarms":  # a merge: each part's environment
        gpus = sorted({r.get("gpu") for r in _g(doc, "environment", "runs", default=[]) if r.get("gpu")})
        found = ", ".join(gpus) or None
    return NR if found is None else str(found)


def _when(doc: dict, kind: str) -> str:
    s = doc.get(KEY)
    if s is not None:
        v = s.get("versions") or {}
        commit = v.get("oracle_commit")
        commit = NR if commit is None else commit[:10] + (" with changes" if v.get("oracle_tree_dirty") else "")
        return f"{(s.get('date') or NR)[:10]} / {commit}"
    date = _g(doc, *LEGACY_DATE[kind]) if kind in LEGACY_DATE else None
    if date is None and kind == "false_alarms":
        date = _g(doc, "environment", "merged")
    return f"{NR if date is None else str(date)[:10]} / {NR}"


def _ratio(m: Measure, doc: dict) -> str:
    stamp = doc.get(KEY)
    if stamp is not None and stamp.get("peer") is None:
        return "no peer: " + _g(stamp, "why_null", "peer", default=NR)
    peer = _g(stamp, "peer", "name") if m.peer is None else m.peer
    if m.ratio is None:
        return NR if peer is None else f"no ratio; the peer: {peer}"
    return f"{m.ratio} vs {peer or 'a peer ' + NR}"


def rows_of(path: Path) -> list[Row]:
    """The table's rows for one results file."""
    name = path.name
    try:
        if path.suffix == ".jsonl":
            lines = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        else:
            doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PerfTableError(f"{name}: not readable as JSON: {e}") from None
    if path.suffix == ".jsonl":
        if not lines:
            raise PerfTableError(f"{name}: an empty JSONL file")
        if all("op" in r for r in lines):
            measures = _verify_lines(lines)
        elif all("case" in r and "verdict" in r for r in lines):
            measures = _bench_lines(lines)
        else:
            raise PerfTableError(f"{name}: no reader knows these JSON lines (neither `oracle bench` nor `oracle verify`)")
        gpus = sorted({g for r in lines if (g := _g(r, "environment", "gpu"))})
        return [Row(m.what, m.goal or NR, m.measured, _ratio(m, {}), ", ".join(gpus) or NR, f"{NR} / {NR}", name)
                for m in measures]
    if not isinstance(doc, dict):
        raise PerfTableError(f"{name}: a results file holds one JSON object, not a {type(doc).__name__}")
    kind = kind_of(doc, name)
    return [Row(m.what, m.goal or NR, m.measured, _ratio(m, doc), _machine(doc, kind), _when(doc, kind),
                name) for m in READERS[kind](doc)]


def results_files(folder: Path = RESULTS) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(folder: Path = RESULTS) -> str:
    """The markdown table of every results file in `folder`."""
    rows = [r for p in results_files(folder) for r in rows_of(p)]
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_cell(c) for c in r.cells()[:-1]) + f" | `{r.file}` |" for r in rows]
    return "\n".join(lines)


def page_with_table(page_text: str, table_text: str) -> str:
    """The page with its text between the markers replaced by the table."""
    if page_text.count(START) != 1 or page_text.count(END) != 1 or page_text.index(START) > page_text.index(END):
        raise PerfTableError(f"{PAGE.relative_to(ROOT)}: needs one {START} line, then one {END} line")
    head, rest = page_text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{table_text}\n{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page's table is stale")
    args = ap.parse_args(argv)
    try:
        text = PAGE.read_text()
        new = page_with_table(text, table())
    except PerfTableError as e:
        print(f"perf_table: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{PAGE.relative_to(ROOT)}: its table is not what benchmarks/results/ gives; run "
                  "python benchmarks/perf_table.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        PAGE.write_text(new)
    print(f"{PAGE.relative_to(ROOT)}: {len(results_files())} results files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

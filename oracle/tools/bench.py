"""Benchmark-and-verify: run a list of live cases, judge every one stage by stage, then time it.

A cases file (TOML):

    [defaults]                 # applied to every case (each case may override any key)
    case = "../harness/examples/simple_gemm.toml"   # a live case file, relative to this file
    inputs = "random:0"
    time = true

    [[case]]
    name = "bf16-ragged"
    set = { m = 200, n = 136, k = 72 }               # problem overrides

    [[case]]
    name = "fp16-1024"
    entry = "simple_gemm_fp16_traced"
    set = { m = 1024, n = 1024, k = 1024, a_dtype = "fp16", b_dtype = "fp16", out_dtype = "fp16" }

Every case is verified (the differential's verdict) before it is timed; a diverging case is
not timed. `repeat = N` (default: the live case's [run] repeat) verifies a case as compare
--repeat N does: the traced and the untraced build N times each on the same inputs, compared bit
for bit; runs that differ make the row NONDETERMINISTIC (exit 6 if nothing worse), and a case
that repeats is timed in one more run of its own. `--shard i/n` keeps cases i, i+n, i+2n, ... (0-based) so a sweep splits across
machines or job arrays; with several visible GPUs one worker process runs per GPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from harness.fields import shown
from oracle.run.case import read_toml, trace_plan
from oracle.run.case_types import MAX_REPEAT, CaseError
from oracle.run.case_files import CaseTrust
from oracle.run.inputs import ATTENTION_LADDER, LADDER, InputError, parse_inputs

CASE_KEYS = ("name", "case", "entry", "set", "inputs", "time", "trace_tiles", "trace_k_blocks", "timeout", "repeat")


@dataclass(frozen=True)
class BenchCase:
    name: str
    case: str
    entry: Optional[str] = None
    overrides: dict = field(default_factory=dict)
    inputs: str = "random:0"
    time: bool = True
    timeout: Optional[float] = None
    trace_tiles: Optional[tuple] = None  # None: the case's [trace] (or its default sample)
    trace_k_blocks: Optional[tuple] = None
    repeat: Optional[int] = None  # None: the live case's [run] repeat
    trust: CaseTrust = CaseTrust()  # the command line's opt-ins (oracle.run.case_files), not the cases file's


ANY_LADDER = LADDER + tuple(x for x in ATTENTION_LADDER if x not in LADDER)


def load_cases(path: str) -> list[BenchCase]:
    """The cases of a cases file, every key checked by type (the live case files they name are
    read by `check_cases`)."""
    doc = read_toml(path, "cases file")
    unknown = sorted(set(doc) - {"defaults", "case"})
    if unknown:
        raise CaseError(f"cases file {path!r}: unknown table(s) {', '.join(unknown)}; allowed: defaults, case")
    base = os.path.dirname(os.path.abspath(path))
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise CaseError(f"cases file {path!r}: defaults = {shown(defaults)} must be a table ([defaults])")
    _typed(defaults, "[defaults]")
    raws = doc.get("case", [])
    if not isinstance(raws, list) or not all(isinstance(r, dict) for r in raws):
        raise CaseError(f"cases file {path!r}: case = {shown(raws)} must be a list of tables ([[case]])")
    out = []
    for i, raw in enumerate(raws):
        entry = {**defaults, **raw}
        where = f"case #{i}"
        bad = sorted(set(entry) - set(CASE_KEYS))
        if bad:
            raise CaseError(f"{where}: unknown key(s) {', '.join(bad)}; allowed: {', '.join(CASE_KEYS)}")
        if "case" not in entry:
            raise CaseError(f"{where}: no live case file (key 'case', here or in [defaults])")
        _typed(entry, where)
        name = entry.get("name") or f"case{i}"
        sets = dict(defaults.get("set", {}))
        sets.update(raw.get("set", {}))
        sel = {key: entry[f"trace_{key}"] for key in ("tiles", "k_blocks") if f"trace_{key}" in entry}
        plan = trace_plan(sel, where=f"{where}: trace")
        out.append(BenchCase(name, os.path.join(base, entry["case"]), entry.get("entry"), sets,
                             entry.get("inputs", "random:0"), entry.get("time", True), entry.get("timeout"),
                             plan.tiles, plan.k_blocks, entry.get("repeat")))
    if not out:
        raise CaseError(f"cases file {path!r} has no [[case]] entries")
    names = [c.name for c in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise CaseError(f"cases file {path!r}: duplicate case name(s) {', '.join(dup)}")
    return out


def _typed(entry: dict, where: str) -> None:
    """Each key of a case by type: strings, a table of problem fields, a boolean, a time limit, inputs."""
    for key in ("name", "case", "entry"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            raise CaseError(f"{where}: {key} = {shown(entry[key])} must be a non-empty string")
    if "set" in entry and not isinstance(entry["set"], dict):
        raise CaseError(f"{where}: set = {shown(entry['set'])} must be a table of problem fields")
    if "time" in entry and not isinstance(entry["time"], bool):
        raise CaseError(f"{where}: time = {shown(entry['time'])} must be true or false")
    r = entry.get("repeat")
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPEAT):
        raise CaseError(f"{where}: repeat = {shown(r)} must be an integer from 1 to {MAX_REPEAT}")
    t = entry.get("timeout")
    if t is not None and not (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < float("inf")):
        raise CaseError(f"{where}: timeout = {shown(t)} must be a positive number of seconds")
    try:
        # either kind's ladders here: the case file, read later, says which kind (RunRequest checks)
        ladder, _, _ = parse_inputs(entry.get("inputs", "random:0"), ANY_LADDER)
    except InputError as e:
        raise CaseError(f"{where}: {e}") from None
    if ladder == "dump":
        raise CaseError(f"{where}: inputs = {shown(entry['inputs'])}: a bench case makes its inputs (ones, index, "
                        f"ktag, random[:seed]); dump inputs are for compare")


def live_case(bc: BenchCase):
    """The live case a bench case runs, with every check made before anything is built (CaseError,
    SpecError, InputError, BuildError, ... naming what is wrong)."""
    from oracle.run.case import load_case
    from oracle.run.case_types import with_trace
    from oracle.run.sink import check_case

    case = load_case(bc.case, bc.overrides, entry=bc.entry, allow_library=bc.trust.library,
                     allow_outside_case_dir=bc.trust.outside_case_dir)
    if bc.trace_tiles or bc.trace_k_blocks:
        case = with_trace(case, bc.trace_tiles, bc.trace_k_blocks)
    check_case(case)
    return case


def parse_shard(text: Optional[str]) -> tuple[int, int]:
    if not text:
        return 0, 1
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise CaseError(f"--shard {text!r} must look like i/n (0-based i < n)") from None
    if not (n >= 1 and 0 <= i < n):
        raise CaseError(f"--shard {text!r}: need 0 <= i < n")
    return i, n


def shard(cases: Sequence[BenchCase], i: int, n: int) -> list[BenchCase]:
    return [c for j, c in enumerate(cases) if j % n == i]


def compare_words(bc: BenchCase) -> tuple[str, ...]:
    """The `python -m oracle compare` command line that judges the bench case alone."""
    words = ["python", "-m", "oracle", "compare", bc.case, "--inputs", bc.inputs]
    if bc.entry:
        words += ["--entry", bc.entry]
    for key, value in bc.overrides.items():
        words += ["--set", f"{key}={_toml_value(value)}"]
    if bc.trace_tiles:
        words += ["--trace-tiles", " ".join(f"{tm},{tn}" for tm, tn in bc.trace_tiles)]
    if bc.trace_k_blocks:
        words += ["--trace-k-blocks", ",".join(map(str, bc.trace_k_blocks))]
    if bc.repeat is not None:
        words += ["--repeat", str(bc.repeat)]
    if bc.timeout is not None:
        words += ["--timeout", str(bc.timeout)]
    words += (["--allow-library"] if bc.trust.library else []) + \
        (["--allow-outside-case-dir"] if bc.trust.outside_case_dir else [])
    return tuple(words)


def _toml_value(v) -> str:
    """A problem field's value as `--set k=v` reads it back (oracle.run.case.parse_value)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v) if any(c in v for c in " ,=[]{}\"'") else v
    return str(v)


def run_case(bc: BenchCase, html_page: Optional[str] = None) -> dict:
    """Verify, then time, one case. Never raises for what the kernel does: the row says. With
    `html_page`, the judgement's HTML page is written there (the row's `html` names its file)."""
    from dataclasses import replace

    from oracle.run.case_types import RunPlan
    from oracle.run.request import RunRequest
    from oracle.tools.api import compare

    row: dict[str, Any] = {"name": bc.name, "case": bc.case, "entry": bc.entry, "set": bc.overrides}
    t0 = time.perf_counter()
    try:
        if bc.time:  # before anything is built
            from oracle.run.timing import require_gpu

            require_gpu(advice="give --no-time, or time = false for the case")
        case = live_case(bc)
        request = RunRequest(case=case, inputs=bc.inputs, repeat=bc.repeat, timeout_s=bc.timeout,
                             command=compare_words(bc))
        timed_here = bc.time and not request.races
        report = compare(replace(request, time=timed_here))
        judged = report.judgement
    except Exception as e:  # a broken case is a row, not the end of the sweep
        row.update(verdict="ERROR", error=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
        return row
    if html_page:
        try:
            report.write_html(html_page)
            row["html"] = os.path.basename(html_page)
        except OSError as e:
            row["html_error"] = f"{type(e).__name__}: {e}"
    row["problem"] = case.spec.describe()
    row["verdict"] = judged.verdict.value
    if judged.races is not None:
        row["repeat"] = {"runs": request.runs, "nondeterministic": judged.races.nondeterministic,
                         "reasons": judged.races.reasons()}
    f = judged.first
    if f is not None:
        row["first_divergence"] = {"stage": f.stage, "tile": list(f.tile) if f.tile else None, "k_block": f.k_block,
                                   "partial": f.partial, "group": f.group, "kind": f.kind.value}
    ran = judged.kernel_run is not None and judged.kernel_run.status == "OK"
    if bc.time and judged.ok and ran:
        performance = judged.performance
        if not timed_here:  # the repeated runs verified it; the timing is a run of its own
            try:
                once = replace(case, run=RunPlan())
                performance = compare(RunRequest(case=once, inputs=bc.inputs, timeout_s=bc.timeout,
                                                 time=True)).judgement.performance
            except Exception as e:
                row.update(error=f"timing run: {type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
                return row
        if performance is not None:
            row["performance"] = performance.to_json()
    row["seconds"] = time.perf_counter() - t0
    return row


def environment() -> dict:
    from harness.dump import environment as env

    return env()


def _progress(i: int, n: int, row: dict, stream) -> None:
    perf = row.get("performance", {})
    k = next((p for p in perf.get("paths", []) if p["name"] == "kernel"), None)
    t = f" {k['median_ms']:.4g} ms {k['TFLOPs']:.4g} TFLOP/s" if k else ""
    bar = "#" * int(20 * i / n)
    print(f"[{bar:<20}] {i}/{n} {row['name']}: {row['verdict']}{t}", file=stream, flush=True)


def table(rows: Sequence[dict]) -> str:
    from tabulate import tabulate

    out = []
    for r in rows:
        perf = {p["name"]: p for p in r.get("performance", {}).get("paths", [])}
        speed = r.get("performance", {}).get("kernel_speed_vs", {})
        fd = r.get("first_divergence")
        peer = next((p for p in PEERS if p in speed), None)  # cuBLAS for a GEMM, torch SDPA for attention
        out.append([r["name"], r["verdict"], f"{fd['stage']} {tuple(fd['tile'])} kb {fd['k_block']}" if fd else "-",
                    *(f"{perf[p]['median_ms']:.4g}" if p in perf else "-" for p in ("kernel", "triton", "cublas", "sdpa")),
                    f"{perf['kernel']['TFLOPs']:.4g}" if "kernel" in perf else "-",
                    f"{speed[peer]:.3g} ({PEERS[peer]})" if peer else "-"])
    return tabulate(out, headers=["case", "verdict", "first divergence", "kernel ms", "triton ms", "cublas ms",
                                  "sdpa ms", "kernel TFLOP/s", "speed vs peer"])


PEERS = {"cublas": "cuBLAS", "sdpa": "SDPA"}  # the peer a kernel's speed is told against, by problem kind


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_bench(cases_path: str, *, shard_text: Optional[str] = None, jsonl: Optional[str] = None,
              workers: Optional[int] = None, time_cases: bool = True, stream=None, allow_library: bool = False,
              allow_outside_case_dir: bool = False, html: Optional[str] = None) -> tuple[list[dict], int]:
    """Run the sweep; returns (rows, exit code: 0 all match, 1 a divergence, 3 a kernel error, 6 runs that
    differ (NONDETERMINISTIC), 2 a broken case). The opt-ins of oracle.run.case_files apply to every case.
    Progress goes to `stream` (default: sys.stderr at the time of the call). `html`: a folder for
    every case's HTML page and an index.html linking them (write_index)."""
    stream = sys.stderr if stream is None else stream
    cases = load_cases(cases_path)
    i, n = parse_shard(shard_text)
    mine = shard(cases, i, n)
    if not time_cases:
        mine = [BenchCase(**{**c.__dict__, "time": False}) for c in mine]
    trust = CaseTrust(library=allow_library, outside_case_dir=allow_outside_case_dir)
    mine = [BenchCase(**{**c.__dict__, "trust": trust}) for c in mine]
    broken = _broken(mine)  # every case checked before the first one is built
    gpus = visible_gpus() if workers is None else workers
    env = environment()
    indices = [j for j in range(len(cases)) if j % n == i]
    if gpus > 1 and len(mine) > 1:
        from oracle.tools.workers import absolute, run_workers

        def argv(sub: str, out: str) -> list[str]:
            return ["bench", "--cases", absolute(cases_path), "--shard", sub, "--jsonl", out, "--workers", "1"] + \
                ([] if time_cases else ["--no-time"]) + (["--allow-library"] if allow_library else []) + \
                (["--allow-outside-case-dir"] if allow_outside_case_dir else []) + \
                (["--html", absolute(html)] if html else [])

        rows = run_workers(argv, (i, n), gpus, indices, stream=stream)
        for r in rows:
            r.pop("environment", None)
            _progress(len(rows), len(rows), r, stream)
    else:
        from oracle.tools.workers import device_of_this_process

        here = device_of_this_process()
        rows = []
        if html:
            from oracle.report.html import page_name

            os.makedirs(html, exist_ok=True)
        for j, c in zip(indices, mine):
            page = os.path.join(html, page_name(j, c.name)) if html else None
            rows.append({"index": j, **(broken.get(c.name) or (run_case(c, page) if page else run_case(c))), **here})
            _progress(len(rows), len(mine), rows[-1], stream)
    if jsonl:
        from harness.output_files import write_text_atomically

        write_text_atomically(jsonl, "".join(json.dumps({"environment": env, **r}, default=str) + "\n"
                                             for r in rows), "JSON lines")
    if html:
        write_index(html, f"bench {os.path.basename(cases_path)}", rows)
    verdicts = {r["verdict"] for r in rows}
    code = 3 if "KERNEL_ERROR" in verdicts else 1 if verdicts & {"DIVERGED", "ORACLE_UNTRUSTED", "MISTRUSTED"} \
        else 6 if "NONDETERMINISTIC" in verdicts else 2 if "ERROR" in verdicts else 0
    return rows, code


def write_index(directory: str, title: str, rows: Sequence[dict]) -> str:
    """DIR/index.html: one row per case (bench, verify), linking the page its row names (`html`)."""
    from oracle.report.html import IndexEntry, write_index as write

    entries = []
    for r in rows:
        fd = r.get("first_divergence") or {}
        where = fd.get("tile") or fd.get("unit")
        first = " ".join(str(x) for x in (fd.get("stage"), tuple(where) if where else None,
                                          f"k-block {fd['k_block']}" if fd.get("k_block") is not None else None,
                                          fd.get("kind")) if x)
        entries.append(IndexEntry(str(r["name"]), str(r["verdict"]), first, r.get("html"),
                                  str(r.get("error") or r.get("html_error") or "")))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "index.html")
    write(path, title, entries)
    return path


def _broken(cases: Sequence[BenchCase]) -> dict[str, dict]:
    """The rows of the cases that fail their checks (live_case), by name: they are not run."""
    from oracle.errors import input_errors

    rows = {}
    for c in cases:
        try:
            live_case(c)
        except input_errors() as e:  # a broken case is a row, not the end of the sweep
            rows[c.name] = {"name": c.name, "case": c.case, "entry": c.entry, "set": c.overrides, "verdict": "ERROR",
                            "error": f"{type(e).__name__}: {e}", "seconds": 0.0}
    return rows

"""The run's results as tables and JSON: per-group and per-defect tables, the summary document,
and reading earlier runs back (to merge shards, or skip what a cut run judged)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from datetime import datetime, timezone

import torch

from alarms.engines import Case, kbucket
from alarms.judging import Result
from oracle.judging.diagnose import Verdict


def tables(results: list[Result]) -> dict:
    ok = [r for r in results if r.judged]
    groups: dict = {}
    for r in ok:
        for key in (f"engine={r.case.engine}", f"out={r.case.out}", kbucket(r.case.k), f"inputs={r.case.kind}"):
            g = groups.setdefault(key, {"cases": 0, "false_diverged": 0, "ratios": []})
            g["cases"] += 1
            g["false_diverged"] += r.verdict != Verdict.MATCH.value
            g["ratios"].append(r.ratio)
    for g in groups.values():
        rs = sorted(x for x in g.pop("ratios") if math.isfinite(x))
        g["worst_ratio"] = rs[-1] if rs else None
        g["median_ratio"] = rs[len(rs) // 2] if rs else None
    planted: dict = {}
    for r in ok:
        for d, (det, right) in r.planted.items():
            for key in (d, f"{d} {kbucket(r.case.k)}", f"{d} inputs={r.case.kind}"):
                p = planted.setdefault(key, {"planted": 0, "detected": 0, "detected_right_tile": 0})
                p["planted"] += 1
                p["detected"] += det
                p["detected_right_tile"] += right
    for p in planted.values():
        p["rate_right_tile"] = p["detected_right_tile"] / p["planted"] if p["planted"] else None
    return {"groups": groups, "planted_table": planted}


def environment() -> dict:
    """The run's versions and device (harness.dump.environment), the date and the GPU's capability."""
    from harness.dump import environment as versions

    env = dict(versions(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["capability"] = f"{p.major}.{p.minor}"
    env["cross_check_tiles"] = os.environ.get("ORACLE_CROSS_CHECK_TILES",
                                              "1 on the first case of each engine and K range, else 0")
    return env


def summarise(results: list[Result], left: int, seconds: float) -> dict:
    ok = [r for r in results if r.judged]
    ratios = sorted((r.ratio for r in ok if math.isfinite(r.ratio)), reverse=True)
    planted = sum(len(r.planted) for r in ok)
    right = sum(right for r in ok for _, right in r.planted.values())
    detected = sum(det for r in ok for det, _ in r.planted.values())
    worst = max(ok, key=lambda r: r.ratio if math.isfinite(r.ratio) else math.inf, default=None)
    return {
        "schema": "oracle.false_alarms/1",
        "environment": environment(),
        "correct_cases": len(ok),
        "false_diverged": sum(r.verdict != Verdict.MATCH.value for r in ok),
        "planted": planted,
        "detected": detected,
        "detected_right_tile": right,
        "detected_right_tile_rate": right / planted if planted else None,
        "worst_ratio": ratios[0] if ratios else None,
        "worst_case": worst.case.label() if worst else None,
        "ratio_quantiles": {q: ratios[min(len(ratios) - 1, int((1 - q) * len(ratios)))] if ratios else None
                            for q in (0.5, 0.9, 0.99)},
        "errors": [{"case": r.case.label(), "error": r.error} for r in results if r.error],
        "skipped": [{"case": r.case.label(), "why": r.skipped} for r in results if r.skipped],
        "cases_left_by_budget": left,
        "seconds": round(seconds, 1),
        **tables(results),
        "false_alarms": [{"case": r.case.label(), "verdict": r.verdict, "ratio": r.ratio, "spec": r.spec_why,
                          "problem": r.problem} for r in ok if r.verdict != Verdict.MATCH.value],
        "cases": [{"case": r.case.label(), "fields": dataclasses.asdict(r.case), "verdict": r.verdict, "ratio": r.ratio,
                   "seconds": r.seconds, "spec": r.spec_why, "error": r.error, "problem": r.problem,
                   "skipped": r.skipped,
                   "planted": {d: list(v) for d, v in r.planted.items()}} for r in results],
    }


def load_results(path: str) -> tuple[list[Result], int, float]:
    """The per-case results of an earlier run (its JSON), to merge shards."""
    with open(path) as f:
        doc = json.load(f)
    out = []
    for c in doc["cases"]:
        r = Result(Case(**c["fields"]), c["spec"], c["verdict"], c["ratio"], c["seconds"], c.get("error"),
                   {d: tuple(v) for d, v in c["planted"].items()}, c.get("problem"), c.get("skipped"))
        out.append(r)
    return out, doc.get("cases_left_by_budget", 0), doc.get("seconds", 0.0)


def _environment_of(path: str) -> dict:
    """A result file's environment: a run's own, or the runs of a merge (flattened)."""
    with open(path) as f:
        env = json.load(f).get("environment", {})
    return {"file": os.path.basename(path), **({"runs": env["runs"]} if "runs" in env else env)}


def not_judged(cases: list, skip_paths) -> list:
    """The cases none of the earlier runs' JSON files judged (a case that could not run is run
    again; one whose layout the engine refused is not), in order."""
    done = {dataclasses.astuple(r.case) for path in skip_paths for r in load_results(path)[0] if r.error is None}
    return [c for c in cases if dataclasses.astuple(c) not in done]


def merged(results: list) -> list:
    """Each case once: its last judged result (runs in the order given: a later run of a case, say
    after its engine's model changed, supersedes the earlier), else its last error."""
    last: dict = {}
    for r in results:
        key = dataclasses.astuple(r.case)
        if r.error is None or key not in last or last[key].error is not None:
            last[key] = r
    return list(last.values())


def write(doc: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)

"""Reports of a judgement (oracle.judging.judgement.Judgement): a human table with one closing
sentence, and a JSON document. They only print what the judgement holds: the final verdict and
kind are the judgement's, never recomputed here. An Analysis alone is told as the judgement of
its recording (`as_judgement`).

The JSON (schema `oracle.report.table/2`) is what machines read: `verdict`, `first_divergence`,
`stages` (name, teacher_forced, chained, worst_tile, details), plus the problem, inputs,
confounds (each its kind, stage, fields and sentence: oracle.run.confounds), the reference cross-check
and the environment. Version 2 made confounds objects; version 1 held their sentences.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Optional

from tabulate import tabulate

from oracle.judging import accumulation_bound
from oracle.judging.compare import Comparison, Status, TileMetrics, _num
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import Analysis, FirstDivergence, StageResult
from oracle.judging.evidence import PADDING, UNRECORDED, UPSTREAM_UNRECORDED, Feed, describe_sites, sites_json
from oracle.run.confounds import ConfoundKind
from oracle.judging.judgement import Judgement, judgement_of
from oracle.run.caller import Caller

SCHEMA = "oracle.report.table/2"


def _fmt(v: Optional[float], digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:.{digits}g}"


def _worst(st: StageResult) -> Optional[TileMetrics]:
    cands = [c.worst for c in (st.teacher_forced, st.chained) if c.worst is not None]
    if not cands:
        return None
    return max(cands, key=lambda t: (not t.passed, t.max_ratio, t.mismatches))


def _where(t: Optional[TileMetrics], attention: bool = False) -> str:
    if t is None:
        return "-"
    kb = "" if t.k_block is None else f" {'kvb' if attention else 'kb'} {t.k_block}"
    return f"({t.tile[0]}, {t.tile[1]}){kb}"


def _attention(spec) -> bool:
    return getattr(spec, "kind", "gemm") == "attention"


def _status(c: Comparison) -> str:
    return c.status.value if c.status is not Status.NOT_RUN else "-"


_FEED_SHORT = {Feed.KERNEL: "kernel", Feed.GLOBAL: "global", Feed.STAND_IN: "stand-in", Feed.REFERENCE: "reference",
               Feed.FIELDS: "fields"}
_MASK_SHORT = {PADDING: "pad", UNRECORDED: "unrec", UPSTREAM_UNRECORDED: "up-unrec"}


def _deciding(st: StageResult) -> Comparison:
    """The comparison a stage's row counts: teacher-forced when it ran, else chained."""
    return st.teacher_forced if st.teacher_forced.status is not Status.NOT_RUN or \
        st.teacher_forced.evidence.masked_total else st.chained


def _fed_by(c: Comparison) -> str:
    return "+".join(_FEED_SHORT[f] for f in c.evidence.feeds) or "-"


def _masked(c: Comparison) -> str:
    ev = c.evidence
    return " ".join(f"{n} {_MASK_SHORT[r]}" for r, n in ev.masked) or "0"


TABLE_HEADERS = ("stage", "teacher-forced", "chained", "fed by", "worst tile", "err/bound", "max |err|", "amplif.",
                 "NaN r/e", "Inf r/e", "bad/compared", "masked")


def table_headers(an: Analysis) -> list[str]:
    """The stage table's column names (an attention judgement's worst unit is not a tile)."""
    heads = list(TABLE_HEADERS)
    if _attention(an.recording.spec):
        heads[4] = "worst unit"
    return heads


def table_rows(an: Analysis) -> list[list[str]]:
    """The stage table's cells, one row per stage, as the text and the HTML report print them."""
    rows = []
    attention = _attention(an.recording.spec)
    for st in an.stages:
        w = _worst(st)
        d = _deciding(st)
        fields = f" +{len(d.fields)} fields" if d.fields else ""
        counted = d.status is not Status.NOT_RUN or d.evidence.masked_total
        rows.append([st.name, _status(st.teacher_forced), _status(st.chained),
                     _fed_by(st.teacher_forced) if st.teacher_forced.evidence.feeds else "-", _where(w, attention),
                     "exact" if w is not None and w.exact and w.passed else _fmt(w.max_ratio if w else None),
                     _fmt(w.max_abs_err if w else None), _fmt(w.amplification if w else None),
                     f"{w.nan_received}/{w.nan_expected}" if w else "-",
                     f"{w.inf_received}/{w.inf_expected}" if w else "-",
                     (f"{d.mismatches + len(d.field_mismatches)}/{d.compared}{fields}"
                      if counted else "-"),
                     _masked(d) if counted else "-"])
    return rows


def table(an: Analysis) -> str:
    return tabulate(table_rows(an), headers=table_headers(an))


def _feed_phrase(f: FirstDivergence) -> str:
    return {"kernel tap": "teacher-forced on the kernel's own taps",
            "global memory": "fed with the operand in global memory, its real input",
            "descriptor fields": "the descriptor's own fields",
            "guard band": "read from the guard bands around the buffer after the run"}.get(f.fed_by, "teacher-forced")


def as_judgement(x) -> Judgement:
    """A Judgement as it is, or an Analysis as the judgement of its recording alone."""
    return x if isinstance(x, Judgement) else judgement_of(x)


def headline(judgement) -> str:
    """One line: the final verdict and, when something diverged, where, e.g. "DIVERGED at mma,
    tile (0, 1), k-block 3, element (5, 17) (VERDICT)" (the first line of a failed assertion, so
    pytest's short summary names it)."""
    j = as_judgement(judgement)
    f = j.first
    if f is None:
        return j.verdict.value
    attention = _attention(j.analysis.recording.spec)
    field = f.field
    coordinates = (("group", f.group),
                   (f"descriptor_{field.operand}" if field else "", field.field if field else None),
                   ("unit" if attention else "tile", f.tile),
                   ("split" if attention else "partial", f.partial),
                   ("KV block" if attention else "k-block", f.k_block),
                   ("element", f.element))
    where = [f"at {f.stage}"] + [f"{name} {value}" for name, value in coordinates if value is not None]
    return f"{j.verdict.value} {', '.join(where)} ({f.kind.value})"


def sentence(judgement, caller: Caller = Caller.PYTHON) -> str:
    """The closing sentence; NONDETERMINISTIC (and then run 1's stage finding, as a DRAFT) when
    the repeated runs differ; compute-sanitizer's findings, when any, are counted at its end. What
    a VERDICT would need names options as `caller` writes them (oracle.run.caller)."""
    j = as_judgement(judgement)
    s = _sentence(j.analysis, j.races, caller)
    found = j.sanitizer.findings if j.sanitizer is not None else ()
    if found:
        tools = sorted({f.tool for f in found})
        s += (f" compute-sanitizer reported {len(found)} finding(s) in the untraced build ({', '.join(tools)}): "
              f"see its section; the stage table does not judge them.")
    return s


def _sentence(an: Analysis, races=None, caller: Caller = Caller.PYTHON) -> str:
    if races is not None and races.nondeterministic:
        s = f"NONDETERMINISTIC: {'; '.join(races.reasons())}."
        where = races.first_difference()
        if where:
            s += f" First difference: {where}."
        if races.tracing_changes and not races.changes:
            s += " The traced runs agree with each other, so the stage table below judges a run whose taps may hide " \
                 "the race."
        return s + " Run 1's stage table alone: " + _sentence(an, caller=caller)  # `an` is told as a DRAFT
    d = an.diagnosis
    if d.verdict is Verdict.DIVERGED and an.first is not None:
        f = an.first
        element = None  # the first bad element, in the problem's words
        if f.field is not None:
            where = f": {f.field.describe()}"
        elif _attention(an.recording.spec) and f.tile is not None:
            b, h, qb = an.recording.spec.unit_of(f.tile)
            where = f" at unit {f.tile} (batch {b}, query head {h}, query block {qb})" + \
                _said((", split", f.partial), (", KV block", f.k_block))
            if f.element is not None:
                from oracle.judging.attention_analysis import describe_element

                element = describe_element(an.recording.spec, f.stage, f.element)
        else:
            where = _said((" in group", f.group), (" at tile", f.tile), (", partial", f.partial),
                          (", k-block", f.k_block))
            if f.element is not None:
                element = f"element ({f.element[0]}, {f.element[1]}) [{f.element_in_tile} in the tile]"
        if element is not None:
            got = "never written" if f.unwritten else f"received {_fmt(f.received, 6)}"
            where += f", {element}: {got}, expected {_fmt(f.expected, 6)} (bound {_fmt(f.bound)})"
        if f.kind.value == "VERDICT":
            why = f"controlled inputs, {_feed_phrase(f)}"
        else:
            opened = [c.sentence for c in an.open_confounds]
            why = "; ".join(filter(None, [d.reason if not d.root_cause else "", *opened])) or \
                ("teacher-forced through reference stand-ins" if f.stand_ins else d.reason)
        s = f"First divergence: {f.stage}{where}. {f.kind.value} ({why})."
        if f.stand_ins and f.kind.value == "DRAFT" and d.root_cause:
            s += (f" {f.stage} was fed reference stand-ins for {describe_sites(f.stand_ins)}, which the kernel did not "
                  f"tap: the error may lie there.")
        if f.hint:
            s += f" Hint: {f.hint}."
        if f.missing:
            s += f" For a VERDICT it needs: {'; '.join(m.say(caller) for m in f.missing)}."
        if d.inherited:
            s += f" Inherited downstream: {', '.join(d.inherited)}."
        oob = getattr(an, "out_of_bounds", ())
        if oob and f.fed_by != "guard band":
            s += f" Also written out of bounds ({oob[0].tensor}): {'; '.join(b.describe() for b in oob)}."
        if d.unexplained:
            tiles = ", ".join(map(str, d.unexplained[:4])) + (" and others" if len(d.unexplained) > 4 else "")
            s += f" Also diverging, in tiles the root cause does not cover (not traced there): {tiles}."
        return s
    if d.verdict is Verdict.KERNEL_ERROR:
        return f"KERNEL_ERROR: {an.recording.kernel_error}. {d.reason}."
    if d.verdict is Verdict.ORACLE_UNTRUSTED:
        return f"ORACLE_UNTRUSTED: {d.reason}: {'; '.join(an.cross_check)}. The kernel is not judged."
    if d.verdict is Verdict.MATCH:
        compared = sum(_deciding(st).compared for st in an.stages)
        s = f"MATCH: {d.reason} ({compared} elements compared)."
        if an.incomplete_trace:
            s += " The trace was incomplete, so a defect in what was lost would not show: " + \
                "; ".join(c.sentence for c in an.incomplete_trace) + "."
        if an.unobserved:
            s += " Not seen: " + "; ".join(an.unobserved) + "."
        return s
    return f"{d.verdict.value}: {d.reason}."


def _said(*parts: tuple[str, object]) -> str:
    """Each "label value" whose value is not None, in order."""
    return "".join(f"{label} {value}" for label, value in parts if value is not None)


def races_section(races=None, sanitizer=None) -> list[str]:
    """The repeat / poison / sanitizer results, beside the stage table (never in it)."""
    lines = []
    if races is not None:
        poison = "" if races.poison is None else \
            f", shared memory poisoned with {races.poison[0]:#010x} and {races.poison[1]:#010x}"
        head = (f"repeat: {races.traced_runs} traced and {races.untraced_runs} untraced run(s) on the same inputs"
                f"{poison}: ")
        if not races.nondeterministic:
            lines.append(head + "every output and tap is bit for bit the same")
        else:
            lines.append(head + "they differ")
            for c in races.changes:
                lines.append(f"  runs differ: {c.describe()}")
            for c in races.tracing_changes:
                lines.append(f"  tracing changes the result: {c.describe()}")
            for c in races.poison_changes:
                lines.append(f"  reads never-written shared memory: {c.describe()}")
            if races.failed:
                lines.append(f"  did not complete: {', '.join(races.failed)}")
        for run, finding in races.finding_runs:
            lines.append(f"  {run}: {finding}")
        if races.poison_note:
            lines.append(f"  poison: {races.poison_note}")
    if sanitizer is not None:
        found = sanitizer.describe()
        lines.append("compute-sanitizer (untraced build):" + (" " + found[0] if sanitizer.unavailable else ""))
        if not sanitizer.unavailable:
            lines.extend(f"  {x}" for x in found)
    return lines


def render(judgement, caller: Caller = Caller.PYTHON) -> str:
    """The report: header, stage table, notes, the race section, the closing sentence and, when the
    kernel was timed, the performance table. When the repeated runs differ, the stage finding is
    told as a DRAFT (the judgement's `analysis`). Advice is spelt for `caller`."""
    j = as_judgement(judgement)
    an, races, sanitizer = j.analysis, j.races, j.sanitizer
    rec = an.recording
    lines = []
    if rec.synthetic:
        lines.append("SYNTHETIC: this recording was made by a Python model of a kernel with an injected defect, "
                     "not by a real kernel.")
    lines.append(f"kernel {rec.kernel}: {rec.spec.describe()}; inputs {rec.provenance.describe()}; "
                 f"references on {an.device}")
    spec = rec.spec
    if _attention(spec):
        lines.append(f"numerics: {_numerics(spec)}")
    elif spec.acc_model is not None or spec.reduction != "none" or spec.activation_impl != "accurate":
        lines.append(f"numerics: {accumulation_bound.describe(spec)}")
    if an.groups:
        lines.append(f"grouped run ({an.whole.spec.describe()}, {len(an.groups)} groups); the stages below are "
                     f"group {an.group}'s:")
        lines.extend(f"  {o.describe()}" for o in an.groups)
    lines.append("")
    lines.append(table(an))
    lines.append("")
    lines.extend(f"{label}: {text}" for label, text in findings_lines(an))
    extra = races_section(races, sanitizer)
    if extra:
        lines.append("")
        lines.extend(extra)
    lines.append(sentence(j, caller))
    if j.performance is not None:
        lines.extend(["", performance_table(j.performance)])
    return "\n".join(lines)


def findings_lines(an: Analysis) -> list[tuple[str, str]]:
    """The lines below the stage table, as (label, text): confounds handled and open, what was
    assumed, elements not recorded, the first NaN/Inf, and the notes (how the diverging stage was
    fed, and any stage that has something to say)."""
    lines = [("handled", c.sentence) for c in an.handled_confounds]
    lines += [("confound", c.sentence) for c in an.open_confounds]
    opened = {c.field("boundary") for c in an.open_confounds if c.kind is ConfoundKind.ASSUMED_BOUNDARY}
    lines += [("assumed, not observed", c) for c in an.assumed if c not in opened]
    for st in an.stages:  # elements a comparison could not see because the kernel did not record them
        for label, c in (("teacher-forced", st.teacher_forced), ("chained", st.chained)):
            ev = c.evidence
            if ev.masked_count(UNRECORDED) or ev.masked_count(UPSTREAM_UNRECORDED):
                lines.append(("masked", f"{st.name} {label}: {c.compared} compared; not compared: "
                                        f"{ev.describe_masked()}"))
    if an.first_nonfinite:
        lines.append(("first NaN/Inf", an.first_nonfinite.describe()))
    notes = list(an.recording.notes)
    for st in an.stages:
        for c in (st.teacher_forced, st.chained):
            notes.extend(c.all_notes if st.name == an.diagnosis.stage else c.notes)
    lines += [("note", n) for n in dict.fromkeys(notes)]
    return lines


def _numerics(spec) -> str:
    """The bound model's line: the GEMM's accumulation model, or attention's output model."""
    if _attention(spec):
        from oracle.judging.attention_tolerance import describe

        return describe(spec)
    return accumulation_bound.describe(spec)


def _first_json(f: Optional[FirstDivergence], caller: Caller) -> Optional[dict]:
    if f is None:
        return None
    return {"stage": f.stage, "tile": list(f.tile) if f.tile is not None else None, "k_block": f.k_block,
            "element": list(f.element) if f.element else None,
            "element_in_tile": list(f.element_in_tile) if f.element_in_tile else None,
            "received": _num(f.received), "expected": _num(f.expected), "bound": _num(f.bound),
            "kind": f.kind.value, "comparison": f.comparison, "hint": f.hint, "fed_by": f.fed_by or None,
            "stand_ins": sites_json(f.stand_ins), "field": f.field.to_json() if f.field else None,
            "untraced_tiles": [list(t) for t in f.untraced], "rerun": f.rerun, "unwritten": f.unwritten,
            "missing": [m.say(caller) for m in f.missing], "partial": f.partial, "group": f.group, "assumed": list(f.assumed)}


def to_json(judgement, extra: Optional[dict[str, Any]] = None, caller: Caller = Caller.PYTHON) -> dict:
    """The report as JSON; the races, the sanitizer, the kernel's run and its timings become keys of
    their own beside `stages`; `extra` adds keys (a caller's own); advice is spelt for `caller`."""
    j = as_judgement(judgement)
    an, races, sanitizer = j.analysis, j.races, j.sanitizer
    rec = an.recording
    stages = []
    for st in an.stages:
        w = _worst(st)
        d = _deciding(st)
        stages.append({"name": st.name, "teacher_forced": st.teacher_forced.status.value,
                       "chained": st.chained.status.value, "fed_by": [f.value for f in st.teacher_forced.evidence.feeds],
                       "compared": d.compared, "masked": dict(d.evidence.masked),
                       "worst_tile": w.to_json() if w else None,
                       "details": {"teacher_forced": st.teacher_forced.to_json(),
                                   "chained": st.chained.to_json()}})
    doc = {
        "schema": SCHEMA,
        "verdict": j.verdict.value,
        "summary": sentence(j, caller),
        "first_divergence": _first_json(an.first, caller),
        "stages": stages,
        "problem": (an.whole or rec).spec.to_json(),
        "numerics": _numerics(rec.spec),
        "kernel": {"name": rec.kernel, "error": rec.kernel_error},
        "inputs": {"ladder": rec.provenance.ladder, "seed": rec.provenance.seed, "source": rec.provenance.source,
                   "controlled": rec.provenance.controlled},
        "synthetic": rec.synthetic,
        "confounds": {"open": [c.to_json() for c in an.open_confounds],
                      "handled": [c.to_json() for c in an.handled_confounds]},
        "notes": list(rec.notes),
        "unobserved": list(an.unobserved),
        "group": an.group,
        "groups": [{"group": o.group, "row0": o.row0, "rows": o.rows,
                    "verdict": o.verdict.value if o.verdict else None, "stage": o.stage, "kind": o.kind,
                    "untapped": o.untapped,
                    **({} if o.k_range is None else {"k0": o.k_range[0], "k": o.k_range[1]})}  # K-grouped: its K slice
                   for o in an.groups],
        "trace": rec.trace.to_json() if rec.trace is not None else None,
        "cross_check": {"ok": not an.cross_check, "problems": list(an.cross_check)},
        "first_nonfinite": an.first_nonfinite.to_json() if an.first_nonfinite else None,
        "reference_device": an.device,
        "environment": dict(rec.environment),
        "phases_ms": {name: round(ms, 3) for name, ms in an.phases},
    }
    if races is not None:
        doc["races"] = {**races.to_json(), "stage_verdict": j.stage_analysis.verdict.value}
    if sanitizer is not None:
        doc["sanitizer"] = sanitizer.to_json()
    if j.source:
        doc["source"] = j.source
    if j.phases_s:
        doc["phases_s"] = dict(j.phases_s)
    if j.kernel_run is not None:
        doc["run"] = j.kernel_run.to_json()
    if j.performance is not None:
        doc["performance"] = j.performance.to_json()
    if extra:
        doc.update(extra)
    return doc


SCHEMA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema.json")


def schema() -> dict:
    """The JSON Schema of a report (oracle/report/schema.json, shipped with the package)."""
    with open(SCHEMA_PATH) as f:
        return json.load(f)


@functools.lru_cache(maxsize=4)
def _checked_validator(schema_text: str):
    """A validator of the schema `schema_text`, checked against its metaschema once, not per document
    (jsonschema.validate checks the schema again at every call: tens of milliseconds each)."""
    import jsonschema

    doc = json.loads(schema_text)
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError if `doc` is not an oracle.report.table/2 document (needs jsonschema);
    the error is the one jsonschema.validate would raise (its best match)."""
    import jsonschema

    with open(SCHEMA_PATH) as f:
        validator = _checked_validator(f.read())
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        raise error


def write_json(judgement, path: str, extra: Optional[dict[str, Any]] = None,
               caller: Caller = Caller.PYTHON) -> None:
    """The report as JSON at `path`, written whole, never through a link (harness.output_files)."""
    from harness.output_files import write_text_atomically

    text = json.dumps(to_json(judgement, extra, caller), indent=2, allow_nan=False, default=str) + "\n"
    write_text_atomically(path, text, "JSON report")


def performance_table(perf) -> str:
    """Times of both paths; `speed` is the peer's time over the kernel's (>1: the kernel is faster)."""
    ratios = perf.ratios()
    rows = [[p.name, f"{p.median_ms:.4g}",
             f"{p.median_ci_ms[0]:.4g}-{p.median_ci_ms[1]:.4g}" if p.median_ci_ms else "-", f"{p.tflops:.4g}",
             f"{ratios[p.name]:.3g}" if p.name in ratios else "-", p.reps, f"{p.rse:.2%}", p.mode, p.note]
            for p in perf.paths]
    out = tabulate(rows, headers=["path", "median ms", "95% interval", "TFLOP/s", "kernel speed vs", "reps", "rse",
                                  "timed by", "note"])
    return out + "".join(f"\nnote: {n}" for n in perf.notes)

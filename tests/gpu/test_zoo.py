"""The bug zoo on the GPU: every entry of tests/zoo/manifest.json, run live and judged.

For each entry: the case with the entry's problem overrides, its traced entry point and trace
selection, controlled random inputs with the entry's seed, one live run, then the differential.
A correct variant (and a harmless defect) must MATCH with every tapped stage compared; a defective
one must be DIVERGED at the stage the manifest names, with nothing upstream of it diverging. An
entry with `record_problem` is also run (and judged) at that smaller shape, which is the one
recorded. With ORACLE_ZOO_RECORD_DIR set, the recorded run is saved there under the file name of
the entry's `dump` before it is judged (so a failing run is kept too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from zoo_cases import check_judgement, entries, entry_case, tapped_stages  # tests/ is on sys.path

from oracle import knobs as oracle_knobs
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.run.live import run_live

pytestmark = pytest.mark.gpu


def _run(entry, problem):
    case = entry_case(entry, problem)
    seed = entry.get("seed", 0)
    live = run_live(case, make_operands(case.spec, "random", seed), Provenance("random", seed), timeout_s=120)
    return case, live


@pytest.mark.parametrize("entry", entries(), ids=lambda e: e["name"])
def test_zoo_variant_is_judged_as_the_manifest_says(entry):
    runs = [entry["problem"]] + ([entry["record_problem"]] if "record_problem" in entry else [])
    for i, problem in enumerate(runs):
        case, live = _run(entry, problem)
        rec = live.recording
        record_dir = oracle_knobs.ZOO_RECORD_DIR.get()
        if record_dir and i == len(runs) - 1:
            out = Path(record_dir).expanduser()
            out.mkdir(parents=True, exist_ok=True)
            rec.save(str(out / Path(entry["dump"]).name))
        assert live.run.ok, live.run.describe() + "\n" + live.run.stderr_tail
        assert rec.trace is not None and rec.trace.complete, rec.notes
        want = tapped_stages(case)
        assert want <= {t.stage for t in rec.taps}, (sorted(want - {t.stage for t in rec.taps}), problem)
        check_judgement(entry["expected_stage"], case, analyze(rec), entry)

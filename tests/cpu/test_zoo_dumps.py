"""The bug zoo offline: every recorded trace of tests/zoo/manifest.json, judged without a GPU.

Each dump was recorded on the H200 by tests/gpu/test_zoo.py (ORACLE_ZOO_RECORD_DIR); here the
offline differential (Triton under the interpreter) must reach the judgement the manifest names,
the same one the live run reached, so CI guards localisation. A missing dump is a failure.
"""

from __future__ import annotations

import pytest
from zoo_cases import ROOT, check_judgement, entries, entry_case, tapped_stages  # tests/ is on sys.path

from oracle.differential import analyze
from oracle.recording import Recording

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("entry", entries(), ids=lambda e: e["name"])
def test_recorded_zoo_trace_is_judged_as_the_manifest_says(entry):
    path = ROOT / entry["dump"]
    assert path.is_file(), f"{entry['dump']} is missing: record it on the GPU (tests/gpu/test_zoo.py)"
    rec = Recording.load(str(path))
    case = entry_case(entry, entry.get("record_problem") or entry["problem"])
    assert rec.spec == case.spec, "the dump was recorded for another problem than the manifest's"
    assert tapped_stages(entry, case) <= {t.stage for t in rec.taps}
    check_judgement(entry, case, analyze(rec))

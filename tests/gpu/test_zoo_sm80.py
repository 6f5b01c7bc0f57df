"""The bug zoo on the GPU: every sm80 GEMM variant of tests/zoo/manifest.json, run live and judged.

For each entry of zoo/sm80_gemm/sm80_gemm.cu: the case with the entry's problem overrides, the
entry's traced entry point, controlled random inputs with the entry's seed, one live run (the
default trace selection: first, middle and last tile, every k-block), then the differential.
A correct variant (and a harmless defect) must MATCH with every tapped stage compared; a defective
one must be DIVERGED with the first divergent stage the manifest names and nothing upstream of
it diverging. With ORACLE_ZOO_RECORD_DIR set, every recording is saved there under the file name
of the entry's `dump`, before it is judged (so a failing run is kept too).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle import knobs as oracle_knobs
from harness.taps import STAGES
from oracle.case import load_case
from oracle.compare import Status
from oracle.diagnose import Verdict
from oracle.differential import analyze
from oracle.inputs import Provenance, make_operands
from oracle.live import run_live

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "zoo" / "manifest.json"
SOURCE = "zoo/sm80_gemm/sm80_gemm.cu"
TAPPED = {"load_a", "load_b", "mma", "epilogue_alpha_beta", "epilogue_bias", "epilogue_activation", "epilogue_cast"}

RECORD_DIR = oracle_knobs.ZOO_RECORD_DIR


def _entries() -> list[dict]:
    with open(MANIFEST) as f:
        return [e for e in json.load(f) if e["kernel"].partition(":")[0] == SOURCE]


def _table(an) -> dict:
    return {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_zoo_sm80_variant_is_judged_as_the_manifest_says(entry):
    src, _, fn = entry["kernel"].partition(":")
    case = load_case(str(ROOT / entry["case"]), entry["problem"], source=str(ROOT / src), entry=fn)
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    live = run_live(case, ops, Provenance("random", seed), timeout_s=120)
    rec = live.recording
    record_dir = Path(RECORD_DIR.get()).expanduser() if RECORD_DIR.get() else None
    if record_dir is not None:
        record_dir.mkdir(parents=True, exist_ok=True)
        rec.save(str(record_dir / Path(entry["dump"]).name))
    assert live.run.ok, live.run.describe() + "\n" + live.run.stderr_tail
    assert not any("dropped" in note for note in rec.notes), rec.notes
    assert TAPPED <= {t.stage for t in rec.taps}, sorted({t.stage for t in rec.taps})

    an = analyze(rec)
    table = _table(an)
    assert not an.cross_check, an.cross_check
    want = entry["expected_stage"]
    if want is None:
        assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, an.first, table)
        forced = {s.name for s in an.stages if s.teacher_forced.status is Status.MATCH}
        chained = {s.name for s in an.stages if s.chained.status is Status.MATCH}
        # loads have no shared-memory image to be teacher-forced from (cp.async, no TMA)
        assert (TAPPED - {"load_a", "load_b"}) | {"epilogue_store"} <= forced, table
        assert {"load_a", "load_b", "mma", "epilogue_store"} <= chained, table
        if entry["problem"]["m"] < case.spec.tile.bm:
            assert an.handled_confounds, "rows past M were compared: the padding confound was not handled"
        return
    assert an.verdict is Verdict.DIVERGED, (an.diagnosis.reason, table)
    assert an.first.stage == want, (an.first, an.diagnosis.reason, table)
    upstream = [s for s in an.stages if STAGES.index(s.name) < STAGES.index(want)]
    assert all(Status.MISMATCH not in (s.teacher_forced.status, s.chained.status) for s in upstream), table

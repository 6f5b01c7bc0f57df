"""The zoo's attention kernels on the GPU (the FlashAttention-2-style zoo/fa2_sm80, the
FlashAttention-3-style zoo/fa3_sm90, any other): every attention entry of tests/zoo/manifest.json
run live and judged.

For each entry: its case with the entry's problem overrides, traced entry point and
trace selection, controlled random inputs with the entry's seed, one live run through the request
path (oracle.run.execute: the traced build, the sink, the combine after a split), then the
attention differential. A correct variant must MATCH with every tapped stage compared,
teacher-forced and chained; a defective one must be DIVERGED at the stage the manifest names, as a
VERDICT, with every stage before it matching. An entry with `record_problem` is also run (and
judged) at that smaller shape, which is the one recorded. With ORACLE_ZOO_RECORD_DIR set the
recorded run is saved there under the file name of the entry's `dump` before it is judged (commit
it and drop the entry's dump_pending: tests/cpu/test_zoo_dumps_attention.py then replays it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from zoo_cases import attention_entry_case, attention_tapped_stages, check_attention_judgement, entries  # tests/ on sys.path

from oracle import knobs as oracle_knobs
from oracle.judging.attention_analysis import analyze_attention
from oracle.run.execute import run
from oracle.run.request import RunRequest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("entry", entries(kind="attention"), ids=lambda e: e["name"])
def test_attention_zoo_variant_is_judged_as_the_manifest_says(entry):
    runs = [entry["problem"]] + ([entry["record_problem"]] if "record_problem" in entry else [])
    for i, problem in enumerate(runs):
        case = attention_entry_case(entry, problem)
        rec = run(RunRequest(case=case, inputs=f"random:{entry.get('seed', 0)}", timeout_s=300)).recording
        record_dir = oracle_knobs.ZOO_RECORD_DIR.get()
        if record_dir and i == len(runs) - 1:
            out = Path(record_dir).expanduser()
            out.mkdir(parents=True, exist_ok=True)
            rec.save(str(out / Path(entry["dump"]).name))
        assert rec.kernel_error is None, rec.kernel_error
        assert rec.trace is not None and rec.trace.complete, rec.notes
        want = attention_tapped_stages(case)
        assert want <= {t.stage for t in rec.taps}, (sorted(want - {t.stage for t in rec.taps}), problem)
        check_attention_judgement(entry["expected_stage"], case, analyze_attention(rec), entry)

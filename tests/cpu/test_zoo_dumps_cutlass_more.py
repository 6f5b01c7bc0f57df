"""The bug zoo offline, CUTLASS's batched, grouped, blockwise-scaled and stream-K kernels' recorded traces (tests/cpu/test_zoo_dumps.py: the rule)."""

import pytest
from zoo_cases import dump_entries, judge_recorded_dump  # tests/ is on sys.path

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("entry", dump_entries("cutlass_more"), ids=lambda e: e["name"])
def test_recorded_zoo_trace_is_judged_as_the_manifest_says(entry):
    judge_recorded_dump(entry)

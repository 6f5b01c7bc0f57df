"""The bug zoo offline, the attention kernels' recorded traces (zoo/fa2_sm80 and zoo/fa3_sm90;
tests/cpu/test_zoo_dumps.py: the rule). Their entries were added without a GPU (`dump_pending`): each is skipped, saying how to
record it, until its dump is committed. Meanwhile the judgement each entry expects is held to the
CPU model of the same kernel (oracle.run.attention_model, whose planted defects carry the zoo's
defect names) at the entry's recorded shape, blocks and traced site: the manifest asks of the
kernel what the oracle says of the model. Once an entry's dump is committed, its recording is judged
instead (each model defect's own stage: tests/cpu/test_attention_model.py)."""

import pytest
from zoo_cases import ROOT, attention_entry_case, check_attention_judgement, dump_entries, judge_recorded_dump  # tests/ on sys.path

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("entry", dump_entries("attention"), ids=lambda e: e["name"])
def test_recorded_zoo_trace_is_judged_as_the_manifest_says(entry):
    judge_recorded_dump(entry)


def _model_analysis(entry: dict):
    from harness.taps import ATTENTION_TAP_STAGES
    from oracle.judging.attention_analysis import analyze_attention
    from oracle.run.attention_inputs import make_attention_operands
    from oracle.run.attention_model import Injection, PagedKV
    from oracle.run.attention_recording import model_recording

    case = attention_entry_case(entry, entry.get("record_problem") or entry["problem"])
    s = case.spec
    ops = make_attention_operands(s, "random", entry.get("seed", 0))
    args = dict(causal=s.causal, block_q=s.block_q, block_kv=s.block_kv, splits=s.splits, sites=case.trace.tiles,
                stages=ATTENTION_TAP_STAGES if s.splits > 1 else tuple(x for x in ATTENTION_TAP_STAGES
                                                                        if x != "combine"),
                injection=Injection(entry["defect"]) if entry["defect"] else None)
    if s.paged:
        paged = PagedKV(ops.k, ops.v, ops.page_table, s.seqlen_k)
        return case, analyze_attention(model_recording(ops.q, None, None, ops.provenance, paged=paged, **args))
    return case, analyze_attention(model_recording(ops.q, ops.k, ops.v, ops.provenance, **args))


@pytest.mark.parametrize("entry", [e for e in dump_entries("attention") if "record_problem" not in e],
                         ids=lambda e: e["name"])
def test_the_model_of_the_kernel_is_judged_as_the_manifest_says(entry):
    if (ROOT / entry["dump"]).is_file():
        pytest.skip("The entry's dump is committed: its recording, the kernel's own, is judged instead.")
    case, an = _model_analysis(entry)
    check_attention_judgement(entry["expected_stage"], case, an, entry)

"""Attention case files ([problem] kind = "attention") read and checked without a GPU, and the launches
a live attention run makes of one (oracle.run.launch.launch_sequence): every argument in the case's
order, the grid evaluated, the buffers shaped as the problem says. Bad cases are refused with a
CaseError naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from attention_cases import ENTRY, case_text, write_case  # tests/ is on sys.path
from harness.launch import ScalarArg, TensorArg
from oracle.run.attention_inputs import make_attention_operands
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.run.launch import launch_sequence
from oracle.run.sink import check_case


def load_attention_case(path, overrides=()):
    """A case loaded and checked as a live run checks it before anything is built."""
    case = load_case(path, overrides)
    check_case(case)
    return case

ROOT = Path(__file__).resolve().parents[2]
FA2 = ROOT / "zoo" / "fa2_sm80"

BASE = case_text("""
batch = 1
heads_q = 2
heads_kv = 1
seqlen_q = 70
seqlen_k = 90
head_dim = 64
""", ["q", "k", "v", "o", "lse", "seqlen_k", "softmax_scale"])


def test_a_plain_attention_case_loads(tmp_path):
    case = load_attention_case(write_case(tmp_path, BASE))
    assert case.spec.kind == "attention" and case.spec.q_blocks == 2 and case.kernel.entry == ENTRY
    assert [a.name for a in case.launch.args][:5] == ["q", "k", "v", "o", "lse"]


@pytest.mark.parametrize("change, named", [
    (('"lse", "seqlen_k"', '"lse", "m", "seqlen_k"'), "args[5] = 'm' is unknown; operands q, k, v"),
    (('kind = "attention"', 'kind = "gemm"'), "batch"),
    (('head_dim = 64', 'head_dim = 64\nheads_kv = 3'), None),  # TOML: a key twice is not TOML
    (('heads_kv = 1', 'heads_kv = 3'), "heads_kv"),
    (('grid = ["q_blocks"', 'grid = ["q_blocks - 2"'), "grid[0]"),
])
def test_a_bad_attention_case_is_refused_naming_the_key(tmp_path, change, named):
    old, new = change
    with pytest.raises(CaseError) as e:
        load_attention_case(write_case(tmp_path, BASE.replace(old, new)))
    if named is not None:
        assert named in str(e.value), str(e.value)


@pytest.mark.parametrize("trace, named", [
    ("tiles = [[2, 0]]", r"outside the problem's 2 query block\(s\)"),
    ("k_blocks = [2]", r"k-block 2 is past the problem's 2 KV block\(s\)"),
    ('stages = ["mma"]', "not a stage of this attention problem"),
])
def test_a_trace_outside_the_problem_is_refused(tmp_path, trace, named):
    with pytest.raises(CaseError, match=named):
        load_attention_case(write_case(tmp_path, BASE + f"\n[trace]\n{trace}\n"))


@pytest.mark.parametrize("name", ["fa2_sm80.toml", "split.toml", "paged.toml"])
def test_the_launches_of_a_zoo_case_follow_its_arguments(name):
    case = load_attention_case(str(FA2 / name), {"batch": 2})
    s = case.spec
    ops = make_attention_operands(s, "random", 1)
    seq, tensors = launch_sequence(case, ops)
    assert [e for e, _ in seq] == [case.kernel.entry] + [p.entry for p in case.launch.next]
    first = seq[0][1]
    assert first.grid == (s.q_blocks, s.heads_q, s.batch * s.splits)
    assert first.block == (128, 1, 1) and first.shared_mem_bytes == 27648
    kinds = [type(a) for a in first.args]
    assert kinds[:3] == [TensorArg] * 3 and [a.name for a in first.args[:3]] == ["q", "k", "v"]
    scalars = {a.value for a in first.args if isinstance(a, ScalarArg)}
    assert {s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k, float(s.softmax_scale)} <= scalars
    assert tuple(tensors["o"].shape) == (s.batch, s.seqlen_q, s.heads_q, s.head_dim_v)
    assert tuple(tensors["lse"].shape) == (s.batch, s.heads_q, s.seqlen_q)
    if s.paged:
        assert "page_table" in [a.name for a in first.args if isinstance(a, TensorArg)]
        assert tuple(tensors["page_table"].shape) == (s.batch, s.max_pages)
    if s.splits > 1:
        assert tensors["ws_o_partial"].numel() == s.splits * s.batch * s.heads_q * s.seqlen_q * s.head_dim * 4
        (_, combine), = seq[1:]
        assert combine.grid == (s.q_blocks, s.heads_q, s.batch) and combine.shared_mem_bytes == 0
        assert [a.name for a in combine.args[:4]] == ["ws_o_partial", "ws_lse_partial", "o", "lse"]
        assert [a.role for a in combine.args[:4]] == ["inout", "inout", "out", "out"]

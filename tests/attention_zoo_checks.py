"""Checks shared by the attention zoo kernels' CPU tests (tests/cpu/test_zoo_build_attention.py for
zoo/fa2_sm80, test_zoo_build_fa3.py for zoo/fa3_sm90): the planted defects every attention zoo
kernel carries, and the manifest held to its source's defect defines and its correct variants."""

from __future__ import annotations

import re
from pathlib import Path

from zoo_cases import ROOT, attention_entry_case, entries

# every attention zoo kernel plants these, each by a ZOO_<PREFIX>_<DEFECT> define (attention_model's names)
DEFECTS = ("kv_tail_not_zeroed", "causal_off_by_one", "max_not_updated_before_rescale", "l_summed_before_rescale",
           "p_wrong_type", "v_read_with_k_layout", "split_merge_without_max", "empty_row_divided_by_zero",
           "gqa_head_modulo", "page_table_off_by_one")


def kernel_entries(folder: str) -> list[dict]:
    """The manifest's attention entries of zoo/`folder`/."""
    return entries(f"zoo/{folder}/", kind="attention")


def check_builds(builds: dict, folder: str, entries_: set[str]) -> None:
    """The traced build holds every entry point and its `_traced` twin (every one the manifest names),
    the plain build the untraced ones only; each untraced entry's SASS is the same in both, each
    traced one differs; no untraced function spills or uses a stack."""
    from cuda_tools import assert_every_entry_traced_and_plain, assert_no_spills, assert_tracing_compiled_out

    assert_every_entry_traced_and_plain(builds, entries_, {e["kernel"].partition(":")[2] for e in kernel_entries(folder)})
    assert_tracing_compiled_out(builds, sorted(entries_), sorted(entries_))
    assert_no_spills(builds["plain"])


def check_manifest(folder: str, source: Path, prefix: str, correct: set[str]) -> None:
    """The manifest holds each defect the source plants (its ZOO_<prefix>_<DEFECT> flags, declared by
    zoo/common/attention_defects.cuh) once, each in its own case defining exactly its macro, and the
    `correct` entry points without one; every entry's recording is committed, and a split or paged
    entry runs a split or paged problem."""
    assert f"ZOO_ATTN_DEFECT_FLAGS(ZOO_{prefix})" in source.read_text()
    header = (source.parents[1] / "common" / "attention_defects.cuh").read_text()
    macros = set(re.findall(r"ZOO_IS_SET\(P##_([A-Z0-9_]+)\)", header))
    assert macros == {d.upper() for d in DEFECTS}
    doc = kernel_entries(folder)
    assert sorted(e["defect"] for e in doc if e["defect"]) == sorted(DEFECTS)
    assert correct <= {e["kernel"].partition(":")[2] for e in doc if e["defect"] is None}
    for e in doc:
        assert (ROOT / e["dump"]).is_file() and not e.get("dump_pending"), f"{e['name']}: its recording is committed"
        case = attention_entry_case(e)
        defines = dict(case.kernel.defines)
        if e["defect"] is None:
            assert e["expected_stage"] is None and not defines, e["name"]
        else:
            assert e["case"] == f"zoo/{folder}/defects/{e['defect']}.toml", e["name"]
            assert defines == {f"ZOO_{prefix}_{e['defect'].upper()}": "1"}, (e["name"], defines)
        assert (case.spec.splits > 1) == ("_split_" in case.kernel.entry), e["name"]
        assert case.spec.paged == ("_paged_" in case.kernel.entry), e["name"]


def check_case_file(path: Path, prefix: str, threads: int, smem_bytes) -> object:
    """The case file loads with a launch that fits the kernel zoo_<prefix>: its traced entry point (and
    the untraced one beside it) of the problem's dtype and head dim, 64 x 64 blocks, `threads` threads,
    `smem_bytes(head_dim)` of shared memory, and the combine after a split. Returns the case."""
    from oracle.run.case import load_case

    case = load_case(str(path))
    s = case.spec
    m = re.fullmatch(rf"zoo_{prefix}_(split_|paged_)?(bf16|fp16)_d(64|128)_traced", case.kernel.entry)
    assert m, case.kernel.entry
    assert case.kernel.untraced_entry == case.kernel.entry.removesuffix("_traced")
    assert (m.group(2), int(m.group(3))) == (s.q_dtype, s.head_dim) and s.head_dim_v == s.head_dim
    assert (s.block_q, s.block_kv) == (64, 64)
    assert case.launch.block == (threads, 1, 1)
    assert case.launch.shared_mem_bytes == smem_bytes(s.head_dim)
    if s.splits > 1:
        (combine,) = case.launch.next
        assert combine.entry == f"zoo_{prefix}_combine_{m.group(2)}_d{m.group(3)}_traced"
        assert combine.block == (128, 1, 1)
        assert [a.name for a in combine.args][:2] == ["o_partial", "lse_partial"]
    else:
        assert not case.launch.next
    return case


def check_stages_named(folder: str) -> None:
    """Each defect entry names the stage its defect changes first (attention_model.INJECTION_STAGE)."""
    from oracle.run.attention_model import INJECTION_STAGE, Injection

    for e in kernel_entries(folder):
        if e["defect"] is not None:
            assert e["expected_stage"] == INJECTION_STAGE[Injection(e["defect"])], e["name"]

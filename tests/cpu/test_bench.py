import pytest

from oracle.tools.bench import BenchCase, load_cases, parse_shard, shard
from oracle.run.case import CaseError
from oracle.tools.cli import main


def test_shipped_case_list_loads_and_shards():
    cases = load_cases("benchmarks/cases_simple_gemm.toml")
    assert len(cases) == 5 and cases[3].entry == "simple_gemm_fp16_traced"
    assert cases[0].overrides == {"m": 200, "n": 136, "k": 72}
    parts = [shard(cases, i, 2) for i in range(2)]
    assert [c.name for c in parts[0]] == [cases[0].name, cases[2].name, cases[4].name]
    assert sorted(c.name for p in parts for c in p) == sorted(c.name for c in cases)
    assert not set(c.name for c in parts[0]) & set(c.name for c in parts[1])


@pytest.mark.parametrize("text", ["3/2", "a/b", "1", "-1/2", "0/0"])
def test_bad_shards_are_refused(text):
    with pytest.raises(CaseError):
        parse_shard(text)


def test_bad_case_files_are_named(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[[case]]\nname = 'x'\nflavour = 1\n")
    with pytest.raises(CaseError, match="unknown key"):
        load_cases(str(p))
    p.write_text("[[case]]\nname = 'x'\n")
    with pytest.raises(CaseError, match="no live case file"):
        load_cases(str(p))
    p.write_text("[defaults]\ncase = 'a.toml'\n[[case]]\nname = 'x'\n[[case]]\nname = 'x'\n")
    with pytest.raises(CaseError, match="duplicate"):
        load_cases(str(p))


def test_a_broken_case_is_a_row_and_exit_2(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text("[defaults]\ncase = 'missing.toml'\n[[case]]\nname = 'x'\n")
    assert main(["bench", "--cases", str(p), "--workers", "1", "--jsonl", str(tmp_path / "r.jsonl")]) == 2
    line = (tmp_path / "r.jsonl").read_text().splitlines()[0]
    assert '"verdict": "ERROR"' in line and "environment" in line


def test_zoo_case_list_loads_with_its_trace_selection():
    cases = {c.name: c for c in load_cases("benchmarks/cases_zoo.toml")}
    assert len(cases) == 6
    big = cases["hopper-bf16-4096"]
    assert big.overrides == {"m": 4096, "n": 4096, "k": 4096} and big.trace_k_blocks == (0, 1, 32, 63)
    assert cases["hopper-bf16-ragged-1000x1000x2048"].trace_k_blocks == (0, 1, 16, 31)  # from [defaults]
    assert cases["hopper-e4m3-block-2048"].entry == "zoo_hopper_e4m3_block_traced"
    from oracle.run.case import load_case

    for c in cases.values():  # every case makes a valid problem for its kernel
        spec = load_case(c.case, c.overrides, entry=c.entry).spec
        assert max(c.trace_k_blocks) < spec.k_blocks, c.name


def test_bad_trace_selections_are_named(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[[case]]\ncase = 'a.toml'\ntrace_tiles = [1, 2]\n")
    with pytest.raises(CaseError, match="case #0: trace tiles must be a list"):
        load_cases(str(p))
    p.write_text("[[case]]\ncase = 'a.toml'\ntrace_k_blocks = [-1]\n")
    with pytest.raises(CaseError, match="case #0: trace k_blocks must be"):
        load_cases(str(p))

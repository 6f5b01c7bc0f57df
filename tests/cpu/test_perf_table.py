"""The results table of docs/benchmarks.md is what benchmarks/perf_table.py makes from the committed
results files (a new file without the table regenerated fails here); the provenance stamp of
benchmarks/provenance.py has every field on the CPU, each null with its reason; a field a results
file lacks reads "not recorded"; every script that writes results stamps them."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

import bench_scripts  # tests/ is on sys.path
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter

ROOT = Path(bench_scripts.ROOT)
sys.path.insert(0, str(ROOT))

from benchmarks import provenance  # noqa: E402

perf_table = bench_scripts.load("perf_table")


def _stamp(**kw):
    args = dict(seeds={"inputs": 7}, peer=provenance.Peer("cuBLAS: torch.matmul", "cuBLAS ms / Triton ms"),
                timing=provenance.Timing("CUDA events", "10 ms", "20 reps", "median"))
    args.update(kw)
    return provenance.stamp(str(ROOT / "benchmarks" / "gemm_bench.py"), ["--out", "x.json"], **args)


def test_the_page_holds_the_table_the_committed_files_give():
    page = perf_table.PAGE.read_text()
    assert perf_table.page_with_table(page, perf_table.table()) == page, \
        "docs/benchmarks.md's table is stale: run python benchmarks/perf_table.py"


def test_every_committed_results_file_has_a_row():
    text = perf_table.table()
    for p in perf_table.results_files():
        assert f"`{p.name}`" in text, p.name


def test_a_new_results_file_makes_the_page_stale(tmp_path):
    for p in perf_table.results_files():
        shutil.copy(p, tmp_path / p.name)
    doc = {"machine": {"gpu": "NVIDIA H200"}, "rows": [
        {"dtype": "bf16", "M": 4096, "N": 4096, "K": 4096, "triton_TFLOPs": 700.0, "cublas_TFLOPs": 760.0,
         "ratio": 0.921, "goal_ratio": 0.95, "meets_goal": False, "cublas_path": "torch.matmul(a, b_nk.t())"}],
        provenance.KEY: _stamp()}
    (tmp_path / "gemm_next.json").write_text(json.dumps(doc))
    page = perf_table.PAGE.read_text()
    new = perf_table.page_with_table(page, perf_table.table(tmp_path))
    assert new != page
    row = next(ln for ln in new.splitlines() if "`gemm_next.json`" in ln)
    assert "ratio >= 0.95: NOT met" in row and "0.921 vs torch.matmul" in row
    commit = doc[provenance.KEY]["versions"]["oracle_commit"]
    if commit:
        assert commit[:10] in row


def test_a_file_no_reader_knows_is_an_error_naming_it(tmp_path):
    (tmp_path / "mystery.json").write_text(json.dumps({"speed": 3}))
    with pytest.raises(perf_table.PerfTableError, match="mystery.json: no reader knows"):
        perf_table.table(tmp_path)
    (tmp_path / "mystery.json").write_text(json.dumps({provenance.KEY: {"benchmark": "new_bench"}}))
    with pytest.raises(perf_table.PerfTableError, match="mystery.json: its stamp names the benchmark 'new_bench'"):
        perf_table.table(tmp_path)


def test_a_missing_field_reads_not_recorded(tmp_path):
    stamp = _stamp()
    del stamp["versions"]["oracle_commit"]
    stamp["peer"] = None
    stamp["why_null"]["peer"] = "it counts verdicts"
    row = {"dtype": "bf16", "M": 4096, "N": 4096, "K": 4096, "triton_TFLOPs": 700.0}  # no cuBLAS, ratio, goal
    (tmp_path / "gemm_partial.json").write_text(json.dumps({"rows": [row], provenance.KEY: stamp}))
    (tmp_path / "check_old.json").write_text(json.dumps({"seed": 1, "sizes": [{"n": 4096, "verdict": "MATCH"}]}))
    rows = {r.file: r for r in perf_table.rows_of(tmp_path / "gemm_partial.json")
            + perf_table.rows_of(tmp_path / "check_old.json")}
    g, c = rows["gemm_partial.json"], rows["check_old.json"]
    assert g.goal == "not recorded" and "cuBLAS not recorded" in g.measured
    assert g.when.endswith("/ not recorded") and g.ratio == "no peer: it counts verdicts"
    assert g.machine != "not recorded"  # the stamp's machine: a GPU's name, or the CPU's
    assert c.machine == "not recorded" and c.when == "not recorded / not recorded" and c.goal == "not recorded"
    assert "warm not recorded ms" in c.measured and c.ratio.startswith("not recorded vs")


def test_the_stamp_has_every_field_on_the_cpu():
    s = _stamp(timing=provenance.NotApplicable("it times nothing"))
    assert set(provenance.TOP_FIELDS) <= set(s)
    assert set(provenance.MACHINE_FIELDS) <= set(s["machine"])
    assert set(provenance.VERSION_FIELDS) <= set(s["versions"])
    assert provenance.nulls_without_reason(s) == []
    assert s["timing"] is None and s["why_null"]["timing"] == "it times nothing"
    assert s["command"] == "python benchmarks/gemm_bench.py --out x.json" and s["benchmark"] == "gemm_bench"
    assert s["seeds"] == {"inputs": 7} and s["peer"]["name"] == "cuBLAS: torch.matmul"
    assert re.fullmatch(r"[0-9a-f]{12}", s["machine"]["host_sha256"] or "0" * 12)
    if not torch.cuda.is_available():
        m = s["machine"]
        assert m["gpu_count"] == 0
        for f in ("gpu_name", "gpu_memory_gib", "gpu_capability", "driver", "driver_cuda"):
            assert m[f] is None and "no CUDA device" in m["why_null"][f], f
        assert m["cpu_cores"] and m["cpu_model"] is not None or "cpu_model" in m["why_null"]
    json.dumps(s)  # it is JSON as it is


@pytest.mark.parametrize("kw, field", [
    ({"peer": "cuBLAS"}, "peer must be a Peer"),
    ({"timing": None}, "timing must be a Timing"),
    ({"seeds": {}}, "seeds must be a non-empty mapping"),
    ({"seeds": {"inputs": 1.5}}, "seeds['inputs']"),
    ({"seeds": {"inputs": True}}, "seeds['inputs']"),
])
def test_a_stamp_that_cannot_describe_the_run_is_refused(kw, field):
    with pytest.raises(provenance.ProvenanceError) as e:
        _stamp(**kw)
    assert field in str(e.value)


@pytest.mark.parametrize("make, field", [
    (lambda: provenance.Peer("", "a / b"), "Peer.name"),
    (lambda: provenance.Timing("events", "none", "  ", "median"), "Timing.reps"),
    (lambda: provenance.NotApplicable(None), "NotApplicable.why"),
])
def test_the_stamp_types_name_their_bad_field(make, field):
    with pytest.raises(provenance.ProvenanceError, match=re.escape(field)):
        make()


def test_every_script_that_writes_results_stamps_them():
    writers = [p for p in [*(ROOT / "benchmarks").glob("*.py"), ROOT / "tests" / "fuzz_inputs.py"]
               if p.name not in ("perf_table.py", "provenance.py")
               and re.search(r"json\.dump\(|write_text\(json\.dumps|write_text_atomically\(", p.read_text())]
    assert len(writers) >= 10, writers
    missing = [p.name for p in writers if "provenance.stamp(" not in p.read_text()]
    assert not missing, f"these write results without a provenance stamp: {missing}"


def test_a_script_run_on_the_cpu_writes_a_stamp_the_table_reads(tmp_path):
    out = tmp_path / "check_cpu.json"
    done = warm_python.run([sys.executable, "benchmarks/check_bench.py", "--device", "cpu", "--sizes", "64", "--warm",
                            "1", "--gemm-reps", "1", "--seed", "11", "--out", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    s = doc[provenance.KEY]
    assert s["benchmark"] == "check_bench" and s["seeds"] == {"inputs": 11, "per_size": [75]}
    assert "--seed 11" in s["command"] and provenance.nulls_without_reason(s) == []
    assert doc["seed"] == 11 and "sizes" in doc  # the script's own fields are kept
    (row,) = perf_table.rows_of(out)
    assert row.benchmark == "oracle.check, bf16 64^3" and row.ratio.endswith("vs the GEMM timed beside it (`gemm_ms`)")
    assert row.when.startswith(s["date"][:10])


def test_the_test_command_profile_sums_the_cache_s_compiles_and_the_table_reads_it(tmp_path):
    cache = tmp_path / "cache"
    entries = (("so", "aa", "/x/zoo/cutlass_sm90/cutlass_sm90.cu", ["-DORACLE_TRACE=1", "-DORACLE_CASE_A=3"], 40.5),
               ("so", "bb", "/x/zoo/cutlass_sm90/cutlass_sm90.cu", ["-DZOO_CUTLASS_HOST=1"], 30.0),
               ("cubin", "cc", "/x/zoo/hopper_gemm/hopper_gemm.cu", [], 90.0))
    for kind, key, source, defines, secs in entries:
        folder = cache / kind / key[:2]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{key}.json").write_text(json.dumps({"command": ["nvcc", *defines, "-o", "x", source],
                                                        "source": source, "seconds": secs, "ok": True}))
    (cache / "so" / "aa" / "not-an-entry.json").write_text("[1, 2]")
    durations = tmp_path / "dur.txt"
    durations.write_text("12.50s call     tests/cpu/test_a.py::test_one\n2.00s setup    tests/cpu/test_a.py::test_two[x]\n"
                         "5.00s call     tests/cpu/test_b.py::test_three\n")
    out = tmp_path / "ci_time_cpu.json"
    done = warm_python.run([sys.executable, "benchmarks/ci_time.py", "--cache", str(cache), "--wall-s", "700",
                            "--pytest-s", "650", "--cores", "2", "--durations", str(durations), "--out", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["compiles"] == 3 and doc["compile_s"] == 160.5
    assert doc["compile_s_by_source"] == {"hopper_gemm.cu": 90.0, "cutlass_sm90.cu": 70.5}
    assert doc["longest_compiles"][1]["defines"] == ["ORACLE_TRACE=1"]  # the case's checks are left out
    assert doc["warm_test_s_by_file"] == {"tests/cpu/test_a.py": 14.5, "tests/cpu/test_b.py": 5.0}
    (row,) = perf_table.rows_of(out)
    assert row.goal == "<= 600 s: NOT met" and "3 compiles, 160 s of nvcc (hopper_gemm.cu 90 s" in row.measured


def test_the_chain_traffic_count_is_size_independent_and_the_table_reads_it(tmp_path):
    """benchmarks/chain_traffic.py counts the same operations and bytes per element of D at two sizes (what
    lets a CPU run speak for 4096^3), and its results file gets a row."""
    chain_traffic = bench_scripts.load("chain_traffic")
    small, large = chain_traffic.traffic(128, "cpu"), chain_traffic.traffic(256, "cpu")
    assert small["verdict"] == large["verdict"] == "MATCH"
    assert small["operations"] == large["operations"] > 10
    assert small["bytes_per_element"] == large["bytes_per_element"] > 100
    out = tmp_path / "chain.json"
    done = warm_python.run([sys.executable, "benchmarks/chain_traffic.py", "--size", "128", "--out", str(out)],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = perf_table.rows_of(out)
    assert row.benchmark == "oracle.check's reference chain, traffic"
    assert f"{small['operations']} torch operations" in row.measured

"""benchmarks/zoo_at_size.py: every run's command line resolves, through the command's own parser, to the
case and size it is listed for (so a GPU run cannot fail on a mistyped field), --list prints them, the
script refuses to run without a GPU, and the results table reads what it writes."""

import json
import sys
from pathlib import Path

import pytest
import torch

import bench_scripts  # tests/ is on sys.path
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter

zoo_at_size = bench_scripts.load("zoo_at_size")
perf_table = bench_scripts.load("perf_table")
ROOT = Path(bench_scripts.ROOT)


def test_every_run_resolves_to_its_case_at_its_size():
    from oracle.problem.attention import AttentionSpec

    names = [n for n, _ in zoo_at_size.RUNS]
    assert len(names) == len(set(names))
    for name, args in zoo_at_size.RUNS:
        case = zoo_at_size.case_of(args)
        spec = case.spec
        assert case.path is None or str(case.path).endswith(args[0]), (name, case.path)
        if isinstance(spec, AttentionSpec):
            assert spec.seqlen_k in (8192, 32768), name
            if spec.seqlen_k == 8192:
                assert (spec.batch, spec.heads_q, spec.heads_kv, spec.seqlen_q, spec.head_dim) == (4, 32, 8, 8192, 128)
            assert case.trace.groups is not None and len(case.trace.groups) <= 4, name  # a sink that fits
        elif spec.groups is not None:
            assert spec.groups == (4096, 4096, 0, 4096) and (spec.n, spec.k) == (4096, 4096), name
        else:
            assert (spec.m, spec.n, spec.k) == (4096, 4096, 4096), name
    kinds = {n.split("_")[0] for n in names}
    assert {"hopper", "deepgemm", "mx", "cutlass", "fa2", "fa3"} <= kinds
    for must in ("cutlass_streamk", "cutlass_evt", "cutlass_batched", "cutlass_grouped", "cutlass_blockwise_scales",
                 "fa2_split_decode", "fa3_split_decode", "fa2_paged_decode"):
        assert must in names, must


def test_list_prints_every_run_and_only_selects():
    done = warm_python.run([sys.executable, "benchmarks/zoo_at_size.py", "--list", "--only", "streamk", "fa3_d128"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["cutlass_streamk", "cutlass_streamk_dp", "fa3_d128"]
    assert all("python -m oracle compare " in ln and ln.endswith("--allow-library") for ln in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_without_a_gpu_it_says_so_and_exits_2():
    done = warm_python.run([sys.executable, "benchmarks/zoo_at_size.py", "--only", "hopper"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr, (done.returncode, done.stderr[-500:])


def test_the_results_table_reads_its_file(tmp_path):
    from benchmarks import provenance

    runs = [{"name": "cutlass_streamk", "verdict": "MATCH", "wall_s": 9.1},
            {"name": "fa2_split_decode", "verdict": "DIVERGED", "wall_s": 30.2},
            {"name": "fa3_paged_decode", "verdict": None, "wall_s": None}]
    doc = {"schema": "zoo_at_size/1", "runs": runs, "started": 2, "matched": 1, "all_match": False,
           provenance.KEY: provenance.stamp(str(ROOT / "benchmarks" / "zoo_at_size.py"), [],
                                            seeds={"inputs": "random:1"},
                                            peer=provenance.NotApplicable("verdicts"),
                                            timing=provenance.NotApplicable("walls for scale"))}
    path = tmp_path / "zoo_at_size_x.json"
    path.write_text(json.dumps(doc))
    (row,) = perf_table.rows_of(path)
    assert row.benchmark == "zoo at size" and row.goal == "every run MATCHes: NOT met"
    assert row.measured == ("1 of 2 correct zoo kernels MATCH at realistic sizes; not MATCH: fa2_split_decode "
                            "DIVERGED; 1 not started")

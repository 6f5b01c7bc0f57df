"""`oracle.check` and the dump reader refuse every bad argument with a SpecError / DumpError
naming it (never an AttributeError, NotImplementedError or OverflowError), and judge valid inputs
at a dtype's extremes and NaN / Inf operands (never ORACLE_UNTRUSTED)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import oracle
from harness.dump import DumpError
from oracle.judging.differential.cross_check import accumulator_in_range, same_values
from oracle.problem.spec import FP32_MAX, ProblemSpec, SpecError
from oracle.run.recording import Recording
from time_limits import deadline  # tests/ is on sys.path


def _problem(m=64, n=48, k=32, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    return a, b, (a.float() @ b.float()).to(dtype)


A, B, D = _problem()


@pytest.mark.parametrize("kwargs, match", [
    (dict(bias=[1.0] * 48), "bias must be a torch.Tensor, got list"),
    (dict(c=[[1.0]]), "c must be a torch.Tensor, got list"),
    (dict(scale_a=2.0), "scale_a must be a torch.Tensor, got float"),
    (dict(scale_b="x"), "scale_b must be a torch.Tensor, got str"),
    (dict(bias=torch.ones(48, device="meta")), "bias is a meta tensor"),
    (dict(c=torch.ones(64, 48, device="meta")), "c is a meta tensor"),
    (dict(scale_a=torch.ones(1, dtype=torch.complex64)), "scale_a has dtype torch.complex64"),
    (dict(scale_a=torch.ones(1, dtype=torch.int32)), "a scale is a floating-point tensor"),
    (dict(bias=torch.ones(48, dtype=torch.bool)), "bias has dtype torch.bool"),
    (dict(bias=torch.ones(48).to_sparse()), "bias is a torch.sparse_coo tensor"),
    (dict(alpha=1e39), "alpha=1e\\+39 is not allowed: must be a finite number of magnitude at most"),
    (dict(alpha=-2**200), "alpha=.* is not allowed"),
    (dict(beta=float("inf"), c=torch.ones(64, 48)), "beta=inf is not allowed"),
    (dict(alpha=float("nan")), "alpha=nan is not allowed"),
    (dict(alpha="2"), "alpha='2' is not allowed"),
    (dict(tile=[64, 64, 16, 1]), "check: "),
    (dict(bogus=1), "check: "),
])
def test_a_bad_keyword_argument_is_a_spec_error(kwargs, match):
    with deadline(60), pytest.raises(SpecError, match=match):
        oracle.check(A, B, D, **kwargs)


@pytest.mark.parametrize("which, make, match", [
    ("a", lambda t: t.to("meta"), "a is a meta tensor"),
    ("b", lambda t: t.to("meta"), "b is a meta tensor"),
    ("d", lambda t: t.to("meta"), "d is a meta tensor"),
    ("a", lambda t: t.float().to_sparse(), "a is a torch.sparse_coo tensor"),
    ("d", lambda t: t.float().to_sparse_csr(), "d is a torch.sparse_csr tensor"),
    ("a", lambda t: t.to(torch.complex64), "a has dtype torch.complex64"),
    ("b", lambda t: t.to(torch.float64), "b has dtype torch.float64, which the oracle has no name for"),
    ("d", lambda t: t.tolist(), "d must be a torch.Tensor, got list"),
    ("a", lambda t: None, "a must be a torch.Tensor, got NoneType"),
    ("b", lambda t: t[None], "b must be a 2-D torch.Tensor"),
])
def test_a_bad_operand_is_a_spec_error(which, make, match):
    args = {"a": A, "b": B, "d": D}
    args[which] = make(args[which])
    with deadline(60), pytest.raises(SpecError, match=match):
        oracle.check(args["a"], args["b"], args["d"])


def test_an_integer_alpha_past_int64_is_judged_as_the_float_it_stands_for():
    a, b, _ = _problem()
    d = (2.0**70 * (a.float() @ b.float())).to(torch.bfloat16)
    rep = oracle.check(a, b, d, alpha=2**70)
    assert rep.verdict == "MATCH", rep
    assert rep.recording.spec.alpha == 2.0**70 and isinstance(rep.recording.spec.alpha, float)


def test_alpha_at_the_edge_of_fp32_is_judged():
    a, b, _ = _problem()
    alpha = 1e30
    d = (alpha * (a.float() @ b.float())).to(torch.bfloat16)
    assert oracle.check(a, b, d, alpha=alpha).verdict == "MATCH"
    assert ProblemSpec(m=8, n=8, k=8, alpha=FP32_MAX).alpha == FP32_MAX


def test_a_dump_with_alpha_past_fp32_is_refused_at_load(tmp_path):
    a, b, d = _problem()
    rec = oracle.check(a, b, d).recording
    object.__setattr__(rec.spec, "alpha", 1e39)  # as a file written elsewhere could hold it
    p = tmp_path / "alpha.safetensors"
    rec.save(str(p))
    with pytest.raises(DumpError, match="alpha=1e\\+39 is not allowed"):
        Recording.load(str(p))


def test_a_dump_with_alpha_1e30_loads_and_is_judged(tmp_path):
    a, b, _ = _problem()
    d = (1e30 * (a.float() @ b.float())).to(torch.bfloat16)
    rec = oracle.check(a, b, d, alpha=1e30).recording
    p = tmp_path / "alpha.safetensors"
    rec.save(str(p))
    assert oracle.judge(Recording.load(str(p))).verdict == "MATCH"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_operands_at_their_dtypes_largest_value_are_judged(dtype, out):
    """bf16's largest value times K overflows the fp32 accumulator: the elements where it may are
    left out of the cross-check, and the output is judged."""
    g = torch.Generator().manual_seed(1)
    a = torch.full((64, 32), torch.finfo(dtype).max).to(dtype)
    b = torch.randn(32, 48, generator=g).to(dtype)
    d = (a.float() @ b.float()).to(out)
    rep = oracle.check(a, b, d)
    assert rep.verdict != "ORACLE_UNTRUSTED" and not rep.analysis.cross_check, rep
    assert rep.verdict in ("MATCH", "DIVERGED")


@pytest.mark.parametrize("partition", [dict(splits=2), dict(splits=2, reduction="fp32"), dict(stream_k_workers=3)])
def test_nan_and_inf_operands_of_a_split_problem_are_judged(partition):
    a, b, _ = _problem(m=64, n=48, k=64)
    a[3, 5] = float("nan")
    a[10, 7] = float("inf")
    b[9, 2] = float("-inf")
    d = (a.float() @ b.float()).to(torch.bfloat16)
    rep = oracle.check(a, b, d, tile=(32, 32, 16), **partition)
    assert rep.verdict == "MATCH" and not rep.analysis.cross_check, rep


def test_the_reduce_cross_check_agrees_on_nan_and_equal_infinities():
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    assert same_values(x, x.clone())
    assert not same_values(x, torch.tensor([1.0, float("nan"), -float("inf"), -float("inf")], dtype=torch.float64))
    assert not same_values(x, torch.tensor([1.0, 0.0, float("inf"), -float("inf")], dtype=torch.float64))


def test_the_cross_check_leaves_out_only_where_the_accumulator_may_overflow():
    s = torch.tensor([1.0, 3e38, float("inf"), float("nan"), 1e38], dtype=torch.float64)
    assert accumulator_in_range(s, "fp32").tolist() == [True, False, False, True, True]
    assert accumulator_in_range(torch.tensor([40000.0, 20000.0]), "fp16").tolist() == [False, True]
    assert accumulator_in_range(s, "int32").all()


def test_check_on_a_huge_stream_k_worker_count_returns_at_once():
    a, b, d = _problem()
    with deadline(10), pytest.raises(SpecError, match="stream_k_workers"):
        oracle.check(a, b, d, stream_k_workers=2**31)


def test_replace_keeps_alpha_a_float():
    spec = dataclasses.replace(ProblemSpec(m=8, n=8, k=8), alpha=3)
    assert spec.alpha == 3.0 and isinstance(spec.alpha, float)


# -- a tile far larger than the problem, nested tensors ----------------------------------------
def test_a_tile_far_larger_than_the_problem_is_fitted_with_a_note_before_anything_is_sized():
    import resource
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = textwrap.dedent("""
        import resource, torch, oracle
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        a = torch.ones(64, 32, dtype=torch.bfloat16); b = torch.ones(32, 48, dtype=torch.bfloat16)
        rep = oracle.check(a, b, (a.float() @ b.float()).bfloat16(), tile=(65535, 65535, 4096))
        print("VERDICT", rep.verdict, rep.recording.spec.tile)
        print("NOTES", rep.recording.notes)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=str(root),
                       env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert "VERDICT MATCH Tile(bm=128, bn=128, bk=64)" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "tile 65535x65535x4096 is larger than the problem: judged with 128x128x64" in r.stdout, r.stdout


def test_a_fitted_tile_keeps_the_problem_s_tiles_and_k_blocks():
    from oracle.tools.api import fitted_tile
    from oracle.problem.spec import Tile

    assert fitted_tile(Tile(64, 64, 16), 200, 136, 72) == Tile(64, 64, 16)  # an ordinary tile is kept
    assert fitted_tile(Tile(65535, 64, 65535), 5000, 136, 100) == Tile(8192, 64, 128)
    for asked, (m, n, k) in ((Tile(65535, 65535, 4096), (64, 48, 32)), (Tile(1024, 512, 4096), (600, 300, 1000))):
        fit = fitted_tile(asked, m, n, k)
        for a, f, e in ((asked.bm, fit.bm, m), (asked.bn, fit.bn, n), (asked.bk, fit.bk, k)):
            assert -(-e // a) == -(-e // f) == 1 or a == f


def test_a_tile_too_large_for_the_references_is_a_spec_error():
    a, b = torch.ones(4096, 64, dtype=torch.bfloat16), torch.ones(64, 4096, dtype=torch.bfloat16)
    with deadline(30), pytest.raises(SpecError, match=r"tile=2048x2048x64 is not allowed: its bm x bn = 4194304"):
        oracle.check(a, b, torch.zeros(4096, 4096, dtype=torch.bfloat16), tile=(2048, 2048, 64))


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
@pytest.mark.parametrize("which", ["a", "d", "bias"])
def test_a_nested_tensor_is_a_spec_error(layout, which):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the strided nested layout is a prototype
        args = {"a": A, "b": B, "d": D, "bias": None}
        base = {"a": A, "d": D, "bias": torch.ones(48, dtype=torch.bfloat16)}[which]
        parts = [base, base[:10]] if base.dim() == 2 else [base, base[:5]]
        args[which] = torch.nested.nested_tensor(parts, layout=layout)
        with deadline(60), pytest.raises(SpecError, match=f"{which} is a nested tensor \\(torch.nested\\)"):
            oracle.check(args["a"], args["b"], args["d"], **({"bias": args["bias"]} if args["bias"] is not None
                                                             else {}))


# -- timing without a GPU --------------------------------------------------------------------------
def test_compare_time_without_a_gpu_is_one_error_line_before_anything_is_built(capsys, monkeypatch):
    from pathlib import Path

    from oracle.run import live
    from oracle.tools import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(live, "build_cubin", lambda *a, **k: pytest.fail("the build was reached"))
    simple = Path(__file__).resolve().parents[2] / "harness" / "examples" / "simple_gemm.toml"
    code = cli.main(["compare", "--problem", str(simple), "--inputs", "ones", "--time"])
    err = capsys.readouterr().err
    assert code == 2 and "error: timing needs a CUDA GPU; none is visible" in err and "Traceback" not in err, err


def test_a_timed_bench_case_without_a_gpu_is_an_error_row_before_anything_is_built(monkeypatch):
    from pathlib import Path

    from oracle.run import live
    from oracle.tools import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "live_case", lambda *a, **k: pytest.fail("the case was loaded"))
    monkeypatch.setattr(live, "build_cubin", lambda *a, **k: pytest.fail("the build was reached"))
    simple = str(Path(__file__).resolve().parents[2] / "harness" / "examples" / "simple_gemm.toml")
    row = bench.run_case(bench.BenchCase("x", simple))
    assert row["verdict"] == "ERROR" and row["error"].startswith("TimingError: timing needs a CUDA GPU; none is "
                                                                 "visible"), row

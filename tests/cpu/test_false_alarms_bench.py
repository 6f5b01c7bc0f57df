"""The false-alarm benchmark's plumbing on the CPU: cases, the spec each engine gets, planted
defects and the JSON, with the engines replaced by exact float64 GEMMs cast to the output type."""

import os

import pytest
import torch
import bench_scripts  # tests/ is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _module():
    return bench_scripts.load("false_alarms")


F = _module()


def _exact(c, ops):
    """A correct engine: the exact product, the spec's epilogue (bias, scales), one rounding."""
    a, b = ops.a.double(), ops.b.double()
    d = a @ b
    if ops.scale_a is not None:
        d = d * ops.scale_a.double()[:, None] * ops.scale_b.double()[None, :] if ops.scale_a.numel() > 1 else \
            d * float(ops.scale_a.double() * ops.scale_b.double())
    if ops.bias is not None:
        d = d + ops.bias.double()[None, :]
    if c.engine == "cublaslt_relu":
        d = d.clamp(min=0)
    if c.out == "int32":
        return d.to(torch.int32)
    return d.to(torch.float32).to(F.TORCH[c.out])


def test_every_engine_has_cases_and_specs_that_validate():
    cases = F.make_cases()
    assert len(cases) >= 500
    assert {c.engine for c in cases} == set(F.ENGINE)
    assert {c.kind for c in cases} == set(F.KINDS)
    assert max(c.k for c in cases) == 65536 and min(c.m for c in cases) == 1
    assert {(c.a_major, c.b_major) for c in cases} >= {("row", "col"), ("col", "row")}
    F.specs._SPLITK.update({(c.a_dtype, c.m, c.n, c.k, c.a_major, c.b_major): {"boundaries": [], "probed": True}
                      for c in cases})
    for c in cases:
        spec, why = F.spec_for(c, {})
        assert spec.m == c.m and why


def test_a_case_is_the_same_whichever_engines_run():
    every = set(F.make_cases())
    some = F.make_cases(engines={"cublaslt_gelu", "int8"})
    assert some and set(some) <= every and {c.engine for c in some} == {"cublaslt_gelu", "int8"}


@pytest.mark.parametrize("engine", ["cublas_bf16_fp32red", "lt_e4m3_rowwise", "int8", "cublas_addmm"])
def test_correct_case_matches_and_planted_defects_are_found(monkeypatch, engine):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE[engine]
    c = F.Case(engine, e.a_dtype, e.out, max(40, e.mmin), 144, 256, "row", "col", "normal", 5)
    r = F.run_case(c, {}, run=_exact)
    assert r.error is None, r.error
    assert r.verdict == "MATCH" and r.ratio < 1
    # fp8's narrow accumulator leaves a bound of several % of |D| at K = 256: a 1% tile is below it
    expect = [d for d in r.planted if not (e.a_dtype == "e4m3" and d == "tile x 1.01")]
    assert expect and all(r.planted[d][1] for d in expect), r.planted
    assert "wrong block scale" not in r.planted  # block scales only
    doc = F.summarise([r], 0, 1.0)
    for key in ("correct_cases", "false_diverged", "planted", "detected_right_tile", "environment", "worst_ratio",
                "groups", "planted_table"):
        assert key in doc
    assert doc["false_diverged"] == 0 and doc["planted"] == len(r.planted)


def test_a_wrong_engine_is_a_false_alarm_in_the_counts(monkeypatch):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    c = F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", 6)
    r = F.run_case(c, {}, planted=False, run=lambda c, ops: (_exact(c, ops).float() * 1.05).to(torch.bfloat16))
    doc = F.summarise([r], 0, 1.0)
    assert doc["false_diverged"] == 1 and doc["false_alarms"][0]["verdict"] == "DIVERGED"


def test_shards_merge_into_one_result(monkeypatch, tmp_path):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    paths = []
    for i, seed in enumerate((7, 8)):
        c = F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", seed)
        r = F.run_case(c, {}, planted=False, run=_exact)
        paths.append(str(tmp_path / f"s{i}.json"))
        F.write(F.summarise([r], 0, 1.0), paths[-1])
    out = tmp_path / "all.json"
    assert F.main(["--merge", *paths, "--out", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["correct_cases"] == 2 and doc["false_diverged"] == 0


def test_a_later_run_of_a_case_supersedes_the_earlier_in_a_merge(monkeypatch, tmp_path):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    c = F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", 7)
    wrong = F.run_case(c, {}, planted=False, run=lambda c, ops: (_exact(c, ops).float() * 1.05).to(torch.bfloat16))
    right = F.run_case(c, {}, planted=False, run=_exact)
    failed = F.Result(c, "", "", 0.0, 0.1, "RuntimeError: the engine refused")
    assert (wrong.verdict, right.verdict) == ("DIVERGED", "MATCH")
    for name, r in (("old", wrong), ("new", right), ("failed", failed)):
        F.write(F.summarise([r], 0, 1.0), str(tmp_path / f"{name}.json"))
    out = tmp_path / "all.json"
    assert F.main(["--merge", *(str(tmp_path / f"{n}.json") for n in ("old", "new", "failed")), "--out", str(out)]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["correct_cases"] == 1 and doc["false_diverged"] == 0 and not doc["errors"]
    assert F.main(["--merge", str(tmp_path / "new.json"), str(tmp_path / "old.json"), "--out", str(out)]) == 1


def test_the_gelu_engine_rounds_its_accumulator_before_the_bias():
    e = F.ENGINE["cublaslt_gelu"]
    spec, why = F.spec_for(F.Case(e.name, e.a_dtype, e.out, 64, 128, 256, "col", "col", "outlier", 1), {})
    assert spec.epilogue == ("alpha_beta:bf16", "bias", "activation", "cast") and "measured" in why
    assert (spec.activation, spec.activation_impl) == ("gelu_tanh", "fast")


def test_a_finished_run_skips_what_an_earlier_run_judged(monkeypatch, tmp_path):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE["cublas_bf16_fp32red"]
    cases = [F.Case(e.name, e.a_dtype, e.out, 40, 144, 256, "row", "col", "normal", s) for s in (7, 8, 9)]
    r = F.run_case(cases[1], {}, planted=False, run=_exact)
    F.write(F.summarise([r], 2, 1.0), str(tmp_path / "cut.json"))
    assert F.not_judged(cases, [str(tmp_path / "cut.json")]) == [cases[0], cases[2]]
    assert F.not_judged(cases, []) == cases
    failed = F.Result(cases[0], "", "", 0.0, 0.1, "RuntimeError: the engine refused")
    F.write(F.summarise([failed], 0, 1.0), str(tmp_path / "failed.json"))
    assert F.not_judged(cases, [str(tmp_path / "cut.json"), str(tmp_path / "failed.json")]) == [cases[0], cases[2]]


def test_specs_follow_what_was_measured(monkeypatch):
    import json

    monkeypatch.setattr(F.specs, "_SPLITK", {})
    numerics = json.load(open(os.path.join(ROOT, "benchmarks", "results", "numerics_h200.json")))

    def spec(engine, probe=None, m=64, n=128, k=4096, doc=numerics):
        e = F.ENGINE[engine]
        c = F.Case(engine, e.a_dtype, e.out, m, n, k, "row", "col", "normal", 1)
        if probe is not None:
            F.specs._SPLITK[(c.a_dtype, m, n, k, "row", "col")] = probe
        return F.spec_for(c, doc)[0]

    tf32 = spec("cublas_tf32")
    assert (tf32.acc_model, tf32.reduction, tf32.tile.bk) == ("tf32_rn", "fp32", 32)
    lt = spec("lt_e4m3")
    assert (lt.acc_model, lt.promotion_interval, lt.tile.bk) == ("fp8_promoted", 128, 128)
    assert spec("lt_e4m3", doc={}).acc_model == "any"
    assert spec("lt_e4m3_fast").acc_model == "fp8_fast"
    assert spec("cublas_bf16", {"boundaries": [], "probed": True}).reduction == "fp32"
    assert spec("cublas_bf16", {"boundaries": [], "probed": False}, k=8192).acc_model == "any"
    split = spec("cublas_bf16", {"boundaries": [1024, 2048, 3072], "chunk": 1024, "probed": True})
    assert (split.reduction, split.reduction_chunk) == ("bf16", 1024)
    assert spec("cublas_fp16", {"boundaries": [1000, 2100], "chunk": None, "probed": True}).acc_model == "any"
    assert F._promotion({"engines": {"x": {"fit": {"promotion": [128, None]}}}}, "x") is None


def test_planted_tile_is_a_full_tile_where_there_is_one():
    import numpy as np

    rng = np.random.default_rng(0)
    spec = F.spec_for(F.Case("int8", "int8", "int32", 300, 136, 512, "row", "col", "normal", 1), {})[0]
    tiles = {F._planted_tile(spec, rng) for _ in range(50)}
    assert tiles == {(0, 0), (1, 0)}  # rows 256..299 and columns 128..135 are partial
    one_row = F.spec_for(F.Case("int8", "int8", "int32", 1, 1000, 512, "row", "col", "normal", 1), {})[0]
    assert {F._planted_tile(one_row, rng)[1] for _ in range(50)} <= set(range(7))


def test_cases_run_in_a_seeded_mixed_order():
    cases = F.make_cases()
    assert cases == F.make_cases()
    assert len({c.engine for c in cases[:len(cases) // 10]}) == len(F.ENGINES)


def test_zoo_cases_load_with_their_specs():
    from oracle.run.case import load_case
    from oracle.run.case_types import with_trace

    for path, entry, shapes in F.ZOO:
        for m, n, k in shapes:
            case = with_trace(load_case(os.path.join(ROOT, path), dict(m=m, n=n, k=k), entry=entry), [(0, 0)], (0,))
            assert (case.spec.m, case.spec.n, case.spec.k) == (m, n, k) and case.kernel.entry == entry


def _block_scaled_exact(a, b, scale_a, scale_b, rows):
    """The block-scaled product in float64: each 128-deep k-block's A_kb @ B_kb times the scales of
    its rows' and columns' blocks (rows: A's rows and B's columns per block)."""
    a, b = a.double(), b.double()
    m, k = a.shape
    n = b.shape[1]
    d = torch.zeros(m, n, dtype=torch.float64)
    for j in range(k // 128):
        part = a[:, j * 128:(j + 1) * 128] @ b[j * 128:(j + 1) * 128]
        sa = scale_a.double()[torch.arange(m) // rows[0], j]
        sb = scale_b.double()[torch.arange(n) // rows[1], j]
        d += part * sa[:, None] * sb[None, :]
    return d


def _block_engine(c, ops):
    return _block_scaled_exact(ops.a, ops.b, ops.scale_a, ops.scale_b, F.BLOCK_ROWS[c.engine]).to(torch.bfloat16)


@pytest.mark.parametrize("engine", ["lt_e4m3_block1x128", "lt_e4m3_block1x128_128x128", "lt_e4m3_block128x128_1x128"])
def test_block_scaled_engines_cases_specs_and_planted_defects(monkeypatch, engine):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE[engine]
    cases = [c for c in F.make_cases() if c.engine == engine]
    assert cases and all(c.k % e.kmult == 0 and c.m % e.mmult == 0 and c.n % e.nmult == 0 for c in cases)
    ra, rb = F.BLOCK_ROWS[engine]
    spec = F.spec_for(cases[0], {})[0]
    assert (spec.scale_a.kind, spec.scale_a.block, spec.scale_b.block) == ("block", (ra, 128), (rb, 128))
    assert (spec.acc_model, spec.promotion_interval, spec.tile.bk) == ("fp8_promoted", 128, 128)
    assert (spec.scale_a.major, spec.scale_b.major) == tuple("col" if r == 1 else "row" for r in (ra, rb))
    c = F.Case(engine, "e4m3", "bf16", 256 if ra > 1 else 40, 256, 512, "row", "col", "normal", 5)
    ops = F.make_operands(c)
    assert tuple(ops.scale_a.shape) == (-(-c.m // ra), 4) and tuple(ops.scale_b.shape) == (-(-c.n // rb), 4)
    r = F.run_case(c, {}, run=_block_engine)
    assert r.judged, r.error
    assert r.verdict == "MATCH" and r.ratio < 1
    gross = {d: r.planted[d] for d in ("zeroed tile", "one sign flip", "one NaN", "missing k-block",
                                       "wrong block scale")}
    assert all(right for _, right in gross.values()), r.planted


@pytest.mark.parametrize("rows", [(1, 1), (1, 128), (128, 1)])
def test_block_scales_are_laid_out_as_torch_scaled_mm_reads_them(rows):
    """alarms.engines._block_scale against torch's rules (aten ScaledBlas.cpp is_blockwise_*_scaling):
    A's scale as given, B's through its transpose, each [rows, K / 128] 1x128 with stride (1, rows)
    or [rows / 128, K / 128] 128x128 row-major; the values those strides reach are the grid's."""
    m, n, kb = 256, 384, 8
    grid = {"a": torch.rand(m // rows[0], kb), "b": torch.rand(n // rows[1], kb)}
    for op, r in zip("ab", rows):
        s = F.engines._block_scale(grid[op], r, op)
        t = s if op == "a" else s.t()
        assert tuple(t.shape) == tuple(grid[op].shape)
        assert t.stride() == ((1, t.shape[0]) if r == 1 else (kb, 1))
        assert torch.equal(t, grid[op])


def test_block_scaled_engines_are_the_pairs_torch_takes():
    """torch._scaled_mm takes 1x128 x 1x128, 1x128 x 128x128 and 128x128 x 1x128, never 128x128 on
    both sides: the benchmark offers exactly those, each once."""
    assert sorted(F.BLOCK_ROWS.values()) == [(1, 1), (1, 128), (128, 1)]
    assert set(F.BLOCK_ROWS) <= set(F.ENGINE)


def test_block_scaled_engine_refused_layout_is_skipped_not_judged(monkeypatch):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE["lt_e4m3_block128x128_1x128"]
    c = F.Case(e.name, "e4m3", "bf16", 128, 128, 512, "row", "col", "normal", 3)

    def refuses(c, ops):
        raise F.EngineSkipped("torch._scaled_mm refused 128x128 block scales: Invalid scaling configuration")

    r = F.run_case(c, {}, run=refuses)
    assert not r.judged and r.error is None and "Invalid scaling configuration" in r.skipped
    doc = F.summarise([r], 0, 1.0)
    assert doc["correct_cases"] == 0 and doc["false_diverged"] == 0 and doc["skipped"][0]["why"] == r.skipped


@pytest.mark.parametrize("rows", [(1, 1), (1, 128), (128, 1)])
def test_block_scaled_output_through_check_matches_and_a_wrong_scale_diverges(rows):
    import oracle

    g = torch.Generator().manual_seed(11)
    m, n = (256 if rows[0] > 1 else 40), (256 if rows[1] > 1 else 144)
    k = 512 if max(rows) > 1 else 384
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(k, n, generator=g) * 4).to(torch.float8_e4m3fn)
    sa = (torch.rand(-(-m // rows[0]), k // 128, generator=g) + 0.5) * 2.0 ** torch.randint(-2, 3, (1,), generator=g)
    sb = torch.rand(-(-n // rows[1]), k // 128, generator=g) + 0.5
    d = _block_scaled_exact(a, b, sa, sb, rows).to(torch.bfloat16)
    model = dict(acc_model="fp8_promoted", promotion_interval=128, reduction="fp32", tile=(128, 128, 128))
    rep = oracle.check(a, b, d, scale_a=sa, scale_b=sb, **model)
    assert rep.verdict == "MATCH", rep
    assert (rep.recording.spec.scale_a.block, rep.recording.spec.scale_b.block) == ((rows[0], 128), (rows[1], 128))
    wrong = sb.clone()
    wrong[0, 1] *= 1.25  # one k-block's scale of B's first column block
    bad = _block_scaled_exact(a, b, sa, wrong, rows).to(torch.bfloat16)
    rep = oracle.check(a, b, bad, scale_a=sa, scale_b=sb, **model)
    assert rep.verdict == "DIVERGED", rep


def _tinygemm_engine(c, ops):
    """tinygemm's arithmetic: w = (q - 8) * s + z in one bf16 fma, then an exact GEMM rounded to bf16."""
    from kernels_ref import dequant as dq

    cfg = dq.DequantConfig("uint4", "bf16", "bf16", F.W4_GROUP[c.engine], "k_pairs_high_first", "float_offset")
    q = dq.values_of_codes(dq.unpack_host(ops.b, cfg), "uint4")
    g = torch.arange(c.k) // cfg.group_size
    w = ((q - 8) * ops.b_scales.double()[g] + ops.b_zeros.double()[g]).float().to(torch.bfloat16)
    return (ops.a.double() @ w.double()).to(torch.bfloat16)


def _tinygemm_engine_fp32(c, ops):
    """w dequantised as the reference's fp32 form, then an exact GEMM rounded to bf16."""
    from kernels_ref import dequant as dq

    cfg = dq.DequantConfig("uint4", "bf16", "bf16", F.W4_GROUP[c.engine], "k_pairs_high_first", "float_offset")
    w = dq.dequant_operand_host(ops.b, ops.b_scales, ops.b_zeros, cfg)
    return (ops.a.double() @ w.double()).to(torch.bfloat16)


@pytest.mark.parametrize("engine", ["tinygemm_w4_g32", "tinygemm_w4_g128"])
def test_w4a16_engine_cases_specs_and_planted_defects(monkeypatch, engine):
    monkeypatch.setattr(F.engines, "DEV", "cpu")
    e = F.ENGINE[engine]
    cases = [c for c in F.make_cases() if c.engine == engine]
    assert cases and all(c.k % 128 == 0 and c.n % 8 == 0 for c in cases)
    spec = F.spec_for(cases[0], {})[0]
    assert (spec.b_dtype, spec.b_packing, spec.b_zeros, spec.b_group_size) == \
        ("uint4", "k_pairs_high_first", "float_offset", F.W4_GROUP[engine])
    assert spec.dequant_precision == "operand"  # no measurement: the bound
    measured = {"engines": {"tinygemm_w4": {"dequant_precision": "fp32"}}}
    assert F.spec_for(cases[0], measured)[0].dequant_precision == "fp32"
    c = F.Case(engine, e.a_dtype, e.out, 40, 144, 512, "row", "col", "outlier", 5)
    ops = F.make_operands(c)
    assert ops.b.shape == (256, 144) and ops.b_scales.dtype == ops.b_zeros.dtype == torch.bfloat16
    r = F.run_case(c, {}, run=_tinygemm_engine)
    assert r.judged, r.error
    assert r.verdict == "MATCH" and r.ratio < 1
    # declared "operand", the bound carries |A| times the dequant's (about 2 % of |w| in bf16): a 1 %
    # tile is below it; the gross defects and a missing k-block are not
    assert all(r.planted[d][1] for d in ("zeroed tile", "one sign flip", "missing k-block", "one NaN")), r.planted
    # measured fp32 (the dequant bit-exact), an engine that dequantises so is held tighter
    r = F.run_case(c, measured, run=_tinygemm_engine_fp32)
    assert r.verdict == "MATCH" and all(right for _, right in r.planted.values()), r.planted


@pytest.mark.parametrize("engine", ["emu_mxfp8", "emu_nvfp4_scales"])
def test_emulated_block_scaled_engines_match_and_their_planted_defects_are_found(monkeypatch, engine):
    """Blackwell's MXFP8 and NVFP4-style scales as Hopper runs them (dequantised, one fp32 GEMM), the
    engine itself run here on the CPU: the spec it gets (1 x 32 e8m0 or 1 x 16 e4m3 block scales, NVFP4's
    per-tensor scale as alpha) MATCHes, and every gross planted defect, a wrong block scale among them,
    is found in its tile alone."""
    from kernels_ref.scales import scale_values

    monkeypatch.setattr(F.engines, "DEV", "cpu")
    group, scale_dtype, alpha = F.engines.EMULATED[engine]
    cases = [c for c in F.make_cases() if c.engine == engine]
    assert cases and all(c.k % group == 0 for c in cases)
    c = F.Case(engine, "e4m3", "bf16", 40, 144, 256, "row", "col", "normal", 5)
    spec = F.spec_for(c, {})[0]
    assert (spec.scale_a.block, spec.scale_a.dtype, spec.scale_b.block, spec.alpha) == \
        ((1, group), scale_dtype, (1, group), alpha)
    ops = F.make_operands(c)
    sa = scale_values(ops.scale_a, scale_dtype)
    assert tuple(ops.scale_a.shape) == (40, 256 // group) and tuple(ops.scale_b.shape) == (144, 256 // group)
    assert len(set(sa.flatten().tolist())) > 4  # scales differ from block to block: a wrong one shows
    r = F.run_case(c, {})  # the engine's own arithmetic, on the CPU
    assert r.judged, r.error
    assert r.verdict == "MATCH" and r.ratio < 1, (r.verdict, r.ratio)
    gross = {d: r.planted[d] for d in ("zeroed tile", "one sign flip", "one NaN", "missing k-block",
                                       "wrong block scale")}
    assert all(right for _, right in gross.values()), r.planted

"""The differential on recordings from the Python kernel model: every defect class is localised
to its stage, correct kernels MATCH, and confounds make drafts."""

import dataclasses

import pytest
import torch

from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.problem.spec import ProblemSpec, Scale, Tile
from oracle.run.simulate import Injection, simulate
from oracle.run.confounds import ConfoundKind

BASE = ProblemSpec(m=128, n=128, k=192, tile=Tile(64, 64, 64), swizzle_a=128, swizzle_b=128)
EPI = dataclasses.replace(BASE, scale_b=Scale("col"), bias="col", activation="gelu_erf", out_dtype="fp32")
CAST = dataclasses.replace(BASE, out_dtype="e4m3", saturate=True, alpha=64.0)


def run(spec, defect=None, tile=(1, 0), kb=1, ladder="random", **kw):
    ops = make_operands(spec, ladder, seed=3)
    inj = Injection(defect, tile, kb) if defect else None
    rec = simulate(spec, ops, Provenance(ladder, 3 if ladder == "random" else None), injection=inj,
                   tap_tiles=kw.pop("tap_tiles", [tile]), **kw)
    return analyze(rec)


@pytest.mark.parametrize("spec, defect, stage, kb", [
    (BASE, "descriptor_swizzle", "descriptor_a", 1),
    (BASE, "load_stale_slot", "load_a", 1),
    (BASE, "load_transposed", "load_a", 1),
    (BASE, "mma_kblock_twice", "mma", 1),
    (BASE, "mma_no_reset", "mma", 0),
    (BASE, "mma_fp16_acc", "mma", 0),
    (EPI, "epilogue_scale_twice", "epilogue_scale", None),
    (EPI, "epilogue_bias_axis", "epilogue_bias", None),
    (EPI, "epilogue_gelu_tanh", "epilogue_activation", None),
    (CAST, "epilogue_cast_nosat", "epilogue_cast", None),
])
def test_each_defect_is_localised_to_its_stage(spec, defect, stage, kb):
    an = run(spec, defect)
    assert an.verdict is Verdict.DIVERGED
    assert an.first.stage == stage, an.first
    assert an.first.tile == (1, 0)
    assert an.first.k_block == kb
    assert an.kind is Kind.VERDICT
    assert an.diagnosis.root_cause


def test_swapped_store_is_localised_at_the_store():
    an = run(BASE, "store_swapped", tile=(0, 1), tap_tiles=[(0, 1), (1, 0)])
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "epilogue_store"
    assert an.first.tile in ((0, 1), (1, 0))


@pytest.mark.parametrize("spec", [BASE, EPI, CAST,
                                  dataclasses.replace(BASE, m=100, n=90, k=150),
                                  dataclasses.replace(BASE, a_major="col", b_major="row", swizzle_a=0, swizzle_b=64)])
def test_correct_kernel_matches(spec):
    an = run(spec, tap_tiles=[(0, 0), (1, 1)])
    assert an.verdict is Verdict.MATCH, [(s.name, s.teacher_forced.status, s.chained.status) for s in an.stages]
    assert not an.cross_check


def test_padding_confound_is_excluded_and_said():
    # batch 8 < MMA tile: rows past M hold stale data in the taps; the kernel is still correct
    spec = ProblemSpec(m=8, n=128, k=192, tile=Tile(64, 64, 64), swizzle_a=128, swizzle_b=128)
    an = run(spec, tap_tiles=[(0, 0), (0, 1)], stale_padding=True)
    assert an.verdict is Verdict.MATCH
    assert any(h.kind is ConfoundKind.PADDING for h in an.handled_confounds)


def test_uncontrolled_inputs_make_a_draft():
    spec = BASE
    ops = make_operands(spec, "random", seed=3)
    rec = simulate(spec, ops, Provenance("dump", source="capture.safetensors"),
                   injection=Injection("mma_kblock_twice", (1, 0), 1), tap_tiles=[(1, 0)])
    an = analyze(rec)
    assert an.first.stage == "mma" and an.kind is Kind.DRAFT
    assert any(c.kind is ConfoundKind.UNCONTROLLED_INPUTS for c in an.open_confounds)


def test_without_taps_only_the_output_is_judged_as_a_draft():
    an = run(BASE, "mma_kblock_twice", tap_tiles=[])
    assert an.verdict is Verdict.DIVERGED and an.first.stage == "epilogue_store"
    assert not an.diagnosis.root_cause and an.kind is Kind.DRAFT
    assert an.first.tile == (1, 0)


def test_partial_fragment_taps_still_localise():
    an = run(BASE, "mma_kblock_twice", partial_mma=True)
    assert an.first.stage == "mma" and an.first.k_block == 1


def test_index_input_names_the_source_of_a_misplaced_element():
    an = run(BASE, "load_transposed", ladder="index")
    assert an.first.stage == "load_a" and "encodes A[" in an.first.hint


def test_ktag_input_names_the_k_block_counted_twice():
    an = run(BASE, "mma_kblock_twice", ladder="ktag", kb=2)
    assert an.first.stage == "mma" and an.first.k_block == 2
    assert "j mod 16 = 2 was summed once too often" in an.first.hint


def _scaled_by(factor, finish):
    """mma_sample_finish with its accumulator multiplied by `factor` (a broken spec), S as it is."""
    def broken(*a, **k):
        acc, s = finish(*a, **k)
        return acc * factor, s
    return broken


def test_broken_reference_makes_the_oracle_untrusted(monkeypatch):
    from kernels_ref import mma_sample

    real = mma_sample.mma_sample_finish
    monkeypatch.setattr(mma_sample, "mma_sample_finish", _scaled_by(1.5, real))
    an = run(BASE, "mma_kblock_twice")
    assert an.verdict is Verdict.ORACLE_UNTRUSTED and an.cross_check


def test_a_whole_output_accumulator_off_the_checked_trajectory_makes_the_oracle_untrusted(monkeypatch):
    """The verdict reads the statistics kernel's accumulator (its own kernel on the GPU); the cross-check
    holds it to the trajectory it checks against the host spec, bit for bit on the sampled tiles."""
    from kernels_ref import mma_stats

    real = mma_stats.accumulate_stats

    def off_by_an_ulp(*a, **k):
        acc, s, st = real(*a, **k)
        acc[64, 0] = torch.nextafter(acc[64, 0], torch.tensor(float("inf")))  # in tile (1, 0), the one sampled
        return acc, s, st

    monkeypatch.setattr(mma_stats, "accumulate_stats", off_by_an_ulp)
    monkeypatch.setattr("kernels_ref.mma.accumulate_stats", off_by_an_ulp)
    an = run(BASE, "mma_kblock_twice")
    assert an.verdict is Verdict.ORACLE_UNTRUSTED
    assert any("whole-output reference accumulator" in c for c in an.cross_check)


@pytest.mark.parametrize("broken", [None, "load", "mma", "epilogue"])
def test_the_cross_checks_host_side_on_a_worker_thread_finds_what_it_finds_inline(monkeypatch, broken):
    """start_cross_check(background=True), the GPU's path (its host side on a worker thread while
    the stages run): the same problems as run inline, the worker's torch on one thread and the
    caller's threads untouched, and an error on the worker raised by `result`."""
    import torch

    from kernels_ref import epilogue as ref_epilogue
    from kernels_ref import load as ref_load
    from kernels_ref import mma_sample
    from oracle.judging.differential import cross_check as cc
    from oracle.judging.differential.context import Context

    if broken == "load":
        real_load = ref_load.load_tile_host
        monkeypatch.setattr(ref_load, "load_tile_host", lambda *a, **k: real_load(*a, **k) + 1)
    if broken == "mma":
        real = mma_sample.mma_sample_finish
        monkeypatch.setattr(mma_sample, "mma_sample_finish", _scaled_by(1.5, real))
    if broken == "epilogue":  # the cast's spec off by a factor: its input is read from the copied accumulator
        real_cast = ref_epilogue.apply_cast_host
        monkeypatch.setattr(ref_epilogue, "apply_cast_host", lambda x, *a, **k: real_cast(x * 2, *a, **k))
    seen = []
    real_dis = cc.disagreement
    monkeypatch.setattr(cc, "disagreement",
                        lambda *a, **k: (seen.append(torch.get_num_threads()), real_dis(*a, **k))[1])
    ops = make_operands(BASE, "random", 0)
    rec = simulate(BASE, ops, Provenance("random", 0), tap_tiles=[(0, 0)])
    ctx = Context.of(rec, torch.device("cpu"))
    tiles = [(0, 0), (BASE.tiles_m - 1, BASE.tiles_n - 1)]
    inline = cc.start_cross_check(ctx, tiles, background=False).result()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen.clear()
        pending = cc.start_cross_check(ctx, tiles, background=True)
        assert torch.get_num_threads() == 2
        assert pending.result() == inline
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    if "OpenMP" in torch.__config__.parallel_info():  # each thread its own count
        assert seen and set(seen) == {1}, seen
    assert bool(inline) == (broken is not None)
    if broken == "load":
        assert any(p.startswith("load_a tile") for p in inline), inline
    if broken == "mma":
        assert any(p.startswith("mma tile") for p in inline), inline
    if broken == "epilogue":
        assert inline == [f"epilogue_cast tile {t}: Triton != host spec" for t in tiles], inline

    def fails(*a, **k):
        raise RuntimeError("planted")

    monkeypatch.setattr(cc, "disagreement", fails)
    pending = cc.start_cross_check(ctx, tiles, background=True)
    with pytest.raises(RuntimeError, match="planted"):
        pending.result()


def test_a_forked_child_gets_its_own_cross_check_worker(monkeypatch):
    """A child forked after the worker started has no such thread: it makes its own, and the work
    submitted there runs."""
    from oracle.judging.differential import cross_check as cc

    first = cc._executor()
    assert cc._executor() is first
    monkeypatch.setattr(cc, "_EXECUTOR", first)  # both restored after the test
    monkeypatch.setattr(cc, "_EXECUTOR_PID", cc._EXECUTOR_PID)
    pid = cc.os.getpid()
    monkeypatch.setattr(cc.os, "getpid", lambda: pid + 1)
    child = cc._executor()
    try:
        assert child is not first and child.submit(lambda: 7).result(timeout=60) == 7
    finally:
        child.shutdown()


def test_kernel_error_with_no_output():
    ops = make_operands(BASE, "random", 0)
    rec = simulate(BASE, ops, Provenance("random", 0), tap_tiles=[(0, 0)])
    rec = dataclasses.replace(rec, output=None, kernel_error="CUDA_ERROR_ILLEGAL_ADDRESS (700)")
    an = analyze(rec)
    assert an.verdict is Verdict.KERNEL_ERROR
    assert [s.name for s in an.stages][:2] == ["descriptor_a", "descriptor_b"]  # recovered taps still judged


def test_all_zero_inputs_are_mistrusted():
    import torch

    ops = make_operands(BASE, "random", 0)
    zeros = dataclasses.replace(ops, a=torch.zeros_like(ops.a), b=torch.zeros_like(ops.b))
    rec = simulate(BASE, zeros, Provenance("random", 0), tap_tiles=[])
    assert analyze(rec).verdict is Verdict.MISTRUSTED


def test_the_cross_checks_one_copy_keeps_every_tensor_whole_whatever_its_dtype():
    # one-byte fp8 operands beside float64 accumulators: every slice must start where its dtype can view it
    import torch

    from oracle.judging.differential.cross_check import pack_bytes, unpack_bytes

    g = torch.Generator().manual_seed(5)
    ts = [torch.randn(3, 5, generator=g).to(torch.float8_e4m3fn), None,
          torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(5, generator=g).bfloat16(),
          torch.arange(3, dtype=torch.int32), torch.randn(1, generator=g).half(),
          torch.randn(6, 4, generator=g)[1:5:2, 1:3], torch.zeros(0, 3), torch.tensor([True, False, True])]
    packed, offsets = pack_bytes(ts, "cpu")
    assert all(o % t.element_size() == 0 for t, o in zip(ts, offsets) if t is not None)
    back = unpack_bytes(packed.clone(), ts, offsets)
    for t, u in zip(ts, back):
        assert (t is None) == (u is None)
        if t is not None:
            assert u.dtype == t.dtype and u.shape == t.shape
            assert torch.equal(u.view(torch.uint8), t.contiguous().view(torch.uint8))


def test_the_cross_check_works_on_one_host_thread_and_gives_the_count_back(monkeypatch):
    import torch

    from oracle.judging.differential import cross_check as cc

    seen = []
    real = cc.disagreement
    monkeypatch.setattr(cc, "disagreement", lambda *a, **k: (seen.append(torch.get_num_threads()), real(*a, **k))[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        an = run(BASE)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    assert an.verdict is Verdict.MATCH and not an.cross_check


def test_the_phases_add_up_to_the_analysis():
    import time

    t0 = time.perf_counter()
    an = run(BASE)
    wall = (time.perf_counter() - t0) * 1e3
    names = [n for n, _ in an.phases]
    assert names == ["context", "reference_gemm", "reference_chain", "cross_check", "descriptor_load", "mma_reduce",
                     "epilogue_store",
                     "cross_check_host", "findings", "compare"]
    assert all(ms >= 0 for _, ms in an.phases)
    assert sum(ms for n, ms in an.phases if n != "compare") <= wall

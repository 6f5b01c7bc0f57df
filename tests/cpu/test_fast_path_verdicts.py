"""No verdict moves between the comparators: recordings judged with every whole-output comparison
on the one-pass comparator, its units kept as a device table (what a large CUDA output takes), give
the verdict, the first divergence, the failing tiles and the worst-tile numbers the torch
specification (compare_reference, every unit on the host) gives. Under the Triton interpreter."""

import math

import pytest
import torch

from oracle.judging import compare as compare_mod
from oracle.judging.compare_fast import check_supported, compare_fast
from oracle.judging.compare_fast import results as fast_results
from oracle.judging.differential import analyze, judge
from oracle.run.recording import Recording
from oracle.tools.api import recording_of
from zoo_cases import ROOT  # tests/ is on sys.path

DUMPS = ("hopper_bf16_correct", "hopper_bf16_kblock_twice", "hopper_bf16_swapped_store", "sm80_bf16_alpha_twice")


def _fast_whole_outputs(received, expected, *, bound=None, mask=None, unwritten=None, **kw):
    """compare(), sending every split comparison (the whole output's) to compare_fast as a large
    CUDA tensor is sent."""
    if kw.get("tile_shape") is not None and not (unwritten is not None and bool(unwritten.any())) and \
            received.shape == expected.shape and (bound is not None or received.dtype == expected.dtype) and \
            not check_supported(received, expected, bound=bound, mask=mask):
        return compare_fast(received, expected, bound=bound, mask=mask, **kw)
    return compare_mod.compare(received, expected, bound=bound, mask=mask, unwritten=unwritten, **kw)


def _worst(c):
    w = c.worst
    return None if w is None else (w.tile, w.k_block, w.partial, w.compared, w.mismatches, w.max_abs_err,
                                   repr(w.first_bad), w.fed_by)


def _same(fast, ref):
    assert fast.verdict is ref.verdict, (fast.diagnosis, ref.diagnosis)
    assert fast.diagnosis == ref.diagnosis
    key = (lambda f: None if f is None else (f.stage, f.tile, f.k_block, f.kind, f.partial))
    assert key(fast.first) == key(ref.first)
    tabled = 0
    for sf, sr in zip(fast.stages, ref.stages):
        for cf, cr in ((sf.teacher_forced, sr.teacher_forced), (sf.chained, sr.chained)):
            tabled += bool(cf.tables)
            assert cf.status is cr.status, sf.name
            assert (cf.units, cf.failing_units, cf.compared, cf.mismatches, cf.bad_tiles) == \
                (cr.units, cr.failing_units, cr.compared, cr.mismatches, cr.bad_tiles), sf.name
            assert _worst(cf) == _worst(cr), sf.name
            if cr.worst is not None and not math.isnan(cr.worst.max_ratio):
                assert math.isclose(cf.worst.max_ratio, cr.worst.max_ratio, rel_tol=2e-6, abs_tol=1e-300), sf.name
    return tabled


def _both(rec, monkeypatch):
    ref = analyze(rec)
    with monkeypatch.context() as m:
        m.setattr(judge, "compare", _fast_whole_outputs)
        m.setattr(fast_results, "HOST_UNITS", 0)
        fast = analyze(rec)
    return fast, ref


@pytest.mark.parametrize("name", DUMPS)
def test_a_recording_gets_the_same_judgement_from_both_comparators(name, monkeypatch):
    rec = Recording.load(str(ROOT / "tests" / "zoo" / "dumps" / f"{name}.safetensors.gz"))
    fast, ref = _both(rec, monkeypatch)
    assert _same(fast, ref) >= 1  # the output stage took the table


@pytest.mark.parametrize("bad", [(), ((1, 2),), ((0, 0), (3, 3), (2, 1))])
def test_an_output_only_check_gets_the_same_judgement_from_both_comparators(bad, monkeypatch):
    g = torch.Generator().manual_seed(len(bad))
    a = torch.randn(128, 64, generator=g).bfloat16()
    b = torch.randn(64, 128, generator=g).bfloat16()
    d = (a.float() @ b.float()).bfloat16()
    for tm, tn in bad:
        d[tm * 32 + 5, tn * 32 + 7] += 4
    rec = recording_of(a, b, d, tile=(32, 32, 32))
    fast, ref = _both(rec, monkeypatch)
    assert _same(fast, ref) == 1
    assert fast.stages[-1].chained.bad_tiles == set(bad)
    assert ref.verdict.value == ("MATCH" if not bad else "DIVERGED")

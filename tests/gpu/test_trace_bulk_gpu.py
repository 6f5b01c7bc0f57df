"""The bulk trace reader on sinks real kernels wrote: the zoo's Hopper GEMM at 4096^3 with the warm
path's 8 tiles and every k-block (109 MB), and smaller runs of the Hopper, SM80 and example GEMMs.
Each sink is read in bulk (the bulk reader takes it) with the result of the record-by-record parser."""

from __future__ import annotations

import time

import pytest
import torch
from zoo_cases import ROOT  # tests/ is on sys.path

from harness.trace_format import parse_header
from harness.trace_format.bulk import read_bulk
from harness.trace_format.header import _buffer
from harness.trace_format.parser import _expected_shape, _parse, _parse_descriptor
from oracle.run.case import load_case
from oracle.run.case_types import with_trace
from oracle.run.inputs import Provenance, make_operands
from oracle.run.live import run_live

pytestmark = pytest.mark.gpu
HOPPER = ROOT / "zoo" / "hopper_gemm" / "hopper_gemm.toml"
TILES = ((0, 0), (31, 31), (0, 31), (31, 0), (15, 16), (16, 15), (7, 23), (23, 7))  # benchmarks/warm_path.py
RUNS = [(HOPPER, None, dict(m=4096, n=4096, k=4096), TILES),
        (HOPPER, None, dict(m=300, n=392, k=520), None),
        (ROOT / "zoo" / "sm80_gemm" / "sm80_gemm.toml", "zoo_sm80_bf16_traced", dict(m=257, n=129, k=1000), None),
        (ROOT / "harness" / "examples" / "simple_gemm.toml", "simple_gemm_bf16_traced", dict(m=200, n=136, k=72),
         None)]


def _summary(res) -> tuple:
    taps = tuple((t.stage, t.tile, t.k_block, t.slot, t.cta, t.partial, t.group, t.values.dtype,
                  tuple(t.values.shape), t.values.contiguous().view(-1).view(torch.uint8).numpy().tobytes(),
                  None if t.mask is None else t.mask.numpy().tobytes()) for t in res.taps)
    return (taps, res.descriptors, res.dropped, res.records, res.warnings, res.torn, res.needed_bytes)


@pytest.mark.parametrize("case_path, entry, problem, tiles", RUNS,
                         ids=[f"{p.parent.name}-{d['m']}x{d['n']}x{d['k']}" for p, _, d, _ in RUNS])
def test_a_real_sink_is_read_in_bulk_with_the_strict_result(case_path, entry, problem, tiles):
    case = load_case(str(case_path), problem, entry=entry)
    if tiles is not None:
        case = with_trace(case, tiles, None, None)
    ops = make_operands(case.spec, "random", 1, generator="cuda")
    live = run_live(case, ops, Provenance("random", 1, generator="cuda"), timeout_s=300)
    assert live.run.ok and live.run.sink is not None, live.run.describe() + "\n" + live.run.stderr_tail
    t = case.spec.tile
    blocks = dict(block_m=t.bm, block_n=t.bn, block_k=t.bk)
    mv = _buffer(live.run.sink)
    assert read_bulk(mv, parse_header(mv), tap_limit=1 << 40, expected_shape=_expected_shape,
                     parse_descriptor=_parse_descriptor, **blocks) is not None
    t0 = time.perf_counter()
    bulk = _parse(live.run.sink, bulk=True, **blocks)
    t1 = time.perf_counter()
    strict = _parse(live.run.sink, bulk=False, **blocks)
    t2 = time.perf_counter()
    print(f"{case_path.name} {problem}: {bulk.records} records, {bulk.used_bytes} bytes; bulk {t1 - t0:.3f} s, "
          f"record by record {t2 - t1:.3f} s")
    assert bulk.taps and _summary(bulk) == _summary(strict)

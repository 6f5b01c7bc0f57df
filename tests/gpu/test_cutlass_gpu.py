"""GPU: CUTLASS's own SM90 GEMM through the CUTLASS adapter (zoo/cutlass_sm90), beyond the zoo's
judgements (tests/gpu/test_zoo.py -k cutlass_sm90):

- the traced build (tap nodes, serialised mainloop, the binding in shared memory) computes the
  same D, bit for bit, as CUTLASS's production build, for both schedules, ragged and square, in
  bf16 and in e4m3 with per-tensor scales (FP8FastAccum: the serialised waits change no sum);
- every traced tile's taps are bound to that tile: the mma taps of each selected tile cover all
  its k-blocks, once per k-block and element, and no tap names a tile outside the selection.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from oracle.run.case import load_case
from oracle.run.case_types import with_trace
from oracle.judging.differential import expected_output
from oracle.run.inputs import Provenance, make_operands
from oracle.run.launch import from_storage
from oracle.run.live import run_live
from oracle.run.races import run_untraced

pytestmark = pytest.mark.gpu

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "cutlass_sm90"


@pytest.mark.parametrize("case_file", ["cutlass_sm90.toml", "pingpong.toml", "e4m3.toml", "pingpong_e4m3.toml"])
@pytest.mark.parametrize("problem", [{"m": 300, "n": 392, "k": 520}, {"m": 1024, "n": 2048, "k": 1024}],
                         ids=["ragged", "square"])
def test_traced_and_production_builds_agree_and_taps_name_their_tiles(case_file, problem):
    if "e4m3" in case_file and problem["k"] % 16:  # e4m3 rows of 16-byte multiples: K 528, 4 k-blocks and 16
        problem = dict(problem, k=problem["k"] + 8)
    case = load_case(str(ZOO / case_file), problem, allow_library=True)
    tiles = ((0, 0), (case.spec.tiles_m - 1, case.spec.tiles_n - 1))
    case = with_trace(case, tiles, None)
    ops = make_operands(case.spec, "random", 7)
    live = run_live(case, ops, Provenance("random", 7), timeout_s=120)
    assert live.run.ok, live.run.describe() + "\n" + live.run.stderr_tail
    plain = run_untraced(case, ops, timeout_s=120)
    assert plain.ok, plain.describe() + "\n" + plain.stderr_tail
    traced_d = live.recording.output
    plain_d = from_storage(plain.outputs["d"], case.spec.d_major)
    tb, pb = traced_d.contiguous().view(torch.int16), plain_d.contiguous().view(torch.int16)
    diff = tb != pb
    why = (f"traced and production D differ at {int(diff.sum())} of {diff.numel()} elements, first "
           f"{diff.nonzero()[:4].tolist()}, at most {int((tb.int() - pb.int()).abs().max())} bf16 ulps")
    if case.spec.resolved_acc_model == "fp8_fast":
        # not bit for bit (the adapter's serialisation note says so): each build within the oracle's bound
        y, bound = expected_output(case.spec, ops)
        for name, d in (("traced", traced_d), ("production", plain_d)):
            err = (d.double().to(y.device) - y.double()).abs()
            assert bool((err <= bound).all()), f"the {name} D exceeds the oracle's bound; {why}"
        assert int(diff.sum()) <= diff.numel() // 1000, why
    else:
        assert not bool(diff.any()), why

    taps = live.recording.taps
    assert {t.tile for t in taps} == set(tiles), sorted({t.tile for t in taps})
    k_blocks = case.spec.k_blocks
    for tile in tiles:
        per_kb = Counter(t.k_block for t in taps if t.stage == "mma" and t.tile == tile)
        assert set(per_kb) == set(range(k_blocks)), (tile, sorted(per_kb))

"""The zoo manifest's verdicts for CUTLASS's blockwise-scaled fp8 GEMM (zoo/cutlass_sm90/blockwise.cu), on a model
of the traced kernel (no GPU).

The model taps what the traced blockwise collective (harness/include/oracle_trace/cutlass/sm90_blockwise.hpp)
taps: the descriptor images and load views of each k-block (oracle.run.simulate's, which do not depend on the
scales), the scales each k-block applies (scale_a [BM, 1] per row, scale_b [BN, 1] per column), and the
accumulator after each promotion as CUTLASS's GmmaFP8Accumulation computes it: p = fp32(A_kb @ B_kb),
s = fp32(sa * sb), acc = fp32(acc + p * s) (one rounding: an FFMA); then the LinearCombination epilogue
(alpha * acc + beta * C, the cast to bf16). The planted defects change the scale registers as the traced
collective's mutations do: B's read at the tile's first k-block only (blockwise_scale_b_hoisted), A's
partitioned by the thread's index in its warp group, so rows 64..127 apply rows 0..63's scales
(blockwise_scale_a_group_rows). Each entry must be judged as the manifest says. What this cannot show, that the
CUDA code does what the model does, the GPU tier does once the entries are recorded.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from zoo_cases import check_judgement, entries, entry_case  # tests/ is on sys.path

from harness.taps import Tap
from kernels_ref import scales as ref_scales
from kernels_ref.dtypes import DTYPES
from oracle.judging.differential import analyze
from oracle.problem.spec import Scale
from oracle.run.inputs import Provenance, make_operands
from oracle.run.library_epilogue import with_library_order
from oracle.run.recording import Recording
from oracle.run.simulate import simulate

LIBRARY_ORDER = ("alpha_beta", "cast")  # what the traced LinearCombination tree declares
WARP_GROUP_ROWS = 64  # the rows of the tile one consumer warp group holds (cooperative, 128-row tile)


def _blockwise_entries() -> list[dict]:
    return entries("zoo/cutlass_sm90/blockwise.cu")


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.float().double()


def model(case, ops, provenance, defect) -> Recording:
    """The recording the traced blockwise kernel makes with `defect` (None: correct), tapping the case's tiles."""
    spec = case.spec
    t = spec.tile
    bm, bn, bk = t.bm, t.bn, t.bk
    tiles = set(case.trace.tiles)
    unscaled = replace(spec, scale_a=Scale(), scale_b=Scale(), promotion_interval=None)
    images = simulate(unscaled, replace(ops, scale_a=None, scale_b=None), provenance, tap_tiles=sorted(tiles))
    taps = [x for x in images.taps if x.stage in ("descriptor_a", "descriptor_b", "load_a", "load_b")]
    a = torch.zeros(spec.tiles_m * bm, spec.k_blocks * bk, dtype=torch.float64)
    a[:spec.m, :spec.k] = ops.a.double()
    b = torch.zeros(spec.k_blocks * bk, spec.tiles_n * bn, dtype=torch.float64)
    b[:spec.k, :spec.n] = ops.b.double()
    va = ref_scales.scale_values(ops.scale_a, spec.scale_a.dtype)
    vb = ref_scales.scale_values(ops.scale_b, spec.scale_b.dtype)
    gk = spec.scale_a.block[1]
    c = torch.zeros(spec.tiles_m * bm, spec.tiles_n * bn, dtype=torch.float64)
    c[:spec.m, :spec.n] = ops.c.double()
    d = torch.zeros(spec.tiles_m * bm, spec.tiles_n * bn, dtype=DTYPES[spec.out_dtype].torch)
    for tm in range(spec.tiles_m):
        for tn in range(spec.tiles_n):
            here, rows, cols = (tm, tn), slice(tm * bm, (tm + 1) * bm), slice(tn * bn, (tn + 1) * bn)
            acc = torch.zeros(bm, bn, dtype=torch.float64)
            sb0 = None
            for kb in range(spec.k_blocks):
                sa = ref_scales.tile_scales(va, spec.scale_a.block[0], gk, tm * bm, bm, kb, bk, spec.m)
                sb = ref_scales.tile_scales(vb, spec.scale_b.block[0], gk, tn * bn, bn, kb, bk, spec.n)
                sb0 = sb if sb0 is None else sb0
                if defect == "blockwise_scale_b_hoisted":
                    sb = sb0
                if defect == "blockwise_scale_a_group_rows":
                    sa = torch.cat([sa[:WARP_GROUP_ROWS], sa[:WARP_GROUP_ROWS]])
                p = _f32(a[rows, kb * bk:(kb + 1) * bk] @ b[kb * bk:(kb + 1) * bk, cols])
                s = _f32(sa[:, :1] * sb[:, 0][None, :])
                acc = _f32(acc + p * s)
                if here in tiles:
                    taps += [Tap("scale_a", here, sa.float(), k_block=kb), Tap("scale_b", here, sb.float(), k_block=kb),
                             Tap("mma", here, acc.float(), k_block=kb)]
            y = _f32(spec.alpha * acc + spec.beta * c[rows, cols])
            out = y.float().to(DTYPES[spec.out_dtype].torch)
            if here in tiles:
                taps += [Tap("epilogue_alpha_beta", here, y.float()), Tap("epilogue_cast", here, out)]
            d[rows, cols] = out
    name = "simulated_cutlass_blockwise" + (f"[{defect}]" if defect else "")
    return Recording(spec=spec, operands=ops, output=d[:spec.m, :spec.n].contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=name, synthetic=True)


def test_the_manifest_has_the_blockwise_entries():
    names = {e["name"] for e in _blockwise_entries()}
    assert names == {"cutlass_sm90_blockwise_correct_ragged", "cutlass_sm90_blockwise_scale_b_hoisted",
                     "cutlass_sm90_blockwise_scale_a_group_rows"}, names


@pytest.mark.slow
@pytest.mark.parametrize("entry", _blockwise_entries(), ids=lambda e: e["name"])
def test_blockwise_entry_on_a_model(entry):
    case, _ = with_library_order(entry_case(entry), LIBRARY_ORDER)  # as a live run resolves it
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    rec = model(case, ops, Provenance("random", seed), entry["defect"])
    check_judgement(entry["expected_stage"], case, analyze(rec), entry)

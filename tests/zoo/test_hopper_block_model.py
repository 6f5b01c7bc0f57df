"""The zoo manifest's verdicts for the Hopper GEMM's fp8 block-scale entries, on a model (no GPU).

The correct run is oracle.run.simulate's model of a tiled GEMM (descriptor images, load views, the
fp32 accumulator promoted per k-block with the 1 x 128 / 128 x 128 block scales, the epilogue); a
defective one takes its mma taps from the planted defect of zoo/hopper_gemm/hopper_gemm.cu applied to
the model's own load taps and scales: A's scale read for the k-block before (scale_prev_kblock), the
scales applied twice (block_scale_twice), k-block 0 not promoted and summed into k-block 1's partial
(skip_promotion), and A's MN-major scales read as if k-major by the kernel that expects them so
(mn_scales_read_k_major). Each manifest entry at the shape it is recorded at must be judged as the manifest
says: the correct ones MATCH, the defects are found at mma at their tile and k-block with nothing
upstream diverging. The GPU tier (tests/gpu/test_zoo.py) shows the CUDA code does what this models.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from zoo_cases import check_judgement, entries, entry_case  # tests/ is on sys.path

from harness.taps import Tap
from oracle.judging.differential import analyze
from oracle.run.inputs import Provenance, make_operands
from oracle.run.simulate import simulate


def _block_entries() -> list[dict]:
    return [e for e in entries("zoo/hopper_gemm/") if e["kernel"].partition(":")[2].startswith("zoo_hopper_e4m3_block")]


def _defective_mma(spec, ops, taps, defect: str) -> list[Tap]:
    """The mma taps of the defective kernel, from the recorded load taps and the operands' scales."""
    bm, bn, bk = spec.tile.bm, spec.tile.bn, spec.tile.bk
    gm, gk = spec.scale_a.block
    gn = spec.scale_b.block[0]
    loads = {(t.stage, t.tile, t.k_block): t.values for t in taps if t.stage in ("load_a", "load_b")}
    out = []
    for tile in sorted({t.tile for t in taps if t.stage == "mma"}):
        tm, tn = tile
        rows = (tm * bm + torch.arange(bm)).clamp(max=spec.m - 1) // gm
        cols = (tn * bn + torch.arange(bn)).clamp(max=spec.n - 1) // gn
        acc = torch.zeros(bm, bn)
        carry = torch.zeros(bm, bn)  # skip_promotion: the partial left in the WGMMA accumulator
        for kb in range(spec.k_blocks):
            part = carry + loads[("load_a", tile, kb)].float() @ loads[("load_b", tile, kb)].float()
            carry = torch.zeros(bm, bn)
            g = kb * bk // gk
            ga = g - 1 if defect == "scale_prev_kblock" and kb > 0 else g
            sa = ops.scale_a[rows, ga]
            if defect == "mn_scales_read_k_major":  # the [kbs, M] buffer read at m * kbs + kb
                sa = ops.scale_a.t().contiguous().flatten()[rows * spec.k_blocks + ga]
            s = sa[:, None] * ops.scale_b[cols, g][None, :]
            if defect == "skip_promotion" and kb == 0 and spec.k_blocks > 1:
                carry = part
            else:
                q = part * s
                if defect == "block_scale_twice":
                    q = q * s
                acc = acc + q
            out.append(Tap("mma", tile, acc.clone(), k_block=kb))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("entry", _block_entries(), ids=lambda e: e["name"])
def test_block_scale_entry_on_a_model(entry):
    case = entry_case(entry, entry.get("record_problem") or entry["problem"])
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    rec = simulate(case.spec, ops, Provenance("random", seed), tap_tiles=case.trace.tiles)
    if entry["defect"] is not None:
        taps = [t for t in rec.taps if t.stage != "mma"] + _defective_mma(case.spec, ops, rec.taps, entry["defect"])
        rec = replace(rec, taps=tuple(taps))
    check_judgement(entry["expected_stage"], case, analyze(rec), entry)

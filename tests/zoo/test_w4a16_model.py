"""The zoo manifest's verdicts for the W4A16 GEMM, on a Python model of the kernel (no GPU).

The model walks the kernel's schedule (zoo/w4a16_sm80/w4a16_gemm.cu) in plain torch: per tile and
k-block the A tile and the packed B bytes of the slot the MMAs read (the previous k-block's for
stale_b), the nibbles of each byte (swapped for nibble_order), the group, zero point and scale of the
k-block (group_index, scale_group, zero_twice), w = fp16((q - z) * s) rounded once, the fp32
accumulator per k16 MMA (k-block 1 twice for kblock_twice), alpha and the fp16 cast; it taps what the
traced kernel taps on the tiles the entry selects. Each manifest entry, at the shape it is recorded
at, analysed by the oracle, must reach the entry's expected stage at its tile and k-block (MATCH
where none), nothing upstream diverging. What this cannot show, that the CUDA code does what the
model does, the GPU tier (tests/gpu/test_zoo.py) does.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from zoo_cases import check_judgement, entries, entry_case  # tests/ is on sys.path

from harness.taps import Tap
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec
from oracle.run.inputs import Operands, Provenance, make_operands
from oracle.run.recording import Recording

MMA_K = 16
GROUP = 128  # kGroup in w4a16_layout.cuh


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def model(spec: ProblemSpec, ops: Operands, provenance: Provenance, defect: Optional[str], tapped) -> Recording:
    """What the traced kernel records and stores, for the variant with `defect` (None: correct)."""
    bm, bn, bk = spec.tile.bm, spec.tile.bn, spec.tile.bk
    m, n, k = spec.m, spec.n, spec.k
    tiles_m, tiles_n, kbs = spec.tiles_m, spec.tiles_n, spec.k_blocks
    groups = k // GROUP
    a_full = _pad(ops.a, tiles_m * bm, k)
    b_full = _pad(ops.b, k // 2, tiles_n * bn)  # packed [K / 2, N] bytes, zero past N
    s_full = _pad(ops.b_scales, groups, tiles_n * bn).double()
    z_full = _pad(ops.b_zeros, groups, tiles_n * bn).double()
    out = torch.zeros(tiles_m * bm, tiles_n * bn, dtype=torch.float16)
    taps: list[Tap] = []
    for tm in range(tiles_m):
        for tn in range(tiles_n):
            here = (tm, tn)
            cols = slice(tn * bn, (tn + 1) * bn)
            acc = torch.zeros(bm, bn)
            for kb in range(kbs):
                a_tile = a_full[tm * bm:(tm + 1) * bm, kb * bk:(kb + 1) * bk]
                kb_b = kb - 1 if defect == "stale_b" and kb == kbs - 1 and kb > 0 else kb
                packed = b_full[kb_b * bk // 2:(kb_b + 1) * bk // 2, cols]
                lo, hi = (packed & 0xF).double(), (packed >> 4).double()
                if defect == "nibble_order":
                    lo, hi = hi, lo
                q = torch.stack((lo, hi), dim=1).reshape(bk, bn)  # k = 2r + nibble
                g = kb * bk // GROUP
                if defect == "group_index":
                    g = min(kb, groups - 1)
                gs = min(g + 1, groups - 1) if defect == "scale_group" else g
                z, s = z_full[g, cols], s_full[gs, cols]
                t = q - z
                if defect == "zero_twice":
                    t = t - z
                w = (t * s).half()  # the product is exact in float64: one rounding
                for _ in range(2 if defect == "kblock_twice" and kb == 1 else 1):
                    for ks in range(0, bk, MMA_K):
                        acc = acc + a_tile[:, ks:ks + MMA_K].float() @ w[ks:ks + MMA_K, :].float()
                if here in tapped:
                    taps.append(Tap("load_a", here, a_tile.clone(), k_block=kb, slot=kb % 2))
                    taps.append(Tap("load_b", here, packed.clone(), k_block=kb, slot=kb_b % 2))
                    taps.append(Tap("dequant_b", here, w.clone(), k_block=kb))
                    taps.append(Tap("mma", here, acc.clone(), k_block=kb))
            v = acc * torch.tensor(spec.alpha, dtype=torch.float32)
            cast = v.half()
            if here in tapped:
                taps.append(Tap("epilogue_alpha_beta", here, v.clone()))
                taps.append(Tap("epilogue_cast", here, cast.clone()))
            out[tm * bm:(tm + 1) * bm, cols] = cast
    return Recording(spec=spec, operands=ops, output=out[:m, :n].contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=f"model of zoo_w4a16_uint4[{defect or 'correct'}]", synthetic=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry", entries("zoo/w4a16_sm80/"), ids=lambda e: e["name"])
def test_manifest_entry_on_the_kernel_model(entry):
    problem = entry.get("record_problem") or entry["problem"]
    case = entry_case(entry, problem)
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    rec = model(case.spec, ops, Provenance("random", seed), entry["defect"], set(case.trace.tiles))
    check_judgement(entry["expected_stage"], case, analyze(rec), entry)

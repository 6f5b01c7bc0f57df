"""The zoo manifest's verdicts for the MXFP8 GEMM (zoo/mx_sm80/), on a Python model of the kernel (no GPU).

The model walks the kernel's schedule in plain torch: tiles in the grouped launch order (block index ->
tile), split-K shares, per k-block the fp8 tiles as the copies leave them (zero past M, N and K), one
scale register per (row of A or column of B, scale group) that keeps its value across k-blocks, each
32-wide K block dequantised as bf16(fp32(x * s)), the fp32 accumulator per k16 MMA, the partials
summed in order, alpha and the bf16 cast; the planted defects (mx_sm80.cu's header) change which
scale a register is loaded with, or whether it is loaded at all. It taps what the traced kernel taps
on the tiles an entry selects. Each manifest entry, at its shape and seed, analysed by the oracle,
must reach the entry's expected stage at its tile, k-block and split (MATCH where none) as a VERDICT
with nothing upstream diverging; on the `scales` input ladder (power-of-two scales per block) each
defect is also named by the scale it applied. What this cannot show, that the CUDA code does what the
model does, the GPU tier (tests/gpu/test_zoo.py) does.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from zoo_cases import check_judgement, entries, entry_case  # tests/ is on sys.path

from harness.taps import Tap
from kernels_ref.scales import scale_values
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec
from oracle.run.inputs import Operands, Provenance, make_operands
from oracle.run.recording import Recording
from oracle.run.scale_model import launch_order

MMA_K = 16
GROUP = 32  # kGroup in mx_sm80.cu: the MX block along K


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols)
    out[:x.shape[0], :x.shape[1]] = x.float()
    return out


def _shares(spec: ProblemSpec) -> list[tuple[Optional[int], int, int]]:
    """(split, first k-block, end) of each non-empty split: the kernel's cdiv shares."""
    kbs, splits = spec.k_blocks, spec.splits
    share = -(-kbs // splits)
    out = [(s, s * share, min(kbs, (s + 1) * share)) for s in range(splits)]
    return [(s if splits > 1 else None, b, e) for s, b, e in out if b < e]


def _load(values: torch.Tensor, rows: torch.Tensor, bound: int, g: int) -> torch.Tensor:
    """The scale registers of `rows` for group g (clamped to the last), 0 at and past `bound`."""
    g = min(g, values.shape[1] - 1)
    picked = values[rows.clamp(max=values.shape[0] - 1), g]
    return torch.where(rows < bound, picked, torch.zeros(())).float()


def model(spec: ProblemSpec, ops: Operands, provenance: Provenance, defect: Optional[str], tapped) -> Recording:
    """What the traced kernel records and stores, for the variant with `defect` (None: correct)."""
    bm, bn, bk = spec.tile.bm, spec.tile.bn, spec.tile.bk
    m, n, k, s_groups = spec.m, spec.n, spec.k, bk // GROUP
    tiles_n, kbs = spec.tiles_n, spec.k_blocks
    n_groups = -(-k // GROUP)
    a = _pad(ops.a, spec.tiles_m * bm, kbs * bk)
    bt = _pad(ops.b.t(), tiles_n * bn, kbs * bk)  # B as the kernel reads it: [N, K]
    va, vb = scale_values(ops.scale_a, "e8m0"), scale_values(ops.scale_b, "e8m0")
    e4m3, bf16 = torch.float8_e4m3fn, torch.bfloat16
    alpha = torch.tensor(spec.alpha, dtype=torch.float32)
    out = torch.zeros(spec.tiles_m * bm, tiles_n * bn, dtype=bf16)
    taps: list[Tap] = []
    for pid, (tm, tn) in launch_order(spec):
        here = (tm, tn)
        scale_tm = pid // tiles_n if defect == "scale_raw_block_index" else tm
        a_bound = min(GROUP, m) if defect == "scale_map_group_size" else m
        rows = scale_tm * bm + torch.arange(bm)
        cols = tn * bn + torch.arange(bn)
        partials = []
        for split, kb0, kb1 in _shares(spec):
            acc = torch.zeros(bm, bn)
            sa, sb = torch.zeros(bm, s_groups), torch.zeros(bn, s_groups)  # registers, kept across k-blocks
            for kb in range(kb0, kb1):
                skb = kb - kb0 if defect == "scale_split_slice0" else kb
                for j in range(s_groups):
                    g = skb * s_groups + (0 if defect == "scale_one_per_k_block" else j)
                    if defect == "scale_trailing_skipped" and g >= n_groups - 1:
                        continue  # a strict '<': the registers keep what they held
                    sa[:, j] = _load(va, rows, a_bound, g)
                    sb[:, j] = sa[:, j] if defect == "scale_b_reused" and tm >= 1 else _load(vb, cols, n, g)
                a_t = a[tm * bm:(tm + 1) * bm, kb * bk:(kb + 1) * bk]
                b_t = bt[tn * bn:(tn + 1) * bn, kb * bk:(kb + 1) * bk]
                da = (a_t * sa.repeat_interleave(GROUP, dim=1)).to(bf16).float()  # fp32 product, then bf16
                db = (b_t * sb.repeat_interleave(GROUP, dim=1)).to(bf16).float()
                for ks in range(0, bk, MMA_K):
                    acc = acc + da[:, ks:ks + MMA_K] @ db[:, ks:ks + MMA_K].t()
                if here in tapped:
                    taps.append(Tap("load_a", here, a_t.to(e4m3), k_block=kb, slot=(kb - kb0) % 2, partial=split))
                    taps.append(Tap("load_b", here, b_t.t().contiguous().to(e4m3), k_block=kb, slot=(kb - kb0) % 2,
                                    partial=split))
                    taps.append(Tap("scale_a", here, sa.clone(), k_block=kb, partial=split))
                    taps.append(Tap("scale_b", here, sb.clone(), k_block=kb, partial=split))
                    taps.append(Tap("mma", here, acc.clone(), k_block=kb, partial=split))
            partials.append(acc)
        acc = partials[0]
        if spec.splits > 1:
            acc = torch.zeros(bm, bn)
            for p in partials:
                acc = acc + p
            if here in tapped:
                taps.append(Tap("reduce", here, acc.clone()))
        v = acc * alpha
        cast = v.to(bf16)
        if here in tapped:
            taps.append(Tap("epilogue_alpha_beta", here, v.clone()))
            taps.append(Tap("epilogue_cast", here, cast.clone()))
        out[tm * bm:(tm + 1) * bm, tn * bn:(tn + 1) * bn] = cast
    return Recording(spec=spec, operands=ops, output=out[:m, :n].contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=f"model of zoo_mx_e4m3[{defect or 'correct'}]", synthetic=True)


def _entries() -> list[dict]:
    return entries("zoo/mx_sm80/")


def _analysis(entry: dict, ladder: str):
    case = entry_case(entry)
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, ladder, seed)
    rec = model(case.spec, ops, Provenance(ladder, seed), entry["defect"], set(case.trace.tiles))
    return case, analyze(rec)


@pytest.mark.slow
@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_manifest_entry_on_the_kernel_model(entry):
    case, an = _analysis(entry, "random")  # the inputs of the live run (tests/gpu/test_zoo.py)
    check_judgement(entry["expected_stage"], case, an, entry)


# what the oracle says the kernel applied, on the scales ladder (oracle.judging.scale_hint)
NAMED = {
    "scale_b_reused": "A's scale applied twice",
    "scale_split_slice0": "slice 0's scales used by split 1",
    "scale_raw_block_index": "1 tiles back: the scale rows of another tile",
    "scale_trailing_skipped": "the scale of k-block group 5 was used for group 7",
    "scale_one_per_k_block": "the scale of k-block group 0 was used for group 1",
    "scale_map_group_size": "a zero scale: read past the scale tensor",
}


@pytest.mark.slow
@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_scales_ladder_names_the_scale_each_defect_applied(entry):
    case, an = _analysis(entry, "scales")
    check_judgement(entry["expected_stage"], case, an, entry)
    if entry["defect"] is not None:
        head = an.first.hint.split(" (it also fits")[0]  # the first reading, not one it also fits
        assert NAMED[entry["defect"]] in head, an.first.hint


def test_the_model_applies_every_scale_group_to_its_own_32_k():
    """The model is the kernel's arithmetic: on the scales ladder (A = B = 1) each output element is the
    sum over K of sa[m][k / 32] * sb[n][k / 32], exactly; a defect changes it."""
    entry = next(e for e in _entries() if e["defect"] is None and "splitk" not in e["name"])
    case = entry_case(entry)
    spec = case.spec
    ops = make_operands(spec, "scales", 0)
    va, vb = scale_values(ops.scale_a, "e8m0"), scale_values(ops.scale_b, "e8m0")
    want = (va.repeat_interleave(GROUP, 1)[:, :spec.k] @ vb.repeat_interleave(GROUP, 1)[:, :spec.k].t()) * spec.alpha
    rec = model(spec, ops, Provenance("scales", 0), None, set())
    assert torch.equal(rec.output.double(), want.to(torch.bfloat16).double())
    bad = model(spec, ops, Provenance("scales", 0), "scale_one_per_k_block", set())
    assert not torch.equal(bad.output, rec.output)

"""The zoo manifest's verdicts for the sm80 GEMM, on a Python model of the kernel (no GPU).

The model walks the kernel's schedule (zoo/sm80_gemm/sm80_gemm.cu) in plain torch: persistent
CTAs, a 4-slot shared-memory ring whose slots keep whatever a skipped copy did not overwrite
(never-written shared memory is NaN here, the worst garbage there is), the tile the MMAs read
(stale slot, ldmatrix .trans), the accumulator per k16 MMA (fp32, or rounded to fp16 by every
MMA), the epilogue sub-steps and the store, and it taps what the traced kernel taps on the tiles
a live run selects. Each manifest entry's recording, analysed by the oracle, must reach the
entry's expected stage (MATCH where none), with every stage upstream of it clean: the shapes and
defect sites chosen for the GPU run are shown to be discriminating before it runs. What this
cannot show, that the CUDA code does what the model does, the GPU tier
(tests/gpu/test_zoo.py) does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import pytest
import torch

from harness.taps import Tap, stage_rank
from kernels_ref.dtypes import DTYPES
from oracle.run.case import load_case
from oracle.judging.compare import Status
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.run.inputs import Operands, Provenance, make_operands
from oracle.run.sink import default_trace_tiles
from oracle.problem.spec import ProblemSpec
from oracle.run.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "zoo" / "manifest.json"
STAGES_RING = 4  # kStages in sm80_layout.cuh
MMA_K = 16


def _entries() -> list[dict]:
    with open(MANIFEST) as f:
        return [e for e in json.load(f) if e["kernel"].startswith("zoo/sm80_gemm/")]


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _gelu(x: torch.Tensor, tanh: bool) -> torch.Tensor:
    x = x.double()
    if tanh:
        y = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        y = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return y.float()


def model(spec: ProblemSpec, ops: Operands, provenance: Provenance, defect: Optional[str], tapped) -> Recording:
    """What the traced kernel records and stores, for the variant with `defect` (None: correct)."""
    bm, bn, bk = spec.tile.bm, spec.tile.bn, spec.tile.bk
    m, n, k = spec.m, spec.n, spec.k
    tiles_m, tiles_n, kbs = spec.tiles_m, spec.tiles_n, spec.k_blocks
    tiles = tiles_m * tiles_n
    grid = -(-tiles // 2)  # the case's grid: cdiv(tiles, 2)
    et = DTYPES[spec.a_dtype].torch
    a_full = _pad(ops.a, tiles_m * bm, kbs * bk)  # zero past M and K, as the copies fill it
    bt_full = _pad(ops.b.t().contiguous(), tiles_n * bn, kbs * bk)  # B as stored: [N, K]
    c_full = _pad(ops.c.float(), tiles_m * bm, tiles_n * bn) if ops.c is not None else None
    bias = ops.bias.float() if ops.bias is not None else None
    out = torch.zeros(tiles_m * bm, tiles_n * bn, dtype=DTYPES[spec.out_dtype].torch)
    taps: list[Tap] = []
    for cta in range(grid):
        ring_a = torch.full((STAGES_RING, bm, bk), math.nan).to(et)  # never written: garbage
        ring_b = torch.full((STAGES_RING, bn, bk), math.nan).to(et)
        acc = torch.zeros(bm, bn)  # no_reset: zeroed here only
        for t in range(cta, tiles, grid):
            tm, tn = t // tiles_n, t % tiles_n
            here = (tm, tn)
            if defect != "no_reset":
                acc = torch.zeros(bm, bn)
            rows_a = torch.arange(bm) + tm * bm < m
            rows_b = torch.arange(bn) + tn * bn < n
            for kb in range(kbs):
                slot = kb % STAGES_RING
                in_k = (torch.arange(bk) + kb * bk < k)  # K % 8 == 0 in the defect runs: whole chunks
                new_a = a_full[tm * bm:(tm + 1) * bm, kb * bk:(kb + 1) * bk]
                new_b = bt_full[tn * bn:(tn + 1) * bn, kb * bk:(kb + 1) * bk]
                write_a = torch.ones(bm, bk, dtype=torch.bool)
                write_b = torch.ones(bn, bk, dtype=torch.bool)
                if defect == "uninit_rows":
                    write_a &= rows_a[:, None]
                if defect == "unmasked_tail":
                    write_a &= in_k[None, :]
                    write_b &= in_k[None, :]
                if defect == "uninit_padding":
                    write_b &= rows_b[:, None] & in_k[None, :]
                ring_a[slot] = torch.where(write_a, new_a, ring_a[slot])
                ring_b[slot] = torch.where(write_b, new_b, ring_b[slot])
                read = slot
                if defect == "stale_slot" and kb == kbs - 1 and kb > 0:
                    read = (kb - 1) % STAGES_RING
                a_view = ring_a[read].clone()
                if defect == "transposed_a":  # ldmatrix .trans: each 8 x 8 block transposed
                    a_view = a_view.reshape(bm // 8, 8, bk // 8, 8).permute(0, 3, 2, 1).reshape(bm, bk).contiguous()
                b_view = ring_b[read].t().contiguous()  # (k, n)
                for _ in range(2 if defect == "kblock_twice" and kb == 1 else 1):
                    for ks in range(0, bk, MMA_K):
                        part = a_view[:, ks:ks + MMA_K].float() @ b_view[ks:ks + MMA_K, :].float()
                        if defect == "fp16_acc":
                            acc = (acc.double() + part.double()).half().float()
                        else:
                            acc = acc + part
                if here in tapped:
                    taps.append(Tap("load_a", here, a_view.clone(), k_block=kb, slot=read))
                    taps.append(Tap("load_b", here, b_view.clone(), k_block=kb, slot=read))
                    taps.append(Tap("mma", here, acc.clone(), k_block=kb))
            r0, c0 = tm * bm, tn * bn
            inside = (rows_a[:, None] & rows_b[None, :])
            alpha = torch.tensor(spec.alpha, dtype=torch.float32)
            v = acc * alpha
            if defect == "alpha_twice":
                v = v * alpha
            if spec.beta != 0:
                cv = c_full[r0:r0 + bm, c0:c0 + bn]
                fma = (torch.tensor(spec.beta, dtype=torch.float32).double() * cv.double() + v.double()).float()
                v = torch.where(inside, fma, v)
            steps = {"alpha_beta": v}
            if bias is not None:
                idx = (torch.arange(bm) + r0)[:, None].expand(bm, bn) if defect == "bias_row" else \
                    (torch.arange(bn) + c0)[None, :].expand(bm, bn)
                bvals = torch.where(idx < n, bias[idx.clamp(max=n - 1)], torch.zeros(()))
                v = v + bvals
            steps["bias"] = v
            if spec.activation == "gelu_erf":
                v = _gelu(v, tanh=defect == "gelu_tanh")
            elif spec.activation != "none":
                raise NotImplementedError(spec.activation)
            steps["activation"] = v
            cast = v.to(DTYPES[spec.out_dtype].torch)
            steps["cast"] = cast
            if here in tapped:
                for name, val in steps.items():
                    taps.append(Tap(f"epilogue_{name}", here, val.clone()))
            dm, dn = tm, tn
            if defect == "swapped_store" and tm != tn and tn < tiles_m and tm < tiles_n:
                dm, dn = tn, tm
            out[dm * bm:(dm + 1) * bm, dn * bn:(dn + 1) * bn] = cast
    return Recording(spec=spec, operands=ops, output=out[:m, :n].contiguous(),
                     provenance=provenance, taps=tuple(taps),
                     kernel=f"model of zoo_sm80[{defect or 'correct'}]", synthetic=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_manifest_entry_on_the_kernel_model(entry):
    fn = entry["kernel"].partition(":")[2]
    case = load_case(str(ROOT / entry["case"]), entry["problem"], entry=fn)
    seed = entry.get("seed", 0)
    ops = make_operands(case.spec, "random", seed)
    an = analyze(model(case.spec, ops, Provenance("random", seed), entry["defect"], set(default_trace_tiles(case.spec))))
    table = {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}
    want = entry["expected_stage"]
    if want is None:
        assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, table)
        assert table["mma"] == ("MATCH", "MATCH") and table["epilogue_store"] == ("MATCH", "MATCH"), table
        return
    assert an.verdict is Verdict.DIVERGED, (an.diagnosis.reason, table)
    assert an.first.stage == want, (an.first, table)
    upstream = [s for s in an.stages if stage_rank(s.name) < stage_rank(want)]
    assert all(Status.MISMATCH not in (s.teacher_forced.status, s.chained.status) for s in upstream), table

"""The zoo manifest's verdicts for the CUTLASS bias + GELU epilogues, on a Python model of the
traced kernel (no GPU).

The model computes what zoo/cutlass_sm90/cutlass_sm90.cu with ZOO_CUTLASS_BIAS_GELU computes and taps:
the mainloop's operand tiles and fp32 accumulator per k-block (load_a, load_b, mma), then the epilogue
as CUTLASS's LinCombPerColBiasEltAct tree does it, each step in fp32: alpha * acc + bias as one FMA
(tapped as epilogue_bias; the adapter's tree taps alpha * acc computed beside it as epilogue_alpha, the
user's tree marks alpha Fused and its case has alpha = 1), beta * C + x as one FMA (epilogue_beta_c),
gelu (epilogue_activation), the cast to bf16 (epilogue_cast), and the store. Each planted defect of
the user's tree changes the step it changes there (the bias read per row; GELU_taylor; beta * C added
where the bias belongs and the bias after it). The case declares no `epilogue`: it is judged in the
order the traced library declares, as a live run resolves it (oracle.run.library_epilogue), the
order tests/cpu/test_cutlass_evt.py reads from the real builds. Each entry must reach its expected
stage (MATCH where none), every stage upstream of it clean. What this cannot show, that the CUDA
code does what the model does, the GPU tier (tests/gpu/test_zoo.py) does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import pytest
import torch

from harness.taps import Tap
from oracle.judging.compare import Status
from oracle.judging.diagnose import Verdict
from oracle.judging.differential import analyze
from oracle.problem.spec import ProblemSpec
from oracle.run.case import load_case
from oracle.run.inputs import Operands, Provenance, make_operands
from oracle.run.library_epilogue import with_library_order
from oracle.run.recording import Recording

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "zoo" / "manifest.json"
TREE_ORDER = ("alpha", "bias", "beta_c", "activation", "cast")  # what the traced library declares


def _entries() -> list[dict]:
    with open(MANIFEST) as f:
        return [e for e in json.load(f) if e["name"].startswith(("cutlass_sm90_evt_", "cutlass_sm90_bias_gelu_"))]


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _gelu(x: torch.Tensor, tanh: bool) -> torch.Tensor:
    x = x.double()
    if tanh:  # GELU_taylor
        y = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    else:
        y = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return y.float()


def _fma(a, b, c) -> torch.Tensor:
    """fp32 a * b + c rounded once (each operand fp32: the product is exact in float64)."""
    return (torch.as_tensor(a, dtype=torch.float32).double() * torch.as_tensor(b).double()
            + torch.as_tensor(c).double()).float()


def model(spec: ProblemSpec, ops: Operands, provenance: Provenance, defect: Optional[str], tapped,
          user_tree: bool) -> Recording:
    """What the traced kernel records and stores, for the variant with `defect` (None: correct), through the
    adapter's tree of CUTLASS's fusion or (`user_tree`) the user's own."""
    bm, bn, bk = spec.tile.bm, spec.tile.bn, spec.tile.bk
    m, n = spec.m, spec.n
    tiles_m, tiles_n, kbs = spec.tiles_m, spec.tiles_n, spec.k_blocks
    a_full = _pad(ops.a, tiles_m * bm, kbs * bk)
    b_full = _pad(ops.b, kbs * bk, tiles_n * bn)
    c_full = _pad(ops.c.float(), tiles_m * bm, tiles_n * bn)
    bias = ops.bias.float()
    alpha, beta = torch.tensor(spec.alpha), torch.tensor(spec.beta)
    out = torch.zeros(tiles_m * bm, tiles_n * bn, dtype=torch.bfloat16)
    taps: list[Tap] = []
    for tm in range(tiles_m):
        for tn in range(tiles_n):
            here, r0, c0 = (tm, tn), tm * bm, tn * bn
            acc = torch.zeros(bm, bn)
            for kb in range(kbs):
                a_t = a_full[r0:r0 + bm, kb * bk:(kb + 1) * bk]
                b_t = b_full[kb * bk:(kb + 1) * bk, c0:c0 + bn]
                acc = (acc.double() + a_t.double() @ b_t.double()).float()
                if here in tapped:
                    taps += [Tap("load_a", here, a_t.clone(), k_block=kb), Tap("load_b", here, b_t.clone(), k_block=kb),
                             Tap("mma", here, acc.clone(), k_block=kb)]
            idx = (torch.arange(bm) + r0)[:, None].expand(bm, bn) if defect == "evt_bias_row" else \
                (torch.arange(bn) + c0)[None, :].expand(bm, bn)
            bvals = torch.where(idx < n, bias[idx.clamp(max=n - 1)], torch.zeros(()))
            c_t = c_full[r0:r0 + bm, c0:c0 + bn]
            if defect == "evt_beta_first":  # beta * C + alpha * acc, then + bias
                x_bias = _fma(beta, c_t, (alpha * acc).float())
                x_beta = (x_bias + bvals).float()
            else:
                x_bias = _fma(alpha, acc, bvals)
                x_beta = _fma(beta, c_t, x_bias)
            act = _gelu(x_beta, tanh=defect == "evt_gelu_tanh")
            cast = act.to(torch.bfloat16)
            if here in tapped:
                if not user_tree:  # the adapter's tree taps alpha * acc beside its FMA; the user's marks it Fused
                    taps.append(Tap("epilogue_alpha", here, (alpha * acc).float()))
                taps += [Tap("epilogue_bias", here, x_bias), Tap("epilogue_beta_c", here, x_beta),
                         Tap("epilogue_activation", here, act), Tap("epilogue_cast", here, cast)]
            out[r0:r0 + bm, c0:c0 + bn] = cast
    return Recording(spec=spec, operands=ops, output=out[:m, :n].contiguous(), provenance=provenance,
                     taps=tuple(taps), kernel=f"model of zoo_cutlass_sm90 bias+gelu[{defect or 'correct'}]",
                     synthetic=True)


@pytest.mark.slow
@pytest.mark.parametrize("entry", _entries(), ids=lambda e: e["name"])
def test_manifest_entry_on_the_kernel_model(entry):
    case = load_case(str(ROOT / entry["case"]), entry["problem"], allow_library=True)
    case, _ = with_library_order(case, TREE_ORDER)  # as a live run resolves it from the built library
    spec = case.spec
    seed = entry.get("seed", 0)
    ops = make_operands(spec, "random", seed)
    tapped = {tuple(t) for t in entry["trace"]["tiles"]}
    user_tree = "ZOO_CUTLASS_EVT" in case.kernel.defines
    an = analyze(model(spec, ops, Provenance("random", seed), entry["defect"], tapped, user_tree))
    table = {s.name: (s.teacher_forced.status.value, s.chained.status.value) for s in an.stages}
    assert [s.name for s in an.stages if s.name.startswith("epilogue_")] == \
        [f"epilogue_{t}" for t in TREE_ORDER] + ["epilogue_store"], table
    want = entry["expected_stage"]
    if want is None:
        assert an.verdict is Verdict.MATCH, (an.diagnosis.reason, table)
        assert table["epilogue_cast"] == ("MATCH", "MATCH") and table["epilogue_store"] == ("MATCH", "MATCH"), table
        return
    assert an.verdict is Verdict.DIVERGED, (an.diagnosis.reason, table)
    assert an.first.stage == want, (an.first, table)
    assert an.first.kind.value == "VERDICT", (an.first, an.open_confounds)
    names = [s.name for s in an.stages]  # in the declared order
    upstream = an.stages[:names.index(want)]
    assert all(Status.MISMATCH not in (s.teacher_forced.status, s.chained.status) for s in upstream), table

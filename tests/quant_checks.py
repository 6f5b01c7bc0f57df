"""Checks shared by the tests of a quantised A and a quantised B: the model kernel's recording of a
problem, with a planted defect or a kernel copy of one stored byte changed, and what the
differential must say of a dequant defect (stage, tile, k-block, scale group, hint)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from oracle.judging.diagnose import Kind, Verdict
from oracle.judging.differential import analyze
from oracle.report.table import sentence
from oracle.run.inputs import Provenance
from oracle.run.simulate import Injection, simulate
from oracle.run.caller import Caller


# each planted dequant defect of the model kernel at group 2 of 4, and the hint that must name it
DEFECT_HINTS = [
    ("dequant_nibble_order", r"the other nibble of its byte \(k = \d+\): the nibble order is swapped"),
    ("dequant_group_index", r"the scale and zero point of group 3: a wrong group index"),
    ("dequant_zero_twice", r"the zero point applied twice"),
    ("dequant_scale_group", r"the scale of group 3"),
]


def model_analysis(spec, ops, tile, kb, defect=None, *, drop=()):
    """The differential of the model kernel on `spec` (index inputs), tile `tile` traced, `defect`
    planted at (tile, kb); the stages in `drop` left untapped."""
    inj = None if defect is None else Injection(defect, tile, kb)
    rec = simulate(spec, ops, Provenance("index"), injection=inj, tap_tiles=[tile])
    if drop:
        rec = dataclasses.replace(rec, taps=tuple(t for t in rec.taps if t.stage not in drop))
    return analyze(rec)


def assert_kernel_fed_match(an, op: str):
    """A correct model kernel: MATCH, dequant_<op> right before the mma and teacher-forced on the
    kernel's own load tap, the mma fed by the kernel's tiles alone."""
    assert an.verdict is Verdict.MATCH, sentence(an)
    names = [s.name for s in an.stages]
    assert names.index(f"load_{op}") < names.index(f"dequant_{op}") == names.index("mma") - 1
    assert f"dequant_{'b' if op == 'a' else 'a'}" not in names
    deq = next(s for s in an.stages if s.name == f"dequant_{op}")
    assert deq.teacher_forced.status.value == "MATCH" and deq.teacher_forced.evidence.feeds[0].value == "kernel tap"
    mma = next(s for s in an.stages if s.name == "mma")
    assert mma.teacher_forced.status.value == "MATCH" and not mma.teacher_forced.evidence.stand_ins


def with_stored_byte_flipped(rec, op: str, kb: int, at: tuple[int, int]):
    """`rec` with the kernel's copy of one stored byte of load_<op>, k-block `kb`, differing from memory."""
    taps = []
    for t in rec.taps:
        if (t.stage, t.k_block) == (f"load_{op}", kb):
            v = t.values.clone()
            v[at] ^= 0x0F
            t = dataclasses.replace(t, values=v)
        taps.append(t)
    return dataclasses.replace(rec, taps=tuple(taps))


def assert_dequant_finding(an, op: str, tile, kb: int, bk: int, group_k: int, says: str):
    """A planted dequant defect: DIVERGED at dequant_<op> in (tile, kb), a VERDICT of the
    teacher-forced comparison, the element's scale group named, `says` (a regex) in the hint, and
    the mma inherited. Returns the finding and the closing sentence."""
    f = an.first
    text = sentence(an)
    assert an.verdict is Verdict.DIVERGED and f.stage == f"dequant_{op}" and an.kind is Kind.VERDICT, text
    assert (f.tile, f.k_block) == (tile, kb) and f.comparison == "teacher_forced"
    k = f.element[1] if op == "a" else f.element[0]
    assert kb * bk <= k < (kb + 1) * bk, f.element
    g = k // group_k
    assert f"dequant_{op} at tile {tile}, k-block {kb}" in text and "VERDICT" in text
    assert f"scale group {g} (k {g * group_k}..{(g + 1) * group_k - 1})" in text, text
    assert re.search(says, text), text
    assert "mma" in an.diagnosis.inherited  # downstream of the dequant, not blamed
    return f, text


def assert_draft_without_load(an, op: str, tile, kb: int):
    """A dequant defect whose load was not tapped: a DRAFT that names the load as its stand-in."""
    f = an.first
    assert f.stage == f"dequant_{op}" and an.kind is Kind.DRAFT
    assert (f"load_{op}", tile, kb) in f.stand_ins and any(f"load_{op}" in m.say(Caller.PYTHON) for m in f.missing)


def int4_low_first(stored: torch.Tensor, dim: int) -> torch.Tensor:
    """Signed int4 values (float32) of bytes packed two k a byte along `dim` (0: B's rows, 1: A's
    columns), the even k in the low nibble: plain torch, as an op under test reads them."""
    lo, hi = (stored & 0xF).to(torch.int32), (stored >> 4).to(torch.int32)
    q = torch.stack([lo, hi], dim=dim + 1).flatten(dim, dim + 1)
    return torch.where(q >= 8, q - 16, q).float()


def int4_op(weight: str):
    """A mixed-input op in plain torch with `weight` ("a" or "b") stored as int4, low nibble first,
    per-group scales and integer zero points along k, dequantised in fp32 and accumulated in fp32."""
    dim = 1 if weight == "a" else 0

    def op(a, b, scales, zeros):
        stored = a if weight == "a" else b
        q = int4_low_first(stored, dim)
        g = torch.arange(q.shape[dim]) // (q.shape[dim] // scales.shape[dim])
        s, z = (scales.float()[:, g], zeros.float()[:, g]) if dim else (scales.float()[g], zeros.float()[g])
        other = b if weight == "a" else a
        w = ((q - z) * s).to(other.dtype)
        return ((w.float() @ b.float()) if weight == "a" else (a.float() @ w.float())).to(other.dtype)

    return op


def assert_case_file_carries_the_quant_fields(tmp_path, weight: str, text: str, want):
    """A case file's [problem] text with `weight`'s quant fields loads as `want`, its launch passes the
    scales and zero points by name, and a group size that does not divide K is refused by name."""
    from oracle.run.case import load_case

    case = tmp_path / "q.toml"
    case.write_text(text)
    c = load_case(str(case))
    assert c.spec == want
    assert [a.name for a in c.launch.args[:4]] == ["a", "b", f"{weight}_scales", f"{weight}_zeros"]
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(f"{weight}_group_size = 32", f"{weight}_group_size = 40"))
    with pytest.raises(Exception, match=f"{weight}_group_size=40"):
        load_case(str(bad))


def assert_verify_tells_the_nibble_order(op, case: dict, quant: dict, packing_field: str):
    """`python -m oracle verify`'s w4a16 call of a low-nibble-first `op`: MATCH with the packing it
    follows, DIVERGED with the stored bytes declared high-first."""
    from oracle.tools.verify import VerifyCase, run_case

    row = run_case(op, VerifyCase(**case, call="w4a16", quant=quant, time=False))
    assert row["verdict"] == "MATCH", row
    row = run_case(op, VerifyCase(**case, call="w4a16", quant={**quant, packing_field: "k_pairs_high_first"},
                                  time=False))
    assert row["verdict"] == "DIVERGED", row


def assert_check_refuses_an_unreadable_quantised(op: str, scales_shape: str):
    """`oracle.check` names what is wrong with a packed int4 `op` ("a" or "b") it cannot read: no
    dtype, a packed width that is not K / 2, scales of the wrong shape (`scales_shape`, the message
    expected), zero points without scales. K = 64 in groups of 32."""
    import oracle
    from oracle.problem.spec import SpecError

    m, n = (8, 4) if op == "a" else (4, 8)

    def stored(k):  # the shape of `op` stored with k rows or columns along K
        return (m, k) if op == "a" else (k, n)

    operands = {"a": torch.ones(m, 64, dtype=torch.float16), "b": torch.ones(64, n, dtype=torch.float16)}
    d = torch.zeros(m, n, dtype=torch.float16)
    s = torch.ones(stored(2), dtype=torch.float16)

    def check(packed=stored(32), **kw):
        oracle.check(**{**operands, op: torch.zeros(packed, dtype=torch.uint8)}, d=d, **kw)

    packing = {f"{op}_packing": "k_pairs_low_first"}
    with pytest.raises(SpecError, match=f"{op}_dtype=None is not allowed"):
        check(**{f"{op}_scales": s}, **packing)
    with pytest.raises(SpecError, match=r"stored as \[M, 32\]" if op == "a" else r"stored as \[32, N\]"):
        check(stored(64), **{f"{op}_scales": s, f"{op}_dtype": "int4"}, **packing)
    bad_scales = torch.ones((3, 2) if op == "a" else (3, n), dtype=torch.float16)
    with pytest.raises(SpecError, match=scales_shape):
        check(**{f"{op}_scales": bad_scales, f"{op}_dtype": "int4"}, **packing)
    with pytest.raises(SpecError, match=f"without {op}_scales"):
        check(**{f"{op}_zeros": torch.zeros(stored(2), dtype=torch.int8)})

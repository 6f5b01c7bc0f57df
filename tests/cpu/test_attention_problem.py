"""AttentionSpec validation (each error names the field, the value and what is allowed) and the
controlled attention inputs: each ladder's documented output holds on the exact attention."""

import math

import pytest
import torch

from kernels_ref.attention.forward import attention_forward_host
from oracle.judging.attention_analysis import params_of
from oracle.problem.attention import AttentionSpec
from oracle.problem.spec import ProblemSpec, SpecError
from oracle.run.attention_inputs import fully_masked_rows, make_attention_operands
from oracle.run.inputs import InputError

BASE = dict(batch=2, heads_q=4, heads_kv=2, seqlen_q=8, seqlen_k=12, head_dim=16)


def spec(**kw):
    return AttentionSpec(**{**BASE, **kw})


@pytest.mark.parametrize("field, value, words", [
    ("heads_kv", 3, "must divide heads_q = 4"),
    ("causal", "diagonal", "none, top_left, bottom_right"),
    ("window", (2,), "(left, right)"),
    ("window", (-2, 0), ">= -1"),
    ("softcap", -1.0, "positive, finite"),
    ("q_dtype", "fp32", "bf16, fp16, e4m3"),
    ("k_dtype", "fp16", "one 16-bit type"),
    ("descale_q", 2.0, "go with e4m3"),
    ("seqlens_q", (8, 3, 1), "one length per sequence"),
    ("seqlens_q", (5, 3), "its longest sequence is seqlen_q"),
    ("page_size", 4, "num_pages"),
    ("block_kv", 0, "positive integer"),
    ("empty_lse", "nan", "-inf, +inf"),
])
def test_errors_name_the_field_value_and_what_is_allowed(field, value, words):
    with pytest.raises(SpecError) as e:
        spec(**{field: value})
    assert field in str(e.value) and words in str(e.value)


def test_derived_fields_and_describe():
    s = spec(causal="bottom_right", window=[4, -1], softcap=30, splits=2)
    assert s.kind == "attention" and ProblemSpec.kind == "gemm"
    assert s.softmax_scale == 0.25 and s.group == 2 and s.window == (4, -1)
    assert s.units == 2 * 4 * 1 and s.unit_of((5, 0)) == (1, 1, 0)
    assert s.describe().startswith("attention b2 4/2h q8 k12 d16 bf16->bf16")
    assert "causal bottom_right" in s.describe() and "2 splits" in s.describe()
    assert AttentionSpec.from_json(s.to_json()) == s
    with pytest.raises(SpecError, match="e4m3"):
        spec(q_dtype="e4m3", k_dtype="e4m3", v_dtype="bf16")
    fp8 = spec(q_dtype="e4m3", k_dtype="e4m3", v_dtype="e4m3", descale_q=0.5, p_scale=16.0)
    assert fp8.fp8
    with pytest.raises(SpecError, match="seqlen_k"):
        spec(page_size=4, num_pages=10, max_pages=2)


def _exact(s, ops):
    o, lse = attention_forward_host(ops.q, ops.k, ops.v, params_of(s), cu_seqlens_q=ops.cu_seqlens_q,
                                    cu_seqlens_k=ops.cu_seqlens_k, page_table=ops.page_table)
    return o, lse


def test_ones_gives_one_and_the_lse_of_n_keys():
    s = spec(causal="top_left", seqlen_q=6, seqlen_k=6)
    o, lse = _exact(s, make_attention_operands(s, "ones"))
    assert torch.allclose(o, torch.ones_like(o))
    n = torch.arange(1, 7, dtype=torch.float64)
    assert torch.allclose(lse[0, 0], 16 * 0.25 + torch.log(n))


def test_one_hot_and_index_name_the_keys():
    s = spec(causal="bottom_right", seqlen_q=5, seqlen_k=12)  # seqlen_k <= head_dim: one key per query
    ops = make_attention_operands(s, "one_hot", seed=3)
    o, _ = _exact(s, ops)
    key = o[..., 0].round()  # V_j0 = j: O names the key each query attended
    hot = ops.q.float().abs().argmax(-1)  # the target's residue
    assert torch.equal(key.long() % 16, hot)
    assert bool((key <= torch.arange(5)[None, :, None] + 7).all())  # within the causal range
    s2 = spec(causal="top_left", seqlen_q=4, seqlen_k=10)
    o2, _ = _exact(s2, make_attention_operands(s2, "index"))
    seen = (o2[0, 2, 0] * 3).round()  # query 2 sees keys 0, 1, 2 (n = 3)
    assert seen.tolist() == [1.0, 1.0, 1.0] + [0.0] * 13


def test_large_logits_are_finite_and_masked_row_needs_a_masked_row():
    s = spec(seqlen_q=4, seqlen_k=20)
    ops = make_attention_operands(s, "large_logits", seed=1)
    sc = (ops.q.float()[0, :, 0] @ ops.k.float()[0, :, 0].T) * s.softmax_scale
    assert float(sc.abs().max()) > 89  # exp overflows fp32 without the max
    o, _ = _exact(s, ops)
    assert bool(torch.isfinite(o).all())
    with pytest.raises(InputError, match="fully masked row"):
        make_attention_operands(s, "masked_row")
    s2 = spec(causal="bottom_right", seqlen_q=10, seqlen_k=4)
    assert fully_masked_rows(s2)[:2] == [(0, 0), (0, 1)]
    o2, lse2 = _exact(s2, make_attention_operands(s2, "masked_row"))
    assert bool((o2[:, :6] == 0).all()) and bool(torch.isinf(lse2[:, :, :6]).all())


def test_varlen_and_paged_layouts():
    s = spec(seqlens_q=(8, 3), seqlens_k=(5, 12), page_size=4, num_pages=8, max_pages=3)
    ops = make_attention_operands(s, "random", seed=2)
    assert ops.q.shape == (11, 4, 16) and ops.k.shape == (8, 4, 2, 16) and ops.page_table.shape == (2, 3)
    assert ops.cu_seqlens_q.tolist() == [0, 8, 11] and ops.provenance.controlled
    with pytest.raises(InputError, match="pages"):
        make_attention_operands(spec(seqlen_k=12, page_size=4, num_pages=5, max_pages=3), "random")


@pytest.mark.parametrize("cls, doc, named", [
    (AttentionSpec, [1], "attention must be an object, got list"),
    (ProblemSpec, "m=64", "problem must be an object, got str"),
    (AttentionSpec, {**BASE, "m": 3}, "unknown attention field(s) m; known: "),
    (ProblemSpec, {"m": 64, "n": 64, "k": 64, "heads_q": 2}, "unknown problem field(s) heads_q; known: "),
    (AttentionSpec, {"batch": 1}, "attention problem: "),
    (ProblemSpec, {"m": 64}, "problem: "),
    (ProblemSpec, {"m": 64, "n": 64, "k": 64, "tile": 5}, "tile must be an object, got int 5"),
    (ProblemSpec, {"m": 64, "n": 64, "k": 64, "scale_a": {"kind": "tensor", "rows": 1}}, "unknown scale_a field(s) rows"),
    (AttentionSpec, {**BASE, "kind": "gemm"}, "kind='gemm' is not allowed"),
])
def test_a_spec_read_back_from_json_refuses_what_it_lacks_naming_it(cls, doc, named):
    with pytest.raises(SpecError) as e:
        cls.from_json(doc)
    assert named in str(e.value), str(e.value)

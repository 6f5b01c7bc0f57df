"""Attention ops for `verify --attention` tests, by module:function: a correct FlashAttention-style op
built on SDPA, and two wrong SDPA-style ones (the output scaled by 1.01; is_causal read as bottom-right)."""

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def scaled_sdpa(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw) * 1.01


def flipped_causal_sdpa(q, k, v, *, is_causal=False, **kw):
    """is_causal aligned bottom-right (FlashAttention's) instead of SDPA's top-left."""
    if not is_causal:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]), **kw)


def flash_like(q, k, v, *, causal=False):
    """bshd q, k, v (GQA by KV head repetition); returns (o bshd, lse [batch, heads_q, seqlen_q] fp32),
    causal bottom-right aligned (queries before the first key see none)."""
    rep = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)
    kh, vh = k.transpose(1, 2).repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
    s = (qh.float() @ kh.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        keep = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a fully masked row: O = 0, LSE = -inf
    o = (p @ vh.float()).to(q.dtype)
    return o.transpose(1, 2), lse

"""Attention's numerics measured on the GPU: the approximate functions FlashAttention-style kernels
use, P's form and rounding, and the online softmax chain against the exact attention.

Three families, each compared with the constant or bound oracle.judging.attention_tolerance uses:
  primitives  ex2.approx.ftz.f32 and tanh.approx.f32 (relative error) and lg2.approx.ftz.f32
              (absolute error beyond the result's own rounding, 2u|lg2 x|) over dense sweeps of fp32 inputs against float64: E_EXP, E_TANH, E_LOG.
  p_form      P as a FlashAttention-2 kernel computes it, ex2(fma(s, scale * log2 e, -m * scale *
              log2 e)) rounded to P's type, against the p stage's reference p_tile(x, m) on the same
              scores (x = s * scale in fp32): |P - P_ref| over the p stage's two-sided bound.
  chain       the Triton reference forward (online softmax over KV blocks: ex2, the rescale, P
              rounded to V's type, fp32 MMA accumulation) against the float64 specification on
              inputs that stress it (large logits, a max that rises at every KV block so every block
              rescales, 32k keys): |O - O*| over one side of the output model (row_terms), per row.
A ratio above 1 is a bound the hardware or the reference does not keep.
"""

from __future__ import annotations

import math

import torch

from kernels_ref.attention.forward import attention_forward, attention_forward_host
from oracle.judging.attention_stages import SIDES, params_of
from oracle.judging.attention_tolerance import E_EXP, E_LOG, E_TANH, STATS_MARGIN, U, lookup, row_terms
from oracle.problem.attention import AttentionSpec

LOG2E = 1.4426950408889634
_OPS = {0: "ex2.approx.ftz.f32", 1: "tanh.approx.f32", 2: "lg2.approx.ftz.f32"}


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def approx_kernel(x_ptr, y_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        x = tl.load(x_ptr + i, mask=ok, other=1.0)
        if OP == 0:
            y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                          is_pure=True, pack=1)
        elif OP == 1:
            y = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:
            y = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                          is_pure=True, pack=1)
        tl.store(y_ptr + i, y, mask=ok)

    @triton.jit
    def p_kernel(s_ptr, m_ptr, p_ptr, n, cols, c, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        s = tl.load(s_ptr + i, mask=ok, other=0.0)
        m = tl.load(m_ptr + i // cols, mask=ok, other=0.0)
        mc = m * c
        arg = tl.fma(s, c, -mc)
        p = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [arg], dtype=tl.float32,
                                      is_pure=True, pack=1)
        tl.store(p_ptr + i, p, mask=ok)

    return approx_kernel, p_kernel


def _sweep(lo: float, hi: float, stride: int, sign: int):
    """Every stride-th fp32 value of magnitude in [lo, hi), with the sign, in chunks (GPU)."""
    a = int(torch.tensor([lo], dtype=torch.float32).view(torch.int32))
    b = int(torch.tensor([hi], dtype=torch.float32).view(torch.int32))
    step = stride * (1 << 24)
    for c0 in range(a, b, step):
        x = torch.arange(c0, min(c0 + step, b), stride, dtype=torch.int32, device="cuda").view(torch.float32)
        yield -x if sign else x


def measure_primitives(quick: bool = False) -> dict:
    approx, _ = _kernels()
    stride = 97 if quick else 3
    plan = {0: [(2.0**-30, 126.0, 1), (2.0**-30, 64.0, 0)],  # ex2: the softmax's arguments are <= 0
            1: [(2.0**-30, 20.0, 0), (2.0**-30, 20.0, 1)],
            2: [(2.0**-126, 2.0**126, 0)]}
    out = {}
    for op, ranges in plan.items():
        worst, at, count = 0.0, None, 0
        for lo, hi, sign in ranges:
            for x in _sweep(lo, hi, stride, sign):
                y = torch.empty_like(x)
                approx[(-(-x.numel() // 1024),)](x, y, x.numel(), OP=op, BLOCK=1024)
                x64 = x.double()
                exact = {0: torch.exp2, 1: torch.tanh, 2: torch.log2}[op](x64)
                if op == 0:  # below fp32's normal range ftz flushes: P's EXP_FLUSH term covers those
                    keep = exact >= 2.0**-126
                    err = ((y.double() - exact).abs() / exact).masked_fill(~keep, 0.0)
                elif op == 1:
                    err = (y.double() - exact).abs() / exact.abs()
                else:  # beyond the result's own fp32 rounding (LSE's bound holds 4u|LSE| for it)
                    err = (y.double() - exact).abs() - 2 * U * exact.abs()
                m, i = err.max(0)
                count += x.numel()
                if float(m) > worst:
                    worst, at = float(m), float(x[i])
        const = {0: E_EXP, 1: E_TANH, 2: E_LOG}[op]
        out[_OPS[op]] = {"error": "absolute, beyond 2u|lg2 x| (the result's own rounding)" if op == 2 else "relative",
                         "max": worst,
                         "max_log2": math.log2(worst) if worst > 0 else None, "at_x": at, "inputs": count,
                         "constant": const.value, "constant_source": const.source,
                         "within": worst <= const.value}
    out["ok"] = all(v["within"] for v in out.values() if isinstance(v, dict))
    return out


def measure_p_form(quick: bool = False) -> dict:
    from kernels_ref.attention.p import p_tile

    _, pk = _kernels()
    g = torch.Generator(device="cuda").manual_seed(5)
    rows, cols = (256, 128) if quick else (4096, 128)
    out, ok = {}, True
    for dtype in ("bf16", "fp16"):
        for spread in (1.0, 30.0, 300.0):
            for offset in (0.0, 1000.0):
                scale = 1 / math.sqrt(128)
                s = (torch.randn(rows, cols, generator=g, device="cuda") * spread / scale + offset).float()
                x = (s * scale).float()
                m = x.amax(1)
                c = float(torch.tensor(scale * LOG2E, dtype=torch.float32))
                p32 = torch.empty_like(s)
                pk[(-(-s.numel() // 1024),)](s, s.amax(1).contiguous(), p32, s.numel(), cols, c, BLOCK=1024)
                tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
                p = p32.to(tdt).double()
                # the p stage's tiles are a kernel's blocks (64 query rows here): one program holds a whole tile
                ref = p_tile(x.view(-1, 64, cols).contiguous(), m.view(-1, 64).contiguous(), dtype, 1.0)
                ref = ref.reshape(rows, cols).double()
                xm = (x.double().abs() + m.double().abs()[:, None]) * STATS_MARGIN
                bound = SIDES * lookup("p", dtype).bound(ref, xm, 1.0) * STATS_MARGIN
                ratio = float(((p - ref).abs() / bound).max())
                key = f"{dtype} spread {spread:g} offset {offset:g}"
                out[key] = {"max_err_over_bound": ratio, "elements": s.numel()}
                ok &= ratio <= 1.0
    out["ok"] = ok
    return out


def _chain_cases(quick: bool):
    cases = [("large_logits", 1, 4, 2, 64, 2048, 128, "bf16"), ("rising_max", 1, 4, 4, 64, 4096, 64, "fp16")]
    if not quick:
        cases += [("normal", 1, 8, 2, 128, 4096, 128, "bf16"), ("normal", 1, 8, 8, 128, 4096, 64, "fp16"),
                  ("large_logits", 1, 8, 2, 128, 4096, 128, "bf16"), ("rising_max", 1, 8, 2, 128, 8192, 128, "bf16"),
                  ("rising_max", 1, 4, 4, 64, 8192, 128, "fp16"), ("normal", 1, 8, 1, 64, 32768, 128, "bf16"),
                  ("large_logits", 1, 8, 1, 64, 32768, 128, "bf16"), ("rising_max", 1, 8, 1, 64, 32768, 128, "bf16"),
                  ("large_logits", 2, 16, 4, 256, 8192, 64, "fp16")]
    return cases


def _chain_inputs(kind, b, hq, hk, sq, sk, d, dtype, g, device):
    t = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    q = torch.randn(b, sq, hq, d, generator=g, device=device)
    k = torch.randn(b, sk, hk, d, generator=g, device=device)
    v = torch.randn(b, sk, hk, d, generator=g, device=device)
    if kind == "large_logits":  # scores of several hundred: exp overflows without the max subtracted
        q, k = q * 6, k * 6
    elif kind == "rising_max":  # a key's scores grow with its position: the running max rises every block
        q = q.abs() + 0.5
        k = k.abs() * (1 + torch.arange(sk, device=device) / sk * 3)[None, :, None, None]
    return q.to(t), k.to(t), v.to(t)


def measure_chain(quick: bool = False, cases=None, device: str = "cuda") -> dict:
    """`cases`: (inputs, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype) rows (default:
    the benchmark's); `device` "cpu" runs the reference under Triton's interpreter (exact exp)."""
    g = torch.Generator(device=device).manual_seed(11)
    out, ok = {"cases": []}, True
    for kind, b, hq, hk, sq, sk, d, dtype in cases or _chain_cases(quick):
        spec = AttentionSpec(batch=b, heads_q=hq, heads_kv=hk, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                             q_dtype=dtype, k_dtype=dtype, v_dtype=dtype, o_dtype=dtype, block_q=64, block_kv=64)
        q, k, v = _chain_inputs(kind, b, hq, hk, sq, sk, d, dtype, g, device)
        params = params_of(spec)
        o, lse, st = attention_forward(q, k, v, params, with_stats=True)
        eo, el = attention_forward_host(q, k, v, params, device=device)
        side = row_terms(spec, st, float(v.float().abs().amax()))
        rows_o = o.double().cpu().permute(0, 2, 1, 3).reshape(-1, d)
        rows_e = eo.double().cpu().permute(0, 2, 1, 3).reshape(-1, d)
        bound = side.rel.cpu()[:, None] * st.av.double().cpu() * STATS_MARGIN + side.absolute.cpu()[:, None]
        r_o = float(((rows_o - rows_e).abs() / bound).max())
        r_l = float(((lse.double().cpu().reshape(-1) - el.double().cpu().reshape(-1)).abs() / side.lse.cpu()).max())
        row = {"inputs": kind, "shape": [b, hq, hk, sq, sk, d], "dtype": dtype,
               "max_score": float(st.s_abs.max()), "o_err_over_one_side_bound": r_o, "lse_err_over_bound": r_l}
        out["cases"].append(row)
        ok &= r_o <= 1.0 and r_l <= 1.0
    out["ok"] = ok
    return out

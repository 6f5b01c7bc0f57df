"""The numerics measurements that are not fitted to the emulator: cuBLAS's reduced-precision split-K
reductions per shape and layout (where the partials end, how they round, in what type they are
summed), torch._int_mm against the exact integer sum, the fast-math activations over a dense sweep,
and the error envelope of random GEMMs next to the statistics the bounds use.
"""

from __future__ import annotations

import math

import torch

from kernels_ref import emulate as E
from benchmarks.numerics.engines import _flags, _int_mm
from benchmarks.numerics.inputs import gemm_inputs
from benchmarks.numerics.probes import OPTYPES, OpType


SPLITK_SHAPES = [(64, 64, 8192), (64, 64, 65536), (128, 128, 16384), (128, 256, 32768), (256, 256, 8192),
                 (16, 2048, 16384), (1, 4096, 16384), (512, 512, 16384), (128, 128, 65536), (1024, 1024, 8192),
                 (32, 32, 4096), (2048, 2048, 2048)]
QUICK_SPLITK = [(64, 64, 8192), (128, 128, 16384)]


def cublas_mm(a: torch.Tensor, b: torch.Tensor, reduced: bool) -> torch.Tensor:
    """torch.mm with reduced-precision reductions allowed or not (cuBLAS)."""
    with _flags(reduced=reduced):
        out = torch.mm(a, b)
    torch.cuda.synchronize()
    return out


def _outlier_inputs(M, N, K, dtype, seed=0, dev="cuda"):
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(M, K, device=dev, generator=g)
    b = torch.randn(K, N, device=dev, generator=g)
    cols = torch.randperm(K, device=dev, generator=g)[:max(1, K // 256)]
    a[:, cols] *= 1000.0
    return a.to(dtype), b.to(dtype)


def _major(x: torch.Tensor, major: str) -> torch.Tensor:
    """x stored row-major (its last dimension contiguous) or column-major: cuBLAS picks its kernel
    by the layout too."""
    return x.contiguous() if major == "row" else x.t().contiguous().t()


def _col_probe_run(dtype, M, N, K, probes: list, reduced: bool, majors=("row", "row"), dev="cuda",
                   mm=cublas_mm) -> torch.Tensor:
    """Probes in columns: A = ones [M, K], B[:, n] = probe n's products, given as lists of (k, value);
    output row 0. Built on `dev`, N probes per GEMM (`mm`), A and B stored in `majors`."""
    outs = []
    a = _major(torch.ones(M, K, device=dev, dtype=dtype), majors[0])
    for c0 in range(0, len(probes), N):
        chunk = probes[c0:c0 + N]
        ks, cols, vals = [], [], []
        for j, pr in enumerate(chunk):
            for k, v in pr:
                ks.append(k)
                cols.append(j)
                vals.append(v)
        Bm = torch.zeros(K, N, device=dev, dtype=torch.float64)
        Bm[torch.tensor(ks, device=dev), torch.tensor(cols, device=dev)] = torch.tensor(vals, device=dev,
                                                                                        dtype=torch.float64)
        out = mm(a, _major(Bm.to(dtype), majors[1]), reduced)
        outs.append(out[0, :len(chunk)].double().cpu())
    return torch.cat(outs)


def measure_splitk_on(dtype_name: str, shapes, quick=False, majors=("row", "row"), dev="cuda",
                      mm=cublas_mm) -> dict:
    """Reduced-precision reductions of cuBLAS, per shape (benchmarks/measure_numerics.py's docstring),
    with A and B stored in `majors`, the GEMMs run by `mm` on `dev`."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    X = 1024.0 if dtype_name == "bf16" else 2.0 ** 14  # X + 1 is not representable, X is
    ulp_x = 8.0 if dtype_name == "bf16" else 16.0
    rows = []
    for (M, N, K) in shapes:
        row = {"shape": [M, N, K], "majors": list(majors)}
        a, b = (_major(x, mj) for x, mj in zip(_outlier_inputs(M, N, K, dtype, dev=dev), majors))
        on = mm(a, b, True).double()
        off = mm(a, b, False).double()
        exact = a.double() @ b.double()
        s = a.double().abs() @ b.double().abs()
        row["outlier_differs"] = int((on != off).sum())
        row["err_on_over_S_max"] = float(((on - exact).abs() / s).max())
        row["err_off_over_S_max"] = float(((off - exact).abs() / s).max())
        step = 16
        pos = list(range(step, K, step))
        # X + 1 just before each candidate boundary, -X at it: 1 when both sit in one partial, 0
        # when a partial holding X + 1 was rounded to the output type first
        probes = [[(kx - step, X), (kx - step + 1, 1.0), (kx, -X)] for kx in pos]
        got = _col_probe_run(dtype, M, N, K, probes, True, majors, dev, mm).tolist()
        bounds = [kx for kx, v in zip(pos, got) if v == 0.0]
        odd = [(kx, v) for kx, v in zip(pos, got) if v not in (0.0, 1.0)]
        row["boundaries"] = bounds
        row["partials"] = len(bounds) + 1
        if odd:
            row["unexpected"] = [{"k": kx, "output": v} for kx, v in odd[:8]]
        if bounds:
            b0 = bounds[0]
            deltas = list(range(1, int(2 * ulp_x) + 1))
            got_r = _col_probe_run(dtype, M, N, K, [[(b0 - 2, X), (b0 - 1, float(d)), (b0, -X)] for d in deltas],
                                   True, majors, dev, mm).tolist()
            rn = [float(torch.tensor(X + d).to(dtype).double() - X) for d in deltas]
            row["partial_rounding"] = "rn" if got_r == rn else {"deltas": deltas, "seen": got_r, "rn_would_be": rn}
            chunks = [b0] + [bb - aa for aa, bb in zip(bounds, bounds[1:])]
            row["chunk"] = b0 if all(c == b0 for c in chunks) else None
            if len(bounds) >= 2:
                big = 256.0 if dtype_name == "bf16" else 4096.0  # big + 1 rounds to big in the output type
                got3 = float(_col_probe_run(dtype, M, N, K, [[(0, big), (bounds[0], 1.0), (bounds[1], -big)]],
                                            True, majors, dev, mm)[0])
                row["partial_sum"] = {1.0: "fp32", 0.0: "output precision"}.get(got3, f"seen {got3}")
        row["explained"] = (row["outlier_differs"] == 0) or bool(bounds)
        rows.append(row)
    return {"dtype": dtype_name, "shapes": rows, "ok": all(r["explained"] and "unexpected" not in r for r in rows)}


# -- int8 --------------------------------------------------------------------------------------

def measure_int8() -> dict:
    res = {"cases": []}
    ok = True
    g = torch.Generator().manual_seed(0)
    for (M, N, K, kind) in ((32, 64, 4096, "random"), (64, 128, 8192, "random"), (32, 32, 8192, "extreme")):
        if kind == "random":
            A = torch.randint(-128, 128, (M, K), generator=g).double()
            B = torch.randint(-128, 128, (K, N), generator=g).double()
        else:
            A = torch.full((M, K), -128.0)
            B = torch.full((K, N), -128.0)
        try:
            out = _int_mm(A, B)
        except Exception as e:
            res["cases"].append({"shape": [M, N, K], "kind": kind, "error": str(e)[:300]})
            ok = False
            continue
        exact = A @ B
        wrapped = torch.remainder(exact + 2.0 ** 31, 2.0 ** 32) - 2.0 ** 31
        same = bool(torch.equal(out, wrapped))
        ok &= same
        res["cases"].append({"shape": [M, N, K], "kind": kind, "exact": same,
                             "max_abs_diff": float((out - wrapped).abs().max())})
    res["ok"] = ok
    return res


# -- activations -------------------------------------------------------------------------------

def _act_kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def act_kernel(x_ptr, y_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        x = tl.load(x_ptr + i, mask=m, other=0.0)
        if KIND == 0:  # gelu with tanh.approx.f32
            u = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                          pack=1)
            y = 0.5 * x * (1.0 + t)
        elif KIND == 1:  # silu with ex2.approx and an IEEE division
            e = tl.inline_asm_elementwise("ex2.approx.f32 $0, $1;", "=f,f", [-x * 1.4426950408889634],
                                          dtype=tl.float32, is_pure=True, pack=1)
            y = tl.math.div_rn(x, 1.0 + e)
        elif KIND == 2:  # silu with ex2.approx.ftz and div.approx (a fast-math build)
            e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [-x * 1.4426950408889634],
                                          dtype=tl.float32, is_pure=True, pack=1)
            y = tl.inline_asm_elementwise("div.approx.f32 $0, $1, $2;", "=f,f,f", [x, 1.0 + e], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:  # gelu with tanh.approx and a fused multiply-add form
            u = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x)
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True,
                                          pack=1)
            y = 0.5 * x + 0.5 * x * t
        tl.store(y_ptr + i, y, mask=m)

    return act_kernel


ACT_KINDS = {0: ("gelu_tanh", "tanh.approx.f32"), 1: ("silu", "ex2.approx.f32 + div.rn"),
             2: ("silu", "ex2.approx.ftz.f32 + div.approx"), 3: ("gelu_tanh", "tanh.approx.f32, x(1 + c x^2) form")}


def _exact_act(x64, name):
    if name == "gelu_tanh":
        u = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64 ** 3)
        return x64 * torch.sigmoid(2.0 * u)
    return x64 * torch.sigmoid(x64)


def measure_activations(quick: bool = False) -> dict:
    """Max over a dense sweep of err / (2^-23 (|x| + |y|)), err against float64 on the fp32 input."""
    kern = _act_kernels()
    stride = 61 if quick else 7
    lo_bits, hi_bits = 0x2F800000, 0x43000000  # 2^-32 .. 128
    out = {}
    for kind, (name, impl) in ACT_KINDS.items():
        worst, worst_x, count = 0.0, None, 0
        for sign in (0, 1):
            for c0 in range(lo_bits, hi_bits, stride * (1 << 22)):
                bits = torch.arange(c0, min(c0 + stride * (1 << 22), hi_bits), stride, dtype=torch.int32, device="cuda")
                x = bits.view(torch.float32)
                x = -x if sign else x
                y = torch.empty_like(x)
                kern[(triton_cdiv(x.numel(), 1024),)](x, y, x.numel(), KIND=kind, BLOCK=1024)
                x64 = x.double()
                ye = _exact_act(x64, name)
                ratio = (y.double() - ye).abs() / (2.0 ** -23 * (x64.abs() + ye.abs()))
                ratio = torch.where(torch.isfinite(ratio), ratio, torch.full_like(ratio, float("inf")))
                m, i = ratio.max(0)
                count += x.numel()
                if float(m) > worst:
                    worst, worst_x = float(m), float(x[i])
        out[f"{name}: {impl}"] = {"activation": name, "impl": impl, "max_err_over_u32_x_plus_y": worst,
                                  "at_x": worst_x, "inputs": count, "range": "|x| in [2^-32, 128), both signs"}
    out["ok"] = all(math.isfinite(v["max_err_over_u32_x_plus_y"]) for k, v in out.items() if isinstance(v, dict))
    return out


def triton_cdiv(a, b):
    return -(-a // b)


# -- envelope ----------------------------------------------------------------------------------

def _inputs(kind, M, N, K, t: OpType, seed):
    a, b = gemm_inputs(kind, t.name, M, N, K, seed)
    return a.double(), b.double()


def block_stats(a: torch.Tensor, b: torch.Tensor, bk: int = 64) -> dict:
    """Per element: S, L = sum_j m_j, V = sum_j m_j^2, R = max_j |X_j| with m_j = |X_(j-1)| + s_j."""
    K = a.shape[1]
    X = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64, device=a.device)
    S = torch.zeros_like(X)
    L, V, R = torch.zeros_like(X), torch.zeros_like(X), torch.zeros_like(X)
    for k0 in range(0, K, bk):
        s = a[:, k0:k0 + bk].abs() @ b[k0:k0 + bk].abs()
        m = X.abs() + s
        L += m
        V += m * m
        X = X + a[:, k0:k0 + bk] @ b[k0:k0 + bk]
        S += s
        R = torch.maximum(R, X.abs())
    return {"X": X, "S": S, "L": L, "V": V, "R": R}


def measure_envelope(ads: dict, quick: bool = False) -> dict:
    rows = []
    ks = (256, 4096) if quick else (256, 4096, 16384, 65536)
    for name, ad in ads.items():
        t = OPTYPES[ad.optype]
        for K in ks:
            M = N = 64 if K >= 16384 else 128
            for kind in ("normal", "positive", "outlier"):
                try:
                    A, B = _inputs(kind, M, N, K, t, seed=K + len(kind))
                    out = ad.run(A, B)
                except Exception as e:
                    rows.append({"engine": name, "K": K, "kind": kind, "unavailable": str(e)[:200]})
                    break
                st = block_stats(A.cuda(), B.cuda()) if torch.cuda.is_available() else block_stats(A, B)
                st = {k: v.cpu() for k, v in st.items()}
                err = (out - st["X"]).abs()
                if ad.out != "fp32":
                    err = (err - 0.5 * _ulp(st["X"], ad.out)).clamp(min=0)
                rows.append({"engine": name, "K": K, "kind": kind, "shape": [M, N, K],
                             "max_err_over_S": float((err / st["S"]).max()),
                             "max_err_over_L": float((err / st["L"]).max()),
                             "max_err_over_sqrtV": float((err / st["V"].sqrt()).max()),
                             "max_err_over_R": float((err / st["R"].clamp(min=1e-300)).max())})
    return {"rows": rows}


def _ulp(x, name):
    bits = {"bf16": 7, "fp16": 10, "fp32": 23}[name]
    return E.lead_pow2(x.abs()) * 2.0 ** -bits

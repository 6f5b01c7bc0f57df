"""The engines the numerics measurement runs: one `Adapter` per way to run a GEMM. On the GPU:
cuBLAS (torch.mm, bf16 / fp16 / TF32 / fp32), cuBLASLt fp8 (torch._scaled_mm), Triton's tl.dot
and torch._int_mm; on the CPU, engines emulated by kernels_ref.emulate with known datapaths
(`KNOWN`), for the dry run and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from kernels_ref import emulate as E
from benchmarks.numerics.probes import Probes


@dataclass
class Adapter:
    """One way to run a GEMM. run(A [M, K], B [K, N]) (float64 values exact in `optype`) -> float64
    output [M, N] as the engine returned it (rounded to `out`)."""

    name: str
    optype: str
    out: str  # fp32 | bf16 | fp16 | int32
    run: Callable
    family: str  # grid key: 16bit | tf32 | fp32 | fp8
    note: str = ""

    def diag(self, pr: Probes, multiple: int = 128) -> torch.Tensor:
        n, K = pr.a.shape
        npad = -(-n // multiple) * multiple
        kpad = -(-K // multiple) * multiple
        A = torch.zeros(npad, kpad, dtype=torch.float64)
        Bm = torch.zeros(kpad, npad, dtype=torch.float64)
        A[:n, :K] = pr.a
        Bm[:K, :n] = pr.b.t()
        out = self.run(A, Bm)
        return out.diagonal()[:n].to(torch.float64).cpu()


def _flags(tf32: Optional[bool] = None, reduced: Optional[bool] = None):
    """Context manager setting torch's matmul knobs, restored on exit."""
    m = torch.backends.cuda.matmul

    class _F:
        def __enter__(self):
            self.saved = {}
            if reduced is not None:
                for k in ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"):
                    self.saved[k] = getattr(m, k)
                    setattr(m, k, reduced)
            if tf32 is not None:
                if hasattr(m, "fp32_precision"):
                    self.saved["fp32_precision"] = m.fp32_precision
                    m.fp32_precision = "tf32" if tf32 else "ieee"
                else:
                    self.saved["allow_tf32"] = m.allow_tf32
                    m.allow_tf32 = tf32

        def __exit__(self, *exc):
            for k, v in self.saved.items():
                setattr(m, k, v)
    return _F()


def _cublas(dtype, out_fp32: bool, reduced: bool = False, tf32: Optional[bool] = None):
    def run(A, B):
        a, b = A.cuda().to(dtype), B.cuda().to(dtype)
        with _flags(tf32=tf32, reduced=reduced):
            out = torch.mm(a, b, out_dtype=torch.float32) if out_fp32 else torch.mm(a, b)
        torch.cuda.synchronize()
        return out.double().cpu()
    return run


def _scaled(fast: bool, rowwise: bool):
    def run(A, B):
        a = A.cuda().to(torch.float32).to(torch.float8_e4m3fn).contiguous()
        b = B.cuda().to(torch.float32).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major
        if rowwise:
            sa = torch.ones(a.shape[0], 1, device="cuda", dtype=torch.float32)
            sb = torch.ones(1, b.shape[1], device="cuda", dtype=torch.float32)
            out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)
        else:
            one = torch.ones((), device="cuda", dtype=torch.float32)
            out = torch._scaled_mm(a, b, one, one, out_dtype=torch.float32, use_fast_accum=fast)
        torch.cuda.synchronize()
        return out.double().cpu()
    return run


_TRITON = {}


def _triton_kernel():
    if "k" in _TRITON:
        return _TRITON["k"]
    import triton
    import triton.language as tl

    @triton.jit
    def probe_mm(a_ptr, b_ptr, c_ptr, K, s_am, s_bn, s_cm, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 IP: tl.constexpr, MNI: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * s_am + (k0 + rk)[None, :])
            b = tl.load(b_ptr + rn[None, :] * s_bn + (k0 + rk)[:, None])  # B stored K-major [N, K]
            if MNI >= 0:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=MNI)
            elif IP == "default":
                acc = tl.dot(a, b, acc)
            else:
                acc = tl.dot(a, b, acc, input_precision=IP)
        tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :], acc)

    _TRITON["k"] = probe_mm
    return probe_mm


def _triton(dtype, ip: str = "default", mni: int = -1, bk: int = 64):
    def run(A, B):
        kern = _triton_kernel()
        M, K = A.shape
        N = B.shape[1]
        a = A.cuda().to(torch.float32).to(dtype).contiguous()
        bnk = B.t().cuda().to(torch.float32).to(dtype).contiguous()
        c = torch.empty(M, N, device="cuda", dtype=torch.float32)
        h = kern[(M // 64, N // 64)](a, bnk, c, K, a.stride(0), bnk.stride(0), c.stride(0), BM=64, BN=64, BK=bk,
                                      IP=ip, MNI=mni, num_warps=4)
        torch.cuda.synchronize()
        asm = getattr(h, "asm", None)
        run.wgmma = ("wgmma" in asm.get("ptx", "")) if isinstance(asm, dict) else None
        return c.double().cpu()
    run.wgmma = None
    return run


def _int_mm(A, B):
    a = A.cuda().to(torch.int8).contiguous()
    b = B.cuda().to(torch.int8).t().contiguous().t()
    try:
        out = torch._int_mm(a, b)
    except RuntimeError:
        out = torch._int_mm(a, B.cuda().to(torch.int8).contiguous())
    torch.cuda.synchronize()
    return out.double().cpu()


def gpu_adapters() -> dict[str, Adapter]:
    bf, hf, f32, f8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
    ads = [
        Adapter("cublas_bf16", "bf16", "fp32", _cublas(bf, True), "16bit", "torch.mm(out_dtype=fp32), reductions fp32"),
        Adapter("cublas_bf16_out", "bf16", "bf16", _cublas(bf, False), "16bit", "torch.mm, bf16 out, reductions fp32"),
        Adapter("cublas_fp16", "fp16", "fp32", _cublas(hf, True), "16bit", "torch.mm(out_dtype=fp32)"),
        Adapter("cublas_tf32", "tf32", "fp32", _cublas(f32, False, tf32=True), "tf32", "torch.mm fp32, TF32 on"),
        Adapter("cublas_fp32", "fp32", "fp32", _cublas(f32, False, tf32=False), "fp32", "torch.mm fp32, TF32 off"),
        Adapter("triton_bf16", "bf16", "fp32", _triton(bf), "16bit", "tl.dot, acc fp32"),
        Adapter("triton_fp16", "fp16", "fp32", _triton(hf), "16bit", "tl.dot, acc fp32"),
        Adapter("triton_tf32", "tf32", "fp32", _triton(f32, "tf32"), "tf32", "tl.dot input_precision=tf32"),
        Adapter("triton_tf32x3", "fp32", "fp32", _triton(f32, "tf32x3"), "x3", "tl.dot input_precision=tf32x3"),
        Adapter("triton_bf16x3", "fp32", "fp32", _triton(f32, "bf16x3"), "x3", "tl.dot input_precision=bf16x3"),
        Adapter("triton_ieee", "fp32", "fp32", _triton(f32, "ieee"), "fp32", "tl.dot input_precision=ieee"),
        Adapter("triton_e4m3", "e4m3", "fp32", _triton(f8, bk=128), "fp8", "tl.dot default max_num_imprecise_acc"),
        Adapter("triton_e4m3_mni0", "e4m3", "fp32", _triton(f8, mni=0, bk=128), "fp8", "max_num_imprecise_acc=0"),
        Adapter("triton_e4m3_mni64", "e4m3", "fp32", _triton(f8, mni=64, bk=128), "fp8", "max_num_imprecise_acc=64"),
        Adapter("lt_e4m3_fast", "e4m3", "fp32", _scaled(True, False), "fp8", "_scaled_mm per-tensor, fast accum"),
        Adapter("lt_e4m3", "e4m3", "fp32", _scaled(False, False), "fp8", "_scaled_mm per-tensor"),
        Adapter("lt_e4m3_fast_rowwise", "e4m3", "bf16", _scaled(True, True), "fp8", "_scaled_mm row/col, fast accum"),
        Adapter("lt_e4m3_rowwise", "e4m3", "bf16", _scaled(False, True), "fp8", "_scaled_mm row/col scales"),
    ]
    return {a.name: a for a in ads}


KNOWN = {
    "emu_trunc25": ("bf16", "fp32", "16bit", E.Engine(mma_k=16, align_bits=25, align_round="trunc", acc_round="trunc")),
    "emu_rn24_unfused": ("bf16", "bf16", "16bit", E.Engine(mma_k=8, fused=False, align_bits=24, align_round="rn",
                                                            acc_round="rn")),
    "emu_fp8_13_p128": ("e4m3", "fp32", "fp8", E.Engine(mma_k=32, align_bits=13, acc_bits=13, promotion=128)),
    "emu_fp8_14_fast": ("e4m3", "bf16", "fp8", E.Engine(mma_k=32, align_bits=14, acc_bits=14)),
    "emu_tf32_rna": ("tf32", "fp32", "tf32", E.Engine(mma_k=8, align_bits=24, operand_bits=10, operand_round="rna")),
}


def emulated_adapters() -> dict[str, Adapter]:
    out = {}
    for name, (opt, o, fam, eng) in KNOWN.items():
        def run(A, B, eng=eng, o=o):
            acc = E.gemm(A, B, eng)
            return E.to_dtype(acc, o) if o != "fp32" else E.to_dtype(acc, "fp32")
        out[name] = Adapter(name, opt, o, run, fam, f"emulated: {eng.describe()}")

    for name, ad in out.items():
        eng, o = KNOWN[name][3], ad.out

        def fast_diag(pr, multiple=128, eng=eng, o=o):
            return E.to_dtype(E.dot(pr.a, pr.b, eng), o)
        ad.diag = fast_diag
    return out

"""Timing both paths: the kernel under test, the Triton reference GEMM, and cuBLAS / cuBLASLt,
each under the same discipline (oracle.run.timing; the kernel under test is timed inside its child
process by harness._child with the same stopping rule, with the sink off and the L2 flushed).

The reference paths compute the same problem from the same operands: the Triton reference is
the composed reference GEMM (kernels_ref.gemm, epilogue included); cuBLAS is torch.matmul for
16/32-bit operands and cuBLASLt `_scaled_mm` (fast accumulation, per-tensor scales) for fp8,
GEMM only (its epilogue is not the problem's: the table says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from oracle.problem.attention import is_attention
from oracle.run.inputs import Operands
from oracle.problem.spec import ProblemSpec
from oracle.run.timing import Timing, TimingError, gemm_flops, median_interval, tflops, time_gpu


@dataclass(frozen=True)
class PathTiming:
    name: str
    median_ms: float
    tflops: float
    mode: str  # how it was timed
    reps: int
    rse: float
    note: str = ""
    median_ci_ms: tuple = ()  # a distribution-free 95 % interval of the median (timing.median_interval)

    def to_json(self) -> dict:
        return {"name": self.name, "median_ms": self.median_ms, "TFLOPs": self.tflops, "mode": self.mode,
                "reps": self.reps, "rse": self.rse, "note": self.note, "median_ci_ms": list(self.median_ci_ms)}


@dataclass(frozen=True)
class Performance:
    paths: tuple[PathTiming, ...]
    notes: tuple[str, ...] = ()

    def get(self, name: str) -> Optional[PathTiming]:
        return next((p for p in self.paths if p.name == name), None)

    def ratios(self) -> dict[str, float]:
        """Speed of the kernel under test relative to each peer (>1: the kernel is faster)."""
        k = self.get("kernel")
        if k is None:
            return {}
        return {p.name: p.median_ms / k.median_ms for p in self.paths if p.name != "kernel"}

    def to_json(self) -> dict:
        return {"paths": [p.to_json() for p in self.paths], "kernel_speed_vs": self.ratios(),
                "notes": list(self.notes)}


def l2_flush_bytes() -> int:
    """Twice the device's L2: written between reps so every rep starts cold."""
    props = torch.cuda.get_device_properties(0)
    return 2 * int(getattr(props, "L2_cache_size", 64 << 20) or (64 << 20))


def kernel_timing_request(entry: Optional[str] = None) -> dict:
    """What harness.runner.run_kernel(timing=...) needs to time the kernel under test (TimingError
    without a GPU)."""
    from oracle.run.timing import require_gpu

    require_gpu()
    return {"entry": entry, "flush_bytes": l2_flush_bytes(), "min_reps": 10, "max_reps": 500,
            "rse_target": 0.02, "max_ms": 2000.0, "warmup_ms": 25.0}


def problem_flops(spec) -> int:
    """The problem's floating-point operations: a GEMM's, or an attention forward's."""
    if is_attention(spec):
        return attention_flops(spec)
    return gemm_flops(spec.m, spec.n, spec.k)


def attention_flops(spec) -> int:
    """Multiply-adds of S = QK^T and O = PV (2 flops each) over the (query, key) pairs the mask keeps."""
    from oracle.run.attention_inputs import allowed

    pairs = sum(int(allowed(spec, b).sum()) for b in range(spec.batch))
    return 2 * spec.heads_q * pairs * (spec.head_dim + spec.head_dim_v)


def kernel_path(spec: ProblemSpec, timing: Optional[dict], entry: str) -> Optional[PathTiming]:
    if not timing:
        return None
    ms = float(timing["median_ms"])
    mode = f"events in the child, {'cold' if timing.get('cold_l2') else 'warm'} L2"
    note = f"entry {entry}"
    if timing.get("verified_after") is False:
        note += "; OUTPUT CHANGED during the timed reps (a race or an input it overwrites)"
    samples = sorted(float(x) for x in timing.get("samples_ms") or ())
    interval = median_interval(samples)[:2] if samples else ()
    return PathTiming("kernel", ms, tflops(problem_flops(spec), ms), mode, int(timing["reps"]),
                      float(timing["rse"]), note, interval)


def _timed(name: str, spec: ProblemSpec, fn, note: str = "") -> PathTiming:
    t: Timing = time_gpu(fn)
    return PathTiming(name, t.median_ms, tflops(problem_flops(spec), t.median_ms),
                      f"{t.mode}, {'cold' if t.cold_l2 else 'warm'} L2", t.reps, t.rse,
                      "; ".join([note] + list(t.notes)).strip("; "), t.median_ci_ms)


def reference_paths(spec: ProblemSpec, ops: Operands) -> tuple[list[PathTiming], list[str]]:
    """Time the Triton reference GEMM and cuBLAS on the problem's operands (on the GPU); for an
    attention problem, torch SDPA (attention_paths)."""
    if is_attention(spec):
        return attention_paths(spec, ops)
    from kernels_ref import gemm as ref_gemm
    from kernels_ref.epilogue import Epilogue

    dev = torch.device("cuda")
    o = ops.to(dev)
    paths, notes = [], []
    q = spec.quant_op
    if q is not None:  # the peers multiply the dequantised operand: they time the GEMM without its dequant
        import dataclasses

        from kernels_ref.dequant import dequant_operand

        w = dequant_operand(*o.quant_kn(q), spec.dequant_config)
        o = dataclasses.replace(o, **{q: w.t().contiguous() if q == "a" else w, f"{q}_scales": None,
                                      f"{q}_zeros": None})
        notes.append(f"{q.upper()} ({getattr(spec, f'{q}_dtype')}) was dequantised before the peers ran: they time "
                     f"the {spec.mma_dtype} GEMM alone")
    ep = Epilogue(alpha=spec.alpha, beta=spec.beta, bias_axis=None if spec.bias == "none" else spec.bias,
                  activation=spec.activation, out_dtype=spec.out_dtype, saturate=spec.saturate,
                  graph=tuple(n.token for n in spec.epilogue_nodes))
    kw = dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, ep=ep, c=o.c,
              bias=o.bias.float() if o.bias is not None else None,
              row_scale=o.scale_a.float() if spec.scale_a.kind == "row" else None,
              col_scale=o.scale_b.float() if spec.scale_b.kind == "col" else None)
    tensor_scales = [s.float().reshape(()) for s, k in ((o.scale_a, spec.scale_a.kind), (o.scale_b, spec.scale_b.kind))
                     if k == "tensor"]
    if tensor_scales:
        kw["tensor_scale"] = tensor_scales[0] if len(tensor_scales) == 1 else tensor_scales[0] * tensor_scales[1]
    if spec.block_scaled:
        kw.update(scale_a_block=o.scale_a.float(), scale_b_block=o.scale_b.float(),
                  block_scale_group=(spec.scale_a.block[0], spec.scale_b.block[0], spec.scale_a.block[1]))
    try:
        paths.append(_timed("triton", spec, lambda: ref_gemm(o.a, o.b, **kw), "kernels_ref.gemm, epilogue included"))
    except (TimingError, ValueError) as e:
        notes.append(f"the Triton reference could not be timed: {e}")
    try:
        paths.append(_cublas_path(spec, o))
    except (TimingError, RuntimeError, ValueError) as e:
        notes.append(f"cuBLAS could not be timed: {e}")
    return paths, notes


def _cublas_path(spec: ProblemSpec, o: Operands) -> PathTiming:
    a, b = o.a, o.b  # a quantised operand already dequantised (reference_paths): both in spec.mma_dtype
    if spec.mma_dtype in ("e4m3", "e5m2"):
        one = torch.ones((), device=a.device, dtype=torch.float32)
        bt = b.t().contiguous().t()  # column-major B, as cuBLASLt wants
        return _timed("cublas", spec, lambda: torch._scaled_mm(a, bt, scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16, use_fast_accum=True),
                      "cuBLASLt _scaled_mm, fast accumulation, GEMM only")
    if spec.mma_dtype == "int8":
        return _timed("cublas", spec, lambda: torch._int_mm(a, b), "cuBLAS int8 GEMM only")
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, not TF32
    try:
        return _timed("cublas", spec, lambda: torch.matmul(a, b), "torch.matmul, GEMM only")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def sdpa_peer(spec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """torch SDPA on dense FlashAttention-layout Q, K, V [batch, seqlen, heads, dim] (on the GPU),
    timed under the discipline: its flash backend, or its math backend where flash refuses the
    case. Returns (name, Timing), or (None, None) when no backend ran it."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    kw: dict = {"is_causal": spec.causal != "none", "scale": spec.softmax_scale}
    if spec.heads_q != spec.heads_kv:
        kh, vh = kh.repeat_interleave(spec.group, dim=1), vh.repeat_interleave(spec.group, dim=1)
    if spec.causal == "bottom_right" and spec.seqlen_q != spec.seqlen_k:
        from torch.nn.attention.bias import causal_lower_right

        kw = {"attn_mask": causal_lower_right(spec.seqlen_q, spec.seqlen_k), "scale": spec.softmax_scale}
    for name, backend in (("torch SDPA flash", SDPBackend.FLASH_ATTENTION), ("torch SDPA math", SDPBackend.MATH)):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qh, kh, vh, **kw)
        try:
            sdpa()
            torch.cuda.synchronize()
        except RuntimeError:  # this backend refuses the case: the next one
            continue
        return name, time_gpu(sdpa)
    return None, None


def attention_paths(spec, ops) -> tuple[list[PathTiming], list[str]]:
    """The peer of an attention kernel: torch SDPA on the case's Q, K, V (dense layouts only)."""
    if spec.varlen_q or spec.varlen_k or spec.paged or spec.window is not None or spec.softcap or spec.fp8:
        return [], ["torch SDPA was not timed: it takes dense bf16 / fp16 Q, K, V without a window or soft-cap, and "
                    "this problem has " + ", ".join(w for w, on in (("variable lengths", spec.varlen_q or spec.varlen_k),
                                                                   ("a paged KV cache", spec.paged),
                                                                   ("a window", spec.window is not None),
                                                                   ("a soft-cap", bool(spec.softcap)),
                                                                   ("e4m3 inputs", spec.fp8)) if on)]
    dev = torch.device("cuda")
    name, t = sdpa_peer(spec, ops.q.to(dev), ops.k.to(dev), ops.v.to(dev))
    if t is None:
        return [], ["no torch SDPA backend ran the problem"]
    return [PathTiming("sdpa", t.median_ms, tflops(attention_flops(spec), t.median_ms),
                       f"{t.mode}, {'cold' if t.cold_l2 else 'warm'} L2", t.reps, t.rse,
                       "; ".join([name] + list(t.notes)), t.median_ci_ms)], []

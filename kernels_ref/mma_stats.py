"""The accumulation's bound statistics: what oracle.judging.tolerance reads about a k-loop.

Data path: operands A [M, K], B [K, N] -> the mainloop (`_mainloop._mma_kblock`, exactly as
mma_accumulate) -> per element, from the kernel's own accumulator, in fp32:
  with X_j the accumulator after k-block j (X_-1 = 0) and s_j the block's sum |a||b|,
  m_j = max(X_(j-1) - min(0, X_0..X_(j-1)), max(0, X_0..X_(j-1)) - X_(j-1)) + s_j (the largest
  |running partial| any restart at a k-block boundary could hold, plus the block),
  l = sum_j m_j, v = sum_j m_j^2; q = sum_k (a_mk b_kn)^2 (fp32 operands only, else 0);
  with stats_chunk c k elements (a multiple of block_k), the partials
  P_i = X(end of chunk i) - X(end of chunk i-1) give pabs = sum_i |P_i| and
  prun = sum_i |X(end of chunk i)| (else 0).
On the GPU, bf16 and fp16 problems of the plain kind (`fast_path_applies`) take `_stats_fast_kernel`:
the same arithmetic on operands loaded as values and streamed by the software pipeline, the
accumulation's bits held to the general kernel's by tests/gpu/test_stats_fast_gpu.py.
`trajectory_stats` computes the same from a trajectory (the accumulator and S after each k-block),
and the host spec (`kernels_ref.mma.mma_accumulate_host(with_stats=True)`) is that applied to the
host trajectory.

Constraints: float accumulators only (int32 is exact and needs none); reached through
`kernels_ref.mma.mma_accumulate(with_stats=True)`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple, Optional

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads: its kernels are interpreted or compiled from then on (_interpret)

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

from kernels_ref import _common as C
from kernels_ref._codec import _decode_f32, _dot
from kernels_ref._mainloop import (_acc_store_bits, _add_rn, _kblock_scales, _loop_count, _mma_kblock, _tile_mask,
                                  _tile_scales)
from kernels_ref.descriptor import _box_bits
from kernels_ref.mma_params import ACC_TORCH, MainloopParams


@dataclass(frozen=True)
class MmaStats:
    """The bound statistics of an accumulation (module docstring), each [..., R, C]."""

    l: torch.Tensor
    v: torch.Tensor
    q: Optional[torch.Tensor]  # None: not computed (a trajectory given none)
    pabs: torch.Tensor
    prun: torch.Tensor

    def _map(self, fn) -> "MmaStats":
        return MmaStats(*(None if getattr(self, f) is None else fn(getattr(self, f))
                          for f in ("l", "v", "q", "pabs", "prun")))

    def at(self, *index) -> "MmaStats":
        return self._map(lambda t: t[index])

    def to(self, device) -> "MmaStats":
        return self._map(lambda t: t.to(device))


def check_stats_chunk(stats_chunk: Optional[int], block_k: int) -> int:
    """k-blocks per split-K partial (0: none)."""
    if stats_chunk is None:
        return 0
    if isinstance(stats_chunk, bool) or not isinstance(stats_chunk, int) or stats_chunk <= 0 or stats_chunk % block_k:
        raise ValueError(f"stats_chunk={stats_chunk!r} must be a positive multiple of block_k={block_k}")
    return stats_chunk // block_k


def trajectory_stats(traj: torch.Tensor, s_traj: torch.Tensor, stats_chunk: Optional[int] = None,
                     block_k: int = 1, q: Optional[torch.Tensor] = None) -> MmaStats:
    """The statistics after every k-block of a trajectory (traj, s_traj: [..., n_kb, R, C], the
    accumulator and S after each k-block), on the trajectory's device, one k-block at a time
    (float64 running values, float32 results); q, if given, is put in as is (else None). Each field is
    [..., n_kb, R, C]: field[..., j, :, :] describes the span of k-blocks 0..j (pabs / prun: as if
    the span ended at j, its last partial still open)."""
    kd = traj.dim() - 3
    n_kb = traj.shape[kd]
    c = check_stats_chunk(stats_chunk, block_k)
    shape = tuple(traj.shape)
    if not c and n_kb:
        return _trajectory_stats_scan(traj, s_traj, kd, q)
    out = {f: torch.zeros(shape, dtype=torch.float32, device=traj.device) for f in ("l", "v", "pabs", "prun")}
    one = traj.select(kd, 0).double() if n_kb else torch.zeros((), dtype=torch.float64, device=traj.device)
    x = torch.zeros_like(one)
    lo, hi, l, v = x.clone(), x.clone(), x.clone(), x.clone()
    s_prev = torch.zeros_like(one)
    closed_abs, closed_run, mark = x.clone(), x.clone(), x.clone()
    for j in range(n_kb):
        s_j = s_traj.select(kd, j).double()
        m = torch.maximum(x - lo, hi - x) + (s_j - s_prev)
        l = l + m
        v = v + m * m
        x = traj.select(kd, j).double()
        lo = torch.minimum(lo, x)
        hi = torch.maximum(hi, x)
        s_prev = s_j
        out["l"].select(kd, j).copy_(l)
        out["v"].select(kd, j).copy_(v)
        if c:
            out["pabs"].select(kd, j).copy_(closed_abs + (x - mark).abs())
            out["prun"].select(kd, j).copy_(closed_run + x.abs())
            if (j + 1) % c == 0:
                closed_abs = closed_abs + (x - mark).abs()
                closed_run = closed_run + x.abs()
                mark = x
    qq = None if q is None else q.to(torch.float32).expand(shape)
    return MmaStats(out["l"], out["v"], qq, out["pabs"], out["prun"])


def _trajectory_stats_scan(traj, s_traj, kd: int, q):
    """trajectory_stats without split-K partials, every k-block at once: the running minimum and
    maximum are scans, l and v running sums (a scan along a dimension that is not the last one adds
    in k-block order, as the loop does)."""
    x = traj.double()
    zero = torch.zeros_like(x.narrow(kd, 0, 1))
    lo = torch.cummin(torch.cat([zero, x], kd), kd).values.narrow(kd, 0, x.shape[kd])  # before each k-block
    hi = torch.cummax(torch.cat([zero, x], kd), kd).values.narrow(kd, 0, x.shape[kd])
    prev = torch.cat([zero, x.narrow(kd, 0, x.shape[kd] - 1)], kd)
    s = s_traj.double()
    s_prev = torch.cat([zero, s.narrow(kd, 0, s.shape[kd] - 1)], kd)
    m = torch.maximum(prev - lo, hi - prev) + (s - s_prev)
    l = torch.cumsum(m, kd).float()
    v = torch.cumsum(m * m, kd).float()
    qq = None if q is None else q.to(torch.float32).expand(tuple(traj.shape))
    return MmaStats(l, v, qq, torch.zeros_like(l), torch.zeros_like(l))


@triton.jit
def _sq_kblock(a, b, m0, n0, k0, M, N, K, MC, BKP: tl.constexpr):
    """sum over the k-block of (a b)^2 for fp32 operands (ieee dot of the squares; a, b: Operand)."""
    a_ptr, sa_m, sa_k = a
    b_ptr, sb_k, sb_n = b
    a = _decode_f32(_box_bits(a_ptr, sa_m, sa_k, m0, k0, M, K, MC.BM, MC.BK, MC.BMP, BKP, MC.A_W, False, 0), 0)
    b = _decode_f32(_box_bits(b_ptr, sb_k, sb_n, k0, n0, K, N, MC.BK, MC.BN, BKP, MC.BNP, MC.B_W, False, 0), 0)
    return _dot(a * a, b * b, True)


@triton.jit
def _mma_stats_kernel(ml, out, abs_ptr, st_ptr, st_s, MC, CHUNK_KB: tl.constexpr, WITH_Q: tl.constexpr,
                      BKP: tl.constexpr):
    """mma_accumulate with S and the bound statistics (module docstring); out (ptr, stride_r,
    stride_c), S and the five statistics [5, M, N] (st_s apart) contiguous."""
    a, b, M, N, K, n_kb, sa, sb = ml  # before the loop (_mainloop._mainloop says why)
    out_ptr, so_r, so_c = out
    m0 = tl.program_id(0) * MC.BM
    n0 = tl.program_id(1) * MC.BN
    acc = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    s_acc = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    l_st = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    v_st = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    q_st = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    pabs = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    prun = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    lo = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    hi = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    mark = tl.zeros([MC.BMP, MC.BNP], tl.float32)
    n_loop = _loop_count(n_kb, MC)
    rows = _tile_scales(sa, sb, m0, n0, M, N, MC)
    for kb in range(0, n_loop):
        k0 = kb * MC.BK
        sc = _kblock_scales(rows, k0, MC)
        x = acc
        s_before = s_acc
        acc, s_acc = _mma_kblock(acc, s_acc, sc, a, b, m0, n0, k0, M, N, K, MC, True)
        m = tl.maximum(x - lo, hi - x) + (s_acc - s_before)
        l_st = l_st + m
        v_st = v_st + m * m
        lo = tl.minimum(lo, acc)
        hi = tl.maximum(hi, acc)
        if WITH_Q:
            q_st = q_st + _sq_kblock(a, b, m0, n0, k0, M, N, K, MC, BKP)
        if CHUNK_KB > 0:
            edge = ((kb + 1) % CHUNK_KB == 0) | (kb + 1 == n_kb)
            pabs = tl.where(edge, pabs + tl.abs(acc - mark), pabs)
            prun = tl.where(edge, prun + tl.abs(acc), prun)
            mark = tl.where(edge, acc, mark)
    rm, rn, mask = _tile_mask(ml, m0, n0, MC)
    tl.store(out_ptr + rm * so_r + rn * so_c, _acc_store_bits(acc, MC.ACC), mask=mask)
    tl.store(abs_ptr + rm * N + rn, s_acc, mask=mask)
    off = rm * N + rn
    tl.store(st_ptr + off, l_st, mask=mask)
    tl.store(st_ptr + st_s + off, v_st, mask=mask)
    tl.store(st_ptr + 2 * st_s + off, q_st, mask=mask)
    tl.store(st_ptr + 3 * st_s + off, pabs, mask=mask)
    tl.store(st_ptr + 4 * st_s + off, prun, mask=mask)


@triton.jit
def _stats_fast_kernel(a_ptr, sa_m, sa_k, b_ptr, sb_k, sb_n, M, N, K, n_kb, out_ptr, abs_ptr, st_ptr, st_s,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                       CHUNK_KB: tl.constexpr):
    """`_mma_stats_kernel` for bf16 or fp16 operands (both the same), an fp32 accumulator, zero
    fill, no promotion and no block scales (`fast_path_applies`), on the GPU: the operands are
    loaded as the values tl.dot consumes (no decoding; the software pipeline streams them), each
    k-block is one BK-deep dot added with one rounding (`_add_rn`), as `_mma_kblock` does for
    that case, and the statistics are updated in the same operations and order. Tiles in grouped
    order (GROUP_M tile rows share a B panel in L2); out, S and the statistics [5, M, N]
    contiguous fp32 (q is 0: the operands are not fp32)."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_here = tl.minimum(tiles_m - first_m, GROUP_M)
    tm = first_m + (pid % per_group) % rows_here
    tn = (pid % per_group) // rows_here
    rm = tm * BM + tl.arange(0, BM)
    rn = tn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rm64 = rm.to(tl.int64)  # offsets past 2^31 elements at large sizes
    rn64 = rn.to(tl.int64)
    a_ptrs = a_ptr + rm64[:, None] * sa_m + rk[None, :] * sa_k
    b_ptrs = b_ptr + rk[:, None] * sb_k + rn64[None, :] * sb_n
    acc = tl.zeros([BM, BN], tl.float32)
    s_acc = tl.zeros([BM, BN], tl.float32)
    l_st = tl.zeros([BM, BN], tl.float32)
    v_st = tl.zeros([BM, BN], tl.float32)
    pabs = tl.zeros([BM, BN], tl.float32)
    prun = tl.zeros([BM, BN], tl.float32)
    lo = tl.zeros([BM, BN], tl.float32)
    hi = tl.zeros([BM, BN], tl.float32)
    mark = tl.zeros([BM, BN], tl.float32)
    for kb in range(0, n_kb):
        k_in = (kb * BK + rk) < K
        a = tl.load(a_ptrs, mask=(rm < M)[:, None] & k_in[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_in[:, None] & (rn < N)[None, :], other=0.0)
        x = acc
        s_before = s_acc
        s = tl.dot(a, b)
        s_acc = s_acc + tl.dot(tl.abs(a), tl.abs(b))
        acc = _add_rn(acc, s, 0)
        m = tl.maximum(x - lo, hi - x) + (s_acc - s_before)
        l_st = l_st + m
        v_st = v_st + m * m
        lo = tl.minimum(lo, acc)
        hi = tl.maximum(hi, acc)
        if CHUNK_KB > 0:
            edge = ((kb + 1) % CHUNK_KB == 0) | (kb + 1 == n_kb)
            pabs = tl.where(edge, pabs + tl.abs(acc - mark), pabs)
            prun = tl.where(edge, prun + tl.abs(acc), prun)
            mark = tl.where(edge, acc, mark)
        a_ptrs += BK * sa_k
        b_ptrs += BK * sb_k
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    off = rm64[:, None] * N + rn64[None, :]
    tl.store(out_ptr + off, acc, mask=mask)
    tl.store(abs_ptr + off, s_acc, mask=mask)
    tl.store(st_ptr + off, l_st, mask=mask)
    off += st_s  # the next field, in int64
    tl.store(st_ptr + off, v_st, mask=mask)
    off += st_s
    tl.store(st_ptr + off, tl.zeros([BM, BN], tl.float32), mask=mask)
    off += st_s
    tl.store(st_ptr + off, pabs, mask=mask)
    off += st_s
    tl.store(st_ptr + off, prun, mask=mask)


class StatsLaunch(NamedTuple):
    """How the statistics kernel is launched on the GPU: its output tile, warps and pipeline stages
    (stages: the fast kernel's only). Each element's arithmetic depends on the k-blocks only, not
    on the output tile, so any launch gives the same bits."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3

    @classmethod
    def parse(cls, text: str) -> "StatsLaunch":
        """'BMxBN' or 'BMxBNxWARPSxSTAGES' (64x32, 128x32x8x4)."""
        parts = [int(x) for x in text.lower().split("x")]
        if len(parts) not in (2, 4) or any(v <= 0 for v in parts):
            raise ValueError(f"launch {text!r}: expected BMxBN or BMxBNxWARPSxSTAGES, positive ints")
        return cls(*parts)

    def label(self) -> str:
        return "x".join(str(v) for v in self)


# The general kernel's launch on the GPU: ten [BM, BN] fp32 tiles live in registers, and at
# 128 x 128 they spill (H200, 4096^3 bf16: 16.5 ms at 128 x 128, 2.1 ms at 64 x 32, every output
# bit the same). The interpreter keeps the problem's tile: it pays per step.
STATS_LAUNCH = StatsLaunch(64, 32)
# The fast kernel's: nine tiles in registers as well (no spills at 64 x 32, spills from 64 x 64), a
# wgmma of 64 x BN per warp group. H200, 4096^3 bf16: 1.47 ms, the general kernel 1.93 ms, 128 x 32
# on 8 warps 1.60 ms; the per-k-block statistics on the CUDA cores bound it, not the two products.
STATS_FAST_LAUNCH = StatsLaunch(64, 32, 4, 3)
_FAST_GROUP_M = 8


def fast_path_applies(p: MainloopParams) -> bool:
    """Whether `_stats_fast_kernel` computes this accumulation: compiled, bf16 or fp16 operands of
    one type, an fp32 accumulator, zero fill, no promotion, no block scales, a power-of-two block_k
    a dot takes and K a multiple of it, A row-major with a row stride of a multiple of 16 elements,
    B row-major or column-major (a column stride of a multiple of 16). That is the envelope its GPU
    test holds to the general kernel's bits. Outside it, on an H200: a problem with K = 300 (a
    ragged last k-block, and A's row stride 300) gave an S off the general kernel's at every
    element, the accumulator the same, and one such launch failed with an illegal memory access."""
    cfg = p.config
    bk = p.block_k
    (am, ak), (bk_s, bn_s) = p.a.stride(), p.b.stride()
    layout = ak == 1 and am % 16 == 0 and (bn_s == 1 or (bk_s == 1 and bn_s % 16 == 0))
    return (not C.interpreting() and cfg.a_dtype == cfg.b_dtype and cfg.a_dtype in ("bf16", "fp16")
            and cfg.acc == "fp32" and cfg.promotion_interval is None and not cfg.scaled and cfg.oob_fill == "zero"
            and bk >= 16 and bk & (bk - 1) == 0 and p.a.shape[1] % bk == 0 and layout)


def accumulate_stats(p: MainloopParams, stats_chunk: Optional[int], dev: torch.device,
                     launch: Optional[StatsLaunch] = None, fast: bool = True):
    """mma_accumulate(with_stats=True) of validated parameters: (acc, S, MmaStats). The fast kernel
    where it applies (`fast` False: the general one even there), else the general one, launched
    as `launch` (default: STATS_FAST_LAUNCH or STATS_LAUNCH; under the interpreter the general
    kernel keeps the problem's tile)."""
    if p.acc == "int32":
        raise ValueError("with_stats describes float accumulation; acc='int32' is exact and needs no statistics")
    chunk_kb = check_stats_chunk(stats_chunk, p.block_k)
    fast = fast and fast_path_applies(p)
    if launch is None and (fast or not C.interpreting()):
        launch = STATS_FAST_LAUNCH if fast else STATS_LAUNCH
    M, N = p.a.shape[0], p.b.shape[1]
    out = torch.empty((M, N), dtype=ACC_TORCH[p.acc], device=dev)
    s = torch.empty((M, N), dtype=torch.float32, device=dev)
    st = torch.empty((5, M, N), dtype=torch.float32, device=dev)
    if M and N and fast:
        a, b = p.a, p.b
        grid = (C.cdiv(M, launch.block_m) * C.cdiv(N, launch.block_n),)
        try:
            _stats_fast_kernel[grid](a, a.stride(0), a.stride(1), b, b.stride(0), b.stride(1), M, N, a.shape[1],
                                     p.n_kb, out, s, st, M * N, BM=launch.block_m, BN=launch.block_n, BK=p.block_k,
                                     GROUP_M=_FAST_GROUP_M, CHUNK_KB=chunk_kb, num_warps=launch.num_warps,
                                     num_stages=launch.num_stages, **C.launch_options(dev))
            return out, s, MmaStats(st[0], st[1], st[2], st[3], st[4])
        except CompilationError as e:  # the compiler's refusal, before anything ran: the general kernel's bits
            warnings.warn(f"the statistics kernel's fast path could not be built ({C.refusal(e)}); the general "
                          f"kernel is used", RuntimeWarning, stacklevel=2)
            launch = None if C.interpreting() else STATS_LAUNCH
    if M and N:
        q = p if launch is None else p.with_tile(launch.block_m, launch.block_n)
        cfg = q.config
        opts = q.launch_options(dev)
        if launch is not None:
            opts["num_warps"] = launch.num_warps
        _mma_stats_kernel[(C.cdiv(M, q.block_m), C.cdiv(N, q.block_n))](
            out=C.strided(out), abs_ptr=s, st_ptr=st, st_s=M * N, CHUNK_KB=chunk_kb,
            WITH_Q=cfg.a_dtype == "fp32" and cfg.b_dtype == "fp32", BKP=C.pad_dim(q.block_k), **q.kernel_args(),
            **opts)
    return out, s, MmaStats(st[0], st[1], st[2], st[3], st[4])

"""The Triton references against independent specifications on a sample of every run: if they
disagree, the oracle reports itself as untrustworthy instead of blaming the kernel.

On each sampled tile (knobs.CROSS_CHECK_TILES: the first tapped tiles, else the first and the last):
  load      the Triton operand tiles of the first and the last k-block, bit for bit, against the
            descriptor's host spec (kernels_ref.load.load_tile_host) on the boxes copied to the CPU;
  mma       the Triton accumulator after the last k-block on SAMPLE_LINES rows (every column) and
            SAMPLE_LINES columns (every row) of the tile: both edges, the corners, the quarter and
            middle lines. The spec is kernels_ref.mma_sample.mma_sample_host: each k-block's product in one
            batched float64 torch matmul on the references' device (not Triton), the accumulator's
            roundings in order on the CPU; judged with the accumulation bound of the spec; and the
            whole-output accumulator the verdict reads (the statistics kernel's, a kernel of its
            own on the GPU) bit for bit against that trajectory on the sampled tiles
            (PendingCrossCheck.watch_accumulator, handed it by the analysis);
  epilogue  the cast and every epilogue step that acts (epilogue.step_acts: run_epilogue passes one
            that changes nothing through, its input on both sides) of the whole tile, fed with the
            Triton accumulator and each previous Triton step, against its float64 host spec;
  partials  split problems: each partial and the reduction against their host specs.
The Triton side and the spec's products run first, with no host round trip; what the host
compares crosses to the CPU in one copy, without blocking (HostCopy). The host side (the specs'
roundings and every comparison, on the CPU only) then runs on a worker thread while the stages run
on the GPU (start_cross_check; inline when the references are on the CPU), and the analysis waits
for it before it judges. A wrong Triton value at an element outside the sampled lines of the mma
check is not seen here.

What it costs, bounded by the tile shape and K whatever M and N: T = knobs.CROSS_CHECK_TILES tiles
(default 2), each with 2 k-blocks of both operand tiles, 8 (BM + BN) accumulator elements
(SAMPLE_LINES rows and columns) over the whole K, and BM x BN elements per epilogue step. On the
device: one Triton trajectory of the T tiles (K / BK steps each, every step's accumulator kept:
T K / BK BM BN float32) and 16 T (BM + BN) K float64 products (batched matmuls); to the host: one
copy of the Triton side (the tiles' last accumulators whole: the sampled lines and each epilogue's
input are read from them) and the spec's products, 8 T (BM + BN) K / BK float64 of them (2 MiB at
4096^3 with 128 x 128 x 64 tiles); on the host: the float32 roundings of those products in numpy
and a few hundred small torch operations (a tile at most each), on one thread (`one_host_thread`).
benchmarks/check_bench.py prints the phases: cross_check (the launches) and cross_check_host (what
the analysis still waited for the host side after its stages).
"""

from __future__ import annotations

import concurrent.futures
import os
from contextlib import contextmanager
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from kernels_ref import _common as C
from kernels_ref import epilogue as ref_epilogue
from kernels_ref import load as ref_load
from kernels_ref import mma as ref_mma
from kernels_ref import mma_sample as ref_sample
from kernels_ref import reduce as ref_reduce
from oracle.judging import accumulation_bound
from oracle.judging.compare import Status, compare
from oracle.judging.comparison import bit_patterns, exact_equal
from oracle.judging.differential.context import Context
from oracle.judging.differential.epilogue import Vectors, run_epilogue, step_acts
from oracle.judging.differential.mma import abs_operand

SAMPLE_LINES = 8  # rows and columns of each sampled tile on which the accumulator is checked


def sample_lines(extent: int) -> list[int]:
    """The lines of a tile extent the mma check reads: both edges and their neighbours, the
    quarter and middle lines (a warp's or a fragment's boundary in the usual layouts)."""
    if extent <= SAMPLE_LINES:
        return list(range(extent))
    return sorted({0, 1, extent // 4, extent // 2 - 1, extent // 2, 3 * extent // 4, extent - 2, extent - 1})


class HostCopy:
    """Tensors on their way to the CPU in one copy: on a GPU their bytes are packed on the device
    and copied without blocking into pinned memory (an event marks the end), so the host goes on
    launching work; `get` waits for that copy only and gives the tensors back (views of it)."""

    def __init__(self, tensors: Sequence[Optional[torch.Tensor]]):
        self.tensors = list(tensors)
        live = [t for t in self.tensors if t is not None]
        self.event = None
        if not live or all(t.device.type == "cpu" for t in live):
            self.host = None
            return
        self.packed, self.offsets = pack_bytes(self.tensors, live[0].device)
        if self.packed.device.type == "cuda":
            self.host = torch.empty(self.packed.shape, dtype=torch.uint8, pin_memory=True)
            self.host.copy_(self.packed, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = self.packed.cpu()

    def get(self) -> list[Optional[torch.Tensor]]:
        if self.host is None:
            return self.tensors
        if self.event is not None:
            self.event.synchronize()
        return unpack_bytes(self.host, self.tensors, self.offsets)


def pack_bytes(tensors: Sequence[Optional[torch.Tensor]], device) -> tuple[torch.Tensor, list[int]]:
    """The tensors' bytes in one uint8 tensor on `device` (one concatenation; a strided tensor is made
    contiguous first), and where each begins (-1 for None). The widest dtypes come first, so every
    tensor starts at a multiple of its own element size and its slice can be viewed as that dtype."""
    device = torch.device(device)
    order = sorted((i for i, t in enumerate(tensors) if t is not None), key=lambda i: -tensors[i].element_size())
    offsets, at, parts = [-1] * len(tensors), 0, []
    for i in order:
        t = tensors[i].detach()
        offsets[i] = at
        at += t.numel() * t.element_size()
        if t.numel():
            parts.append((t if t.device == device else t.to(device)).reshape(-1).view(torch.uint8))
    packed = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)
    return packed, offsets


def unpack_bytes(packed: torch.Tensor, tensors: Sequence[Optional[torch.Tensor]], offsets: list[int]):
    """pack_bytes undone: views of `packed` with each tensor's dtype and shape."""
    out = []
    for t, at in zip(tensors, offsets):
        if t is None:
            out.append(None)
            continue
        n = t.numel() * t.element_size()
        out.append(packed[at:at + n].view(t.dtype).reshape(t.shape))
    return out


def disagreement(got: torch.Tensor, want: torch.Tensor, bound: Optional[torch.Tensor] = None,
                 mask: Optional[torch.Tensor] = None) -> Optional[float]:
    """None when `got` agrees with `want` (bit for bit without a bound; else within it, NaN with
    NaN, an infinity with the same infinity, as oracle.judging.compare), else the worst error/bound.
    CPU tensors, compared in numpy: a small array's operation costs a fraction of a torch one's."""
    keep = None if mask is None else mask.numpy()
    if bound is None:
        w = want.to(got.dtype)
        ok = bit_patterns(got).numpy() == bit_patterns(w).numpy()
        if got.is_floating_point():
            ok |= np.isnan(got.float().numpy()) & np.isnan(w.float().numpy())
        bad = ~ok if keep is None else ~ok & keep
        return float("inf") if bad.any() else None
    r, e, b = got.double().numpy(), want.double().numpy(), bound.double().numpy()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        err = np.abs(r - e)
        finite = np.isfinite(r) & np.isfinite(e)
        ok = (np.isnan(r) & np.isnan(e)) | (np.isinf(r) & np.isinf(e) & (np.sign(r) == np.sign(e))) | \
            (finite & (err <= b))
        bad = ~ok if keep is None else ~ok & keep
        if not bad.any():
            return None
        ratio = np.where(finite, err / np.maximum(b, 1e-300), np.inf)
    return float(ratio[bad].max())


@contextmanager
def one_host_thread():
    """torch's CPU operations on one thread. The cross-check's host tensors are small (a tile at
    most), and waking the intra-op threads costs more than such an operation: a parallel sqrt of
    4096 float64 takes milliseconds on a busy or many-core host, one thread microseconds."""
    n = torch.get_num_threads()
    if n > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if n > 1:
            torch.set_num_threads(n)


class PendingCrossCheck:
    """A cross-check whose device work is launched and whose host side (the float64 specs and the
    comparisons, on the CPU only) runs on the worker thread, or, without it, on one host thread
    when `result` is asked. `watch_accumulator` adds the whole-output reference accumulator's
    agreement with the checked trajectory on the sampled tiles."""

    def __init__(self, host_side: Callable[[], list[str]], background: bool, sample=None):
        self._host_side = host_side
        self._future = _executor().submit(host_side) if background else None
        self._sample = sample  # (tiles, their checked accumulators [T, BM, BN], bm, bn) or None
        self._watched: list[tuple[str, torch.Tensor]] = []

    def watch_accumulator(self, acc_full: torch.Tensor) -> None:
        """The whole output's reference accumulator [M, N] (the statistics kernel's, which the verdict
        reads) against the trajectory the cross-check holds to its spec, bit for bit on the sampled
        tiles (inside M x N). The comparison is launched here; `result` reads it."""
        if self._sample is None:
            return
        tiles, final, bm, bn = self._sample
        for t, (tm, tn) in enumerate(tiles):
            got = acc_full[tm * bm:(tm + 1) * bm, tn * bn:(tn + 1) * bn]
            want = final[t, :got.shape[0], :got.shape[1]].to(got.dtype)
            self._watched.append((f"mma tile {(tm, tn)}: the whole-output reference accumulator != the checked "
                                  f"trajectory", exact_equal(got, want).all()))

    def result(self) -> list[str]:
        if self._future is not None:
            problems = self._future.result()
        else:
            with one_host_thread():
                problems = self._host_side()
        return problems + [label for label, ok in self._watched if not bool(ok)]

    def close(self) -> None:
        """Wait for the worker, its outcome dropped (the analysis failed before it asked)."""
        if self._future is not None:
            concurrent.futures.wait([self._future])


_EXECUTOR: Optional[concurrent.futures.ThreadPoolExecutor] = None
_EXECUTOR_PID = 0


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """The cross-check's worker: one thread whose torch CPU operations run on one thread (its own
    OpenMP setting: the caller's threads are left as they are; a torch whose setting is process-wide
    gets the caller's count back, and the worker runs with it). A forked child makes its own."""
    global _EXECUTOR, _EXECUTOR_PID
    if _EXECUTOR is None or _EXECUTOR_PID != os.getpid():
        _EXECUTOR_PID = os.getpid()
        n = torch.get_num_threads()
        _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="oracle-cross-check",
                                                          initializer=torch.set_num_threads, initargs=(1,))
        _EXECUTOR.submit(int).result()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
    return _EXECUTOR


def start_cross_check(ctx: Context, tiles: Sequence[tuple[int, int]],
                      background: Optional[bool] = None) -> PendingCrossCheck:
    """The cross-check's device work launched and its host side pending: on a worker thread when
    `background` (default: references on a GPU, whose stages the host side then overlaps), else run
    by `result`. The split problems' partials are checked here, before it returns."""
    geo, ops = ctx.geo, ctx.ops
    if background is None:
        background = geo.dev.type == "cuda"
    spec = geo.spec
    tiles = [tuple(t) for t in tiles]
    if not tiles or spec.k_blocks == 0:
        return PendingCrossCheck(list, background=False)
    kbs = sorted({0, spec.k_blocks - 1})
    # the Triton side, on the device
    loads = []
    for op in ("a", "b"):
        ops.prefetch_ref_tiles(op, [(t, kb) for t in tiles for kb in kbs])
        x, bmn = ops.operand(op), (geo.bm if op == "a" else geo.bn)
        for t in tiles:
            for kb in kbs:
                i = t[0] if op == "a" else t[1]
                r0, c0 = (i * bmn, kb * geo.bk) if op == "a" else (kb * geo.bk, i * bmn)
                tr, tc = (bmn, geo.bk) if op == "a" else (geo.bk, bmn)
                loads.append((op, t, kb, ops.ref_tile(op, t, kb), x[r0:r0 + tr, c0:c0 + tc]))
    kw = dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ops.block_a,
              scale_b=ops.block_b, block_scale_group=ops.group, oob_fill=spec.oob_fill)
    final = ref_mma.mma_trajectory(ops.a, ops.b, tiles, geo.bm, geo.bn, geo.bk, **kw)[:, -1]  # [T, BM, BN]
    rows_at, cols_at = sample_lines(geo.bm), sample_lines(geo.bn)
    epilogues = []
    zero = torch.zeros(final.shape[1:], dtype=torch.float64, device=geo.dev)  # no step writes to its bound
    for t, tile in enumerate(tiles):
        vec = Vectors(ctx, tile)
        steps = [st for st in run_epilogue(ctx, final[t].float(), zero, 0, vec, cast_bound=False)  # the cast: bit
                 if st[0] == "cast" or step_acts(spec, st[0])]  # for bit; the others are x on both sides (run_epilogue)
        epilogues.append((vec, steps))
    # the float64 spec of the accumulator on the sampled lines: its products on the device
    base_r = torch.tensor([tm * geo.bm for tm, _ in tiles])[:, None]
    base_c = torch.tensor([tn * geo.bn for _, tn in tiles])[:, None]
    lines_r, lines_c = torch.tensor(rows_at)[None], torch.tensor(cols_at)[None]
    every_r, every_c = torch.arange(geo.bm)[None], torch.arange(geo.bn)[None]
    sampled = [ref_sample.mma_sample_products(ops.a, ops.b, rows, cols, geo.bm, geo.bn, geo.bk, **kw)
               for rows, cols in ((base_r + lines_r, base_c + every_c), (base_r + every_r, base_c + lines_c))]
    # one copy to the host
    dev_side = [f for *_, got, box in loads for f in (got, box)]
    dev_side.append(final)  # the sampled lines and each tile's epilogue input are read from it on the host
    for sp in sampled:
        dev_side += sp.tensors()
    for vec, steps in epilogues:
        dev_side += [vec.row_scale, vec.col_scale, vec.tensor_scale, vec.c, vec.bias]
        dev_side += [f for _, y, b in steps for f in (y, b)]
    copy = HostCopy(dev_side)
    partials = []
    if spec.partitioned:
        for tile in tiles:
            a_h, b_h, sa_h, sb_h, local = _host_operands(ctx, tile)
            partials.extend(_partials_cross_check(ctx, tile, a_h, b_h, sa_h, sb_h, local))
    meta = [(op, tile, kb) for op, tile, kb, _, _ in loads]
    steps_of_tiles = [[step for step, _, _ in steps] for _, steps in epilogues]
    return PendingCrossCheck(lambda: _host_side(ctx, tiles, meta, sampled, steps_of_tiles, copy) + partials,
                             background=background, sample=(tiles, final, geo.bm, geo.bn))


def _host_side(ctx: Context, tiles, loads, sampled, steps_of_tiles, copy: HostCopy) -> list[str]:
    """The comparisons of the copied Triton side against the float64 host specs, on the CPU only."""
    geo = ctx.geo
    spec = geo.spec
    problems = []
    host = iter(copy.get())
    for op, tile, kb in loads:
        got, box = next(host), next(host)
        want = ref_load.load_tile_host(box, op, 0, 0, geo.bm if op == "a" else geo.bn, geo.bk, spec.oob_fill)
        if disagreement(got, want) is not None:
            problems.append(f"load_{op} tile {tile} k-block {kb}: Triton != host spec")
    final = next(host)
    got_rows, got_cols = final[:, sample_lines(geo.bm)], final[:, :, sample_lines(geo.bn)]
    specs = []
    for sp in sampled:
        specs.append(ref_sample.mma_sample_finish(sp.with_tensors([next(host) for _ in sp.tensors()])))
    flat = (lambda x, y: torch.cat([x.reshape(len(tiles), -1), y.reshape(len(tiles), -1)], 1))  # [T, sampled]
    got, want, s = flat(got_rows, got_cols).double(), flat(specs[0][0], specs[1][0]), flat(specs[0][1], specs[1][1])
    bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s), s, spec.k).double()
    in_range = accumulator_in_range(s, spec.acc_dtype)
    for t, tile in enumerate(tiles):
        w = disagreement(got[t], want[t], bound=bound[t], mask=in_range[t])
        if w is not None:
            problems.append(f"mma tile {tile}: Triton trajectory != host spec (error/bound {w:.3g})")
    for t, (tile, steps) in enumerate(zip(tiles, steps_of_tiles)):
        host_x = final[t].float().double()  # the epilogue's input, as the device side made it
        vec = _HostVectors(*(next(host) for _ in range(5)))
        for step in steps:
            got, b = next(host), next(host)
            want = _host_epilogue_step(ctx, step, host_x, vec)
            node = next(n for n in spec.epilogue_nodes if n.step == step)
            if node.rounds:
                want = ref_epilogue.apply_round_host(want, node.round)
            w = disagreement(got, want) if step == "cast" else disagreement(got.double(), want, bound=b + 1e-30)
            if w is not None:
                problems.append(f"epilogue_{step} tile {tile}: Triton != host spec")
            host_x = got.double()
    return problems


class _HostVectors:
    """A tile's epilogue vectors on the CPU (what `Vectors` holds on the device)."""

    def __init__(self, row_scale, col_scale, tensor_scale, c, bias):
        self.row_scale, self.col_scale, self.tensor_scale = row_scale, col_scale, tensor_scale
        self.c, self.bias = c, bias


def _partials_cross_check(ctx: Context, tile, a_h, b_h, sa_h, sb_h, local) -> list[str]:
    """The partial references (each partial from zero, block scales of its own k-blocks) and the
    reduction against their host specs."""
    geo, ops = ctx.geo, ctx.ops
    spec = geo.spec
    out, finals = [], []
    scaled = ops.block_a is not None
    dev_kw = dict(scale_a=ops.block_a, scale_b=ops.block_b, block_scale_group=ops.group) if scaled else {}
    host_kw = dict(scale_a=sa_h, scale_b=sb_h, block_scale_group=ops.group) if scaled else {}
    abs_kw = dict(scale_a=sa_h.abs(), scale_b=sb_h.abs(), block_scale_group=ops.group) if scaled else {}
    for p in geo.partials(tile):
        got = ref_mma.partial_trajectory(ops.a, ops.b, [tile], geo.bm, geo.bn, geo.bk, p.kb_begin, p.kb_end,
                                         oob_fill=spec.oob_fill, acc=spec.acc_dtype,
                                         promotion_interval=spec.promotion_interval, **dev_kw)
        want = ref_mma.partial_trajectory_host(a_h, b_h, [local], geo.bm, geo.bn, geo.bk, p.kb_begin, p.kb_end,
                                               oob_fill=spec.oob_fill, acc=spec.acc_dtype,
                                               promotion_interval=spec.promotion_interval, **host_kw)
        s = ref_mma.partial_trajectory_host(abs_operand(a_h), abs_operand(b_h), [local], geo.bm, geo.bn, geo.bk,
                                            p.kb_begin, p.kb_end, acc="fp32", **abs_kw)
        n_k = min(p.kb_end * geo.bk, spec.k) - p.kb_begin * geo.bk
        bound = accumulation_bound.mma_bound(spec, torch.zeros_like(s[0, -1]), s[0, -1], n_k)
        c = compare(got[0, -1].cpu().double(), want[0, -1].double(), bound=bound.double(),
                    mask=accumulator_in_range(s[0, -1], spec.acc_dtype))
        if c.status is Status.MISMATCH:
            out.append(f"mma tile {tile} {p.describe()}: Triton partial != host spec")
        finals.append(got[0, -1].float())
    stack = torch.stack(finals)
    got, want = ref_reduce.reduce_partials(stack).cpu().double(), ref_reduce.reduce_partials_host(stack)
    if not same_values(got, want):
        out.append(f"reduce tile {tile}: Triton != host spec")
    return out


# The largest magnitude an accumulator of each type holds; half of it is the margin below which no
# order of the additions can overflow (every partial sum is at most sum |a||b|, rounded).
_ACC_MAX = {"fp32": torch.finfo(torch.float32).max, "fp16": torch.finfo(torch.float16).max}


def accumulator_in_range(abs_sum: torch.Tensor, acc: str) -> torch.Tensor:
    """The elements a cross-check can judge: where sum |a||b| keeps every partial sum of the
    accumulator finite. Past it (A filled with bf16's largest value, say) the accumulator
    overflows or not depending on the order of its additions, so the reference and its float64
    spec may rightly differ (inf, NaN or a finite value): those elements are left out."""
    most = _ACC_MAX.get(acc)
    a = abs_sum.cpu().double()
    if most is None:  # int32: exact, no overflow is modelled
        return torch.ones(a.shape, dtype=torch.bool)
    return torch.isnan(a) | (a <= most / 2)  # NaN: a NaN operand, which both sides propagate


def same_values(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-for-bit agreement of two exact results, non-finite values included: NaN agrees with NaN
    (a NaN operand propagates to both), an infinity with the same infinity."""
    return x.shape == y.shape and bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())


def _host_operands(ctx: Context, tile):
    """The rows of A and columns of B (and block scales) that one tile reads, on the CPU for the
    float64 host specs, with the tile's index in them: only those cross to the host."""
    geo, ops = ctx.geo, ctx.ops
    tm, tn = tile
    sa = ops.block_a.cpu() if ops.block_a is not None else None
    sb = ops.block_b.cpu() if ops.block_b is not None else None
    if sa is not None and (geo.bm % ops.group[0] or geo.bn % ops.group[1]):
        return ops.a.cpu(), ops.b.cpu(), sa, sb, tile  # block scales that straddle tiles: keep everything
    a = ops.a[tm * geo.bm:(tm + 1) * geo.bm].cpu()
    b = ops.b[:, tn * geo.bn:(tn + 1) * geo.bn].cpu()
    if sa is not None:
        sa = sa[tm * geo.bm // ops.group[0]:(tm + 1) * geo.bm // ops.group[0]]
        sb = sb[tn * geo.bn // ops.group[1]:(tn + 1) * geo.bn // ops.group[1]]
    return a, b, sa, sb, (0, 0)


def _host_epilogue_step(ctx, step, x, vec) -> torch.Tensor:
    spec = ctx.geo.spec
    if step == "scale":
        if vec.row_scale is None and vec.col_scale is None and vec.tensor_scale is None:
            return x
        return ref_epilogue.apply_scale_host(x, row_scale=vec.row_scale, col_scale=vec.col_scale,
                                             tensor_scale=vec.tensor_scale)
    if step == "alpha_beta":
        return ref_epilogue.apply_alpha_beta_host(x, spec.alpha, spec.beta, vec.c)
    if step == "alpha":
        return ref_epilogue.apply_alpha_host(x, spec.alpha)
    if step == "beta_c":
        return ref_epilogue.apply_beta_c_host(x, spec.beta, vec.c)
    if step == "bias":
        return x if vec.bias is None else ref_epilogue.apply_bias_host(x, vec.bias, spec.bias)
    if step == "activation":
        return ref_epilogue.apply_activation_host(x, spec.activation)
    return ref_epilogue.apply_cast_host(x, spec.out_dtype, spec.saturate)

"""The summary of a table of folded tile rows: everything the host reads of a comparison of many
units, written by the device into one small buffer of page-locked host memory, which the host reads
after one wait (`summarize`; no copy).

One kernel after the pass, `_summary_kernel`, one program per BLOCK units: each reduces its units
to one partial record (counts, the first non-finite unit, the worst failing unit and the worst unit)
and takes a ticket from a counter; the program that takes the last ticket folds the records, copies
the worst and the first non-finite rows, lists the first `cap` failing units in row order with the
rows of the first `detail` of them (visiting only the blocks that hold a listed failing unit), and
sets the counter back to zero for the next summary on its stream. The worst unit is the largest
(failing, max_ratio, mismatches, max_abs_err), the first row on ties, as Python's max picks it. A NaN
max_ratio or max_abs_err makes a unit unknown; the caller then reads every row instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from kernels_ref._interpret import choose_backend

choose_backend()  # before triton loads, as in oracle.judging.compare_fast.kernels

import triton
import triton.language as tl

from oracle.judging.compare_fast.stats import (NSTAT, S_BAD, S_COMPARED, S_INF_E, S_INF_R, S_INFO, S_MAX_ABS,
                                               S_MAX_RATIO, S_NAN_E, S_NAN_R, S_RATIO_NAN)

BLOCK = 256  # units per program
CHUNK = 256  # partial records per step of the fold

# A partial record (the kernels write it by these positions; 2^62 is "no unit"): counts, the first
# non-finite unit, then (index, max_ratio, mismatches, max_abs_err) of the worst failing unit and of
# the worst unit.
(P_UNITS, P_FAILING, P_COMPARED, P_BAD, P_NONTRIVIAL, P_UNKNOWN, P_NONFINITE, P_FIRST_NONFINITE,
 P_FAIL_I, P_FAIL_RATIO, P_FAIL_BAD, P_FAIL_ABS, P_ALL_I, P_ALL_RATIO, P_ALL_BAD, P_ALL_ABS) = range(16)
NPART = 16
# The summary buffer (likewise): HEAD counts and indices, the worst row, the first non-finite row,
# the list of failing units (cap), the rows of the first `detail` of them.
(H_UNITS, H_FAILING, H_COMPARED, H_BAD, H_NONTRIVIAL, H_UNKNOWN, H_NONFINITE, H_WORST, H_FIRST_NONFINITE) = range(9)
HEAD = 16


@triton.jit
def _best(cand, ratio, bad, mabs, idx):
    """The largest (ratio, bad, mabs) among cand, lexicographically, the smallest idx on ties:
    (idx, ratio, bad, mabs), idx = 2^62 when cand is empty."""
    t1 = tl.max(tl.where(cand, ratio, float("-inf")), axis=0)
    cand = cand & (ratio == t1)
    t2 = tl.max(tl.where(cand, bad, float("-inf")), axis=0)
    cand = cand & (bad == t2)
    t3 = tl.max(tl.where(cand, mabs, float("-inf")), axis=0)
    cand = cand & (mabs == t3)
    return tl.min(tl.where(cand, idx, 4611686018427387904), axis=0), t1, t2, t3


@triton.jit
def _better(i, r, b, a, j, s, c, d):
    """(j, s, c, d) replaces the running (i, r, b, a): larger key, or the same key and a smaller index."""
    return (s > r) | ((s == r) & ((c > b) | ((c == b) & ((d > a) | ((d == a) & (j < i))))))


@triton.jit
def _block_record(rows_ptr, part_ptr, U, s_row, C_COMPARED: tl.constexpr, C_BAD: tl.constexpr,
                  C_NAN_R: tl.constexpr, C_NAN_E: tl.constexpr, C_INF_R: tl.constexpr, C_INF_E: tl.constexpr,
                  C_INFO: tl.constexpr, C_MAX_ABS: tl.constexpr, C_MAX_RATIO: tl.constexpr,
                  C_RATIO_NAN: tl.constexpr, BLOCK: tl.constexpr, NPART: tl.constexpr):
    """This program's partial record of its BLOCK units (columns as in oracle.judging.compare_fast.stats)."""
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = idx < U
    row = rows_ptr + idx * s_row
    comp = tl.load(row + C_COMPARED, mask=valid, other=0.0)
    bad = tl.load(row + C_BAD, mask=valid, other=0.0)
    nonfin_r = tl.load(row + C_NAN_R, mask=valid, other=0.0) + tl.load(row + C_INF_R, mask=valid, other=0.0)
    nonfin_e = tl.load(row + C_NAN_E, mask=valid, other=0.0) + tl.load(row + C_INF_E, mask=valid, other=0.0)
    info = tl.load(row + C_INFO, mask=valid, other=0.0)
    mabs = tl.load(row + C_MAX_ABS, mask=valid, other=0.0)
    ratio = tl.load(row + C_MAX_RATIO, mask=valid, other=0.0)
    rnan = tl.load(row + C_RATIO_NAN, mask=valid, other=0.0)
    keep = valid & (comp > 0.0)
    fail = keep & (bad > 0.0)
    nonfin = keep & (nonfin_r > nonfin_e)
    unknown = keep & ((rnan > 0.0) | (mabs != mabs))
    out = part_ptr + pid.to(tl.int64) * NPART
    tl.store(out + 0, tl.sum(keep.to(tl.float64), axis=0))
    tl.store(out + 1, tl.sum(fail.to(tl.float64), axis=0))
    tl.store(out + 2, tl.sum(tl.where(keep, comp, 0.0), axis=0))
    tl.store(out + 3, tl.sum(tl.where(keep, bad, 0.0), axis=0))
    tl.store(out + 4, tl.sum((keep & (info > 0.0)).to(tl.float64), axis=0))
    tl.store(out + 5, tl.sum(unknown.to(tl.float64), axis=0))
    tl.store(out + 6, tl.sum(nonfin.to(tl.float64), axis=0))
    tl.store(out + 7, tl.min(tl.where(nonfin, idx, 4611686018427387904), axis=0).to(tl.float64))
    fi, f1, f2, f3 = _best(fail, ratio, bad, mabs, idx)
    tl.store(out + 8, fi.to(tl.float64))
    tl.store(out + 9, f1)
    tl.store(out + 10, f2)
    tl.store(out + 11, f3)
    ai, a1, a2, a3 = _best(keep, ratio, bad, mabs, idx)
    tl.store(out + 12, ai.to(tl.float64))
    tl.store(out + 13, a1)
    tl.store(out + 14, a2)
    tl.store(out + 15, a3)


@triton.jit
def _fold_records(rows_ptr, part_ptr, sum_ptr, U, s_row, NB, CAP, DETAIL, C_COMPARED: tl.constexpr,
                  C_BAD: tl.constexpr, NSTAT: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                  HEAD: tl.constexpr, NPART: tl.constexpr):
    """Folds the NB partial records and writes the summary buffer (module docstring). The records
    are read from L2 (.cg): other programs wrote them during this launch."""
    ar = tl.arange(0, CHUNK)
    cols = tl.arange(0, 32)
    col_ok = cols < NSTAT
    zf = tl.zeros([CHUNK], tl.float64)
    s_units, s_fail, s_comp, s_bad, s_info, s_unknown, s_nonfin = zf, zf, zf, zf, zf, zf, zf
    first_nonfin = tl.full([CHUNK], 4611686018427387904, tl.int64)
    fi = tl.program_id(0).to(tl.int64) * 0 + 4611686018427387904
    f1 = fi.to(tl.float64) * 0.0 - float("inf")
    f2 = f1
    f3 = f1
    ai = fi
    a1 = f1
    a2 = f1
    a3 = f1
    for c in range(0, NB, CHUNK):
        blk = c + ar
        ok = blk < NB
        p = part_ptr + blk.to(tl.int64) * NPART
        s_units += tl.load(p + 0, mask=ok, other=0.0, cache_modifier=".cg")
        s_fail += tl.load(p + 1, mask=ok, other=0.0, cache_modifier=".cg")
        s_comp += tl.load(p + 2, mask=ok, other=0.0, cache_modifier=".cg")
        s_bad += tl.load(p + 3, mask=ok, other=0.0, cache_modifier=".cg")
        s_info += tl.load(p + 4, mask=ok, other=0.0, cache_modifier=".cg")
        s_unknown += tl.load(p + 5, mask=ok, other=0.0, cache_modifier=".cg")
        s_nonfin += tl.load(p + 6, mask=ok, other=0.0, cache_modifier=".cg")
        first_nonfin = tl.minimum(first_nonfin, tl.load(p + 7, mask=ok, other=4611686018427387904.0, cache_modifier=".cg").to(tl.int64))
        ci = tl.load(p + 8, mask=ok, other=4611686018427387904.0, cache_modifier=".cg").to(tl.int64)
        ji, j1, j2, j3 = _best(ci < 4611686018427387904, tl.load(p + 9, mask=ok, other=0.0, cache_modifier=".cg"),
                               tl.load(p + 10, mask=ok, other=0.0, cache_modifier=".cg"), tl.load(p + 11, mask=ok, other=0.0, cache_modifier=".cg"), ci)
        take = _better(fi, f1, f2, f3, ji, j1, j2, j3)
        fi, f1, f2, f3 = tl.where(take, ji, fi), tl.where(take, j1, f1), tl.where(take, j2, f2), tl.where(take, j3, f3)
        ci = tl.load(p + 12, mask=ok, other=4611686018427387904.0, cache_modifier=".cg").to(tl.int64)
        ji, j1, j2, j3 = _best(ci < 4611686018427387904, tl.load(p + 13, mask=ok, other=0.0, cache_modifier=".cg"),
                               tl.load(p + 14, mask=ok, other=0.0, cache_modifier=".cg"), tl.load(p + 15, mask=ok, other=0.0, cache_modifier=".cg"), ci)
        take = _better(ai, a1, a2, a3, ji, j1, j2, j3)
        ai, a1, a2, a3 = tl.where(take, ji, ai), tl.where(take, j1, a1), tl.where(take, j2, a2), tl.where(take, j3, a3)
    n_fail = tl.sum(s_fail, axis=0)
    worst = tl.where(n_fail > 0.0, fi, ai)
    worst = tl.where(worst < 4611686018427387904, worst, 0)
    nonfin_i = tl.min(first_nonfin, axis=0)
    nonfin_i = tl.where(nonfin_i < 4611686018427387904, nonfin_i, 0)
    tl.store(sum_ptr + 0, tl.sum(s_units, axis=0))
    tl.store(sum_ptr + 1, n_fail)
    tl.store(sum_ptr + 2, tl.sum(s_comp, axis=0))
    tl.store(sum_ptr + 3, tl.sum(s_bad, axis=0))
    tl.store(sum_ptr + 4, tl.sum(s_info, axis=0))
    tl.store(sum_ptr + 5, tl.sum(s_unknown, axis=0))
    tl.store(sum_ptr + 6, tl.sum(s_nonfin, axis=0))
    tl.store(sum_ptr + 7, worst.to(tl.float64))
    tl.store(sum_ptr + 8, nonfin_i.to(tl.float64))
    tl.store(sum_ptr + HEAD + cols, tl.load(rows_ptr + worst * s_row + cols, mask=col_ok), mask=col_ok)
    tl.store(sum_ptr + HEAD + NSTAT + cols, tl.load(rows_ptr + nonfin_i * s_row + cols, mask=col_ok), mask=col_ok)
    # the first CAP failing units, and the rows of the first DETAIL of them, in row order
    listed = sum_ptr + HEAD + 2 * NSTAT
    detail_rows = listed + CAP
    run = tl.program_id(0).to(tl.int64) * 0
    units = tl.arange(0, BLOCK)
    for c in range(0, NB, CHUNK):
        blk = c + ar
        cnt = tl.load(part_ptr + blk.to(tl.int64) * NPART + 1, mask=blk < NB, other=0.0, cache_modifier=".cg")
        if (run < CAP) & (tl.sum(cnt, axis=0) > 0.0):  # run counts the failing units of earlier chunks
            for b in range(c, tl.minimum(c + CHUNK, NB)):
                n_b = tl.load(part_ptr + tl.cast(b, tl.int64) * NPART + 1, cache_modifier=".cg").to(tl.int64)
                if (n_b > 0) & (run < CAP):
                    idx = tl.cast(b, tl.int64) * BLOCK + units
                    ok = idx < U
                    comp = tl.load(rows_ptr + idx * s_row + C_COMPARED, mask=ok, other=0.0, cache_modifier=".cg")
                    bad = tl.load(rows_ptr + idx * s_row + C_BAD, mask=ok, other=0.0, cache_modifier=".cg")
                    fail = ok & (comp > 0.0) & (bad > 0.0)
                    pos = run + tl.cumsum(fail.to(tl.int64), axis=0) - 1
                    tl.store(listed + pos, idx.to(tl.float64), mask=fail & (pos < CAP))
                    shown = (fail & (pos < DETAIL))[:, None] & col_ok[None, :]
                    vals = tl.load(rows_ptr + idx[:, None] * s_row + cols[None, :], mask=shown, other=0.0)
                    tl.store(detail_rows + pos[:, None] * NSTAT + cols[None, :], vals, mask=shown)
                    run += n_b


@triton.jit
def _summary_kernel(rows_ptr, part_ptr, sum_ptr, count_ptr, U, s_row, NB, CAP, DETAIL, C_COMPARED: tl.constexpr,
                    C_BAD: tl.constexpr, C_NAN_R: tl.constexpr, C_NAN_E: tl.constexpr, C_INF_R: tl.constexpr,
                    C_INF_E: tl.constexpr, C_INFO: tl.constexpr, C_MAX_ABS: tl.constexpr,
                    C_MAX_RATIO: tl.constexpr, C_RATIO_NAN: tl.constexpr, NSTAT: tl.constexpr,
                    BLOCK: tl.constexpr, CHUNK: tl.constexpr, HEAD: tl.constexpr, NPART: tl.constexpr):
    """Each program's partial record, then the fold by the program that takes the last ticket."""
    _block_record(rows_ptr, part_ptr, U, s_row, C_COMPARED, C_BAD, C_NAN_R, C_NAN_E, C_INF_R, C_INF_E, C_INFO,
                  C_MAX_ABS, C_MAX_RATIO, C_RATIO_NAN, BLOCK, NPART)
    tl.debug_barrier()  # the record is written before the ticket is taken (release, at the GPU's scope)
    ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == NB - 1:
        tl.store(count_ptr, 0)
        _fold_records(rows_ptr, part_ptr, sum_ptr, U, s_row, NB, CAP, DETAIL, C_COMPARED, C_BAD, NSTAT, BLOCK, CHUNK,
                      HEAD, NPART)


@dataclass(frozen=True)
class Summary:
    """What the host reads of a table of U units (counts over the units that compared something)."""
    units: int
    failing: int
    compared: int
    mismatches: int
    nontrivial: int
    unknown: int
    nonfinite: int
    worst: int  # row of the worst unit (0 when no unit compared anything)
    first_nonfinite: int  # row of the first non-finite unit (0 when none)
    worst_row: list
    nonfinite_row: list
    failing_rows: tuple  # the first min(failing, cap) failing rows' indices, in order
    detail_rows: tuple  # the folded rows of the first min(failing, detail) of them


_mapped = threading.local()  # per thread and device: the page-locked buffer the kernel writes, the counters


def _host_buffer(n: int, device: torch.device) -> torch.Tensor:
    """n float64 of page-locked host memory that a kernel on `device` writes directly (mapped: the
    summary needs no copy), one buffer per thread and device, reused by the next summary."""
    bufs = getattr(_mapped, "bufs", None)
    if bufs is None:
        bufs = _mapped.bufs = {}
    buf = bufs.get(device.index)
    if buf is None or buf.numel() < n:
        buf = bufs[device.index] = torch.empty(max(n, 4096), dtype=torch.float64, pin_memory=True)
    return buf[:n]


def _counter(device: torch.device) -> torch.Tensor:
    """The ticket counter of summaries on this thread's current stream of `device` (zero between
    them: the last program sets it back). Launches on one stream run in order, so they share it."""
    bufs = getattr(_mapped, "counters", None)
    if bufs is None:
        bufs = _mapped.counters = {}
    key = (device.index, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    count = bufs.get(key)
    if count is None:
        count = bufs[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return count


def summarize(rows: torch.Tensor, cap: int, detail: int) -> Summary:
    """The summary of `rows` ([U, NSTAT] float64 on the device): one small kernel, writing into
    host memory, and one wait for it (the only synchronisation). `detail` <= `cap` failing units get
    their rows."""
    if rows.dim() != 2 or rows.shape[1] != NSTAT or rows.dtype != torch.float64:
        raise ValueError(f"summarize takes [U, {NSTAT}] float64 rows, got {tuple(rows.shape)} {rows.dtype}")
    if not 0 <= detail <= cap:
        raise ValueError(f"detail = {detail}, cap = {cap}: expected 0 <= detail <= cap")
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    u = rows.shape[0]
    nb = -(-u // BLOCK)
    dev = rows.device
    part = torch.empty(nb, NPART, dtype=torch.float64, device=dev)
    count = _counter(dev)
    n_out = HEAD + 2 * NSTAT + cap + detail * NSTAT

    def launch(out):
        _summary_kernel[(nb,)](rows, part, out, count, u, rows.stride(0), nb, cap, detail, C_COMPARED=S_COMPARED,
                               C_BAD=S_BAD, C_NAN_R=S_NAN_R, C_NAN_E=S_NAN_E, C_INF_R=S_INF_R, C_INF_E=S_INF_E,
                               C_INFO=S_INFO, C_MAX_ABS=S_MAX_ABS, C_MAX_RATIO=S_MAX_RATIO, C_RATIO_NAN=S_RATIO_NAN,
                               NSTAT=NSTAT, BLOCK=BLOCK, CHUNK=CHUNK, HEAD=HEAD, NPART=NPART, num_warps=4)

    if dev.type != "cuda":  # the interpreter: host tensors already
        out = torch.empty(n_out, dtype=torch.float64, device=dev)
        launch(out)
        host = out.numpy()
    else:
        try:
            out = _host_buffer(n_out, dev)
            launch(out)
        except ValueError:  # a pointer this device cannot reach (Triton checks before launching): copy instead
            out = torch.empty(n_out, dtype=torch.float64, device=dev)
            launch(out)
            out = out.cpu()
        else:
            torch.cuda.current_stream(dev).synchronize()
        host = out.numpy()  # numpy: its slices and lists cost a fraction of a tensor's
    at = HEAD + 2 * NSTAT
    v = host[:at].tolist()  # the rest only as far as it was written
    failing = int(v[H_FAILING])
    listed, shown = min(failing, cap), min(failing, detail)
    rows_shown = host[at + cap:at + cap + shown * NSTAT].tolist() if shown else []
    return Summary(int(v[H_UNITS]), failing, int(v[H_COMPARED]), int(v[H_BAD]), int(v[H_NONTRIVIAL]),
                   int(v[H_UNKNOWN]), int(v[H_NONFINITE]), int(v[H_WORST]), int(v[H_FIRST_NONFINITE]),
                   v[HEAD:HEAD + NSTAT], v[HEAD + NSTAT:at],
                   tuple(int(x) for x in host[at:at + listed].tolist()) if listed else (),
                   tuple(rows_shown[k * NSTAT:(k + 1) * NSTAT] for k in range(shown)))

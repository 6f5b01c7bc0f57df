"""The recording's data on the reference device, the geometry of its tiles and k-blocks, and how
one comparison is judged: its mask built from what the kernel recorded, its evidence labelled.

A stage judges all its taps of one kind at once (judge_units): their tensors stacked, one
comparison pass (oracle.judging.compare.compare_units) and a fixed number of host reads, each
unit keeping its own tile, k-block, partial, feed, stand-ins and assumptions.

Masks: an element is compared only if it lies inside the real extent (A rows < M, B columns < N,
accumulator and epilogue elements inside M x N: the rest is padding that feeds no valid output),
the kernel recorded it, and every element that fed it on the teacher-forcing side was recorded
too. Elements past K are compared: they do feed the sum.

A quantised operand (oracle.problem.spec b_scales or a_scales; `quant_op` names it): `a` or `b` is
the reference's dequantised operand (the one the MMA reads, in the other operand's dtype,
kernels_ref.dequant); `q_stored`, `q_scales` and `q_zeros` are what the problem stores (codes,
packed two a byte for a 4-bit type), held with K along the rows as kernels_ref.dequant reads them
(B's as stored, A's transposed: `orient` turns a tile between the two); `stored_tile` is the load
stage's reference in that orientation, `ref_tile(op, ...)` the MMA's.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Optional

import torch

from oracle.judging.compare import FAST_MIN_ELEMENTS, Comparison, Status, compare, compare_units
from oracle.judging.diagnose import StageOutcome
from oracle.judging.evidence import PADDING, UNRECORDED, UPSTREAM_UNRECORDED, Evidence, Feed
from oracle.judging.differential.device_operands import DeviceOperands
from oracle.judging.differential.geometry import Geometry
from oracle.judging.differential.judge import bits
from oracle.judging.differential.tap_index import TapIndex
from oracle.run.recording import Recording


def ratio_map(received, expected, bound, mask, unwritten, unit, kw) -> Optional[torch.Tensor]:
    """err/bound per element of one failing unit (float32 on the CPU), for pictures."""
    shape = kw.get("tile_shape")
    if shape is not None:  # one tile of a split comparison: only its elements
        origin = kw.get("origin", (0, 0))
        r0, c0 = unit.tile[0] * shape[0] - origin[0], unit.tile[1] * shape[1] - origin[1]
        cut = (lambda t: None if t is None else t[r0:r0 + shape[0], c0:c0 + shape[1]])
        full = received.shape
        received, expected, mask = cut(received), cut(expected), cut(mask.expand(full))
        bound, unwritten = cut(None if bound is None else bound.expand(full)), cut(unwritten)
    r, e = received.double(), expected.to(received.device).double()
    if bound is None:
        same = bits(received) == bits(expected.to(received.dtype)) if received.dtype == expected.dtype else r == e
        out = torch.where(same | (torch.isnan(r) & torch.isnan(e)), 0.0, float("inf"))
    else:
        out = (r - e).abs() / bound.to(r.device).double().clamp(min=1e-300)
        out = torch.where(torch.isnan(r) & torch.isnan(e), 0.0, out)
    if unwritten is not None:
        out = torch.where(unwritten.to(out.device), float("inf"), out)
    out = torch.where(mask.to(out.device), out, 0.0)
    return out.float().cpu()


@dataclass(frozen=True)
class StageResult:
    name: str
    teacher_forced: Comparison
    chained: Comparison

    @property
    def outcome(self) -> StageOutcome:
        return StageOutcome(self.name, self.teacher_forced.status, self.chained.status,
                            forced_bad_tiles=self.teacher_forced.bad_tiles, chained_bad_tiles=self.chained.bad_tiles)


NOT_RUN_STAGE = Comparison(Status.NOT_RUN)


@dataclass(frozen=True)
class Unit:
    """One comparison of a stack (Context.judge_units): where it lies and what labels it."""

    feed: Feed
    origin: tuple[int, int]
    tile: tuple[int, int]
    k_block: Optional[int]
    stand_ins: tuple = ()
    partial: Optional[int] = None
    assumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    """The accumulator a tile's epilogue is fed with, as the kernel had it: its final mma tap, its
    reduce tap, or its partials summed by the reference (a stand-in for an untapped reduction)."""

    values: torch.Tensor
    recorded: torch.Tensor
    name: str
    stand_ins: tuple = ()
    assumed: tuple[str, ...] = ()  # partition assumptions the values rest on (Context.assumed)


class Context:
    """What the stage comparisons share: operands and vectors on the reference device, the taps by
    key, the geometry, the reference operand tiles fetched so far, and the padding bookkeeping."""

    def __init__(self, rec: Recording, device: torch.device):
        self.rec, self.spec, self.dev = rec, rec.spec, device
        self.geo = Geometry.of(rec, device)
        self.ops = DeviceOperands.of(rec, self.geo)
        self.open_confounds: list[str] = []  # what broke an assumption of the judgement (see confound())
        self.taps = TapIndex.of(rec, self.geo)
        self.open_confounds.extend(self.taps.confounds)
        self.padding_excluded: dict[str, int] = {}
        self.compare_s = 0.0  # wall seconds inside judge()
        self.bm, self.bn, self.bk = self.geo.bm, self.geo.bn, self.geo.bk

    # -- confounds ---------------------------------------------------------------------------
    def confound(self, text: str) -> None:
        """Something noticed that breaks an assumption of the judgement (a tap outside its partial,
        two taps of one site that disagree, a record the judgement cannot place): an open confound,
        so no finding of the run is more than a DRAFT, and the report names it."""
        if text not in self.open_confounds:
            self.open_confounds.append(text)

    def note_padding(self, stage: str, valid: torch.Tensor, recorded: torch.Tensor) -> None:
        """Count recorded elements past the real extent (the padding confound, handled)."""
        n = int((recorded & ~valid).sum())
        if n:
            self.padding_excluded[stage] = self.padding_excluded.get(stage, 0) + n

    # -- the output's poison -------------------------------------------------------------------
    def unwritten(self, got: torch.Tensor, expected: torch.Tensor) -> Optional[torch.Tensor]:
        """Elements of the output `got` that still hold the poison byte pattern the harness wrote
        before the launch; None when the recording does not say how D was poisoned.

        In a float output the pattern of 0xFF bytes is a NaN that arithmetic never produces (CUDA
        writes canonical NaNs: 0x7FFF in bf16 and fp16, 0x7FFFFFFF in fp32, 0x7F in e4m3), so it
        means "never written" even where the reference is NaN. In an integer output the pattern is a
        value (-1): there it counts as unwritten only where the reference differs from it."""
        p = self.rec.output_poison
        if p is None:
            return None
        size = got.element_size()
        held = (got.contiguous().view(torch.uint8).reshape(*got.shape, size) == p).all(-1)
        pattern = torch.full((size,), p, dtype=torch.uint8).view(got.dtype)
        if got.is_floating_point() and bool(torch.isnan(pattern.float()).all()):
            return held
        want = expected.to(got.dtype).contiguous().view(torch.uint8).reshape(*got.shape, size)
        return held & ~(want == p).all(-1)

    # -- one comparison ------------------------------------------------------------------------
    def judge(self, received: torch.Tensor, expected: torch.Tensor, *, feed: Feed, valid: torch.Tensor,
              recorded: Optional[torch.Tensor] = None, upstream: Optional[torch.Tensor] = None,
              bound: Optional[torch.Tensor] = None, stand_ins=(), unwritten: Optional[torch.Tensor] = None,
              partial: Optional[int] = None, assumed: tuple[str, ...] = (), **kw) -> Comparison:
        """compare() over the elements that were observed on both sides, labelled with what fed
        the expected side, what was masked and why, and what its expected side assumed (`assumed`:
        Context.assumed, carried by every unit)."""
        t0 = time.perf_counter()
        try:
            return self._judge(received, expected, feed=feed, valid=valid, recorded=recorded, upstream=upstream,
                               bound=bound, stand_ins=stand_ins, unwritten=unwritten, partial=partial, assumed=assumed, **kw)
        finally:
            self.compare_s += time.perf_counter() - t0

    def judge_units(self, units, received: torch.Tensor, expected: torch.Tensor, *, valid: torch.Tensor,
                    recorded: Optional[torch.Tensor] = None, upstream: Optional[torch.Tensor] = None,
                    bound: Optional[torch.Tensor] = None, padding: Optional[str] = None) -> list[Comparison]:
        """judge() of many units of one shape at once: received, expected (bound, and the masks,
        broadcastable) [U, R, C], unit u labelled by units[u] (Unit). The same Comparisons, in unit
        order, as judge() of each; `padding`: the stage whose padding confound the units count
        (note_padding of valid and recorded)."""
        t0 = time.perf_counter()
        try:
            return self._judge_units(list(units), received, expected, valid, recorded, upstream, bound, padding)
        finally:
            self.compare_s += time.perf_counter() - t0

    def _judge_units(self, units, received, expected, valid, recorded, upstream, bound, padding) -> list[Comparison]:
        n = len(units)
        if n == 0:
            return []
        shape = tuple(received.shape)
        valid = valid.to(self.dev).expand(shape)
        mask = valid
        counts = [(~valid).sum((1, 2))]
        if recorded is not None:
            recorded = recorded.to(self.dev).expand(shape)
            counts.append((valid & ~recorded).sum((1, 2)))
            mask = mask & recorded
        if upstream is not None:
            counts.append((mask & ~upstream).sum((1, 2)))
            mask = mask & upstream
        if padding is not None and recorded is not None:
            counts.append((recorded & ~valid).sum())
        host = torch.stack([c.expand(n) for c in counts]).cpu().tolist()
        if padding is not None and recorded is not None and host[-1][0]:
            self.padding_excluded[padding] = self.padding_excluded.get(padding, 0) + host[-1][0]
        reasons = [PADDING] + ([UNRECORDED] if recorded is not None else []) + \
            ([UPSTREAM_UNRECORDED] if upstream is not None else [])
        if shape[1] * shape[2] >= FAST_MIN_ELEMENTS and received.is_cuda:  # judge() would take compare_fast
            cmps = [compare(received[u], expected[u], bound=None if bound is None else bound.expand(shape)[u],
                            mask=mask[u], origin=x.origin, tile_index=x.tile, k_block=x.k_block)
                    for u, x in enumerate(units)]
        else:
            cmps = compare_units(received, expected, origins=[x.origin for x in units], tiles=[x.tile for x in units],
                                 k_blocks=[x.k_block for x in units],
                                 bound=None if bound is None else bound.expand(shape), mask=mask)
        failing = [u for u, c in enumerate(cmps) if c.status is Status.MISMATCH]
        maps = {}
        if failing:
            sel = torch.tensor(failing, device=received.device)
            pick = (lambda t: None if t is None else t.expand(shape)[sel])
            whole = ratio_map(pick(received), pick(expected), pick(bound), pick(mask), None, None, {})
            maps = {u: whole[i] for i, u in enumerate(failing)}
        out = []
        for u, (x, cmp) in enumerate(zip(units, cmps)):
            if u in maps:
                cmp = dataclasses.replace(cmp, tiles=tuple(dataclasses.replace(t, ratio_map=maps[u]) if not t.passed
                                                           else t for t in cmp.tiles))
            if x.partial is not None:
                cmp = cmp.of_partial(x.partial)
            if x.assumed:
                cmp = cmp.assuming(tuple(x.assumed))
            masked = {r: host[i][u] for i, r in enumerate(reasons)}
            out.append(cmp.labelled(Evidence.of(x.feed, masked, x.stand_ins)))
        return out

    def _judge(self, received, expected, *, feed, valid, recorded, upstream, bound, stand_ins, unwritten, partial,
               assumed=(), **kw) -> Comparison:
        mask = valid
        masked = {PADDING: int((~valid).sum())}
        if recorded is not None:
            masked[UNRECORDED] = int((valid & ~recorded).sum())
            mask = mask & recorded
        if upstream is not None:
            masked[UPSTREAM_UNRECORDED] = int((mask & ~upstream).sum())
            mask = mask & upstream
        cmp = compare(received, expected, bound=bound, mask=mask, unwritten=unwritten, **kw)
        if cmp.status is Status.MISMATCH:
            cmp = dataclasses.replace(cmp, tiles=tuple(
                dataclasses.replace(t, ratio_map=ratio_map(received, expected, bound, mask, unwritten, t, kw))
                if not t.passed else t for t in cmp.tiles))
        if partial is not None:
            cmp = cmp.of_partial(partial)
        if assumed:
            cmp = cmp.assuming(tuple(assumed))
        return cmp.labelled(Evidence.of(feed, masked, stand_ins))

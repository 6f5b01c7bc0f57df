"""How one comparison of a stage is judged, and what a stage notes while it judges.

judge() and judge_units() are pure: compare() (oracle.judging.compare) over the elements observed
on both sides, labelled with what fed the expected side, what was masked and why, and the partition
boundaries the expected side assumed. A stage judges all its taps of one kind at once
(judge_units): their tensors stacked, one comparison pass (compare_units) and a fixed number of
host reads, each unit keeping its own tile, k-block, partial, feed, stand-ins and assumptions.

Masks: an element is compared only if it can feed a valid output (Geometry.valid_mask), the kernel
recorded it, and every element that fed it on the teacher-forcing side was recorded too.

A stage keeps what it notices in its own Notebook and returns it as StageNotes (frozen): the open
confounds it found, the recorded elements past the real extent it left out (the padding confound,
per stage) and the seconds it spent comparing. The analysis folds the stages' notes in pipeline
order (fold_notes); no stage writes into anything shared.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

import torch

from kernels_ref._common import device_tensor
from oracle.judging.compare import FAST_MIN_ELEMENTS, Comparison, Status, compare, compare_units
from oracle.judging.comparison import bit_patterns, unit_labels
from oracle.judging.evidence import PADDING, UNRECORDED, UPSTREAM_UNRECORDED, Evidence, Feed
from oracle.run.confounds import Confound

_T = TypeVar("_T")
@dataclass(frozen=True)
class Unit:
    """One comparison of a stack (judge_units): where it lies and what labels it."""

    feed: Feed
    origin: tuple[int, int]
    tile: tuple[int, int]
    k_block: Optional[int]
    stand_ins: tuple = ()
    partial: Optional[int] = None
    assumed: tuple[str, ...] = ()


@dataclass(frozen=True)
class StageNotes:
    """What one stage (or a run of stages) noticed while it judged."""

    confounds: tuple[Confound, ...] = ()  # open confounds: what broke an assumption of the judgement, in order
    padding: tuple[tuple[str, int], ...] = ()  # (stage, recorded elements past the real extent), first noted first
    compare_s: float = 0.0  # wall seconds inside judge() and judge_units()

    def __post_init__(self):
        bad = [(k, n) for k, n in self.padding if not isinstance(n, int) or n <= 0]
        if bad:
            raise ValueError(f"StageNotes.padding: counts must be positive ints, got {bad!r}")


def fold_notes(notes: Sequence[StageNotes]) -> StageNotes:
    """The notes of stages in pipeline order as one: confounds in order, each once; padding counts
    summed per stage, in the order first noted; seconds summed."""
    confounds = tuple(dict.fromkeys(c for n in notes for c in n.confounds))
    padding: dict[str, int] = {}
    for n in notes:
        for key, count in n.padding:
            padding[key] = padding.get(key, 0) + count
    return StageNotes(confounds, tuple(padding.items()), sum((n.compare_s for n in notes), 0.0))


class Notebook:
    """One stage's notes while it runs (its own: made by the stage, never shared), and the judging
    calls timed into them; `notes()` freezes them."""

    def __init__(self, dev: torch.device):
        self.dev = dev
        self._confounds: list[Confound] = []
        self._padding: dict[str, int] = {}
        self._seconds = 0.0

    def confound(self, found: Confound) -> None:
        """Something noticed that breaks an assumption of the judgement (a tap outside its partial,
        a record the judgement cannot place): an open confound, so no finding of the run is more
        than a DRAFT, and the report names it."""
        if found not in self._confounds:
            self._confounds.append(found)

    def count_padding(self, stage: str, n: int) -> None:
        if n:
            self._padding[stage] = self._padding.get(stage, 0) + n

    def note_padding(self, stage: str, valid: torch.Tensor, recorded: torch.Tensor) -> None:
        """Count recorded elements past the real extent (the padding confound, handled)."""
        self.count_padding(stage, int((recorded & ~valid).sum()))

    def judge(self, received: torch.Tensor, expected: torch.Tensor, **kw) -> Comparison:
        """judge(), timed."""
        t0 = time.perf_counter()
        try:
            return judge(received, expected, **kw)
        finally:
            self._seconds += time.perf_counter() - t0

    def judge_units(self, units, received: torch.Tensor, expected: torch.Tensor, *, valid: torch.Tensor,
                    recorded: Optional[torch.Tensor] = None, upstream: Optional[torch.Tensor] = None,
                    bound: Optional[torch.Tensor] = None, padding: Optional[str] = None) -> list[Comparison]:
        """judge_units(), timed; `padding`: the stage whose padding confound the units count."""
        t0 = time.perf_counter()
        try:
            cmps, padded = judge_units(self.dev, units, received, expected, valid=valid, recorded=recorded,
                                       upstream=upstream, bound=bound, count_padding=padding is not None)
            if padding is not None:
                self.count_padding(padding, padded)
            return cmps
        finally:
            self._seconds += time.perf_counter() - t0

    def notes(self) -> StageNotes:
        return StageNotes(tuple(self._confounds), tuple(self._padding.items()), self._seconds)


def with_notes(dev: torch.device, judged: Callable[[Notebook], _T]) -> tuple[_T, StageNotes]:
    """`judged(notebook)` with a notebook of its own: what it returns, and the notes it took."""
    nb = Notebook(dev)
    return judged(nb), nb.notes()


def per_operand(judge: Callable[..., _T], doc: str) -> Callable[..., tuple[_T, StageNotes]]:
    """The stage of one operand, `judge(ctx, notebook, op)`, as its callers run it: stage(ctx, op)
    with a notebook of its own, giving what it returns and the notes it took."""
    def stage(ctx, op: str) -> tuple[_T, StageNotes]:
        return with_notes(ctx.geo.dev, lambda nb: judge(ctx, nb, op))

    stage.__doc__ = doc
    return stage


def ratio_map(received, expected, bound, mask, unwritten, unit, kw) -> Optional[torch.Tensor]:
    """err/bound per element of one failing unit (float32 on the CPU), for pictures: 0 where the
    data agree bit for bit (or are the same NaN or Inf), inf where bit-exact data differ, a value is
    NaN or Inf on one side only, or the output was never written; NaN where nothing was compared
    (masked: padding, not recorded)."""
    shape = kw.get("tile_shape")
    if shape is not None:  # one tile of a split comparison: only its elements
        origin = kw.get("origin", (0, 0))
        r0, c0 = unit.tile[0] * shape[0] - origin[0], unit.tile[1] * shape[1] - origin[1]
        cut = (lambda t: None if t is None else t[r0:r0 + shape[0], c0:c0 + shape[1]])
        full = received.shape
        received, expected, mask = cut(received), cut(expected), cut(None if mask is None else mask.expand(full))
        bound, unwritten = cut(None if bound is None else bound.expand(full)), cut(unwritten)
    r, e = received.double(), expected.to(received.device).double()
    if bound is None:
        same = (bit_patterns(received) == bit_patterns(expected.to(received.dtype))
                if received.dtype == expected.dtype else r == e)
        out = torch.where(same | (torch.isnan(r) & torch.isnan(e)), 0.0, float("inf"))
    else:
        out = (r - e).abs() / bound.to(r.device).double().clamp(min=1e-300)
        out = torch.where(torch.isnan(out), float("inf"), out)  # NaN or Inf on one side, or Inf - Inf
        same = (torch.isnan(r) & torch.isnan(e)) | (r == e)  # the same value, the same Inf included
        out = torch.where(same, 0.0, out)
    if unwritten is not None:
        out = torch.where(unwritten.to(out.device), float("inf"), out)
    if mask is not None:
        out = torch.where(mask.to(out.device), out, float("nan"))
    return out.float().cpu()


def with_unit_maps(cmps: list[Comparison], received: torch.Tensor, expected: torch.Tensor,
                   bound: Optional[torch.Tensor], mask: torch.Tensor) -> list[Comparison]:
    """The comparisons of units [U, R, C] (compare_units' answer), each failing unit with its
    ratio_map, made in one pass over the failing units."""
    failing = [u for u, c in enumerate(cmps) if c.status is Status.MISMATCH]
    if not failing:
        return list(cmps)
    shape = tuple(received.shape)
    sel = device_tensor(failing, received.device)
    pick = (lambda t: None if t is None else t.expand(shape)[sel.to(t.device)])
    whole = ratio_map(pick(received), pick(expected), pick(bound), pick(mask), None, None, {})
    out = list(cmps)
    for i, u in enumerate(failing):
        out[u] = dataclasses.replace(out[u], tiles=tuple(dataclasses.replace(t, ratio_map=whole[i])
                                                         if not t.passed else t for t in out[u].tiles))
    return out


def unwritten(poison: Optional[int], got: torch.Tensor, expected: torch.Tensor) -> Optional[torch.Tensor]:
    """Elements of the output `got` that still hold the poison byte pattern the harness wrote
    before the launch (`poison`: Recording.output_poison); None when the recording does not say
    how D was poisoned.

    In a float output the pattern of 0xFF bytes is a NaN that arithmetic never produces (CUDA
    writes canonical NaNs: 0x7FFF in bf16 and fp16, 0x7FFFFFFF in fp32, 0x7F in e4m3), so it
    means "never written" even where the reference is NaN. In an integer output the pattern is a
    value (-1): there it counts as unwritten only where the reference differs from it."""
    if poison is None:
        return None
    size = got.element_size()
    held = (got.contiguous().view(torch.uint8).reshape(*got.shape, size) == poison).all(-1)
    pattern = torch.full((size,), poison, dtype=torch.uint8).view(got.dtype)
    if got.is_floating_point() and bool(torch.isnan(pattern.float()).all()):
        return held
    want = expected.to(got.dtype).contiguous().view(torch.uint8).reshape(*got.shape, size)
    return held & ~(want == poison).all(-1)


def judge(received: torch.Tensor, expected: torch.Tensor, *, feed: Feed, valid: Optional[torch.Tensor],
          recorded: Optional[torch.Tensor] = None, upstream: Optional[torch.Tensor] = None,
          bound: Optional[torch.Tensor] = None, stand_ins=(), unwritten: Optional[torch.Tensor] = None,
          partial: Optional[int] = None, assumed: tuple[str, ...] = (), **kw) -> Comparison:
    """compare() over the elements that were observed on both sides, labelled with what fed the
    expected side, what was masked and why, and what its expected side assumed (`assumed`:
    Geometry.assumed, carried by every unit). `valid` None: every element lies inside the problem
    (no padding), and no mask is read for it."""
    mask = valid
    masked = {PADDING: 0 if valid is None else int((~valid).sum())}
    if recorded is not None:
        masked[UNRECORDED] = int((~recorded if mask is None else mask & ~recorded).sum())
        mask = recorded if mask is None else mask & recorded
    if upstream is not None:
        masked[UPSTREAM_UNRECORDED] = int((~upstream if mask is None else mask & ~upstream).sum())
        mask = upstream if mask is None else mask & upstream
    cmp = compare(received, expected, bound=bound, mask=mask, unwritten=unwritten, **kw)
    if cmp.status is Status.MISMATCH:
        cmp = dataclasses.replace(cmp, tiles=tuple(
            dataclasses.replace(t, ratio_map=ratio_map(received, expected, bound, mask, unwritten, t, kw))
            if not t.passed else t for t in cmp.tiles))
    return cmp.labelled(Evidence.of(feed, masked, stand_ins), partial=partial, assumed=assumed)


def judge_units(dev: torch.device, units, received: torch.Tensor, expected: torch.Tensor, *, valid: torch.Tensor,
                recorded: Optional[torch.Tensor] = None, upstream: Optional[torch.Tensor] = None,
                bound: Optional[torch.Tensor] = None, count_padding: bool = False) -> tuple[list[Comparison], int]:
    """judge() of many units of one shape at once: received, expected (bound, and the masks,
    broadcastable) [U, R, C] on `dev`, unit u labelled by units[u] (Unit). The same Comparisons, in
    unit order, as judge() of each, and (`count_padding`, with `recorded`) how many recorded
    elements lie past the real extent (else 0)."""
    units = list(units)
    n = len(units)
    if n == 0:
        return [], 0
    shape = tuple(received.shape)
    valid = valid.to(dev).expand(shape)
    mask = valid
    counts = [(~valid).sum((1, 2))]
    if recorded is not None:
        recorded = recorded.to(dev).expand(shape)
        counts.append((valid & ~recorded).sum((1, 2)))
        mask = mask & recorded
    if upstream is not None:
        counts.append((mask & ~upstream).sum((1, 2)))
        mask = mask & upstream
    padded = count_padding and recorded is not None
    if padded:
        counts.append((recorded & ~valid).sum())
    host = torch.stack([c.expand(n) for c in counts]).cpu().tolist()
    reasons = [PADDING] + ([UNRECORDED] if recorded is not None else []) + \
        ([UPSTREAM_UNRECORDED] if upstream is not None else [])
    evidence = [Evidence.of(x.feed, {r: host[i][u] for i, r in enumerate(reasons)}, x.stand_ins)
                for u, x in enumerate(units)]
    if shape[1] * shape[2] >= FAST_MIN_ELEMENTS and received.is_cuda:  # judge() would take compare_fast
        cmps = [compare(received[u], expected[u], bound=None if bound is None else bound.expand(shape)[u],
                        mask=mask[u], origin=x.origin, tile_index=x.tile, k_block=x.k_block)
                .labelled(ev, partial=x.partial, assumed=x.assumed) for u, (x, ev) in enumerate(zip(units, evidence))]
    else:  # each unit made with its labels (a replace of every unit after it took a third of the time)
        cmps = compare_units(received, expected, origins=[x.origin for x in units], tiles=[x.tile for x in units],
                             k_blocks=[x.k_block for x in units],
                             bound=None if bound is None else bound.expand(shape), mask=mask,
                             labels=[unit_labels(ev, x.partial, x.assumed) for x, ev in zip(units, evidence)])
        cmps = [c.with_evidence(ev) for c, ev in zip(cmps, evidence)]
    return with_unit_maps(cmps, received, expected, bound, mask), (int(host[-1][0]) if padded else 0)

"""The differential: every stage's Triton reference run on the kernel's own data, twice.

For each stage in pipeline order (descriptor -> load -> mma -> epilogue sub-steps -> store):
- chained: the reference fed with the reference output of the stage before it;
- teacher-forced: the reference fed with the kernel's OWN tap of the stage before it (the
  nearest tapped stage upstream; the steps in between are run by the reference).
Then the first divergent stage is judged (oracle.diagnose) and the open confounds decide
whether the localisation is a VERDICT or a DRAFT.

Padding: elements past the real extent (A rows >= M, B columns >= N, accumulator and epilogue
elements outside M x N) feed no valid output, so they are excluded from every comparison and
the report says how many were. Elements past K are compared: they do feed the sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from harness.taps import EPILOGUE_STEPS, STAGES, Tap
from kernels_ref import descriptor as ref_descriptor
from kernels_ref import epilogue as ref_epilogue
from kernels_ref import load as ref_load
from kernels_ref import mma as ref_mma
from kernels_ref.dtypes import DTYPES
from oracle import knobs, tolerance
from oracle.compare import NOT_RUN, Comparison, Status, combine, compare
from oracle.diagnose import Diagnosis, Kind, StageOutcome, Verdict, evidence_kind, first_divergence
from oracle.inputs import KTAG_PERIOD, decode_index, decode_ktag
from oracle.recording import Recording


@dataclass(frozen=True)
class StageResult:
    name: str
    teacher_forced: Comparison
    chained: Comparison

    @property
    def outcome(self) -> StageOutcome:
        return StageOutcome(self.name, self.teacher_forced.status, self.chained.status)


@dataclass(frozen=True)
class FirstDivergence:
    stage: str
    tile: tuple[int, int]
    k_block: Optional[int]
    element: Optional[tuple[int, int]]  # global (row, col) in the stage's tensor space
    element_in_tile: Optional[tuple[int, int]]
    received: Optional[float]
    expected: Optional[float]
    bound: Optional[float]
    kind: Kind
    comparison: str  # "teacher_forced" or "chained"
    hint: Optional[str] = None  # what the controlled input says about the bad value


@dataclass(frozen=True)
class Analysis:
    recording: Recording
    stages: tuple[StageResult, ...]
    cross_check: tuple[str, ...]  # disagreements between Triton references and host specs
    diagnosis: Diagnosis
    kind: Kind
    open_confounds: tuple[str, ...]
    handled_confounds: tuple[str, ...]
    first: Optional[FirstDivergence]
    first_nonfinite: Optional[tuple[str, tuple[int, int], Optional[int], Optional[tuple[int, int]]]]
    device: str

    @property
    def verdict(self) -> Verdict:
        return self.diagnosis.verdict


def reference_device() -> torch.device:
    want = knobs.DEVICE.get()
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


class _Context:
    """The recording's data on the reference device, and the derived per-stage facts."""

    def __init__(self, rec: Recording, device: torch.device):
        self.rec, self.spec, self.dev = rec, rec.spec, device
        ops = rec.operands.to(device)
        self.a, self.b, self.c = ops.a, ops.b, ops.c
        self.bias = ops.bias.float() if ops.bias is not None else None
        spec = self.spec
        self.row_scale = ops.scale_a.float() if spec.scale_a.kind == "row" else None
        self.col_scale = ops.scale_b.float() if spec.scale_b.kind == "col" else None
        tensor_scales = [s.float().reshape(()) for s, k in ((ops.scale_a, spec.scale_a.kind),
                                                             (ops.scale_b, spec.scale_b.kind)) if k == "tensor"]
        self.tensor_scale = None
        if tensor_scales:
            self.tensor_scale = tensor_scales[0] if len(tensor_scales) == 1 else tensor_scales[0] * tensor_scales[1]
        self.block_a = ops.scale_a.float() if spec.block_scaled else None
        self.block_b = ops.scale_b.float() if spec.block_scaled else None
        self.group = ((spec.scale_a.block[0], spec.scale_b.block[0], spec.scale_a.block[1])
                      if spec.block_scaled else None)
        self.output = rec.output.to(device) if rec.output is not None else None
        self.taps: dict[tuple, Tap] = {t.key: t for t in rec.taps}
        self.padding_excluded: dict[str, int] = {}
        self._ref_tiles: dict[tuple[str, int, int], torch.Tensor] = {}
        t = spec.tile
        self.bm, self.bn, self.bk = t.bm, t.bn, t.bk

    # -- geometry ------------------------------------------------------------------------------
    def taps_of(self, stage: str) -> list[Tap]:
        return sorted((t for t in self.rec.taps if t.stage == stage),
                      key=lambda t: (t.tile, -1 if t.k_block is None else t.k_block))

    def valid_mask(self, stage: str, tile: tuple[int, int], shape) -> torch.Tensor:
        """True where the element can feed a valid output (see module docstring)."""
        spec = self.spec
        tm, tn = tile
        rows = torch.arange(shape[0], device=self.dev)
        cols = torch.arange(shape[1], device=self.dev)
        if stage.endswith("_a"):
            ok = (tm * self.bm + rows < spec.m)[:, None].expand(shape)
        elif stage.endswith("_b"):
            ok = (tn * self.bn + cols < spec.n)[None, :].expand(shape)
        else:
            ok = (tm * self.bm + rows < spec.m)[:, None] & (tn * self.bn + cols < spec.n)[None, :]
        return ok

    def tap_mask(self, tap: Tap, stage_for_padding: Optional[str] = None) -> torch.Tensor:
        shape = tuple(tap.values.shape)
        valid = self.valid_mask(stage_for_padding or tap.stage, tap.tile, shape)
        recorded = tap.mask.to(self.dev) if tap.mask is not None else torch.ones(shape, dtype=torch.bool,
                                                                                  device=self.dev)
        excluded = int((recorded & ~valid).sum())
        if excluded:
            key = stage_for_padding or tap.stage
            self.padding_excluded[key] = self.padding_excluded.get(key, 0) + excluded
        return recorded & valid

    def origin(self, stage: str, tile: tuple[int, int], k_block: Optional[int]) -> tuple[int, int]:
        tm, tn = tile
        if stage.endswith("_a"):
            return tm * self.bm, (k_block or 0) * self.bk
        if stage.endswith("_b"):
            return (k_block or 0) * self.bk, tn * self.bn
        return tm * self.bm, tn * self.bn

    def operand(self, op: str) -> torch.Tensor:
        return self.a if op == "a" else self.b

    def ref_tile(self, op: str, tile: tuple[int, int], kb: int) -> torch.Tensor:
        idx = tile[0] if op == "a" else tile[1]
        key = (op, idx, kb)
        if key not in self._ref_tiles:
            self.prefetch_ref_tiles(op, [(tile, kb)])
        return self._ref_tiles[key]

    def prefetch_ref_tiles(self, op: str, sites) -> None:
        """Load the reference operand tiles of many (tile, k-block) sites in one launch."""
        pairs = sorted({((t[0] if op == "a" else t[1]), kb) for t, kb in sites} -
                       {(i, kb) for o, i, kb in self._ref_tiles if o == op})
        if not pairs:
            return
        tiles = ref_load.load_tiles(self.operand(op), op, pairs, self.bm if op == "a" else self.bn, self.bk,
                                    self.spec.oob_fill)
        for (idx, kb), t in zip(pairs, tiles):
            self._ref_tiles[(op, idx, kb)] = t

    def tile_slice(self, vec: Optional[torch.Tensor], start: int, size: int) -> Optional[torch.Tensor]:
        if vec is None:
            return None
        out = torch.zeros(size, dtype=vec.dtype, device=self.dev)
        part = vec[start:start + size]
        out[:part.numel()] = part
        return out

    def block_scales(self, tile: tuple[int, int], kb: int):
        if not self.spec.block_scaled:
            return None, None
        gm, gn, gk = self.group
        tm, tn = tile
        g = (kb * self.bk) // gk
        rows = (tm * self.bm + torch.arange(self.bm, device=self.dev)).clamp(max=self.spec.m - 1) // gm
        cols = (tn * self.bn + torch.arange(self.bn, device=self.dev)).clamp(max=self.spec.n - 1) // gn
        return self.block_a[rows, g], self.block_b[cols, g]


# -- descriptor and load ---------------------------------------------------------------------
def _descriptor_stage(ctx: _Context, op: str) -> StageResult:
    """The shared-memory image the kernel's TMA wrote, against a TMA with the right descriptor.

    Both images are read back through the declared swizzle, so the comparison is bit-exact and
    speaks in logical (row, col) coordinates; a wrong swizzle or stride shows as misplaced elements.
    """
    spec = ctx.spec
    stage = f"descriptor_{op}"
    sw = getattr(spec, f"swizzle_{op}")
    major = getattr(spec, f"{op}_major")
    dname = getattr(spec, f"{op}_dtype")
    block_mn = ctx.bm if op == "a" else ctx.bn
    parts = []
    for tap in ctx.taps_of(stage):
        idx = tap.tile[0] if op == "a" else tap.tile[1]
        want_img = ref_descriptor.operand_image(ctx.operand(op), op, major, idx, tap.k_block, block_mn, ctx.bk, sw,
                                                spec.oob_fill)
        expected = ref_load.tile_from_image(want_img, op, major, block_mn, ctx.bk, dname, sw)
        received = ref_load.tile_from_image(tap.values.to(ctx.dev), op, major, block_mn, ctx.bk, dname, sw)
        mask = ctx.valid_mask(stage, tap.tile, tuple(expected.shape))
        excluded = int((~mask).sum())
        if excluded:
            ctx.padding_excluded[stage] = ctx.padding_excluded.get(stage, 0) + excluded
        parts.append(compare(received, expected, mask=mask, origin=ctx.origin(stage, tap.tile, tap.k_block),
                             tile_index=tap.tile, k_block=tap.k_block))
    parts.extend(_descriptor_fields(ctx, op))
    if not parts:
        return StageResult(stage, NOT_RUN, NOT_RUN)
    cmp = combine(parts)
    return StageResult(stage, cmp, cmp)  # the first stage: its input is the kernel's own global memory


def _descriptor_fields(ctx: _Context, op: str) -> list[Comparison]:
    """Recorded tensor-map fields against the ones the problem implies."""
    recs = [d for d in ctx.rec.descriptors if d.operand == op]
    if not recs:
        return []
    from harness.tensormap import mn_dim, operand_tensormap

    spec = ctx.spec
    rows, cols = (spec.m, spec.k) if op == "a" else (spec.k, spec.n)
    want = operand_tensormap(op, getattr(spec, f"{op}_major"), rows, cols, getattr(spec, f"{op}_dtype"),
                             ctx.bm if op == "a" else ctx.bn, ctx.bk, getattr(spec, f"swizzle_{op}"),
                             spec.oob_fill).to_descriptor_record(op)
    mn_axis = mn_dim(op, getattr(spec, f"{op}_major"))
    out = []
    for got in recs:
        diffs, notes = [], []
        for f in ("dtype", "global_dims", "global_strides", "box_dims", "element_strides", "swizzle", "oob_fill"):
            g, w = getattr(got, f), getattr(want, f)
            if g == w:
                continue
            if f == "global_dims" and _padded_only(g, w, mn_axis):
                # a buffer padded past M / N: those rows feed only outputs past M / N
                extra = g[mn_axis] - w[mn_axis]
                notes.append(f"descriptor {op}: the map covers {extra} padding row(s) past "
                             f"{'M' if op == 'a' else 'N'} = {w[mn_axis]} (global_dims {g!r})")
                ctx.padding_excluded[f"descriptor_{op} map rows"] = extra
                continue
            diffs.append(f"{f}: kernel {g!r}, expected {w!r}")
        status = Status.MISMATCH if diffs else Status.MATCH
        out.append(Comparison(status, (), tuple(f"descriptor field {d}" for d in diffs) or
                              tuple(notes) + ("descriptor fields match the problem",)))
    return out


def _padded_only(got: tuple, want: tuple, mn_axis: int) -> bool:
    return (len(got) == len(want) and got[mn_axis] > want[mn_axis]
            and all(g == w for i, (g, w) in enumerate(zip(got, want)) if i != mn_axis))


def _load_stage(ctx: _Context, op: str) -> StageResult:
    spec = ctx.spec
    stage = f"load_{op}"
    sw = getattr(spec, f"swizzle_{op}")
    major = getattr(spec, f"{op}_major")
    dname = getattr(spec, f"{op}_dtype")
    block_mn = ctx.bm if op == "a" else ctx.bn
    tf, ch = [], []
    missing_upstream = 0
    ctx.prefetch_ref_tiles(op, [(t.tile, t.k_block) for t in ctx.taps_of(stage)])
    for tap in ctx.taps_of(stage):
        received = tap.values.to(ctx.dev)
        mask = ctx.tap_mask(tap)
        origin = ctx.origin(stage, tap.tile, tap.k_block)
        ch.append(compare(received, ctx.ref_tile(op, tap.tile, tap.k_block), mask=mask, origin=origin,
                          tile_index=tap.tile, k_block=tap.k_block))
        up = ctx.taps.get((f"descriptor_{op}", tap.tile, tap.k_block))
        if up is None:
            missing_upstream += 1
            continue
        fed = ref_load.tile_from_image(up.values.to(ctx.dev), op, major, block_mn, ctx.bk, dname, sw)
        tf.append(compare(received, fed, mask=mask, origin=origin, tile_index=tap.tile, k_block=tap.k_block))
    note = f"{missing_upstream} load tap(s) had no shared-memory image to teacher-force from" if missing_upstream \
        and tf else ""
    return StageResult(stage, combine(tf, note) if tf else NOT_RUN, combine(ch) if ch else NOT_RUN)


# -- mma -------------------------------------------------------------------------------------
def _abs_operand(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        return x.float().abs()
    if x.element_size() == 1:  # fp8: no abs on CUDA; clear the sign bit (exact, and fp8 stays fp8)
        return (x.view(torch.uint8) & 0x7F).view(x.dtype)
    return x.abs()


def _mma_stage(ctx: _Context, last_kb: int) -> tuple[StageResult, dict]:
    """Accumulator taps: teacher-forced one k-block span at a time, chained along the trajectory."""
    spec = ctx.spec
    taps = ctx.taps_of("mma")
    finals: dict[tuple[int, int], Tap] = {}
    if not taps:
        return StageResult("mma", NOT_RUN, NOT_RUN), finals
    kb_of = {id(t): (last_kb if t.k_block is None else t.k_block) for t in taps}
    for t in taps:
        if kb_of[id(t)] == last_kb:
            finals[t.tile] = t
    tiles = sorted({t.tile for t in taps})
    kw = dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ctx.block_a,
              scale_b=ctx.block_b, block_scale_group=ctx.group)
    traj = ref_mma.mma_trajectory(ctx.a, ctx.b, tiles, ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill, **kw)
    abs_kw = dict(kw, acc="fp32", promotion_interval=None,
                  scale_a=ctx.block_a.abs() if ctx.block_a is not None else None,
                  scale_b=ctx.block_b.abs() if ctx.block_b is not None else None)
    s_traj = ref_mma.mma_trajectory(_abs_operand(ctx.a), _abs_operand(ctx.b), tiles, ctx.bm, ctx.bn, ctx.bk,
                                    **abs_kw)
    traj_stats = ref_mma.trajectory_stats(traj, s_traj, spec.reduction_chunk, ctx.bk)
    row_of = {tile: i for i, tile in enumerate(tiles)}
    by_tile: dict[tuple[int, int], dict[int, Tap]] = {}
    for t in taps:
        by_tile.setdefault(t.tile, {})[kb_of[id(t)]] = t
    tf, ch = [], []
    untapped_operands = 0
    # teacher-forced: each tap's span starts after the nearest earlier accumulator tap of its tile
    j0_of = {id(t): max((j for j in by_tile[t.tile] if j < kb_of[id(t)]), default=-1) for t in taps}
    for op in ("a", "b"):  # the reference operands that stand in for untapped ones, in one launch each
        ctx.prefetch_ref_tiles(op, [(t.tile, j) for t in taps for j in range(j0_of[id(t)] + 1, kb_of[id(t)] + 1)
                                    if (f"load_{op}", t.tile, j) not in ctx.taps])
    for t in taps:
        kb = kb_of[id(t)]
        i = row_of[t.tile]
        received = t.values.to(ctx.dev).float()
        mask = ctx.tap_mask(t)
        origin = ctx.origin("mma", t.tile, kb)
        n_k = min((kb + 1) * ctx.bk, spec.k)
        bound = tolerance.mma_bound(spec, torch.zeros_like(s_traj[i, kb]), s_traj[i, kb], n_k,
                                    traj_stats.at(i, kb), x_abs=traj[i, kb].abs())
        ch.append(compare(received, traj[i, kb].float(), bound=bound, mask=mask, origin=origin, tile_index=t.tile,
                          k_block=kb))
        j0 = j0_of[id(t)]  # -1: from zero at the start
        acc = by_tile[t.tile][j0].values.to(ctx.dev) if j0 >= 0 else None
        start_abs = acc.float().abs() if acc is not None else torch.zeros(ctx.bm, ctx.bn, device=ctx.dev)
        if acc is None:
            acc = torch.zeros(ctx.bm, ctx.bn, device=ctx.dev, dtype=traj.dtype)
        span_s = s_traj[i, kb] - (s_traj[i, j0] if j0 >= 0 else 0)
        span = tolerance.SpanStats(acc.float())
        for j in range(j0 + 1, kb + 1):
            a_t = ctx.taps.get(("load_a", t.tile, j))
            b_t = ctx.taps.get(("load_b", t.tile, j))
            untapped_operands += (a_t is None) + (b_t is None)
            a_tile = a_t.values.to(ctx.dev) if a_t is not None else ctx.ref_tile("a", t.tile, j)
            b_tile = b_t.values.to(ctx.dev) if b_t is not None else ctx.ref_tile("b", t.tile, j)
            s_blk = s_traj[i, j] - (s_traj[i, j - 1] if j > 0 else 0)
            if a_t is not None or b_t is not None:  # the kernel's own operands may differ in magnitude
                s_own = _abs_operand(a_tile).float() @ _abs_operand(b_tile).float() * _block_abs(ctx, t.tile, j)
                span_s = span_s - s_blk + s_own
                s_blk = s_own
            sa, sb = ctx.block_scales(t.tile, j)
            acc = ref_mma.mma_step(acc.to(traj.dtype), a_tile, b_tile, acc=spec.acc_dtype,
                                   promotion_interval=spec.promotion_interval, scale_a=sa, scale_b=sb)
            span.add(s_blk, acc.float())
        n_span = min((kb + 1) * ctx.bk, spec.k) - (j0 + 1) * ctx.bk
        bound = tolerance.mma_bound(spec, start_abs, span_s, max(n_span, 1), span)
        tf.append(compare(received, acc.float(), bound=bound, mask=mask, origin=origin, tile_index=t.tile,
                          k_block=kb))
    note = (f"{untapped_operands} operand tile(s) were not tapped: the reference loads stood in for them"
            if untapped_operands else "")
    return StageResult("mma", combine(tf, note), combine(ch)), finals


def _block_abs(ctx: _Context, tile, kb) -> torch.Tensor:
    sa, sb = ctx.block_scales(tile, kb)
    if sa is None:
        return torch.ones((), device=ctx.dev)
    return sa.abs()[:, None] * sb.abs()[None, :]


# -- epilogue --------------------------------------------------------------------------------
class _Vectors:
    """The epilogue's per-row / per-column operands, for the whole output or one tile."""

    def __init__(self, ctx: _Context, tile: Optional[tuple[int, int]]):
        spec = ctx.spec
        if tile is None:
            r0, c0, h, w = 0, 0, spec.m, spec.n
            self.c = ctx.c
        else:
            r0, c0, h, w = tile[0] * ctx.bm, tile[1] * ctx.bn, ctx.bm, ctx.bn
            self.c = None
            if ctx.c is not None:
                self.c = torch.zeros(h, w, dtype=ctx.c.dtype, device=ctx.dev)
                part = ctx.c[r0:r0 + h, c0:c0 + w]
                self.c[:part.shape[0], :part.shape[1]] = part
        sl = (lambda v, s, n: v if tile is None else ctx.tile_slice(v, s, n))
        self.row_scale = sl(ctx.row_scale, r0, h)
        self.col_scale = sl(ctx.col_scale, c0, w)
        self.tensor_scale = ctx.tensor_scale
        self.bias = None
        if ctx.bias is not None:
            self.bias = sl(ctx.bias, r0, h) if spec.bias == "row" else sl(ctx.bias, c0, w)


def _run_epilogue(ctx: _Context, x: torch.Tensor, bound: torch.Tensor, first_step: int, vec: _Vectors):
    """Run epilogue steps from index `first_step` on, carrying the bound. Yields (step, y, bound)."""
    spec = ctx.spec
    x = x.float()
    for step in EPILOGUE_STEPS[first_step:]:
        if step == "scale":
            if vec.row_scale is None and vec.col_scale is None and vec.tensor_scale is None:
                y, own, gain = x, torch.zeros_like(x), torch.ones_like(x)
            else:
                y = ref_epilogue.apply_scale(x, row_scale=vec.row_scale, col_scale=vec.col_scale,
                                             tensor_scale=vec.tensor_scale)
                factor = torch.ones_like(x)
                if vec.row_scale is not None:
                    factor = factor * vec.row_scale[:, None]
                if vec.col_scale is not None:
                    factor = factor * vec.col_scale[None, :]
                if vec.tensor_scale is not None:
                    factor = factor * vec.tensor_scale
                own, gain = tolerance.scale_step(y, factor)
        elif step == "alpha_beta":
            y = ref_epilogue.apply_alpha_beta(x, spec.alpha, spec.beta, vec.c)
            own, gain = tolerance.alpha_beta_step(x, vec.c.float() if vec.c is not None else None, spec.alpha,
                                                  spec.beta)
        elif step == "bias":
            if vec.bias is None:
                y, own, gain = x, torch.zeros_like(x), torch.ones_like(x)
            else:
                y = ref_epilogue.apply_bias(x, vec.bias, spec.bias)
                bb = vec.bias[:, None] if spec.bias == "row" else vec.bias[None, :]
                own, gain = tolerance.bias_step(x, bb.expand_as(x))
        elif step == "activation":
            y = ref_epilogue.apply_activation(x, spec.activation)
            own, gain = tolerance.activation_step(x, y, spec.activation, spec.activation_impl)
        else:  # cast
            y = ref_epilogue.apply_cast(x, spec.out_dtype, spec.saturate)
            bound = tolerance.cast_bound(bound, y.double(), spec.out_dtype)
            yield step, y, bound
            return
        bound = gain.double() * bound + own.double()
        yield step, y, bound
        x = y


def _reference_chain(ctx: _Context) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The reference pipeline over the whole output: each epilogue step's values and bound."""
    spec = ctx.spec
    kw = dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ctx.block_a,
              scale_b=ctx.block_b, block_scale_group=ctx.group)
    stats = None
    if spec.acc_dtype == "int32":
        acc_full = ref_mma.mma_accumulate(ctx.a, ctx.b, ctx.bm, ctx.bn, ctx.bk, **kw).float()
        s_full = ref_mma.mma_accumulate(_abs_operand(ctx.a), _abs_operand(ctx.b), ctx.bm, ctx.bn, ctx.bk,
                                        **dict(kw, acc="fp32", promotion_interval=None)).double()
    else:  # the accumulator, S and the partial-sum statistics the accumulation bound reads, in one pass
        acc_full, s_full, stats = ref_mma.mma_accumulate(ctx.a, ctx.b, ctx.bm, ctx.bn, ctx.bk, **kw, with_stats=True,
                                                         stats_chunk=spec.reduction_chunk)
        acc_full, s_full = acc_full.float(), s_full.double()
    bound0 = tolerance.mma_bound(spec, torch.zeros_like(s_full), s_full, spec.k, stats,
                                 x_abs=acc_full.double().abs()).double()
    return {step: (y, b) for step, y, b in _run_epilogue(ctx, acc_full, bound0, 0, _Vectors(ctx, None))}


def expected_output(spec, operands, device: Optional[torch.device] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference D of the whole problem and its per-element bound: what epilogue_store's chained
    comparison holds the output to. D is in the output dtype where the bound is zero everywhere
    (bit-exact), else float32; the bound is float64 (0 = bit-exact)."""
    from oracle.inputs import Provenance

    rec = Recording(spec=spec, operands=operands, output=None, provenance=Provenance("captured"),
                    kernel_error="none: a reference-only recording")
    rec.validate()
    ctx = _Context(rec, device or reference_device())
    y, b = _reference_chain(ctx)["cast"]
    exact = bool((b == 0).all())
    return (y.to(DTYPES[spec.out_dtype].torch) if exact else y.float()), b


def _epilogue_stages(ctx: _Context, chain, mma_finals: dict) -> list[StageResult]:
    results = []
    # Upstream sources of a tile, in pipeline order: the final accumulator, then each sub-step.
    for si, step in enumerate(EPILOGUE_STEPS):
        stage = f"epilogue_{step}"
        tf, ch = [], []
        for tap in ctx.taps_of(stage):
            received = tap.values.to(ctx.dev)
            mask = ctx.tap_mask(tap)
            origin = ctx.origin(stage, tap.tile, None)
            y_full, b_full = chain[step]
            exp, bnd = _tile_of(ctx, y_full, tap.tile), _tile_of(ctx, b_full, tap.tile)
            exact = step == "cast" and bool((bnd == 0).all())
            ch.append(compare(received, exp.to(received.dtype) if exact else exp, bound=None if exact else bnd,
                              mask=mask, origin=origin, tile_index=tap.tile))
            fed = _teacher_forced_epilogue(ctx, tap.tile, si, mma_finals)
            if fed is not None:
                y, b, span = fed
                exact = bool((b == 0).all()) and y.dtype == received.dtype
                c = compare(received, y if exact else y.float(), bound=None if exact else b, mask=mask,
                            origin=origin, tile_index=tap.tile)
                tf.append(c.with_notes(f"fed from {span}" if span else ""))
        results.append(StageResult(stage, combine(tf) if tf else NOT_RUN, combine(ch) if ch else NOT_RUN))
    results.append(_store_stage(ctx, chain, mma_finals))
    return results


def _tile_of(ctx: _Context, full: torch.Tensor, tile) -> torch.Tensor:
    r0, c0 = tile[0] * ctx.bm, tile[1] * ctx.bn
    out = torch.zeros(ctx.bm, ctx.bn, dtype=full.dtype, device=ctx.dev)
    part = full[r0:r0 + ctx.bm, c0:c0 + ctx.bn]
    out[:part.shape[0], :part.shape[1]] = part
    return out


def _teacher_forced_epilogue(ctx: _Context, tile, step_index: int, mma_finals: dict):
    """The reference for epilogue step `step_index` fed from the kernel's nearest upstream tap.

    Returns (values, bound, note) or None when nothing upstream was tapped."""
    for up in range(step_index - 1, -2, -1):
        if up >= 0:
            src = ctx.taps.get((f"epilogue_{EPILOGUE_STEPS[up]}", tile, None))
        else:
            src = mma_finals.get(tile)
        if src is None:
            continue
        skipped = [f"epilogue_{s}" for s in EPILOGUE_STEPS[up + 1:step_index]]
        name = src.stage if up >= 0 else "mma (final accumulator)"
        note = f"the kernel's {name} tap" + (f" through untapped {', '.join(skipped)}" if skipped else "")
        y = src.values.to(ctx.dev)
        b = torch.zeros(y.shape, dtype=torch.float64, device=ctx.dev)
        last = min(step_index, len(EPILOGUE_STEPS) - 1)  # the store runs every step up to the cast
        if up < last:
            for step, y, b in _run_epilogue(ctx, y, b, up + 1, _Vectors(ctx, tile)):
                if step == EPILOGUE_STEPS[last]:
                    break
        return y, b, note
    return None


def _store_stage(ctx: _Context, chain, mma_finals: dict) -> StageResult:
    """The output D in global memory: chained against the reference GEMM over every tile, and
    teacher-forced per tapped tile against the kernel's last epilogue tap placed at its coordinates."""
    if ctx.output is None:
        return StageResult("epilogue_store", NOT_RUN, NOT_RUN)
    y_ref, b_ref = chain["cast"]
    exact = bool((b_ref == 0).all())
    ch = compare(ctx.output, y_ref.to(ctx.output.dtype) if exact else y_ref, bound=None if exact else b_ref,
                 tile_shape=(ctx.bm, ctx.bn), max_detail_tiles=knobs.MAX_DETAIL_TILES.get())
    tiles = sorted({t.tile for t in ctx.rec.taps if t.stage.startswith("epilogue")} | set(mma_finals))
    tf = []
    for tile in tiles:
        fed = _teacher_forced_epilogue(ctx, tile, len(EPILOGUE_STEPS), mma_finals)
        if fed is None:
            continue
        y, b, note = fed
        r0, c0 = tile[0] * ctx.bm, tile[1] * ctx.bn
        got = ctx.output[r0:r0 + ctx.bm, c0:c0 + ctx.bn]
        h, w = got.shape
        y, b = y[:h, :w], b[:h, :w]
        is_exact = bool((b == 0).all()) and y.dtype == got.dtype
        tf.append(compare(got, y if is_exact else y.float(), bound=None if is_exact else b, origin=(r0, c0),
                          tile_index=tile).with_notes(f"fed from {note}"))
    return StageResult("epilogue_store", combine(tf) if tf else NOT_RUN, ch)


# -- cross-check -----------------------------------------------------------------------------
def _cross_check(ctx: _Context, tiles: Sequence[tuple[int, int]]) -> list[str]:
    """The Triton references against the float64 host specs on a few tiles."""
    spec = ctx.spec
    problems = []
    a_cpu, b_cpu = ctx.a.cpu(), ctx.b.cpu()
    last_kb = spec.k_blocks - 1
    for tile in tiles:
        a_h, b_h, sa_h, sb_h, local = _host_operands(ctx, tile, a_cpu, b_cpu)
        for op in ("a", "b"):
            idx = local[0] if op == "a" else local[1]
            bmn = ctx.bm if op == "a" else ctx.bn
            x = a_h if op == "a" else b_h
            for kb in sorted({0, last_kb}):
                got = ctx.ref_tile(op, tile, kb).cpu()
                want = ref_load.load_tile_host(x, op, idx, kb, bmn, ctx.bk, spec.oob_fill)
                c = compare(got, want.to(got.dtype))
                if c.status is Status.MISMATCH:
                    problems.append(f"load_{op} tile {tile} k-block {kb}: Triton != host spec")
        kw = dict(acc=spec.acc_dtype, promotion_interval=spec.promotion_interval, scale_a=ctx.block_a,
                  scale_b=ctx.block_b, block_scale_group=ctx.group)
        traj = ref_mma.mma_trajectory(ctx.a, ctx.b, [tile], ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill, **kw)
        host_kw = dict(kw, scale_a=sa_h, scale_b=sb_h)
        host = ref_mma.mma_trajectory_host(a_h, b_h, [local], ctx.bm, ctx.bn, ctx.bk, oob_fill=spec.oob_fill,
                                           **host_kw)
        s = ref_mma.mma_trajectory_host(_abs_operand(a_h), _abs_operand(b_h), [local], ctx.bm, ctx.bn, ctx.bk,
                                        **dict(host_kw, acc="fp32", promotion_interval=None,
                                               scale_a=sa_h.abs() if sa_h is not None else None,
                                               scale_b=sb_h.abs() if sb_h is not None else None))
        bound = tolerance.mma_bound(spec, torch.zeros_like(s[0, last_kb]), s[0, last_kb], spec.k)
        c = compare(traj[0, last_kb].cpu().double(), host[0, last_kb].double(), bound=bound.double())
        if c.status is Status.MISMATCH:
            w = c.worst
            problems.append(f"mma tile {tile}: Triton trajectory != host spec (error/bound {w.max_ratio:.3g})")
        vec = _Vectors(ctx, tile)
        x = traj[0, last_kb].float()
        host_x = x.cpu().double()
        for step, y, b in _run_epilogue(ctx, x, torch.zeros(x.shape, dtype=torch.float64, device=ctx.dev), 0,
                                        vec):
            want = _host_epilogue_step(ctx, step, host_x, vec)
            got = y.cpu()
            if step == "cast":
                c = compare(got, want.to(got.dtype))
            else:
                c = compare(got.double(), want, bound=b.cpu() + 1e-30)
            if c.status is Status.MISMATCH:
                problems.append(f"epilogue_{step} tile {tile}: Triton != host spec")
            host_x = y.cpu().double()
    return problems


def _host_operands(ctx: _Context, tile, a_cpu, b_cpu):
    """The rows of A and columns of B (and block scales) that one tile reads, for the float64 host
    specs, with the tile's index in them: the specs then never widen whole operands to float64."""
    tm, tn = tile
    sa = ctx.block_a.cpu() if ctx.block_a is not None else None
    sb = ctx.block_b.cpu() if ctx.block_b is not None else None
    if sa is not None and (ctx.bm % ctx.group[0] or ctx.bn % ctx.group[1]):
        return a_cpu, b_cpu, sa, sb, tile  # block scales that straddle tiles: keep everything
    a = a_cpu[tm * ctx.bm:(tm + 1) * ctx.bm]
    b = b_cpu[:, tn * ctx.bn:(tn + 1) * ctx.bn]
    if sa is not None:
        sa = sa[tm * ctx.bm // ctx.group[0]:(tm + 1) * ctx.bm // ctx.group[0]]
        sb = sb[tn * ctx.bn // ctx.group[1]:(tn + 1) * ctx.bn // ctx.group[1]]
    return a, b, sa, sb, (0, 0)


def _host_epilogue_step(ctx, step, x, vec: _Vectors) -> torch.Tensor:
    spec = ctx.spec
    cpu = (lambda v: v.cpu() if v is not None else None)
    if step == "scale":
        if vec.row_scale is None and vec.col_scale is None and vec.tensor_scale is None:
            return x
        return ref_epilogue.apply_scale_host(x, row_scale=cpu(vec.row_scale), col_scale=cpu(vec.col_scale),
                                             tensor_scale=cpu(vec.tensor_scale))
    if step == "alpha_beta":
        return ref_epilogue.apply_alpha_beta_host(x, spec.alpha, spec.beta, cpu(vec.c))
    if step == "bias":
        return x if vec.bias is None else ref_epilogue.apply_bias_host(x, cpu(vec.bias), spec.bias)
    if step == "activation":
        return ref_epilogue.apply_activation_host(x, spec.activation)
    return ref_epilogue.apply_cast_host(x, spec.out_dtype, spec.saturate)


# -- the whole differential ------------------------------------------------------------------
def analyze(rec: Recording, device: Optional[torch.device] = None) -> Analysis:
    rec.validate()
    spec = rec.spec
    if spec.batch != 1:
        from oracle.recording import RecordingError

        raise RecordingError(f"batch={spec.batch}: the differential judges one GEMM at a time; "
                             f"record each batch entry as its own run")
    dev = device or reference_device()
    ctx = _Context(rec, dev)
    if rec.kernel_error is not None and rec.output is None and not rec.taps:
        diag = first_divergence([], kernel_error=True)
        return Analysis(rec, (), (), diag, Kind.DRAFT, (), (), None, None, str(dev))

    tapped = sorted({t.tile for t in rec.taps})
    sample = tapped[:knobs.CROSS_CHECK_TILES.get()] or \
        sorted({(0, 0), (spec.tiles_m - 1, spec.tiles_n - 1)})[:knobs.CROSS_CHECK_TILES.get()]
    cross = tuple(_cross_check(ctx, sample))

    stages: list[StageResult] = []
    for op in ("a", "b"):
        stages.append(_descriptor_stage(ctx, op))
    for op in ("a", "b"):
        stages.append(_load_stage(ctx, op))
    mma_result, finals = _mma_stage(ctx, spec.k_blocks - 1)
    stages.append(mma_result)
    stages.extend(_epilogue_stages(ctx, _reference_chain(ctx), finals))
    assert [s.name for s in stages] == list(STAGES), "stage order drifted from harness.taps.STAGES"

    diag = first_divergence([s.outcome for s in stages], kernel_error=rec.kernel_error is not None,
                            references_trusted=not cross)
    handled = ()
    if ctx.padding_excluded:
        per = ", ".join(f"{stage} {n}" for stage, n in ctx.padding_excluded.items())
        handled = (f"padding confound: tap elements past the real extent (rows >= M={spec.m} or columns >= "
                   f"N={spec.n}) feed no valid output and were excluded ({per})",)
    open_conf = list(rec.confounds)
    if not rec.provenance.controlled:
        open_conf.append(f"inputs are not controlled ({rec.provenance.describe()}): a localisation on them is a "
                         f"draft until reproduced on a controlled input")
    open_conf.extend(_mixing_confound(ctx))
    kind = evidence_kind(diag, inputs_controlled=rec.provenance.controlled, confounds=open_conf)
    first = _first(ctx, stages, diag, kind)
    return Analysis(rec, tuple(stages), cross, diag, kind, tuple(open_conf), handled, first,
                    _first_nonfinite(stages), str(dev))


def _mixing_confound(ctx: _Context) -> list[str]:
    """Operand taps far larger than any input value suggest taps from another layer or config."""
    if ctx.rec.provenance.controlled:
        return []
    out = []
    for op in ("a", "b"):
        taps = ctx.taps_of(f"load_{op}")
        if not taps:
            continue
        inp = ctx.operand(op).float().abs().max().item()
        tap_max = max(float(t.values.float().abs().nan_to_num(0).max()) for t in taps)
        if tap_max > 4 * inp:
            out.append(f"load_{op} taps reach {tap_max:.4g} but no input value exceeds {inp:.4g}: the taps may come "
                       f"from another layer or config than the inputs (mixing confound)")
    return out


def _first(ctx: _Context, stages, diag: Diagnosis, kind: Kind) -> Optional[FirstDivergence]:
    if diag.verdict is not Verdict.DIVERGED:
        return None
    st = next(s for s in stages if s.name == diag.stage)
    which = "teacher_forced" if diag.root_cause else "chained"
    cmp = st.teacher_forced if diag.root_cause else st.chained
    unit = cmp.first_bad_tile
    if unit is None:  # a field-level descriptor mismatch has no element
        return FirstDivergence(st.name, (0, 0), None, None, None, None, None, None, kind, which,
                               "; ".join(cmp.notes) or None)
    el = unit.first_bad[0] if unit.first_bad else None
    element = (el.row, el.col) if el else None
    in_tile = None
    if el:
        o = ctx.origin(st.name, unit.tile, unit.k_block)
        in_tile = (el.row - o[0], el.col - o[1]) if not st.name == "epilogue_store" else \
            (el.row - unit.tile[0] * ctx.bm, el.col - unit.tile[1] * ctx.bn)
    return FirstDivergence(st.name, unit.tile, unit.k_block, element, in_tile, el.received if el else None,
                           el.expected if el else None, el.bound if el else None, kind, which,
                           _hint(ctx, st.name, el))


def _hint(ctx: _Context, stage: str, el) -> Optional[str]:
    if el is None:
        return None
    ladder = ctx.rec.provenance.ladder
    if ladder == "index" and stage.split("_")[0] in ("descriptor", "load"):
        op = stage[-1]
        src = decode_index(el.received, getattr(ctx.spec, f"{op}_dtype"))
        if src:
            dims = ("m", "k") if op == "a" else ("k", "n")
            return (f"the received value encodes {op.upper()}[{dims[0]} = {src[0]} mod P, {dims[1]} = {src[1]} mod Q]"
                    f" (index-encoded input)")
        return "the received value encodes no operand position: it was not loaded from the operand"
    if ladder == "ktag" and stage == "mma":
        what = decode_ktag(el.received - el.expected, ctx.bk)
        if what:
            return f"{what} (ktag input, period {KTAG_PERIOD})"
    return None


def _first_nonfinite(stages):
    for s in stages:
        for cmp in (s.teacher_forced, s.chained):
            unit = cmp.first_nonfinite_tile
            if unit is not None:
                el = next((b for b in unit.first_bad if b.received != b.received or abs(b.received) == float("inf")),
                          None)
                return s.name, unit.tile, unit.k_block, (el.row, el.col) if el else None
    return None

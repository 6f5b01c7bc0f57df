"""From stage results to what the report may claim: the first divergence with its element, whether
it is a VERDICT or a DRAFT and what is missing for a VERDICT, the confounds that an incomplete
trace or mixed inputs open, and what a MATCH did not see.

A finding is a VERDICT only when the stage's own teacher-forced comparison failed on controlled
inputs with no open confound, fed by the kernel's own taps, global memory or descriptor fields. A
finding fed by a reference stand-in names the missing tap; a divergence in a tile that was not
traced names the tile and the command that traces it; a failing unit that rests on a partition
boundary the declared rule placed over untraced k-blocks (TileMetrics.assumed) has that boundary
as an open confound, and among failing units of the stage one that rests on observed taps only is
reported first.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from typing import Optional, Sequence

from harness.taps import DEQUANT_STAGES, DESCRIPTOR_STAGES, LOAD_STAGES, SCALE_STAGES, stage_rank
from oracle.judging.compare import Comparison, Status, TileMetrics
from oracle.judging.diagnose import Diagnosis, Kind, Verdict, evidence_kind
from oracle.judging.differential.context import Context, StageResult
from oracle.judging.differential.epilogue import step_acts
from oracle.judging.evidence import FieldCheck, describe_sites
from oracle.problem.partition import kb_ranges
from oracle.run.caller import Advice, Option
from oracle.run.inputs import KTAG_PERIOD, decode_index, decode_ktag
from oracle.run.confounds import Confound, ConfoundKind

MAX_LISTED_SITES = 2048  # selection sites enumerated when naming what an overflowed sink lost
MAX_CHECKED_TILES = 1 << 20  # a larger grid cannot be traced whole: its untapped selected tiles are not looked for
CONTROLLED_INPUTS = ("ones", "index", "ktag", "random[:seed]")
NO_OPEN_CONFOUND = Advice.of("no open confound")


@dataclass(frozen=True)
class FirstDivergence:
    stage: str
    tile: Optional[tuple[int, int]]  # None: a descriptor field, which belongs to no tile
    k_block: Optional[int]
    element: Optional[tuple[int, int]]  # global (row, col) in the stage's tensor space
    element_in_tile: Optional[tuple[int, int]]
    received: Optional[float]
    expected: Optional[float]
    bound: Optional[float]
    kind: Kind
    comparison: str  # "teacher_forced" or "chained"
    hint: Optional[str] = None  # what the controlled input says about the bad value
    fed_by: str = ""  # what fed the failing comparison (oracle.judging.evidence.Feed value)
    stand_ins: tuple = ()  # (stage, tile, k_block) of the taps a reference value stood in for
    field: Optional[FieldCheck] = None  # the descriptor field that disagrees
    untraced: tuple[tuple[int, int], ...] = ()  # failing tiles in which nothing was traced
    rerun: Optional[str] = None  # the command that re-runs with the failing tile traced
    unwritten: bool = False  # the first bad element was never written (it holds the poison)
    missing: tuple[Advice, ...] = ()  # what a VERDICT would need, spelt for the caller when told
    partial: Optional[int] = None  # the partial of a split tile
    group: Optional[int] = None  # the group (or batch entry) of a grouped run
    assumed: tuple[str, ...] = ()  # partition boundaries the finding rests on that were assumed, not traced


# -- confounds -------------------------------------------------------------------------------
def trace_confounds(ctx: Context) -> list[Confound]:
    """An overflowed or torn trace: which stages lost records, and which of their selected taps
    are absent or partial. Every finding that could rest on them is a draft."""
    acc = ctx.rec.trace
    if acc is None or acc.complete:
        return []
    out = []
    if acc.dropped:
        if acc.dropped_by_stage is not None:
            stages = [s for s, _ in acc.dropped_by_stage]
            by = ", ".join(f"{s} {n}" for s, n in acc.dropped_by_stage)
        else:
            stages = sorted({t.stage for t in ctx.taps.records}, key=stage_rank)
            by = "stages not recorded by this sink version"
        lost = "; ".join(filter(None, (_lost_sites(ctx, s) for s in stages)))
        out.append(Confound.of(ConfoundKind.DROPPED_RECORDS, dropped=acc.dropped, capacity=acc.capacity,
                               needed_bytes=acc.needed_bytes, by_stage=by, lost=lost, advice=True))
    if acc.torn:
        out.append(Confound.of(ConfoundKind.TORN_RECORDS, torn=acc.torn))
    return out


def _lost_sites(ctx: Context, stage: str) -> str:
    """Selected sites of `stage` with no tap, and taps of it with unrecorded elements."""
    geo, tapped = ctx.geo, ctx.taps
    spec, sel = geo.spec, ctx.rec.trace.selection
    partial = [(t.stage, t.tile, t.k_block) for t in tapped.taps_of(stage)
               if t.mask is not None and not bool(t.mask.all())]
    tiles = [(tm, tn) for tm in range(spec.tiles_m) for tn in range(spec.tiles_n) if sel.records_tile((tm, tn))] \
        if spec.tiles_m * spec.tiles_n <= MAX_LISTED_SITES else []
    has_kb = stage in DESCRIPTOR_STAGES + LOAD_STAGES + DEQUANT_STAGES + SCALE_STAGES or stage == "mma"
    kbs = [kb for kb in range(spec.k_blocks) if sel.records_k_block(kb)] if has_kb else [None]
    present = {(t.tile, t.k_block) for t in tapped.taps_of(stage)}
    absent = [(stage, t, kb) for t in tiles for kb in kbs if (t, kb) not in present][:MAX_LISTED_SITES]
    parts = []
    if absent:
        parts.append(f"no tap: {describe_sites(absent)}")
    if partial:
        parts.append(f"partly recorded: {describe_sites(partial)}")
    return f"{stage} {', '.join(parts)}" if parts else ""


@dataclass(frozen=True)
class Untapped:
    """Selected tiles inside a group's grid (or the single GEMM's) that no tap came from."""

    tiles: tuple[tuple[int, int], ...]
    group_silent: bool  # no tap of the group arrived at all: the group is judged from its output alone

    def note(self, group: Optional[int]) -> str:
        listed = ", ".join(str(t) for t in self.tiles[:4]) + (f" and {len(self.tiles) - 4} more"
                                                              if len(self.tiles) > 4 else "")
        s = "s" if len(self.tiles) > 1 else ""
        if self.group_silent:
            return (f"group {group}: the trace selected its tile{s} {listed} and no tap of the group arrived, so it is "
                    f"judged from its output alone (does the kernel tap it under another group index?)")
        return ((f"group {group}: " if group is not None else "") + f"selected tile{s} {listed} had no tap: judged at "
                f"the output only (does the kernel tap {'them' if s else 'it'} under another tile index?)")


def untapped_tiles(rec) -> dict[Optional[int], Untapped]:
    """Per group (None: a single GEMM), the tiles inside its grid that a complete live trace selected and
    no tap came from: each is judged at the output only, which a MATCH must say (a kernel that taps under
    another tile or group index, or skips a tile, looks like this). Empty for a trace that lost records,
    which names what it lost itself (trace_confounds), and for a grid too large to be traced whole."""
    acc, spec = rec.trace, rec.spec
    if acc is None or acc.dropped or acc.torn:
        return {}
    sel, sizes = acc.selection, spec.group_sizes
    tapped = {(t.group, tuple(t.tile)) for t in rec.taps}
    tapped_groups = {g for g, _ in tapped}
    out = {}
    for g, rows in ([(None, spec.m)] if sizes is None else enumerate(sizes)):
        empty = rows == 0 or (spec.k_groups is not None and spec.k_groups[g] == 0)
        tiles_m = -(-rows // spec.tile.bm)
        if empty or not sel.records_group(g) or tiles_m * spec.tiles_n > MAX_CHECKED_TILES:
            continue
        missing = tuple((tm, tn) for tm in range(tiles_m) for tn in range(spec.tiles_n)
                        if sel.records_tile((tm, tn)) and (g, (tm, tn)) not in tapped)
        if missing:
            out[g] = Untapped(missing, g is not None and g not in tapped_groups)
    return out


def mixing_confound(ctx: Context) -> list[Confound]:
    """Operand taps far larger than any input value suggest taps from another layer or config."""
    geo, tapped, ops = ctx.geo, ctx.taps, ctx.ops
    if ctx.rec.provenance.controlled:
        return []
    out = []
    for op in ("a", "b"):
        taps = tapped.taps_of(geo.mma_stage_of(op))  # a quantised operand: its dequantised tiles, not its codes
        if not taps:
            continue
        inp = ops.operand(op).float().abs().max().item()
        tap_max = max(float(t.values.float().abs().nan_to_num(0).max()) for t in taps)
        if tap_max > 4 * inp:
            out.append(Confound.of(ConfoundKind.MIXED_TAPS, f"load_{op}", tap_max=tap_max, input_max=inp))
    return out


# -- the first divergence --------------------------------------------------------------------
def rerun_command(command: Sequence[str], tiles: Sequence[tuple[int, int]]) -> Optional[str]:
    """The recorded command line with its tile selection replaced by `tiles` (None without one)."""
    if not command:
        return None
    out, skip = [], False
    for arg in command:
        if skip:
            skip = False
            continue
        if arg == "--trace-tiles":
            skip = True
            continue
        if arg.startswith("--trace-tiles="):
            continue
        out.append(arg)
    return shlex.join(out + ["--trace-tiles", " ".join(f"{tm},{tn}" for tm, tn in tiles)])


def first_finding(ctx: Context, stages: Sequence[StageResult], diag: Diagnosis, *, confounds: Sequence[Confound]) \
        -> tuple[Optional[FirstDivergence], Kind]:
    geo = ctx.geo
    controlled = ctx.rec.provenance.controlled
    if diag.verdict is not Verdict.DIVERGED:
        return None, evidence_kind(diag, inputs_controlled=controlled, confounds=confounds)
    st = next(s for s in stages if s.name == diag.stage)
    which = "teacher_forced" if diag.root_cause else "chained"
    cmp = st.teacher_forced if diag.root_cause else st.chained
    missing = []
    if not controlled:
        missing.append(Advice.of("controlled inputs (", Option.choices("inputs", *CONTROLLED_INPUTS), ")"))
    if confounds:
        missing.append(NO_OPEN_CONFOUND)
    field = next(iter(cmp.field_mismatches), None) if diag.root_cause else None
    if field is not None:
        kind = evidence_kind(diag, inputs_controlled=controlled, confounds=confounds)
        return FirstDivergence(st.name, None, None, None, None, None, None, None, kind, which,
                               f"{field.field} disagrees with the problem", fed_by="descriptor fields", field=field,
                               missing=tuple(missing) if kind is Kind.DRAFT else ()), kind
    unit = _chosen_unit(cmp, diag)
    rerun = None
    if diag.untraced:
        worst = unit.tile if unit is not None else diag.untraced[0]
        rerun = rerun_command(ctx.rec.command, [worst])
        missing.append(Advice.of(f"a trace of tile {worst}: " + ("" if rerun else "re-run the live compare with "),
                                 Option.tiles([worst], command=rerun)))
    elif not diag.root_cause:
        before = [s.name for s in stages[:[x.name for x in stages].index(st.name)]
                  if s.teacher_forced.status is Status.NOT_RUN
                  and _acts(ctx, s.name)]
        missing.append(Advice.of(f"a tap of the stage before {st.name} in that tile" +
                                 (f" ({', '.join(before)} not teacher-forced)" if before else "")))
    stand_ins = unit.stand_ins if unit is not None else ()
    if stand_ins:
        missing.append(Advice.of(f"the kernel's own {describe_sites(stand_ins)} (a reference value stood in for "
                                 f"each; ", *_how_to_record(ctx, stand_ins), ")"))
    assumed = unit.assumed if unit is not None else ()
    if assumed:
        if NO_OPEN_CONFOUND not in missing:
            missing.append(NO_OPEN_CONFOUND)
        kbs = sorted({kb for part in geo.partitions.values() for a in part.assumed if a.describe() in assumed
                      for kb in a.untraced})
        missing.append(Advice.of(f"a trace of k-block{'s' if len(kbs) > 1 else ''} {kb_ranges(kbs)}, where the "
                                 "partition boundary was assumed (", Option.k_blocks(kbs), " with them): the "
                                 "kernel's taps then place it"))
    assumed_confounds = tuple(Confound.of(ConfoundKind.ASSUMED_BOUNDARY, st.name, boundary=a) for a in assumed)
    kind = evidence_kind(diag, inputs_controlled=controlled, confounds=tuple(confounds) + assumed_confounds,
                         stand_ins=stand_ins)
    if unit is None:
        return FirstDivergence(st.name, None, None, None, None, None, None, None, kind, which, None,
                               missing=tuple(missing)), kind
    el = unit.first_bad[0] if unit.first_bad else None
    element = (el.row, el.col) if el else None
    in_tile = None
    if el:
        if st.name == "epilogue_store":
            in_tile = (el.row - unit.tile[0] * geo.bm, el.col - unit.tile[1] * geo.bn)
        else:
            o = geo.origin(st.name, unit.tile, unit.k_block)
            in_tile = (el.row - o[0], el.col - o[1])
    return FirstDivergence(st.name, unit.tile, unit.k_block, element, in_tile, el.received if el else None,
                           el.expected if el else None, el.bound if el else None, kind, which,
                           _hint(ctx, st.name, el, unit) or _partition_hint(ctx, st.name, unit), fed_by=unit.fed_by,
                           stand_ins=stand_ins,
                           untraced=diag.untraced, rerun=rerun, unwritten=bool(el and el.unwritten),
                           missing=tuple(missing) if kind is Kind.DRAFT else (), partial=unit.partial,
                           assumed=tuple(assumed)), kind


def _how_to_record(ctx: Context, sites) -> tuple:
    """What would bring the missing taps (Advice parts): a wider selection, or a tap the kernel does
    not have yet."""
    acc = ctx.rec.trace
    stages = sorted({s for s, _, _ in sites}, key=stage_rank)
    if acc is not None:
        sel = acc.selection
        unselected = [s for s in stages if s not in sel.stages]
        if unselected:
            return "trace them: ", Option.stages(unselected), " added to the stages traced"
        kbs = sorted({kb for _, _, kb in sites if kb is not None and not sel.records_k_block(kb)})
        if kbs:
            return "trace them: ", Option.k_blocks(kbs), " added to the k-blocks traced"
    return (f"the kernel did not record them: tap {', '.join(stages)} in the kernel (tap_smem_tile / "
            f"tap_elements / tap_smem_bytes, see docs/trace-format.md)",)


def _chosen_unit(cmp: Comparison, diag: Diagnosis) -> Optional[TileMetrics]:
    """The failing unit to report: among untraced tiles the worst one; else the first in pipeline
    order (earliest k-block, then tile) of those that rest on no assumed partition boundary, else
    of all."""
    if diag.untraced:
        bad = cmp.failing_in(diag.untraced)
        if bad:
            return max(bad, key=lambda t: (t.max_ratio, t.mismatches))
    observed = [t for t in cmp.tiles if not t.passed and not t.assumed]
    if observed and len(observed) < sum(not t.passed for t in cmp.tiles):
        return dataclasses.replace(cmp, tiles=tuple(observed)).first_bad_tile
    return cmp.first_bad_tile


def _acts(ctx: Context, stage: str) -> bool:
    geo = ctx.geo
    if stage.startswith("epilogue_") and stage != "epilogue_store":
        return step_acts(geo.spec, stage[len("epilogue_"):])
    if stage in DESCRIPTOR_STAGES:
        return geo.has_tma(stage[-1])
    return True


def _partition_hint(ctx: Context, stage: str, unit: TileMetrics) -> Optional[str]:
    """What a failing mma unit made of a partition issue (oracle.problem.partition) says."""
    if stage != "mma":
        return None
    return next((i.describe() for i in ctx.geo.partition_issues
                 if (i.tile, i.partial, i.k_block) == (unit.tile, unit.partial, unit.k_block)), None)


def _hint(ctx: Context, stage: str, el, unit: Optional[TileMetrics] = None) -> Optional[str]:
    geo = ctx.geo
    if el is None:
        return None
    if stage in SCALE_STAGES and unit is not None:  # which scale of the problem the kernel applied
        from oracle.judging.differential.scales import hint as scale_hint

        return scale_hint(ctx, stage, el.row, el.col, el.received, unit.tile, unit.partial)
    if el.unwritten:
        return (f"the output element still holds the 0x{ctx.rec.output_poison:02X} poison the harness wrote before the "
                f"launch: the kernel never wrote it")
    ladder = ctx.rec.provenance.ladder
    if geo.quant is not None and stage == f"dequant_{geo.quant_op}":
        from oracle.judging.differential.dequant import hint

        return hint(ctx, el.row, el.col, el.received)
    if geo.quant is not None and stage.endswith(f"_{geo.quant_op}"):
        return None  # a quantised operand's stored codes encode no index
    if ladder == "index" and stage.split("_")[0] in ("descriptor", "load"):
        op = stage[-1]
        src = decode_index(el.received, getattr(geo.spec, f"{op}_dtype"))
        if src:
            dims = ("m", "k") if op == "a" else ("k", "n")
            return (f"the received value encodes {op.upper()}[{dims[0]} = {src[0]} mod P, {dims[1]} = {src[1]} mod Q]"
                    f" (index-encoded input)")
        return "the received value encodes no operand position: it was not loaded from the operand"
    if ladder == "ktag" and stage == "mma":
        what = decode_ktag(el.received - el.expected, geo.bk)
        if what:
            return f"{what} (ktag input, period {KTAG_PERIOD})"
    return None


@dataclass(frozen=True)
class NonFinite:
    """Where the first NaN or Inf was received, in pipeline order: the stage, the tile, the
    k-block (None for a stage without one) and the element (None when no bad element was kept)."""

    stage: str
    tile: tuple[int, int]
    k_block: Optional[int] = None
    element: Optional[tuple[int, int]] = None

    def describe(self) -> str:
        return f"{self.stage} tile {self.tile}" + (f" k-block {self.k_block}" if self.k_block is not None else "") + \
            (f" element {self.element}" if self.element else "")

    def to_json(self) -> dict:
        return {"stage": self.stage, "tile": list(self.tile), "k_block": self.k_block,
                "element": list(self.element) if self.element else None}


def first_nonfinite(stages) -> Optional[NonFinite]:
    for s in stages:
        for cmp in (s.teacher_forced, s.chained):
            unit = cmp.first_nonfinite_tile
            if unit is not None:
                el = next((b for b in unit.first_bad if b.received != b.received or abs(b.received) == float("inf")),
                          None)
                return NonFinite(s.name, tuple(unit.tile), unit.k_block, (el.row, el.col) if el else None)
    return None


# -- what a run did not see ------------------------------------------------------------------
def unobserved(ctx: Context, stages: Sequence[StageResult]) -> list[str]:
    """Stages of this problem that nothing was compared for, stand-ins a MATCH rests on, the
    partition boundaries that were assumed, not traced, and what the traced build serialises that the
    production build does not (Recording.serialised, from the kernel's adapter). The last is never an
    open confound: a finding stays what its own comparison makes it (the traced build computed the
    divergent value), while a MATCH says it did not see the production build's timing."""
    geo, tapped = ctx.geo, ctx.taps
    out = [f"the production build's timing (traced build serialised: {s})" for s in ctx.rec.serialised]
    silent = [s.name for s in stages if s.teacher_forced.status is Status.NOT_RUN
              and s.chained.status is Status.NOT_RUN and _acts(ctx, s.name)]
    if silent:
        out.append(f"not observed: {', '.join(silent)} (no tap)")
    for s in stages:
        ev = s.teacher_forced.evidence
        if ev.stand_ins:
            out.append(f"{s.name} was teacher-forced through reference stand-ins for {describe_sites(ev.stand_ins)}")
    if tapped.traced_tiles:
        total = geo.spec.tiles_m * geo.spec.tiles_n
        if len(tapped.traced_tiles) < total:
            out.append(f"{len(tapped.traced_tiles)} of {total} tiles traced (the others are judged at the output only)")
    out.extend(geo.partition_assumptions)  # boundaries placed by the declared rule over untraced k-blocks
    return out

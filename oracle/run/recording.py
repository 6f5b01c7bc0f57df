"""A recorded kernel run: the problem, its operands, the kernel's output and its stage taps.

This is what the differential judges, whether it came from a live run, a dump file or a
Python model of a kernel. `save`/`load` go through `harness.dump` (safetensors + JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

import torch

from harness.errors import BadInput
from harness.dump import Dump, DumpError, environment, load_dump, save_dump
from harness.guard_bands import GuardBreach
from harness.fields import INT64_MAX, is_opt_int, is_opt_str, is_str_list, require, shown
from harness.taps import ALL_TAP_STAGES, DESCRIPTOR_STAGES, TAP_STAGES, DescriptorRecord, Tap
from harness.trace_format import TraceAccount
from kernels_ref.dtypes import ALL_TYPES, DTYPES
from kernels_ref.scales import groups_of_problem as scale_groups
from oracle.run.confounds import Confound, ConfoundKind
from oracle.run.inputs import LADDER, InputError, Operands, Provenance, check_operands
from oracle.problem.spec import ProblemSpec, SpecError


class RecordingError(BadInput, ValueError):
    """A recording that does not fit its own problem."""


@dataclass(frozen=True)
class Recording:
    spec: ProblemSpec
    operands: Operands
    output: Optional[torch.Tensor]  # D, logical [M, N]; None when the kernel never finished
    provenance: Provenance
    taps: tuple[Tap, ...] = ()
    descriptors: tuple[DescriptorRecord, ...] = ()
    kernel: str = "unknown"
    kernel_error: Optional[str] = None
    synthetic: bool = False  # made by a Python model of a kernel, not by a real one
    confounds: tuple[Confound, ...] = ()  # declared by the recorder, e.g. runtime-gated taps (oracle.run.confounds)
    notes: tuple[str, ...] = ()  # what the recorder wants the reader to know (dropped taps, checks)
    environment: Mapping[str, Any] = field(default_factory=dict)
    trace: Optional[TraceAccount] = None  # the trace's selection and what it lost; None: not a live trace
    output_poison: Optional[int] = None  # the byte D was filled with before the launch; None: unknown
    command: tuple[str, ...] = ()  # the command line that made the run, to re-run it with other taps
    # what the traced build waits for or synchronises that the production build does not (its adapter
    # says so: oracle.run.adapters.ADAPTERS): a run judged on it did not see the production build's timing
    serialised: tuple[str, ...] = ()
    # bytes the kernel wrote outside D or another output, read from their guard bands (a live run's;
    # not kept in a dump): the finding at epilogue_store (oracle.judging.differential.analysis)
    guard_breaches: tuple[GuardBreach, ...] = ()

    def validate(self) -> None:
        """Raise RecordingError naming what does not fit the problem."""
        spec = self.spec
        try:
            check_operands(spec, self.operands)
        except InputError as e:
            raise RecordingError(str(e)) from None
        if self.output is not None:
            if tuple(self.output.shape) != (spec.total_m, spec.n):
                raise RecordingError(f"output D has shape {list(self.output.shape)}, the problem needs "
                                     f"[{spec.total_m}, {spec.n}]")
            want = DTYPES[spec.out_dtype].torch
            if self.output.dtype != want:
                raise RecordingError(f"output D has dtype {self.output.dtype}, the problem's out_dtype is {want}")
        if self.kernel_error is None and self.output is None:
            raise RecordingError("the recording has no output D and no kernel error")
        p = self.output_poison
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 255):
            raise RecordingError(f"output_poison={p!r} must be a byte value 0..255 or None")
        if not all(isinstance(a, str) for a in self.serialised):
            raise RecordingError(f"serialised must be a list of strings, got {list(self.serialised)!r}")
        if not all(isinstance(a, str) for a in self.command):
            raise RecordingError(f"command must be a list of strings, got {list(self.command)!r}")
        t = spec.tile
        sizes = spec.group_sizes
        if spec.partitioned:
            _check_whole_tiles(self.taps)
        for tap in self.taps:
            if tap.stage not in TAP_STAGES:
                raise RecordingError(f"{tap.describe()}: a GEMM recording holds only taps of {', '.join(TAP_STAGES)}")
            tm, tn = tap.tile
            if sizes is not None:
                if tap.group is None or tap.group >= len(sizes):
                    raise RecordingError(f"{tap.describe()}: a grouped problem's taps must name their group "
                                         f"0..{len(sizes) - 1}")
                tiles_m = -(-sizes[tap.group] // t.bm)
            else:
                if tap.group is not None:
                    raise RecordingError(f"{tap.describe()}: the problem has no groups")
                tiles_m = spec.tiles_m
            if not spec.partitioned and tap.partial is not None:
                raise RecordingError(f"{tap.describe()}: the problem's k is not split (splits = 1, no stream-K), "
                                     f"but the tap names a partial")
            if not (tm < tiles_m and tn < spec.tiles_n):
                raise RecordingError(f"{tap.describe()}: tile is outside the {tiles_m}x{spec.tiles_n} tile grid")
            k_blocks = spec.k_blocks
            if spec.k_groups is not None and tap.group is not None:  # counted from the group's start
                k_blocks = -(-spec.k_groups[tap.group] // t.bk)
            if tap.k_block is not None and tap.k_block >= k_blocks:
                raise RecordingError(f"{tap.describe()}: k-block is outside 0..{k_blocks - 1}" if k_blocks else
                                     f"{tap.describe()}: group {tap.group} has K = 0: it has no k-block")
            shape = tuple(tap.values.shape)
            if tap.stage in DESCRIPTOR_STAGES:
                op = tap.stage[-1]
                rows = t.bm if op == "a" else t.bn
                d = ALL_TYPES[getattr(spec, f"{op}_dtype")]
                want_n = rows * t.bk // d.per_item * d.itemsize
                if shape != (want_n,):
                    raise RecordingError(f"{tap.describe()}: shared-memory image has {shape[0]} bytes, the tile "
                                         f"needs {want_n}")
                continue
            per_a, per_b = (ALL_TYPES[getattr(spec, f"{o}_dtype")].per_item for o in "ab")  # packed: two k a byte
            want_shape = {"load_a": (t.bm, t.bk // per_a), "load_b": (t.bk // per_b, t.bn), "dequant_a": (t.bm, t.bk),
                          "dequant_b": (t.bk, t.bn), "scale_a": (t.bm, scale_groups(spec)),
                          "scale_b": (t.bn, scale_groups(spec))}.get(tap.stage, (t.bm, t.bn))
            if tap.stage in ("scale_a", "scale_b") and not spec.block_scaled:
                raise RecordingError(f"{tap.describe()}: the problem has no block scales (scale_a.kind and "
                                     f"scale_b.kind block)")
            if shape != want_shape:
                raise RecordingError(f"{tap.describe()}: values have shape {list(shape)}, expected {list(want_shape)}")
            if tap.stage in ("dequant_a", "dequant_b"):
                op = tap.stage[-1]
                if op != spec.quant_op:
                    raise RecordingError(f"{tap.describe()}: operand {op} of {spec.describe()} is not quantised, so it "
                                         f"has no dequant stage")
                want = DTYPES[spec.mma_dtype].torch
                if tap.values.dtype != want:
                    raise RecordingError(f"{tap.describe()}: values are {tap.values.dtype}, but a dequant tap holds "
                                         f"the MMA's operand: {spec.mma_dtype} ({want})")
            if tap.stage in ("load_a", "load_b"):  # the operand's own bits, compared bit for bit
                op = tap.stage[-1]
                want = ALL_TYPES[getattr(spec, f"{op}_dtype")].torch
                if tap.values.dtype != want:
                    raise RecordingError(f"{tap.describe()}: values are {tap.values.dtype}, but a load tap holds the "
                                         f"operand's own elements: {op}_dtype is {getattr(spec, f'{op}_dtype')} "
                                         f"({want})")

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str) -> None:
        meta = dict(common_meta(self), output_poison=self.output_poison)
        outputs = {"d": self.output} if self.output is not None else {}
        save_dump(path, Dump(inputs=self.operands.named(), outputs=outputs, taps=self.taps,
                             descriptors=self.descriptors, meta=meta))

    @classmethod
    def load(cls, path: str) -> "Recording":
        """Read a GEMM dump written by `save`; every metadata field is checked by type and range, and
        the whole recording against its problem. Raises DumpError naming the field, nothing else.
        oracle.run.dumps.load_recording reads a dump of either problem kind."""
        check = lambda meta, inputs, outputs: check_header(path, meta, inputs, outputs)  # noqa: E731
        return cls.of_dump(path, load_dump(path, check, stages=ALL_TAP_STAGES))  # validate refuses others' taps

    @classmethod
    def of_dump(cls, path: str, dump: Dump) -> "Recording":
        m = _Meta.of(dump.meta, f"dump {path!r}")
        _check_names(path, dump.inputs, dump.outputs)
        rec = cls(spec=m.spec, operands=Operands(**dump.inputs), output=dump.outputs.get("d"),
                  provenance=m.provenance_of(path), taps=dump.taps, descriptors=dump.descriptors,
                  kernel=m.kernel.get("name", "unknown"), kernel_error=m.kernel.get("error"), synthetic=m.synthetic,
                  confounds=m.confounds, notes=m.notes, environment=m.environment, trace=m.trace,
                  output_poison=m.output_poison, command=m.command, serialised=m.serialised)
        try:
            rec.validate()
        except RecordingError as e:
            raise DumpError(f"dump {path!r} is inconsistent: {e}") from None
        return rec


def common_meta(rec) -> dict:
    """The metadata document every recording's dump holds (a GEMM's or an attention's): its problem
    (with its kind), provenance, kernel, declarations and environment."""
    prov = rec.provenance
    meta = {"problem": rec.spec.to_json(),
            "provenance": {"ladder": prov.ladder, "seed": prov.seed, "source": prov.source,
                           "generator": prov.generator},
            "kernel": {"name": rec.kernel, "error": rec.kernel_error}, "synthetic": rec.synthetic,
            "confounds": [c.sentence for c in rec.confounds], "notes": list(rec.notes),
            "environment": dict(rec.environment or environment()),
            "trace": rec.trace.to_json() if rec.trace is not None else None, "command": list(rec.command)}
    if rec.serialised:  # absent from older dumps: nothing declared
        meta["serialised"] = list(rec.serialised)
    return meta


def problem_kind(meta: Any, where: str) -> str:
    """The problem kind a dump's metadata names: "gemm" (a GEMM problem names none) or "attention"."""
    problem = meta.get("problem") if isinstance(meta, dict) else None
    kind = problem.get("kind", "gemm") if isinstance(problem, dict) else "gemm"
    require(kind in PROBLEM_KINDS, DumpError, where, "metadata field problem.kind", kind,
            f"one of {', '.join(PROBLEM_KINDS)}")
    return kind


def _check_names(path: str, inputs, outputs) -> None:
    unknown = sorted(set(inputs) - {f.name for f in fields(Operands)})
    if unknown:
        raise DumpError(f"dump {path!r}: unknown input tensor(s) {shown(unknown)}")
    if "a" not in inputs or "b" not in inputs:
        raise DumpError(f"dump {path!r}: operands A and B are required (input.a, input.b)")
    unknown = sorted(set(outputs) - {"d"})
    if unknown:
        raise DumpError(f"dump {path!r}: unknown output tensor(s) {shown(unknown)}; the only output is d")


def check_header(path: str, meta, inputs: dict, outputs: dict) -> None:
    """A dump's problem against the operands and output its header lists (dtype and shape), before
    any data is read or inflated: a header whose tensors the problem does not account for is
    refused without reading them."""
    if problem_kind(meta, f"dump {path!r}") != "gemm":
        raise DumpError(f"dump {path!r} holds an attention problem, not a GEMM: read it with "
                        f"oracle.run.dumps.load_recording")
    m = _Meta.of(meta, f"dump {path!r}")
    _check_names(path, inputs, outputs)
    spec = m.spec
    ghost = {k: torch.empty(shape, dtype=dt, device="meta") for k, (dt, shape) in inputs.items()}
    try:
        check_operands(spec, Operands(**ghost))
    except InputError as e:
        raise DumpError(f"dump {path!r} is inconsistent: {e}") from None
    if "d" in outputs:
        dt, shape = outputs["d"]
        if shape != (spec.total_m, spec.n) or dt != DTYPES[spec.out_dtype].torch:
            raise DumpError(f"dump {path!r} is inconsistent: output D is {dt} {list(shape)}, the problem needs "
                            f"{DTYPES[spec.out_dtype].torch} [{spec.total_m}, {spec.n}]")


def trace_warnings(trace) -> tuple[tuple[Confound, ...], tuple[str, ...]]:
    """The trace parser's warnings (a harness.trace_format.TraceResult) sorted into the open
    confounds of the recording (what the judgement rests on) and notes (what cannot change it).

    - records the sink header did not select: every tap of the trace header checks the selection
      itself, so such records were written past the tap API or over an altered header; the
      selection the judgement reads (which tiles and k-blocks were traced, so where an untapped
      k-block is a gap and where it was merely not traced) and the records' own coordinates are
      then not to be trusted: an open confound;
    - torn records: a note here, because the trace account's `torn` count already opens the
      confound ("incomplete trace", oracle.judging.differential.findings.trace_confounds); the
      lines only say where;
    - records of one tap that disagree on the pipeline slot, or come from several CTAs: notes. No
      comparison reads a tap's slot or CTA, and an element two records hold with different values
      is refused by the parser, so each value judged is one the kernel recorded for that site.
    """
    from harness.trace_format import WARN_UNSELECTED

    confounds = []
    unselected = trace.warnings_of(WARN_UNSELECTED)
    if unselected:
        n = dict(trace.warning_counts).get(WARN_UNSELECTED, len(unselected))
        shown = "; ".join(w for w in unselected[:3])
        confounds.append(Confound.of(ConfoundKind.UNSELECTED_TAPS, count=n, examples=shown))
    notes = tuple(w for w in trace.warnings if w not in unselected)
    return tuple(confounds), notes


PADDING_EVIDENCE = ("descriptor_a", "load_a", "mma")  # what a CTA past a group's M reads and sums: zeros


def without_padding_tiles(spec, taps) -> tuple[tuple, tuple[str, ...]]:
    """A grouped problem's taps less those of padding tiles, and a note per group that had some. A tile
    selector matches its tile in every group, and a scheduler may run more tiles than a group has:
    CUTLASS's grouped scheduler rounds each group's tile count up to the cluster (and its swizzle), so a
    padding CTA runs tile (3, n) of a 3-tile group on TMA's zero fill and stores nothing. A tile outside
    its group's grid is left out only where its taps show that: A's image or tile, or its accumulator,
    tapped and all zero. Any other tap outside the grid (a real tile tapped under a wrong index, or one
    whose A-side was not traced) is kept, and the recording refuses it, as it refuses a tap that names
    no valid group."""
    sizes = spec.group_sizes
    if sizes is None:
        return tuple(taps), ()
    outside: dict = {}
    for tap in taps:
        g = tap.group
        if g is not None and 0 <= g < len(sizes):
            tiles_m = -(-sizes[g] // spec.tile.bm)
            if tap.tile[0] >= tiles_m or tap.tile[1] >= spec.tiles_n:
                outside.setdefault((g, tap.tile), []).append(tap)
    padding: dict = {}
    for (g, tile), site in outside.items():
        evidence = [t for t in site if t.stage in PADDING_EVIDENCE]
        if evidence and all(int(torch.count_nonzero(t.values)) == 0 for t in evidence):
            padding.setdefault(g, set()).add(tile)
    if not padding:
        return tuple(taps), ()
    kept = tuple(t for t in taps if t.group not in padding or t.tile not in padding[t.group])
    notes = tuple(f"group {g}: the taps of tile{'s' if len(tiles) > 1 else ''} "
                  f"{', '.join(str(t) for t in sorted(tiles))}, outside the group's {-(-sizes[g] // spec.tile.bm)} "
                  f"x {spec.tiles_n} tile grid, are left out: a CTA that pads the group's grid, as a cluster does, "
                  f"read zeros for A there and summed nothing" for g, tiles in sorted(padding.items()))
    return kept, notes


def _check_whole_tiles(taps) -> None:
    """A split problem's tile is whole when its mma taps name no partial (-1 in the trace), as the
    trace format documents; a tile whose mma taps do both is refused (it says two things)."""
    named: dict[tuple, set] = {}
    for tap in taps:
        if tap.stage == "mma":
            named.setdefault((tap.group, tap.tile), set()).add(tap.partial is None)
    for (group, tile), kinds in named.items():
        if len(kinds) == 2:
            where = f"tile {tile}" + (f" of group {group}" if group is not None else "")
            raise RecordingError(f"mma taps of {where} name partials and also none (partial -1, a whole tile): a "
                                 f"tile is either split into named partials or whole")


META_FIELDS = ("problem", "provenance", "kernel", "synthetic", "confounds", "notes", "environment", "trace",
               "output_poison", "command", "serialised")
PROVENANCE_FIELDS = ("ladder", "seed", "source", "generator")
LADDERS = LADDER + ("dump", "captured")
PROBLEM_KINDS = ("gemm", "attention")
# environment fields the recorders write, and their types; other fields may hold any JSON value
ENVIRONMENT_TYPES = {"python": str, "torch": str, "platform": str, "triton": (str, type(None)),
                     "gpu": (str, type(None)), "cuda": (str, type(None)), "triton_interpret": bool, "device": dict,
                     "function": dict, "source": str}


@dataclass(frozen=True)
class _Meta:
    """A dump's meta object, every field checked by type and range."""

    spec: ProblemSpec
    provenance: Mapping[str, Any]
    kernel: Mapping[str, Any]
    synthetic: bool
    confounds: tuple[Confound, ...]
    notes: tuple[str, ...]
    environment: Mapping[str, Any]
    trace: Optional[TraceAccount]
    output_poison: Optional[int]
    command: tuple[str, ...]
    serialised: tuple[str, ...] = ()

    def provenance_of(self, path: str) -> Provenance:
        prov = self.provenance
        return Provenance(prov["ladder"], prov.get("seed"), prov.get("source") or path, prov.get("generator", "cpu"))

    @classmethod
    def of(cls, meta: Mapping[str, Any], where: str, problem=ProblemSpec, ladders: tuple[str, ...] = LADDERS) -> "_Meta":
        """`problem`: the problem's type (its from_json raises SpecError); `ladders`: the input
        ladders its provenance may name."""
        def need(ok: bool, field: str, value: Any, allowed: str) -> None:
            require(ok, DumpError, where, f"metadata field {field}", value, allowed)

        unknown = sorted(set(meta) - set(META_FIELDS), key=str)
        if unknown:
            raise DumpError(f"{where}: unknown metadata field(s) {shown(unknown)}; known: {', '.join(META_FIELDS)}")
        try:
            spec = problem.from_json(meta.get("problem"))
        except SpecError as e:
            raise DumpError(f"{where}: problem spec: {e}") from None
        prov = meta.get("provenance")
        need(isinstance(prov, dict) and "ladder" in prov, "provenance", prov,
             "an object with at least the ladder (how the inputs were made)")
        need(set(prov) <= set(PROVENANCE_FIELDS), "provenance", sorted(prov, key=str),
             f"the fields are {', '.join(PROVENANCE_FIELDS)}")
        need(_one_of(prov["ladder"], ladders), "provenance.ladder", prov["ladder"], f"one of {', '.join(ladders)}")
        need(is_opt_int(prov.get("seed"), lo=-INT64_MAX - 1), "provenance.seed", prov.get("seed"),
             "a 64-bit integer or null")
        need(is_opt_str(prov.get("source")), "provenance.source", prov.get("source"), "a string or null")
        need(_one_of(prov.get("generator", "cpu"), ("cpu", "cuda")), "provenance.generator", prov.get("generator"),
             "'cpu' or 'cuda'")
        kernel = meta.get("kernel", {})
        need(isinstance(kernel, dict) and set(kernel) <= {"name", "error"}, "kernel", kernel,
             "an object with name (a string) and error (a string or null)")
        need(isinstance(kernel.get("name", "unknown"), str), "kernel.name", kernel.get("name"), "a string")
        need(is_opt_str(kernel.get("error")), "kernel.error", kernel.get("error"), "a string or null")
        synthetic = meta.get("synthetic", False)
        need(isinstance(synthetic, bool), "synthetic", synthetic, "true or false")
        lists = {key: [] if meta.get(key) is None else meta[key]
                 for key in ("confounds", "notes", "command", "serialised")}
        for key, v in lists.items():
            need(is_str_list(v), key, v, "a list of strings")
        env = {} if meta.get("environment") is None else meta["environment"]
        need(isinstance(env, dict), "environment", env, "an object")
        for key, typ in ENVIRONMENT_TYPES.items():
            if key in env:
                need(isinstance(env[key], typ), f"environment.{key}", env[key], f"{_type_names(typ)}")
        trace = None
        if meta.get("trace") is not None:
            try:
                trace = TraceAccount.from_json(meta["trace"])
            except ValueError as e:
                raise DumpError(f"{where}: metadata field trace: {e}") from None
        poison = meta.get("output_poison")
        need(is_opt_int(poison, hi=255), "output_poison", poison, "a byte value 0..255 or null")
        confounds = tuple(Confound.declared(c) for c in lists["confounds"])  # a dump holds their sentences
        return cls(spec, prov, kernel, synthetic, confounds, tuple(lists["notes"]), env, trace, poison,
                   tuple(lists["command"]), tuple(lists["serialised"]))


def _one_of(v: Any, allowed: tuple[str, ...]) -> bool:
    return isinstance(v, str) and v in allowed


def _type_names(typ) -> str:
    names = {str: "a string", bool: "true or false", dict: "an object", type(None): "null"}
    return " or ".join(names[t] for t in (typ if isinstance(typ, tuple) else (typ,)))

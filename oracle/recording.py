"""A recorded kernel run: the problem, its operands, the kernel's output and its stage taps.

This is what the differential judges, whether it came from a live run, a dump file or a
Python model of a kernel. `save`/`load` go through `harness.dump` (safetensors + JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch

from harness.dump import Dump, DumpError, environment, load_dump, save_dump
from harness.taps import DESCRIPTOR_STAGES, DescriptorRecord, Tap
from harness.trace_format import TraceAccount
from kernels_ref.dtypes import DTYPES
from oracle.inputs import InputError, Operands, Provenance, check_operands
from oracle.problem import ProblemSpec, SpecError


class RecordingError(ValueError):
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
    confounds: tuple[str, ...] = ()  # declared by the recorder, e.g. runtime-gated taps
    notes: tuple[str, ...] = ()  # what the recorder wants the reader to know (dropped taps, checks)
    environment: Mapping[str, Any] = field(default_factory=dict)
    trace: Optional[TraceAccount] = None  # the trace's selection and what it lost; None: not a live trace
    output_poison: Optional[int] = None  # the byte D was filled with before the launch; None: unknown
    command: tuple[str, ...] = ()  # the command line that made the run, to re-run it with other taps

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
        if not all(isinstance(a, str) for a in self.command):
            raise RecordingError(f"command must be a list of strings, got {list(self.command)!r}")
        t = spec.tile
        sizes = spec.group_sizes
        for tap in self.taps:
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
            if spec.partitioned and tap.stage == "mma" and tap.partial is None:
                raise RecordingError(f"{tap.describe()}: the problem splits k into partials, so its mma taps must "
                                     f"name their partial")
            if not spec.partitioned and tap.partial is not None:
                raise RecordingError(f"{tap.describe()}: the problem's k is not split (splits = 1, no stream-K), "
                                     f"but the tap names a partial")
            if not (tm < tiles_m and tn < spec.tiles_n):
                raise RecordingError(f"{tap.describe()}: tile is outside the {tiles_m}x{spec.tiles_n} tile grid")
            if tap.k_block is not None and tap.k_block >= spec.k_blocks:
                raise RecordingError(f"{tap.describe()}: k-block is outside 0..{spec.k_blocks - 1}")
            shape = tuple(tap.values.shape)
            if tap.stage in DESCRIPTOR_STAGES:
                op = tap.stage[-1]
                rows = t.bm if op == "a" else t.bn
                want_n = rows * t.bk * DTYPES[getattr(spec, f"{op}_dtype")].itemsize
                if shape != (want_n,):
                    raise RecordingError(f"{tap.describe()}: shared-memory image has {shape[0]} bytes, the tile "
                                         f"needs {want_n}")
                continue
            want_shape = {"load_a": (t.bm, t.bk), "load_b": (t.bk, t.bn)}.get(tap.stage, (t.bm, t.bn))
            if shape != want_shape:
                raise RecordingError(f"{tap.describe()}: values have shape {list(shape)}, expected {list(want_shape)}")

    # -- persistence -------------------------------------------------------------------------
    def save(self, path: str) -> None:
        meta = {"problem": self.spec.to_json(),
                "provenance": {"ladder": self.provenance.ladder, "seed": self.provenance.seed,
                               "source": self.provenance.source, "generator": self.provenance.generator},
                "kernel": {"name": self.kernel, "error": self.kernel_error}, "synthetic": self.synthetic,
                "confounds": list(self.confounds), "notes": list(self.notes),
                "environment": dict(self.environment or environment()),
                "trace": self.trace.to_json() if self.trace is not None else None,
                "output_poison": self.output_poison, "command": list(self.command)}
        outputs = {"d": self.output} if self.output is not None else {}
        save_dump(path, Dump(inputs=self.operands.named(), outputs=outputs, taps=self.taps,
                             descriptors=self.descriptors, meta=meta))

    @classmethod
    def load(cls, path: str) -> "Recording":
        dump = load_dump(path)
        meta = dump.meta
        try:
            spec = ProblemSpec.from_json(meta.get("problem"))
        except SpecError as e:
            raise DumpError(f"dump {path!r}: problem spec: {e}") from None
        prov = meta.get("provenance") or {}
        if not isinstance(prov, dict) or "ladder" not in prov:
            raise DumpError(f"dump {path!r}: metadata lacks provenance.ladder (how the inputs were made)")
        kernel = meta.get("kernel") or {}
        unknown = sorted(set(dump.inputs) - {"a", "b", "c", "bias", "scale_a", "scale_b"})
        if unknown:
            raise DumpError(f"dump {path!r}: unknown input tensor(s) {', '.join(unknown)}")
        if "a" not in dump.inputs or "b" not in dump.inputs:
            raise DumpError(f"dump {path!r}: operands A and B are required (input.a, input.b)")
        try:
            trace = TraceAccount.from_json(meta["trace"]) if meta.get("trace") is not None else None
        except ValueError as e:
            raise DumpError(f"dump {path!r}: metadata field trace: {e}") from None
        command = meta.get("command") or []
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise DumpError(f"dump {path!r}: metadata field command must be a list of strings, got {command!r}")
        poison = meta.get("output_poison")
        if poison is not None and (isinstance(poison, bool) or not isinstance(poison, int) or not 0 <= poison <= 255):
            raise DumpError(f"dump {path!r}: metadata field output_poison={poison!r} must be a byte value or null")
        rec = cls(spec=spec, operands=Operands(**dump.inputs), output=dump.outputs.get("d"),
                  provenance=Provenance(prov["ladder"], prov.get("seed"), prov.get("source") or path,
                                        prov.get("generator", "cpu")),
                  taps=dump.taps, descriptors=dump.descriptors, kernel=kernel.get("name", "unknown"),
                  kernel_error=kernel.get("error"), synthetic=bool(meta.get("synthetic", False)),
                  confounds=tuple(meta.get("confounds") or ()), notes=tuple(meta.get("notes") or ()),
                  environment=meta.get("environment") or {}, trace=trace, output_poison=poison,
                  command=tuple(command))
        try:
            rec.validate()
        except RecordingError as e:
            raise DumpError(f"dump {path!r} is inconsistent: {e}") from None
        return rec

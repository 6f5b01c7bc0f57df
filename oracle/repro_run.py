"""A run of a standalone reproducer, read back as a Recording the differential can judge.

Data path: a directory written by oracle.repro.write_repro and run by its repro / repro_traced
-> repro.json (problem, provenance, entry points, tensor maps, tensors) + the input files (the
operands, back in logical form: B of a grouped problem as its stack [groups, K, N]) + result.txt
(ok, or the kernel's CUDA error and the launch it came from) + d.bin (the output D of every group,
after a clean run) + sink.bin (the traced build's sink over every launch, parsed with
harness.trace_format.parse_trace, partially after a fault: taps with their partial and group)
-> Recording, as a live run records it: the first launch's encoded maps added as descriptor
records, the trace's account, D's 0xFF poison.

Constraints: nothing here runs a kernel; a missing or malformed file is a ReproError naming it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from harness import trace_format
from harness.tensormap import TensorMapSpec
from kernels_ref.dtypes import DTYPES
from oracle.inputs import Operands, Provenance
from oracle.live import _ones_check
from oracle.problem import ProblemSpec, SpecError
from oracle.recording import Recording
from oracle.repro import FORMAT, READABLE_VERSIONS, ReproError


def _read_tensor(path: Path, meta: dict) -> torch.Tensor:
    """A binary file of repro back as its storage-order tensor."""
    name = meta.get("dtype")
    if name not in DTYPES:
        raise ReproError(f"{path}: dtype {name!r} is unknown; known: {', '.join(DTYPES)}")
    dt = DTYPES[name]
    shape = tuple(int(s) for s in meta["storage_shape"])
    want = dt.itemsize
    for s in shape:
        want *= s
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ReproError(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) != want:
        raise ReproError(f"{path} has {len(data)} bytes; {name} {list(shape)} needs {want}")
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(dt.torch).reshape(shape)


def _logical(stored: torch.Tensor, meta: dict) -> torch.Tensor:
    """Storage order -> the logical tensor (a matrix, or a stack of them), leaving out padding rows
    a map covered."""
    shape = tuple(int(s) for s in meta["shape"])
    if meta.get("major") is None:
        return stored.reshape(shape).clone()
    if stored.dim() != len(shape) or len(shape) < 2:
        raise ReproError(f"{meta.get('file')}: storage shape {list(stored.shape)} does not hold a matrix of logical "
                         f"shape {list(shape)}")
    col = meta["major"] == "col"
    rows, cols = (shape[-1], shape[-2]) if col else (shape[-2], shape[-1])
    x = stored[..., :rows, :cols]
    return (x.transpose(-1, -2) if col else x).contiguous()


def _result(path: Path) -> dict:
    if not path.is_file():
        raise ReproError(f"{path} does not exist: run the reproducer first (make TRACE=1 && ./repro_traced)")
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key:
            out[key] = value.strip()
    if out.get("status") not in ("ok", "kernel_error"):
        raise ReproError(f"{path}: status {out.get('status')!r} must be 'ok' or 'kernel_error'")
    return out


def load_repro_run(directory, *, sink: Optional[str] = None) -> Recording:
    """The run of the reproducer in `directory` as a Recording: its inputs, D (after a clean run),
    the taps of sink.bin (or `sink`) if there is one, and the kernel error if there was one."""
    root = Path(directory)
    try:
        doc = json.loads((root / "repro.json").read_text())
    except OSError:
        raise ReproError(f"{root} holds no repro.json: not a directory written by python -m oracle repro") from None
    except json.JSONDecodeError as e:
        raise ReproError(f"{root / 'repro.json'} is not valid JSON: {e}") from None
    if doc.get("format") != FORMAT or doc.get("version") not in READABLE_VERSIONS:
        raise ReproError(f"{root / 'repro.json'}: format {doc.get('format')!r} version {doc.get('version')!r}; "
                         f"this oracle reads {FORMAT!r} versions {', '.join(map(str, READABLE_VERSIONS))}")
    try:
        spec = ProblemSpec.from_json(doc["problem"])
    except SpecError as e:
        raise ReproError(f"{root / 'repro.json'}: problem: {e}") from None
    tensors = doc["tensors"]
    named = {}
    for name in ("a", "b", "c", "bias", "scale_a", "scale_b"):
        if name in tensors:
            named[name] = _logical(_read_tensor(root / tensors[name]["file"], tensors[name]), tensors[name])
    ops = Operands(**named)
    prov = doc["provenance"]
    provenance = Provenance(prov["ladder"], prov.get("seed"), prov.get("source"), prov.get("generator", "cpu"))
    result = _result(root / "result.txt")
    ok = result["status"] == "ok"
    traced = result.get("traced") == "1"
    entry = result.get("entry") or doc["kernel"]["entry_traced"]
    output = None
    if ok:
        d = tensors["d"]
        output = _logical(_read_tensor(root / d["file"], d), d)
    sink_path = Path(sink) if sink else root / "sink.bin"
    notes, taps, descriptors, account = [], (), (), None
    if sink_path.is_file():
        t = spec.tile
        trace = trace_format.parse_trace(sink_path.read_bytes(), block_m=t.bm, block_n=t.bn, block_k=t.bk,
                                         partial=not ok)
        taps, descriptors = trace.taps, trace.descriptors
        notes.extend(trace.warnings)
        account = trace_format.account_of(trace)
        notes.append(f"trace: {len(taps)} taps from {trace.records} records, {trace.used_bytes} of {trace.capacity} "
                     f"sink bytes (repro's host-mapped sink, {sink_path.name})" +
                     ("" if trace.complete else f", {trace.dropped} dropped"))
    elif ok and not traced:
        notes.append("the untraced build ran: no taps (make TRACE=1 && ./repro_traced records them)")
    host_maps = tuple(TensorMapSpec.from_dict({k: tuple(v) if isinstance(v, list) else v
                                               for k, v in m["spec"].items()}).to_descriptor_record(m["buffer"])
                      for m in doc["tensormaps"] if m.get("launch", 0) == 0)  # a live run adds the first launch's
    error = None if ok else f"{result.get('error', 'unknown')}: {result.get('message', '')}".strip()
    rec = Recording(spec=spec, operands=ops, output=output, provenance=provenance, taps=taps,
                    descriptors=tuple(descriptors) + host_maps, kernel=entry, kernel_error=error,
                    notes=tuple(notes), environment={"source": f"standalone reproducer {root}"}, trace=account,
                    output_poison=0xFF)
    try:
        rec.validate()
    except ValueError as e:
        raise ReproError(f"{root}: the run does not fit its problem: {e}") from None
    if provenance.ladder == "ones" and output is not None:  # as a live run checks it
        rec = replace(rec, notes=rec.notes + (_ones_check(rec),))
    return rec

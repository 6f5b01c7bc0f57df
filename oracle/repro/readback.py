"""A run of a standalone reproducer, read back as a Recording the differential can judge.

Data path: a directory written by oracle.repro.generate.write_repro and run by its repro / repro_traced
-> repro.json (problem, provenance, entry points, tensor maps, tensors) + the input files (the
operands, back in logical form: B of a grouped problem as its stack [groups, K, N]; a quantised B
as its stored codes with its scales and zero points, each file's quant part the problem's) + result.txt
(ok, or the kernel's CUDA error and the launch it came from) + d.bin (the output D of every group,
after a clean run) + sink.bin (the traced build's sink over every launch, parsed with
harness.trace_format.parse_trace, partially after a fault: taps with their partial and group)
-> Recording, as a live run records it: the first launch's encoded maps added as descriptor
records, the trace's account, D's 0xFF poison. An attention problem (problem kind "attention",
format version 4) reads back as an AttentionRecording instead: q, k, v (and the offsets and page
table it has) in FlashAttention's layouts, o.bin and lse.bin after a clean run, the sink parsed with
the problem's blocks as a live attention run parses it (oracle.run.attention_live).

Constraints: nothing here runs a kernel; a missing or malformed file is a ReproError naming it
(the trace is parse_trace's: TraceFormatError). Every file is a regular file inside the
directory, opened without following a symbolic link (the directory itself is not one either), its
size checked before it is read: repro.json and result.txt at most 16 MiB, a tensor exactly its
dtype and shape, both sized from the problem (not the file's own storage_shape claim), sink.bin at
most ORACLE_TRACE_MAX_MB.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import torch

from harness import trace_format
from harness.files import read_bounded
from harness.fields import is_int_list, is_opt_int, is_opt_str, require, shown
from harness.taps import TapError
from harness.tensormap import TensorMapError, TensorMapSpec
from kernels_ref.dtypes import ELEMENT_TYPES
from kernels_ref.scales import groups_of_problem as scale_groups
from oracle import knobs
from oracle.run.inputs import InputError, Operands, Provenance, check_problem_size, expected_shapes
from oracle.run.live import ones_check
from oracle.problem.spec import ProblemSpec, SpecError
from oracle.run.recording import Recording, trace_warnings
from oracle.repro.generate import ATTENTION_VERSION, FORMAT, READABLE_VERSIONS, ReproError, quant_part

ATTENTION_VERSIONS = (ATTENTION_VERSION,)


MAX_TEXT_BYTES = 16 << 20  # repro.json and result.txt: larger files are not a reproducer's


def _read_bytes(path: Path, most: int, what: str, *, follow: bool = False) -> bytes:
    """A regular file's bytes, refused unread past `most` bytes; a symbolic link is refused, not
    followed (unless `follow`: a file the command line named itself)."""
    return read_bounded(path, str(path), most, what, ReproError, nofollow=not follow)


def _inside(root: Path, name: Any, where: str) -> Path:
    """A file named by repro.json: a plain name inside the directory (no path to elsewhere)."""
    require(isinstance(name, str) and name and "/" not in name and "\\" not in name and name not in (".", ".."),
            ReproError, where, "file", name, "the name of a file in the reproducer's directory")
    return root / name


def _tensor_meta(meta: Any, where: str, most_dims: int = 3) -> dict:
    require(isinstance(meta, dict), ReproError, where, "entry", meta, "an object")
    require(isinstance(meta.get("dtype"), str) and meta["dtype"] in ELEMENT_TYPES, ReproError, where, "dtype",
            meta.get("dtype"), f"one of {', '.join(ELEMENT_TYPES)}")
    for key in ("storage_shape", "shape"):
        require(is_int_list(meta.get(key)) and 1 <= len(meta[key]) <= most_dims, ReproError, where, key,
                meta.get(key), f"a list of one to {'three' if most_dims == 3 else most_dims} non-negative integers")
    major = meta.get("major")
    require(major is None or isinstance(major, str) and major in ("row", "col"), ReproError, where, "major", major,
            "'row', 'col' or null")
    return meta


def _read_tensor(root: Path, meta: dict, where: str, logical: tuple, padded: bool) -> torch.Tensor:
    """A binary file of repro back as its storage-order tensor, sized from the problem: its logical
    shape must be `logical` (the problem's), its storage no larger than that (twice that where a
    tensor map's padding rows may follow: at most the operand's size, as oracle.run.live pads), so a
    file's own claim never decides what is read or allocated; its size is checked before it is read."""
    path = _inside(root, meta.get("file"), where)
    dt = ELEMENT_TYPES[meta["dtype"]]
    shape = tuple(meta["storage_shape"])
    if tuple(meta["shape"]) != tuple(logical):
        raise ReproError(f"{where}: shape {meta['shape']} is not the problem's {list(logical)}")
    room = math.prod(logical) * (2 if padded else 1)
    if len(shape) != len(logical) or math.prod(shape) > room or math.prod(shape) < math.prod(logical):
        raise ReproError(f"{where}: storage_shape {meta['storage_shape']} does not hold the problem's "
                         f"{list(logical)} (at most {room} elements)")
    want = dt.itemsize * math.prod(shape)
    data = _read_bytes(path, want, f"the {want} bytes of {meta['dtype']} {list(shape)}")
    if len(data) != want:
        raise ReproError(f"{path} has {len(data)} bytes; {meta['dtype']} {list(shape)} needs {want}")
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if want else torch.empty(0, dtype=torch.uint8)
    return raw.view(dt.torch).reshape(shape)


def _logical(stored: torch.Tensor, meta: dict, where: str) -> torch.Tensor:
    """Storage order -> the logical tensor (a matrix, or a stack of them), leaving out padding rows
    a map covered."""
    shape = tuple(meta["shape"])
    if meta.get("major") is None:
        if math.prod(shape) != stored.numel():
            raise ReproError(f"{where}: shape {list(shape)} does not hold the {stored.numel()} stored elements")
        return stored.reshape(shape).clone()
    col = meta["major"] == "col"
    rows, cols = (shape[-1], shape[-2]) if col else (shape[-2], shape[-1])
    if (stored.dim() != len(shape) or len(shape) < 2 or rows > stored.shape[-2] or cols > stored.shape[-1]
            or tuple(stored.shape[:-2]) != shape[:-2]):
        raise ReproError(f"{where}: shape {list(shape)} ({meta['major']}-major) does not fit its storage "
                         f"{list(stored.shape)}")
    x = stored[..., :rows, :cols]
    return (x.transpose(-1, -2) if col else x).contiguous()


def _result(path: Path) -> dict:
    if not os.path.lexists(path):
        raise ReproError(f"{path} does not exist: run the reproducer first (make TRACE=1 && ./repro_traced)")
    out = {}
    for line in _read_bytes(path, MAX_TEXT_BYTES, f"{MAX_TEXT_BYTES >> 20} MiB").decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key:
            out[key] = value.strip()
    if out.get("status") not in ("ok", "kernel_error"):
        raise ReproError(f"{path}: status {out.get('status')!r} must be 'ok' or 'kernel_error'")
    return out


def _provenance(doc: dict, where: str) -> Provenance:
    prov = doc.get("provenance")
    require(isinstance(prov, dict) and isinstance(prov.get("ladder"), str) and is_opt_int(prov.get("seed"), -2**63)
            and is_opt_str(prov.get("source")) and prov.get("generator", "cpu") in ("cpu", "cuda"), ReproError,
            where, "provenance", prov, "an object: ladder (a string), seed (an integer or null), source (a string "
            "or null), generator ('cpu' or 'cuda')")
    return Provenance(prov["ladder"], prov.get("seed"), prov.get("source"), prov.get("generator", "cpu"))


def load_repro_run(directory, *, sink: Optional[str] = None):
    """The run of the reproducer in `directory` as a Recording (an AttentionRecording for an attention
    problem): its inputs, D or O and LSE (after a clean run), the taps of sink.bin (or `sink`) if there
    is one, and the kernel error if there was one."""
    root = Path(directory)
    where = str(root / "repro.json")
    if root.is_symlink():
        raise ReproError(f"{root} is a symbolic link: give the reproducer's folder itself")
    if not os.path.lexists(root / "repro.json"):
        raise ReproError(f"{root} holds no repro.json: not a directory written by python -m oracle repro")
    text = _read_bytes(root / "repro.json", MAX_TEXT_BYTES, f"{MAX_TEXT_BYTES >> 20} MiB")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ReproError(f"{where} is not valid JSON: {str(e)[:200]}") from None
    require(isinstance(doc, dict), ReproError, where, "document", doc, "a JSON object")
    if doc.get("format") != FORMAT or doc.get("version") not in READABLE_VERSIONS:
        raise ReproError(f"{where}: format {shown(doc.get('format'))} version {shown(doc.get('version'))}; "
                         f"this oracle reads {FORMAT!r} versions {', '.join(map(str, READABLE_VERSIONS))}")
    problem = doc.get("problem")
    if isinstance(problem, dict) and problem.get("kind") == "attention":
        return _attention_run(root, doc, where, sink)
    try:
        spec = ProblemSpec.from_json(doc.get("problem"))
        check_problem_size(spec)
    except (SpecError, InputError) as e:
        raise ReproError(f"{where}: problem: {e}") from None
    tensors = doc.get("tensors")
    require(isinstance(tensors, dict) and "d" in tensors, ReproError, where, "tensors", tensors,
            "an object with an entry per tensor, d among them")
    named = {}
    shapes = expected_shapes(spec)
    for name in ("a", "b", "c", "bias", "scale_a", "scale_b", "b_scales", "b_zeros"):
        if name in tensors:
            meta = _tensor_meta(tensors[name], f"{where}: tensors.{name}")
            if shapes.get(name) is None:
                raise ReproError(f"{where}: tensors.{name}: the problem has no {name}")
            if meta.get("quant") != quant_part(spec, name):  # a quantised B's part, as the problem stores it
                raise ReproError(f"{where}: tensors.{name}: quant {shown(meta.get('quant'))} is not the problem's "
                                 f"{quant_part(spec, name)}")
            named[name] = _logical(_read_tensor(root, meta, f"{where}: tensors.{name}", shapes[name],
                                                name in ("a", "b")), meta, f"{where}: tensors.{name}")
    try:
        ops = Operands(**named)
    except TypeError as e:
        raise ReproError(f"{where}: tensors: {e}") from None
    provenance = _provenance(doc, where)
    kernel = doc.get("kernel")
    require(isinstance(kernel, dict) and isinstance(kernel.get("entry_traced"), str), ReproError, where, "kernel",
            kernel, "an object with entry_traced (a string)")
    maps = doc.get("tensormaps", [])
    require(isinstance(maps, list) and all(isinstance(m, dict) and m.get("buffer") in ("a", "b")
                                           and isinstance(m.get("spec"), dict)
                                           and is_opt_int(m.get("launch"), hi=2**31 - 1) for m in maps),
            ReproError, where, "tensormaps", maps, "a list of {buffer: 'a' or 'b', spec: {...}, launch: an index}")
    result = _result(root / "result.txt")
    ok = result["status"] == "ok"
    traced = result.get("traced") == "1"
    entry = result.get("entry") or kernel["entry_traced"]
    output = None
    if ok:
        d = _tensor_meta(tensors["d"], f"{where}: tensors.d")
        output = _logical(_read_tensor(root, d, f"{where}: tensors.d", (spec.total_m, spec.n), False), d,
                          f"{where}: tensors.d")
    t = spec.tile
    trace, confounds, notes = _sink_trace(root, sink, ok, traced, lambda data: trace_format.parse_trace(
        data, block_m=t.bm, block_n=t.bn, block_k=t.bk, partial=not ok, scale_groups=scale_groups(spec)))
    taps, descriptors = (trace.taps, trace.descriptors) if trace is not None else ((), ())
    account = trace_format.account_of(trace) if trace is not None else None
    try:
        host_maps = tuple(TensorMapSpec.from_dict({k: tuple(v) if isinstance(v, list) else v
                                                   for k, v in m["spec"].items()}).to_descriptor_record(m["buffer"])
                          for m in maps if m.get("launch", 0) == 0)  # a live run adds the first launch's
    except (TensorMapError, TapError, TypeError, ValueError) as e:
        raise ReproError(f"{where}: tensormaps: {str(e)[:300]}") from None
    serialised: tuple[str, ...] = ()
    if doc.get("library") is not None:  # a launch library's maps are its own: only its taps say anything
        from oracle.run.live import library_descriptor_note

        notes.append(library_descriptor_note(descriptors, taps))
        said = doc["library"].get("serialised", []) if isinstance(doc["library"], dict) else []
        if not isinstance(said, list) or not all(isinstance(x, str) for x in said):
            raise ReproError(f"{where}: library.serialised must be a list of strings, got {str(said)[:200]}")
        serialised = tuple(said) if traced else ()  # the untraced build is the production one
    error = None if ok else f"{result.get('error', 'unknown')}: {result.get('message', '')}".strip()
    rec = Recording(spec=spec, operands=ops, output=output, provenance=provenance, taps=taps,
                    descriptors=tuple(descriptors) + host_maps, kernel=entry, kernel_error=error,
                    notes=tuple(notes), environment={"source": f"standalone reproducer {root}"}, trace=account,
                    output_poison=0xFF, confounds=confounds, serialised=serialised)
    try:
        rec.validate()
    except ValueError as e:
        raise ReproError(f"{root}: the run does not fit its problem: {e}") from None
    if provenance.ladder == "ones" and output is not None:  # as a live run checks it
        rec = replace(rec, notes=rec.notes + (ones_check(rec),))
    return rec


def _attention_run(root: Path, doc: dict, where: str, sink: Optional[str]):
    """The run of an attention reproducer as an AttentionRecording: its problem, q, k, v (and the
    offsets and page table it has), O and LSE after a clean run, the taps of sink.bin parsed as a
    live attention run parses them (oracle.run.attention_live), the kernel error if there was one."""
    from oracle.problem.attention import AttentionSpec
    from oracle.problem.spec import SpecError
    from oracle.run import attention_live
    from oracle.run.attention_recording import AttentionRecording, shapes_of
    from oracle.run.recording import RecordingError

    try:
        spec = AttentionSpec.from_json(doc.get("problem"))
        attention_live.check_size(spec)
    except (SpecError, InputError) as e:
        raise ReproError(f"{where}: problem: {e}") from None
    if doc.get("version") not in ATTENTION_VERSIONS:
        raise ReproError(f"{where}: version {shown(doc.get('version'))} holds no attention problem; an attention "
                         f"reproducer is version {', '.join(map(str, ATTENTION_VERSIONS))}")
    tensors = doc.get("tensors")
    require(isinstance(tensors, dict) and "o" in tensors, ReproError, where, "tensors", tensors,
            "an object with an entry per tensor, o among them")
    shapes = dict(shapes_of(spec))
    for name, (on, rows) in {"cu_seqlens_q": (spec.varlen_q, (spec.batch + 1,)),
                             "cu_seqlens_k": (spec.varlen_k, (spec.batch + 1,)),
                             "page_table": (spec.paged, (spec.batch, spec.max_pages or 0))}.items():
        if on:
            shapes[name] = rows
    dtypes = {"q": spec.q_dtype, "k": spec.k_dtype, "v": spec.v_dtype, "o": spec.o_dtype, "lse": "fp32",
              "cu_seqlens_q": "int32", "cu_seqlens_k": "int32", "page_table": "int32"}

    def read(name: str) -> torch.Tensor:
        at = f"{where}: tensors.{name}"
        meta = _tensor_meta(tensors.get(name), at, most_dims=4)
        if meta["dtype"] != dtypes[name]:
            raise ReproError(f"{at}: dtype {meta['dtype']!r} is not the problem's {dtypes[name]!r}")
        if meta.get("major") is not None:
            raise ReproError(f"{at}: major {meta['major']!r}: an attention tensor is stored as it is (null)")
        return _read_tensor(root, meta, at, shapes[name], False).reshape(shapes[name]).clone()

    named = {}
    for name in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "page_table"):
        if name in shapes:
            named[name] = read(name)
        elif name in tensors:
            raise ReproError(f"{where}: tensors.{name}: the problem has no {name}")
    provenance = _provenance(doc, where)
    kernel = doc.get("kernel")
    require(isinstance(kernel, dict) and isinstance(kernel.get("entry_traced"), str), ReproError, where, "kernel",
            kernel, "an object with entry_traced (a string)")
    result = _result(root / "result.txt")
    ok = result["status"] == "ok"
    traced = result.get("traced") == "1"
    o = lse = None
    if ok:
        o = read("o")
        if spec.lse:
            lse = read("lse")
    trace, confounds, notes = _sink_trace(root, sink, ok, traced, lambda data: trace_format.parse_trace(
        data, block_m=spec.block_q, block_n=spec.block_kv, block_k=spec.head_dim, head_dim_v=spec.head_dim_v,
        partial=not ok))
    taps, account = (trace.taps, trace_format.account_of(trace)) if trace is not None else ((), None)
    error = None if ok else f"{result.get('error', 'unknown')}: {result.get('message', '')}".strip()
    rec = AttentionRecording(spec=spec, q=named["q"], k=named["k"], v=named["v"], output=o, provenance=provenance,
                             lse=lse, cu_seqlens_q=named.get("cu_seqlens_q"), cu_seqlens_k=named.get("cu_seqlens_k"),
                             page_table=named.get("page_table"), kernel=result.get("entry") or kernel["entry_traced"],
                             kernel_error=error, confounds=confounds, notes=tuple(notes),
                             environment={"source": f"standalone reproducer {root}"}, taps=tuple(taps), trace=account)
    try:
        rec.validate()
    except (RecordingError, ValueError) as e:
        raise ReproError(f"{root}: the run does not fit its problem: {e}") from None
    return rec


def _sink_trace(root: Path, sink, ok: bool, traced: bool, parse):
    """The reproducer's sink (`sink`, else DIR/sink.bin) parsed by `parse`, with the confounds and
    notes its warnings give: (trace or None, confounds, notes)."""
    sink_path = Path(sink) if sink else root / "sink.bin"
    if not (os.path.lexists(sink_path) or sink):
        untraced = ["the untraced build ran: no taps (make TRACE=1 && ./repro_traced records them)"]
        return None, (), untraced if ok and not traced else []
    mb = knobs.TRACE_MAX_MB.get()
    trace = parse(_read_bytes(sink_path, mb << 20, f"the {mb} MiB a sink may take (ORACLE_TRACE_MAX_MB)",
                              follow=bool(sink)))
    confounds, kept = trace_warnings(trace)  # a warning the judgement rests on is an open confound
    notes = list(kept) + [f"trace: {len(trace.taps)} taps from {trace.records} records, {trace.used_bytes} of "
                          f"{trace.capacity} sink bytes (repro's host-mapped sink, {sink_path.name})"
                          + ("" if trace.complete else f", {trace.dropped} dropped")]
    return trace, confounds, notes

"""Dumps: one safetensors file holding a recorded kernel run, never pickle.

Tensors: the operands and output under `input.<name>` / `output.<name>`, and every tap under
`tap.<i>.values` (plus `tap.<i>.mask` when it is partial). The file's metadata holds one key,
`oracle.dump`, a JSON document:

    {"format": "oracle-dump", "version": 1,
     "meta": {...},          # problem spec, provenance, kernel, environment: opaque here
     "taps": [{"stage", "tile", "k_block", "slot", "cta", "dtype", "shape", "partial"}, ...],
     "descriptors": [{"operand", "dtype", "global_dims", ...}, ...]}

A path ending in `.gz` is written as a gzip stream of the same bytes (the recorded zoo traces are
mostly zero padding, which compresses well); `load_dump` recognises a gzip stream by its magic.
`load_dump` checks everything it reads and raises DumpError naming the problem: the file's size
against ORACLE_DUMP_MAX_MB (a gzip stream is read header first: its header is decompressed and
checked, then exactly the data bytes it describes, within the limit and the host's memory
(harness.budget), so a stream of zeros is refused from its first 8 bytes), every tensor entry
against the bytes there are, every metadata field by type and range. The meta object is the caller's to check
(oracle.run.recording does, field by field).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import platform
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from harness.errors import BadInput
from harness import knobs as _knobs
from harness._tensorio import MAX_HEADER_BYTES
from harness.fields import UINT64_MAX, is_int_list, is_opt_int, require, shown
from harness.output_files import check_destination, write_atomically
from harness.taps import TAP_STAGES, DescriptorRecord, Tap, TapError
from harness.tensormap import MAP_DTYPES

FORMAT = "oracle-dump"
VERSION = 1
META_KEY = "oracle.dump"
DESCRIPTOR_DTYPES = tuple(MAP_DTYPES)  # the element types a tensor map (and so a descriptor record) can have


class DumpError(BadInput, ValueError):
    """A dump file that is malformed, truncated or inconsistent."""


@dataclass(frozen=True)
class Dump:
    inputs: Mapping[str, torch.Tensor]
    outputs: Mapping[str, torch.Tensor]
    taps: tuple[Tap, ...] = ()
    descriptors: tuple[DescriptorRecord, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)


def _dtype_name(t: torch.dtype) -> str:
    return str(t).replace("torch.", "")


def save_dump(path: str, dump: Dump) -> None:
    """Write atomically (harness.output_files): a reader never sees half a file, and a destination
    that is a symbolic link, a FIFO or a directory is refused (DumpError) without being opened."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    for kind, group in (("input", dump.inputs), ("output", dump.outputs)):
        for name, t in group.items():
            tensors[f"{kind}.{name}"] = t.detach().to("cpu").contiguous()
    tap_meta = []
    for i, tap in enumerate(dump.taps):
        tensors[f"tap.{i}.values"] = tap.values.detach().to("cpu").contiguous()
        if tap.mask is not None:
            tensors[f"tap.{i}.mask"] = tap.mask.detach().to("cpu").contiguous()
        tap_meta.append({"stage": tap.stage, "tile": list(tap.tile), "k_block": tap.k_block, "slot": tap.slot,
                         "cta": tap.cta, "dtype": _dtype_name(tap.values.dtype), "shape": list(tap.values.shape),
                         "partial": tap.mask is not None, "k_partial": tap.partial, "group": tap.group})
    doc = {"format": FORMAT, "version": VERSION, "meta": dict(dump.meta), "taps": tap_meta,
           "descriptors": [asdict(d) for d in dump.descriptors]}
    check_destination(path, "dump", DumpError)  # before the bytes are made
    data = save(tensors, metadata={META_KEY: json.dumps(doc)})

    def write(f) -> None:
        if str(path).endswith(".gz"):  # a gzip stream of the same safetensors bytes
            with gzip.GzipFile(filename="", fileobj=f, mode="wb", compresslevel=9) as z:
                z.write(data)
        else:
            f.write(data)

    write_atomically(path, write, "dump", DumpError)


GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20
TAP_FIELDS = ("stage", "tile", "k_block", "slot", "cta", "dtype", "shape", "partial", "k_partial", "group")
DESCRIPTOR_FIELDS = ("operand", "dtype", "global_dims", "global_strides", "box_dims", "element_strides", "swizzle",
                     "oob_fill", "source")


def _size_limit() -> tuple[int, str]:
    mb = _knobs.get("ORACLE_DUMP_MAX_MB")
    return mb << 20, f"the {mb} MiB limit of ORACLE_DUMP_MAX_MB"


class _Inflater:
    """A gzip file (one member or several) read as a stream of its decompressed bytes, on demand:
    at most one chunk is decompressed ahead of what was asked for, so the header of a dump is read
    and checked before its body is decompressed, and nothing past `limit` bytes is ever kept."""

    def __init__(self, f, path: str, limit: int, limit_name: str) -> None:
        self.f, self.path, self.limit, self.limit_name = f, path, limit, limit_name
        self.d = zlib.decompressobj(wbits=31)
        self.pending = b""  # decompressed, not yet handed out
        self.done = 0  # bytes handed out
        self.ended = False

    def _more(self) -> bytes:
        """The next decompressed piece (b"" at the end of the last member)."""
        while not self.ended:
            if self.d.eof:  # a member ended: another one follows, or nothing
                data = self.d.unused_data or self.f.read(_CHUNK)
                if not data:
                    self.ended = True
                    return b""
                self.d = zlib.decompressobj(wbits=31)
            else:
                data = self.d.unconsumed_tail or self.f.read(_CHUNK)
                if not data:
                    raise DumpError(f"dump {self.path!r}: the gzip stream ends inside a member (truncated or "
                                    f"corrupt?)")
            piece = self.d.decompress(data, _CHUNK)
            if piece:
                return piece
        return b""

    def readinto(self, out: memoryview, what: str) -> None:
        """Fill `out` exactly, or raise DumpError naming `what` when the stream ends first."""
        if self.done + len(out) > self.limit:
            raise DumpError(f"dump {self.path!r}: {what} would make it more than {self.limit_name} decompressed "
                            f"({self.done + len(out)} bytes): raise the limit if the dump is genuine")
        at = 0
        while at < len(out):
            if not self.pending:
                self.pending = self._more()
                if not self.pending:
                    raise DumpError(f"dump {self.path!r}: the stream ends {len(out) - at} bytes into {what} "
                                    f"(truncated?)")
            n = min(len(self.pending), len(out) - at)
            out[at:at + n] = self.pending[:n]
            self.pending = self.pending[n:]
            at += n
        self.done += len(out)

    def read(self, n: int, what: str) -> bytearray:
        buf = bytearray(n)
        self.readinto(memoryview(buf), what)
        return buf

    def at_end(self) -> bool:
        """True when nothing is left (reads at most one more chunk)."""
        if not self.pending:
            self.pending = self._more()
        return not self.pending


def _json(text, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser goes
        raise DumpError(f"{what} is not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None


def _header(n: int, raw: bytes, where: str) -> tuple[dict, dict, int]:
    """The safetensors header (`n` bytes, `raw`): its entries by name, its metadata, and the data
    bytes the entries say follow it (the end of the last one), every entry checked for type and
    size before any tensor is made."""
    from harness.runner import ST_TO_TORCH

    head = _json(bytes(raw), f"{where}: the safetensors header")
    if not isinstance(head, dict):
        raise DumpError(f"{where}: the safetensors header is not a JSON object")
    meta = head.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise DumpError(f"{where}: the safetensors __metadata__ must map names to strings")
    spans, end = [], 0
    for name, info in head.items():
        at = f"{where}: tensor {name!r}"
        require(isinstance(info, dict) and set(info) == {"dtype", "shape", "data_offsets"}, DumpError, at,
                "header entry", info, "an object with dtype, shape and data_offsets")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        require(isinstance(dtype, str) and dtype in ST_TO_TORCH, DumpError, at, "dtype", dtype,
                f"one of {', '.join(ST_TO_TORCH)}")
        require(is_int_list(shape), DumpError, at, "shape", shape, "a list of non-negative integers")
        require(is_int_list(offs, 2) and offs[0] <= offs[1], DumpError, at, "data_offsets", offs,
                "[begin, end], begin <= end")
        nbytes = math.prod(shape) * ST_TO_TORCH[dtype].itemsize
        require(offs[1] - offs[0] == nbytes, DumpError, at, "data_offsets", offs,
                f"{nbytes} bytes for {dtype} {shape}")
        spans.append((offs[0], offs[1], name))
        end = max(end, offs[1])
    spans.sort()
    for (b0, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise DumpError(f"{where}: tensors {n0!r} and {n1!r} overlap (bytes {b0}..{e0} and {b1}..)")
    return head, meta, end


def _header_length(first8: bytes, available: Optional[int], where: str) -> int:
    """The header length a safetensors stream's first 8 bytes give, checked against MAX_HEADER_BYTES
    and (when known) the bytes there are."""
    n = int.from_bytes(first8, "little")
    if n > MAX_HEADER_BYTES:
        raise DumpError(f"{where}: the safetensors header claims {n} bytes, more than the {MAX_HEADER_BYTES >> 20} "
                        f"MiB a tensor file's header may have")
    if available is not None and n > available:
        raise DumpError(f"{where}: the safetensors header claims {n} bytes, the stream has {available}")
    return n


def _tensors_of(head: dict, data: bytearray, where: str) -> dict[str, torch.Tensor]:
    """The tensors of a checked header, as views of `data` (no copies)."""
    from harness.runner import ST_TO_TORCH

    out = {}
    for name, info in head.items():
        t, shape, offs = ST_TO_TORCH[info["dtype"]], info["shape"], info["data_offsets"]
        numel = math.prod(shape)
        out[name] = (torch.empty(shape, dtype=t) if numel == 0 else
                     torch.frombuffer(data, dtype=t, count=numel, offset=offs[0]).reshape(shape))
    return out


def _read_gzip(path: str, limit: int, limit_name: str, check_header) -> tuple[dict[str, torch.Tensor], dict]:
    """A gzip dump, header first: its 8-byte length and its header are decompressed and checked
    (the declared size against the limit and the host's memory, then `check_header(head, meta)`:
    the metadata against the tensors the header lists), and only then the data it describes into
    one buffer of exactly that size; bytes after it are refused."""
    from harness import budget

    where = f"dump {path!r}"
    with open(path, "rb") as f:
        z = _Inflater(f, path, limit, limit_name)
        try:
            first = z.read(8, "the 8-byte header length")
        except DumpError:
            raise DumpError(f"{where}: the safetensors stream is shorter than its 8-byte header length") from None
        n = _header_length(first, None, where)
        head, meta, size = _header(n, z.read(n, f"the {n}-byte safetensors header"), where)
        budget.require(8 + n + size, f"{where}: the tensors its header describes", DumpError,
                       knob=budget.Limit(limit, limit_name), advice="raise the limit if the dump is genuine")
        check_header(head, meta)  # before a byte of data is inflated
        data = z.read(size, f"the {size} data bytes its header describes")
        if not z.at_end():
            raise DumpError(f"{where}: the stream holds bytes after the {size} data bytes its header describes")
    return _tensors_of(head, data, where), meta


def _read(path: str, check_header) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and safetensors metadata of a dump file, gzip or plain, within the size limit;
    `check_header(head, meta)` runs on the header before any tensor's data is read."""
    from safetensors import safe_open

    limit, limit_name = _size_limit()
    if not os.path.isfile(path):
        raise DumpError(f"dump {path!r} does not exist or is not a file")
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
        if gzipped:
            try:
                return _read_gzip(path, limit, limit_name, check_header)
            except zlib.error as e:
                raise DumpError(f"dump {path!r} is not a readable gzip stream (truncated or corrupt?): {e}") from None
        size = os.path.getsize(path)
        if size > limit:
            raise DumpError(f"dump {path!r} has {size} bytes, more than {limit_name}: raise the limit if the dump "
                            f"is genuine")
        with open(path, "rb") as raw:  # the header alone, checked before safetensors reads a tensor
            where = f"dump {path!r}"
            try:
                n = _header_length(raw.read(8), max(0, size - 8), where)
                head, meta, _ = _header(n, raw.read(n), where)
            except DumpError as e:
                raise DumpError(f"{where} is not a readable safetensors file (truncated or corrupt?): "
                                f"{str(e)[len(where) + 2:]}") from None
        check_header(head, meta)
        with safe_open(path, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    except DumpError:
        raise
    except OSError as e:
        raise DumpError(f"dump {path!r} cannot be read: {e.strerror or e}") from None
    except Exception as e:  # safetensors raises its own error types for bad headers and short files
        raise DumpError(f"dump {path!r} is not a readable safetensors file (truncated or corrupt?): {e}") from None


def _tap_meta(tm: Any, where: str, stages: tuple[str, ...] = TAP_STAGES) -> None:
    """The fields of one tap's metadata, by type and range (Tap itself checks the stage's rules);
    `stages`: the stages the reader accepts (a GEMM's by default)."""
    require(isinstance(tm, dict), DumpError, where, "entry", tm, "a JSON object")
    unknown = sorted(set(tm) - set(TAP_FIELDS), key=str)
    require(not unknown, DumpError, where, "unknown field(s)", unknown, f"known: {', '.join(TAP_FIELDS)}")
    missing = [k for k in ("stage", "tile", "k_block", "dtype", "shape", "partial") if k not in tm]
    if missing:
        raise DumpError(f"{where} lacks field(s) {', '.join(missing)}")
    require(isinstance(tm["stage"], str) and tm["stage"] in stages, DumpError, where, "stage", tm["stage"],
            f"one of {', '.join(stages)}")
    require(is_int_list(tm["tile"], 2, hi=2**31 - 1), DumpError, where, "tile", tm["tile"],
            "[tile_m, tile_n], two non-negative integers")
    for key in ("k_block", "slot", "cta", "k_partial", "group"):
        require(is_opt_int(tm.get(key), hi=2**31 - 1), DumpError, where, key, tm.get(key),
                "a non-negative integer or null")
    require(isinstance(tm["dtype"], str), DumpError, where, "dtype", tm["dtype"], "a torch dtype name")
    require(is_int_list(tm["shape"]), DumpError, where, "shape", tm["shape"], "a list of non-negative integers")
    require(isinstance(tm["partial"], bool), DumpError, where, "partial", tm["partial"],
            "true (the tap has a mask tensor) or false")


def _descriptor(dm: Any, where: str) -> DescriptorRecord:
    require(isinstance(dm, dict), DumpError, where, "entry", dm, "a JSON object")
    unknown = sorted(set(dm) - set(DESCRIPTOR_FIELDS), key=str)
    require(not unknown, DumpError, where, "unknown field(s)", unknown, f"known: {', '.join(DESCRIPTOR_FIELDS)}")
    missing = [k for k in DESCRIPTOR_FIELDS[:-1] if k not in dm]
    if missing:
        raise DumpError(f"{where} lacks field(s) {', '.join(missing)}")
    for key in ("global_dims", "global_strides", "box_dims", "element_strides"):
        require(is_int_list(dm[key], hi=UINT64_MAX), DumpError, where, key, dm[key], "a list of non-negative integers")
    require(isinstance(dm["dtype"], str) and dm["dtype"] in DESCRIPTOR_DTYPES, DumpError, where, "dtype", dm["dtype"],
            f"one of {', '.join(DESCRIPTOR_DTYPES)}")
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in dm.items()}
    fields.setdefault("source", "unknown")  # recordings before the source was kept
    try:
        return DescriptorRecord(**fields)
    except TapError as e:
        raise DumpError(f"{where}: {e}") from None


def _document(path: str, meta: dict) -> dict:
    """The oracle.dump document of a file's safetensors metadata, its fields checked by type."""
    if META_KEY not in meta:
        raise DumpError(f"dump {path!r} has no {META_KEY!r} metadata: it was not written by this tool")
    doc = _json(meta[META_KEY], f"dump {path!r}: the {META_KEY!r} metadata")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DumpError(f"dump {path!r}: metadata format is {shown(doc.get('format') if isinstance(doc, dict) else doc)},"
                        f" expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise DumpError(f"dump {path!r}: version {shown(doc.get('version'))} is not supported (this reader: {VERSION})")
    unknown = sorted(set(doc) - {"format", "version", "meta", "taps", "descriptors"})
    if unknown:
        raise DumpError(f"dump {path!r}: unknown metadata field(s) {shown(unknown)}; known: format, version, meta, "
                        f"taps, descriptors")
    for key, typ in (("meta", dict), ("taps", list), ("descriptors", list)):
        if not isinstance(doc.get(key), typ):
            raise DumpError(f"dump {path!r}: metadata field {key!r} must be a JSON {typ.__name__}")
    return doc


def _check_entries(path: str, doc: dict, head: dict, stages: tuple[str, ...]) -> None:
    """The document against the tensors the header lists, before their data is read: every tap's
    tensors there with its dtype and shape, and no tensor the document does not describe."""
    from harness.runner import ST_TO_TORCH

    named = set()
    for i, tm in enumerate(doc["taps"]):
        where = f"dump {path!r}: tap #{i}"
        _tap_meta(tm, where, stages)
        for part in ("values", "mask") if tm["partial"] else ("values",):
            name = f"tap.{i}.{part}"
            if name not in head:
                raise DumpError(f"{where} names tensor {name!r}, which the file does not contain")
            named.add(name)
        info = head[f"tap.{i}.values"]
        dtype = _dtype_name(ST_TO_TORCH[info["dtype"]])
        if dtype != tm["dtype"] or list(info["shape"]) != list(tm["shape"]):
            raise DumpError(f"{where} ({tm['stage']}) says {tm['dtype'][:40]} {shown(tm['shape'])} but its tensor "
                            f"is {dtype} {shown(info['shape'])}")
    orphans = sorted(n for n in head if n not in named and not n.startswith(("input.", "output.")))
    if orphans:
        raise DumpError(f"dump {path!r}: tensor(s) {shown(orphans[:5])} are not described by the metadata")


def entry_shapes(head: dict, prefix: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The dtype and shape of every header entry under `prefix` ("input.", "output."), by its name after it."""
    from harness.runner import ST_TO_TORCH

    return {k[len(prefix):]: (ST_TO_TORCH[v["dtype"]], tuple(v["shape"])) for k, v in head.items()
            if k.startswith(prefix)}


def load_dump(path: str, check_meta: Optional[Callable[[Mapping[str, Any], dict, dict], None]] = None, *,
              stages: tuple[str, ...] = TAP_STAGES) -> Dump:
    """Read a dump, checking everything: the file within ORACLE_DUMP_MAX_MB (a gzip stream is
    stopped as soon as it passes it), every tensor entry, every metadata field. The header is read
    and checked first, with the document it carries: the taps' entries against their metadata and,
    with `check_meta(meta, inputs, outputs)` (the caller's, e.g. the problem against its operands;
    inputs and outputs map names to (dtype, shape) from the header), the meta object; only then is
    any tensor's data read or a gzip stream's body inflated. `stages`: the tap stages accepted (a
    GEMM's by default; a reader of several problem kinds passes theirs and checks each tap against
    its problem's own chain). Raises DumpError naming the file, the
    field, the value and what is allowed; nothing else."""
    def check_header(head: dict, meta: dict) -> None:
        doc = _document(path, meta)
        _check_entries(path, doc, head, stages)
        if check_meta is not None:
            check_meta(doc["meta"], entry_shapes(head, "input."), entry_shapes(head, "output."))

    tensors, meta = _read(path, check_header)
    doc = _document(path, meta)
    used: set[str] = set()

    def take(name: str, what: str) -> torch.Tensor:
        if name not in tensors:
            raise DumpError(f"dump {path!r}: {what} names tensor {name!r}, which the file does not contain")
        used.add(name)
        return tensors[name]

    taps = []
    for i, tm in enumerate(doc["taps"]):
        where = f"dump {path!r}: tap #{i}"
        _tap_meta(tm, where, stages)
        values = take(f"tap.{i}.values", where)
        if _dtype_name(values.dtype) != tm["dtype"] or list(values.shape) != list(tm["shape"]):
            raise DumpError(f"{where} ({tm['stage']}) says {tm['dtype'][:40]} {shown(tm['shape'])} but its tensor "
                            f"is {_dtype_name(values.dtype)} {list(values.shape)}")
        mask = take(f"tap.{i}.mask", where) if tm["partial"] else None
        try:
            taps.append(Tap(stage=tm["stage"], tile=tuple(tm["tile"]), values=values, k_block=tm["k_block"],
                            slot=tm.get("slot"), cta=tm.get("cta"), mask=mask, partial=tm.get("k_partial"),
                            group=tm.get("group")))
        except TapError as e:
            raise DumpError(f"{where}: {e}") from None
    descriptors = tuple(_descriptor(dm, f"dump {path!r}: descriptor #{i}") for i, dm in enumerate(doc["descriptors"]))
    inputs = {k[len("input."):]: v for k, v in tensors.items() if k.startswith("input.")}
    outputs = {k[len("output."):]: v for k, v in tensors.items() if k.startswith("output.")}
    used |= {f"input.{k}" for k in inputs} | {f"output.{k}" for k in outputs}
    orphans = sorted(set(tensors) - used)
    if orphans:
        raise DumpError(f"dump {path!r}: tensor(s) {shown(orphans[:5])} are not described by the metadata")
    return Dump(inputs=inputs, outputs=outputs, taps=tuple(taps), descriptors=descriptors, meta=doc["meta"])


def environment() -> dict[str, Any]:
    """Versions and the device, for a dump's metadata."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform()}
    try:  # the installed version, without importing triton (that would fix its backend before the oracle chooses)
        from importlib.metadata import version

        env["triton"] = version("triton")
    except Exception:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = None
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET") == "1"
    return env

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
`load_dump` checks everything it reads and raises DumpError naming the problem.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import torch

from harness.taps import DescriptorRecord, Tap, TapError

FORMAT = "oracle-dump"
VERSION = 1
META_KEY = "oracle.dump"


class DumpError(ValueError):
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
    """Write atomically: a reader never sees half a file."""
    from safetensors.torch import save_file

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
    tmp = f"{path}.tmp.{os.getpid()}"
    if str(path).endswith(".gz"):  # a gzip stream of the same safetensors bytes
        from safetensors.torch import save

        with gzip.open(tmp, "wb", compresslevel=9) as f:
            f.write(save(tensors, metadata={META_KEY: json.dumps(doc)}))
    else:
        save_file(tensors, tmp, metadata={META_KEY: json.dumps(doc)})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # a plain file, as open() would make it
    os.replace(tmp, path)


GZIP_MAGIC = b"\x1f\x8b"


def _safetensors_metadata(data: bytes) -> dict:
    """The __metadata__ table of safetensors bytes (8-byte little-endian header length, JSON)."""
    if len(data) < 8:
        raise DumpError("the safetensors stream is shorter than its 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise DumpError(f"the safetensors header claims {n} bytes, the stream has {len(data) - 8}")
    head = json.loads(data[8:8 + n])
    meta = head.get("__metadata__", {}) if isinstance(head, dict) else {}
    return meta if isinstance(meta, dict) else {}


def load_dump(path: str) -> Dump:
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise DumpError(f"dump {path!r} does not exist or is not a file")
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
        if gzipped:
            from safetensors.torch import load

            with gzip.open(path, "rb") as f:
                data = f.read()
            tensors = load(data)
            meta = _safetensors_metadata(data)
        else:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
    except DumpError:
        raise
    except Exception as e:  # safetensors raises its own error types for bad headers and short files
        raise DumpError(f"dump {path!r} is not a readable safetensors file (truncated or corrupt?): {e}") from None
    if META_KEY not in meta:
        raise DumpError(f"dump {path!r} has no {META_KEY!r} metadata: it was not written by this tool")
    try:
        doc = json.loads(meta[META_KEY])
    except json.JSONDecodeError as e:
        raise DumpError(f"dump {path!r}: the {META_KEY!r} metadata is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DumpError(f"dump {path!r}: metadata format is {doc.get('format') if isinstance(doc, dict) else doc!r},"
                        f" expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        raise DumpError(f"dump {path!r}: version {doc.get('version')!r} is not supported (this reader: {VERSION})")
    for key, typ in (("meta", dict), ("taps", list), ("descriptors", list)):
        if not isinstance(doc.get(key), typ):
            raise DumpError(f"dump {path!r}: metadata field {key!r} must be a JSON {typ.__name__}")

    used: set[str] = set()

    def take(name: str, what: str) -> torch.Tensor:
        if name not in tensors:
            raise DumpError(f"dump {path!r}: {what} names tensor {name!r}, which the file does not contain")
        used.add(name)
        return tensors[name]

    taps = []
    for i, tm in enumerate(doc["taps"]):
        where = f"tap #{i}"
        if not isinstance(tm, dict):
            raise DumpError(f"dump {path!r}: {where} must be a JSON object")
        missing = [k for k in ("stage", "tile", "k_block", "dtype", "shape", "partial") if k not in tm]
        if missing:
            raise DumpError(f"dump {path!r}: {where} lacks field(s) {', '.join(missing)}")
        values = take(f"tap.{i}.values", where)
        if _dtype_name(values.dtype) != tm["dtype"] or list(values.shape) != list(tm["shape"]):
            raise DumpError(f"dump {path!r}: {where} ({tm['stage']}) says {tm['dtype']} {tm['shape']} but its tensor "
                            f"is {_dtype_name(values.dtype)} {list(values.shape)}")
        mask = take(f"tap.{i}.mask", where) if tm["partial"] else None
        try:
            taps.append(Tap(stage=tm["stage"], tile=tuple(tm["tile"]), values=values, k_block=tm["k_block"],
                            slot=tm.get("slot"), cta=tm.get("cta"), mask=mask, partial=tm.get("k_partial"),
                            group=tm.get("group")))
        except (TapError, TypeError) as e:
            raise DumpError(f"dump {path!r}: {where}: {e}") from None
    descriptors = []
    for i, dm in enumerate(doc["descriptors"]):
        try:
            fields = {k: tuple(v) if isinstance(v, list) else v for k, v in dm.items()}
            fields.setdefault("source", "unknown")  # recordings before the source was kept
            descriptors.append(DescriptorRecord(**fields))
        except (TapError, TypeError) as e:
            raise DumpError(f"dump {path!r}: descriptor #{i}: {e}") from None
    inputs = {k[len("input."):]: v for k, v in tensors.items() if k.startswith("input.")}
    outputs = {k[len("output."):]: v for k, v in tensors.items() if k.startswith("output.")}
    used |= {f"input.{k}" for k in inputs} | {f"output.{k}" for k in outputs}
    orphans = sorted(set(tensors) - used)
    if orphans:
        raise DumpError(f"dump {path!r}: tensor(s) {', '.join(orphans[:5])} are not described by the metadata")
    return Dump(inputs=inputs, outputs=outputs, taps=tuple(taps), descriptors=tuple(descriptors), meta=doc["meta"])


def environment() -> dict[str, Any]:
    """Versions and the device, for a dump's metadata."""
    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform()}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = None
    env["triton_interpret"] = os.environ.get("TRITON_INTERPRET") == "1"
    return env

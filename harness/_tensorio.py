"""Tensors on disk in the safetensors layout, without torch or numpy, for the kernel child process.

Layout: 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {str: str}}, space-padded to a multiple of 8), then the
data, with no holes. Entries are written largest element first, so every tensor's data is aligned to
its element size. Files written here load with `safetensors.torch.load_file` and the reverse.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Mapping, Optional, Sequence

ITEMSIZE: dict[str, int] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


class TensorFileError(ValueError):
    """A tensor file that is not well-formed."""


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int = 0  # absolute byte offset in the file
    nbytes: int = 0


def nbytes_of(dtype: str, shape: Sequence[int]) -> int:
    if dtype not in ITEMSIZE:
        raise TensorFileError(f"dtype {dtype!r} is not a safetensors dtype; known: {', '.join(ITEMSIZE)}")
    n = ITEMSIZE[dtype]
    for d in shape:
        n *= int(d)
    return n


def layout(specs: Iterable[tuple[str, str, Sequence[int]]],
           metadata: Optional[Mapping[str, str]] = None) -> tuple[bytes, list[Entry]]:
    """The header bytes (length prefix included) and the entries with absolute offsets."""
    items = sorted(((n, d, tuple(int(x) for x in s)) for n, d, s in specs),
                   key=lambda e: (-ITEMSIZE.get(e[1], 0), e[0]))
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    pos = 0
    rel: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for name, dtype, shape in items:
        if name == "__metadata__" or name in header:
            raise TensorFileError(f"tensor name {name!r} is reserved or repeated")
        size = nbytes_of(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + size]}
        rel.append((name, dtype, shape, pos, size))
        pos += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return head, [Entry(n, d, s, len(head) + p, sz) for n, d, s, p, sz in rel]


def write(path: os.PathLike, tensors: Iterable[tuple[str, str, Sequence[int], object]],
          metadata: Optional[Mapping[str, str]] = None) -> list[Entry]:
    """Write (name, dtype, shape, data) tuples; data is any bytes-like object of the right size."""
    tensors = list(tensors)
    head, entries = layout(((n, d, s) for n, d, s, _ in tensors), metadata)
    data = {n: b for n, _, _, b in tensors}
    with open(path, "wb") as f:
        f.write(head)
        for e in entries:
            view = memoryview(data[e.name]).cast("B")
            if len(view) != e.nbytes:
                raise TensorFileError(f"tensor {e.name!r}: {len(view)} bytes of data for {e.dtype}{list(e.shape)} "
                                      f"which needs {e.nbytes}")
            f.write(view)
    return entries


def create(path: os.PathLike, specs: Iterable[tuple[str, str, Sequence[int]]],
           metadata: Optional[Mapping[str, str]] = None) -> list[Entry]:
    """Write the header and size the file for the data, to be filled in place (e.g. through mmap)."""
    head, entries = layout(specs, metadata)
    total = len(head) + sum(e.nbytes for e in entries)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(total)
    return entries


def read_header(f: BinaryIO, file_size: int) -> tuple[list[Entry], dict]:
    raw = f.read(8)
    if len(raw) != 8:
        raise TensorFileError("file is shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER_BYTES or 8 + n > file_size:
        raise TensorFileError(f"header length {n} does not fit in a {file_size}-byte file")
    try:
        header = json.loads(f.read(n).decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise TensorFileError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise TensorFileError("header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    entries = []
    start = 8 + n
    for name, info in header.items():
        try:
            dtype, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise TensorFileError(f"tensor {name!r}: header entry {info!r} is malformed") from None
        if e - b != nbytes_of(dtype, shape) or b < 0 or start + e > file_size:
            raise TensorFileError(f"tensor {name!r}: offsets {[b, e]} do not match {dtype}{list(shape)} "
                                  f"or the file size {file_size}")
        entries.append(Entry(name, dtype, shape, start + b, e - b))
    return entries, meta


def read(path: os.PathLike) -> tuple[dict[str, tuple[Entry, bytes]], dict]:
    """{name: (entry, data bytes)} and the metadata."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        entries, meta = read_header(f, size)
        out = {}
        for e in entries:
            f.seek(e.offset)
            data = f.read(e.nbytes)
            if len(data) != e.nbytes:
                raise TensorFileError(f"tensor {e.name!r}: file ends inside its data")
            out[e.name] = (e, data)
    return out, meta


def entries(path: os.PathLike) -> list[Entry]:
    with open(path, "rb") as f:
        return read_header(f, os.path.getsize(path))[0]

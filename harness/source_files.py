"""What a CUDA/C++ source file the oracle builds or copies may be, and what a device image is.

A source (a kernel's translation unit, a launch library, a header a reproducer copies) is a
regular file (checked with lstat on its resolved path before it is opened: no FIFO, device or file
of /proc, /sys, /dev; opened with O_NONBLOCK and O_NOFOLLOW) whose name ends in a source suffix and
whose first bytes are text: no ELF object, ar archive or fatbin, no NUL byte. nvcc decides what a
file is by its suffix, so an object, archive or shared library named as a source would be linked
into a launch library (its constructors run when the library is loaded); both checks keep it out.
A device image (a prebuilt cubin) is a CUDA ELF (e_machine EM_CUDA) or a fatbin, never a host object.
"""

from __future__ import annotations

import os
import struct
from typing import Optional, Union

from harness.files import read_head

Path = Union[str, os.PathLike]

SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")  # a translation unit or launch library
HEADER_SUFFIXES = SOURCE_SUFFIXES + (".hh", ".hxx", ".inl", ".inc")  # a header a quoted #include reaches
BINARY_MAGICS = ((b"\x7fELF", "an ELF file (an object, a shared library or a cubin)"),
                 (b"!<arch>", "an ar archive (a static library)"),
                 (b"\x50\xed\x55\xba", "a fatbin"))
HEAD_BYTES = 4096  # how much of a source is read to tell text from binary
MAX_SOURCE_BYTES = 64 << 20  # a CUDA source larger than this is not one
EM_CUDA = 190  # the ELF machine of a cubin
FATBIN_MAGIC = b"\x50\xed\x55\xba"


def binary_kind(data: bytes) -> Optional[str]:
    """What `data` (a file's first bytes, or all of them) is when it is not source text, or None."""
    for magic, what in BINARY_MAGICS:
        if data.startswith(magic):
            return what
    if b"\0" in data:
        return "binary data (it holds a NUL byte)"
    return None


def check_source_bytes(data: bytes, name: str, error: type) -> None:
    """`data` (a file's first bytes, or all of them) must be source text."""
    what = binary_kind(data)
    if what is not None:
        raise error(f"{name} is {what}, not a CUDA/C++ source: only source text is built or copied")


def check_source_suffix(path: Path, name: str, error: type, suffixes: tuple[str, ...] = SOURCE_SUFFIXES) -> None:
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix.lower() not in suffixes:
        raise error(f"{name} is not a CUDA/C++ source: its name must end in {', '.join(suffixes)} (nvcc treats "
                    f"any other file by its suffix, an object or a library as something to link)")


def check_source_file(path: Path, name: str, error: type, suffixes: tuple[str, ...] = SOURCE_SUFFIXES) -> None:
    """`path` is a source: its suffix, a regular file within MAX_SOURCE_BYTES (followed to where its
    links lead, then checked and opened without following one more), and text in its first bytes."""
    check_source_suffix(path, name, error, suffixes)
    head = read_head(os.path.realpath(path), name, HEAD_BYTES, MAX_SOURCE_BYTES,
                     f"the {MAX_SOURCE_BYTES >> 20} MiB a CUDA source may have", error, nofollow=True)
    check_source_bytes(head, name, error)


def device_image_kind(data: bytes) -> Optional[str]:
    """"cubin" or "fatbin" when `data` (at least a file's first 20 bytes) starts a device image, else None."""
    if data.startswith(FATBIN_MAGIC):
        return "fatbin"
    if data.startswith(b"\x7fELF") and len(data) >= 20:
        little = data[5] == 1
        (machine,) = struct.unpack_from("<H" if little else ">H", data, 18)
        if machine == EM_CUDA:
            return "cubin"
    return None


def check_device_image_file(path: Path, name: str, limit: int, limit_text: str, error: type) -> None:
    """`path` is a cubin (a CUDA ELF) or a fatbin: a regular file within `limit`, checked before it is opened."""
    head = read_head(os.path.realpath(path), name, 64, limit, limit_text, error, nofollow=True)
    check_device_image_bytes(head, name, error)


def check_device_image_bytes(data: bytes, name: str, error: type) -> None:
    if device_image_kind(data) is None:
        what = ("an ELF file for another machine than CUDA's (a host object or library)" if data.startswith(b"\x7fELF")
                else binary_kind(data[:HEAD_BYTES]) or "text")
        raise error(f"{name} is not a CUDA device image (a cubin, an ELF for EM_CUDA, or a fatbin): it is {what}")

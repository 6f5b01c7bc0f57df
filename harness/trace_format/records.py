"""Encoding one record (elements, block, bytes, descriptor) as a traced kernel writes it."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import torch

from harness.taps import DescriptorRecord
from harness.trace_format.format import (
    COMMIT_TAG, DESCRIPTOR_BODY, DTYPE_CODES, DTYPE_SIZE, DTYPE_TORCH, NONE, OOB_FILL_CODES, OPERAND_CODES,
    RECORD_HEAD, RECORD_HEAD_V1, RecordKind, STAGE_CODES, VERSION, _BITS, _TORCH_BITS, _round_up)


ValuesLike = Union[torch.Tensor, np.ndarray, Sequence[float]]


def _dtype_name(values, dtype: Optional[str]) -> str:
    if dtype is not None:
        if dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {dtype!r} is unknown; known: {', '.join(DTYPE_CODES)}")
        return dtype
    if isinstance(values, torch.Tensor):
        for name, t in DTYPE_TORCH.items():
            if values.dtype == t:
                return name
        raise ValueError(f"torch dtype {values.dtype} has no trace dtype; known: {', '.join(DTYPE_CODES)}")
    raise ValueError("dtype is required when values are not a torch tensor")


def _value_bytes(values: ValuesLike, dtype: str) -> bytes:
    """Raw little-endian bits of `values` in `dtype`."""
    if not isinstance(values, torch.Tensor):
        values = torch.as_tensor(np.asarray(values, dtype=np.float64 if dtype not in ("int8", "int32") else np.int64))
    t = values.detach().cpu().reshape(-1)
    if t.dtype != DTYPE_TORCH[dtype]:
        t = t.to(DTYPE_TORCH[dtype])
    return t.contiguous().view(_TORCH_BITS[DTYPE_SIZE[dtype]]).numpy().astype(
        np.dtype(_BITS[DTYPE_SIZE[dtype]]).newbyteorder("<")).tobytes()


def encode_record(kind: int, body: bytes, *, stage: str, dtype: str, tile: tuple[int, int] = (NONE, NONE),
                  k_block: int = NONE, slot: int = NONE, cta: int = 0, thread: int = 0,
                  shape: tuple[int, int] = (0, 0), commit: bool = True, stage_code: Optional[int] = None,
                  dtype_code: Optional[int] = None, partial: Optional[int] = None, group: Optional[int] = None,
                  version: int = VERSION) -> bytes:
    """One record: head + body, padded to RECORD_ALIGN. The *_code overrides write raw codes (for tests);
    `version` 1 writes the old 40-byte head (no partial, no group)."""
    fields = (int(kind), COMMIT_TAG if commit else 0, STAGE_CODES[stage] if stage_code is None else stage_code,
              DTYPE_CODES[dtype] if dtype_code is None else dtype_code, 0, thread, cta, tile[0], tile[1],
              NONE if k_block is None else k_block, NONE if slot is None else slot, shape[0], shape[1])
    if version >= 2:
        head_struct = RECORD_HEAD
        fields += (NONE if partial is None else partial, NONE if group is None else group)
    else:
        if partial is not None or group is not None:
            raise ValueError("a version-1 record head has no partial or group")
        head_struct = RECORD_HEAD_V1
    size = _round_up(head_struct.size + len(body))
    return (head_struct.pack(size, *fields) + body).ljust(size, b"\0")


def encode_descriptor(d: DescriptorRecord, *, cta: int = 0, thread: int = 0, version: int = VERSION) -> bytes:
    """A Descriptor record for the fields of `d`."""
    rank = len(d.global_dims)
    pad = lambda xs, n: tuple(xs) + (0,) * (n - len(xs))  # noqa: E731
    body = DESCRIPTOR_BODY.pack(OPERAND_CODES[d.operand], rank, d.swizzle, OOB_FILL_CODES[d.oob_fill],
                                *pad(d.global_dims, 5), *pad(d.global_strides, 4), *pad(d.box_dims, 5),
                                *pad(d.element_strides, 5))
    return encode_record(RecordKind.DESCRIPTOR, body, stage=d.stage, dtype=d.dtype, cta=cta, thread=thread,
                         version=version)

"""The numbers of the C++ trace header and of harness/trace_format/ must agree.

The header's static_asserts pin its struct layout (checked by nvcc whenever it compiles the
header with ORACLE_TRACE); this test reads those same lines and compares them with Python.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
import torch

from harness import trace_format as tf
from harness.taps import ALL_TAP_STAGES

HEADER = Path(__file__).resolve().parents[2] / "harness" / "include" / "oracle_trace" / "trace.cuh"
TEXT = HEADER.read_text()


def _int(s: str) -> int:
    return int(s.strip().rstrip("uU"), 0)


def _constants() -> dict[str, int]:
    out = {}
    for name, value in re.findall(r"constexpr\s+(?:uint32_t|int)\s+(k\w+)\s*=\s*(-?(?:0x)?[0-9A-Fa-f]+u?)\s*;", TEXT):
        out[name] = _int(value)
    return out


def _enum(name: str) -> dict[str, int]:
    m = re.search(r"enum class " + name + r"\s*:\s*\w+\s*\{(.*?)\};", TEXT, re.S)
    assert m, f"enum {name} not found in {HEADER}"
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return {k: _int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\w+)", body)}


def _camel_to_snake(s: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", s).lower()


def _static_asserts() -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    consts = _constants()
    offsets = {(s, f): _int(v) for s, f, v in re.findall(r"static_assert\(offsetof\((\w+),\s*(\w+)\)\s*==\s*(\w+)\s*,", TEXT)}
    sizes = {}
    for s, v in re.findall(r"static_assert\(sizeof\((\w+)\)\s*==\s*(\w+)\s*,", TEXT):
        sizes[s] = consts[v] if v in consts else _int(v)
    return offsets, sizes


def test_scalar_constants_agree():
    c = _constants()
    expected = {
        "kMagic": tf.MAGIC, "kVersion": tf.VERSION, "kHeaderBytes": tf.HEADER_BYTES, "kMaxTiles": tf.MAX_TILES,
        "kKBlockWindow": tf.KBLOCK_WINDOW, "kFlagAllKBlocks": tf.FLAG_ALL_K_BLOCKS, "kCommitTag": tf.COMMIT_TAG,
        "kRecordHeadBytes": tf.RECORD_HEAD_BYTES, "kRecordAlign": tf.RECORD_ALIGN, "kMaxTileDim": tf.MAX_TILE_DIM,
        "kNone": tf.NONE, "kStageCounters": tf.STAGE_COUNTERS, "kMaxGroups": tf.MAX_GROUPS,
    }
    assert c == expected


def test_magic_spells_otrc():
    assert struct.pack("<I", tf.MAGIC) == b"OTRC"


def test_stage_codes_agree():
    header = {_camel_to_snake(k): v for k, v in _enum("Stage").items()}
    assert header == tf.STAGE_CODES
    assert set(header) == set(ALL_TAP_STAGES) and len(set(header.values())) == len(header)


def test_dtype_codes_agree():
    names = {"F32": "fp32", "F16": "fp16", "BF16": "bf16", "E4M3": "e4m3", "E5M2": "e5m2", "I8": "int8", "I32": "int32",
             "U8": "uint8"}
    header = {names[k]: v for k, v in _enum("DType").items()}
    assert header == tf.DTYPE_CODES


def test_dtype_names_match_kernels_ref():
    from kernels_ref.dtypes import DTYPES, ELEMENT_TYPES

    assert set(tf.DTYPE_CODES) == set(DTYPES) | {"uint8"}  # uint8: a packed operand's bytes
    for name in tf.DTYPE_CODES:
        d = ELEMENT_TYPES[name]
        assert tf.DTYPE_TORCH[name] == d.torch
        assert tf.DTYPE_SIZE[name] == d.itemsize


def test_record_kinds_operands_fills_agree():
    assert {k.upper(): v for k, v in _enum("RecordKind").items()} == {k.name: k.value for k in tf.RecordKind}
    assert {k.lower(): v for k, v in _enum("Operand").items()} == tf.OPERAND_CODES
    assert {k.lower(): v for k, v in _enum("OobFill").items()} == tf.OOB_FILL_CODES


def _struct_offsets(fmt: str) -> list[int]:
    """Offsets of each field of a little-endian struct format ('x' padding skipped)."""
    offs, pos = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.lstrip("<")):
        n = int(count) if count else 1
        size = struct.calcsize("<" + code)
        if code == "x":
            pos += n
            continue
        for _ in range(n):
            offs.append(pos)
            pos += size
    return offs


def test_header_offsets_agree():
    offsets, _ = _static_asserts()
    header = {f: o for (s, f), o in offsets.items() if s == "SinkHeader"}
    assert header == tf.HEADER_OFFSETS
    fixed = ["magic", "version", "header_bytes", "capacity", "cursor", "dropped", "flags", "stage_mask", "n_tiles",
             "kb_base", "n_groups"]
    assert _struct_offsets(tf.HEADER_FIXED.format)[:len(fixed)] == [tf.HEADER_OFFSETS[f] for f in fixed]


def test_record_head_offsets_agree():
    offsets, _ = _static_asserts()
    head = {f: o for (s, f), o in offsets.items() if s == "RecordHead"}
    assert head == tf.RECORD_HEAD_OFFSETS
    fields = ["size", "kind", "commit", "stage", "dtype", None, "thread", "cta", "tile_m", "tile_n", "k_block", "slot",
              "shape_rows", "shape_cols", "partial", "group"]
    for name, off in zip(fields, _struct_offsets(tf.RECORD_HEAD.format)):
        if name is not None:
            assert tf.RECORD_HEAD_OFFSETS[name] == off, name


def test_descriptor_body_offsets_agree():
    offsets, _ = _static_asserts()
    body = {f: o for (s, f), o in offsets.items() if s == "DescriptorBody"}
    assert body == tf.DESCRIPTOR_BODY_OFFSETS
    offs = _struct_offsets(tf.DESCRIPTOR_BODY.format)
    # operand, rank, swizzle, oob_fill, dims[5], strides[4], box[5], element_strides[5]
    assert [offs[4], offs[9], offs[13], offs[18]] == [body["dims"], body["strides"], body["box"],
                                                      body["element_strides"]]


def test_struct_sizes_agree():
    _, sizes = _static_asserts()
    assert sizes == tf.STRUCT_SIZES


@pytest.mark.parametrize("name", list(tf.DTYPE_TORCH))
def test_torch_dtypes_have_the_declared_size(name):
    assert torch.empty((), dtype=tf.DTYPE_TORCH[name]).element_size() == tf.DTYPE_SIZE[name]

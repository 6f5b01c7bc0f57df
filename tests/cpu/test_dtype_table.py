"""One dtype table (kernels_ref.dtypes) that every layer reads: its rows agree with torch, and the
tables the harness and the references use are derived from it, not written out again."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import torch

from harness import runner, tensormap, trace_format
from kernels_ref import _common
from kernels_ref.dtypes import DTYPES, ELEMENT_TYPES

ROOT = Path(__file__).resolve().parents[2]


def test_every_row_agrees_with_torch():
    for name, d in ELEMENT_TYPES.items():
        assert torch.empty((), dtype=d.torch).element_size() == d.itemsize, name
        if d.is_float:
            assert float(torch.finfo(d.torch).max) == d.max_finite, name
            nan = torch.tensor([d.nan_bits], dtype=torch.int64).to({1: torch.uint8, 2: torch.int16, 4: torch.int32}[
                d.itemsize]).view(d.torch).float()
            assert math.isnan(nan.item()), f"{name}: nan_bits {d.nan_bits:#x} is not a NaN"
        else:
            assert d.nan_bits is None and d.unit_roundoff == 0.0, name
            assert float(torch.iinfo(d.torch).max) == d.max_finite, name


def test_codes_are_unique_per_layer():
    ref = [d.ref_code for d in DTYPES.values()]
    trace = [d.trace_code for d in ELEMENT_TYPES.values() if d.trace_code]
    assert len(set(ref)) == len(ref) and len(set(trace)) == len(trace)


def test_the_layers_read_the_one_table():
    assert _common.CODES == {k: d.ref_code for k, d in DTYPES.items()}
    assert _common.NAN_BITS == {k: d.nan_bits for k, d in DTYPES.items() if d.is_float}
    # every operand/output type can be traced, and the bytes of a packed operand
    assert set(trace_format.DTYPE_CODES) == set(DTYPES) | {"uint8"}
    for k, code in trace_format.DTYPE_CODES.items():
        d = ELEMENT_TYPES[k]
        assert (code, trace_format.DTYPE_SIZE[k], trace_format.DTYPE_TORCH[k]) == (d.trace_code, d.itemsize, d.torch)
    assert set(tensormap.MAP_DTYPES) == set(ELEMENT_TYPES) == set(runner.MAP_DTYPE_TORCH)
    for k, (size, map_type, is_float) in tensormap.MAP_DTYPES.items():
        d = ELEMENT_TYPES[k]
        assert (size, map_type, is_float) == (d.itemsize, d.map_type, d.map_is_float)
        assert runner.MAP_DTYPE_TORCH[k] == (d.torch,)
        assert runner.TORCH_TO_ST[d.torch] == d.safetensors


def test_the_table_loads_without_torch_or_triton():
    code = "import sys, kernels_ref.dtypes, harness.tensormap; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["False", "False"]

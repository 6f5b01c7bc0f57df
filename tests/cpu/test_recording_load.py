"""A recording's metadata is checked field by field when it is loaded: every field of the wrong
type or out of range is a DumpError naming it, also those that only decorate the report."""

from __future__ import annotations

import gzip
import json
import re
import struct

import pytest
from zoo_cases import ROOT  # tests/ is on sys.path

from harness.dump import DumpError
from oracle.run.recording import Recording

DUMP = ROOT / "tests" / "zoo" / "dumps" / "hopper_bf16_correct.safetensors.gz"


def _with_meta(tmp_path, edit) -> str:
    """The zoo recording with its metadata document edited, as a plain safetensors file."""
    raw = gzip.decompress(DUMP.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    doc = json.loads(header["__metadata__"]["oracle.dump"])
    edit(doc)
    header["__metadata__"]["oracle.dump"] = json.dumps(doc)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    p = tmp_path / "edited.safetensors"
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    return str(p)


def _set(path: str, value):
    def edit(doc):
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def test_the_recording_loads_unedited(tmp_path):
    rec = Recording.load(_with_meta(tmp_path, lambda doc: None))
    assert rec.kernel.startswith("zoo_hopper_bf16") and rec.synthetic is False


@pytest.mark.parametrize("path, value, message", [
    ("meta.kernel", 5, "metadata field kernel=5 is not allowed"),
    ("meta.kernel", {"name": 5}, "kernel.name=5 is not allowed: a string"),
    ("meta.confounds", 5, "metadata field confounds=5 is not allowed: a list of strings"),
    ("meta.notes", [1], "metadata field notes=[1] is not allowed: a list of strings"),
    ("meta.synthetic", "none", "metadata field synthetic='none' is not allowed: true or false"),
    ("meta.output_poison", 256, "output_poison=256 is not allowed: a byte value 0..255 or null"),
    ("meta.command", "python", "command='python' is not allowed"),
    ("meta.environment", [], "environment=[] is not allowed: an object"),
    ("meta.environment.gpu", 5, "environment.gpu=5 is not allowed: a string or null"),
    ("meta.provenance", 5, "provenance=5 is not allowed"),
    ("meta.provenance.ladder", "rnd", "provenance.ladder='rnd' is not allowed: one of ones, index"),
    ("meta.provenance.seed", "7", "provenance.seed='7' is not allowed"),
    ("meta.provenance.generator", "tpu", "provenance.generator='tpu' is not allowed"),
    ("meta.trace", 5, "metadata field trace: a trace account must be a JSON object"),
    ("meta.trace.k_blocks", [[1]], "metadata field trace: selection k-block [1] must be an int"),
    ("meta.problem.scale_a", {"kind": "block", "block": 5}, "scale_a.block=5 is not allowed"),
    ("meta.problem.alpha", 10 ** 400, "alpha=1000000000000"),
    ("meta.problem.tile", [1 << 20, 128, 64], "tile.bm=1048576 is not allowed: must be a positive integer of at "
                                              "most 65535"),
    ("meta.extra", 1, "unknown metadata field(s) ['extra']; known: problem, provenance"),
    ("descriptors.0", 5, "descriptor #0: entry=5 is not allowed: a JSON object"),
    ("taps.0.shape", 5, "tap #0: shape=5 is not allowed"),
    ("taps.0.slot", "none", "tap #0: slot='none' is not allowed"),
    ("taps.0.cta", [1, 2, 3], "tap #0: cta=[1, 2, 3] is not allowed"),
])
def test_fields_of_the_wrong_type_or_range_are_named(tmp_path, path, value, message):
    with pytest.raises(DumpError, match=re.escape(message)):
        Recording.load(_with_meta(tmp_path, _set(path, value)))

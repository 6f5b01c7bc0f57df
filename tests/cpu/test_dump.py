import json
import struct

import pytest
import torch

from harness.dump import Dump, DumpError, load_dump, save_dump
from harness.taps import DescriptorRecord, Tap


def _dump():
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[::2] = True
    taps = (Tap("load_a", (0, 1), torch.arange(8, dtype=torch.float32).reshape(2, 4).to(torch.bfloat16), k_block=2,
                slot=1, cta=5),
            Tap("mma", (0, 1), torch.randn(4, 4), k_block=0, mask=mask),
            Tap("descriptor_b", (0, 1), torch.arange(16, dtype=torch.uint8), k_block=3),
            Tap("epilogue_cast", (1, 1), torch.randn(4, 4).to(torch.float8_e4m3fn)))
    desc = (DescriptorRecord("a", "bf16", (64, 32), (128,), (64, 16), (1, 1), 128, "zero"),)
    return Dump(inputs={"a": torch.randn(3, 5).to(torch.float8_e5m2), "b": torch.randn(5, 2)},
                outputs={"d": torch.randn(3, 2).half()}, taps=taps, descriptors=desc,
                meta={"problem": {"m": 3}, "note": "x"})


@pytest.mark.parametrize("name", ["run.safetensors", "run.safetensors.gz"])
def test_round_trip_keeps_everything(tmp_path, name):
    d = _dump()
    p = str(tmp_path / name)
    save_dump(p, d)
    if name.endswith(".gz"):
        assert open(p, "rb").read(2) == b"\x1f\x8b", "a .gz dump is a gzip stream"
    back = load_dump(p)
    assert back.meta == d.meta and back.descriptors == d.descriptors
    for name in ("a", "b"):
        assert back.inputs[name].dtype == d.inputs[name].dtype
        assert torch.equal(back.inputs[name].view(torch.uint8), d.inputs[name].view(torch.uint8))
    assert len(back.taps) == 4
    for x, y in zip(back.taps, d.taps):
        assert x.key == y.key and x.slot == y.slot and x.cta == y.cta
        assert x.values.dtype == y.values.dtype
        assert torch.equal(x.values.view(torch.uint8), y.values.view(torch.uint8))
        assert (x.mask is None) == (y.mask is None)
        if x.mask is not None:
            assert torch.equal(x.mask, y.mask)


def _rewrite_meta(path, fn):
    """Edit the JSON metadata inside a safetensors file in place."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    doc = json.loads(header["__metadata__"]["oracle.dump"])
    fn(doc, header)
    header["__metadata__"]["oracle.dump"] = json.dumps(doc)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])


@pytest.mark.parametrize("edit, message", [
    (lambda doc, h: doc.update(version=99), "version 99 is not supported"),
    (lambda doc, h: doc.update(format="other"), "expected 'oracle-dump'"),
    (lambda doc, h: doc["taps"][0].update(stage="warp_shuffle"), "unknown"),
    (lambda doc, h: doc["taps"][0].update(shape=[9, 9]), "says bfloat16 [9, 9]"),
    (lambda doc, h: doc["taps"][1].pop("k_block"), "lacks field"),
    (lambda doc, h: doc["taps"].pop(), "not described by the metadata"),
    (lambda doc, h: doc["taps"][0].update(tile=[-1, 0]), "non-negative"),
    (lambda doc, h: doc["descriptors"][0].update(swizzle=48), "swizzle 48"),
    (lambda doc, h: doc.update(taps="nope"), "'taps' must be a JSON list"),
    (lambda doc, h: doc["taps"].append(dict(doc["taps"][0])), "'tap.4.values'"),
])
def test_malformed_metadata_is_named(tmp_path, edit, message):
    p = str(tmp_path / "bad.safetensors")
    save_dump(p, _dump())
    _rewrite_meta(p, edit)
    with pytest.raises(DumpError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_dump(p)


def test_truncated_file(tmp_path):
    p = tmp_path / "cut.safetensors"
    save_dump(str(p), _dump())
    raw = p.read_bytes()
    p.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(DumpError, match="truncated or corrupt"):
        load_dump(str(p))


def test_truncated_gzip_dump(tmp_path):
    p = tmp_path / "cut.safetensors.gz"
    save_dump(str(p), _dump())
    raw = p.read_bytes()
    p.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(DumpError, match="truncated or corrupt"):
        load_dump(str(p))


def test_not_a_dump(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(p))
    with pytest.raises(DumpError, match="not written by this tool"):
        load_dump(str(p))
    (tmp_path / "garbage").write_bytes(b"\x00" * 3)
    with pytest.raises(DumpError):
        load_dump(str(tmp_path / "garbage"))
    with pytest.raises(DumpError, match="does not exist"):
        load_dump(str(tmp_path / "missing.safetensors"))

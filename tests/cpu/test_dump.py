import json
import os
import re
import stat
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
    (lambda doc, h: doc["taps"][0].update(stage="warp_shuffle"), "stage='warp_shuffle' is not allowed: one of"),
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


@pytest.mark.parametrize("name", ["cut.safetensors", "cut.safetensors.gz"])
def test_a_truncated_dump_plain_or_gzipped_is_refused(tmp_path, name):
    p = tmp_path / name
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


def _gzip_of_zeros(path, n_bytes: int) -> None:
    """A small gzip file that inflates to `n_bytes` zero bytes (a decompression bomb)."""
    import zlib

    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    with open(path, "wb") as f:
        for _ in range(n_bytes >> 20):
            f.write(c.compress(chunk))
        f.write(c.flush())


def test_a_gzip_bomb_is_stopped_at_the_limit(tmp_path, monkeypatch):
    import time
    import tracemalloc

    p = tmp_path / "bomb.safetensors.gz"
    _gzip_of_zeros(p, 1 << 30)  # about 1 MB that inflates to 1 GiB
    assert p.stat().st_size < 2 << 20
    monkeypatch.setenv("ORACLE_DUMP_MAX_MB", "16")
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        # read header first: eight zero bytes say the header is empty, and nothing more is inflated
        with pytest.raises(DumpError, match="the safetensors header is not valid JSON"):
            load_dump(str(p))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5 and peak < 64 << 20


def test_a_plain_dump_over_the_limit_is_refused_unread(tmp_path, monkeypatch):
    p = tmp_path / "big.safetensors"
    save_dump(str(p), _dump())
    monkeypatch.setenv("ORACLE_DUMP_MAX_MB", "1")
    with open(p, "ab") as f:
        f.truncate(2 << 20)
    with pytest.raises(DumpError, match=r"has 2097152 bytes, more than the 1 MiB limit of ORACLE_DUMP_MAX_MB"):
        load_dump(str(p))


def test_gzip_dumps_of_several_members_and_with_garbage(tmp_path):
    import gzip

    p = tmp_path / "run.safetensors.gz"
    save_dump(str(p), _dump())
    raw = gzip.decompress(p.read_bytes())
    two = tmp_path / "two.safetensors.gz"
    two.write_bytes(gzip.compress(raw[:100]) + gzip.compress(raw[100:]))
    assert load_dump(str(two)).meta == _dump().meta
    bad = tmp_path / "bad.safetensors.gz"
    bad.write_bytes(p.read_bytes() + b"garbage")
    with pytest.raises(DumpError, match="not a readable gzip stream"):
        load_dump(str(bad))


@pytest.mark.parametrize("edit, message", [
    (lambda doc, h: doc["descriptors"].__setitem__(0, 5), "descriptor #0: entry=5 is not allowed: a JSON object"),
    (lambda doc, h: doc["taps"][0].update(shape=5), "shape=5 is not allowed"),
    (lambda doc, h: doc["taps"][0].update(slot="none"), "slot='none' is not allowed"),
    (lambda doc, h: doc["taps"][0].update(cta=[1, 2, 3]), "cta=[1, 2, 3] is not allowed"),
    (lambda doc, h: doc["taps"][0].update(partial="none"), "partial='none' is not allowed"),
    (lambda doc, h: doc["taps"][0].update(tile=[True, 0]), "tile=[True, 0] is not allowed"),
    (lambda doc, h: doc["descriptors"][0].update(global_dims=["64", 32]), "global_dims=['64', 32] is not allowed"),
    (lambda doc, h: doc["descriptors"][0].update(dtype="fp64"), "dtype='fp64' is not allowed"),
    (lambda doc, h: doc["descriptors"][0].update(extra=1), "unknown field(s)=['extra']"),
    (lambda doc, h: doc.update(extra=1), "unknown metadata field(s) ['extra']"),
    (lambda doc, h: h["tap.0.values"].update(data_offsets=[0, 10 ** 12]), "data_offsets"),
    (lambda doc, h: h["tap.0.values"].update(shape=["2", 4]), "shape=['2', 4] is not allowed"),
])
def test_fields_of_the_wrong_type_are_named(tmp_path, edit, message):
    import gzip

    p = tmp_path / "bad.safetensors"
    save_dump(str(p), _dump())
    _rewrite_meta(str(p), edit)
    entry = "data_offsets" in message or "'2'" in message  # a tensor entry: safetensors names it in a plain file
    with pytest.raises(DumpError, match="not a readable safetensors file" if entry else re.escape(message)):
        load_dump(str(p))
    z = tmp_path / "bad.safetensors.gz"  # the gzip path checks the tensor entries itself
    z.write_bytes(gzip.compress(p.read_bytes()))
    with pytest.raises(DumpError, match=re.escape(message)):
        load_dump(str(z))


def test_metadata_nested_past_the_json_parser_is_a_dump_error(tmp_path):
    p = tmp_path / "deep.safetensors"
    save_dump(str(p), _dump())
    _rewrite_meta(str(p), lambda doc, h: None)
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["__metadata__"]["oracle.dump"] = "[" * 100000 + "]" * 100000
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    with pytest.raises(DumpError, match="is not valid JSON"):
        load_dump(str(p))


def _victim(tmp_path):
    """Another file of the user's, which a link planted by someone else points at."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    os.chmod(victim, 0o600)
    return victim


@pytest.mark.parametrize("name", ["run.safetensors", "run.safetensors.gz"])
def test_a_link_at_the_old_temporary_name_is_not_written_through(tmp_path, name):
    victim = _victim(tmp_path)
    dest = tmp_path / name
    for pid in {os.getpid(), os.getpid() + 1}:  # the name the old writer used
        os.symlink(victim, f"{dest}.tmp.{pid}")
    save_dump(str(dest), _dump())
    assert victim.read_bytes() == b"keep me" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not dest.is_symlink() and load_dump(str(dest)).meta["note"] == "x"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o666 & ~umask, "the mode open() would give it"
    assert sorted(p.name for p in tmp_path.iterdir() if ".tmp" not in p.name) == sorted([name, "victim"])


@pytest.mark.parametrize("kind", ["symbolic link", "FIFO", "directory"])
def test_a_destination_that_is_not_a_regular_file_is_refused_untouched(tmp_path, kind):
    victim = _victim(tmp_path)
    dest = tmp_path / "run.safetensors.gz"
    if kind == "symbolic link":
        os.symlink(victim, dest)
    elif kind == "FIFO":
        os.mkfifo(dest)
    else:
        dest.mkdir()
    with pytest.raises(DumpError, match=f"run.safetensors.gz.*it is a {kind}"):
        save_dump(str(dest), _dump())
    assert victim.read_bytes() == b"keep me" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert os.path.islink(dest) == (kind == "symbolic link") and os.path.lexists(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run.safetensors.gz", "victim"]), "nothing left"


def test_a_dump_replaces_a_regular_file_and_leaves_no_temporary(tmp_path):
    dest = tmp_path / "run.safetensors"
    dest.write_bytes(b"old")
    save_dump(str(dest), _dump())
    assert load_dump(str(dest)).meta["note"] == "x" and [p.name for p in tmp_path.iterdir()] == ["run.safetensors"]
    with pytest.raises(DumpError, match="cannot write dump"):
        save_dump(str(tmp_path / "missing" / "x.safetensors"), _dump())

"""Output files the user points somewhere (a JSON report, JSON lines, pictures; dumps in
test_dump.py) are written whole and never through a link, a FIFO or into a directory planted at
their name: the planted thing's target is untouched and the command says what is wrong."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from harness.output_files import OutputFileError, write_atomically, write_text_atomically


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_bytes(b"keep me")
    os.chmod(v, 0o600)
    yield v
    assert v.read_bytes() == b"keep me" and stat.S_IMODE(v.stat().st_mode) == 0o600, "the link's target changed"


def _plant(dest, kind, victim):
    if kind == "symbolic link":
        os.symlink(victim, dest)
    elif kind == "FIFO":
        os.mkfifo(dest)
    else:
        os.mkdir(dest)


def _bounded(fn):
    """fn() on a thread: a write that waits on a FIFO fails the test instead of hanging it."""
    out = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=60)
    assert out, "the write hung"
    return out[0]


@pytest.mark.parametrize("kind", ["symbolic link", "FIFO", "directory"])
def test_a_planted_destination_is_refused_and_left_as_it_was(tmp_path, victim, kind):
    dest = tmp_path / "out.json"
    _plant(dest, kind, victim)
    got = _bounded(lambda: write_text_atomically(dest, "{}\n", "JSON report"))
    assert isinstance(got, OutputFileError) and f"it is a {kind}" in str(got) and "out.json" in str(got)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"], "no temporary left"


def test_a_new_file_gets_the_mode_open_would_give_and_a_failed_write_leaves_nothing(tmp_path):
    dest = tmp_path / "out.json"
    write_text_atomically(dest, "one\n", "JSON report")
    umask = os.umask(0)
    os.umask(umask)
    assert dest.read_text() == "one\n" and stat.S_IMODE(dest.stat().st_mode) == 0o666 & ~umask

    def broken(f):
        f.write(b"half")
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError):
        write_atomically(dest, broken, "JSON report")
    assert dest.read_text() == "one\n" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    with pytest.raises(OutputFileError, match="cannot write JSON report"):
        write_text_atomically(tmp_path / "no" / "out.json", "x", "JSON report")


def test_the_json_report_is_not_written_through_a_link(tmp_path, victim, capsys):
    from oracle.tools.cli import main

    dest = tmp_path / "report.json"
    os.symlink(victim, dest)
    assert main(["compare", "--demo", "--quiet", "--json", str(dest)]) == 2
    assert "report.json" in capsys.readouterr().err and os.path.islink(dest)


def test_bench_json_lines_are_not_written_through_a_link(tmp_path, victim, capsys):
    from oracle.tools.cli import main

    cases = tmp_path / "c.toml"
    cases.write_text("[defaults]\ncase = 'missing.toml'\n[[case]]\nname = 'x'\n")
    dest = tmp_path / "rows.jsonl"
    os.symlink(victim, dest)
    assert main(["bench", "--cases", str(cases), "--workers", "1", "--jsonl", str(dest)]) == 2
    assert "rows.jsonl" in capsys.readouterr().err and os.path.islink(dest)


def test_a_picture_is_not_written_through_a_link_at_its_fixed_name(tmp_path, victim):
    from oracle.report.plots import _save

    class Figure:
        def tight_layout(self):
            pass

        def savefig(self, f, dpi, format, **layout):
            f.write(b"\x89PNG picture")

    class Pyplot:
        def close(self, fig):
            pass

    os.symlink(victim, tmp_path / "mma_k_blocks.png")
    with pytest.raises(OutputFileError, match="mma_k_blocks.png.*symbolic link"):
        _save(Figure(), Pyplot(), str(tmp_path), "mma_k_blocks.png")
    assert _save(Figure(), Pyplot(), str(tmp_path), "load_a_tiles.png").endswith("load_a_tiles.png")
    assert (tmp_path / "load_a_tiles.png").read_bytes() == b"\x89PNG picture"

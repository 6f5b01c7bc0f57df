"""A case file or reproducer folder from someone else cannot run a command, reach a file outside
the folder, or be copied into a reproducer: names and defines are held to harness.names' grammar
(exit 2, one line naming the field), `repro --out` writes only into a folder it created or one that
holds exactly its earlier reproducer (manifest.json, sha256 each), nothing is followed through a
symbolic link when a reproducer folder is written or read, only regular source files are copied,
reproducer tensors are sized from the problem, and repro.cu's own parser refuses malformed lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import build
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.run.inputs import Provenance, make_operands
from oracle.repro.generate import ReproError, write_repro
from oracle.repro.readback import load_repro_run
from host_programs import host_from, shared_host_programs  # tests/ is on sys.path
from cli_checks import one_error_line  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]
SIMPLE = ROOT / "harness" / "examples" / "simple_gemm.toml"
SIMPLE_CU = SIMPLE.parent / "simple_gemm.cu"


def _case_text(source: str = SIMPLE_CU.name, extra_kernel: str = "", entry: str = '"simple_gemm_bf16_traced"') -> str:
    text = SIMPLE.read_text().replace('source = "simple_gemm.cu"', f"source = {json.dumps(source)}")
    text = text.replace('entry = "simple_gemm_bf16_traced"', f"entry = {entry}")
    return text.replace("[launch]", extra_kernel + "\n[launch]", 1) if extra_kernel else text


def _toml(tmp_path: Path, text: str, name: str = "case.toml") -> Path:
    """The case file in tmp_path, with simple_gemm.cu beside it (a case names files inside its folder)."""
    if not (tmp_path / SIMPLE_CU.name).exists():
        shutil.copy(SIMPLE_CU, tmp_path / SIMPLE_CU.name)
    p = tmp_path / name
    p.write_text(text)
    return p


def _repro(case, out: Path):
    ops = make_operands(case.spec, "ones", 0)
    return write_repro(case, ops, Provenance("ones", None), out)


def _snapshot(d: Path) -> dict:
    """Every entry under d (links not followed) with its bytes or link target and mtime."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        if p.is_symlink():
            out[str(p.relative_to(d))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(d))] = ("file", p.read_bytes(), st.st_mtime_ns)
        else:
            out[str(p.relative_to(d))] = ("dir",)
    return out


@pytest.fixture
def simple_case():
    return load_case(str(SIMPLE))


# ---------------------------------------------------------------- values that reach make, nvcc, launch.txt


@pytest.mark.parametrize("value", ["1 $(shell touch PWNED)", "1; touch PWNED; true", "1\nall:\n\ttouch PWNED",
                                   "'1'", "1#", "a b", "$X", "`id`"])
def test_a_define_value_outside_the_grammar_is_refused_before_anything_is_written(tmp_path, capsys, value):
    toml = _toml(tmp_path, _case_text(extra_kernel=f"defines = {{ X = {json.dumps(value)} }}"))
    with pytest.raises(CaseError, match=r"defines\.X"):
        load_case(str(toml))
    out = tmp_path / "out"
    line = one_error_line(capsys, ["repro", "--problem", toml, "--inputs", "ones", "--out", out])
    assert "[kernel] defines.X" in line and repr(value) in line
    assert not out.exists() and not list(tmp_path.rglob("PWNED"))


def test_a_define_name_outside_the_grammar_is_refused(tmp_path):
    toml = _toml(tmp_path, _case_text(extra_kernel='defines = { "X$(shell id)" = 1 }'))
    with pytest.raises(CaseError, match="defines: name"):
        load_case(str(toml))


def test_the_live_build_refuses_a_define_outside_the_grammar_too():
    assert build.define_flags({"X": "1.5e+3", "Y": -2}) == ("-DX=1.5e+3", "-DY=-2")
    with pytest.raises(build.DefineError, match="define X"):
        build.define_flags({"X": "1 -o /tmp/elsewhere"})
    with pytest.raises(build.BuildError):
        build.define_flags({"X": "$(shell id)"})


def test_a_source_file_named_with_make_syntax_is_refused(tmp_path, capsys):
    src = tmp_path / "k$(shell touch PWNED).cu"
    shutil.copy(SIMPLE_CU, src)
    toml = _toml(tmp_path, _case_text(source=src.name))
    with pytest.raises(CaseError, match=r"\[kernel\] source"):
        load_case(str(toml))
    out = tmp_path / "out"
    one_error_line(capsys, ["repro", "--problem", toml, "--inputs", "ones", "--out", out])
    assert not out.exists() and not list(tmp_path.rglob("PWNED"))


def test_a_source_path_with_a_newline_isone_error_line(tmp_path, capsys):
    line = one_error_line(capsys, ["repro", "--kernel", str(tmp_path / "a\nb.cu"), "--entry", "k", "--problem",
                                    SIMPLE, "--inputs", "ones", "--out", tmp_path / "out"])
    assert "\\n" in line and "[kernel] source" in line


@pytest.mark.parametrize("entry", ["k\ncubin_traced /etc/passwd", "k x", "k;", "../k"])
def test_an_entry_name_that_is_not_an_identifier_cannot_reach_launch_txt(tmp_path, capsys, entry):
    toml = _toml(tmp_path, _case_text(entry=json.dumps(entry)))
    with pytest.raises(CaseError, match=r"\[kernel\] entry"):
        load_case(str(toml))
    out = tmp_path / "out"
    line = one_error_line(capsys, ["repro", "--problem", SIMPLE, "--entry", entry, "--inputs", "ones", "--out", out])
    assert "[kernel] entry" in line and not out.exists()


def test_a_later_launch_s_entry_is_held_to_the_grammar(tmp_path):
    text = _case_text() + '\n[[launch.next]]\nentry = "k\\ngrid 1 1 1"\ngrid = [1, 1, 1]\nblock = [1, 1, 1]\nargs = []\n'
    with pytest.raises(CaseError, match=r"\[\[launch.next\]\] #0 entry"):
        load_case(str(_toml(tmp_path, text)))


def test_a_grammatical_define_reaches_the_makefile_as_written_and_make_n_runs_nothing(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("This test needs make on PATH to read the Makefile, and it is not installed here.")
    toml = _toml(tmp_path, _case_text(extra_kernel='defines = { TILE_X = "1.5e+3", NEG = -2 }'))
    out = _repro(load_case(str(toml)), tmp_path / "r").path
    proc = subprocess.run(["make", "-n", "-C", str(out), "TRACE=1", "NVCC=nvcc"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    (nvcc_line,) = [line for line in proc.stdout.splitlines() if "-o kernel_traced.cubin" in line]
    assert "-DTILE_X=1.5e+3" in nvcc_line and "-DNEG=-2" in nvcc_line and "-DORACLE_TRACE=1" in nvcc_line


# ---------------------------------------------------------------- --out: only the oracle's own folder


def test_a_folder_with_a_bare_repro_json_is_refused_with_nothing_touched(tmp_path, simple_case):
    out = tmp_path / "mine"
    (out / "kernel" / "src").mkdir(parents=True)
    (out / "repro.json").write_text("{}")
    (out / "a.bin").write_bytes(b"precious")
    (out / "Makefile").write_text("my own Makefile\n")
    (out / "kernel" / "src" / "notes.txt").write_text("mine")
    before = _snapshot(out)
    with pytest.raises(ReproError, match="refused, nothing was touched") as e:
        _repro(simple_case, out)
    assert "\n" not in str(e.value)
    assert _snapshot(out) == before


def test_the_oracle_s_own_folder_is_replaced_build_outputs_and_all(tmp_path, simple_case):
    out = tmp_path / "r"
    first = _repro(simple_case, out)
    doc = json.loads((out / "manifest.json").read_text())
    assert set(doc["files"]) == set(first.files) - {"manifest.json"} and "repro.json" in doc["files"]
    for name in ("repro", "kernel_traced.cubin", "d.bin", "result.txt", "sink.bin"):  # what make and a run leave
        (out / name).write_bytes(b"built")
    _repro(simple_case, out)
    assert not (out / "d.bin").exists() and not (out / "repro").exists()
    assert json.loads((out / "manifest.json").read_text()) == doc


@pytest.mark.parametrize("change", ["extra file", "changed file", "bad manifest", "extra folder", "fifo"])
def test_a_reproducer_folder_that_is_not_exactly_the_oracle_s_is_refused(tmp_path, simple_case, change):
    out = tmp_path / "r"
    _repro(simple_case, out)
    if change == "extra file":
        (out / "notes.txt").write_text("mine")
    elif change == "changed file":
        (out / "kernel" / "src" / "simple_gemm.cu").write_text("// my edit\n")
    elif change == "bad manifest":
        (out / "manifest.json").write_text('{"format": "oracle-repro-manifest", "version": 1, "files": {"../x": 1}}')
    elif change == "extra folder":
        (out / "mine").mkdir()
    else:
        os.mkfifo(out / "pipe")
    before = _snapshot(out)
    with pytest.raises(ReproError, match="refused, nothing was touched"):
        _repro(simple_case, out)
    assert _snapshot(out) == before


def test_a_symlinked_out_folder_is_refused(tmp_path, simple_case):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ReproError, match="symbolic link"):
        _repro(simple_case, tmp_path / "link")
    assert not list(target.iterdir())


@pytest.mark.parametrize("name", ["README.txt", "kernel", "a.bin"])
def test_a_symlink_inside_a_reproducer_folder_is_refused_and_its_target_untouched(tmp_path, simple_case, name):
    out = tmp_path / "r"
    _repro(simple_case, out)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me")
    victim = outside if name == "kernel" else outside / "victim"
    p = out / name
    shutil.rmtree(p) if p.is_dir() else p.unlink()
    p.symlink_to(victim)
    before = _snapshot(outside)
    with pytest.raises(ReproError, match="symbolic link"):
        _repro(simple_case, out)
    assert _snapshot(outside) == before and p.is_symlink()


# ---------------------------------------------------------------- what is copied


def _kernel_dir(tmp_path: Path, header_text: str = "#pragma once\n") -> Path:
    d = tmp_path / "proj" / "kern"
    d.mkdir(parents=True)
    text = SIMPLE_CU.read_text()
    (d / "simple.cu").write_text('#include "used.cuh"\n' + text)
    (d / "used.cuh").write_text(header_text)
    (d / "unused.cuh").write_text("#pragma once\n")
    (d / "secret.txt").write_text("a key")
    return d


def test_only_the_translation_unit_and_the_headers_it_includes_are_copied_and_listed(tmp_path):
    d = _kernel_dir(tmp_path)
    case = load_case(str(_toml(tmp_path, _case_text(source="proj/kern/simple.cu"))))
    out = _repro(case, tmp_path / "r")
    copied = sorted(f for f in out.files if f.startswith("kernel/src/"))
    assert copied == ["kernel/src/simple.cu", "kernel/src/used.cuh"]
    readme = (out.path / "README.txt").read_text()
    assert "kernel/src/simple.cu  (from " in readme and "kernel/src/used.cuh  (from " in readme
    assert "secret" not in readme and "unused" not in readme
    listed = json.loads((out.path / "manifest.json").read_text())["files"]
    assert {"kernel/src/simple.cu", "kernel/src/used.cuh"} <= set(listed)


def test_a_pseudo_file_source_is_not_copied(tmp_path, capsys):
    toml = _toml(tmp_path, _case_text(source="/proc/self/environ"))
    out = tmp_path / "r"
    line = one_error_line(capsys, ["repro", "--problem", toml, "--inputs", "ones", "--out", out])
    assert "/proc" in line
    assert not out.exists() or not any(out.rglob("*"))


@pytest.mark.parametrize("what", ["source", "header"])
def test_a_linked_source_or_header_is_not_copied(tmp_path, what):
    d = _kernel_dir(tmp_path)
    secret = tmp_path / "secret.cuh"
    secret.write_text("// a secret\n")
    if what == "source":
        (d / "link.cu").symlink_to(d / "simple.cu")
        src = d / "link.cu"
    else:
        (d / "used.cuh").unlink()
        (d / "used.cuh").symlink_to(secret)
        src = d / "simple.cu"
    case = load_case(str(_toml(tmp_path, _case_text(source=str(src.relative_to(tmp_path))))))
    with pytest.raises(ReproError, match="symbolic link"):
        _repro(case, tmp_path / "r")
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*"))


def test_a_header_outside_the_source_s_tree_is_refused(tmp_path):
    d = _kernel_dir(tmp_path, header_text='#include "../../outside.h"\n')
    (tmp_path / "outside.h").write_text("// not the kernel's\n")
    case = load_case(str(_toml(tmp_path, _case_text(source="proj/kern/simple.cu"))))
    with pytest.raises(ReproError, match="outside"):
        _repro(case, tmp_path / "r")


# ---------------------------------------------------------------- reading a reproducer folder back


def _ran(tmp_path: Path, simple_case) -> Path:
    """A reproducer folder as a clean untraced run leaves it (result.txt, d.bin of the right size)."""
    out = _repro(simple_case, tmp_path / "r").path
    (out / "result.txt").write_text("status ok\ntraced 0\n")
    (out / "d.bin").write_bytes(bytes(2 * 200 * 136))
    return out


def test_compare_repro_dir_reads_a_clean_folder(tmp_path, simple_case):
    rec = load_repro_run(_ran(tmp_path, simple_case))
    assert rec.output is not None and tuple(rec.output.shape) == (200, 136)


@pytest.mark.parametrize("name", ["d.bin", "a.bin", "repro.json", "result.txt"])
def test_compare_repro_dir_does_not_follow_a_link_out_of_the_folder(tmp_path, simple_case, name):
    out = _ran(tmp_path, simple_case)
    elsewhere = tmp_path / "elsewhere.bin"
    shutil.copy(out / name, elsewhere)
    (out / name).unlink()
    (out / name).symlink_to(elsewhere)
    with pytest.raises(ReproError, match="symbolic link"):
        load_repro_run(out)


def test_compare_repro_dir_refuses_a_linked_folder(tmp_path, simple_case):
    out = _ran(tmp_path, simple_case)
    (tmp_path / "link").symlink_to(out)
    with pytest.raises(ReproError, match="symbolic link"):
        load_repro_run(tmp_path / "link")


def _claim(out: Path, name: str, storage_shape) -> None:
    doc = json.loads((out / "repro.json").read_text())
    doc["tensors"][name]["storage_shape"] = storage_shape
    (out / "repro.json").write_text(json.dumps(doc))


def test_a_tensor_s_size_comes_from_the_problem_not_its_claimed_storage_shape(tmp_path, simple_case):
    out = _ran(tmp_path, simple_case)
    _claim(out, "a", [2 ** 40, 2 ** 40])
    with pytest.raises(ReproError, match="storage_shape"):
        load_repro_run(out)


def test_a_sparse_3_gib_tensor_file_is_refused_before_it_is_read(tmp_path, simple_case):
    out = _ran(tmp_path, simple_case)
    n = 3 << 30
    with open(out / "a.bin", "r+b") as f:
        f.truncate(n)  # sparse: no disk is used
    _claim(out, "a", [n // 2 // 72, 72])  # its bytes as the file claims them, 200 rows in the problem
    with pytest.raises(ReproError, match="storage_shape"):
        load_repro_run(out)


# ---------------------------------------------------------------- repro.cu's own parser (built with nvcc)


@pytest.fixture(scope="module")
def host_program(tmp_path_factory) -> tuple[Path, Path]:
    """A reproducer of simple_gemm and its traced host program (no cubin: --dry-run needs none): the
    session's one build of it (tests/host_programs.py), by a reproducer's own Makefile."""
    shared = shared_host_programs(tmp_path_factory)
    d = tmp_path_factory.mktemp("host") / "r"
    _repro(load_case(str(SIMPLE)), d)
    host_from(shared, d, "repro_traced")
    exe = d.parent / "repro_traced"
    (d / "repro_traced").rename(exe)  # beside the reproducer, not in it: the tests copy its folder
    return d, exe


def _edited(src: Path, dst: Path, name: str, edit) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("kernel"))
    (dst / name).write_text(edit((dst / name).read_text()))
    return dst


@pytest.mark.nvcc
def test_the_host_program_reads_its_own_files(host_program, tmp_path):
    d, exe = host_program
    proc = subprocess.run([str(exe), "--dir", str(d), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.nvcc
@pytest.mark.parametrize("name, edit, message", [
    ("launch.txt", lambda t: t.replace("entry_traced simple_gemm_bf16_traced",
                                       "entry_traced simple_gemm_bf16_traced extra"), "takes 1 value"),
    ("launch.txt", lambda t: t.replace("entry_traced simple_gemm_bf16_traced",
                                       "entry_traced simple_gemm_bf16_traced\nentry_traced other"), "given twice"),
    ("launch.txt", lambda t: t.replace("cubin_traced kernel_traced.cubin", "cubin_traced ../../x.cubin"),
     "not a plain file name"),
    ("launch.txt", lambda t: t.replace("entry_traced simple_gemm_bf16_traced", "entry_traced k\r"),
     "control character"),
    ("launch.txt", lambda t: t.replace("grid ", "grid 1 ", 1), "takes 3 value"),
    ("launch.txt", lambda t: t.replace("arg ptr a", "arg bytes zz"), "not hex bytes"),
    ("inputs.txt", lambda t: t.replace("file=a.bin", "file=../a.bin"), "not a plain file name"),
    ("inputs.txt", lambda t: t + t.splitlines()[1] + "\n", "listed twice"),
])
def test_the_host_program_refuses_a_malformed_line(host_program, tmp_path, name, edit, message):
    d, exe = host_program
    bad = _edited(d, tmp_path / "bad", name, edit)
    proc = subprocess.run([str(exe), "--dir", str(bad), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr

"""What a case file may name (oracle.run.case_files): its kernel's files and extends stay inside its
folder unless the user gives --allow-outside-case-dir; a source or library is CUDA/C++ source text,
never an object, archive or FIFO; a cubin is a CUDA device image; a launch library (host code the
kernel's child runs) needs --allow-library; `repro` copies only checked sources. Everything here is
refused when the case is loaded, before anything is built, in bounded time."""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.tools import cli
from cli_checks import one_error_line  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "harness" / "examples"
SIMPLE = EXAMPLES / "simple_gemm.toml"
LIBRARY = EXAMPLES / "simple_gemm_lib.toml"
ELF_HOST = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", 3, 62) + bytes(44)  # x86-64 shared object
ELF_CUDA = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", 2, 190) + bytes(44)  # a cubin's header


def _folder(tmp_path: Path) -> Path:
    """A case folder: simple_gemm's case and source, and the launch library's, copied in."""
    d = tmp_path / "case"
    d.mkdir()
    for name in ("simple_gemm.toml", "simple_gemm.cu", "simple_gemm_lib.toml", "simple_gemm_lib.cu"):
        shutil.copy(EXAMPLES / name, d / name)
    return d


def _with(case: Path, key: str, value: str, name: str = "x.toml") -> Path:
    """`case` with its [kernel] source or library (or a cubin instead of the source) set to `value`."""
    text = case.read_text()
    if key == "library":
        text = text.replace('library = "simple_gemm_lib.cu"', f"library = {json.dumps(value)}")
    else:
        text = text.replace('source = "simple_gemm.cu"', f"{key} = {json.dumps(value)}")
    assert json.dumps(value) in text
    p = case.parent / name
    p.write_text(text)
    return p


def _case_with(d: Path, key: str, value: str, name: str = "x.toml") -> Path:
    return _with(d / ("simple_gemm_lib.toml" if key == "library" else "simple_gemm.toml"), key, value, name)


def _load(path: Path, **kwargs):
    return load_case(str(path), allow_library=True, **kwargs)


# ---------------------------------------------------------------- where the files may be


@pytest.mark.parametrize("key", ["source", "library", "cubin"])
@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_a_kernel_file_outside_the_case_folder_is_refused_unless_allowed(tmp_path, key, how):
    d = _folder(tmp_path)
    outside = tmp_path / ("k.cubin" if key == "cubin" else "k.cu")
    outside.write_bytes(ELF_CUDA if key == "cubin" else (EXAMPLES / "simple_gemm.cu").read_bytes())
    value = str(outside) if how == "absolute" else "../" + outside.name
    path = _case_with(d, key, value)
    with pytest.raises(CaseError, match=r"\[kernel\] " + key + r" = .*--allow-outside-case-dir") as e:
        _load(path)
    assert repr(value) in str(e.value) and ("absolute" in str(e.value) if how == "absolute" else "leads out of"
                                            in str(e.value))
    case = _load(path, allow_outside_case_dir=True)
    assert getattr(case.kernel, key) is not None and os.path.samefile(getattr(case.kernel, key), outside)


def test_a_link_that_leaves_the_case_folder_is_refused_one_inside_is_not(tmp_path):
    d = _folder(tmp_path)
    (tmp_path / "elsewhere.cu").write_text((EXAMPLES / "simple_gemm.cu").read_text())
    (d / "out.cu").symlink_to(tmp_path / "elsewhere.cu")
    (d / "in.cu").symlink_to(d / "simple_gemm.cu")
    with pytest.raises(CaseError, match=r"source = 'out.cu' goes through a symbolic link to .*elsewhere.cu"):
        _load(_case_with(d, "source", "out.cu"))
    assert _load(_case_with(d, "source", "in.cu")).kernel.source.endswith("in.cu")


@pytest.mark.parametrize("how", ["absolute", "two up"])
def test_extends_may_reach_one_folder_up_and_no_further(tmp_path, how):
    d = _folder(tmp_path)
    (d / "defects").mkdir()
    one_up = d / "defects" / "one_up.toml"
    one_up.write_text('extends = "../simple_gemm.toml"\n')
    assert _load(one_up).kernel.source == str(d / "simple_gemm.cu")  # the zoo's defects/ layout
    deep = d / "defects" / "deeper"
    deep.mkdir()
    value = str(d / "simple_gemm.toml") if how == "absolute" else "../../simple_gemm.toml"
    far = deep / "far.toml"
    far.write_text(f"extends = {json.dumps(value)}\n")
    with pytest.raises(CaseError, match=r"extends = .*--allow-outside-case-dir"):
        _load(far)
    assert _load(far, allow_outside_case_dir=True).kernel.source == str(d / "simple_gemm.cu")


@pytest.mark.parametrize("key", ["source", "extends"])
def test_a_path_with_a_control_character_is_a_case_error(tmp_path, key):
    d = _folder(tmp_path)
    path = d / "x.toml"
    path.write_text('extends = "a\\u0000b.toml"\n' if key == "extends" else
                    _case_with(d, "source", "a").read_text().replace('"a"', '"a\\u0000b.cu"'))
    with pytest.raises(CaseError, match=rf"{key} = 'a\\x00b.*' holds a control character"):
        _load(path)


def test_the_command_line_opt_in_reaches_the_case(tmp_path, capsys, monkeypatch):
    from oracle.run import sink

    d = _folder(tmp_path)
    path = _case_with(d, "source", str(d / "simple_gemm.cu"))
    line = one_error_line(capsys, ["compare", "--problem", path, "--inputs", "ones"])
    assert "--allow-outside-case-dir" in line and "is an absolute path" in line

    def reached(case):
        raise CaseError("the case was loaded")

    monkeypatch.setattr(sink, "check_case", reached)
    for command in (["compare"], ["repro", "--out", tmp_path / "r"]):
        line = one_error_line(capsys, [*command, "--problem", path, "--inputs", "ones", "--allow-outside-case-dir"])
        assert "the case was loaded" in line


# ---------------------------------------------------------------- what the files must be


@pytest.mark.parametrize("key", ["source", "library"])
@pytest.mark.parametrize("name, data, why", [
    ("evil.o", ELF_HOST, "must end in .cu"),
    ("libevil.so", ELF_HOST, "must end in .cu"),
    ("libevil.a", b"!<arch>\nevil.o/", "must end in .cu"),
    ("evil.cu", ELF_HOST, "is an ELF file"),
    ("evil.cpp", b"!<arch>\nevil.o/", "is an ar archive"),
    ("evil.cu", b"\x50\xed\x55\xba\x01\x00", "is a fatbin"),
    ("evil.cuh", b"// text\0 then binary", "NUL byte"),
])
def test_an_object_or_archive_named_as_source_or_library_is_refused(tmp_path, key, name, data, why):
    d = _folder(tmp_path)
    (d / name).write_bytes(data)
    with pytest.raises(CaseError, match=rf"\[kernel\] {key} = '.*{name}'.*{why}"):
        _load(_case_with(d, key, name))


def test_a_host_elf_named_as_cubin_is_refused_a_cuda_one_is_not(tmp_path):
    d = _folder(tmp_path)
    (d / "k.cubin").write_bytes(ELF_HOST)
    with pytest.raises(CaseError, match=r"\[kernel\] cubin = '.*k.cubin' is not a CUDA device image.*host object"):
        _load(_case_with(d, "cubin", "k.cubin"))
    (d / "k.cubin").write_bytes(ELF_CUDA)
    assert _load(_case_with(d, "cubin", "k.cubin")).kernel.cubin == str(d / "k.cubin")


def _loads_in_bounded_time(path: Path, seconds: float = 30.0):
    """load_case(path) on a thread: the exception it raised, or a test failure if it is still waiting
    after `seconds` (the FIFOs under the case folder are then opened for writing, to let it go)."""
    result = {}

    def run():
        try:
            _load(path)
            result["error"] = None
        except Exception as e:  # noqa: BLE001 - the test reads what it was
            result["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for fifo in path.parent.rglob("*"):
            if fifo.is_fifo():
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
        t.join(10)
        pytest.fail(f"loading {path} still waited after {seconds} s")
    return result["error"]


@pytest.mark.parametrize("key", ["source", "library", "cubin", "extends"])
def test_a_fifo_named_by_a_case_is_refused_without_waiting(tmp_path, key):
    d = _folder(tmp_path)
    name = {"source": "pipe.cu", "library": "pipe.cu", "cubin": "pipe.cubin", "extends": "pipe.toml"}[key]
    os.mkfifo(d / name)
    if key == "extends":
        path = d / "x.toml"
        path.write_text(f'extends = "{name}"\n')
    else:
        path = _case_with(d, key, name)
    error = _loads_in_bounded_time(path)
    assert isinstance(error, CaseError) and "is not a regular file" in str(error), error
    assert name in str(error)


def test_a_proc_file_is_refused_even_where_outside_files_are_allowed(tmp_path):
    d = _folder(tmp_path)
    with pytest.raises(CaseError, match=r"source = .*/proc/self/environ"):
        _load(_case_with(d, "source", "/proc/self/environ"), allow_outside_case_dir=True)


# ---------------------------------------------------------------- a launch library is opted into


def test_a_library_case_is_refused_without_the_opt_in_and_names_the_flag(tmp_path, capsys, monkeypatch):
    from oracle.run import sink

    with pytest.raises(CaseError, match=r"\[kernel\] library = .*simple_gemm_lib.cu.* host code .*--allow-library"):
        load_case(str(LIBRARY))
    assert load_case(str(LIBRARY), allow_library=True).kernel.library.endswith("simple_gemm_lib.cu")
    for command in (["compare"], ["repro", "--out", tmp_path / "r"]):
        line = one_error_line(capsys, [*command, "--problem", LIBRARY, "--inputs", "ones"])
        assert "--allow-library" in line and "host code" in line
    assert not (tmp_path / "r").exists()

    def reached(case):
        raise CaseError("the case was loaded")

    monkeypatch.setattr(sink, "check_case", reached)
    line = one_error_line(capsys, ["compare", "--problem", LIBRARY, "--inputs", "ones", "--allow-library"])
    assert "the case was loaded" in line


def test_the_python_api_needs_the_same_opt_in():
    from oracle.tools.api import run_live

    with pytest.raises(CaseError, match="allow_library=True"):
        run_live(str(LIBRARY), "ones")


def test_bench_refuses_a_library_case_unless_allowed(tmp_path, capsys, monkeypatch):
    import oracle.tools.bench as bench

    ran = []
    monkeypatch.setattr(bench, "run_case", lambda c: ran.append(c.name) or {"name": c.name, "verdict": "MATCH"})
    cases = tmp_path / "cases.toml"
    cases.write_text(f"[[case]]\nname = 'lib'\ncase = {json.dumps(str(LIBRARY))}\n")
    assert cli.main(["bench", "--cases", str(cases), "--workers", "1", "--no-time"]) == 2
    assert "lib: CaseError:" in capsys.readouterr().err and ran == []
    assert cli.main(["bench", "--cases", str(cases), "--workers", "1", "--no-time", "--allow-library"]) == 0
    assert ran == ["lib"]


# ---------------------------------------------------------------- what repro copies


@pytest.mark.parametrize("kernel", ["/etc/passwd", "id_ed25519", "evil.cu"])
def test_repro_of_a_file_that_is_not_a_source_copies_nothing(tmp_path, capsys, kernel):
    (tmp_path / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "evil.cu").write_bytes(ELF_HOST)
    path = kernel if kernel.startswith("/") else str(tmp_path / kernel)
    out = tmp_path / "r"
    line = one_error_line(capsys, ["repro", "--problem", SIMPLE, "--kernel", path, "--entry",
                                    "simple_gemm_bf16_traced", "--inputs", "ones", "--no-reference", "--out", out])
    assert "[kernel] source" in line and path in line and "not a CUDA/C++ source" in line
    assert not out.exists()


def test_repro_of_a_case_naming_a_file_outside_copies_nothing(tmp_path, capsys):
    d = _folder(tmp_path)
    path = _case_with(d, "source", "/etc/passwd")
    out = tmp_path / "r"
    line = one_error_line(capsys, ["repro", "--problem", path, "--inputs", "ones", "--no-reference", "--out", out])
    assert "'/etc/passwd' is an absolute path" in line and not out.exists()
    line = one_error_line(capsys, ["repro", "--problem", path, "--inputs", "ones", "--no-reference", "--out", out,
                                    "--allow-outside-case-dir"])
    assert "not a CUDA/C++ source" in line and not out.exists()


@pytest.mark.parametrize("header, data, why", [
    ("blob.bin", b"not a header", "must end in"),
    ("lib.cuh", ELF_HOST, "is an ELF file"),
    ("keys.h", b"ssh-ed25519\0AAAA", "NUL byte"),
])
def test_repro_copies_no_included_file_that_is_not_a_source(tmp_path, header, data, why):
    from oracle.repro.generate import ReproError, write_repro
    from oracle.run.inputs import Provenance, make_operands

    d = _folder(tmp_path)
    (d / header).write_bytes(data)
    (d / "k.cu").write_text(f'#include "{header}"\n' + (d / "simple_gemm.cu").read_text())
    case = _load(_case_with(d, "source", "k.cu"))
    out = tmp_path / "r"
    with pytest.raises(ReproError, match=rf"{header}.*#include \"{header}\".*{why}"):
        write_repro(case, make_operands(case.spec, "ones", 0), Provenance("ones", None), out, reference=False)
    assert not out.exists()


def test_repro_copies_a_host_elf_cubin_never(tmp_path):
    pass

    from oracle.repro.generate import ReproError, write_repro
    from oracle.run.inputs import Provenance, make_operands

    d = _folder(tmp_path)
    (d / "k.cubin").write_bytes(ELF_CUDA)
    case = _load(_case_with(d, "cubin", "k.cubin"))
    (d / "k.cubin").write_bytes(ELF_HOST)  # swapped after the case was loaded
    out = tmp_path / "r"
    with pytest.raises((ReproError, CaseError), match="not a CUDA device image"):
        write_repro(case, make_operands(case.spec, "ones", 0), Provenance("ones", None), out,
                    reference=False)
    assert not out.exists()

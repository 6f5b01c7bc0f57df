"""[kernel] include_dirs and nvcc_flags (oracle.run.kernel_flags): include dirs are folders inside the
case's folder (unless --allow-outside-case-dir), existing, with no link out; nvcc flags are held to an
allow-list and a refused one is named; both reach the build (its flags and its cache key)."""

from __future__ import annotations

import os
import shutil

import pytest

from oracle.run.case import CaseError, load_case
from oracle.run.kernel_flags import ALLOWED_FLAGS

SOURCE = '#include "deep.cuh"\nextern "C" __global__ void k_traced(int* p) { *p = DEEP_VALUE; }\n'


def _case(d, kernel_lines: str, name: str = "case.toml"):
    p = d / name
    p.write_text(f'[problem]\nm = 8\nn = 8\nk = 8\ntile = [8, 8, 8]\n[kernel]\nsource = "k.cu"\nentry = "k_traced"\n'
                 f'{kernel_lines}\n')
    return str(p)


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "case"
    (d / "inc").mkdir(parents=True)
    (d / "k.cu").write_text(SOURCE)
    (d / "inc" / "deep.cuh").write_text("#define DEEP_VALUE 7\n")
    return d


def test_include_dirs_inside_the_case_folder_are_resolved(folder):
    case = load_case(_case(folder, 'include_dirs = ["inc"]'))
    assert case.kernel.include_dirs == (str(folder / "inc"),)


@pytest.mark.parametrize("value, phrase", [("../out", "leads out of"), ("/usr/include", "absolute path"),
                                           ("nothing", "does not exist"), ("k.cu", "is not a directory"),
                                           ("link", "symbolic link")])
def test_an_include_dir_outside_missing_or_not_a_folder_is_refused(folder, tmp_path, value, phrase):
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", folder / "link")
    with pytest.raises(CaseError, match=phrase) as e:
        load_case(_case(folder, f'include_dirs = ["{value}"]'))
    assert "include_dirs[0]" in str(e.value)


def test_outside_include_dirs_need_the_opt_in(folder, tmp_path):
    (tmp_path / "out").mkdir()
    case = load_case(_case(folder, 'include_dirs = ["../out"]'), allow_outside_case_dir=True)
    assert case.kernel.include_dirs == (os.path.join(str(folder), "../out"),)


def test_a_link_inside_an_include_dir_that_leads_out_is_refused(folder, tmp_path):
    (tmp_path / "secret.h").write_text("#define X 1\n")
    os.symlink(tmp_path / "secret.h", folder / "inc" / "x.h")
    with pytest.raises(CaseError, match="x.h.*symbolic link.*outside"):
        load_case(_case(folder, 'include_dirs = ["inc"]'))
    os.symlink(folder / "k.cu", folder / "inc" / "inside.h")  # a link that stays inside is fine
    os.remove(folder / "inc" / "x.h")
    assert load_case(_case(folder, 'include_dirs = ["inc"]')).kernel.include_dirs


def test_a_base_include_dir_stays_relative_to_the_base(folder):
    sub = folder / "defects"
    sub.mkdir()
    _case(folder, 'include_dirs = ["inc"]', "base.toml")
    (sub / "d.toml").write_text('extends = "../base.toml"\n[kernel]\nentry = "k_traced"\n')
    assert load_case(str(sub / "d.toml")).kernel.include_dirs == (str(folder / "inc"),)


@pytest.mark.parametrize("flag", ["-lineinfo", "--maxrregcount=128", "-Xptxas=-v", "--use_fast_math", "-std=c++20",
                                  "--diag-suppress=177,550", "-Xcudafe=--diag_suppress=esa_on_defaulted_function_ignored"])
def test_allowed_flags_are_kept(folder, flag):
    assert load_case(_case(folder, f'nvcc_flags = ["{flag}"]')).kernel.nvcc_flags == (flag,)


@pytest.mark.parametrize("flag, why", [
    ("-ccbin=/tmp/evil", "runs another program"), ("--compiler-bindir=/tmp", "runs another program"),
    ("-Xcompiler=-fplugin=/tmp/p.so", "load plugins"), ("--compiler-options=-wrapper,/bin/sh", "load plugins"),
    ("--pre-include=/etc/passwd", "includes a file"), ("-o", "writes files"), ("--output-file=/tmp/x", "writes files"),
    ("--run", "runs the program"), ("-lcuda", "links or loads"), ("-L/tmp", "links or loads"),
    ("--linker-options=-rpath", "links or loads"), ("--options-file=/tmp/f", "reads more flags"),
    ("@/tmp/flags", "response file"), ("-I/etc", "include_dirs"), ("-DX=1", "defines"),
    ("--keep", "writes files"), ("--bogus", "not on the allow-list"), ("--maxrregcount=x", "takes a value"),
    ("-lineinfo=1", "takes no value")])
def test_a_flag_that_runs_loads_or_writes_is_refused_by_name(folder, flag, why):
    with pytest.raises(CaseError, match=why) as e:
        load_case(_case(folder, f'nvcc_flags = ["{flag}"]'))
    assert f"nvcc_flags[0] = {flag!r}" in str(e.value)


def test_a_flag_that_is_not_a_string_is_refused_naming_its_place(folder):
    with pytest.raises(CaseError, match=r"\[kernel\] nvcc_flags\[1\] = 5 is not allowed: one flag, its value joined"):
        load_case(_case(folder, 'nvcc_flags = ["-lineinfo", 5]'))


def test_the_allow_list_holds_nothing_that_runs_or_links():
    refused = {"-ccbin", "--compiler-bindir", "-Xcompiler", "--compiler-options", "-o", "--output-file", "-l", "-L",
               "-I", "-D", "--run", "--options-file", "-optf", "--pre-include", "-include", "-Xlinker", "--keep"}
    assert not refused & set(ALLOWED_FLAGS)


def test_a_prebuilt_cubin_takes_no_build_options(folder):
    shutil.copy(folder / "k.cu", folder / "k.cubin")
    p = folder / "c.toml"
    p.write_text('[problem]\nm = 8\nn = 8\nk = 8\n[kernel]\ncubin = "k.cubin"\nentry = "k"\nnvcc_flags = ["-lineinfo"]\n')
    with pytest.raises(CaseError):  # not a device image, or no build to flag: refused either way
        load_case(str(p))


def test_the_options_reach_the_traced_build(folder, monkeypatch):
    """run_live hands include_dirs and nvcc_flags to build_cubin (stopped there: no GPU needed)."""
    from oracle.run import live
    from oracle.run.inputs import Provenance, make_operands

    seen = {}

    class Stop(Exception):
        pass

    class FakeLaunch:
        args = ()

    def fake_build(source, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(live, "build_cubin", fake_build)
    monkeypatch.setattr(live, "check_case", lambda case: (None, 0))
    monkeypatch.setattr(live, "launch_sequence", lambda case, ops: ([("k_traced", FakeLaunch())], {}))
    monkeypatch.setattr(live, "require_gpu", lambda: None)  # the build is faked: so is the GPU
    case = load_case(_case(folder, 'include_dirs = ["inc"]\nnvcc_flags = ["--maxrregcount=64"]'))
    with pytest.raises(Stop):
        live.run_live(case, make_operands(case.spec, "ones"), Provenance("ones"))
    assert seen["include_dirs"] == (str(folder / "inc"),) and seen["extra_flags"] == ("--maxrregcount=64",)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed, so nothing can be built.")
def test_the_untraced_build_finds_the_header_and_keys_on_the_flags(folder):
    from oracle.run.races import untraced_build

    with pytest.raises(Exception, match="deep.cuh"):  # without the include dir the header is not found
        untraced_build(load_case(_case(folder, "")))
    a = load_case(_case(folder, 'include_dirs = ["inc"]\nnvcc_flags = ["--maxrregcount=64"]'))
    b = load_case(_case(folder, 'include_dirs = ["inc"]\nnvcc_flags = ["--maxrregcount=32"]'))
    cubin_a, _ = untraced_build(a)
    cubin_b, _ = untraced_build(b)
    assert cubin_a[:4] == b"\x7fELF" and cubin_a != cubin_b
    from harness.build import build_cubin

    keys = {build_cubin(str(folder / "k.cu"), arch=c.kernel.arch, include_dirs=c.kernel.include_dirs,
                        extra_flags=c.kernel.nvcc_flags).key for c in (a, b)}
    assert len(keys) == 2

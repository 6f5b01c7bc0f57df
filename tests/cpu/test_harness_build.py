"""The build cache, with a stand-in nvcc that counts its invocations, and real nvcc compiles
(marker `nvcc`) of a tiny kernel and of the GPU tier's kernel sources."""

import importlib.util
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from harness import build
from harness.build import BuildError, build_cubin, load_cubin

FAKE_NVCC = r'''#!{python}
import hashlib, os, sys, time
log = os.environ["FAKE_NVCC_LOG"]
args = sys.argv[1:]
if args == ["--version"]:
    with open(log, "a") as f:
        f.write("version\n")
    print("Cuda compilation tools, release 99.0 (stand-in)")
    sys.exit(0)
with open(log, "a") as f:
    f.write("compile\n")
src = args[-1]
out = args[args.index("-o") + 1]
text = open(src).read()
if "#error" in text:
    print(f"{{src}}(3): error: this source does not compile", file=sys.stderr)
    sys.exit(2)
started = time.time()
time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "0")))
if os.environ.get("FAKE_NVCC_SPANS"):
    with open(os.environ["FAKE_NVCC_SPANS"], "a") as f:
        f.write(f"{{started}} {{time.time()}}\n")
with open(out, "wb") as f:
    f.write(b"\x7fELF" + hashlib.sha256((" ".join(args) + text).encode()).digest())
print("remark: stand-in compile", file=sys.stderr)
'''

KERNEL = '''#include "local.cuh"
extern "C" __global__ void k(float* x) { x[threadIdx.x] = LOCAL_VALUE; }
'''


@pytest.fixture
def fake(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "nvcc.log"
    log.write_text("")
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("ORACLE_NVCC", raising=False)
    monkeypatch.setenv("ORACLE_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "local.cuh").write_text("#define LOCAL_VALUE 1.0f\n")
    (src / "k.cu").write_text(KERNEL)

    class Fake:
        path = nvcc
        source = src / "k.cu"
        header = src / "local.cuh"
        cache = tmp_path / "cache"

        @staticmethod
        def calls():
            return log.read_text().split()

    return Fake


def test_second_build_runs_no_nvcc_at_all(fake):
    first = build_cubin(fake.source)
    assert not first.cached
    assert fake.calls() == ["version", "compile"]
    assert first.cubin_path.is_file() and first.cubin_path.is_relative_to(fake.cache)
    assert "stand-in compile" in first.log
    second = build_cubin(fake.source)
    assert second.cached and second.key == first.key and second.cubin_path == first.cubin_path
    assert fake.calls() == ["version", "compile"]  # not even nvcc --version
    assert second.log == first.log
    assert second.read() == first.read()


def test_the_command_line(fake):
    res = build_cubin(fake.source, defines={"TILE": 128, "TRACE": None}, include_dirs=[fake.header.parent])
    cmd = res.command
    assert "-cubin" in cmd and "-gencode=arch=compute_90a,code=sm_90a" in cmd
    for flag in ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-DTILE=128", "-DTRACE"):
        assert flag in cmd
    assert f"-I{build.HARNESS_INCLUDE_DIR}" in cmd
    for d in build.cutlass_include_dirs():
        assert f"-I{d}" in cmd


def _cutlass_tree(root: Path, gemm: str = "// the GEMM\n") -> tuple[Path, Path]:
    """A stand-in for a venv's nvidia-cutlass headers: (include, tools/util/include)."""
    inc, util = root / "cutlass" / "include", root / "cutlass" / "tools" / "util" / "include"
    (inc / "cute").mkdir(parents=True)
    (inc / "cute" / "tensor.hpp").write_text("// CuTe\n")
    (inc / "gemm.h").write_text(gemm)
    util.mkdir(parents=True)
    (util / "helper.h").write_text("// a helper\n")
    return inc, util


def test_a_hit_names_this_environment_s_folders(fake, tmp_path, monkeypatch):
    """The key is content, not paths: an entry built from another environment (another venv's CUTLASS
    wheel with the same headers, another checkout) is a hit, and its command is the one this environment
    runs, naming this environment's include folders, never the other's."""
    monkeypatch.setattr(build, "cutlass_version", lambda: "4.2.0")
    venv_a, venv_b = _cutlass_tree(tmp_path / "venv_a"), _cutlass_tree(tmp_path / "venv_b")
    monkeypatch.setattr(build, "cutlass_include_dirs", lambda: venv_a)
    first = build_cubin(fake.source)
    assert f"-I{venv_a[0]}" in first.command
    monkeypatch.setattr(build, "cutlass_include_dirs", lambda: venv_b)
    second = build_cubin(fake.source)
    assert second.cached and second.key == first.key
    assert f"-I{venv_b[0]}" in second.command and f"-I{venv_b[1]}" in second.command
    assert not any("venv_a" in word for word in second.command)
    assert second.command[second.command.index("-o") + 1] == str(second.cubin_path)


@pytest.mark.parametrize("change", ["edited", "added", "removed", "moved"])
def test_other_cutlass_headers_of_the_same_version_are_another_build(fake, tmp_path, monkeypatch, change):
    """The same wheel version with other headers (patched, edited in place, another layout) is not the
    same build; the digest kept in the cache is found again by the folders' sizes and mtimes."""
    monkeypatch.setattr(build, "cutlass_version", lambda: "4.2.0")
    ours = _cutlass_tree(tmp_path / "venv_a")
    monkeypatch.setattr(build, "cutlass_include_dirs", lambda: ours)
    first = build_cubin(fake.source)
    assert build_cubin(fake.source).cached
    gemm = ours[0] / "gemm.h"
    if change == "edited":  # the same size, so only the mtime tells
        st = gemm.stat()
        gemm.write_text("// the GEMX\n")
        os.utime(gemm, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    elif change == "added":
        (ours[0] / "cute" / "new.hpp").write_text("// new\n")
    elif change == "removed":
        (ours[1] / "helper.h").unlink()
    else:  # the same files, one of them in the other folder
        (ours[1] / "helper.h").rename(ours[0] / "helper.h")
    second = build_cubin(fake.source)
    assert not second.cached and second.key != first.key
    assert fake.calls().count("compile") == 2


def test_the_cutlass_headers_digest_is_kept_between_processes(fake, tmp_path, monkeypatch):
    """Reading the headers again is what the kept digest saves: a second process (the memo read from the
    cache, nothing cached in memory) finds it without opening a header."""
    monkeypatch.setattr(build, "cutlass_version", lambda: "4.2.0")
    ours = _cutlass_tree(tmp_path / "venv_a")
    monkeypatch.setattr(build, "cutlass_include_dirs", lambda: ours)
    first = build_cubin(fake.source)
    opened = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: opened.append(self) or real(self))
    assert build_cubin(fake.source).key == first.key
    assert not [p for p in opened if "venv_a" in str(p)], opened


@pytest.mark.parametrize("change", ["define", "flag", "arch", "source", "local_header", "include_tree",
                                    "trace_version", "nvcc"])
def test_every_key_part_invalidates(fake, change, tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    (inc / "oracle_trace").mkdir(parents=True)
    (inc / "oracle_trace" / "trace.cuh").write_text("#define ORACLE_TRACE_VERSION 1\n")
    monkeypatch.setattr(build, "HARNESS_INCLUDE_DIR", inc)
    monkeypatch.setattr(build, "TRACE_HEADER", inc / "oracle_trace" / "trace.cuh")
    kwargs = dict(defines={"A": 1})
    first = build_cubin(fake.source, **kwargs)
    if change == "define":
        kwargs = dict(defines={"A": 2})
    elif change == "flag":
        kwargs["extra_flags"] = ["-G"]
    elif change == "arch":
        kwargs["arch"] = "sm_100a"
    elif change == "source":
        fake.source.write_text(KERNEL + "// edited\n")
    elif change == "local_header":
        fake.header.write_text("#define LOCAL_VALUE 2.0f\n")
    elif change == "include_tree":
        (inc / "other.cuh").write_text("// a new header in the harness include tree\n")
    elif change == "trace_version":
        (inc / "oracle_trace" / "trace.cuh").write_text("#define ORACLE_TRACE_VERSION 2\n")
    elif change == "nvcc":
        # Another nvcc (a new file: its size and mtime change) that reports another version.
        fake.path.write_text(fake.path.read_text().replace("99.0", "99.1 (an update)"))
    second = build_cubin(fake.source, **kwargs)
    assert not second.cached and second.key != first.key
    assert fake.calls().count("compile") == 2


def test_nested_local_headers_are_hashed(fake):
    fake.header.write_text('#include "deeper.cuh"\n')
    deeper = fake.header.parent / "deeper.cuh"
    deeper.write_text("#define LOCAL_VALUE 1.0f\n")
    first = build_cubin(fake.source)
    deeper.write_text("#define LOCAL_VALUE 3.0f\n")
    assert build_cubin(fake.source).key != first.key


def test_source_text_and_include_dirs(fake):
    text = '#include "local.cuh"\n' + KERNEL
    first = build_cubin(text, include_dirs=[fake.header.parent])
    assert not first.cached
    assert build_cubin(text, include_dirs=[fake.header.parent]).cached
    fake.header.write_text("#define LOCAL_VALUE 5.0f\n")
    assert not build_cubin(text, include_dirs=[fake.header.parent]).cached


def test_compile_error_carries_nvcc_stderr(fake):
    bad = fake.source.with_name("bad.cu")
    bad.write_text("#error no\n")
    with pytest.raises(BuildError) as info:
        build_cubin(bad)
    assert "this source does not compile" in info.value.stderr
    assert "this source does not compile" in str(info.value)
    assert info.value.command[-1] == str(bad.resolve())
    assert not list(fake.cache.rglob("*.cubin"))


def test_missing_source_and_missing_nvcc(fake, monkeypatch):
    with pytest.raises(BuildError, match="cannot read"):
        build_cubin(fake.source.with_name("nope.cu"))
    monkeypatch.setenv("ORACLE_NVCC", "definitely-not-nvcc")
    with pytest.raises(BuildError, match="nvcc not found"):
        build_cubin(fake.source)


def test_concurrent_builds_of_one_key_compile_once_and_never_see_half_a_cubin(fake, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.3")
    results, errors = [], []

    def work():
        try:
            results.append(build_cubin(fake.source))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    datas = {r.read() for r in results}
    assert len(datas) == 1 and len({r.key for r in results}) == 1
    assert fake.calls().count("compile") == 1 and sorted(r.cached for r in results) == [False, True, True, True]
    assert not [p for p in fake.cache.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("oracle-build-")]


def test_the_key_lock_follows_no_link_and_waits_on_no_fifo(fake, tmp_path):
    first = build_cubin(fake.source)
    lock = first.cubin_path.with_suffix(".lock")
    assert lock.is_file() and not lock.is_symlink()
    victim = tmp_path / "victim"
    for plant in ("link", "fifo"):
        first.cubin_path.unlink()  # a miss: the next build takes the lock
        lock.unlink()
        if plant == "link":
            lock.symlink_to(victim)
        else:
            os.mkfifo(lock)
        # In the user's own cache the bad file is replaced by a lock of its own: built again.
        assert build_cubin(fake.source).cubin_path == first.cubin_path
        assert not victim.exists(), plant  # the link's target is neither created nor touched
        assert stat.S_ISREG(lock.lstat().st_mode) and stat.S_IMODE(lock.lstat().st_mode) == 0o600, plant
    assert fake.calls().count("compile") == 3


def _most_at_once(spans: Path) -> int:
    events = sorted((float(t), +1 if i == 0 else -1) for line in spans.read_text().split("\n") if line
                    for i, t in enumerate(line.split()))
    running = most = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at one instant
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("jobs", [1, 2, 4])
def test_at_most_build_jobs_compiles_run_at_once(fake, monkeypatch, tmp_path, jobs):
    spans = tmp_path / f"spans{jobs}"
    monkeypatch.setenv("FAKE_NVCC_SPANS", str(spans))
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.4")
    monkeypatch.setenv("ORACLE_BUILD_JOBS", str(jobs))
    errors = []

    def work(i):
        try:
            build_cubin(fake.source, defines={"VARIANT": i})  # four keys: no build lock shared
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and fake.calls().count("compile") == 4
    assert _most_at_once(spans) == jobs  # never more, and the slots are used
    assert sorted(p.name for p in (fake.cache / "build-slots").iterdir()) == [f"{i}.lock" for i in range(jobs)]


def test_a_build_slot_follows_no_link(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("ORACLE_BUILD_JOBS", "1")
    slots = fake.cache / "build-slots"
    slots.mkdir(parents=True)
    victim = tmp_path / "victim"
    (slots / "0.lock").symlink_to(victim)
    build_cubin(fake.source)  # the link is replaced by a slot file of its own, never followed
    assert not victim.exists() and stat.S_ISREG((slots / "0.lock").lstat().st_mode)


def test_arch_and_define_flags():
    assert build.arch_flags("sm_90a") == ("-gencode=arch=compute_90a,code=sm_90a",)
    assert build.arch_flags("sm_100f") == ("-gencode=arch=compute_100f,code=sm_100f",)
    with pytest.raises(ValueError, match="arch"):
        build.arch_flags("hopper")
    assert build.define_flags({"B": 2, "A": None, "C": False}) == ("-DA", "-DB=2", "-DC=0")
    with pytest.raises(ValueError, match="identifier"):
        build.define_flags({"1X": 1})


def test_load_cubin_checks_the_magic(tmp_path):
    good = tmp_path / "k.cubin"
    good.write_bytes(b"\x7fELF" + b"\0" * 60)
    assert load_cubin(good)[:4] == b"\x7fELF"
    bad = tmp_path / "k.ptx"
    bad.write_text(".version 8.0\n")
    with pytest.raises(BuildError, match="not a cubin"):
        load_cubin(bad)


def test_cutlass_headers_are_found_when_installed():
    dirs = build.cutlass_include_dirs()
    if importlib.util.find_spec("cutlass_library") is None:
        assert dirs == ()
    else:
        assert (dirs[0] / "cute" / "tensor.hpp").is_file()
        assert (dirs[0] / "cutlass" / "cutlass.h").is_file()


# --------------------------------------------------------------------------- real nvcc

TINY = 'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.mark.nvcc
def test_real_nvcc_builds_and_caches(tmp_path):
    first = build_cubin(TINY, cache_dir=tmp_path)
    assert not first.cached and first.read()[:4] == b"\x7fELF"
    second = build_cubin(TINY, cache_dir=tmp_path)
    assert second.cached and second.cubin_path == first.cubin_path


@pytest.mark.nvcc
def test_real_nvcc_error_is_reported(tmp_path):
    with pytest.raises(BuildError) as info:
        build_cubin('extern "C" __global__ void broken() { undeclared_thing = 1; }\n', cache_dir=tmp_path)
    assert "undeclared_thing" in info.value.stderr


def _gpu_test_module():
    path = Path(__file__).resolve().parent.parent / "gpu" / "test_harness_gpu.py"
    spec = importlib.util.spec_from_file_location("_harness_gpu_sources", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.nvcc
@pytest.mark.slow
def test_gpu_tier_kernels_compile_here(tmp_path):
    """The GPU tier compiles these on the H200; compiling them here first keeps GPU time for running."""
    res = build_cubin(_gpu_test_module().KERNELS, cache_dir=tmp_path)
    assert res.read()[:4] == b"\x7fELF"


@pytest.mark.nvcc
@pytest.mark.slow
def test_cute_header_compiles_from_the_wheel(tmp_path):
    if not build.cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel is not installed, so there are no CuTe headers to compile against.")
    text = ('#include <cute/tensor.hpp>\n'
            'extern "C" __global__ void k(float* x) {\n'
            '  auto t = cute::make_tensor(cute::make_gmem_ptr(x), cute::make_shape(cute::Int<4>{}, cute::Int<8>{}));\n'
            '  t(threadIdx.x % 4, threadIdx.x / 4) = 1.0f;\n}\n')
    assert build_cubin(text, cache_dir=tmp_path).read()[:4] == b"\x7fELF"


def test_trace_header_version_is_read(tmp_path, monkeypatch):
    header = tmp_path / "trace.cuh"
    monkeypatch.setattr(build, "TRACE_HEADER", header)
    assert build.trace_header_version() == "absent"
    header.write_text("namespace oracle_trace {\nconstexpr uint32_t kVersion = 3u;\n}\n")
    assert build.trace_header_version() == "3u"
    header.write_text("#define ORACLE_TRACE_VERSION 7\n")
    assert build.trace_header_version() == "7"
    header.write_text("// nothing\n")
    assert build.trace_header_version() == "unversioned"

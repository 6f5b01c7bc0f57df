"""The build cache against another user of the machine: a cache folder they could write is refused,
an entry planted at a key's path (other bytes, a link, another owner, a mode others can write) is
never used and is rebuilt, the nvcc version memo is checked the same way, lock and slot files are
never followed or waited on forever, failed builds are cached by content, and what a run loads is
the bytes that were verified. Real nvcc, one tiny kernel built once per module (a cubin and a
library) into a cache that each test copies; other users are played with os.chown (the tests run
as root) or skipped with a reason."""

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

import pytest

from harness import build, runner
from harness.build import BuildError, CacheDirError, LockTimeoutError, build_cubin, build_library, build_slot
from harness.launch_abi import LibraryCall

TINY = 'extern "C" __global__ void tiny(float* x) { x[threadIdx.x] *= 2.0f; }\n'
BROKEN = 'extern "C" __global__ void broken(float* x) { x[0] = undeclared_thing; }\n'
PLANTED = b"\x7fELF planted by another user: a constructor that must never run"
STRANGER = 12345  # a uid that is not this user's

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="Playing another user's file needs os.chown, "
                                                          "which only root may do.")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A cache holding the tiny kernel's cubin and library, built once."""
    if shutil.which("nvcc") is None:
        pytest.skip("This test needs nvcc on PATH to compile CUDA, and it is not installed here.")
    cache = tmp_path_factory.mktemp("base") / "cache"
    return cache, build_cubin(TINY, cache_dir=cache), build_library(TINY, cache_dir=cache)


@pytest.fixture
def cache(base, tmp_path):
    """A copy of the module's cache (modes kept), with the cubin and library results of its builds."""
    src, cubin, library = base
    dst = tmp_path / "cache"
    shutil.copytree(src, dst, symlinks=True)
    moved = {}
    for res in (cubin, library):
        path = dst / res.cubin_path.relative_to(src)
        moved[path.suffix] = path
    return dst, moved[".cubin"], moved[".so"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _record(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


# --------------------------------------------------------------------------- folders and files


@pytest.mark.nvcc
def test_entries_are_0600_and_folders_0700(tmp_path):
    cache = tmp_path / "fresh"
    res = build_cubin(TINY, cache_dir=cache)
    folders = [p for p in [cache, *cache.rglob("*")] if p.is_dir()]
    files = [p for p in cache.rglob("*") if not p.is_dir()]
    assert {p.name for p in folders} >= {"fresh", "cubin", res.key[:2], "nvcc-version", "build-slots"}
    assert {p.name: _mode(p) for p in folders} == {p.name: 0o700 for p in folders}
    assert {p.suffix for p in files} == {".cubin", ".json", ".lock", ".txt"}
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert _record(res.cubin_path)["sha256"] == hashlib.sha256(res.cubin_path.read_bytes()).hexdigest()


@needs_root
@pytest.mark.parametrize("plant", ["foreign", "0777", "link"])
def test_a_cache_root_another_user_could_write_is_refused(tmp_path, plant):
    root = tmp_path / "shared-cache"
    if plant == "link":
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        root.symlink_to(theirs)
    else:
        root.mkdir(mode=0o700)
        if plant == "foreign":
            os.chown(root, STRANGER, -1)
        else:
            root.chmod(0o777)
    with pytest.raises(CacheDirError) as info:
        build_cubin(TINY, cache_dir=root)
    text = str(info.value)
    assert str(root) in text and "ORACLE_CACHE_DIR" in text and "private" in text
    expected = {"foreign": f"uid {STRANGER}", "0777": "mode 0777", "link": "symbolic link"}[plant]
    assert expected in text
    assert isinstance(info.value, BuildError)
    with pytest.raises(CacheDirError):  # the slots of such a cache are not used either
        with build_slot(root):
            pass
    assert not [p for p in (theirs if plant == "link" else root).iterdir()]  # nothing written there


@needs_root
@pytest.mark.parametrize("plant", ["foreign", "0777", "link"])
def test_a_sub_folder_another_user_could_write_is_refused(cache, tmp_path, plant):
    root, cubin, _ = cache
    kk = cubin.parent
    if plant == "link":
        theirs = tmp_path / "theirs"
        shutil.move(kk, theirs)
        kk.symlink_to(theirs)
    elif plant == "foreign":
        os.chown(kk, STRANGER, -1)
    else:
        kk.chmod(0o777)
    with pytest.raises(CacheDirError, match=re.escape(str(kk))):
        build_cubin(TINY, cache_dir=root)


# --------------------------------------------------------------------------- planted entries


def _plant(path: Path, plant: str, tmp_path: Path) -> None:
    """Put another user's file (or a link, or an open mode) at an entry's path."""
    if plant == "bytes":  # other bytes, the record left as it was
        path.write_bytes(PLANTED)
    elif plant == "link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_bytes(PLANTED)
        path.unlink()
        path.symlink_to(elsewhere)
    elif plant == "foreign":  # bytes and a record that agree, owned by someone else
        path.write_bytes(PLANTED)
        rec = _record(path)
        rec["sha256"] = hashlib.sha256(PLANTED).hexdigest()
        path.with_suffix(".json").write_text(json.dumps(rec))
        os.chown(path, STRANGER, -1)
    elif plant == "writable":  # bytes and record agree, but the group and others may write the file
        path.write_bytes(PLANTED)
        rec = _record(path)
        rec["sha256"] = hashlib.sha256(PLANTED).hexdigest()
        path.with_suffix(".json").write_text(json.dumps(rec))
        path.chmod(0o666)
    elif plant == "record-link":  # the record a link to a forged one that vouches for planted bytes
        path.write_bytes(PLANTED)
        rec = _record(path)
        rec["sha256"] = hashlib.sha256(PLANTED).hexdigest()
        forged = tmp_path / "forged.json"
        forged.write_text(json.dumps(rec))
        path.with_suffix(".json").unlink()
        path.with_suffix(".json").symlink_to(forged)
    else:
        raise AssertionError(plant)


PLANTS = ["bytes", "link", pytest.param("foreign", marks=needs_root), "writable", "record-link"]


def _assert_rebuilt(res, path: Path) -> None:
    assert not res.cached and res.cubin_path == path
    data = res.read()
    assert data != PLANTED and data[:4] == b"\x7fELF"
    assert path.read_bytes() == data and not path.is_symlink() and not path.with_suffix(".json").is_symlink()
    assert _mode(path) == 0o600 and path.stat().st_uid == os.geteuid()
    assert _record(path)["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.nvcc
@pytest.mark.parametrize("plant", PLANTS)
def test_a_planted_cubin_is_never_used_and_is_rebuilt(cache, tmp_path, plant):
    root, cubin, _ = cache
    _plant(cubin, plant, tmp_path)
    _assert_rebuilt(build_cubin(TINY, cache_dir=root), cubin)
    assert build_cubin(TINY, cache_dir=root).cached  # the rebuilt entry is a hit


@pytest.mark.nvcc
@pytest.mark.parametrize("plant", ["bytes", "link"])
def test_a_planted_library_is_never_used_and_is_rebuilt(cache, tmp_path, plant):
    root, _, library = cache
    _plant(library, plant, tmp_path)
    _assert_rebuilt(build_library(TINY, cache_dir=root), library)


@pytest.mark.nvcc
def test_a_planted_nvcc_version_memo_is_not_believed(cache):
    root, cubin, _ = cache
    (memo,) = (root / "nvcc-version").iterdir()
    real = memo.read_text()
    memo.write_text("Cuda compilation tools, planted\n")
    memo.chmod(0o666)
    res = build_cubin(TINY, cache_dir=root)
    assert res.cached and res.cubin_path == cubin  # the same key: the version was asked again
    assert memo.read_text() == real and _mode(memo) == 0o600


# --------------------------------------------------------------------------- what a run loads


@pytest.mark.nvcc
def test_a_run_loads_the_verified_bytes_not_the_path_again(cache, monkeypatch):
    root, cubin, library = cache
    res, lib = build_cubin(TINY, cache_dir=root), build_library(TINY, cache_dir=root)
    assert res.cached and lib.cached
    verified, verified_lib = cubin.read_bytes(), library.read_bytes()
    for path in (cubin, library):  # swapped after the check
        path.unlink()
        path.write_bytes(PLANTED)
    assert runner._as_cubin_bytes(res) == verified
    copied = []
    monkeypatch.setattr(runner, "_run_child", lambda name, image, *a, **k: copied.append(image))
    runner.run_library(lib, LibraryCall(m=1, n=1, k=1, tile=(1, 1, 1), tensors=()), {})
    assert copied == [verified_lib]
    # A result without its bytes (made by hand) is read from its path and checked against its digest.
    bare = build.BuildResult(cubin_path=cubin, cached=True, key=res.key, sha256=res.sha256)
    with pytest.raises(BuildError, match="changed since it was built"):
        bare.read()


# --------------------------------------------------------------------------- locks and slots


def _hold(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _in_thread(work, limit_s: float):
    """Run `work` on a thread: (finished within limit_s, its exception or None)."""
    out = {}

    def run():
        try:
            work()
        except BaseException as exc:  # handed to the test
            out["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    return (not t.is_alive()), out.get("exc"), t


@pytest.mark.nvcc
def test_a_held_build_lock_times_out_with_a_clear_error(cache, monkeypatch):
    root, cubin, _ = cache
    cubin.unlink()  # a miss: the build takes the key's lock
    lock = cubin.with_suffix(".lock")
    monkeypatch.setenv("ORACLE_BUILD_LOCK_TIMEOUT_S", "0.5")
    fd = _hold(lock)
    try:
        started = time.monotonic()
        done, exc, thread = _in_thread(lambda: build_cubin(TINY, cache_dir=root), 10)
        assert done, "the build still waits for the lock"
        assert time.monotonic() - started < 5
    finally:
        os.close(fd)
        thread.join()
    assert isinstance(exc, LockTimeoutError) and isinstance(exc, BuildError)
    text = str(exc)
    assert str(lock) in text and "ORACLE_BUILD_LOCK_TIMEOUT_S" in text and "0.5 s" in text
    assert f"process {os.getpid()}" in text  # /proc/locks names the holder


def test_a_held_build_slot_times_out_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ORACLE_BUILD_JOBS", "1")
    monkeypatch.setenv("ORACLE_BUILD_LOCK_TIMEOUT_S", "0.3")
    with build_slot(tmp_path / "cache"):
        pass
    fd = _hold(tmp_path / "cache" / "build-slots" / "0.lock")

    def take():
        with build_slot(tmp_path / "cache"):
            pass

    try:
        done, exc, thread = _in_thread(take, 10)
        assert done, "still waiting for a build slot"
    finally:
        os.close(fd)
        thread.join()
    assert isinstance(exc, LockTimeoutError)
    assert str(tmp_path / "cache" / "build-slots") in str(exc) and "ORACLE_BUILD_LOCK_TIMEOUT_S" in str(exc)


def _plant_lock(path: Path, plant: str, victim: Path) -> None:
    path.unlink(missing_ok=True)
    if plant == "link":
        path.symlink_to(victim)
    elif plant == "fifo":
        os.mkfifo(path)
    elif plant == "foreign":
        path.write_text("")
        os.chown(path, STRANGER, -1)
    else:
        path.write_text("")
        path.chmod(0o666)


LOCK_PLANTS = ["link", "fifo", pytest.param("foreign", marks=needs_root), "writable"]


@pytest.mark.parametrize("plant", LOCK_PLANTS)
def test_a_bad_slot_file_is_replaced_not_followed(tmp_path, monkeypatch, plant):
    monkeypatch.setenv("ORACLE_BUILD_JOBS", "1")
    monkeypatch.setenv("ORACLE_BUILD_LOCK_TIMEOUT_S", "2")
    cache = tmp_path / "cache"
    with build_slot(cache):
        pass
    slot = cache / "build-slots" / "0.lock"
    victim = tmp_path / "victim"

    def take():
        with build_slot(cache):
            pass

    for _ in range(2):  # not once, and not only the first time
        _plant_lock(slot, plant, victim)
        done, exc, thread = _in_thread(take, 10)
        assert done and exc is None, exc
        st = slot.lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
        assert not victim.exists()


@pytest.mark.nvcc
@pytest.mark.parametrize("plant", LOCK_PLANTS)
def test_a_bad_build_lock_is_replaced_not_followed(cache, tmp_path, monkeypatch, plant):
    root, cubin, _ = cache
    monkeypatch.setenv("ORACLE_BUILD_LOCK_TIMEOUT_S", "2")
    lock, victim = cubin.with_suffix(".lock"), tmp_path / "victim"
    cubin.unlink()
    _plant_lock(lock, plant, victim)
    done, exc, thread = _in_thread(lambda: build_cubin(TINY, cache_dir=root), 30)
    assert done and exc is None, exc
    st = lock.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert not victim.exists()


# --------------------------------------------------------------------------- failed builds


@pytest.fixture
def counting_nvcc(tmp_path, monkeypatch):
    """A wrapper around the real nvcc that counts its runs; `version` adds a line to `--version`."""
    log = tmp_path / "nvcc-runs"
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()

    def write(extra: str = "") -> None:
        wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                           f'if [ "$1" = --version ]; then {shutil.which("nvcc")} --version; echo "{extra}"; exit; fi\n'
                           f'exec {shutil.which("nvcc")} "$@"\n')
        wrapper.chmod(0o755)

    write()
    log.write_text("")
    monkeypatch.setenv("ORACLE_NVCC", str(wrapper))

    class Counting:
        version = staticmethod(write)

        @staticmethod
        def compiles() -> int:
            return sum(1 for line in log.read_text().splitlines() if line != "--version")

    return Counting


@pytest.mark.nvcc
def test_a_failed_build_is_cached_by_content(tmp_path, counting_nvcc):
    cache = tmp_path / "cache"
    with pytest.raises(BuildError) as first:
        build_cubin(BROKEN, cache_dir=cache)
    assert "undeclared_thing" in first.value.stderr and counting_nvcc.compiles() == 1
    with pytest.raises(BuildError) as again:
        build_cubin(BROKEN, cache_dir=cache)
    assert counting_nvcc.compiles() == 1  # failed at once, from the cache
    assert "undeclared_thing" in again.value.stderr and again.value.command == first.value.command
    (record,) = cache.rglob("*.json")
    assert "cached in" in str(again.value) and str(record) in str(again.value) and _mode(record) == 0o600
    # A changed source, changed flags or another nvcc miss: compiled again.
    with pytest.raises(BuildError):
        build_cubin(BROKEN + "// edited\n", cache_dir=cache)
    assert counting_nvcc.compiles() == 2
    with pytest.raises(BuildError):
        build_cubin(BROKEN, cache_dir=cache, defines={"X": 1})
    assert counting_nvcc.compiles() == 3
    counting_nvcc.version("an update")
    with pytest.raises(BuildError):
        build_cubin(BROKEN, cache_dir=cache)
    assert counting_nvcc.compiles() == 4


@pytest.mark.nvcc
def test_a_planted_failure_record_is_not_believed(tmp_path, counting_nvcc):
    """Another user's record of a failure would make a good source fail: a record others may write
    is a miss like any other."""
    cache = tmp_path / "cache"
    res = build_cubin(TINY, cache_dir=cache)
    record = res.cubin_path.with_suffix(".json")
    rec = _record(res.cubin_path)
    rec.update(ok=False, returncode=1, log="error: planted")
    record.write_text(json.dumps(rec))
    record.chmod(0o666)
    again = build_cubin(TINY, cache_dir=cache)
    assert not again.cached and counting_nvcc.compiles() == 2 and _record(res.cubin_path)["ok"] is True


def test_the_lock_timeout_knob(monkeypatch):
    from harness import knobs

    monkeypatch.delenv("ORACLE_BUILD_LOCK_TIMEOUT_S", raising=False)
    monkeypatch.setenv("ORACLE_NVCC_TIMEOUT_S", "30")
    assert knobs.get("ORACLE_BUILD_LOCK_TIMEOUT_S") == 60.0  # twice the compile's own limit
    monkeypatch.setenv("ORACLE_BUILD_LOCK_TIMEOUT_S", "0")
    with pytest.raises(knobs.KnobError, match="ORACLE_BUILD_LOCK_TIMEOUT_S"):
        knobs.get("ORACLE_BUILD_LOCK_TIMEOUT_S")

"""Track B on the GPU: the standalone reproducer of every zoo entry says what the oracle says.

For every entry of tests/zoo/manifest.json (the split-K, stream-K, two-launch and grouped entries
of zoo/split_gemm among them) and the inputs `ones` and `random:1`:
- the reproducer is written (python's write_repro, the same operands for both sides), and the
  oracle's live run of the same case and operands is judged on its output (the epilogue_store
  comparison: D against expected_output's reference and bounds, every group's for a grouped one);
- the reproducer's untraced program prints the same output verdict (MATCH / DIVERGED), after
  running every launch of the case in order on the workspaces the harness would have filled;
- with random:1, its traced program's sink.bin (one sink over every launch), judged by the oracle
  (compare --repro-dir), names the manifest's first stage, group and partial (or MATCHes with
  every tapped stage compared, for a correct entry);
- the reproducers of the correct entries are clean under compute-sanitizer --tool memcheck.

Launch-library entries (zoo/cutlass_sm90) build shared libraries, not cubins, so they are not in
the prebuilt folder: three of them (CUTLASS_REPRO: the cooperative correct run at its recorded
shape, the descriptor defect, the load defect) get their own reproducers, built there with make
(CUTLASS's headers from the wheel; about 4 CUTLASS builds, in parallel), run, and their traced
sink judged as the manifest says (test_cutlass_reproducer_*). Entries with a quantised B
(zoo/w4a16_sm80) are among them: their reproducers carry B's codes, scales and zero points and
dequantise on the host (oracle/repro/files/host/dequant.cuh). ORACLE_REPRO_ONLY (entry-name
prefixes, comma-separated) narrows the run and its prebuild to some entries.

Builds are shared: one traced cubin per kernel source (zoo/hopper_gemm/hopper_gemm.cu,
zoo/sm80_gemm/sm80_gemm.cu, zoo/split_gemm/split_gemm.cu; the zoo's cases have no time_entry, so
the untraced program runs the traced build with a null sink) and one pair of host programs for
every reproducer (repro.cu does not depend on the case; --dir, --cubin). The oracle's live runs
use the same cubins, so nothing is compiled on the GPU machine.

Prebuild here, with nvcc (about 3 minutes on 2 cores; about 30 MB):
    python tests/gpu/test_repro_gpu.py --prebuild .carry/repro-prebuilt
Run on the H200 (carry .carry/repro-prebuilt; a few minutes):
    ORACLE_REPRO_PREBUILT=.carry/repro-prebuilt python -m pytest -q tests/gpu/test_repro_gpu.py
Without the prebuilt folder the test builds it first (nvcc there: about 2 minutes more). Run it
without pytest-xdist's -n: the module's fixture does every run itself, on a pool of its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

# run as a script (the prebuild), this worktree's packages and tests/ come first
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]
from zoo_cases import check_judgement, entries, entry_case  # noqa: E402

from oracle.run.inputs import Provenance, make_operands  # noqa: E402
from oracle.repro.generate import write_repro  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
LADDERS = ("ones", "random:1")
PREBUILT_ENV = "ORACLE_REPRO_PREBUILT"
WORKERS = 8


# -- the shared builds -----------------------------------------------------------------------------
def _cubin_entries() -> list[dict]:
    """The zoo entries whose kernel is a cubin entry point (`source:entry`), not a launch library
    (those ORACLE_REPRO_ONLY names, when it is set)."""
    only = tuple(p for p in os.environ.get("ORACLE_REPRO_ONLY", "").split(",") if p)
    return [e for e in entries() if ":" in e["kernel"] and (not only or e["name"].startswith(only))]


def _source_key(entry: dict, case) -> str:
    """The prebuilt cubin an entry (its case: entry_case's) runs: its source, and the defines the case adds
    (the zoo's variants of one source built with a defect's define), one build each."""
    defines = case.kernel.defines
    source = Path(entry["kernel"].partition(":")[0]).stem
    return "+".join([source] + [f"{k}-{v}" for k, v in sorted(defines.items())])


def _tree_digest(kernel_dir: Path) -> str:
    """The copied kernel sources of a reproducer: a prebuilt cubin serves only the same tree."""
    h = hashlib.sha256()
    for p in sorted(kernel_dir.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(kernel_dir)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _template_digest() -> str:
    from oracle.repro.generate import TEMPLATE

    return hashlib.sha256(TEMPLATE.read_bytes()).hexdigest()


def _build_lines(makefile: Path) -> list[str]:
    return [line for line in makefile.read_text().splitlines()
            if line.startswith(("KERNEL_FLAGS :=", "TRACED_DEFINES :=", "PLAIN_CUBIN :="))]


def _ladder(text: str):
    name, _, seed = text.partition(":")
    seed = int(seed) if seed else 0
    return name, seed, Provenance(name, seed if name == "random" else None)


def prebuild(out: Path) -> dict:
    """One reproducer per zoo source built with make (the traced cubin), and the host programs
    built once without debug info: what the GPU run needs, small enough to carry."""
    out.mkdir(parents=True, exist_ok=True)
    first = {}
    for e in _cubin_entries():
        first.setdefault(_source_key(e, entry_case(e)), e)
    info = {"sources": {}}

    def build(key_entry):
        key, e = key_entry
        case = entry_case(e)
        name, seed, prov = _ladder("ones")
        d = out / key
        write_repro(case, make_operands(case.spec, name, seed), prov, d, reference=False)
        proc = subprocess.run(["make", "-C", str(d), "kernel_traced.cubin"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"make kernel_traced.cubin in {d} failed:\n{proc.stdout}{proc.stderr}")
        return key, {"cubin": f"{key}/kernel_traced.cubin", "kernel_digest": _tree_digest(d / "kernel"),
                     "build": _build_lines(d / "Makefile")}

    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(build, sorted(first.items())))
        host = pool.submit(_build_host, out, next(iter(first)))
        host.result()
    for key, meta in built:
        info["sources"][key] = meta
    for key in first:  # keep the cubins only: the reproducers themselves are written on the GPU side
        for p in (out / key).iterdir():
            if p.name != "kernel_traced.cubin":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    info["repro"], info["repro_traced"] = "bin/repro", "bin/repro_traced"
    info["repro_cu"] = _template_digest()
    (out / "prebuilt.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def _build_host(out: Path, key: str) -> None:
    (out / "bin").mkdir(exist_ok=True)
    src = out / key / "repro.cu"
    for name, traced in (("repro", 0), ("repro_traced", 1)):
        cmd = ["nvcc", "-std=c++17", "-O2", f"-I{out / key / 'kernel' / 'include'}", f"-DORACLE_REPRO_TRACED={traced}",
               "-o", str(out / "bin" / name), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")


def _prebuilt() -> tuple[Path, dict]:
    """The prebuilt folder, built here first when it is missing: under a lock, into a folder of its
    own that is renamed into place, so pytest-xdist workers never build over each other."""
    root = Path(os.environ.get(PREBUILT_ENV, ROOT / ".carry" / "repro-prebuilt"))
    if not (root / "prebuilt.json").is_file():
        if shutil.which("nvcc") is None:
            pytest.skip(f"No prebuilt reproducers in {root} ({PREBUILT_ENV}) and no nvcc to build them.")
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f".{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (root / "prebuilt.json").is_file():
                if root.exists() and any(root.iterdir()):  # never delete a folder this test did not make
                    pytest.fail(f"{root} ({PREBUILT_ENV}) is not empty and holds no prebuilt.json: "
                                f"point {PREBUILT_ENV} at a new or empty folder")
                staging = root.parent / f".{root.name}.{os.getpid()}"
                prebuild(staging)
                if root.exists():
                    root.rmdir()  # empty: checked above
                staging.rename(root)
    return root, json.loads((root / "prebuilt.json").read_text())


# -- the runs ---------------------------------------------------------------------------------------
def _verdict(stdout: str) -> str:
    m = re.findall(r"^verdict: (\w+)", stdout, re.M)
    return m[-1] if m else "NONE"


def _oracle_output_verdict(rec) -> str:
    """The oracle's judgement of D: epilogue_store's chained comparison (differential._store_stage)."""
    from oracle import knobs
    from oracle.judging.compare import Status, compare
    from oracle.judging.differential import expected_output

    if rec.output is None:
        return "KERNEL_ERROR"
    y, b = expected_output(rec.spec, rec.operands)
    out = rec.output.to(y.device)
    exact = bool((b == 0).all())
    c = compare(out, y.to(out.dtype) if exact else y, bound=None if exact else b,
                tile_shape=(rec.spec.tile.bm, rec.spec.tile.bn), max_detail_tiles=knobs.MAX_DETAIL_TILES.get())
    return {Status.MATCH: "MATCH", Status.MISMATCH: "DIVERGED", Status.MISTRUSTED: "MISTRUSTED"}[c.status]


def _correct(entry: dict) -> bool:
    return entry["defect"] is None


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    from oracle.run.live import run_live

    root, info = _prebuilt()
    assert info.get("repro_cu") == _template_digest(), f"{root}/bin was built from another repro.cu: prebuild again"
    work = tmp_path_factory.mktemp("repro_gpu")
    jobs = []
    for e in _cubin_entries():
        case = entry_case(e)
        meta = info["sources"][_source_key(e, case)]
        for text in LADDERS:
            name, seed, prov = _ladder(text)
            ops = make_operands(case.spec, name, seed)
            d = write_repro(case, ops, prov, work / e["name"] / name).path
            assert _tree_digest(d / "kernel") == meta["kernel_digest"], \
                f"{root} was built from other sources than {e['kernel']}: prebuild again"
            assert _build_lines(d / "Makefile") == meta["build"], "the prebuilt cubin has other flags: prebuild again"
            jobs.append((e, text, case, ops, prov, d, root / meta["cubin"]))

    def run_one(job):
        e, text, case, ops, prov, d, cubin = job
        live = run_live(replace(case, kernel=replace(case.kernel, cubin=str(cubin))), ops, prov, timeout_s=120)
        res = {"live": live.recording}
        cmd = [str(root / info["repro"]), "--dir", str(d), "--cubin", str(cubin)]
        res["plain"] = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if text != "ones":
            cmd = [str(root / info["repro_traced"]), "--dir", str(d), "--cubin", str(cubin)]
            res["traced"] = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return res

    with ThreadPoolExecutor(WORKERS) as pool:
        done = list(pool.map(run_one, jobs))
    results = {}
    for job, res in zip(jobs, done):
        e, text, case, ops, prov, d, cubin = job
        res.update(case=case, dir=d, cubin=cubin, oracle=_oracle_output_verdict(res["live"]))
        results[(e["name"], text)] = res

    def sanitize(job):
        e, text, case, ops, prov, d, cubin = job
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99", str(root / info["repro"]),
               "--dir", str(d), "--cubin", str(cubin), "--timeout", "600"]
        return e["name"], subprocess.run(cmd, capture_output=True, text=True, timeout=600)

    checked = [j for j in jobs if _correct(j[0]) and j[1] == "random:1"]
    if shutil.which("compute-sanitizer"):
        with ThreadPoolExecutor(4) as pool:
            for name, proc in pool.map(sanitize, checked):
                results[(name, "random:1")]["memcheck"] = proc
    return results


def _out(proc) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("ladder", LADDERS)
@pytest.mark.parametrize("entry", _cubin_entries(), ids=lambda e: e["name"])
def test_repro_prints_the_oracle_s_output_verdict(runs, entry, ladder):
    r = runs[(entry["name"], ladder)]
    plain = r["plain"]
    assert r["oracle"] in ("MATCH", "DIVERGED"), (r["oracle"], r["live"].kernel_error)
    assert _verdict(plain.stdout) == r["oracle"], _out(plain)
    assert plain.returncode == {"MATCH": 0, "DIVERGED": 1}[r["oracle"]], _out(plain)
    assert "the oracle's reference D" in plain.stdout
    if "traced" in r:
        assert _verdict(r["traced"].stdout) == r["oracle"], _out(r["traced"])


@pytest.mark.parametrize("entry", _cubin_entries(), ids=lambda e: e["name"])
def test_repro_traced_sink_names_the_manifest_s_stage(runs, entry):
    from oracle.judging.differential import analyze
    from oracle.repro.readback import load_repro_run

    r = runs[(entry["name"], "random:1")]
    assert (r["dir"] / "sink.bin").is_file(), _out(r["traced"])
    launches = 1 + len(r["case"].launch.next)
    assert f"launches {launches}\n" in (r["dir"] / "result.txt").read_text(), _out(r["traced"])
    rec = load_repro_run(r["dir"])
    assert rec.taps, "the traced reproducer recorded no taps"
    assert not any("dropped" in n for n in rec.notes), rec.notes
    check_judgement(entry["expected_stage"], r["case"], analyze(rec), entry)


@pytest.mark.parametrize("entry", [e for e in _cubin_entries() if _correct(e)], ids=lambda e: e["name"])
def test_correct_reproducers_are_clean_under_memcheck(runs, entry):
    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer is not on PATH.")
    proc = runs[(entry["name"], "random:1")]["memcheck"]
    assert proc.returncode == 0, _out(proc)
    assert "ERROR SUMMARY: 0 errors" in proc.stdout + proc.stderr, _out(proc)
    assert _verdict(proc.stdout) == "MATCH", _out(proc)


# -- CUTLASS launch libraries: the reproducer builds them itself ------------------------------------
CUTLASS_REPRO = ("cutlass_sm90_coop_correct", "cutlass_sm90_coop_wrong_stride", "cutlass_sm90_coop_smem_a")


def _cutlass_entries() -> list[dict]:
    return [e for e in entries() if e["name"] in CUTLASS_REPRO]


@pytest.fixture(scope="module")
def cutlass_runs(tmp_path_factory) -> dict:
    """Per entry (at its recorded shape, random:1): the reproducer written, built with make (traced;
    the correct one also untraced), run, and its traced sink read back."""
    from harness.build import cutlass_include_dirs

    if shutil.which("make") is None or shutil.which("nvcc") is None:
        pytest.skip("The reproducer is built with make and nvcc, which this machine lacks.")
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")
    work = tmp_path_factory.mktemp("repro_cutlass")
    jobs = []
    for e in _cutlass_entries():
        case = entry_case(e, e.get("record_problem") or e["problem"])
        name, seed, prov = _ladder("random:1")
        d = write_repro(case, make_operands(case.spec, name, seed), prov, work / e["name"]).path
        jobs.append((e, case, d))

    def build_and_run(job):
        e, case, d = job
        res = {"case": case, "dir": d}
        for target, exe in ((["TRACE=1"], "repro_traced"),) + ((([], "repro"),) if _correct(e) else ()):
            built = subprocess.run(["make", "-C", str(d), *target], capture_output=True, text=True, timeout=1800)
            res[f"make {exe}"] = built
            if built.returncode != 0:
                return res
            res[exe] = subprocess.run([str(d / exe)], capture_output=True, text=True, timeout=600)
        return res

    with ThreadPoolExecutor(4) as pool:
        return {job[0]["name"]: res for job, res in zip(jobs, pool.map(build_and_run, jobs))}


@pytest.mark.parametrize("entry", _cutlass_entries(), ids=lambda e: e["name"])
def test_cutlass_reproducer_builds_runs_and_its_sink_names_the_manifest_s_stage(cutlass_runs, entry):
    from oracle.judging.differential import analyze
    from oracle.repro.readback import load_repro_run

    r = cutlass_runs[entry["name"]]
    for exe in ("repro_traced", "repro"):
        if f"make {exe}" in r:
            assert r[f"make {exe}"].returncode == 0, _out(r[f"make {exe}"])
    traced = r["repro_traced"]
    want = "MATCH" if entry["expected_stage"] is None else "DIVERGED"
    assert _verdict(traced.stdout) == want, _out(traced)  # the traced build's D, as the oracle's live run has it
    assert (r["dir"] / "sink.bin").is_file(), _out(traced)
    rec = load_repro_run(r["dir"])
    assert rec.taps, "the traced reproducer recorded no taps"
    assert not any("dropped" in n for n in rec.notes), rec.notes
    check_judgement(entry["expected_stage"], r["case"], analyze(rec), entry)
    if "repro" in r:  # the production build (CUTLASS's own collective): the same D verdict
        assert _verdict(r["repro"].stdout) == "MATCH" and r["repro"].returncode == 0, _out(r["repro"])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--prebuild":
        sys.exit("usage: python tests/gpu/test_repro_gpu.py --prebuild DIR")
    built = prebuild(Path(sys.argv[2]))
    print(json.dumps(built, indent=1))

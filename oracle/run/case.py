"""A live case read from TOML: the problem, the kernel to build, how to launch it, and what to trace.

Described in TOML (one file, every section but [problem] optional) and overridable from the
command line:

    [problem]                 # oracle.problem.spec.ProblemSpec fields
    m = 200
    n = 136
    k = 72
    tile = [64, 64, 16]
    # epilogue = ["alpha", "bias", "beta_c", "cast"]   the epilogue's steps in order (docs/epilogue.md)

    [kernel]
    source = "simple_gemm.cu"  # relative to the TOML file, inside its folder (oracle.run.case_files)
    entry = "simple_gemm_bf16_traced"
    time_entry = "simple_gemm_bf16"   # optional: time the untraced entry (default: entry, sink off)
    defines = { ORACLE_TRACE = 1 }

    [launch]
    grid = ["tiles_n", "tiles_m", 1]   # ints or expressions of the problem's sizes
    block = [16, 16, 1]
    shared_mem_bytes = 0
    args = ["a", "b", "c", "d", "bias", "m", "n", "k", "lda", "ldb", "ldc", "ldd", "alpha", "beta",
            { i32 = 2 }]

    A launch library instead (oracle_trace/launch.hpp; harness.launch_abi): the kernel's own host
    code, built as a shared library, launches it; [launch] then holds only the ABI. Its host code
    runs in the kernel's child process, so such a case is loaded only with --allow-library
    (allow_library=True):
    [kernel]
    library = "my_gemm.cu"     # no source, cubin, entry, time_entry or untraced_entry beside it
    [launch]
    abi = "oracle/1"

    [trace]
    tiles = [[0, 0], [3, 2]]   # default: the first, a middle and the last tile
    k_blocks = "all"           # or a list
    stages = "all"             # or a list of the stages the kernel taps (harness.taps.TAP_STAGES)
    capacity_mb = 2048         # the most the sink may take (default ORACLE_TRACE_MAX_MB); the sink
                               # is sized to the selection, and a launch that overflows it is run
                               # once more with the measured size

Launch arguments: an operand name (a, b, c, d, bias, scale_a, scale_b, a quantised B's
b_scales and b_zeros, a quantised A's a_scales and a_zeros) is a device pointer (stored in its
declared major, a block scale in its scale_a.major / scale_b.major; b_scales and b_zeros
[K / group, N] row-major, a_scales and a_zeros [M, K / group] row-major; a packed B [K / 2, N]
bytes in b_major, its ldb counting values, so a column-major packed B's columns lie ldb / 2
bytes apart; a packed A [M, K / 2] likewise in a_major; `null` or an operand the problem does
not use is a null pointer); a size name (m, n, k, lda, ldb, ldc, ldd, tiles_m, tiles_n, k_blocks) is an i32;
alpha and beta are f32; `{ i32 = 7 }` (or u32, i64, u64, f32, f64) is a literal;
`{ tensormap = "a" }` is the operand's TMA tensor map passed by value, built from the problem
(dims, leading dimension, tile box, swizzle_a / swizzle_b, oob_fill). The map is the kernel's host
code, so a case may change what that host code does:
    { tensormap = "b", rows = "cdiv(n, 16) * 16" }   the operand lives in a buffer padded to that
        many rows along M (A) or N (B), and the map covers them; the padding rows hold stale data
        (a deterministic junk pattern), as in a batch padded to the MMA tile
    stride_bytes = EXPR    the map's leading-dimension stride in bytes (default: the real one)
    box_inner = EXPR       the box's contiguous extent in elements (default: the k-block, or
                           the swizzle span when narrower)
    swizzle = 0|32|64|128  the map's swizzle (default: the problem's)
    oob_fill = "zero"|"nan"
The oracle records every map it encodes as the run's descriptor fields (descriptor stage).
Expressions (grid, literals) may use + - * //, min, max, cdiv and the names above plus
num_sms (the GPU's multiprocessor count). In [problem], stream_k_workers may be an expression too
(e.g. "num_sms", "min(num_sms, tiles + 2)", over m, n, k, tiles_m, tiles_n, k_blocks, tiles, batch
and num_sms): it is resolved when the case is loaded (num_sms 132, an H200's, without a GPU), and
the problem, hence every recording, holds the number.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from harness.fields import shown
from harness.files import read_bounded
from harness.launch_abi import ABIS, ENTRY_SYMBOL
from harness.names import check_entry
from oracle.run.adapters import adapter_of
from oracle.run.case_files import CaseTrust, case_path, check_kernel_file, check_library_allowed, extends_root
from oracle.run.case_expressions import device_sms, evaluate_int
from oracle.run.case_grammar import check_kernel_names
from oracle.run.case_types import Arg, Case, CaseError, KernelSource, LaunchPlan, RunPlan, TracePlan, Workspace
from oracle.problem import attention
from oracle.problem.attention import AttentionSpec, check_selection as check_attention_selection, is_attention
from oracle.run.case_extends import apply_unset
from oracle.run.kernel_flags import check_nvcc_flags, resolve_include_dirs
from oracle.problem.spec import ProblemSpec, SpecError, check_selection as check_gemm_selection

OPERANDS = ("a", "b", "c", "d", "bias", "scale_a", "scale_b", "group_offsets", "b_scales", "b_zeros", "a_scales",
            "a_zeros")
SIZE_NAMES = ("m", "n", "k", "lda", "ldb", "ldc", "ldd", "tiles_m", "tiles_n", "k_blocks", "tiles", "total_m",
              "splits", "stream_k_workers", "groups", "group_tiles_m", "max_partials")
WORKSPACE_INITS = ("zero", "poison", "stale")
WORKSPACE_DTYPES = ("uint8", "int32", "fp32")
LITERAL_TYPES = ("i32", "u32", "i64", "u64", "f32", "f64")
MAX_CAPACITY_MB = 65536
TENSORMAP_OPTIONS = ("rows", "stride_bytes", "box_inner", "swizzle", "oob_fill")
SECTIONS = ("problem", "kernel", "launch", "trace", "workspace", "run")
MAX_CASE_BYTES = 1 << 20  # a case file (or a cases file) larger than this is not one
KERNEL_FILES = ("source", "cubin", "library")  # [kernel] keys that name a file, relative to the case file
LIBRARY_ENTRY = ENTRY_SYMBOL


def parse_value(text: str) -> Any:
    """A command-line value as TOML would read it (numbers, true/false, [lists], strings bare or quoted)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # not TOML (a bare word), or an integer past Python's digit limit
        return text


def parse_assignments(pairs: Sequence[str]) -> dict[str, Any]:
    out = {}
    for item in pairs:
        for part in _split_top(item):
            if "=" not in part:
                raise CaseError(f"problem setting {part!r} must look like key=value")
            key, val = part.split("=", 1)
            out[key.strip()] = parse_value(val.strip())
    return out


def _split_top(s: str) -> list[str]:
    """Split on commas outside brackets: 'm=1,tile=[64,64,16]' -> ['m=1', 'tile=[64,64,16]']."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def load_case(path: Optional[str], problem_overrides: Mapping[str, Any] = (), *, source: Optional[str] = None,
              entry: Optional[str] = None, allow_library: bool = False, allow_outside_case_dir: bool = False) -> Case:
    """The case of the file `path` (or none: the problem from the overrides) with the command line's
    kernel `source` and `entry`. The files the case file names stay inside its folder unless
    `allow_outside_case_dir`; a launch library ([kernel] library: host code the kernel's child runs) is
    refused unless `allow_library` (oracle.run.case_files)."""
    trust = CaseTrust(library=allow_library, outside_case_dir=allow_outside_case_dir)
    doc: dict = {}
    base = os.getcwd()
    if path is not None:
        doc = _read_case(path, (), trust, extends_root(path))
        base = os.path.dirname(os.path.abspath(path))
    prob = dict(doc.get("problem", {}))
    prob.update(dict(problem_overrides))
    if not prob:
        raise CaseError("no problem given: use a [problem] table or --problem m=...,n=...,k=...")
    spec = _problem(prob)
    kernel = _kernel(doc.get("kernel"), base, source, entry)
    launch = _launch(doc["launch"], names=_arg_names(spec)) if "launch" in doc else None
    _check_library(kernel, launch)
    if is_attention(spec) and kernel is not None and kernel.library is not None:
        raise CaseError("[kernel] library: a launch library's ABI (oracle/1) passes a GEMM; an attention kernel is "
                        "launched from [launch] args")
    check_adapter(spec, kernel)
    trace = trace_plan(doc.get("trace", {}))
    workspaces = _workspaces(doc.get("workspace", {}))
    run = run_plan(doc.get("run", {}))
    if launch is not None:
        declared = {w.name for w in workspaces}
        for plan in (launch,) + launch.next:
            for i, a in enumerate(plan.args):
                if a.kind == "workspace" and a.name not in declared:
                    raise CaseError(f"[launch] args[{i}]: workspace {a.name!r} is not declared; declared: "
                                    f"{', '.join(sorted(declared)) or 'none'} ([workspace.NAME] tables)")
    check_library_allowed(kernel.library if kernel is not None else None, path, trust, CaseError)  # a valid case
    return Case(spec, kernel, launch, trace, path, workspaces, run)


def _problem(prob: dict):
    """The [problem] table (with the command line's overrides) as its kind's spec: a GEMM's
    ProblemSpec, or an AttentionSpec for kind = "attention"."""
    try:
        if prob.get("kind") == "attention":
            return AttentionSpec.from_json(prob)
        return ProblemSpec.from_json(_resolve_problem(prob))
    except SpecError as e:
        raise CaseError(f"problem: {e}") from None


@dataclass(frozen=True)
class ArgNames:
    """The names a [launch] args string may take for a problem kind."""

    operands: tuple[str, ...]
    sizes: tuple[str, ...]
    floats: tuple[str, ...]
    tensormaps: tuple[str, ...]


GEMM_ARGS = ArgNames(OPERANDS, SIZE_NAMES, ("alpha", "beta"), ("a", "b"))
ATTENTION_ARGS = ArgNames(attention.OPERANDS, attention.LAUNCH_SIZES, attention.LAUNCH_FLOATS, ())


def _arg_names(spec) -> ArgNames:
    return ATTENTION_ARGS if is_attention(spec) else GEMM_ARGS


def run_plan(sec: dict) -> RunPlan:
    """[run] repeat = N, smem_poison = "0xFFFFFFFF" (or an integer)."""
    unknown = sorted(set(sec) - {"repeat", "smem_poison"})
    if unknown:
        raise CaseError(f"[run]: unknown key(s) {', '.join(unknown)}; allowed: repeat, smem_poison")
    poison = sec.get("smem_poison")
    if isinstance(poison, str):
        try:
            poison = int(poison.strip(), 0)
        except ValueError:
            raise CaseError(f"[run] smem_poison = {shown(poison)} must be a 32-bit word such as \"0xFFFFFFFF\"") from None
    return RunPlan(sec.get("repeat", 1), poison)


PROBLEM_EXPRESSIONS = ("stream_k_workers",)  # [problem] fields that may be expressions of the sizes


def _resolve_problem(prob: dict) -> dict:
    """[problem] fields given as expressions (e.g. stream_k_workers = "2 * num_sms") evaluated over
    the problem's sizes and num_sms; the spec (and so every recording) holds the integer."""
    exprs = {f: prob[f] for f in PROBLEM_EXPRESSIONS if isinstance(prob.get(f), str)}
    if not exprs:
        return prob
    try:
        base = ProblemSpec.from_json({key: v for key, v in prob.items() if key not in exprs and key != "partition"})
    except SpecError as e:
        raise CaseError(f"problem: {e}") from None
    names = {"m": base.m, "n": base.n, "k": base.k, "tiles_m": base.tiles_m, "tiles_n": base.tiles_n,
             "k_blocks": base.k_blocks, "tiles": base.tiles_m * base.tiles_n, "batch": base.batch,
             "num_sms": device_sms()}
    out = dict(prob)
    for key, expr in exprs.items():
        out[key] = evaluate_int(expr, names, f"[problem] {key}", 1)
    return out


def _workspaces(sec) -> tuple[Workspace, ...]:
    if not isinstance(sec, dict):
        raise CaseError(f"[workspace] must be a table of [workspace.NAME] tables, got {sec!r}")
    out = []
    for name, w in sec.items():
        where = f"[workspace.{name}]"
        if not name.isidentifier():
            raise CaseError(f"{where}: the name must be an identifier")
        if not isinstance(w, dict):
            raise CaseError(f"{where} must be a table with bytes, init and dtype")
        unknown = sorted(set(w) - {"bytes", "init", "dtype"})
        if unknown:
            raise CaseError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: bytes, init, dtype")
        if "bytes" not in w or isinstance(w["bytes"], bool) or not isinstance(w["bytes"], (int, str)):
            raise CaseError(f"{where} bytes must be an integer or an expression, got {w.get('bytes')!r}")
        init, dtype = w.get("init", "zero"), w.get("dtype", "uint8")
        if init not in WORKSPACE_INITS:
            raise CaseError(f"{where} init must be one of {', '.join(WORKSPACE_INITS)}, got {init!r}")
        if dtype not in WORKSPACE_DTYPES:
            raise CaseError(f"{where} dtype must be one of {', '.join(WORKSPACE_DTYPES)}, got {dtype!r}")
        out.append(Workspace(name, w["bytes"], init, dtype))
    return tuple(out)


def read_toml(path: str, what: str) -> dict:
    """A TOML file as a dict; a missing or malformed file is a CaseError naming `what` and the path."""
    if not os.path.lexists(path):
        raise CaseError(f"{what} {path!r} does not exist")
    # the file its links lead to, checked to be a regular one before it is opened (never a FIFO or /proc)
    data = read_bounded(os.path.realpath(path), f"{what} {path!r}", MAX_CASE_BYTES,
                        f"the {MAX_CASE_BYTES >> 20} MiB a case file may have", CaseError, nofollow=True)
    if len(data) > MAX_CASE_BYTES:
        raise CaseError(f"{what} {path!r} is larger than {MAX_CASE_BYTES >> 20} MiB, the most a case file may be")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CaseError(f"{what} {path!r} is not UTF-8 text: {e}") from None
    except ValueError as e:  # TOMLDecodeError, or an integer past Python's digit limit
        raise CaseError(f"{what} {path!r} is not valid TOML: {e}") from None
    except RecursionError:
        raise CaseError(f"{what} {path!r} nests arrays or tables deeper than the TOML reader goes") from None


def _read_case(path: str, seen: tuple[str, ...], trust: CaseTrust, chain_root: str) -> dict:
    """The TOML of a case with its `extends` chain merged: a case may name a base case file
    (relative to itself, inside `chain_root`) and replace keys of its tables; the base's file paths
    stay its own, inside its own folder (oracle.run.case_files)."""
    doc = read_toml(path, "case file")
    unknown = sorted(set(doc) - set(SECTIONS) - {"extends", "unset"})
    if unknown:
        raise CaseError(f"{path}: unknown section(s) {', '.join(unknown)}; allowed: {', '.join(SECTIONS)}, extends, "
                        f"unset")
    for section in SECTIONS:
        if section in doc and not isinstance(doc[section], dict):
            raise CaseError(f"{path}: {section} = {shown(doc[section])} must be a table ([{section}])")
    here = os.path.dirname(os.path.abspath(path))
    for key in KERNEL_FILES:
        if key in doc.get("kernel", {}):
            value = doc["kernel"][key]
            if not isinstance(value, str) or not value:
                raise CaseError(f"{path}: [kernel] {key} = {shown(value)} must be the path of a file (a string)")
            doc["kernel"][key] = case_path(value, f"[kernel] {key}", path, here, trust, CaseError)
    if "include_dirs" in doc.get("kernel", {}):  # relative to the file that names them, like its files
        doc["kernel"]["include_dirs"] = resolve_include_dirs(doc["kernel"]["include_dirs"], path, trust, CaseError)
    parent, unset = doc.pop("extends", None), doc.pop("unset", None)
    if parent is None:
        if unset is not None:
            raise CaseError(f"{path}: unset = {shown(unset)} removes keys of a base: it needs extends = \"BASE.toml\"")
        return doc
    if not isinstance(parent, str) or not parent:
        raise CaseError(f"{path}: extends must be the path of a case file, got {parent!r}")
    parent_path = os.path.normpath(case_path(parent, "extends", path, chain_root, trust, CaseError))
    if parent_path in seen or len(seen) > 8:
        raise CaseError(f"{path}: extends forms a cycle or a chain deeper than 8: {' -> '.join(seen + (parent_path,))}")
    merged = _read_case(parent_path, seen + (os.path.abspath(path),), trust, chain_root)
    if unset is not None:  # the base's keys this case drops (oracle.run.case_extends)
        merged = apply_unset(merged, unset, path, CaseError)
    for section, table in doc.items():
        merged[section] = {**merged.get(section, {}), **table}
    return merged


def _defines(sec: dict) -> dict[str, str]:
    """[kernel] defines = { NAME = value }: strings, numbers or booleans, as the build passes them."""
    raw = sec.get("defines", {})
    if not isinstance(raw, dict):
        raise CaseError(f"[kernel] defines = {shown(raw)} must be a table of NAME = value")
    defines = {}
    for name, value in raw.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, str) and "\0" in value:
            raise CaseError(f"[kernel] defines.{name} = {shown(value)} must be a string, a number or a boolean")
        defines[name] = str(value)
    return defines


def _arch(sec: dict) -> str:
    arch = sec.get("arch", "sm_90a")
    if not isinstance(arch, str) or not re.match(r"^sm_\d{2,3}[af]?$", arch):
        raise CaseError(f"[kernel] arch = {shown(arch)} must look like sm_90a, sm_90 or sm_100a")
    return arch


def _library_kernel(sec: dict, base: str, source: Optional[str], entry: Optional[str]) -> KernelSource:
    """[kernel] library = "FILE.cu": a launch library, whose entry is its exported oracle_launch."""
    for key in ("source", "cubin", "entry", "time_entry", "untraced_entry"):
        if key in sec:
            raise CaseError(f"[kernel] {key} = {shown(sec[key])} is not allowed beside [kernel] library: a launch "
                            f"library is built from its one source and entered through its {LIBRARY_ENTRY}(); "
                            f"remove {key}")
    if entry is not None:
        raise CaseError(f"--entry {shown(entry)} is not allowed for a launch library ([kernel] library): it is "
                        f"entered through its {LIBRARY_ENTRY}()")
    library = source or os.path.join(base, sec["library"])
    defines = _defines(sec)
    check_kernel_names(None, None, LIBRARY_ENTRY, None, defines, CaseError, library=library)
    check_kernel_file("library", library, CaseError)  # a source, never an object or archive, before it is read
    arch = _arch(sec)
    return KernelSource(None, LIBRARY_ENTRY, defines, arch, library=library, adapter=adapter_of(library),
                        **_build_options(sec))


def _build_options(sec: dict) -> dict:
    """include_dirs (resolved by _read_case) and nvcc_flags (checked against the allow-list)."""
    dirs = sec.get("include_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) and os.path.isabs(d) for d in dirs):
        raise CaseError(f"[kernel] include_dirs = {shown(dirs)} must be folders named by a case file")
    return {"include_dirs": tuple(dirs), "nvcc_flags": check_nvcc_flags(sec.get("nvcc_flags", []), CaseError)}


def check_adapter(spec: ProblemSpec, kernel: Optional[KernelSource]) -> None:
    """A library built through a shipped adapter runs only the problems the adapter supports: every
    field it lacks, in one CaseError."""
    adapter = kernel.adapter if kernel is not None else None
    if adapter is not None and is_attention(spec):
        raise CaseError(f"[kernel] library = {shown(os.path.basename(kernel.library))} is built through the "
                        f"{adapter.name} adapter, a GEMM's: an attention problem is launched from [launch] args")
    why = adapter.unsupported(spec) if adapter is not None else []
    if why:
        raise CaseError(f"[kernel] library = {shown(os.path.basename(kernel.library))} is built through the "
                        f"{adapter.name} adapter ({adapter.header}), which cannot run this problem: "
                        + "; ".join(f"[problem] {w}" for w in why))


def _check_library(kernel: Optional[KernelSource], launch: Optional[LaunchPlan]) -> None:
    """A launch library and its [launch] abi come together, or neither does."""
    library = kernel is not None and kernel.library is not None
    if library and (launch is None or launch.abi is None):
        raise CaseError(f"[kernel] library = {shown(os.path.basename(kernel.library))} needs [launch] abi = "
                        f"\"{ABIS[0]}\" (the ABI its {LIBRARY_ENTRY} speaks; allowed: {', '.join(ABIS)})")
    if launch is not None and launch.abi is not None and not library:
        raise CaseError(f"[launch] abi = {shown(launch.abi)} is for a launch library: it needs [kernel] library = "
                        f"\"FILE.cu\" instead of a source or cubin entry point")


def _kernel(sec: Optional[dict], base: str, source: Optional[str], entry: Optional[str]) -> Optional[KernelSource]:
    sec = dict(sec or {})
    unknown = sorted(set(sec) - {"source", "entry", "defines", "arch", "cubin", "time_entry", "untraced_entry",
                                 "library", "include_dirs", "nvcc_flags"})
    if unknown:
        raise CaseError(f"[kernel]: unknown key(s) {', '.join(unknown)}; allowed: source, entry, defines, arch, "
                        f"cubin, time_entry, untraced_entry, library, include_dirs, nvcc_flags")
    for key in KERNEL_FILES:  # a case read from a file has them as paths already; inline ones too
        if key in sec and (not isinstance(sec[key], str) or not sec[key]):
            raise CaseError(f"[kernel] {key} = {shown(sec[key])} must be the path of a file (a string)")
    if "library" in sec:
        return _library_kernel(sec, base, source, entry)
    src = source or (os.path.join(base, sec["source"]) if "source" in sec else None)
    cubin = os.path.join(base, sec["cubin"]) if "cubin" in sec else None
    ent = entry or sec.get("entry")
    if src is None and cubin is None and ent is None:
        return None
    if ent is None:
        raise CaseError("the kernel's entry point is missing: [kernel] entry = \"...\" or --entry NAME")
    if src is None and cubin is None:
        raise CaseError("the kernel needs a source (.cu) or a prebuilt cubin: [kernel] source/cubin or --kernel FILE")
    time_entry = sec.get("time_entry") if entry is None else None  # a new --entry drops the TOML's
    untraced = sec.get("untraced_entry") if entry in (None, sec.get("entry")) else None
    for key, value in (("entry", ent), ("time_entry", time_entry), ("untraced_entry", untraced)):
        if value is not None and not isinstance(value, str):
            raise CaseError(f"[kernel] {key} = {shown(value)} must be the kernel's entry point name (a string)")
    defines = _defines(sec)
    check_kernel_names(src, cubin, ent, time_entry, defines, CaseError)
    check_kernel_file("source", src, CaseError)
    check_kernel_file("cubin", cubin, CaseError)
    if untraced is not None:
        check_entry(untraced, "[kernel] untraced_entry", CaseError)
    arch = _arch(sec)
    options = _build_options(sec)
    if cubin is not None and src is None and (options["include_dirs"] or options["nvcc_flags"]):
        raise CaseError("[kernel] include_dirs and nvcc_flags are for a build: a prebuilt [kernel] cubin has none")
    return KernelSource(src, ent, defines, arch, cubin, time_entry, untraced, **options)


def _triple(v, key: str, expressions: bool = False) -> tuple:
    """1 to 3 positive integers (or, for the grid, expressions of the problem's sizes), padded with 1."""
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list) or not 1 <= len(v) <= 3:
        raise CaseError(f"[launch] {key} = {shown(v)} must be a list of 1 to 3 entries")
    for x in v:
        if not (_index(x) and x > 0 or expressions and isinstance(x, str)):
            raise CaseError(f"[launch] {key} entry {shown(x)} must be a positive integer"
                            + (" or an expression of the problem's sizes" if expressions else ""))
    return tuple(list(v) + [1] * (3 - len(v)))


def _launch(sec: dict, where: str = "[launch]", names: ArgNames = GEMM_ARGS) -> LaunchPlan:
    if not isinstance(sec, dict):
        raise CaseError(f"{where} must be a table, got {sec!r}")
    if "abi" in sec:
        return _library_launch(sec, where)
    allowed = {"grid", "block", "shared_mem_bytes", "args", "cluster"} | ({"next"} if where == "[launch]" else {"entry", "untraced_entry"})
    unknown = sorted(set(sec) - allowed)
    if unknown:
        raise CaseError(f"{where}: unknown key(s) {', '.join(unknown)}")
    nxt = ()
    if "next" in sec:
        if not isinstance(sec["next"], list):
            raise CaseError("[[launch.next]] must be an array of tables (one per kernel launched after the first)")
        nxt = tuple(_launch(t, f"[[launch.next]] #{i}", names) for i, t in enumerate(sec["next"]))
        for i, t in enumerate(nxt):
            if not isinstance(t.entry, str) or not t.entry:
                raise CaseError(f"[[launch.next]] #{i} needs entry = \"kernel name\"")
            check_entry(t.entry, f"[[launch.next]] #{i} entry", CaseError)
            if t.untraced_entry is not None:
                check_entry(t.untraced_entry, f"[[launch.next]] #{i} untraced_entry", CaseError)
    for key in ("grid", "block", "args"):
        if key not in sec:
            raise CaseError(f"[launch] needs {key!r}")
    block = _triple(sec["block"], "block")
    if not isinstance(sec["args"], list):
        raise CaseError(f"[launch] args = {shown(sec['args'])} must be a list of the kernel's arguments, in order")
    args = tuple(_arg(a, i, names) for i, a in enumerate(sec["args"]))
    smem = sec.get("shared_mem_bytes", 0)
    if not _index(smem):
        raise CaseError(f"{where} shared_mem_bytes = {shown(smem)} must be a non-negative integer")
    grid = _triple(sec["grid"], "grid", expressions=True)
    return LaunchPlan(grid, block, args, smem, _triple(sec.get("cluster", [1, 1, 1]), "cluster"), sec.get("entry"), nxt,
                      untraced_entry=sec.get("untraced_entry"))


def _library_launch(sec: dict, where: str) -> LaunchPlan:
    """[launch] abi = "oracle/1": the library launches its own kernels, so the table says nothing else."""
    abi = sec["abi"]
    if where != "[launch]":
        raise CaseError(f"{where} abi = {shown(abi)}: only [launch] itself may name a launch library's ABI")
    if not isinstance(abi, str) or abi not in ABIS:
        raise CaseError(f"[launch] abi = {shown(abi)} is not allowed: one of {', '.join(repr(a) for a in ABIS)}")
    extra = sorted(set(sec) - {"abi"})
    if extra:
        raise CaseError(f"[launch] {extra[0]} = {shown(sec[extra[0]])} is not allowed with abi = {shown(abi)}: a launch "
                        f"library chooses its own grid, block, shared memory and arguments; [launch] holds only abi")
    return LaunchPlan((), (1, 1, 1), (), abi=abi)


def _arg(a, i: int, names: ArgNames = GEMM_ARGS) -> Arg:
    where = f"[launch] args[{i}]"
    if isinstance(a, str):
        if a in names.operands:
            return Arg("operand", a)
        if a in names.sizes:
            return Arg("size", a)
        if a in names.floats:
            return Arg("float", a)
        if a == "null":
            return Arg("null")
        maps = " / { tensormap = \"a\" }" if names.tensormaps else ""
        raise CaseError(f"{where} = {shown(a)} is unknown; operands {', '.join(names.operands)}, sizes "
                        f"{', '.join(names.sizes)}, floats {', '.join(names.floats)}, null, or a table like "
                        f"{{ i32 = 3 }}{maps}")
    if isinstance(a, dict) and "workspace" in a:
        if len(a) != 1 or not isinstance(a["workspace"], str):
            raise CaseError(f"{where}: a workspace argument is {{ workspace = \"NAME\" }}, got {a!r}")
        return Arg("workspace", a["workspace"])
    if isinstance(a, dict) and "tensormap" in a:
        val = a["tensormap"]
        if not names.tensormaps:
            raise CaseError(f"{where}: the harness builds no tensor map over an attention operand: pass it as a "
                            f"pointer and build the map in the kernel's own launch, or use a launch library")
        if not isinstance(val, str) or val not in names.tensormaps:
            raise CaseError(f"{where}: tensormap must be \"a\" or \"b\", got {shown(val)}")
        opts = {k: v for k, v in a.items() if k != "tensormap"}
        unknown = sorted(set(opts) - set(TENSORMAP_OPTIONS))
        if unknown:
            raise CaseError(f"{where}: unknown tensormap option(s) {', '.join(unknown)}; "
                            f"known: {', '.join(TENSORMAP_OPTIONS)}")
        if "swizzle" in opts and not (_index(opts["swizzle"]) and opts["swizzle"] in (0, 32, 64, 128)):
            raise CaseError(f"{where}: swizzle must be 0, 32, 64 or 128, got {shown(opts['swizzle'])}")
        if "oob_fill" in opts and not (isinstance(opts["oob_fill"], str) and opts["oob_fill"] in ("zero", "nan")):
            raise CaseError(f"{where}: oob_fill must be \"zero\" or \"nan\", got {shown(opts['oob_fill'])}")
        for k in ("rows", "stride_bytes", "box_inner"):
            if k in opts and not (_index(opts[k]) or isinstance(opts[k], str)):
                raise CaseError(f"{where}: {k} must be an integer or an expression, got {shown(opts[k])}")
        return Arg("tensormap", val, options=tuple(sorted(opts.items())))
    if isinstance(a, dict) and len(a) == 1:
        (key, val), = a.items()
        if key in LITERAL_TYPES:
            if isinstance(val, bool) or not isinstance(val, (int, float, str)):
                raise CaseError(f"{where}: {{ {key} = {shown(val)} }} must hold a number or an expression")
            return Arg("literal", ctype=key, expr=val)
    raise CaseError(f"{where} = {shown(a)} is not an argument description")


def trace_plan(sec: Mapping[str, Any], where: str = "[trace]") -> TracePlan:
    """A trace selection (tiles, k_blocks, stages, groups, capacity_mb), checked; `where` names it in errors."""
    unknown = sorted(set(sec) - {"tiles", "k_blocks", "stages", "groups", "capacity_mb"})
    if unknown:
        raise CaseError(f"{where}: unknown key(s) {', '.join(unknown)}")
    tiles = sec.get("tiles")
    if tiles is not None:
        if not isinstance(tiles, list) or not all(
                isinstance(t, list) and len(t) == 2 and all(_index(v) for v in t) for t in tiles):
            raise CaseError(f"{where} tiles must be a list of [tile_m, tile_n] pairs, got {shown(tiles)}")
        tiles = tuple((t[0], t[1]) for t in tiles)
    kbs = sec.get("k_blocks", "all")
    if kbs == "all":
        kbs = None
    elif isinstance(kbs, list) and all(_index(x) for x in kbs):
        kbs = tuple(kbs)
    else:
        raise CaseError(f"{where} k_blocks must be \"all\" or a list of k-block indices, got {shown(kbs)}")
    stages = trace_stages(sec.get("stages", "all"), f"{where} stages")
    cap = sec.get("capacity_mb")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CAPACITY_MB):
        raise CaseError(f"{where} capacity_mb must be an integer 1..{MAX_CAPACITY_MB}, got {shown(cap)}")
    groups = sec.get("groups", "all")
    if groups == "all":
        groups = None
    elif isinstance(groups, list) and groups and all(_index(x) for x in groups):
        groups = tuple(groups)
    else:
        raise CaseError(f"{where} groups must be \"all\" or a non-empty list of group (batch entry) indices, "
                        f"got {shown(groups)}")
    plan = TracePlan(tiles, kbs, stages, cap, groups)
    _selection(plan, where)
    return plan


def _selection(plan: TracePlan, where: str):
    """The selection as the sink header holds it (at most 32 tile selectors, k-blocks in one
    1024-wide window, at most 4 groups, int32 indices), or a CaseError naming `where`."""
    from harness.trace_format import TraceSelection

    try:
        return TraceSelection(tiles=plan.tiles, k_blocks=plan.k_blocks, stages=plan.stages or TraceSelection().stages,
                              groups=plan.groups)
    except ValueError as e:
        raise CaseError(f"{where}: {e}") from None


def trace_stages(value: Any, where: str) -> Optional[tuple[str, ...]]:
    """"all" (None) or a non-empty list of tap stage names."""
    from harness.taps import TAP_STAGES

    if value == "all":
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v in TAP_STAGES for v in value):
        raise CaseError(f"{where} must be \"all\" or a list of stages from {', '.join(TAP_STAGES)}, got {shown(value)}")
    return tuple(dict.fromkeys(value))


def check_trace_selection(case: Case) -> None:
    """The selection against the sink header and the problem: at most 32 tile selectors, every
    traced tile inside the tile grid, every traced k-block inside 0..k_blocks-1 and one 1024-wide
    window (a CaseError before anything is built or launched)."""
    check = check_attention_selection if is_attention(case.spec) else check_gemm_selection
    try:
        check(case.spec, case.trace)
    except ValueError as e:
        raise CaseError(str(e)) from None
    _selection(case.trace, "trace selection")


def _index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0

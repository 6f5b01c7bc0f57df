"""Benchmark-and-verify a torch op: `python -m oracle verify --op module:function`.

The op is any callable that takes the operands and returns D: `torch.matmul`, `torch._scaled_mm`,
a custom op from an extension. For every case of a sweep it draws seeded random operands, calls
the op, judges D with the oracle (`oracle.check`, output only, with the case's numerics model),
and times the op against cuBLAS (torch.matmul, or cuBLASLt `_scaled_mm` with fast accumulation
for fp8) under the oracle's timing discipline (oracle.run.timing). A sweep (TOML):

    [defaults]                         # applied to every case
    dtype = "bf16"
    out_dtype = "bf16"

    [[case]]
    name = "decode"
    m = 8
    n = 4096
    k = 4096
    fields = { acc_model = "fp32" }    # any ProblemSpec field, for the judgement
    call = "matmul"                    # how the op is called: "matmul" op(a, b);
                                       # "scaled_mm" op(a, b, scale_a=, scale_b=, out_dtype=, use_fast_accum=)
                                       # "scaled_mm_block": the same with DeepSeek-style fp8 block scales,
                                       #   scale_a [M, K/128] (M-major), scale_b [K/128, N/128]
                                       # "w4a16" op(a, b, b_scales, b_zeros): a quantised B as stored
                                       #   (a quant table of a_* fields: op(a, b, a_scales, a_zeros),
                                       #   a quantised A as stored [M, K / per] beside a `dtype` B)
    fast_accum = false                 # scaled_mm only
    quant = { b_dtype = "int4", b_packing = "k_pairs_low_first", b_group_size = 128, b_scales = "fp16",
              b_zeros = "int" }        # w4a16 only: the stored operand (oracle.problem.spec's b_* or a_* fields)

or `--shape MxNxK` (repeatable) and `--dtype`. Results: one JSON line per case (`--jsonl`), a
progress line per case on stderr, a table; `--shard i/n` keeps cases i, i+n, ...; with several
visible GPUs one worker process runs per GPU (as `bench`).

Without a GPU the references run under the Triton interpreter on the CPU, thousands of times
slower: the sweep's time is estimated from its sizes first (cpu_estimate_s), said on stderr with
a line as each case starts, and a sweep estimated past ORACLE_CPU_MAX_S is refused before any case
runs.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from oracle.run.case import read_toml
from oracle.run.case_types import CaseError

CASE_KEYS = ("name", "m", "n", "k", "dtype", "out_dtype", "b_major", "fields", "call", "fast_accum", "seed",
             "time", "quant")
CALLS = ("matmul", "scaled_mm", "scaled_mm_block", "w4a16")
QUANT_FIELDS = ("dtype", "packing", "group_size", "scales", "zeros")
QUANT_KEYS = tuple(f"{op}_{f}" for op in "ba" for f in QUANT_FIELDS) + ("dequant_precision",)
DTYPES = ("fp32", "fp16", "bf16", "e4m3", "int8")


@dataclass(frozen=True)
class VerifyCase:
    name: str
    m: int
    n: int
    k: int
    dtype: str = "bf16"
    out_dtype: Optional[str] = None  # default: the operand type (fp8: bf16; int8: int32)
    b_major: str = "row"
    fields: dict = field(default_factory=dict)
    call: str = "matmul"
    fast_accum: bool = False
    seed: int = 0
    time: bool = True
    quant: dict = field(default_factory=dict)  # w4a16: the stored operand's fields (QUANT_KEYS)

    def __post_init__(self) -> None:
        where = f"verify case {self.name!r}"
        for f in ("m", "n", "k"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CaseError(f"{where}: {f} = {v!r} must be a positive integer")
        if self.dtype not in DTYPES:
            raise CaseError(f"{where}: dtype {self.dtype!r} must be one of {', '.join(DTYPES)}")
        if self.call not in CALLS:
            raise CaseError(f"{where}: call {self.call!r} must be one of {', '.join(CALLS)}")
        if self.b_major not in ("row", "col"):
            raise CaseError(f"{where}: b_major {self.b_major!r} must be 'row' or 'col'")
        if not isinstance(self.fields, dict):
            raise CaseError(f"{where}: fields must be a table of ProblemSpec fields, got {self.fields!r}")
        if not isinstance(self.quant, dict) or sorted(set(self.quant) - set(QUANT_KEYS)):
            raise CaseError(f"{where}: quant must be a table of {', '.join(QUANT_KEYS)}, got {self.quant!r}")
        if (self.call == "w4a16") != bool(self.quant):
            raise CaseError(f"{where}: call 'w4a16' takes a quant table (b_dtype, b_scales, ...), and only it does")
        if self.call == "w4a16" and self.dtype not in ("fp16", "bf16"):
            raise CaseError(f"{where}: a w4a16 call takes an fp16 or bf16 float operand, not {self.dtype!r}")
        if len({key[0] for key in self.quant if key != "dequant_precision"}) > 1:
            raise CaseError(f"{where}: quant names fields of both a_* and b_*: exactly one operand is quantised")
        if self.call == "scaled_mm_block" and self.dtype != "e4m3":
            raise CaseError(f"{where}: a block-scaled call takes e4m3 operands, not {self.dtype!r}")

    @property
    def quant_op(self) -> str:
        """The quantised operand of a w4a16 case: "a" when its quant table holds a_* fields, else "b"."""
        return "a" if any(key.startswith("a_") for key in self.quant) else "b"


def sweep_entries(path: str, case_keys: Sequence[str], top: Sequence[str] = ("defaults", "case")) -> list[dict]:
    """The [[case]] tables of a sweep file, each over its [defaults], every key checked against
    `case_keys` (a case without a name is called case<i>); `top` are the keys the file may have."""
    doc = read_toml(path, "verify sweep")
    unknown = sorted(set(doc) - set(top))
    if unknown:
        raise CaseError(f"verify sweep {path!r}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(top)}")
    defaults, cases = doc.get("defaults", {}), doc.get("case", [])
    if not isinstance(defaults, dict) or not isinstance(cases, list):
        raise CaseError(f"verify sweep {path!r}: [defaults] must be a table and [[case]] an array of tables")
    out = []
    for i, raw in enumerate(cases):
        if not isinstance(raw, dict):
            raise CaseError(f"verify sweep {path!r}: case #{i} must be a table")
        entry = {**defaults, **raw}
        bad = sorted(set(entry) - set(case_keys))
        if bad:
            raise CaseError(f"verify sweep {path!r}: case #{i}: unknown key(s) {', '.join(bad)}; allowed: "
                            f"{', '.join(case_keys)}")
        entry.setdefault("name", f"case{i}")
        out.append(entry)
    if not out:
        raise CaseError(f"verify sweep {path!r} has no [[case]] entries")
    return out


def load_sweep(path: str) -> list[VerifyCase]:
    out = []
    for i, entry in enumerate(sweep_entries(path, CASE_KEYS)):
        try:
            out.append(VerifyCase(**entry))
        except TypeError as e:
            raise CaseError(f"verify sweep {path!r}: case #{i}: {e}") from None
    return out


def shape_cases(shapes: Sequence[str], dtype: str, call: str, fast_accum: bool = False) -> list[VerifyCase]:
    out = []
    for s in shapes:
        try:
            m, n, k = (int(v) for v in s.lower().split("x"))
        except ValueError:
            raise CaseError(f"--shape {s!r} must look like MxNxK (three positive integers)") from None
        if min(m, n, k) <= 0:
            raise CaseError(f"--shape {s!r}: M, N and K must be positive")
        out.append(VerifyCase(f"{m}x{n}x{k}-{dtype}", m, n, k, dtype, call=call, fast_accum=fast_accum))
    return out


def load_op(spec: str) -> Callable:
    """'module:function' (dots allowed in both: 'torch:_scaled_mm', 'mypkg.ops:gemm')."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise CaseError(f"--op {spec!r} must look like module:function")
    try:
        obj = importlib.import_module(mod)
    except ImportError as e:
        raise CaseError(f"--op {spec!r}: cannot import {mod!r}: {e}") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise CaseError(f"--op {spec!r}: {mod!r} has no attribute {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CaseError(f"--op {spec!r} is not callable")
    return obj


def _check_workers_import(spec: str) -> None:
    """The workers never import from the current folder (harness.python_start): an --op module found
    only there is refused with the way to hand it to them, instead of every worker failing."""
    from harness.python_start import python_path

    top = sys.modules.get(spec.partition(":")[0].split(".")[0])
    where = getattr(top, "__file__", None)
    if where is None:
        return
    root = os.path.dirname(os.path.dirname(where) if os.path.basename(where) == "__init__.py" else where)
    given = python_path(os.environ.get("PYTHONPATH")).split(os.pathsep)
    if os.path.realpath(root) == os.path.realpath(os.getcwd()) and \
            not any(os.path.realpath(p) == os.path.realpath(root) for p in given):
        raise CaseError(f"--op {spec!r}: {top.__name__!r} was imported from the current folder {root}, which the "
                        f"worker processes never import from (a file left there would run as you); put the folder "
                        f"on PYTHONPATH (PYTHONPATH={root}) or install the module, or run with --workers 1")


def _operands(vc: VerifyCase, device: str):
    import torch

    from kernels_ref.dtypes import DTYPES as TABLE

    g = torch.Generator(device=device).manual_seed(vc.seed)
    if vc.dtype == "int8":
        a = torch.randint(-8, 9, (vc.m, vc.k), generator=g, device=device).to(torch.int8)
        b = torch.randint(-8, 9, (vc.k, vc.n), generator=g, device=device).to(torch.int8)
    else:
        a = torch.randn(vc.m, vc.k, generator=g, device=device).to(TABLE[vc.dtype].torch)
        b = torch.randn(vc.k, vc.n, generator=g, device=device).to(TABLE[vc.dtype].torch)
    if vc.b_major == "col" or vc.call in ("scaled_mm", "scaled_mm_block"):
        b = b.t().contiguous().t()  # the same logical B, stored column-major
    return a, b


def quant_spec(vc: VerifyCase):
    """The problem of a w4a16 case (its stored operand from `quant`, the other in `dtype`)."""
    from oracle.problem.spec import ProblemSpec, SpecError

    try:
        return ProblemSpec(vc.m, vc.n, vc.k, **{f"{'b' if vc.quant_op == 'a' else 'a'}_dtype": vc.dtype},
                           out_dtype=_out_dtype(vc), tile=_quant_tile(vc), **vc.quant)
    except SpecError as e:
        raise CaseError(f"verify case {vc.name!r}: quant: {e}") from None


def _quant_tile(vc: VerifyCase):
    from oracle.problem.spec import Tile

    g = vc.quant.get(f"{vc.quant_op}_group_size") or vc.k
    return Tile(128, 128, 64 if vc.k % 64 == 0 else (g if vc.k % g == 0 else vc.k))


def _quant_operands(vc: VerifyCase, device: str):
    """A and B (the float one drawn as the oracle's random ladder, the quantised one as stored), the
    quantised operand's scales and zero points, on `device`."""
    from oracle.run.inputs import make_operands

    ops = make_operands(quant_spec(vc), "random", vc.seed)
    q = vc.quant_op
    return tuple(None if t is None else t.to(device)
                 for t in (ops.a, ops.b, getattr(ops, f"{q}_scales"), getattr(ops, f"{q}_zeros")))


def _block_scales(vc: VerifyCase, device: str):
    """DeepSeek-style scales: the oracle's [M, K/128] and [N/128, K/128], positive, seeded."""
    import torch

    g = torch.Generator(device=device).manual_seed(vc.seed + 1)
    kb = -(-vc.k // 128)
    sa = torch.rand(vc.m, kb, generator=g, device=device) + 0.5
    sb = torch.rand(-(-vc.n // 128), kb, generator=g, device=device) + 0.5
    return sa, sb


def _out_dtype(vc: VerifyCase) -> str:
    return vc.out_dtype or {"e4m3": "bf16", "int8": "int32"}.get(vc.dtype, vc.dtype)


def default_numerics(vc: VerifyCase) -> dict:
    """The spec fields that describe what torch may dispatch the case to, when the sweep does not
    say (sound first: a correct engine must never be judged DIVERGED by a model it does not follow).
    cuBLAS may split K and sum fp32 partials; with torch's reduced-precision reductions allowed
    (the default for bf16 and fp16), it may round the partials to the output type: acc_model any.
    fp32 with TF32 allowed: cuBLAS rounds the operands to TF32. fp8: fast accumulation is the
    narrow accumulator (fp8_fast); otherwise the promotion interval is the engine's own (any).
    int8: exact int32."""
    flags = cublas_flags()
    if vc.dtype == "e4m3":  # fast accumulation is the narrow accumulator; otherwise the interval is the engine's
        return {"acc_model": "fp8_fast" if vc.call == "scaled_mm" and vc.fast_accum else "any"}
    if vc.call == "w4a16":  # an unknown engine over the dequantised fp16 / bf16 operands
        return {"acc_model": "any"}
    if vc.dtype == "int8":
        return {"acc_dtype": "int32"}
    if vc.dtype == "fp32":
        return {"acc_model": "tf32_rn"} if flags.tf32 else {"reduction": "fp32"}
    reduced = flags.bf16_reduced if vc.dtype == "bf16" else flags.fp16_reduced
    return {"acc_model": "any"} if reduced else {"reduction": "fp32"}


@dataclass(frozen=True)
class CublasFlags:
    """What torch lets cuBLAS do to a matmul: TF32 for fp32, reduced-precision bf16 / fp16 reductions."""

    tf32: bool
    bf16_reduced: bool
    fp16_reduced: bool


def cublas_flags() -> CublasFlags:
    """torch's current cuBLAS matmul settings, read through the API this torch has: torch >= 2.9
    says `fp32_precision` ("tf32", "ieee", or "none": the global `torch.backends.fp32_precision`)
    and refuses the legacy `allow_tf32` once the new one was set; older torch has only `allow_tf32`."""
    import torch

    m = torch.backends.cuda.matmul
    try:
        precision = m.fp32_precision
    except AttributeError:  # torch < 2.9
        tf32 = bool(m.allow_tf32)
    else:
        if precision == "none":
            precision = getattr(torch.backends, "fp32_precision", "none")
        tf32 = precision == "tf32"
    return CublasFlags(tf32, bool(m.allow_bf16_reduced_precision_reduction),
                       bool(m.allow_fp16_reduced_precision_reduction))


def _call(op: Callable, vc: VerifyCase, a, b, scales):
    from kernels_ref.dtypes import DTYPES as TABLE

    if vc.call == "scaled_mm":
        return op(a, b, scale_a=scales[0], scale_b=scales[1], out_dtype=TABLE[_out_dtype(vc)].torch,
                  use_fast_accum=vc.fast_accum)
    if vc.call == "scaled_mm_block":  # torch's layouts: scale_a M-major, scale_b [K/128, N/128]
        return op(a, b, scale_a=scales[0].t().contiguous().t(), scale_b=scales[1].t().contiguous(),
                  out_dtype=TABLE[_out_dtype(vc)].torch, use_fast_accum=vc.fast_accum)
    if vc.call == "w4a16":
        return op(a, b, scales[0], scales[1])
    return op(a, b)


def run_case(op: Callable, vc: VerifyCase, html_page: Optional[str] = None, commands: Sequence = ()) -> dict:
    """Verify, then time, one case; a failure of the op or the case is a row, never a crash. With
    `html_page`, the judgement's HTML page is written there, with `commands` to re-run it."""
    import torch

    from oracle.tools.api import check

    row: dict[str, Any] = {"name": vc.name, "shape": [vc.m, vc.n, vc.k], "dtype": vc.dtype,
                           "out_dtype": _out_dtype(vc), "call": vc.call, "fields": vc.fields}
    t0 = time.perf_counter()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        scales = None
        kw = dict(default_numerics(vc), **vc.fields)
        row["numerics_fields"] = {k: v for k, v in kw.items() if k in ("acc_model", "reduction", "acc_dtype")}
        if vc.call == "w4a16":
            q = vc.quant_op
            a, b, q_scales, q_zeros = _quant_operands(vc, dev)
            scales = (q_scales, q_zeros)
            extra = {f"{q}_scales": q_scales, f"{q}_zeros": q_zeros, f"{q}_dtype": vc.quant[f"{q}_dtype"],
                     f"{q}_packing": vc.quant.get(f"{q}_packing"),
                     "dequant_precision": vc.quant.get("dequant_precision")}
            if q_zeros is not None:  # its form (float_offset is not told by the zero points' dtype)
                extra[f"{q}_zeros_kind"] = vc.quant[f"{q}_zeros"]
        else:
            a, b = _operands(vc, dev)
            if vc.call == "scaled_mm":
                scales = (torch.ones((), device=dev), torch.ones((), device=dev))
            if vc.call == "scaled_mm_block":
                scales = _block_scales(vc, dev)
            extra = {} if scales is None else {"scale_a": scales[0], "scale_b": scales[1]}
        d = _call(op, vc, a, b, scales)
        rep = check(a, b, d, **extra, **kw)
        write_page(row, rep, html_page, commands)
        row["verdict"] = rep.verdict
        first = rep.first_divergence
        if first is not None:
            row["first_divergence"] = {"stage": first.stage, "tile": list(first.tile) if first.tile else None,
                                       "kind": first.kind.value}
        w = next((s.chained.worst for s in rep.stages if s.name == "epilogue_store" and s.chained.worst), None)
        row["worst_err_over_bound"] = w.max_ratio if w else None
        if vc.time and dev == "cuda" and rep.ok:
            row["performance"] = _time(op, vc, a, b, scales)
    except Exception as e:  # a broken op or case is a row, not the end of the sweep
        row.update(verdict="ERROR", error=f"{type(e).__name__}: {e}")
    row["seconds"] = time.perf_counter() - t0
    return row


def write_page(row: dict, rep, html_page: Optional[str], commands: Sequence) -> None:
    """A verified case's HTML page at `html_page` (if given), its file named in the row (`html`)."""
    if not html_page:
        return
    try:
        rep.write_html(html_page, tuple(commands))
        row["html"] = os.path.basename(html_page)
    except OSError as e:
        row["html_error"] = f"{type(e).__name__}: {e}"


def sweep_pages(html: Optional[str], op_spec: str, sweep_argv: Sequence[str]):
    """(page of case j and name, commands) of a verify sweep writing HTML pages to `html`."""
    from oracle.report.html import Command, page_name

    if html:
        os.makedirs(html, exist_ok=True)
    page = (lambda j, name: os.path.join(html, page_name(j, name)) if html else None)
    return page, (Command("verify the sweep again", ("python", "-m", "oracle", "verify", "--op", op_spec,
                                                     *sweep_argv)),)


def _time(op, vc: VerifyCase, a, b, scales) -> dict:
    import torch

    from oracle.run.timing import gemm_flops, time_gpu, tflops

    flops = gemm_flops(vc.m, vc.n, vc.k)
    mine = time_gpu(lambda: _call(op, vc, a, b, scales))
    if vc.call == "w4a16":  # the same GEMM with the quantised operand already dequantised, through cuBLAS
        from kernels_ref import dequant as ref_dequant
        from oracle.run.inputs import Operands

        q = vc.quant_op
        ops = Operands(a=a, b=b, **{f"{q}_scales": scales[0], f"{q}_zeros": scales[1]})
        w = ref_dequant.dequant_operand(*ops.quant_kn(q), quant_spec(vc).dequant_config)
        x, y = (w.t(), b) if q == "a" else (a, w)
        peer_name, peer = f"cuBLAS matmul on the dequantised {q.upper()}", time_gpu(lambda: torch.matmul(x, y))
    elif vc.call == "scaled_mm" or vc.dtype == "e4m3":
        s = scales if vc.call == "scaled_mm" else None
        s = s or (torch.ones((), device=a.device), torch.ones((), device=a.device))
        peer_name = "cuBLASLt _scaled_mm (fast accumulation)"
        peer = time_gpu(lambda: torch._scaled_mm(a, b, scale_a=s[0], scale_b=s[1], out_dtype=torch.bfloat16,
                                                 use_fast_accum=True))
    elif vc.dtype == "int8":
        peer_name, peer = "cuBLAS _int_mm", time_gpu(lambda: torch._int_mm(a, b))
    else:
        peer_name, peer = "cuBLAS matmul", time_gpu(lambda: torch.matmul(a, b))
    return {"op_ms": mine.median_ms, "op_TFLOPs": tflops(flops, mine.median_ms), "peer": peer_name,
            "peer_ms": peer.median_ms, "peer_TFLOPs": tflops(flops, peer.median_ms),
            "op_speed_vs_peer": peer.median_ms / mine.median_ms, "op_rse": mine.rse, "peer_rse": peer.rse}


CPU_MACS_PER_S = 4e6  # multiply-adds a second the interpreter judges on a CPU (measured: 512^3 in about 35 s)
CPU_START_S = 3.0  # the first call's compiles and a case's fixed costs, in seconds


def cpu_estimate_s(vc: VerifyCase) -> float:
    """About how many seconds judging `vc` takes under the Triton interpreter on a CPU."""
    return CPU_START_S + vc.m * vc.n * vc.k / CPU_MACS_PER_S


def _cpu_plan(cases: Sequence[VerifyCase], stream) -> None:
    """Say what a sweep on the CPU will take; CaseError when it is estimated past ORACLE_CPU_MAX_S."""
    from oracle import knobs

    total, limit = sum(cpu_estimate_s(vc) for vc in cases), knobs.CPU_MAX_S.get()
    if total > limit:
        big = max(cases, key=cpu_estimate_s)
        raise CaseError(f"verify: no GPU is visible, so the Triton interpreter would judge the {len(cases)} case(s) on "
                        f"the CPU in about {total:.0f} s (case {big.name!r}, {big.m}x{big.n}x{big.k}: about "
                        f"{cpu_estimate_s(big):.0f} s), past ORACLE_CPU_MAX_S = {limit:g} s: run on a machine with a "
                        f"GPU, give smaller shapes, or set ORACLE_CPU_MAX_S={math.ceil(total)} to wait for it")
    print(f"no GPU is visible: {len(cases)} case(s) judged on the CPU by the Triton interpreter, about {total:.0f} s",
          file=stream, flush=True)


def run_verify(op_spec: str, cases: Sequence[VerifyCase], *, shard_text: Optional[str] = None,
               jsonl: Optional[str] = None, workers: Optional[int] = None, sweep_argv: Sequence[str] = (),
               stream=None, html: Optional[str] = None) -> tuple[list[dict], int]:
    """Run the sweep (this shard of it); returns (rows, exit code: 0 all match, 1 a divergence, 2 an error).
    Progress goes to `stream` (default: sys.stderr at the time of the call, so a caller that swapped
    it, such as the warm server, gets it); without a GPU, with the CPU estimate first (_cpu_plan).
    With several visible GPUs (or `workers` > 1) one worker runs per GPU; `sweep_argv` is the part of
    the command line that names the sweep (--sweep FILE, or --shape and --dtype), for the workers.
    `html`: a folder for every case's HTML page and an index.html linking them."""
    from oracle.tools.bench import environment, parse_shard, visible_gpus
    from oracle.tools.workers import device_of_this_process, run_workers

    stream = sys.stderr if stream is None else stream
    op = load_op(op_spec)
    i, n = parse_shard(shard_text)
    indices = [j for j in range(len(cases)) if j % n == i]
    gpus = visible_gpus() if workers is None else workers
    env = environment()
    if gpus > 1 and len(indices) > 1:
        _check_workers_import(op_spec)
        rows = run_workers(lambda sub, out: ["verify", "--op", op_spec, *sweep_argv, "--shard", sub, "--jsonl", out,
                                             "--workers", "1"] + (["--html", os.path.abspath(html)] if html else []),
                           (i, n), gpus, indices, stream=stream)
        for r in rows:
            r.pop("environment", None)
    else:
        here = device_of_this_process()
        cpu = not _gpu_visible()
        if cpu:
            _cpu_plan([cases[j] for j in indices], stream)
        rows = []
        page, commands = sweep_pages(html, op_spec, sweep_argv)
        for j in indices:
            if cpu:
                vc = cases[j]
                print(f"{len(rows) + 1}/{len(indices)} {vc.name}: {vc.m}x{vc.n}x{vc.k}, about "
                      f"{cpu_estimate_s(vc):.0f} s on the CPU", file=stream, flush=True)
            rows.append({"index": j, **run_case(op, cases[j], page(j, cases[j].name), commands), **here})
            _progress(len(rows), len(indices), rows[-1], stream)
    return rows, finish_sweep(rows, jsonl, env, op_spec, html, f"verify {op_spec}")


def finish_sweep(rows: Sequence[dict], jsonl: Optional[str], env: dict, op_spec: str, html: Optional[str] = None,
                 title: str = "") -> int:
    """A sweep's rows written as JSON lines to `jsonl` (when given), each with the environment and
    the op, and an index page of the cases' HTML pages into the folder `html` (when given); and the
    sweep's exit code: 1 when a case did not match, 2 when one could not run, else 0."""
    if jsonl:
        from harness.output_files import write_text_atomically

        write_text_atomically(jsonl, "".join(json.dumps({"environment": env, "op": op_spec, **r}, default=str) + "\n"
                                             for r in rows), "JSON lines")
    if html:
        from oracle.tools.bench import write_index

        write_index(html, title or f"verify {op_spec}", rows)
    verdicts = {r["verdict"] for r in rows}
    return 1 if verdicts & {"DIVERGED", "ORACLE_UNTRUSTED", "MISTRUSTED", "KERNEL_ERROR"} else \
        2 if "ERROR" in verdicts else 0


def _gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _progress(done: int, total: int, r: dict, stream) -> None:
    bar = "#" * int(20 * done / max(total, 1))
    perf = (f" {r['performance']['op_speed_vs_peer']:.3g}x {r['performance']['peer']}" if r.get("performance")
            else "")
    print(f"[{bar:<20}] {done}/{total} {r['name']}: {r['verdict']}{perf}" +
          (f" {r['error']}" if r.get("error") else ""), file=stream, flush=True)


def table(rows: Sequence[dict]) -> str:
    from tabulate import tabulate

    out = []
    for r in rows:
        p = r.get("performance") or {}
        out.append([r["name"], "x".join(map(str, r["shape"])), r["dtype"], r["verdict"],
                    f"{r['worst_err_over_bound']:.3g}" if r.get("worst_err_over_bound") is not None else "-",
                    f"{p['op_ms']:.4g}" if p else "-", f"{p['peer_ms']:.4g}" if p else "-",
                    f"{p['op_speed_vs_peer']:.3g}" if p else "-"])
    return tabulate(out, headers=["case", "shape", "dtype", "verdict", "err/bound", "op ms", "peer ms", "speed vs peer"])

"""Track B: a standalone reproducer of a live case, written as a directory that builds with nvcc
alone and runs without Python.

Data path: Case + Operands -> the launches the oracle itself makes (oracle.run.launch.launch_sequence:
[launch] then every [[launch.next]], the tensors they share in storage order, workspaces filled as
declared, tensor maps with the case's host-side options, grids and arguments evaluated) -> a
directory:

  repro.cu       the host program, the same for every case (oracle/repro/files/repro.cu and its
                 headers host/*.cuh: inputs, launches, the reference, the comparison, the run)
  Makefile       nvcc builds kernel[_traced].cubin from the unchanged kernel source with the
                 oracle's arch, flags and include paths, and the host programs repro / repro_traced
  launch.txt     cubins, trace selection, then every launch in order: entry points, grid, block,
                 cluster, dynamic shared memory, arguments (floats as bits), tensor-map fields
  problem.txt    the problem (group sizes included; a quantised B's b_dtype, b_packing,
                 b_group_size, b_scales, b_zeros, dequant_precision), for the host reference
  inputs.txt     one line per binary file: name, role, dtype, shape, bytes, file (a quantised B's
                 files also say which part they are: quant=stored, scales or zeros)
  <name>.bin     the inputs as the kernel reads them: raw little-endian, the operand's storage order
                 (a map over padding rows reads a buffer that holds them; B of a grouped problem is
                 its stack of matrices, each in B's major, and its block scales one matrix per group,
                 [G, N / gn, K / gk] in scale_b's major; a quantised B is its stored codes, b.bin,
                 with b_scales.bin and b_zeros.bin, [K / group, N] row-major, which the host
                 reference dequantises as kernels_ref.dequant does); the group offsets; every workspace
                 (ws_NAME.bin, role inout) with the bytes the harness fills it with before the first
                 launch (zeros, the 0xFF poison or its stale pattern), never compared
  expected.bin   the oracle's reference D (oracle.judging.differential.expected_output), logical
                 [total M, N] (a grouped problem: every group's rows in order)
  bound.bin      its per-element bound: fp64, or fp32 rounded up for outputs above BOUND_F64_LIMIT
  kernel/        copies of the kernel source and its local headers (kernel/src/...: CUDA/C++ source
                 text only, oracle.repro.folder) and of the trace header (kernel/include/oracle_trace/);
                 a prebuilt cubin is copied only when it is a CUDA device image
  repro.json     the same facts for `python -m oracle compare --repro-dir` (oracle.repro.readback)
  README.txt     the commands, the launch, the tensor maps and the files copied from the kernel's folder
  manifest.json  every file above with its sha256, written last (oracle.repro.folder): the proof that
                 a later `repro --out` into the same folder replaces only the oracle's own files

Constraints: the C++ side evaluates nothing: every size, grid entry and literal is a number here.
Nothing from the case reaches a generated file unchecked: names and defines are in harness.names'
grammar (oracle.run.case_grammar, again in check_case), and every word of the Makefile is proven free of
what make or a shell would interpret before it is written (oracle.repro.makefile).
The untraced build launches the case's time_entry built without ORACLE_TRACE when there is one and
the case launches one kernel, else the traced entries from the traced build with a null sink (then
both builds share one cubin; time_entry names no untraced kernel for a later launch).
The directory is self-contained except for the CUDA toolkit and the CUTLASS headers (a Makefile
variable, defaulting to the nvidia-cutlass wheel of the machine that wrote it).
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from harness.build import HARNESS_INCLUDE_DIR
from harness.launch import ScalarArg, TensorArg, TensorMapArg
from harness.launch_abi import LibraryCall
from harness.runner import RunnerError, _check_request, sequence_roles
from harness.source_files import check_device_image_bytes
from harness.trace_format import STAGE_CODES, TraceSelection
from kernels_ref.dtypes import name_of
from oracle.problem.attention import is_attention
from oracle.repro import attention as attn
from oracle.run import attention_live
from oracle.run.case_types import Case, CaseError
from oracle.run.inputs import Operands, Provenance, check_operands, check_problem_size
from oracle.run.launch import is_library, launch_names, launch_sequence, library_call
from oracle.run.sink import check_case, default_trace_tiles, trace_selection
from oracle.repro.errors import ReproError
from oracle.repro.launch_text import (TIMEOUT_S, _launch_text, _library_launch_text, _plans, _problem_text, map_summary,
                                      sink_bytes)
from oracle.repro.folder import MANIFEST, KernelFile, ReproFolder, kernel_files, read_kernel_file
from oracle.repro.makefile import (RUN_OUTPUTS, TEMPLATE, TEMPLATE_PARTS, BuildPlan, FirstEntries, build_plan,
                                   makefile_text)

FORMAT = "oracle-repro"
VERSION = 3  # 2: every launch of the case, workspaces, grouped problems; 3: a quantised B
ATTENTION_VERSION = 4  # an attention problem (a GEMM's reproducer stays version 3: older readers read it)
READABLE_VERSIONS = (1, 2, 3, 4)
BOUND_F64_LIMIT = 1 << 22  # outputs with more elements get a float32 bound.bin (rounded up)


@dataclass(frozen=True)
class ReproDir(FirstEntries):
    """What write_repro wrote."""

    path: Path
    files: tuple[str, ...]  # relative to path
    entries_traced: tuple[str, ...]  # every launch's, in order
    entries_plain: tuple[str, ...]
    cubin_traced: str
    cubin_plain: str
    reference: bool  # expected.bin and bound.bin were written


# -------------------------------------------------------------------------------- tensors


def _raw(t: torch.Tensor) -> bytes:
    """The tensor's elements, little-endian, in memory (row-major) order."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _dtype_name(t: torch.Tensor) -> str:
    return {torch.float64: "fp64", torch.uint8: "uint8"}.get(t.dtype) or name_of(t.dtype)


def _shape(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def _major_of(spec, name: str) -> Optional[str]:
    """A matrix operand's major ("row"/"col"), None for vectors (and row-major block scales, as they
    always were)."""
    if name in ("a", "b", "c", "d"):
        return getattr(spec, f"{name}_major")
    if name in ("scale_a", "scale_b") and getattr(spec, name).kind == "block" and getattr(spec, name).major == "col":
        return "col"
    return None


def quant_part(spec, name: str) -> Optional[dict]:
    """What a file of a quantised B holds (None for any other): B's stored codes with their dtype and
    packing, its scales with their dtype and group along K, its zero points with their form."""
    if not spec.quantised_b:
        return None
    if name == "b":
        return {"part": "stored", "values": spec.b_dtype, "packing": spec.b_packing or "none"}
    if name == "b_scales":
        return {"part": "scales", "values": spec.b_scales, "group_size": spec.group_k}
    if name == "b_zeros":
        stored = {torch.int8: "int8", torch.uint8: "uint8"}.get(spec.dequant_config.zero_torch(), spec.b_scales)
        return {"part": "zeros", "values": stored, "form": spec.b_zeros}
    return None


REFERENCE_BYTES_PER_ELEMENT = 32  # the chain's float64 value and bound of each output, and the copies written


def reference_bytes(spec) -> int:
    """What expected_output holds for a reproducer's expected.bin and bound.bin: the reference chain's
    float64 value and bound of every output element, and the float32 / float64 copies written out."""
    return REFERENCE_BYTES_PER_ELEMENT * spec.total_m * spec.n


def _bound_tensor(b: torch.Tensor, n_elements: int) -> torch.Tensor:
    """The bound in float64, or in float32 rounded up (never below the oracle's) for large outputs."""
    b = b.detach().cpu().double()
    if n_elements <= BOUND_F64_LIMIT:
        return b
    b32 = b.float()
    low = b32.double() < b
    return torch.where(low, torch.nextafter(b32, torch.full_like(b32, float("inf"))), b32)


# -------------------------------------------------------------------------------- text files


# -------------------------------------------------------------------------------- Makefile, README


def _library_readme_parts(case: Case, call: LibraryCall, build: BuildPlan) -> tuple[str, str, list[str]]:
    """The kernels line, the build note and the launch lines of a launch library's README."""
    kernels = (f"Kernel: the launch library {build.source.name if build.source else ''} (ABI {call.abi}), entered "
               f"through oracle_launch, which launches its own kernels.")
    note = (f"Built twice as a shared library: {build.cubin_traced} with ORACLE_TRACE (repro_traced passes it the "
            f"host-mapped sink) and {build.cubin_plain} without (repro, a null sink). Its tensor maps and Params "
            f"are its own host code: the descriptor stages are judged only from what its kernels tap.")
    lines = [f"  oracle_launch(LaunchArgs): m {call.m}, n {call.n}, k {call.k}, tile {list(call.tile)}, batch "
             f"{call.batch}, groups {call.groups}, alpha {call.alpha!r}, beta {call.beta!r}, activation "
             f"{case.spec.activation}, bias {call.bias_kind}, splits {call.splits}, stream-K workers "
             f"{call.stream_k_workers}; on repro's stream"]
    lines += [f"     tensor {t.slot}: buffer {t.buffer}, {t.dtype}, shape {list(t.shape)}, strides {list(t.strides)} "
              f"elements" for t in call.tensors]
    lines += [f"     workspace {i} {name}: buffer {buffer}" for i, (name, buffer) in enumerate(call.workspaces)]
    return kernels, note, lines


def _quant_readme(s) -> str:
    """README's paragraph on a quantised B: its problem.txt fields and its three files."""
    if not s.quantised_b:
        return ""
    stored = (f"uint8 [{s.k // 2}, {s.n}], two k a byte in b_packing's order" if s.b_packing
              else f"{s.b_dtype} [{s.k}, {s.n}]")
    zeros = quant_part(s, "b_zeros")
    z = (f"; b_zeros.bin its {s.b_zeros} zero points, {zeros['values']} [{s.quant_groups}, {s.n}] row-major"
         if zeros else "")
    form = ("w = (q - c) * s + z, c = 8 for uint4 and 0 for a signed B" if s.b_zeros == "float_offset"
            else "w = (q - z) * s" if s.b_zeros != "none" else "w = q * s")
    scales = "raw e8m0 bytes, 2^(b - 127)," if s.b_scales == "e8m0" else s.b_scales
    text = (f"Quantised B (problem.txt): b_dtype {s.b_dtype}, b_packing {s.b_packing or 'none'}, b_group_size "
            f"{s.group_k}, b_scales {s.b_scales}, b_zeros {s.b_zeros}, dequant_precision "
            f"{s.resolved_dequant_precision}. b.bin holds B's stored codes as the kernel reads them ({stored}, "
            f"logical, stored {s.b_major}-major); b_scales.bin its scales, {scales} [{s.quant_groups}, {s.n}] "
            f"row-major, "
            f"one per {s.group_k} k and column{z} (inputs.txt: quant=stored, scales, zeros). The kernel gets them "
            f"through its arguments as the live run passes them. The host reference dequantises B as "
            f"kernels_ref/dequant.py does ({form}, in the {s.resolved_dequant_precision} arithmetic, then rounded to "
            f"{s.a_dtype}) before the GEMM; ./repro --dequant-b FILE writes that B ([K, N] row-major, fp64) without "
            f"touching the GPU.")
    return "\n" + textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def _build_and_run(headers: str) -> str:
    """The README's commands that build, run, judge and debug the reproducer (`headers`: where the
    Makefile finds headers beyond the CUDA toolkit's)."""
    return f"""Build and run (the CUDA toolkit is all it needs{headers}):
  make && ./repro                  the production entry point; prints MATCH or DIVERGED
  make TRACE=1 && ./repro_traced   the traced entry point; writes sink.bin
  python -m oracle compare --repro-dir .    judges sink.bin stage by stage (needs the oracle)
  compute-sanitizer --tool memcheck ./repro --timeout 600      (or: make sanitize)
  cuda-gdb --args ./repro          (add -G to KERNEL_FLAGS in the Makefile for device-side stepping)
  ncu --clock-control none ./repro
  make clean && make NVCC=/path/to/other/nvcc && ./repro     bisect compilers"""


def _readme(case: Case, prov: Provenance, sequence: list, build: BuildPlan, reference: bool,
            selection: TraceSelection, workspaces: list, copied: list, call: Optional[LibraryCall] = None) -> str:
    s = case.spec
    ref = ("expected.bin and bound.bin hold the oracle's reference D and per-element bounds\n"
           "(oracle.judging.differential.expected_output), so repro judges D with the oracle's own numbers." if reference else
           "No expected.bin/bound.bin were written: repro computes its own reference (below).")
    tiles = "all" if selection.tiles is None else " ".join(f"({tm}, {tn})" for tm, tn in selection.tiles)
    kbs = "all" if selection.k_blocks is None else ", ".join(map(str, selection.k_blocks))
    exprs = [str(g) for plan in _plans(case) for g in plan.grid] + \
        [str(a.expr) for plan in _plans(case) for a in plan.args if a.kind == "literal"]
    sms = (f"\nGrids and literals were evaluated with num_sms = {launch_names(case)['num_sms']} (the GPU of the machine "
           f"that wrote this, or an H200's 132 without one).") if any("num_sms" in e for e in exprs) else ""
    if build.time_entry_unused:
        cubin_note = (f"The untraced build is the traced one with a null sink: the case's time_entry "
                      f"({case.kernel.time_entry}) names the untraced kernel of one launch, and this case launches "
                      f"{len(sequence)}.")
    elif build.shared:
        cubin_note = "The untraced build is the traced one with a null sink (the case has no time_entry)."
    else:
        cubin_note = f"The untraced build has no ORACLE_TRACE and launches {build.entry_plain}."
    launch_lines = []
    for i, (_, launch) in enumerate(sequence):
        maps = [a for a in launch.args if isinstance(a, TensorMapArg)]
        plain = "" if build.entries_plain[i] == build.entries_traced[i] else f" (untraced: {build.entries_plain[i]})"
        launch_lines.append(f"  {i}: {build.entries_traced[i]}{plain}: grid {launch.grid}, block {launch.block}, "
                            f"cluster {launch.cluster}, dynamic shared memory {launch.shared_mem_bytes} bytes, "
                            f"{len(launch.args)} arguments")
        launch_lines += [f"     tensor map {j} over {a.tensor_name}: {map_summary(a.spec)}" for j, a in enumerate(maps)]
    many = len(sequence) > 1
    order = ("\nThe launches run in this order on the same buffers, each to completion before the next; the\n"
             "traced build keeps the sink set for all of them. A kernel error names its launch and entry."
             if many else "")
    ws_text = ""
    if workspaces:
        ws_text = ("\nWorkspaces (role inout; uploaded before the first launch, never compared):\n" +
                   "\n".join(f"  {name}: {nbytes} bytes, {how}" for name, nbytes, how in workspaces))
    if is_attention(s):
        return _attention_readme(case, prov, build, cubin_note, launch_lines, order + sms, tiles, kbs, ws_text,
                                 copied)
    groups = ""
    if s.group_sizes is not None:
        what = f"{len(s.groups)} groups" if s.groups is not None else f"a batch of {s.batch}"
        groups = (f"\nThe problem is {what} of {', '.join(map(str, s.group_sizes))} rows along M: A [{s.total_m}, "
                  f"{s.k}], B [{len(s.group_sizes)}, {s.k}, {s.n}] (each matrix in B's major), D [{s.total_m}, "
                  f"{s.n}];\nevery group is its own GEMM (B[g], its bias, B's block scales of the group), tiled from "
                  f"its first row, and D is judged group by group.")
    quant = _quant_readme(s)
    tiling = ", counted from each group's first row" if groups else ""
    plural = "s, in launch order" if many else ""
    if build.entries_plain == build.entries_traced:
        kernels = f"Kernel{plural}: {', '.join(build.entries_traced)}."
    else:
        kernels = f"Kernel{plural}: {', '.join(build.entries_traced)} (traced), {', '.join(build.entries_plain)} " \
                  f"(untraced)."
    if call is not None:
        kernels, cubin_note, launch_lines = _library_readme_parts(case, call, build)
    return f"""A standalone reproducer of a case's kernel launches, written by `python -m oracle repro`.

Problem: {s.describe()}; inputs: {prov.describe()}.{groups}{quant}
{kernels} {cubin_note}

{_build_and_run("; CUTLASS headers: make CUTLASS_INCLUDE=...")}

Options of repro: --dir DIR (the files; default: the executable's directory), --cubin FILE,
--timeout S (default {TIMEOUT_S}, for all launches together; 0: wait forever), --host-reference
(ignore expected.bin), --check-only [EXPECTED D] (judge a D file without running anything; no GPU
needed), --dequant-b FILE (a quantised B as the host reference dequantises it; no GPU). Exit codes:
0 MATCH, 1 DIVERGED, 2 bad usage or input files, 3 kernel error (the CUDA error's name is printed,
e.g. cudaErrorIllegalAddress; taps written before it are in sink.bin), 5 MISTRUSTED (every
reference value is zero).

Launches (launch.txt), tensor maps encoded by repro with cuTensorMapEncodeTiled (dims and box
innermost first):
{chr(10).join(launch_lines)}{order}{sms}
Trace selection (repro_traced): tiles {tiles}; k-blocks {kbs}; sink {sink_bytes(case)} bytes (sized
to the selection as a live run sizes it), host-mapped pinned memory.

Inputs (inputs.txt): raw little-endian binaries in the order the kernel reads them (an operand in
its major; a map over padding rows reads a buffer that holds them). D is poisoned with 0xFF bytes
before the first launch; elements still holding them are counted as never written.{ws_text}

Copied into this folder (regular files only: the kernel's translation unit, the local headers its
quoted #include lines reach, the trace header tree; manifest.json lists every file with its sha256):
{chr(10).join(f"  {rel}  (from {src!r})" for rel, src in copied)}

Reference: {ref}
Without them (or with --host-reference) repro computes D in double precision from the inputs
(GEMM with block scales per k-group, each group's sum times fp32(sa * sb), a quantised B
dequantised first, scale, alpha/beta, bias, activation, cast; a grouped problem group by group
with B[g] and B's block scales of group g) and uses a conservative worst-case bound, looser than
the oracle's:
1.25 (eps |alpha| S + |alpha| Q + 2^-20 (|alpha v| + |beta c| + |bias|)) + 2^-14 (|x| + |y|) for
gelu/silu + one ulp of the output type at |y|, with S = sum_k |a||b| (times |scales|) and eps =
K 2^-23 for fp32 accumulation (+ 2^-10 P/32 for fp8 partial sums over P), 2 ceil(K/16) 2^-11 for
fp16, 0 for int32; Q = sum_k |a| times the dequant bound of each w of a quantised B (the oracle's:
0 when it is exact, else for dequant_precision operand 2u(|q - z||s| + |z||s|), float_offset
2u((2 + e)|q - c||s| + (1 + e)|z|), plus a subnormal step; u of A's dtype). The order in which
partials are summed (split-K, stream-K) is inside it. It says which reference it used.
Comparison: per BM x BN tile ({s.tile.bm} x {s.tile.bn}{tiling}); bit-exact when every bound is zero (NaN
matches NaN), else |received - expected| <= bound; it prints the worst tile (err/bound), the
first bad element, NaN/Inf counts and the never-written count.
"""


def _attention_readme(case: Case, prov: Provenance, build: BuildPlan, cubin_note: str, launch_lines: list,
                      order: str, tiles: str, kbs: str, ws_text: str, copied: list) -> str:
    """README.txt of an attention case: the commands, the launches, the trace selection, the files."""
    s = case.spec
    plural = "s, in launch order" if len(build.entries_traced) > 1 else ""
    kernels = f"Kernel{plural}: {', '.join(build.entries_traced)}" + (
        "." if build.entries_plain == build.entries_traced else f" (traced), {', '.join(build.entries_plain)} "
                                                                 f"(untraced).")
    outputs = "o.bin and lse.bin" if s.lse else "o.bin"
    return f"""A standalone reproducer of an attention case's kernel launches, written by `python -m oracle repro`.

Problem: {s.describe()}; inputs: {prov.describe()}.{attn.readme_problem(s)}
{kernels} {cubin_note}

{_build_and_run("")}

Options of repro: --dir DIR (the files; default: the executable's directory), --cubin FILE,
--timeout S (default {TIMEOUT_S}, for all launches together; 0: wait forever), --check-only (judge
{outputs} as they are, without running anything; no GPU needed). Exit codes: 0 MATCH, 1 DIVERGED,
2 bad usage or input files, 3 kernel error (the CUDA error's name is printed, e.g.
cudaErrorIllegalAddress; taps written before it are in sink.bin), 5 MISTRUSTED (every reference
value is zero).

Launches (launch.txt):
{chr(10).join(launch_lines)}{order}
Trace selection (repro_traced): units (query block, query head) {tiles}, in every batch entry; KV
blocks {kbs}; the attention stages (launch.txt's trace_stages); sink {sink_bytes(case)} bytes (sized to
the selection as a live run sizes it), host-mapped pinned memory.

Inputs (inputs.txt): raw little-endian binaries in FlashAttention's layouts, as the kernel reads
them (offsets and page table int32).{ws_text}

Copied into this folder (regular files only: the kernel's translation unit, the local headers its
quoted #include lines reach, the trace header tree; manifest.json lists every file with its sha256):
{chr(10).join(f"  {rel}  (from {src!r})" for rel, src in copied)}
"""


# -------------------------------------------------------------------------------- the writer


def write_repro(case: Case, operands: Operands, provenance: Provenance, out_dir, *,
                reference: bool = True) -> ReproDir:
    """Write the reproducer of `case` with `operands` into `out_dir`: a new or empty folder, or one
    holding exactly an earlier reproducer (its manifest.json and the build's outputs), which is
    replaced; anything else is refused before a file is touched (oracle.repro.folder). With
    `reference`, expected.bin and bound.bin come from oracle.judging.differential.expected_output."""
    if case.kernel is None:
        raise CaseError("no kernel to reproduce: give --kernel FILE.cu and --entry NAME, or a [kernel] table")
    if case.kernel.include_dirs or case.kernel.nvcc_flags:  # the Makefile and kernel/ would lack them
        raise ReproError("the reproducer does not carry [kernel] include_dirs or nvcc_flags yet: its Makefile would "
                         "build another kernel than the oracle ran; compare the case live instead")
    if getattr(case.spec, "k_groups", None) is not None:
        raise ReproError(f"a K-grouped problem (k_groups = {list(case.spec.k_groups)}) has no standalone reproducer "
                         f"yet: its host reference multiplies each group over all of K, not over its own K slice; "
                         f"judge it with a live compare")
    check_case(case)  # the checks of a live run, before anything is written
    attention = is_attention(case.spec)
    if attention and not reference:
        raise ReproError("an attention reproducer is written with its reference (expected_o.bin, bound_o.bin, "
                         "expected_lse.bin, bound_lse.bin): the host program has no attention reference of its own; "
                         "drop --no-reference")
    if attention:
        attention_live.check_operands(case.spec, operands)
        attention_live.check_size(case.spec, extra=attn.reference_bytes(case.spec),
                                  extra_what="the reference O and LSE and their per-element bounds")
    elif case.spec.quantised_a:
        raise ReproError(f"a quantised A ({case.spec.a_dtype}, its scales and zero points) has no standalone "
                         f"reproducer yet: its host reference dequantises a quantised B only; judge it with a live "
                         f"compare")
    if not attention:
        check_operands(case.spec, operands)
    if reference and not attention:  # the reference D and its bound, counted with the operands before either is made
        check_problem_size(case.spec, extra=reference_bytes(case.spec),
                           extra_what="the reference D and its per-element bound (expected.bin, bound.bin)")
    out = Path(out_dir)
    call = None
    if is_library(case):  # one oracle_launch call; its LaunchArgs are written out field by field
        sequence = []
        call, tensors = library_call(case, operands)
    else:
        sequence, tensors = launch_sequence(case, operands)
        first, later = sequence[0][1], [spec for _, spec in sequence[1:]]
        try:
            _check_request(first, tensors, later)  # the harness's own checks: dtypes, maps inside their buffers
        except RunnerError as e:
            raise ReproError(f"the launch cannot be reproduced: {e}") from None
    build = build_plan(case)
    if attention:  # tiles (query block, query head), KV blocks and the attention stages, as a live run selects
        selection = trace_selection(case)
    else:
        tiles = case.trace.tiles if case.trace.tiles is not None else default_trace_tiles(case.spec)
        selection = TraceSelection(tiles=tiles, k_blocks=case.trace.k_blocks,
                                   groups=case.trace.groups)  # checked by check_case
    # Everything read from the user's files before the folder is touched: a refusal changes nothing.
    if build.prebuilt is not None:
        data, mtime = read_kernel_file(build.prebuilt, ReproError)
        check_device_image_bytes(data, f"[kernel] cubin {str(build.prebuilt)!r}", ReproError)  # never a host object
        sources = [KernelFile(build.prebuilt, "kernel_traced.cubin", data, mtime)]
        kernel_main = None
    else:
        main, found = kernel_files(build.source, (HARNESS_INCLUDE_DIR.resolve(),), ReproError)
        sources = [replace(f, rel=f"kernel/src/{f.rel}") for f in found] + _trace_header_files()
        kernel_main = f"kernel/src/{main}"
    kernel_names = [f.rel for f in sources] if build.prebuilt is None else []
    makefile = makefile_text(build, kernel_main, kernel_names,
                             outputs=RUN_OUTPUTS + attn.RUN_OUTPUTS if attention else RUN_OUTPUTS)
    launch_text = (_library_launch_text(case, call, build, selection) if call is not None
                   else _launch_text(case, sequence, build, selection))
    folder = ReproFolder(out, ReproError)  # refuses a folder that is not new, empty or the oracle's own
    cleared = False
    try:
        y = b = None
        if attention:  # [(name, role, tensor)]: the expected O and LSE and their bounds
            y = attn.expected(case.spec, operands, _bound_tensor)
        elif reference:
            from oracle.judging.differential import expected_output

            y, b = expected_output(case.spec, operands)
            y, b = y.cpu(), _bound_tensor(b, case.spec.total_m * case.spec.n)
        folder.clear()
        cleared = True
        _write_all(case, operands, provenance, folder, sequence, tensors, build, selection, sources, makefile,
                   launch_text, y, b, call)
    finally:  # after a failure too: the manifest of what was written, so the folder stays the oracle's
        if cleared:
            folder.finish()
        else:
            folder.close()
    files = tuple(sorted(folder.hashes)) + (MANIFEST,)
    return ReproDir(out, files, build.entries_traced, build.entries_plain, build.cubin_traced,
                    build.cubin_plain, reference)


def _trace_header_files() -> list[KernelFile]:
    """The trace header tree, copied under kernel/include."""
    root = HARNESS_INCLUDE_DIR.resolve()
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts:
            out.append(KernelFile(p, f"kernel/include/{p.relative_to(root)}", *read_kernel_file(p, ReproError)))
    return out


def _write_all(case: Case, operands: Operands, provenance: Provenance, folder: ReproFolder, sequence: list,
               tensors: dict, build: BuildPlan, selection: TraceSelection, sources: list, makefile: str,
               launch_text: str, y, b, call: Optional[LibraryCall] = None) -> None:
    """Every file of the reproducer but the manifest, into a folder cleared of an earlier one."""
    reference = y is not None
    write = folder.write
    for f in sources:  # the mtime is kept: an unchanged source does not rebuild the cubin
        write(f.rel, f.data, f.mtime_ns)

    s = case.spec
    attention = is_attention(s)
    if call is not None:
        roles = call.buffers()
    else:
        roles = sequence_roles(sequence[0][1], [spec for _, spec in sequence[1:]])
    declared = {f"ws_{w.name}": w for w in case.workspaces}
    manifest, tensor_meta = ["# inputs.txt: the binary files of repro; shapes in storage order"], {}
    logical = {} if attention else {"d": (s.total_m, s.n), **{n: tuple(t.shape) for n, t in operands.named().items()}}
    workspaces = []
    for name, t in tensors.items():
        role = roles[name]
        major = None if attention else _major_of(s, name)
        fname = f"{name}.bin"
        dtype = _dtype_name(t)
        nbytes = t.numel() * t.element_size()
        shape = logical.get(name, tuple(t.shape))
        line = (f"tensor name={name} role={role} dtype={dtype} shape={_shape(t.shape)} bytes={nbytes} file={fname}"
                f" logical={_shape(shape)}" + (f" major={major}" if major else ""))
        tensor_meta[name] = {"file": fname, "role": role, "dtype": dtype, "storage_shape": list(t.shape),
                             "shape": list(shape), "major": major}
        quant = None if attention else quant_part(s, name)
        if quant is not None:  # a quantised B's stored codes, scales or zero points
            line += f" quant={quant['part']}" + "".join(f" {k}={v}" for k, v in quant.items() if k != "part")
            tensor_meta[name]["quant"] = quant
        w = declared.get(name)
        if w is not None:
            line += f" workspace={w.name} init={w.init} init_dtype={w.dtype}"
            tensor_meta[name]["workspace"] = {"name": w.name, "bytes": nbytes, "init": w.init, "dtype": w.dtype}
            how = {"zero": "zeros", "poison": "the 0xFF poison",
                   "stale": f"stale data (the harness's deterministic {w.dtype} junk pattern)"}[w.init]
            workspaces.append((w.name, nbytes, f"{how}, {fname}"))
        manifest.append(line)
        if role != "out":
            write(fname, _raw(t))
    if attention:  # four files: the expected O and LSE, each with its bound, in the outputs' layouts
        for name, role, t in y:
            manifest.append(f"tensor name={name} role={role} dtype={_dtype_name(t)} shape={_shape(t.shape)} "
                            f"bytes={t.numel() * t.element_size()} file={name}.bin logical={_shape(t.shape)}")
            tensor_meta[name] = {"file": f"{name}.bin", "role": role, "dtype": _dtype_name(t),
                                 "storage_shape": list(t.shape), "shape": list(t.shape), "major": None}
            write(f"{name}.bin", _raw(t))
    elif reference:
        for name, t in (("expected", y), ("bound", b)):
            manifest.append(f"tensor name={name} role={name} dtype={_dtype_name(t)} shape={_shape(t.shape)} "
                            f"bytes={t.numel() * t.element_size()} file={name}.bin logical={_shape(t.shape)} "
                            f"major=row")
            write(f"{name}.bin", _raw(t))
    write("inputs.txt", "\n".join(manifest) + "\n")
    write("launch.txt", launch_text)
    write("problem.txt", attn.problem_text(s) if attention else _problem_text(case))
    write("repro.cu", read_kernel_file(TEMPLATE, ReproError)[0])
    for part in TEMPLATE_PARTS:  # the host program's headers, one concern each, and its kind (host/)
        write(f"host/{part.name}", read_kernel_file(part, ReproError)[0])
    write("Makefile", makefile)
    copied = [(f.rel, str(f.path)) for f in sources]
    write("README.txt", _readme(case, provenance, sequence, build, reference, selection, workspaces, copied, call))
    maps = [{"launch": i, "buffer": a.tensor_name, "spec": a.spec.to_dict()}
            for i, (_, launch) in enumerate(sequence) for a in launch.args if isinstance(a, TensorMapArg)]
    doc = {"format": FORMAT, "version": ATTENTION_VERSION if attention else VERSION, "problem": s.to_json(),
           "provenance": {"ladder": provenance.ladder, "seed": provenance.seed, "source": provenance.source,
                          "generator": provenance.generator},
           "kernel": {"entry_traced": build.entry_traced, "entry_plain": build.entry_plain,
                      "entries_traced": list(build.entries_traced), "entries_plain": list(build.entries_plain),
                      "source": str(build.source) if build.source else None,
                      "cubin_traced": build.cubin_traced, "cubin_plain": build.cubin_plain},
           "launches": [{"entry_traced": build.entries_traced[i], "entry_plain": build.entries_plain[i]}
                        | launch.to_dict() | {"args": [_json_arg(a) for a in launch.args]}
                        for i, (_, launch) in enumerate(sequence)],
           "tensormaps": maps, "tensors": tensor_meta,
           "trace": {"tiles": None if selection.tiles is None else [list(t) for t in selection.tiles],
                     "k_blocks": None if selection.k_blocks is None else list(selection.k_blocks),
                     "groups": None if selection.groups is None else list(selection.groups),
                     "capacity_bytes": sink_bytes(case), "stages": list(STAGE_CODES)},
           "reference": reference}
    if call is not None:
        doc["library"] = {"abi": call.abi, "traced": build.cubin_traced, "plain": build.cubin_plain,
                          "call": call.to_dict()}
        if case.kernel.adapter is not None:  # what its traced build serialises (Recording.serialised)
            doc["library"]["serialised"] = list(case.kernel.adapter.serialised)
    write("repro.json", json.dumps(doc, indent=1) + "\n")


def _json_arg(a) -> dict:
    if isinstance(a, TensorMapArg):
        return {"kind": "tensormap", "tensor_name": a.tensor_name}
    if isinstance(a, TensorArg):
        return {"kind": "tensor", "name": a.name, "role": a.role}
    if isinstance(a, ScalarArg):
        return {"kind": "scalar", "value": a.value, "ctype": a.ctype}
    return {"kind": "struct", "hex": a.data.hex()}


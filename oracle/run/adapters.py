"""The kernel adapters the harness ships, as a case sees them: which one a launch library's source
includes, the problems it can run, and what its traced build serialises.

Data path: the library's own source text (read, never built or run here) -> adapter_of() -> Adapter;
Adapter.unsupported(spec) lists, field by field, what the problem asks that the adapter cannot do
(oracle.run.case raises them as one CaseError when the case is loaded); Adapter.serialised goes
into every recording of the case (Recording.serialised), and the judgement lists it under what a
run did not see.

Adapter.expected_defines(spec) says what the case expects of the kernel (its tile, element types,
majors, bias and activation, and whether it splits k) as `-DORACLE_CASE_*` defines; library_defines() adds them to the library's own, and the
adapter's type checks compare them with the kernel's types at compile time (the build stops in
seconds, before the kernel is instantiated, where they differ), so a case that does not fit the kernel
is not found only by oracle_launch after the full build. The epilogue's order is the kernel's tree's,
read from the built library (oracle.run.library_epilogue), so it is not limited here.

Constraints: only an include line in the library's own file counts (`#include
"oracle_trace/cutlass.hpp"`, angle brackets too); an include through another of the user's headers
is not followed, and such a library is judged without the adapter's declarations. The C++ side
refuses the same problems again (static_assert at build, kLaunchUnsupported at launch:
harness/include/oracle_trace/cutlass/entry.hpp).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from harness import source_files
from harness.fields import shown
from harness.launch_abi import BIAS_KINDS
from harness.files import read_head
from kernels_ref.dtypes import FP8, dtype
from kernels_ref.epilogue import ACTIVATIONS
from oracle.problem.spec import ProblemSpec

MAX_SOURCE_BYTES = 1 << 20  # a library's source is read this far for its include lines

@dataclass(frozen=True)
class Adapter:
    """One shipped adapter: its name, the header a library includes, and what its traced build waits
    for that the production build does not."""

    name: str
    header: str
    serialised: tuple[str, ...]

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9_]+", self.name):
            raise ValueError(f"Adapter.name={shown(self.name)} must be [a-z0-9_]+")
        if not self.serialised or not all(isinstance(s, str) and s for s in self.serialised):
            raise ValueError(f"Adapter.serialised={shown(self.serialised)} must name what the traced build serialises")

    def unsupported(self, spec: ProblemSpec) -> list[str]:
        """Every field of `spec` this adapter cannot run, as 'field = value: why; supported: ...'."""
        if self.name != "cutlass_sm90":
            return []
        why = []
        if spec.k_groups is not None:
            why.append(f"k_groups = {shown(list(spec.k_groups))}: the adapter traces no K-grouped GEMM; supported: no "
                       f"k_groups")
        if spec.groups is not None:  # CUTLASS's grouped (pointer-array) GEMM: LinearCombination, whole tiles
            if spec.bias != "none" or spec.activation != "none":
                why.append(f"groups with bias = {shown(spec.bias)}, activation = {shown(spec.activation)}: the adapter "
                           f"traces a grouped kernel's LinearCombination epilogue only; supported: bias none, "
                           f"activation none with groups")
            if spec.splits != 1 or spec.stream_k_workers is not None:
                why.append("groups with a split of k: CUTLASS's grouped kernel runs every tile whole; supported: "
                           "splits 1, no stream_k_workers with groups")
            if spec.scale_a.kind != "none" or spec.scale_b.kind != "none":
                why.append(f"groups with scale_a.kind = {shown(spec.scale_a.kind)}, scale_b.kind = "
                           f"{shown(spec.scale_b.kind)}: a grouped kernel's epilogue is a LinearCombination; "
                           f"supported: none")
        if spec.batch != 1 and spec.bias != "none":
            why.append(f"bias = {shown(spec.bias)} with batch = {spec.batch}: the adapter passes one bias vector, not "
                       f"one per batch entry; supported: bias none with batch > 1")
        if spec.batch != 1 and (spec.splits != 1 or spec.stream_k_workers is not None):
            why.append(f"batch = {spec.batch} with a split of k: a split (CUTLASS's stream-K scheduler) is traced for "
                       f"one GEMM per call; supported: batch 1 with splits or stream_k_workers")
        # splits and stream_k_workers: a kernel built with CUTLASS's stream-K scheduler (TracedScheduler) takes
        # them (the build checks that it is one: ORACLE_CASE_SPLIT, CaseSplitCheck); its partition is read
        # from the taps
        # bias, activation and epilogue: the kernel's tree says which it has (checked at the build:
        # expected_defines, and against the built library's order: oracle.run.library_epilogue)
        kinds = (spec.scale_a.kind, spec.scale_b.kind)
        if kinds == ("block", "block"):
            why.extend(_blockwise_unsupported(spec))
            return why
        for op, kind in zip("ab", kinds):
            if kind not in ("none", "tensor"):
                why.append(f"scale_{op}.kind = {shown(kind)}: supported: none (LinearCombination) or tensor on both "
                           f"A and B (TensorScaledLinearCombination), or block on both (CUTLASS's blockwise-scaled "
                           f"fp8 mainloop)")
        if set(kinds) == {"none", "tensor"}:
            op = "b" if kinds[0] == "tensor" else "a"
            why.append(f"scale_{op}.kind = 'none' beside a per-tensor scale of the other operand: "
                       f"TensorScaledLinearCombination scales both; supported: both tensor or both none")
        if spec.a_dtype in FP8 and spec.resolved_acc_model != "fp8_fast":
            why.append(f"acc_model = {shown(spec.resolved_acc_model)}: the adapter traces fp8 through CUTLASS's "
                       f"FP8FastAccum mainloop only (WGMMA's accumulator, no promotion; the promoting FP8 mainloop "
                       f"stops the traced build at a static_assert), or with block scales through the blockwise-scaled "
                       f"one; supported: fp8_fast")
        return why


    def expected_defines(self, spec: ProblemSpec) -> dict[str, str]:
        """The case's tile, element types (launch codes), majors, bias, activation, (where > 1) batch and (where
        grouped) the group count as
        the adapter's type checks read them (ORACLE_CASE_*, harness/include/oracle_trace/cutlass/entry_checks.hpp CaseChecks); {}
        for another adapter. A major is the stride mode of unit stride in CUTLASS's (m, k), (n, k), (m, n)
        order: 1 for a row-major A, C, D and a column-major (K-contiguous) B. The bias and activation are
        launch.hpp's codes (BiasKind: none 0, row 1, col 2; Activation: kernels_ref.epilogue.ACTIVATIONS)."""
        if self.name != "cutlass_sm90":
            return {}
        out = {"ORACLE_CASE_TILE_M": spec.tile.bm, "ORACLE_CASE_TILE_N": spec.tile.bn, "ORACLE_CASE_TILE_K": spec.tile.bk,
               "ORACLE_CASE_A": dtype(spec.a_dtype).launch_code, "ORACLE_CASE_B": dtype(spec.b_dtype).launch_code,
               "ORACLE_CASE_D": dtype(spec.out_dtype).launch_code,
               "ORACLE_CASE_A_UNIT_MODE": int(spec.a_major == "row"), "ORACLE_CASE_B_UNIT_MODE": int(spec.b_major == "col"),
               "ORACLE_CASE_D_UNIT_MODE": int(spec.d_major == "row"),
               "ORACLE_CASE_BIAS": BIAS_KINDS.index(spec.bias), "ORACLE_CASE_ACTIVATION": ACTIVATIONS.index(spec.activation)}
        if spec.bias != "none":
            out["ORACLE_CASE_BIAS_DTYPE"] = dtype(spec.bias_dtype).launch_code
        if spec.partitioned:  # only then: the unsplit cases' defines (and builds) stay as they were
            out["ORACLE_CASE_SPLIT"] = 1
        if spec.c_dtype is not None:
            out.update(ORACLE_CASE_C=dtype(spec.c_dtype).launch_code, ORACLE_CASE_C_UNIT_MODE=int(spec.c_major == "row"))
        if spec.batch != 1:  # only where batched: one-GEMM cases keep sharing their build
            out["ORACLE_CASE_BATCH"] = spec.batch
        if spec.groups is not None:  # a grouped case needs a grouped kernel (CaseGroupsCheck)
            out["ORACLE_CASE_GROUPS"] = len(spec.groups)
        return {name: str(value) for name, value in out.items()}


def _blockwise_unsupported(spec: ProblemSpec) -> list[str]:
    """What a block-scaled problem asks that the traced blockwise-scaled fp8 mainloop
    (harness/include/oracle_trace/cutlass/sm90_blockwise.hpp) cannot do: one scale group per k-block, each
    k-block's WGMMA sum promoted, one GEMM of whole tiles."""
    why = []
    gk = spec.scale_a.block[1]
    if gk != spec.tile.bk:
        why.append(f"scale_a.block = {shown(list(spec.scale_a.block))}: CUTLASS's blockwise-scaled mainloop is traced "
                   f"with one scale group per k-block (ScaleGranularityK = tile.bk = {spec.tile.bk}); supported: "
                   f"[rows, {spec.tile.bk}] and [cols, {spec.tile.bk}]")
    if spec.resolved_acc_model != "fp8_promoted" or spec.promotion_interval != gk:
        why.append(f"acc_model = {shown(spec.resolved_acc_model)} with promotion_interval = "
                   f"{shown(spec.promotion_interval)}: the blockwise-scaled mainloop promotes each k-block's WGMMA sum "
                   f"(its tensor-core accumulation over the k group); supported: fp8_promoted with promotion_interval "
                   f"= the scale group's k ({gk})")
    if spec.batch != 1 or spec.partitioned:
        why.append(f"batch = {spec.batch}, splits = {spec.splits}, stream_k_workers = {shown(spec.stream_k_workers)} "
                   f"with block scales: the traced blockwise-scaled mainloop runs one GEMM of whole tiles per call; "
                   f"supported: batch 1, no split")
    return why


def library_defines(kernel, spec: ProblemSpec, *, traced: bool) -> dict[str, str]:
    """The defines a case's launch library is built with: ORACLE_TRACE (traced), the case's own, and what
    its adapter's type checks compare (Adapter.expected_defines)."""
    own = dict(kernel.defines)
    adapter = kernel.adapter
    expected = adapter.expected_defines(spec) if adapter is not None else {}
    return {**({"ORACLE_TRACE": "1"} if traced else {}), **own, **expected}


CUTLASS_SM90 = Adapter(
    "cutlass_sm90", "oracle_trace/cutlass.hpp",
    ("the CUTLASS adapter's traced mainloop waits for each k-block's WGMMAs before issuing the next (CUTLASS's "
     "own keeps one batch in flight) and reads each stage for its taps between the stage's wait and release, so the "
     "traced build runs serialised where the production kernel overlaps: a MATCH does not show the production "
     "kernel free of races (`compare --repeat N` also runs the untraced build); "
     "with fp8 fast accumulation the traced build's D is not always the production build's bit for bit (H200, "
     "cooperative e4m3, 1024x2048x1032: 2 of 2,097,152 elements one bf16 ulp apart, the cause not identified): "
     "what is judged is the traced build's arithmetic",))
ADAPTERS = (CUTLASS_SM90,)


def adapter_of(library: Optional[str]) -> Optional[Adapter]:
    """The shipped adapter the library's source includes, or None (no library, no such include, or a
    file that cannot be read: the build reports that)."""
    if library is None:
        return None
    try:  # a regular file, checked before it is opened (a FIFO never makes this wait)
        head = read_head(os.path.realpath(library), f"library {library}", MAX_SOURCE_BYTES,
                         source_files.MAX_SOURCE_BYTES, "its size limit", OSError, nofollow=True)
    except OSError:
        return None
    text = head.decode("utf-8", "replace")
    for adapter in ADAPTERS:
        pattern = r'^[ \t]*#[ \t]*include[ \t]*[<"]' + re.escape(adapter.header) + r'[>"]'
        if re.search(pattern, text, re.MULTILINE):
            return adapter
    return None

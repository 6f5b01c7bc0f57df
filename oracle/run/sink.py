"""The trace a live case asks for, and the checks made before anything is built: the tiles,
k-blocks and stages selected (trace_selection), the sink's estimate and ceiling (sink_budget,
initial_sink_bytes), and check_case, every check that needs no inputs, no build and no GPU."""

from __future__ import annotations

from dataclasses import replace


from harness import trace_format
from harness.build import check_cubin_file, check_source_file
from harness.taps import pipeline
from harness.trace_budget import TraceBudget, trace_budget
from kernels_ref.dtypes import ALL_TYPES, DTYPES
from kernels_ref.scales import groups_of_problem as scale_groups
from oracle import knobs
from oracle.problem.attention import is_attention, tap_stages
from oracle.run import attention_live
from oracle.run.case import check_trace_selection
from oracle.run.case_types import Case, CaseError
from oracle.run.case_grammar import check_case_names
from oracle.run.inputs import check_problem_size
from oracle.run.launch import is_library, launch_sequence, library_call


def default_trace_tiles(s) -> tuple[tuple[int, int], ...]:
    """The first tile, a middle one and the last (ragged) one: where defects like to hide."""
    return tuple(dict.fromkeys([(0, 0), (s.tiles_m // 2, s.tiles_n // 2), (s.tiles_m - 1, s.tiles_n - 1)]))


MIN_SINK_BYTES = 1 << 20


def check_case(case: Case) -> tuple[TraceBudget, int]:
    """Every check of a live case that needs no inputs, no build and no GPU, made before any of
    them: the [launch] table evaluated in full (grid, literals, tensor maps), the trace selection
    against the tile grid, the k-blocks and the sink's ceiling, the operands' size against the
    memory there is, and the kernel's files (a source or cubin that is a regular file within its
    size limit). Returns the sink budget (sink_budget). Raises CaseError, BuildError, InputError,
    LaunchError or TensorMapError naming what is wrong."""
    if case.kernel is None:
        raise CaseError("no kernel to run: give --kernel FILE.cu and --entry NAME, or a [kernel] table")
    check_case_names(case, CaseError)  # what reaches nvcc or a generated file, in its grammar
    # first: every later check may walk the tile grid or the partition
    (attention_live.check_size if is_attention(case.spec) else check_problem_size)(case.spec)
    if is_library(case):
        library_call(case, None)
    else:
        launch_sequence(case, None)
    check_trace_selection(case)
    budget = sink_budget(case)
    k = case.kernel
    if k.library:
        check_source_file(k.library)
    elif k.cubin:
        check_cubin_file(k.cubin)
    else:
        check_source_file(k.source)
    return budget


def _problem_stages(case: Case) -> tuple[str, ...]:
    """The stages a kernel of this problem can tap: its pipeline, epilogue in the declared order."""
    if is_attention(case.spec):
        return tap_stages(case.spec)
    return pipeline([n.step for n in case.spec.epilogue_nodes], case.spec.dequant_operands,
                    block_scaled=case.spec.block_scaled)[:-1]


def trace_selection(case: Case) -> trace_format.TraceSelection:
    default = attention_live.default_tiles if is_attention(case.spec) else default_trace_tiles
    tiles = case.trace.tiles if case.trace.tiles is not None else default(case.spec)
    s = case.spec
    if not is_attention(s) and s.group_sizes is None:  # a grouped problem's tile is matched in each group
        outside = [t for t in tiles if not (0 <= t[0] < s.tiles_m and 0 <= t[1] < s.tiles_n)]
        if outside:  # a CTA a cluster pads the grid with has such a tile: its taps would not be the problem's
            raise CaseError(f"trace selection: tile {tuple(outside[0])} is outside the problem's "
                            f"{s.tiles_m} x {s.tiles_n} tile grid")
    try:
        return trace_format.TraceSelection(tiles=tiles, k_blocks=case.trace.k_blocks,
                                           stages=case.trace.stages or _problem_stages(case), groups=case.trace.groups)
    except ValueError as e:
        raise CaseError(f"trace selection: {e}") from None


def sink_budget(case: Case) -> tuple[TraceBudget, int]:
    """The selection's size and the ceiling the sink may grow to (bytes); a selection that cannot
    fit under the ceiling is refused here, before anything is built or launched."""
    s = case.spec
    if is_attention(s):
        return _ceiling(case, attention_live.budget(s, trace_selection(case)))
    size = {f"descriptor_{op}": ALL_TYPES[getattr(s, f"{op}_dtype")].itemsize for op in "ab"}
    size.update({f"load_{op}": ALL_TYPES[getattr(s, f"{op}_dtype")].itemsize for op in "ab"})
    size.update({f"dequant_{op}": DTYPES[s.mma_dtype].itemsize for op in "ab"})
    size["epilogue_cast"] = DTYPES[s.out_dtype].itemsize
    budget = trace_budget(trace_selection(case), tiles_m=s.tiles_m, tiles_n=s.tiles_n, k_blocks=s.k_blocks,
                          block_m=s.tile.bm, block_n=s.tile.bn, block_k=s.tile.bk, itemsize=size,
                          scale_groups=scale_groups(s) or 1)
    if s.group_sizes is not None:  # a tile selector matches that tile in every selected group
        g = len(case.trace.groups or s.group_sizes)
        budget = replace(budget, least=512 + g * (budget.least - 512), estimate=512 + g * (budget.estimate - 512))
    return _ceiling(case, budget)


def _ceiling(case: Case, budget: TraceBudget) -> tuple[TraceBudget, int]:
    """The budget with the sink's ceiling; CaseError when the selection cannot fit under it."""
    mb = case.trace.capacity_mb or knobs.TRACE_MAX_MB.get()
    ceiling = mb << 20
    if budget.least > ceiling:
        per_tile = max(1, (budget.least - 512) // max(budget.tiles, 1))
        spec = case.spec
        entries = spec.batch if is_attention(spec) else len(spec.group_sizes or ())
        entries = entries if entries > 1 and case.trace.groups is None else 0
        word = "batch entries" if spec.batch > 1 else "groups"
        raise CaseError(f"the trace selection ({budget.describe()}) cannot fit in the {mb} MiB ceiling of the sink: "
                        f"raise it (ORACLE_TRACE_MAX_MB, or [trace] capacity_mb) or narrow the selection: "
                        f"--trace-tiles with at most {max(1, ceiling // per_tile)} tile(s), fewer --trace-k-blocks, "
                        f"or --trace-stages naming only the stages the kernel taps"
                        + (f", or --trace-groups naming at most 4 of its {entries} {word}" if entries else ""))
    return budget, ceiling


def initial_sink_bytes(budget: TraceBudget, ceiling: int) -> int:
    """The sink a launch starts with: the selection's estimate, at least MIN_SINK_BYTES, at most the ceiling."""
    return min(ceiling, max(MIN_SINK_BYTES, -(-budget.estimate // 4096) * 4096))

"""The CUTLASS adapter's type checks (harness/include/oracle_trace/cutlass/checks.hpp and
entry_checks.hpp) refuse, at compile time and in seconds, what the adapter cannot run:

- the tile scheduler: GroupScheduler with a problem shape that is not grouped, and in a traced build CUTLASS's StreamKScheduler untraced, stop the
  build at a static_assert naming the scheduler and what to do (for stream-K: TracedScheduler); the
  default persistent one passes, and so does the stream-K one in a production build (the checks
  compiled alone, with CUTLASS's scheduler header: a few seconds); a traced stream-K scheduler in
  the ping-pong kernel, or naming another mainloop than the kernel's, stops the build, and so does a
  split case (ORACLE_CASE_SPLIT) on the persistent scheduler;
- a case that does not fit its kernel (another tile, element type or major: the -DORACLE_CASE_* defines
  a live run builds with, oracle.run.adapters.library_defines) stops the kernel's real build the same
  way, the kernel's and the case's values named; the zoo case's own expectations pass;
- a kernel written as a user writes it (the zoo's CUTLASS types with a rank-3 problem shape, the
  stream-K scheduler, or a host-route function of another shape than make_arguments') stops its real launch-library build at the entry macro's namespace-scope check,
  with that one error, before the kernel's device code is instantiated: the refusal comes in the
  seconds the front end takes to read CUTLASS's headers, not after the full build (minutes); CUTLASS's grouped
  GEMM in the ping-pong schedule (example 57's) passes the same checks.

The builds go through the build cache (failed builds are cached too); the timed ones use a private
cache so that they compile.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cutlass_refusals import refused_early  # tests/ is on sys.path
from harness.build import BuildError, build_cubin, cutlass_include_dirs

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


SCHEDULER_TU = r'''
#include "oracle_trace/cutlass/checks.hpp"
namespace sched = cutlass::gemm::kernel::detail;
using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
static_assert(oracle_trace::cutlass_sm90::SchedulerChecks<sched::PersistentTileSchedulerSm90>::ok, "");
#if defined(CHECK_STREAM_K)
static_assert(oracle_trace::cutlass_sm90::SchedulerChecks<sched::PersistentTileSchedulerSm90StreamK<Tile, Cluster>>::ok, "");
#endif
#if defined(CHECK_GROUP)
#include "cutlass/gemm/group_array_problem_shape.hpp"
using Group = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
static_assert(oracle_trace::cutlass_sm90::SchedulerChecks<sched::PersistentTileSchedulerSm90Group<Group, 2>>::ok, "");
#endif
'''


def _refusal(source: str, **kw) -> str:
    with pytest.raises(BuildError) as e:
        build_cubin(source, **kw)
    return e.value.stderr or ""


@pytest.mark.every_build
def test_the_default_persistent_scheduler_passes_the_checks():
    build_cubin(SCHEDULER_TU)


@pytest.mark.every_build
def test_stream_k_untraced_and_group_schedulers_are_refused_with_their_names_and_what_to_do():
    err = _refusal(SCHEDULER_TU, defines={"ORACLE_TRACE": "1", "CHECK_STREAM_K": "1", "CHECK_GROUP": "1"})
    assert "2 errors detected" in err, err[-3000:]
    assert ("the kernel's tile scheduler is cutlass::gemm::StreamKScheduler (stream-K and split-K) untraced: its "
            "fixup (a reduction of partial tiles) and each work unit's partial would be missed") in err, err[-3000:]
    assert ("write GemmUniversal's fourth template argument as oracle_trace::cutlass_sm90::TracedScheduler<"
            "cutlass::gemm::StreamKScheduler, CollectiveMainloop>") in err
    assert ("the kernel's tile scheduler is cutlass::gemm::GroupScheduler, which deals a grouped GEMM's tiles, and "
            "its problem shape is not grouped") in err


@pytest.mark.every_build
def test_the_stream_k_scheduler_passes_in_a_production_build():
    build_cubin(SCHEDULER_TU, defines={"CHECK_STREAM_K": "1"})  # without ORACLE_TRACE: CUTLASS's own kernel


# A user's kernel: the zoo's CUTLASS collectives (types only), the adapter's traced aliases, and a
# GemmUniversal the adapter cannot run.
USER_TU = r'''
#define ZOO_CUTLASS_PLAIN 1
#define ZOO_CUTLASS_TYPES_ONLY 1
#include "cutlass_sm90.cu"
#include "oracle_trace/cutlass.hpp"

using CollectiveMainloop = oracle_trace::cutlass_sm90::TracedMainloop<zoo_cutlass::BuiltMainloop>;
using CollectiveEpilogue = oracle_trace::cutlass_sm90::TracedEpilogue<zoo_cutlass::BuiltEpilogue>;
#if defined(USER_RANK_3)  // CUTLASS's example 48 writes a rank-3 problem shape
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
#elif defined(USER_STATIC_L)  // L fixed to 1 at compile time: no batch
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, cute::_1>, CollectiveMainloop,
                                                        CollectiveEpilogue>;
#elif defined(USER_GROUPED_PINGPONG)  // CUTLASS's grouped GEMM as its example 57 writes it, ping-pong schedule
using namespace cute;
using GroupedEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, zoo_cutlass::TileShape, zoo_cutlass::ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, zoo_cutlass::ElementC, zoo_cutlass::LayoutC*, 8,
    zoo_cutlass::ElementD, zoo_cutlass::LayoutD*, 8, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>::CollectiveOp;
using GroupedMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, zoo_cutlass::ElementA, zoo_cutlass::LayoutA*, 8,
    zoo_cutlass::ElementB, zoo_cutlass::LayoutB*, 8, float, zoo_cutlass::TileShape, zoo_cutlass::ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename GroupedEpilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>::CollectiveOp;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>,
                                                        oracle_trace::cutlass_sm90::TracedMainloop<GroupedMainloop>,
                                                        oracle_trace::cutlass_sm90::TracedEpilogue<GroupedEpilogue>>;
#elif defined(USER_STREAM_K)
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;
#elif defined(USER_TRACED_STREAM_K)  // with ZOO_CUTLASS_PINGPONG, or naming CUTLASS's own mainloop
#if defined(USER_OTHER_MAINLOOP)
using Named = zoo_cutlass::BuiltMainloop;
#else
using Named = CollectiveMainloop;
#endif
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue,
    oracle_trace::cutlass_sm90::TracedScheduler<cutlass::gemm::StreamKScheduler, Named>>;
#else
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue>;
#endif
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

#if defined(USER_CHECKS_ONLY)  // the entry macros' checks alone, no kernel instantiated
static_assert(oracle_trace::cutlass_sm90::EntryChecks<Gemm>::ok && oracle_trace::cutlass_sm90::CaseChecks<Gemm>::ok, "");
#elif defined(USER_BAD_MAKE)  // the host route with a function of another shape: no l, no leading dimensions
Gemm::Arguments make_arguments(int m, int n, int k, zoo_cutlass::ElementA const* a, zoo_cutlass::ElementB const* b,
                               zoo_cutlass::ElementC const* c, zoo_cutlass::ElementD* d, float alpha, float beta);
ORACLE_CUTLASS_HOST_ENTRY(Gemm, make_arguments)
#else
ORACLE_CUTLASS_ENTRY(Gemm)
#endif
'''


@pytest.mark.parametrize("defines, words", [
    ({"USER_RANK_3": "1"}, "the kernel's problem shape must be (M, N, K, L): write GemmUniversal<Shape<int, int, int, int>, "
                    "...> (a rank-3 Shape<int, int, int>, as in CUTLASS's example 48, has no L: add the fourth int)"),
    ({"USER_STREAM_K": "1"}, "the kernel's tile scheduler is cutlass::gemm::StreamKScheduler (stream-K and "
                             "split-K) untraced"),
    ({"USER_TRACED_STREAM_K": "1", "ZOO_CUTLASS_PINGPONG": "1"},
     "the stream-K scheduler runs in CUTLASS's cooperative kernel only"),
    ({"USER_TRACED_STREAM_K": "1", "USER_OTHER_MAINLOOP": "1"},
     "TracedScheduler<cutlass::gemm::StreamKScheduler, Mainloop> must name the kernel's CollectiveMainloop"),
    ({"USER_BAD_MAKE": "1"}, "ORACLE_CUTLASS_HOST_ENTRY(Gemm, make): make must be callable as make(int m, int n, "
                             "int k, int l, const ElementA* a, int64_t lda,"),
], ids=["rank3", "stream_k", "stream_k_pingpong", "stream_k_other_mainloop", "host_make_signature"])
@pytest.mark.every_build
def test_a_kernel_the_adapter_cannot_run_is_refused_before_the_long_compile(tmp_path, defines, words):
    err = refused_early(USER_TU, tmp_path / "cache", defines={"ORACLE_TRACE": "1", **defines}, include_dirs=(ZOO,))
    assert words in err, err[-3000:]
    errors = [line for line in err.splitlines() if ": error:" in line]
    if "USER_BAD_MAKE" not in defines:  # (a call of make that does not fit is also an error where it is made)
        assert "1 error detected" in err, err[-3000:]  # the check's, nothing from the kernel's instantiation


@pytest.mark.every_build
def test_the_grouped_kernel_in_the_ping_pong_schedule_passes_the_checks():
    """CUTLASS's grouped GEMM as example 57 writes it in the ping-pong schedule (KernelPtrArrayTmaWarpSpecialized
    Pingpong with PtrArrayTmaWarpSpecializedPingpong), traced: the entry macros' checks pass (its full build:
    tests/cpu/test_cutlass_grouped_pingpong.py)."""
    build_cubin(USER_TU, defines={"ORACLE_TRACE": "1", "USER_GROUPED_PINGPONG": "1", "USER_CHECKS_ONLY": "1"},
                include_dirs=(ZOO,))


# The zoo kernel's types, traced, checked against a case's expectations (ORACLE_CASE_*) alone.
CASE_TU = r'''
#define ZOO_CUTLASS_PLAIN 1
#define ZOO_CUTLASS_TYPES_ONLY 1
#include "cutlass_sm90.cu"
#include "oracle_trace/cutlass.hpp"

using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, oracle_trace::cutlass_sm90::TracedMainloop<zoo_cutlass::BuiltMainloop>,
    oracle_trace::cutlass_sm90::TracedEpilogue<zoo_cutlass::BuiltEpilogue>>>;
static_assert(oracle_trace::cutlass_sm90::EntryChecks<Gemm>::ok && oracle_trace::cutlass_sm90::CaseChecks<Gemm>::ok, "");
'''


def _zoo_case(over=None):
    from oracle.run.case import load_case

    return load_case(str(ZOO / "cutlass_sm90.toml"), over, allow_library=True)


@pytest.mark.every_build
def test_the_zoo_case_s_expectations_fit_its_kernel():
    case = _zoo_case({"m": 64})  # C, D row-major, a bf16 C
    expected = case.kernel.adapter.expected_defines(case.spec)
    assert {"ORACLE_CASE_TILE_K", "ORACLE_CASE_C", "ORACLE_CASE_C_UNIT_MODE"} <= set(expected), expected
    build_cubin(CASE_TU, defines=expected, include_dirs=(ZOO,))


def test_a_case_that_does_not_fit_the_kernel_stops_its_build_before_the_long_compile(tmp_path):
    from oracle.run.adapters import library_defines

    case = _zoo_case({"tile": [128, 64, 64], "a_major": "col"})
    err = refused_early(case.kernel.library, tmp_path / "cache", arch=case.kernel.arch,
                        defines=library_defines(case.kernel, case.spec, traced=True))  # as a live run builds it
    assert "the kernel's CTA tile (TileShape) is not the case's [problem] tile" in err, err[-3000:]
    assert "KernelBM=128, KernelBN=128, KernelBK=64, CaseBM=128, CaseBN=64, CaseBK=64" in err, err[-3000:]
    assert "the kernel's layout of an operand is not the case's *_major" in err, err[-3000:]
    assert "Operand=oracle_trace::cutlass_sm90::OperandA, KernelUnitMode=1, CaseUnitMode=0" in err, err[-3000:]
    assert "2 errors detected" in err, err[-3000:]


@pytest.mark.every_build
def test_a_batched_case_on_a_kernel_whose_l_is_fixed_stops_its_build_before_the_long_compile(tmp_path):
    """A batched case's ORACLE_CASE_BATCH against a kernel whose problem shape fixes L = 1 (Shape<int, int, int,
    _1>): CaseBatchCheck names both, in the front end's seconds."""
    case = _zoo_case({"batch": 3})
    expected = case.kernel.adapter.expected_defines(case.spec)
    assert expected["ORACLE_CASE_BATCH"] == "3"
    err = refused_early(USER_TU, tmp_path / "cache", defines={"ORACLE_TRACE": "1", "USER_STATIC_L": "1", **expected},
                        include_dirs=(ZOO,))
    assert "the kernel's problem shape fixes L at compile time to another value than the case's [problem] batch" in err, \
        err[-3000:]
    assert "KernelL=1, KernelBatchStrides=true, CaseBatch=3" in err, err[-3000:]
    assert "1 error detected" in err, err[-3000:]


@pytest.mark.every_build
def test_a_grouped_case_on_a_kernel_that_is_not_grouped_stops_its_build_before_the_long_compile(tmp_path):
    """A grouped case's ORACLE_CASE_GROUPS against the zoo's plain (M, N, K, L) kernel: CaseGroupsCheck names
    both, in the front end's seconds."""
    from oracle.run.adapters import library_defines

    case = _zoo_case({"groups": [100, 0, 200]})
    defines = library_defines(case.kernel, case.spec, traced=True)  # as a live run builds it
    assert defines["ORACLE_CASE_GROUPS"] == "3"
    err = refused_early(case.kernel.library, tmp_path / "cache", arch=case.kernel.arch, defines=defines)
    assert "the case is grouped ([problem] groups) but the kernel is not" in err, err[-3000:]
    assert "KernelGrouped=false, CaseGroups=3" in err, err[-3000:]
    assert "1 error detected" in err, err[-3000:]


@pytest.mark.every_build
def test_a_split_case_on_the_persistent_scheduler_stops_its_build_before_the_long_compile(tmp_path):
    from oracle.run.adapters import library_defines

    case = _zoo_case({"splits": 3})  # the zoo's kernel without ZOO_CUTLASS_STREAMK: CUTLASS's persistent scheduler
    err = refused_early(case.kernel.library, tmp_path / "cache", arch=case.kernel.arch,
                        defines=library_defines(case.kernel, case.spec, traced=True))  # as a live run builds it
    assert ("the case splits k (splits > 1 or stream_k_workers) but the kernel's tile scheduler is CUTLASS's "
            "persistent one, which never splits a tile") in err, err[-3000:]
    assert "1 error detected" in err, err[-3000:]


@pytest.mark.every_build
def test_the_stream_k_case_s_expectations_fit_its_kernel():
    from oracle.run.case import load_case

    case = load_case(str(ZOO / "splitk.toml"), allow_library=True)
    expected = case.kernel.adapter.expected_defines(case.spec)
    assert expected["ORACLE_CASE_SPLIT"] == "1", expected
    source = CASE_TU.replace("oracle_trace::cutlass_sm90::TracedEpilogue<zoo_cutlass::BuiltEpilogue>>>;",
                             "oracle_trace::cutlass_sm90::TracedEpilogue<zoo_cutlass::BuiltEpilogue>, "
                             "cutlass::gemm::StreamKScheduler>>;")
    assert source != CASE_TU
    build_cubin(source, defines=expected, include_dirs=(ZOO,))

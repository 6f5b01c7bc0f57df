"""Test tiers. The CPU tier runs everywhere with Triton under its interpreter (selected here, as
the package selects it, when no GPU is visible); the GPU tier (marker `gpu`) needs a CUDA device
and is skipped with a reason elsewhere. The build tier (marker `every_build`, option --every-build)
compiles what the CPU tier leaves out to stay within ten minutes on two cores: the CuTe Hopper, the
DeepGEMM-style and the attention kernels, every CUTLASS library, program and front-end check but one,
and the planted defects' variants (seconds to two minutes of nvcc each); the GPU tier's machine builds
the same variants to run them."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # shared test helpers (compare_checks)
# the repository root, for what tests share with the benchmarks (benchmarks.numerics.inputs)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # torch missing or broken: the CPU tier still reports it
    _HAS_CUDA = False
else:
    # The package's own rule, before any test module defines a kernel: the interpreter when no GPU
    # is visible and TRITON_INTERPRET is unset (so the README's command needs no variable).
    from kernels_ref._interpret import choose_backend

    choose_backend()
    import interpreter_patching  # tests/ is on sys.path: the interpreter's nested calls, patched once per launch
    import launch_memo  # and a launch seen before, with the same bytes in, served from memory

    interpreter_patching.install()
    launch_memo.install()


# Math libraries' thread pools, per xdist worker: each takes its share of the cores. Left at their
# defaults (one thread per core each), n workers run n times as many spinning threads as there are
# cores, and a small float64 matmul then waits tens of milliseconds instead of tens of microseconds.
THREAD_POOL_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _share_the_cores(config) -> None:
    """Set before the workers start, so that they (and the processes they run) inherit it; a value
    the user set is kept."""
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for name in THREAD_POOL_VARIABLES:
        os.environ.setdefault(name, str(max(1, cores // workers)))


def pytest_addoption(parser):
    parser.addoption("--every-build", action="store_true",
                     help="also compile every zoo variant (marker every_build: 78 tests, about 11 minutes on two cores)")


def pytest_configure(config):
    _share_the_cores(config)
    # A child started ahead after one test's live run would be taken by the next test's run, or keep
    # a test's own prestart from starting one: tests that want one set the knob themselves.
    os.environ.setdefault("ORACLE_CHILD_AHEAD_S", "0")
    config.addinivalue_line("markers", "every_build: compiles CUTLASS, CuTe or a zoo variant, which the CPU tier leaves out "
                                       "(run with --every-build)")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the H200)")
    config.addinivalue_line("markers", "nvcc: needs the CUDA compiler nvcc on PATH (no GPU needed)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on the CPU tier")
    # `--dist loadfile` hands out files in the order collected (below), not by test count.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# The CPU tier's longest files (nvcc builds, reproducers, interpreter-heavy references), started
# first, longest first, so that no worker is left with one of them at the end; the two workers take them
# in turns. A file's builds run one after another on its worker, so a file of many builds is cut in
# files of a few (the CUTLASS ones: about 45 s of one core each, cold); files that share a build
# through the cache (the traced CUTLASS library: the adapter's, the SASS identity's, the EVT file's)
# are kept apart in this order so that one seldom waits on the other's build lock. Most of these builds
# are the build tier's (--every-build); without it their tests are skipped and the order costs nothing.
LONG_FIRST = (
    "cpu/test_zoo_build_hopper.py",  # the CuTe Hopper GEMM built traced and plain
    "cpu/test_zoo_build.py",  # the sm80 GEMM traced and plain, its layout program
    "cpu/test_cutlass_evt_defects.py",  # three CUTLASS EVT builds
    "cpu/test_cutlass_grouped.py",  # two CUTLASS grouped (pointer-array) builds
    "cpu/test_cutlass_grouped_pingpong.py",  # two CUTLASS grouped builds in the ping-pong schedule
    "cpu/test_cutlass_stream_k_library.py",  # two CUTLASS stream-K builds (quick and host routes)
    "cpu/test_cutlass_evt.py",  # two CUTLASS EVT builds (and the traced LinearCombination library), refusals
    "cpu/test_cutlass_adapter.py",  # two CUTLASS builds (quick and host routes)
    "cpu/test_cutlass_batched.py",  # two CUTLASS batched builds
    "cpu/test_cutlass_batched_host.py",  # two CUTLASS batched builds
    "cpu/test_repro.py",  # make builds the cubins; the host programs, Hopper and split builds are shared
    "cpu/test_cutlass_sass_identity.py",  # two CUTLASS cubins
    "cpu/test_cutlass_checks.py",  # the checks' front-end builds and refusals
    "cpu/test_cutlass_blockwise.py",  # the blockwise-scaled kernel's front-end refusals
    "cpu/test_cutlass_tap_maps.py",  # two CUTLASS host programs
    "cpu/test_launch_library.py",
    "cpu/test_zoo_build_split.py",
    "cpu/test_zoo_build_attention.py",
    "zoo/test_cutlass_streamk_model.py",  # the stream-K entries judged on a model, under the interpreter
    "zoo/test_cutlass_grouped_model.py",
    "zoo/test_cutlass_batched_model.py",
    "zoo/test_cutlass_blockwise_model.py",
    "cpu/test_sass_identity.py",
    "cpu/test_ref_mma_fp16.py",
    "cpu/test_fuzz_inputs.py",
    "cpu/test_fuzz_commands.py",
    "cpu/test_docs_commands.py",
    "cpu/test_api.py",
    "cpu/test_zoo_dumps_attention.py",
    "cpu/test_zoo_dumps_cutlass_coop.py",  # the largest recordings, replayed under the interpreter
    "cpu/test_zoo_dumps_cutlass_pingpong.py",
    "cpu/test_zoo_dumps_cutlass_more.py",
    # The session's host programs, built once by test_repro's worker (about a minute of nvcc, cold):
    # these take them after the long files above, so that the other worker does not sit on the lock.
    "cpu/test_repro_security.py",
    "cpu/test_repro_quant.py",  # and its own wrong-nibble twin
    "cpu/test_repro_grouped_scales.py",  # on grouped block-scaled reproducers
)

def pytest_collection_modifyitems(config, items):
    import shutil

    skip_gpu = pytest.mark.skip(reason="This test needs a CUDA GPU, and none is visible on this machine.")
    skip_nvcc = pytest.mark.skip(reason="This test needs nvcc on PATH to compile CUDA, and it is not installed here.")
    skip_build = pytest.mark.skip(reason="The build tier: this test compiles CUTLASS, CuTe or a zoo variant, which the "
                                         "CPU tier leaves out; run it with --every-build.")
    every_build = config.getoption("--every-build")
    for item in items:
        if "every_build" in item.keywords and not every_build:
            item.add_marker(skip_build)
        if "gpu" in item.keywords and not _HAS_CUDA:
            item.add_marker(skip_gpu)
        if "nvcc" in item.keywords and shutil.which("nvcc") is None:
            item.add_marker(skip_nvcc)
    count: dict[str, int] = {}
    for item in items:
        count[item.path] = count.get(item.path, 0) + 1

    def rank(item):
        path = "/".join(item.path.parts[-2:])
        return (LONG_FIRST.index(path), 0) if path in LONG_FIRST else (len(LONG_FIRST), -count[item.path])

    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True, scope="session")
def _every_report_follows_its_schema():
    """Every report any test makes (oracle.report.table.to_json) is validated against the shipped JSON
    Schema (oracle/report/schema.json), so the schema and the reports cannot drift apart."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:  # the dev extra installs it; without it the schema test says so
        yield
        return
    from oracle.report import table as report

    real = report.to_json

    def checked(an, extra=None, *args, **kwargs):
        doc = real(an, extra, *args, **kwargs)
        report.validate(json.loads(json.dumps(doc, allow_nan=False, default=str)))
        return doc

    report.to_json = checked
    yield
    report.to_json = real


@pytest.fixture(scope="module")
def zoo_builds(request):
    """The test module's ZOO_SOURCE built traced and plain (cuda_tools.traced_and_plain), once per module."""
    from cuda_tools import traced_and_plain

    return traced_and_plain(request.module.ZOO_SOURCE)


@pytest.fixture(scope="session")
def hopper_builds():
    """The CuTe Hopper GEMM of the zoo built traced and plain, both at once and once per session (a
    CuTe build takes minutes on two cores): the zoo's build tests and the reproducer's share it."""
    from cuda_tools import require_nvcc
    from harness.build import cutlass_include_dirs

    require_nvcc()
    if not cutlass_include_dirs():
        pytest.skip("The Hopper GEMM is written with CuTe: install the nvidia-cutlass wheel for its headers.")
    from cuda_tools import HOPPER_SOURCE, traced_and_plain

    return traced_and_plain(HOPPER_SOURCE)

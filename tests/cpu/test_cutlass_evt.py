"""The CUTLASS adapter's EVT epilogues without a GPU, on the zoo's bias + GELU kernel
(zoo/cutlass_sm90/cutlass_sm90.cu with ZOO_CUTLASS_BIAS_GELU):

- the traced library of CUTLASS's LinCombPerColBiasEltAct<GELU> fusion and that of the user's own
  Sm90EVT tree (Tap and Fused marks, ZOO_CUTLASS_EVT) each keep the order their tree computes as text,
  which the oracle reads from the built file (oracle.run.library_epilogue): alpha, bias, beta_c,
  activation, cast; CUTLASS's LinearCombination tree keeps alpha_beta, cast;
- a case without `epilogue` is judged in the tree's order; one that declares another is refused with
  both orders named; beta_c leaves the order where beta is 0 (its tap is off);
- every defect planted in the user's tree builds, its order the intended one (three more CUTLASS
  compiles: test_cutlass_evt_defects.py, which --dist loadfile builds beside this file's);
- a case whose bias or activation is not the fusion's stops the library's build in seconds (the
  -DORACLE_CASE_* checks), and oracle_launch refuses one before any CUDA call.

The builds are the ones a live run makes (oracle.run.adapters.library_defines of the zoo's cases),
through the oracle's build cache, so a later run of the same case reuses them. The two EVT libraries are
the build tier's (marker every_build), with the LinearCombination library the adapter's tests share; the
CPU tier judges the order the EVT libraries declare without building them, and the refusals in seconds.
"""

from __future__ import annotations

import ctypes
import dataclasses
from functools import lru_cache
from pathlib import Path

import pytest

from cutlass_refusals import refused_early  # tests/ is on sys.path
from harness import launch_abi as L
from harness.build import build_library, cutlass_include_dirs
from oracle.run.adapters import library_defines
from oracle.run.case import load_case
from oracle.run.case_types import CaseError
from oracle.run.library_epilogue import declared_order, with_library_order

pytestmark = pytest.mark.nvcc

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"
TREE_ORDER = ("alpha", "bias", "beta_c", "activation", "cast")  # CUTLASS's LinCombPerColBiasEltAct


@pytest.fixture(scope="module", autouse=True)
def _needs_cutlass():
    if not cutlass_include_dirs():
        pytest.skip("The nvidia-cutlass wheel (CUTLASS's headers) is not installed.")


def _case(name: str, over=None):
    return load_case(str(ZOO / name), over or {}, allow_library=True)


@lru_cache(maxsize=None)
def _built(name: str):
    """The traced library of the zoo case `name` as a live run builds it."""
    case = _case(name)
    return build_library(case.kernel.library, arch=case.kernel.arch,
                         defines=library_defines(case.kernel, case.spec, traced=True))


@pytest.mark.every_build
@pytest.mark.parametrize("name", ["bias_gelu.toml", "evt.toml"], ids=["cutlass_fusion", "user_tree"])
def test_the_traced_library_keeps_its_tree_s_order(name):
    assert declared_order(_built(name).read()) == TREE_ORDER


@pytest.mark.every_build
def test_the_linear_combination_tree_keeps_alpha_beta_then_cast():
    case = _case("cutlass_sm90.toml")  # the build tests/cpu/test_cutlass_adapter.py makes
    lib = build_library(case.kernel.library, arch=case.kernel.arch, defines={"ORACLE_TRACE": "1"})
    assert declared_order(lib.read()) == ("alpha_beta", "cast")


def test_a_case_without_epilogue_is_judged_in_the_tree_s_order():
    order = TREE_ORDER  # what the library declares (test_the_traced_library_keeps_its_tree_s_order)
    case = _case("bias_gelu.toml")
    assert case.spec.epilogue is None
    judged, note = with_library_order(case, order)
    assert judged.spec.epilogue == TREE_ORDER
    assert [n.token for n in judged.spec.epilogue_nodes] == list(TREE_ORDER)
    assert "the library's tree's (the case declares none)" in note
    # the same order declared: kept, and said so
    same, note = with_library_order(_case("bias_gelu.toml", {"epilogue": list(TREE_ORDER)}), order)
    assert same.spec.epilogue == TREE_ORDER and "declared by the case and by the library's tree" in note
    # beta = 0: the tree's beta_c adds nothing and its tap is off
    no_c, _ = with_library_order(_case("bias_gelu.toml", {"beta": 0.0, "c_dtype": None}), order)
    assert no_c.spec.epilogue == ("alpha", "bias", "activation", "cast")


def test_a_case_that_declares_another_order_is_refused_naming_both():
    order = TREE_ORDER
    other = ["alpha_beta", "bias", "activation", "cast"]  # the order of a kernel that adds beta * C first
    with pytest.raises(CaseError) as e:
        with_library_order(_case("bias_gelu.toml", {"epilogue": other}), order)
    msg = str(e.value)
    assert "[problem] epilogue = ['alpha_beta', 'bias', 'activation', 'cast'] is not the order the library's " \
           "epilogue tree computes, ['alpha', 'bias', 'beta_c', 'activation', 'cast']" in msg, msg


@pytest.mark.every_build
def test_a_bias_or_activation_the_fusion_lacks_stops_the_build_in_seconds(tmp_path):
    case = _case("bias_gelu.toml", {"bias": "row", "activation": "gelu_tanh"})
    err = refused_early(case.kernel.library, tmp_path / "cache", arch=case.kernel.arch,
                        defines=library_defines(case.kernel, case.spec, traced=True))  # as a live run builds it
    assert "the kernel's epilogue bias is not the case's [problem] bias" in err, err[-3000:]
    assert "KernelBias=2, CaseBias=1" in err, err[-3000:]
    assert "the kernel's epilogue activation is not the case's [problem] activation" in err, err[-3000:]
    assert "KernelActivation=2, CaseActivation=3" in err, err[-3000:]
    assert "2 errors detected" in err, err[-3000:]


def _call(**over) -> L.LibraryCall:
    m, n, k = 300, 392, 520
    tensors = (L.TensorSlotArg("a", "a", "bf16", (m, k), (k, 1)),
               L.TensorSlotArg("b", "b", "bf16", (k, n), (1, k)),
               L.TensorSlotArg("c", "c", "bf16", (m, n), (n, 1)),
               L.TensorSlotArg("d", "d", "bf16", (m, n), (n, 1), "out"))
    kw = dict(m=m, n=n, k=k, tile=(128, 128, 64), tensors=tensors, alpha=0.75, beta=0.5, bias_kind="col",
              activation=2)
    kw.update(over)
    return L.LibraryCall(**kw)


def _launch(path: Path, call: L.LibraryCall) -> tuple[int, str]:
    """oracle_launch on fake device addresses: only calls refused before any CUDA call are safe."""
    names = {t.buffer for t in call.tensors}
    filled = L.fill(call, {b: 4096 * (i + 1) for i, b in enumerate(sorted(names))}, {b: 1 for b in names})
    lib = ctypes.CDLL(str(path))
    lib.oracle_launch.restype = ctypes.c_int
    lib.oracle_launch.argtypes = [ctypes.c_void_p]
    return lib.oracle_launch(filled.address), filled.message()


@pytest.mark.parametrize("over, words", [
    ({"activation": 1}, "the kernel's epilogue adds bias col and activation gelu_erf; the case asks for bias col and "
                        "activation relu"),
    ({"bias_kind": "row"}, "the kernel's epilogue adds bias col and activation gelu_erf; the case asks for bias row"),
    ({}, "the bias must be a contiguous [N] = [392] vector of element type bf16 (got none, rank 0)"),
])
@pytest.mark.every_build
def test_oracle_launch_refuses_a_bias_or_activation_the_fusion_lacks(over, words):
    got, message = _launch(_built("bias_gelu.toml").cubin_path, _call(**over))
    assert got == 1001 and words in message, message


def test_a_library_s_order_text_is_checked():
    good = b"\x00junk" + b"oracle_trace:epilogue_order=alpha_beta,cast\x00" + b"more"
    assert declared_order(good) == ("alpha_beta", "cast")
    assert declared_order(b"no order here") is None
    assert declared_order(b"oracle_trace:epilogue_order=\x00") is None  # the prefix alone declares nothing
    with pytest.raises(CaseError, match="declares 2 epilogue orders"):
        declared_order(good + b"oracle_trace:epilogue_order=cast\x00")
    with pytest.raises(CaseError, match="not an epilogue order"):
        declared_order(b"oracle_trace:epilogue_order=alpha,cast,bias\x00")
    with pytest.raises(CaseError, match="does not end within 256 bytes"):
        declared_order(b"oracle_trace:epilogue_order=" + b"a" * 300)
    assert dataclasses.is_dataclass(_case("bias_gelu.toml"))


# The user's own tree entered through ORACLE_CUTLASS_ENTRY, which cannot fill its arguments.
NO_FILL_TU = r'''
#define ZOO_CUTLASS_PLAIN 1
#define ZOO_CUTLASS_TYPES_ONLY 1
#define ZOO_CUTLASS_BIAS_GELU 1
#define ZOO_CUTLASS_EVT 1
#include "cutlass_sm90.cu"
#include "oracle_trace/cutlass.hpp"

using Gemm = cutlass::gemm::device::GemmUniversalAdapter<cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, oracle_trace::cutlass_sm90::TracedMainloop<zoo_cutlass::BuiltMainloop>,
    oracle_trace::cutlass_sm90::TracedEpilogue<zoo_cutlass::BuiltEpilogue>>>;
ORACLE_CUTLASS_ENTRY(Gemm)
'''


@pytest.mark.every_build
def test_a_user_s_tree_without_its_fill_function_is_refused_in_seconds(tmp_path):
    err = refused_early(NO_FILL_TU, tmp_path / "cache", defines={"ORACLE_TRACE": "1"}, include_dirs=(ZOO,))
    assert "the epilogue is your own Sm90EVT tree, whose arguments the adapter cannot fill: use " \
           "ORACLE_CUTLASS_ENTRY_WITH(Gemm, fill)" in err, err[-3000:]
    assert "1 error detected" in err, err[-3000:]

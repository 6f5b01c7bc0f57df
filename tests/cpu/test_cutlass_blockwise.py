"""CUTLASS's blockwise-scaled fp8 mainloop through the adapter (harness/include/oracle_trace/cutlass/sm90_blockwise.hpp,
zoo/cutlass_sm90/blockwise.cu), without a GPU:

- a case with block scales on both operands loads for a library built through the adapter (one scale group
  per k-block, promoted at that interval), and what the traced blockwise mainloop cannot run is refused when
  the case is loaded, the field named with what is supported (a scale group spanning several k-blocks, fp8
  fast accumulation, a batch, a split);
- (nvcc) the adapter's type checks stop, in the front end, a traced build whose blockwise mainloop is
  CUTLASS's own untraced one, and the host route for a blockwise-scaled kernel (make_arguments passes no scales).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_tools import require_nvcc  # tests/ on sys.path
from cutlass_refusals import refused_early
from oracle.run.adapters import CUTLASS_SM90
from oracle.run.case import load_case
from oracle.run.case_types import CaseError

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo" / "cutlass_sm90"
BLOCKWISE = ZOO / "blockwise.toml"


def test_a_block_scaled_case_loads_for_the_blockwise_mainloop():
    case = load_case(str(BLOCKWISE), allow_library=True)
    assert case.kernel.adapter is CUTLASS_SM90
    s = case.spec
    assert (s.scale_a.kind, s.scale_b.kind, s.resolved_acc_model) == ("block", "block", "fp8_promoted")
    # 128 x 128 blocks for A too (CUTLASS's trivial blockwise config, example 67's first kernel)
    load_case(str(BLOCKWISE), {"scale_a": {"kind": "block", "block": [128, 128], "major": "col"}}, allow_library=True)


@pytest.mark.parametrize("over, words", [
    ({"scale_a": {"kind": "block", "block": [1, 256], "major": "col"},
      "scale_b": {"kind": "block", "block": [128, 256], "major": "row"}, "promotion_interval": 128},
     "scale_a.block = [1, 256]: CUTLASS's blockwise-scaled mainloop is traced with one scale group per k-block"),
    ({"promotion_interval": None, "acc_model": "fp32"},
     "acc_model = 'fp32' with promotion_interval = None: the blockwise-scaled mainloop promotes each k-block's "
     "WGMMA sum"),
    ({"splits": 2}, "splits = 2, stream_k_workers = None with block scales: the traced blockwise-scaled mainloop "
                    "runs one GEMM of whole tiles per call"),
])
def test_what_the_blockwise_mainloop_cannot_run_is_refused_when_the_case_is_loaded(over, words):
    with pytest.raises(CaseError) as e:
        load_case(str(BLOCKWISE), over)
    msg = str(e.value)
    assert "is built through the cutlass_sm90 adapter (oracle_trace/cutlass.hpp)" in msg, msg
    assert words in msg, msg


def test_block_scales_on_the_other_cutlass_kernels_name_the_blockwise_mainloop():
    over = {"a_dtype": "e4m3", "b_dtype": "e4m3", "tile": [128, 128, 128], "acc_model": None,
            "promotion_interval": 128, "scale_a": {"kind": "block", "block": [1, 128]},
            "scale_b": {"kind": "block", "block": [128, 128]}}
    # the case cannot tell the library's mainloop: it loads, and oracle_launch refuses the plain kernel's
    # block scales (entry.hpp's LinearCombination branch); a per-row scale is refused by name at load
    load_case(str(ZOO / "cutlass_sm90.toml"), over, allow_library=True)
    with pytest.raises(CaseError) as e:
        load_case(str(ZOO / "cutlass_sm90.toml"), {"scale_a": {"kind": "row"}, "scale_b": {"kind": "tensor"}})
    assert "or block on both (CUTLASS's blockwise-scaled fp8 mainloop)" in str(e.value)


@pytest.mark.parametrize("edit, words", [
    (("oracle_trace::cutlass_sm90::TracedMainloop<BuiltMainloop, Mutation>", "BuiltMainloop"),
     "the kernel's mainloop is CUTLASS's blockwise-scaled fp8 collective (MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8) "
     "untraced"),
    (("ORACLE_CUTLASS_ENTRY(zoo_blockwise::Gemm)",
      "namespace zoo_blockwise { Gemm::Arguments make(int, int, int, int, const ElementA*, int64_t, const ElementB*, "
      "int64_t, const ElementC*, int64_t, ElementD*, int64_t, float, float); }\n"
      "ORACLE_CUTLASS_HOST_ENTRY(zoo_blockwise::Gemm, zoo_blockwise::make)"),
     "ORACLE_CUTLASS_HOST_ENTRY: the kernel's mainloop is CUTLASS's blockwise-scaled fp8 one"),
])
@pytest.mark.every_build
def test_a_blockwise_kernel_the_adapter_cannot_trace_stops_its_build_in_the_front_end(tmp_path, edit, words):
    require_nvcc()
    text = (ZOO / "blockwise.cu").read_text()
    old, new = edit
    assert text.count(old) == 1, old
    src = tmp_path / "user_blockwise.cu"
    src.write_text(text.replace(old, new))
    err = refused_early(src, tmp_path / "cache", defines={"ORACLE_TRACE": "1"})
    assert words in err, err[-3000:]

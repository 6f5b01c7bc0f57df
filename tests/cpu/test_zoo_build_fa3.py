"""The zoo's FlashAttention-3-style Hopper kernel (zoo/fa3_sm90) holds together without a GPU: its
builds, its manifest entries and its case files.

- (nvcc) the build with -DORACLE_TRACE holds every entry point traced and untraced, the build
  without it the untraced ones only; every untraced entry point's SASS is the same in both, every
  traced one differs; no untraced function spills or uses a stack;
- (nvcc) every forward entry point is the kernel its header describes: WGMMA (HGMMA, P V with V
  transposed), bulk copies (UBLKCP) and mbarriers (SYNCS), no cp.async and no mma.sync;
- (nvcc) two defect builds (a ZOO_FA3_<DEFECT> define, one in the consumer's second MMA, one in the
  producer) compile traced and change the forward kernels, not the combine; the V layout defect
  reads V without the transpose;
- tests/zoo/manifest.json: one entry per planted defect of the source (by its define), named for
  the stage the defect changes first, the correct dense, head_dim 128, split-KV and paged variants,
  every defect case defining exactly its defect's macro;
- every case file under zoo/fa3_sm90 loads (oracle.run.case.load_case) with a launch that fits the
  kernel: 256 threads (producer and consumer warpgroups), the shared memory of its head dim, the
  combine after a split.
Builds go through the oracle's build cache (tests/cuda_tools.zoo_build), two at a time.
"""

from __future__ import annotations

import re

import pytest
from cuda_tools import sass_by_function, traced_and_plain  # tests/ on sys.path
from attention_zoo_checks import check_builds, check_case_file, check_manifest, check_stages_named, kernel_entries
from zoo_cases import ROOT, attention_entry_case

FA3_DIR = ROOT / "zoo" / "fa3_sm90"
FA3_SOURCE = FA3_DIR / "fa3_sm90.cu"
BUILT_DEFECTS = ("v_read_with_k_layout", "kv_tail_not_zeroed")  # compiled by the build tier (--every-build); the others only on the GPU
FORWARD = {f"zoo_fa3_{kind}bf16_d{d}" for kind in ("", "split_", "paged_") for d in (64, 128)}
ENTRIES = FORWARD | {f"zoo_fa3_combine_bf16_d{d}" for d in (64, 128)}


def smem_bytes(head_dim: int) -> int:
    """The forward kernels' dynamic shared memory: Q and two K and two V slots of 64 x D bf16, the
    barriers' 64 bytes, 1 KiB to align the tiles."""
    return 5 * 64 * head_dim * 2 + 64 + 1024


def _defect_build(defect: str):
    from harness.build import build_cubin

    return build_cubin(FA3_SOURCE, defines={"ORACLE_TRACE": "1", f"ZOO_FA3_{defect.upper()}": "1"})


@pytest.fixture(scope="module")
def builds():
    return traced_and_plain(FA3_SOURCE)


def _lines(sass, opcode: str) -> list[str]:
    text = sass if isinstance(sass, str) else "\n".join(sass)
    return [line for line in text.splitlines() if re.search(rf"\b{opcode}\b", line)]


# -- builds ---------------------------------------------------------------------------------------
@pytest.mark.nvcc
@pytest.mark.every_build
def test_every_entry_point_is_built_traced_and_untraced_with_tracing_compiled_out_and_no_spills(builds):
    check_builds(builds, "fa3_sm90", ENTRIES)


@pytest.mark.nvcc
@pytest.mark.every_build
def test_the_forward_kernels_are_wgmma_bulk_copies_and_mbarriers(builds):
    sass = sass_by_function(builds["plain"].cubin_path)
    for name in sorted(FORWARD):
        d = int(name.rsplit("_d", 1)[1])
        # Q K^T: D / 16 k-steps of N = 64 keys, both operands from shared memory; P V: 4 k-steps of
        # N = D, P from registers, V transposed
        qk = [g for g in _lines(sass[name], "HGMMA.64x64x16.F32.BF16") if "tnspB" not in g]
        pv = _lines(sass[name], f"HGMMA.64x{d}x16.F32.BF16")
        assert len(qk) == d // 16, (name, qk)
        assert len([g for g in pv if "tnspB" in g]) == 4, (name, pv)
        assert _lines(sass[name], "UBLKCP.S.G"), f"{name}: no bulk copy"
        assert _lines(sass[name], "SYNCS.PHASECHK.TRANS64.TRYWAIT"), f"{name}: no mbarrier wait"
        assert not _lines(sass[name], "LDGSTS") and not _lines(sass[name], "HMMA.16816.F32.BF16"), \
            f"{name}: cp.async or mma.sync in the Hopper kernel"


@pytest.mark.nvcc
@pytest.mark.every_build
@pytest.mark.parametrize("defect", BUILT_DEFECTS)
def test_a_defect_define_changes_the_kernel_it_plants_the_defect_in(builds, defect):
    bad, good = sass_by_function(_defect_build(defect).cubin_path), sass_by_function(builds["traced"].cubin_path)
    assert set(bad) == set(good)
    for name in sorted(FORWARD):
        assert bad[name] != good[name], name
    for d in (64, 128):
        assert bad[f"zoo_fa3_combine_bf16_d{d}"] == good[f"zoo_fa3_combine_bf16_d{d}"]  # the combine has neither
    if defect == "v_read_with_k_layout":  # V's descriptor is K-major: the second MMA loses its transpose
        assert not [g for g in _lines(bad["zoo_fa3_bf16_d64"], "HGMMA") if "tnspB" in g]


# -- the manifest ---------------------------------------------------------------------------------
def test_the_manifest_holds_every_defect_of_the_source_once_and_the_correct_variants():
    check_manifest("fa3_sm90", FA3_SOURCE, "FA3", {"zoo_fa3_bf16_d64_traced", "zoo_fa3_bf16_d128_traced", "zoo_fa3_split_bf16_d64_traced",
                                                "zoo_fa3_paged_bf16_d64_traced"})


def test_the_manifest_names_the_stage_each_defect_first_changes():
    check_stages_named("fa3_sm90")


def test_the_kv_tail_defect_reaches_a_slot_that_held_keys():
    """With a 2-slot ring, the tail block's slot holds a block of two before only from block 2 on:
    the entry's tail must sit there, so that the stale rows are keys, not what the slot first held."""
    (e,) = [e for e in kernel_entries("fa3_sm90") if e["defect"] == "kv_tail_not_zeroed"]
    s = attention_entry_case(e).spec
    tail_block = (s.seqlen_k - 1) // s.block_kv
    assert s.seqlen_k % s.block_kv and tail_block >= 2 and e["expected_k_block"] == tail_block, (s.seqlen_k, e)


# -- the case files -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(FA3_DIR.rglob("*.toml")), ids=lambda p: str(p.relative_to(FA3_DIR)))
def test_every_case_file_loads_with_a_launch_that_fits_the_kernel(path):
    s = check_case_file(path, "fa3", 256, smem_bytes).spec  # producer and consumer warpgroups
    assert (s.q_dtype, s.k_dtype, s.v_dtype, s.o_dtype) == ("bf16",) * 4


def test_the_source_pins_the_shared_memory_the_cases_launch_with():
    text = FA3_SOURCE.read_text()
    assert f"smem_bytes<64>() == {smem_bytes(64)} && smem_bytes<128>() == {smem_bytes(128)}" in text

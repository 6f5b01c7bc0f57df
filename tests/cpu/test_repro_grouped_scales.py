"""The reproducer's host reference on grouped (MoE) and batched block-scaled problems, without a GPU:
A's per-row scales stacked with A's rows, B's one [N / gn, K / gk] tensor per group (in its major),
each scale group promoted on its own with fp32(sa * sb) as kernels_ref/mma.py's host spec. The host
program (the session's one build, tests/host_programs.py) judges the oracle's D a MATCH with its own
host reference on fp32 1 x 128 / 128 x 128 scales and on 1 x 32 e8m0 MX scales under a ragged K
(groups with an empty one, and a batch), and finds a D computed with group 0's B scales for group 1,
in group 1's rows only. problem.txt names each block scale's dtype (e8m0 is stored as raw bytes).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
import torch

from kernels_ref.dtypes import DTYPES
from oracle.judging.differential import expected_output
from oracle.repro.generate import write_repro
from oracle.run.case import load_case
from oracle.run.inputs import Provenance, make_operands
from host_programs import host_from, shared_host_programs  # tests/ is on sys.path
from repro_files import input_manifest

ROOT = Path(__file__).resolve().parents[2]
MX = ROOT / "zoo" / "mx_sm80" / "mx_sm80.toml"  # takes a grouped problem (its launch has no tensor map)
GROUPS = [40, 64, 0, 24]  # one expert empty
FP32_BLOCKS = {"scale_a": {"kind": "block", "block": [1, 128]},
               "scale_b": {"kind": "block", "block": [128, 128], "major": "col"}}
CASES = {
    # DeepSeek-style fp32 scales, B's 128 x 128 ones stored column-major per group; K = 320: a partial
    # last scale group
    "fp32_1x128_128x128": {"m": 128, "n": 200, "k": 320, "groups": GROUPS, **FP32_BLOCKS},
    # OCP MX: 1 x 32 e8m0 scales (the case file's), K = 200 ragged under the 64-deep k-block and the
    # 32-wide groups (the last one 8 deep, groups past K absent)
    "mx_e8m0_ragged_k": {"m": 128, "n": 72, "k": 200, "groups": GROUPS},
    "mx_e8m0_batched": {"m": 24, "n": 72, "k": 200, "batch": 3, "groups": None},
    # one GEMM: e8m0 bytes are 2^(b - 127), not the byte's value
    "mx_e8m0_single": {"m": 40, "n": 72, "k": 200},
}
DEFECT_CASES = ["fp32_1x128_128x128", "mx_e8m0_ragged_k", "mx_e8m0_batched"]
SEED = 5


def _run(cmd, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def _u8(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict:
    """Each case's reproducer (written with the oracle's reference) and its operands."""
    base = tmp_path_factory.mktemp("repro_grouped_scales")
    out = {}
    for name, problem in CASES.items():
        case = load_case(str(MX), problem)
        ops = make_operands(case.spec, "random", SEED)
        write_repro(case, ops, Provenance("random", SEED), base / name)
        out[name] = (base / name, case, ops)
    return out


@pytest.fixture(scope="module")
def repro(written, tmp_path_factory) -> Path:
    """The session's host program, copied into the first case's folder (it takes --dir)."""
    shared = shared_host_programs(tmp_path_factory)
    d = next(iter(written.values()))[0]
    host_from(shared, d, "repro")
    return d / "repro"


def test_the_files_hold_b_scales_per_group_and_problem_txt_names_the_scale_dtypes(written):
    for name, (d, case, ops) in written.items():
        s = case.spec
        man = input_manifest(d)
        if s.group_sizes is not None:
            assert man["scale_b"]["logical"] == "x".join(map(str, [len(s.group_sizes), *ops.scale_b.shape[1:]])), name
        problem = (d / "problem.txt").read_text()
        for op in ("a", "b"):
            sc = getattr(s, f"scale_{op}")
            assert re.search(rf"^scale_{op} block {sc.block[0]} {sc.block[1]} {sc.dtype}$", problem, re.M), name
    d, _, ops = written["fp32_1x128_128x128"]
    # B's scales column-major, each group's matrix transposed on its own: [G, K / gk, N / gn]
    assert input_manifest(d)["scale_b"]["shape"] == f"{len(GROUPS)}x3x2"
    assert (d / "scale_b.bin").read_bytes() == _u8(ops.scale_b.transpose(-1, -2))


@pytest.mark.nvcc
@pytest.mark.parametrize("name", list(CASES))
def test_the_host_reference_agrees_with_the_oracle_on_grouped_block_scales(written, repro, name):
    d, case, ops = written[name]
    s = case.spec
    y, _ = expected_output(s, ops)
    (d / "d.bin").write_bytes(_u8(y.to(DTYPES[s.out_dtype].torch)))  # the oracle's D, as a kernel would store it
    proc = _run([repro, "--dir", d, "--check-only", "--host-reference"])
    assert proc.returncode == 0 and "verdict: MATCH" in proc.stdout, proc.stdout + proc.stderr
    assert "own double-precision host reference" in proc.stdout
    if s.groups is not None:
        assert "group 2 (empty): nothing to compare" in proc.stdout, proc.stdout


def _group_rows(s, g: int) -> tuple[int, int]:
    r0 = sum(s.group_sizes[:g])
    return r0, r0 + s.group_sizes[g]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", DEFECT_CASES)
def test_the_host_reference_finds_group_0s_b_scales_applied_to_group_1(written, repro, name):
    d, case, ops = written[name]
    s = case.spec
    wrong_sb = ops.scale_b.clone()
    wrong_sb[1] = ops.scale_b[0]
    assert not torch.equal(ops.scale_b[1], ops.scale_b[0])  # the defect is visible in these inputs
    y, _ = expected_output(s, dataclasses.replace(ops, scale_b=wrong_sb))
    (d / "d.bin").write_bytes(_u8(y.to(DTYPES[s.out_dtype].torch)))
    proc = _run([repro, "--dir", d, "--check-only", "--host-reference"])
    assert proc.returncode == 1 and "verdict: DIVERGED" in proc.stdout, proc.stdout + proc.stderr
    r0, r1 = _group_rows(s, 1)
    m = re.search(r"first bad element: \((\d+), (\d+)\) in tile \(\d+, \d+\) of group 1\b", proc.stdout)
    assert m and r0 <= int(m.group(1)) < r1, proc.stdout  # in the group that got group 0's scales
    assert re.search(rf"group 1 \(rows {r0}\.\.{r1 - 1}\): bad elements [1-9]", proc.stdout), proc.stdout
    for g in range(len(s.group_sizes)):  # every other group is right
        if g != 1 and s.group_sizes[g]:
            r0, r1 = _group_rows(s, g)
            assert f"group {g} (rows {r0}..{r1 - 1}): bad elements 0 in 0 of" in proc.stdout, proc.stdout


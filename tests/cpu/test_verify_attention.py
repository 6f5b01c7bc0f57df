"""`verify --attention`: torch SDPA (CPU) is MATCH with exit 0 over MHA, GQA and top-left causal cases,
a FlashAttention-style op (bshd, returning LSE) too; wrong ops are DIVERGED at `store` with exit 1;
a sweep file round trips; bad arguments are one error line with exit 2. Timing needs a GPU: here
it is skipped with a note in the row."""

import json
import os
import sys
from pathlib import Path

import pytest
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter

from oracle.tools.cli import main
from oracle.tools.verify_attention import AttentionVerifyCase, load_sweep

ROOT = Path(__file__).resolve().parents[2]
SDPA = "torch.nn.functional:scaled_dot_product_attention"


def verify(capsys, tmp_path, *argv):
    out = tmp_path / "rows.jsonl"
    code = main(["verify", *argv, "--jsonl", str(out)])
    cap = capsys.readouterr()
    rows = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    return code, rows, cap


def test_sdpa_matches_over_mha_gqa_and_causal(capsys, tmp_path):
    code, rows, cap = verify(capsys, tmp_path, "--op", SDPA, "--attention", "--shape", "1,2,2,16,32,16",
                             "--shape", "2,4,2,24,24,32", "--shape", "1,4,1,16,40,16", "--causal", "top_left")
    assert code == 0, cap.out + cap.err
    assert [r["verdict"] for r in rows] == ["MATCH"] * 3
    assert [r["gqa"] for r in rows] == [None, "enable_gqa", "enable_gqa"]
    assert all(r["causal"] == "top_left" and r["layout"] == "bhsd" and r["call"] == "sdpa" for r in rows)
    assert all(r["timing"].startswith("skipped: timing needs a CUDA GPU") and "performance" not in r for r in rows)
    assert rows[0]["environment"]["torch"] and rows[0]["op"] == SDPA
    assert "MATCH" in cap.out and "timing skipped" in cap.out


def test_repeated_kv_heads_without_enable_gqa(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("oracle.tools.verify_attention.has_enable_gqa", lambda: False)
    code, rows, cap = verify(capsys, tmp_path, "--op", SDPA, "--attention", "--shape", "1,4,2,16,16,16")
    assert code == 0 and rows[0]["gqa"] == "repeat_kv" and rows[0]["verdict"] == "MATCH", cap.out + cap.err


def test_flash_style_op_in_bshd_with_lse(capsys, tmp_path):
    code, rows, cap = verify(capsys, tmp_path, "--op", "attention_ops:flash_like", "--attention", "--shape",
                             "1,4,2,32,16,16", "--causal", "bottom_right", "--layout", "bshd")
    assert code == 0, cap.out + cap.err
    assert rows[0]["call"] == "flash" and rows[0]["verdict"] == "MATCH"


@pytest.mark.parametrize("op, causal", [("attention_ops:scaled_sdpa", "top_left"),
                                        ("attention_ops:flipped_causal_sdpa", "top_left")])
def test_wrong_op_diverges_at_store(capsys, tmp_path, op, causal):
    code, rows, cap = verify(capsys, tmp_path, "--op", op, "--attention", "--shape", "1,2,2,16,48,16",
                             "--causal", causal)
    assert code == 1, cap.out + cap.err
    r = rows[0]
    assert r["verdict"] == "DIVERGED" and r["first_divergence"]["stage"] == "store"
    assert len(r["first_divergence"]["unit"]) == 2 and "store" in cap.out
    assert r["timing"].startswith("skipped")


def test_sweep_file_round_trip(capsys, tmp_path):
    sweep = tmp_path / "attn.toml"
    sweep.write_text('kind = "attention"\n[defaults]\ndtype = "fp16"\nhead_dim = 16\n'
                     '[[case]]\nname = "gqa"\nbatch = 1\nheads_q = 4\nheads_kv = 2\nseqlen_q = 16\nseqlen_k = 32\n'
                     'causal = "top_left"\nseed = 5\n'
                     '[[case]]\nname = "flash"\nbatch = 2\nheads_q = 2\nheads_kv = 2\nseqlen_q = 24\nseqlen_k = 8\n'
                     'causal = "bottom_right"\ncall = "flash"\nlayout = "bshd"\n')
    cases = load_sweep(str(sweep))
    assert cases[0] == AttentionVerifyCase("gqa", 1, 4, 2, 16, 32, 16, dtype="fp16", causal="top_left",
                                           layout="bhsd", call="sdpa", seed=5)
    assert cases[1].call == "flash" and cases[1].layout == "bshd" and cases[1].dtype == "fp16"
    code, rows, cap = verify(capsys, tmp_path, "--op", SDPA, "--sweep", str(sweep))
    # the sdpa op takes no causal= keyword: the flash-called case is a broken case (exit 2), the other MATCH
    assert code == 2 and [r["verdict"] for r in rows] == ["MATCH", "ERROR"], cap.out + cap.err
    assert [r["name"] for r in rows] == ["gqa", "flash"] and rows[0]["seed"] == 5 and rows[0]["dtype"] == "fp16"
    assert "causal" in rows[1]["error"]


def test_a_gemm_sweep_is_still_a_gemm_sweep(tmp_path):
    sweep, out = tmp_path / "gemm.toml", tmp_path / "rows.jsonl"
    sweep.write_text('[[case]]\nm = 8\nn = 8\nk = 8\ndtype = "fp32"\n')
    proc = warm_python.run([sys.executable, "-m", "oracle", "verify", "--op", "torch:matmul", "--sweep", str(sweep),
                            "--jsonl", str(out)], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, TRITON_INTERPRET="1"))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert proc.returncode == 0 and rows[0]["shape"] == [8, 8, 8] and "kind" not in rows[0], proc.stdout + proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["--attention", "--shape", "1,2,2,16,16,16", "--layout", "bsdh"], "layout 'bsdh' must be one of bshd, bhsd"),
    (["--attention", "--shape", "1,2,2,16,16,16", "--causal", "left"], "causal 'left' must be one of"),
    (["--attention", "--shape", "1,2,2,16,16"], "B,HQ,HKV,LQ,LK,D"),
    (["--attention", "--shape", "1,2,2,16,16,16,4"], "B,HQ,HKV,LQ,LK,D"),
    (["--attention", "--shape", "1,4,3,16,16,16"], "heads_kv = 3 must divide heads_q = 4"),
    (["--attention", "--shape", "1,2,2,16,32,16", "--causal", "bottom_right"], "call 'flash'"),
    (["--attention", "--shape", "1,2,2,16,16,16", "--fast-accum"], "--fast-accum"),
    (["--shape", "8x8x8", "--causal", "top_left"], "--causal go with --attention"),
])
def test_bad_arguments_are_one_error_line(capsys, tmp_path, argv, words):
    code, rows, cap = verify(capsys, tmp_path, "--op", SDPA, *argv)
    lines = cap.err.strip().splitlines()
    assert code == 2 and rows == [] and cap.out == ""
    assert len(lines) == 1 and lines[0].startswith("error:"), cap.err
    assert words in cap.err, cap.err


def test_bad_sweep_kind(capsys, tmp_path):
    sweep = tmp_path / "s.toml"
    sweep.write_text('kind = "conv"\n[[case]]\nm = 8\nn = 8\nk = 8\n')
    code, rows, cap = verify(capsys, tmp_path, "--op", SDPA, "--sweep", str(sweep))
    assert code == 2 and cap.err.startswith("error:") and "kind = 'conv'" in cap.err, cap.err

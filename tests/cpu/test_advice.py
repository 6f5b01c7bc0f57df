"""Advice is spelt for its caller: what a DRAFT would need for a VERDICT names Python keywords
(`inputs=`, `trace_tiles=`) to oracle.check and the pytest plugin, and flags (`--inputs`,
`--trace-tiles`) to the command line; judging makes one finding, the renderer spells it."""

from __future__ import annotations

import json

import pytest
import torch

import oracle
from oracle.report import table as report
from oracle.run.caller import Advice, Caller, Option
from oracle.tools import cli


@pytest.fixture(scope="module")
def draft():
    """A captured (uncontrolled) output with one wrong element: a DRAFT that needs controlled inputs
    and a trace of tile (0, 0)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g).bfloat16(), torch.randn(64, 64, generator=g).bfloat16()
    d = (a.float() @ b.float()).bfloat16()
    d[5, 17] += 3
    return oracle.check(a, b, d)


def test_python_is_told_keywords(draft):
    said = report.sentence(draft.judgement)
    assert said == report.sentence(draft.judgement, Caller.PYTHON)
    assert 'controlled inputs (inputs="ones" | "index" | "ktag" | "random[:seed]")' in said, said
    assert "trace_tiles=[(0, 0)]" in said, said
    assert "--" not in said.split("For a VERDICT")[1], said
    assert "trace_tiles=[(0, 0)]" in str(draft)
    assert "trace_tiles=[(0, 0)]" in " ".join(draft.to_json()["first_divergence"]["missing"])


def test_the_command_line_is_told_flags(draft, tmp_path, capsys):
    dump, out = tmp_path / "d.safetensors", tmp_path / "r.json"
    draft.recording.save(str(dump))
    assert cli.main(["compare", "--dump", str(dump), "--json", str(out)]) == 1
    said = capsys.readouterr().out.splitlines()[-1]
    assert "controlled inputs (--inputs ones|index|ktag|random[:seed])" in said, said
    assert "--trace-tiles 0,0" in said and "trace_tiles=" not in said and "inputs=" not in said, said
    missing = json.loads(out.read_text())["first_divergence"]["missing"]
    assert any("--trace-tiles 0,0" in m for m in missing), missing


def test_a_recorded_command_is_the_command_lines_rerun_and_not_pythons():
    opt = Option.tiles([(1, 2)], command="python -m oracle compare c.toml --trace-tiles '1,2'")
    assert opt.say(Caller.COMMAND_LINE) == "python -m oracle compare c.toml --trace-tiles '1,2'"
    assert opt.say(Caller.PYTHON) == "trace_tiles=[(1, 2)]"
    advice = Advice.of("trace them: ", Option.k_blocks([3, 4]), " and ", Option.stages(["mma", "epilogue_store"]))
    assert advice.say(Caller.COMMAND_LINE) == "trace them: --trace-k-blocks 3,4 and --trace-stages mma,epilogue_store"
    assert advice.say(Caller.PYTHON) == "trace them: trace_k_blocks=[3, 4] and trace_stages='mma,epilogue_store'"
    with pytest.raises(TypeError, match="str or an Option"):
        Advice.of("x", 3)
    with pytest.raises(ValueError, match="'--trace-tiles' must be a Python keyword"):
        Option("--trace-tiles")

"""Every launch has an untraced entry (oracle.run.races.untraced_entries): the first from [kernel]
untraced_entry or --untraced-entry, each later one from its [[launch.next]] untraced_entry, each by
default its traced entry without the zoo's _traced suffix; a two-kernel case runs --repeat with the
untraced build's names, and an untraced build that cannot start names the keys that choose them."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle.run import races
from oracle.run.case import CaseError, load_case
from oracle.run.inputs import Provenance, make_operands

ROOT = Path(__file__).resolve().parents[2]
ATOMIC = ROOT / "zoo" / "split_gemm" / "splitk_atomic.toml"


def test_the_default_drops_the_traced_suffix():
    assert races.default_untraced_entry("zoo_sm80_bf16_traced") == "zoo_sm80_bf16"
    assert races.default_untraced_entry("plain_kernel") == "plain_kernel"
    assert races.default_untraced_entry("_traced") == "_traced"


def test_every_launch_of_a_two_kernel_case_has_an_untraced_entry():
    case = load_case(str(ATOMIC))
    assert races.untraced_entries(case) == ("zoo_splitk_atomic_partials", "zoo_splitk_atomic_reduce")


def test_the_case_keys_choose_each_launchs_untraced_entry(tmp_path):
    p = tmp_path / "c.toml"
    text = ATOMIC.read_text().replace('extends = "splitk_serial.toml"', f'extends = "{ATOMIC.parent}/splitk_serial.toml"')
    text = text.replace('entry = "zoo_splitk_atomic_reduce_traced"',
                        'entry = "zoo_splitk_atomic_reduce_traced"\nuntraced_entry = "my_reduce"')
    p.write_text(text.replace("[kernel]\n", '[kernel]\nuntraced_entry = "my_partials"\n', 1))
    case = load_case(str(p), allow_outside_case_dir=True)
    assert races.untraced_entries(case) == ("my_partials", "my_reduce")
    p.write_text(text.replace('untraced_entry = "my_reduce"', 'untraced_entry = "bad name"'))
    with pytest.raises(CaseError, match=r"\[\[launch.next\]\] #0 untraced_entry = 'bad name'"):
        load_case(str(p), allow_outside_case_dir=True)


class _Failed:
    ok, kernel_fault, stderr_tail = False, False, "cuModuleGetFunction: named symbol not found"

    def describe(self):
        return "LOAD_ERROR CUDA_ERROR_NOT_FOUND at phase load"


def _race(monkeypatch, run):
    """run_races of the two-kernel zoo case with two repeats; the traced runs and the build faked."""
    seen = []
    first = type("Live", (), {"recording": type("Rec", (), {"kernel_error": None, "output": None})()})()
    monkeypatch.setattr(races, "run_live", lambda *a, **k: first)
    monkeypatch.setattr(races, "untraced_build", lambda case: (b"cubin", races.untraced_entries(case)[0]))

    def fake_run_kernel(cubin, entry, launch, tensors, *, timeout_s=None, then=()):
        seen.append((entry, tuple(e for e, _ in then)))
        return run

    monkeypatch.setattr(races, "run_kernel", fake_run_kernel)
    case = load_case(str(ATOMIC))
    ops = make_operands(case.spec, "ones")
    return seen, lambda: races.run_races(case, ops, Provenance("ones"), repeat=2)


def test_repeat_runs_every_launch_by_its_untraced_name(monkeypatch):
    import torch

    ok = type("Ok", (), {"ok": True, "kernel_fault": False, "outputs": {"d": torch.zeros(2, 2)}})()
    seen, go = _race(monkeypatch, ok)
    runs = go()
    assert runs.untraced_entry == "zoo_splitk_atomic_partials" and len(runs.untraced) == 2
    assert seen == [("zoo_splitk_atomic_partials", ("zoo_splitk_atomic_reduce",))] * 2


def test_an_untraced_build_that_cannot_start_names_the_keys(monkeypatch):
    _, go = _race(monkeypatch, _Failed())
    with pytest.raises(CaseError) as e:
        go()
    msg = str(e.value)
    assert "--untraced-entry" in msg and "[kernel] untraced_entry" in msg and "[[launch.next]] untraced_entry" in msg
    assert "zoo_splitk_atomic_partials, zoo_splitk_atomic_reduce" in msg

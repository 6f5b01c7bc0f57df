"""`unset` in a case that extends a base (oracle.run.case_extends): a base key can be dropped, at any
depth, before the case's own tables are laid over; a path the base lacks is an error naming it."""

from __future__ import annotations

import pytest

from oracle.run.case import CaseError, load_case

BASE = '''[problem]
m = 64
n = 64
k = 64
tile = [64, 64, 64]
[kernel]
source = "k.cu"
entry = "first_traced"
time_entry = "first"
defines = { FOO = 1, BAR = 2 }
[launch]
grid = ["tiles_n", "tiles_m", 1]
block = [128, 1, 1]
args = ["a", "b", "d"]
[[launch.next]]
entry = "second_traced"
grid = [1, 1, 1]
block = [32, 1, 1]
args = ["d"]
[trace]
tiles = [[0, 0]]
'''


def _pair(tmp_path, child: str):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void first_traced() {}\n')
    (tmp_path / "base.toml").write_text(BASE)
    p = tmp_path / "child.toml"
    p.write_text('extends = "base.toml"\n' + child)
    return str(p)


def test_a_base_key_can_be_dropped_at_any_depth(tmp_path):
    case = load_case(_pair(tmp_path, 'unset = ["kernel.defines.FOO", "launch.next", "kernel.time_entry", "trace"]\n'))
    assert dict(case.kernel.defines) == {"BAR": "2"}
    assert case.launch.next == () and case.kernel.time_entry is None and case.trace.tiles is None
    base = load_case(str(tmp_path / "base.toml"))  # the base itself is untouched
    assert dict(base.kernel.defines) == {"FOO": "1", "BAR": "2"} and len(base.launch.next) == 1


def test_a_dropped_key_can_be_set_anew(tmp_path):
    case = load_case(_pair(tmp_path, 'unset = ["kernel.defines"]\n[kernel]\ndefines = { BAZ = 3 }\n'))
    assert dict(case.kernel.defines) == {"BAZ": "3"}


@pytest.mark.parametrize("path, phrase", [("kernel.defines.NOPE", "kernel.defines has no 'NOPE'"),
                                          ("nosection", "the base has no 'nosection'"),
                                          ("kernel.entry.deeper", "kernel.entry has no 'deeper'"),
                                          ("kernel..x", "not a dotted path")])
def test_an_unknown_path_is_named(tmp_path, path, phrase):
    with pytest.raises(CaseError, match=phrase) as e:
        load_case(_pair(tmp_path, f'unset = ["{path}"]\n'))
    assert repr(path) in str(e.value) and "child.toml" in str(e.value)


def test_unset_needs_a_base_and_a_list(tmp_path):
    p = tmp_path / "alone.toml"
    p.write_text('unset = ["kernel.defines.FOO"]\n' + BASE)
    with pytest.raises(CaseError, match="needs extends"):
        load_case(str(p))
    with pytest.raises(CaseError, match="must be a list"):
        load_case(_pair(tmp_path, 'unset = "launch.next"\n'))

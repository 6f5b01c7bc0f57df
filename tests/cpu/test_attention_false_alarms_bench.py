"""The attention false-alarm benchmark on the CPU: a few SDPA cases judged, the JSON it writes, and
a backend made wrong on purpose counted as false alarms (exit 1)."""

import json

import bench_scripts  # tests/ is on sys.path

B = bench_scripts.load("attention_false_alarms")


def test_cpu_smoke_run_writes_the_json(tmp_path):
    assert B.main(["--cpu", "--cases", "4", "--planted", "1", "--out-dir", str(tmp_path), "--seed", "3"]) == 0
    doc = json.loads((tmp_path / "results" / "attention_false_alarms_cpu.json").read_text())
    assert doc["machine"] == "cpu" and doc["seed"] == 3 and doc["environment"]["torch"]
    assert doc["false_diverged"] == 0 and sum(p["cases"] + p["skipped"] for p in doc["per_backend"].values()) == 4
    assert doc["planted_detected"] == len(doc["planted"]) == 3


def test_a_wrong_backend_is_a_false_alarm(tmp_path, monkeypatch):
    real = B._sdpa

    def doubled(*args):
        outs, lse = real(*args)
        return [o * 2 for o in outs], lse

    monkeypatch.setattr(B, "_sdpa", doubled)
    assert B.main(["--cpu", "--cases", "2", "--planted", "0", "--out-dir", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "results" / "attention_false_alarms_cpu.json").read_text())
    assert doc["false_diverged"] == 2 and len(doc["false_alarms"]) == 2


def test_parts_merge_into_the_whole_run(tmp_path):
    for k in (0, 1):
        B.main(["--cpu", "--cases", "4", "--planted", "1", "--out-dir", str(tmp_path), "--part", f"{k}/2"])
    parts = sorted((tmp_path / "results").glob("attention_false_alarms_cpu_part*-of-2.json"))
    assert [json.loads(p.read_text())["cases_in_part"] for p in parts] == [2, 2]
    assert B.main(["--merge", *map(str, parts), "--out-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results" / "attention_false_alarms_cpu.json").read_text())
    assert doc["cases_run"] == 4 and len(doc["cases"]) == 4 and len(doc["planted"]) == 6
    assert sum(p["cases"] + p["skipped"] for p in doc["per_backend"].values()) == 4
    assert sorted(c["seed"] for c in doc["cases"]) == [0, 1, 2, 3]


def test_a_missing_part_is_refused(tmp_path):
    B.main(["--cpu", "--cases", "2", "--planted", "0", "--out-dir", str(tmp_path), "--part", "0/2"])
    (part,) = (tmp_path / "results").glob("*part0-of-2.json")
    import pytest

    with pytest.raises(SystemExit, match="every part of 2 is needed once"):
        B.main(["--merge", str(part), "--out-dir", str(tmp_path)])


def test_flash_cases_draw_only_the_masks_the_flash_backend_takes():
    cases = B.make_cases(360, 0, ("sdpa_flash", "sdpa_efficient", "sdpa_math"), False)
    flash = [c for c in cases if c.backend == "sdpa_flash"]
    assert len(flash) == 120 and {c.mask for c in flash} <= {"none", "top_left", "bottom_right"}
    assert all(q <= k for c in flash if c.mask != "none" for q, k in zip(c.lq, c.lk))
    others = [c for c in cases if c.backend != "sdpa_flash"]
    assert {"window", "bottom_right"} <= {c.mask for c in others}  # windows and rows with no key stay
    assert any(q > k for c in others if c.mask == "bottom_right" for q, k in zip(c.lq, c.lk))

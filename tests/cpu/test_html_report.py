"""The HTML report (oracle.report.html) without a browser: the demo's page marks the first
divergence and its inherited stages, draws the pictures of every diverging stage (the elements
not compared apart), offers the commands that re-run it, loads nothing from anywhere; every
string from the user's files is escaped; `compare --html` writes it whole and refuses a link;
`verify --html` and the pytest plugin write their pages and say where."""

from __future__ import annotations

import base64
import math
import os
import re
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import oracle
from foreign_project import BAD, run_foreign_tests  # tests/ is on sys.path
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter
from oracle.report import html
from oracle.tools.demo import DEMO_PATH

ROOT = Path(__file__).resolve().parents[2]
EVIL = '<script>alert("x")</script>'
pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def demo():
    from oracle.run.request import RunRequest
    from oracle.tools.api import compare

    return compare(RunRequest(dump=DEMO_PATH))


class Tags(HTMLParser):
    """Every start tag, with its attributes, and the text."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Tags:
    t = Tags()
    t.feed(page)
    return t


def test_the_demo_page_marks_the_first_divergence_and_draws_mma(demo):
    page = demo.to_html()
    tags = parse(page)
    rows = {a["data-stage"]: a["class"] for tag, a in tags.tags if tag == "tr" and "data-stage" in a}
    assert "first" in rows["mma"].split() and "first divergence" in page
    assert [s for s, c in rows.items() if "inherited" in c.split()] == list(demo.analysis.diagnosis.inherited)
    ids = {a.get("id") for _, a in tags.tags}
    assert {"stages", "sentence", "heatmap-mma", "worst-mma", "kblocks-mma"} <= ids
    assert not {"heatmap-load_a", "heatmap-descriptor_a"} & ids  # only diverging stages get pictures
    # the k-block curve has both k-blocks of tile (0, 0), teacher-forced and chained
    curve = page[page.index('id="kblocks-mma"'):]
    curve = curve[:curve.index("</svg>")]
    assert curve.count("<polyline") == 2 and "tile (0, 0) teacher-forced, k-block 1" in curve
    assert "python -m oracle compare --demo" in page and "python -m oracle repro --dump" in page
    said = oracle.report.table.sentence(demo.judgement)
    assert html.render(demo.judgement).count(html._e(said)) == 2  # at the top and as the closing sentence


def _pixels(uri: str) -> tuple[int, int, bytes]:
    """(width, height, RGB bytes) of one of the page's PNGs."""
    data = base64.b64decode(uri.split(",", 1)[1])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    idat = data.index(b"IDAT")
    n = int.from_bytes(data[idat - 4:idat], "big")
    raw = zlib.decompress(data[idat + 4:idat + 4 + n])
    return w, h, b"".join(raw[r * (3 * w + 1) + 1:(r + 1) * (3 * w + 1)] for r in range(h))


def test_the_worst_tile_draws_padding_apart_from_passing_elements(demo):
    """The demo's 40x24 output in a 128x128 tile: every element past row 40 or column 24 is not
    compared, and is drawn as the checker, never as a colour of err/bound."""
    unit = max((t for t in demo.stages[4].teacher_forced.tiles if not t.passed), key=lambda t: t.max_ratio)
    m = unit.ratio_map
    assert m.shape == (128, 128)
    assert bool(torch.isnan(m[40:]).all()) and bool(torch.isnan(m[:, 24:]).all())
    assert not bool(torch.isnan(m[:40, :24]).any())
    page = demo.to_html()
    worst = page[page.index('id="worst-mma"'):]
    uri = re.search(r'href="(data:image/png;base64,[^"]+)"', worst).group(1)
    w, h, px = _pixels(uri)
    assert (w, h) == (128, 128)
    rgb = (lambda i, j: tuple(px[3 * (i * w + j):3 * (i * w + j) + 3]))
    checker = {rgb(100, 100), rgb(100, 101)}
    assert checker == {tuple(round(x * 255) for x in c) for c in html._MASKED}
    assert rgb(0, 0) not in checker and rgb(39, 23) not in checker
    assert "not compared (padding 30848)" in worst[:worst.index("</svg>")]


def test_colours_tell_passing_failing_and_not_compared_apart():
    cap = 1e4
    assert html._colour(float("nan"), cap) is None
    assert html._colour(0.0, cap) == html._ZERO and html._colour(math.inf, cap) == html._INF
    blue, red = html._colour(0.5, cap), html._colour(2.0, cap)
    assert blue[2] > blue[0] and red[0] > red[2]  # passing is blue, failing is red
    assert html._colour(1e4, cap) != html._colour(10.0, cap)


def _evil_report():
    from oracle.run.request import RunRequest
    from oracle.tools.api import compare, recording_of

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 64, generator=g).bfloat16(), torch.randn(64, 24, generator=g).bfloat16()
    d = (a.float() @ b.float()).bfloat16()
    d[3, 5] += 4
    rec = recording_of(a, b, d, kernel=EVIL)
    return compare(RunRequest(recording=rec, source=f"cases/{EVIL}.toml"))


def test_every_string_from_the_users_files_is_escaped():
    rep = _evil_report()
    assert not rep.ok
    cmd = html.Command(f"re-run {EVIL}", ("python", "-m", "oracle", "compare", f"{EVIL}.toml"))
    page = rep.to_html([cmd])
    tags = parse(page)
    assert [t for t, _ in tags.tags].count("script") == 1  # the page's own, at its end
    assert "<script>alert" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    text = "".join(tags.text)
    assert f"cases/{EVIL}.toml" in text and EVIL in text  # shown as text, whole
    index = html.index_page(f"sweep {EVIL}", [html.IndexEntry(EVIL, "DIVERGED", EVIL, None, EVIL)])
    assert "<script>alert" not in index and [t for t, _ in parse(index).tags].count("script") == 1
    assert html.page_name(3, EVIL) == "0003-script_alert_x_script.html"
    assert html.page_name(0, "../../etc/passwd") == "0000-etc_passwd.html"
    with pytest.raises(ValueError, match="plain .html file name"):
        html.IndexEntry("x", "MATCH", page="javascript:alert(1)//.html")


def test_the_page_loads_nothing_from_anywhere(demo):
    page = demo.to_html()
    tags = parse(page)
    for tag, attrs in tags.tags:
        for name in ("src", "href"):
            v = attrs.get(name)
            assert v is None or v.startswith(("#", "data:image/png;base64,")), (tag, name, v[:60])
    assert "default-src 'none'" in page  # and the browser is told so


def test_rerun_commands_come_from_the_request():
    from oracle.run.request import RunRequest
    from oracle.tools.rerun import commands_for, repro_argv

    words = ("compare", "case.toml", "--set", "m=64", "--inputs=ones", "--json", "x.json", "--html", "p.html",
             "--repeat", "3", "--trace-tiles", "0,0 1,1", "--quiet", "--allow-library")
    assert repro_argv(words) == ("repro", "--problem", "case.toml", "--set", "m=64", "--inputs=ones", "--trace-tiles",
                                 "0,0 1,1", "--allow-library", "--out", "repro")
    texts = [c.text for c in commands_for(RunRequest(dump="/tmp/my dump.safetensors"), dump="/tmp/b.safetensors")]
    assert texts == ["python -m oracle compare --dump '/tmp/my dump.safetensors'",
                     "python -m oracle compare --dump /tmp/b.safetensors",
                     "python -m oracle repro --dump /tmp/b.safetensors --problem CASE.toml --out repro"]
    assert commands_for(None) == ()


def test_the_flag_tables_of_the_rerun_commands_cover_compare_and_repro():
    """Every compare flag is known as one repro takes or one it does not, with its arity."""
    from oracle.tools import cli
    from oracle.tools.rerun import COMPARE_ONLY_FLAGS, REPRO_FLAGS

    subs = next(a for a in cli.build_parser()._actions if hasattr(a, "choices") and a.choices).choices
    flags = {}
    for name in ("compare", "repro"):
        flags[name] = {o: a.nargs != 0 for a in subs[name]._actions for o in a.option_strings if o.startswith("--")}
        flags[name].pop("--help")
    assert set(REPRO_FLAGS) | set(COMPARE_ONLY_FLAGS) == set(flags["compare"])
    assert not set(REPRO_FLAGS) & set(COMPARE_ONLY_FLAGS)
    for f, takes in REPRO_FLAGS.items():
        assert flags["repro"][f] == takes == flags["compare"][f], f
    for f, takes in COMPARE_ONLY_FLAGS.items():
        assert flags["compare"][f] == takes, f


def test_compare_writes_the_page_whole_and_never_through_a_link(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    page = tmp_path / "demo.html"
    proc = warm_python.run([sys.executable, "-m", "oracle", "compare", "--demo", "--quiet", "--html", str(page)],
                           cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr  # DIVERGED
    assert page.read_text().startswith("<!DOCTYPE html>") and 'id="heatmap-mma"' in page.read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
    target = tmp_path / "target"
    target.write_text("mine")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    proc = warm_python.run([sys.executable, "-m", "oracle", "compare", "--demo", "--quiet", "--html", str(link)],
                           cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr and target.read_text() == "mine"


def test_verify_writes_a_page_per_case_and_an_index(tmp_path):
    mod = tmp_path / "badops.py"
    mod.write_text("import torch\ndef gemm(a, b):\n    d = a @ b\n    d[:1] = 0\n    return d\n")
    out = tmp_path / "pages"
    proc = warm_python.run([sys.executable, "-m", "oracle", "verify", "--op", "badops:gemm", "--shape", "40x24x64",
                            "--dtype", "fp32", "--html", str(out)], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{ROOT}:{tmp_path}"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    index = (out / "index.html").read_text()
    assert sorted(p.name for p in out.iterdir()) == ["0000-40x24x64-fp32.html", "index.html"]
    assert 'href="0000-40x24x64-fp32.html"' in index and "DIVERGED" in index
    page = (out / "0000-40x24x64-fp32.html").read_text()
    assert 'id="heatmap-epilogue_store"' in page and "python -m oracle verify --op badops:gemm" in page


def test_a_bench_case_that_breaks_is_a_row_of_the_index(tmp_path):
    from oracle.tools.cli import main

    p = tmp_path / "c.toml"
    p.write_text(f"[defaults]\ncase = 'missing.toml'\n[[case]]\nname = '{EVIL}'\n")
    assert main(["bench", "--cases", str(p), "--workers", "1", "--no-time", "--html", str(tmp_path / "h")]) == 2
    index = (tmp_path / "h" / "index.html").read_text()
    assert "ERROR" in index and "&lt;script&gt;" in index and "<script>alert" not in index


def test_the_pytest_plugin_writes_the_page_of_a_failing_check(pytester):
    pages = pytester.path / "pages"
    result = run_foreign_tests(pytester, f"--oracle-html={pages}", tests=(BAD,))
    result.assert_outcomes(failed=1)
    (page,) = list(pages.iterdir())
    assert page.name == "test_foreign.py_test_bad-1.html"
    result.stdout.fnmatch_lines([f"*HTML report: {page}*"])
    assert 'id="heatmap-epilogue_store"' in page.read_text()


def test_an_attention_page_draws_its_units_element_by_element_and_per_kv_block():
    from oracle.problem.attention import AttentionSpec
    from oracle.run.attention_simulate import simulate_attention

    spec = AttentionSpec(batch=1, heads_q=2, heads_kv=2, seqlen_q=64, seqlen_k=96, head_dim=32, causal="bottom_right",
                         q_dtype="bf16", k_dtype="bf16", v_dtype="bf16", o_dtype="bf16", block_q=32, block_kv=32)
    rep = oracle.judge(simulate_attention(spec, defect="max_not_updated_before_rescale", inputs="random", seed=0))
    assert rep.first_divergence.stage == "softmax_state"
    page = rep.to_html()
    assert 'data-stage="softmax_state"' in page and 'id="worst-softmax_state"' in page  # attention units keep maps
    curve = page[page.index('id="kblocks-softmax_state"'):]
    assert "KV block" in curve[:curve.index("</svg>")]
    assert "rows: batch x heads_q + head" in page

"""Every command the README and docs/*.md show works: the CPU-runnable ones are run (each once,
with a time limit, `/tmp/` moved to a private folder); a block marked `<!-- gpu -->` or
`<!-- not-run: why -->` on the line before it is checked instead: `python -m oracle` words through
the command line's own parser and the case files they name loaded, scripts' flags against their
source, `make` with `-n` in a reproducer an earlier command on the page wrote, install commands
against their exact text. Also: every relative link resolves, the README stays a guide (at most
300 lines, its first block unchanged), the knobs page matches `python -m oracle knobs`, the case-file
page names every key the reader accepts, TOML examples parse and agree with the file they name,
and the live commands in the case files' header comments parse."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import warm_python  # tests/ is on sys.path: the commands run from a warm interpreter

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_LANGS = ("bash", "console", "sh")
TIMEOUT_S = 180
MAX_README_LINES = 300

# The README's first block, byte for byte: CI (.ci/run) runs the second command verbatim.
FIRST_BLOCK = """```bash
# 1. install and run the main job on the embedded demo (no GPU needed; exits 1: the demo kernel is defective)
pip install torch==2.13.0 -e . && python -m oracle compare --demo

# 2. install and run the tests (what CI runs: .ci/run; as root: Debian's chromium for the HTML report's browser test)
apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver && pip install torch==2.13.0 -e '.[dev,cuda]' && pip install --no-deps nvidia-cutlass && python -m pytest -q -n auto --dist loadfile tests
```"""
# Install commands are checked for their exact text (they are never run here).
INSTALLS = {
    "apt-get update",
    "DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver",
    "pip install torch==2.13.0 -e .",
    "pip install torch==2.13.0 -e '.[dev,cuda]'",
    "pip install --no-deps nvidia-cutlass",
    "pip install 'gemm-oracle[plots]'",
}
INSTALL_WORDS = {" ".join(shlex.split(i)) for i in INSTALLS}  # as the page's words are compared
# Exit codes other than 0 that a documented command gives by design.
EXPECTED_EXIT = {"python -m oracle compare --demo": 1,
                 "python -m oracle compare --demo --quiet --html /tmp/demo.html": 1,
                 "python -m oracle compare --dump /tmp/attention-max.safetensors": 1,
                 "python -m oracle compare --dump /tmp/scaled.safetensors": 1}
MARKER = re.compile(r"^<!--\s*(gpu|not-run:\s*\S.*?)\s*-->$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str | None  # "gpu", "not-run: ...", or None (run it)
    body: tuple[str, ...]


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        assert j < len(lines), f"{page.name}:{i + 1}: a code block is never closed"
        prev = lines[i - 1].strip() if i else ""
        mk = MARKER.match(prev)
        out.append(Block(page, i + 1, m.group(1), mk.group(1) if mk else None, tuple(lines[i + 1:j])))
        i = j + 1
    return out


def commands(block: Block) -> list[str]:
    """The block's command lines (continuations joined); in a console block only the `$ ` lines."""
    out, cur = [], None
    for raw in block.body:
        if block.lang == "console":
            if cur is None and not raw.startswith("$ "):
                continue
            text = raw[2:] if cur is None else raw
        else:
            text = raw
            if cur is None and (not text.strip() or text.lstrip().startswith("#")):
                continue
        text = text.rstrip()
        if text.endswith("\\"):
            cur = (cur or "") + text[:-1] + " "
            continue
        out.append(((cur or "") + text).strip())
        cur = None
    return out


def simple_commands(line: str) -> list[tuple[list[str], bool]]:
    """`a && b` -> [(words of a, background?), ...]; `#` comments dropped."""
    words = shlex.split(line, comments=True)
    out, cur = [], []
    for w in words + ["&&"]:
        if w == "&&":
            if cur:
                background = cur[-1] == "&"
                out.append((cur[:-1] if background else cur, background))
            cur = []
        else:
            cur.append(w)
    return out


class Session:
    """One page's commands, in order: its private folder for /tmp/, and the failures."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.failures: list[str] = []

    def local(self, word: str) -> str:
        word = word.replace("$XDG_RUNTIME_DIR", str(self.tmp))
        return word.replace("/tmp/", f"{self.tmp}/")

    def fail(self, where: str, words, why: str) -> None:
        self.failures.append(f"{where}: `{' '.join(words)}`: {why}")


_RAN: dict[str, subprocess.CompletedProcess] = {}  # each command runs once per test session


def run(words: list[str], session: Session) -> subprocess.CompletedProcess:
    argv = [sys.executable if w == "python" and i == 0 else session.local(w) for i, w in enumerate(words)]
    key = " ".join(argv)  # a command that writes under /tmp/ runs once per page, in the page's folder
    if key not in _RAN:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        try:
            _RAN[key] = warm_python.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _RAN[key] = subprocess.CompletedProcess(argv, -9, "", f"timed out after {TIMEOUT_S} s")
    return _RAN[key]


def placeholder(path: str) -> bool:
    """CASE.toml, FILE.cu, SWEEP.toml: a word in capitals stands for the user's own file."""
    return Path(path).name.split(".")[0].isupper()


def strict_parser():
    """The command line's parser, refusing abbreviated flags: a page that writes `--input` would
    pass only while no other flag starts so, and a renamed flag must fail here."""
    from oracle.tools import cli

    parser = cli.build_parser()
    parser.allow_abbrev = False
    for action in parser._actions:
        for sub in (getattr(action, "choices", None) or {}).values() if hasattr(action, "add_parser") else ():
            sub.allow_abbrev = False
    return parser


def check_oracle_args(words: list[str], where: str, s: Session) -> None:
    """Through the CLI's own parser, then every input file named, then the live case loaded and
    held to every check that needs no build and no GPU."""
    from oracle.run.case_types import CaseError
    from oracle.problem.spec import SpecError
    from oracle.tools import cli

    try:
        args = strict_parser().parse_args(words)
    except SystemExit:
        s.fail(where, ["python", "-m", "oracle", *words], "the command line's parser refuses it")
        return
    for flag in ("cases", "kernel", "sweep", "warm"):
        for v in (getattr(args, flag, None) or []) if flag == "warm" else [getattr(args, flag, None)]:
            if v and not placeholder(v) and not (ROOT / v).exists():
                s.fail(where, words, f"--{flag} {v}: no such file")
    problems = ([args.case] if getattr(args, "case", None) else []) + list(getattr(args, "problem", None) or [])
    tomls = [p for p in problems if p.endswith(".toml")]
    if not tomls or any(placeholder(p) for p in tomls):
        return
    if not (ROOT / tomls[0]).is_file():
        s.fail(where, words, f"--problem {tomls[0]}: no such file")
        return
    args.problem = [str(ROOT / p) if p.endswith(".toml") else p for p in problems]
    try:
        case = cli._case(args)  # the command line's own assembly: flags, trace selection, opt-ins
        from oracle.run.case import check_trace_selection

        check_trace_selection(case)
    except (CaseError, SpecError, cli.UsageError) as e:
        s.fail(where, words, f"its case does not load: {e}")


def check_command(words: list[str], background: bool, block: Block, s: Session) -> None:
    where = f"{block.page.relative_to(ROOT)}:{block.line}"
    text = " ".join(words)
    if text in INSTALL_WORDS:  # an install command, known by its exact text (apt-get's sets its own variable)
        return
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # NAME=value before a command
        check_knob(words[0].split("=", 1)[0], where, s)
        words = words[1:]
    if not words:
        return
    if words[0] == "export":
        for w in words[1:]:
            check_knob(w.split("=", 1)[0], where, s)
        return
    if words[0] == "pip":
        if text not in INSTALL_WORDS:
            s.fail(where, words, "an install command this test does not know; add its exact text to INSTALLS")
        return
    runnable = block.marker is None and not background
    if words[:3] == ["python", "-m", "oracle"]:
        check_oracle_args(words[3:], where, s)
        if runnable:
            done = run(words, s)
            want = EXPECTED_EXIT.get(text, 0)
            if done.returncode != want:
                s.fail(where, words, f"exit {done.returncode}, not {want}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return
    if words[:3] == ["python", "-m", "pytest"]:
        plugin = (ROOT / "oracle/tools/pytest_plugin.py").read_text()
        for w in words[3:]:
            if w.startswith("--oracle") and f'"{w}"' not in plugin:
                s.fail(where, words, f"{w} is not an option of the pytest plugin")
        if text != "python -m pytest -q -n auto --dist loadfile tests" and runnable:
            s.fail(where, words, "a pytest command on a page must be marked: this test does not run suites")
        return
    if words[0] == "python" and len(words) > 1 and words[1].endswith(".py"):
        script = ROOT / words[1]
        if not script.is_file():
            s.fail(where, words, f"{words[1]}: no such script")
            return
        source = script.read_text()
        for w in words[2:]:
            if w.startswith("--") and f'"{w.split("=")[0]}"' not in source:
                s.fail(where, words, f"{w} is not an option of {words[1]}")
        if runnable:
            s.fail(where, words, "benchmark scripts are not run here: mark the block")
        return
    if words[0] == "make":
        check_make(words, where, s)
        return
    if "/" in words[0] and Path(s.local(words[0])).parent.joinpath("Makefile").is_file():
        folder = Path(s.local(words[0])).parent  # a program the reproducer's Makefile builds
        done = subprocess.run(["make", "-n", "-C", str(folder), Path(words[0]).name], capture_output=True, text=True)
        if done.returncode:
            s.fail(where, words, f"the reproducer's Makefile does not build it: {done.stderr.strip()}")
        return
    s.fail(where, words, "no check for this command: run it in an unmarked block, or teach this test to check it")


def check_make(words: list[str], where: str, s: Session) -> None:
    if "-C" not in words:
        s.fail(where, words, "make without -C DIR")
        return
    folder = Path(s.local(words[words.index("-C") + 1]))
    if not (folder / "Makefile").is_file():
        s.fail(where, words, f"no reproducer was written to {folder} earlier on this page")
        return
    done = subprocess.run([w if i == 0 else s.local(w) for i, w in enumerate(words)] + ["-n"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    if done.returncode:
        s.fail(where, words, f"make -n fails: {done.stderr.strip()}")


def check_knob(name: str, where: str, s: Session) -> None:
    from oracle import knobs

    if name not in {k.name for k in knobs.ALL} and name not in ("PYTHONPATH",):
        s.fail(where, [name], "not an ORACLE_* knob")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_on_the_page_works(page, tmp_path):
    s = Session(tmp_path)
    for block in blocks(page):
        if block.lang not in COMMAND_LANGS:
            continue
        for line in commands(block):
            for words, background in simple_commands(line):
                check_command(words, background, block, s)
        if block.lang == "console" and block.marker is None:
            check_console_output(block, s)
    assert not s.failures, "\n".join(s.failures)


def check_console_output(block: Block, s: Session) -> None:
    """The output a console block shows is what its command prints: in full where the references
    run on the CPU, as here; stage names, verdicts and the first divergence's place anywhere."""
    body = list(block.body)
    cmd = body[0][2:]
    shown = "\n".join(body[1:]).strip()
    got = run(shlex.split(cmd), s).stdout.strip()
    if "references on cpu" in got:
        if shown != got:
            s.failures.append(f"{block.page.name}:{block.line}: the output shown is not what `{cmd}` prints:\n{got}")
        return

    def gist(text):
        rows = [ln.split()[:3] for ln in text.splitlines() if re.match(r"^(descriptor|load|dequant|mma|reduce|epilogue)", ln)]
        first = [ln.split(": received")[0] for ln in text.splitlines() if ln.startswith("First divergence")]
        return rows, first

    if gist(shown) != gist(got):
        s.failures.append(f"{block.page.name}:{block.line}: the stages shown are not what `{cmd}` prints:\n{got}")


def test_readme_is_a_guide():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES, f"README.md has {len(text.splitlines())} lines"
    first = re.search(r"^```bash\n.*?\n```", text, re.S | re.M)
    assert first and first.group(0) == FIRST_BLOCK, "README.md's first block changed: CI runs its second command"
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert FIRST_BLOCK.splitlines()[-2] in ci, ".ci/run no longer runs the README's test command verbatim"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for install in INSTALLS:
        for extra in re.findall(r"\[([a-z,]+)\]", install):
            assert set(extra.split(",")) <= set(extras), f"{install}: pyproject.toml has no extra {extra}"


def _slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def test_every_relative_link_resolves():
    bad = []
    for page in PAGES + [ROOT / "benchmarks/results/README.md"]:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", dest.read_text(), re.M)}
                if anchor not in slugs:
                    bad.append(f"{page.relative_to(ROOT)}: {target}: no heading #{anchor}")
    assert not bad, "\n".join(bad)


def test_knobs_page_matches_the_knobs_command():
    from oracle import knobs

    done = warm_python.run([sys.executable, "-m", "oracle", "knobs"], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    printed = [ln.split()[0] for ln in done.stdout.splitlines()[2:] if ln.startswith("ORACLE_")]
    rows = [r for r in re.findall(r"^\| `(ORACLE_\w+)` \| (.*?) \|", (ROOT / "docs/knobs.md").read_text(), re.M)]
    assert [name for name, _ in rows] == printed, "docs/knobs.md lists other knobs, or another order, than the command"
    by_name = {k.name: k for k in knobs.ALL}
    for name, default in rows:
        k = by_name[name]
        if default == "unset":
            assert k.default() is None, f"{name}: the page says unset, the default is {k.default()!r}"
        elif re.fullmatch(r"`[^`]+`", default):  # one value: it must parse to the knob's default
            assert k.parse(default.strip("`")) == k.default(), f"{name}: the page's default {default} is not the knob's"


def test_case_file_page_names_every_key():
    from oracle.problem.spec import ProblemSpec, Scale, Tile
    from oracle.run import case

    page = (ROOT / "docs/case-file.md").read_text()
    keys = {f.name for f in dataclasses.fields(ProblemSpec)} | {f.name for f in dataclasses.fields(Scale)}
    keys |= {f.name for f in dataclasses.fields(case.KernelSource)} - {"adapter"}
    keys |= {f.name for f in dataclasses.fields(case.LaunchPlan)} | {f.name for f in dataclasses.fields(case.TracePlan)}
    keys |= {f.name for f in dataclasses.fields(case.Workspace)} - {"name"}
    keys |= {f.name for f in dataclasses.fields(case.RunPlan)}
    keys |= set(case.OPERANDS) | set(case.SIZE_NAMES) | set(case.LITERAL_TYPES) | set(case.TENSORMAP_OPTIONS)
    keys |= set(case.WORKSPACE_INITS) | set(case.WORKSPACE_DTYPES) | {"extends", "workspace", "tensormap", "null"}
    keys |= {f"[{s}]" if s != "workspace" else "[workspace.NAME]" for s in case.SECTIONS}
    assert {f.name for f in dataclasses.fields(Tile)} == {"bm", "bn", "bk"}
    missing = sorted(k for k in keys if f"`{k}" not in page and f"{k} =" not in page)
    assert not missing, f"docs/case-file.md does not document: {', '.join(missing)}"


def test_toml_examples_parse_and_agree_with_the_file_they_name():
    bad = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang != "toml":
                continue
            try:
                doc = tomllib.loads("\n".join(block.body))
            except tomllib.TOMLDecodeError:  # a block of alternatives: each line one document
                for n, line in enumerate(block.body, block.line + 1):
                    try:
                        tomllib.loads(line)
                    except tomllib.TOMLDecodeError as e:
                        bad.append(f"{page.name}:{n}: not TOML: {e}")
                continue
            named = re.match(r"^#\s*(\S+\.toml)\s*$", block.body[0])
            if not named:
                continue
            real = tomllib.loads((ROOT / named.group(1)).read_text())
            for section, table in doc.items():
                for key, value in (table.items() if isinstance(table, dict) else [(None, table)]):
                    have = real.get(section, {}).get(key) if key is not None else real.get(section)
                    if have != value:
                        bad.append(f"{page.name}:{block.line}: [{section}] {key} = {value!r}, but "
                                   f"{named.group(1)} has {have!r}")
    assert not bad, "\n".join(bad)


def test_case_file_header_commands_parse():
    """The `python -m oracle ...` lines in the shipped case files' comments are real commands."""
    s = Session(Path("/nonexistent"))
    files = [*ROOT.glob("zoo/**/*.toml"), *ROOT.glob("harness/examples/*.toml"), *ROOT.glob("benchmarks/*.toml")]
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = re.match(r"^#\s+(python -m oracle .*)$", line)
            if m:
                words = shlex.split(re.sub(r"\s{2,}\(.*$", "", m.group(1)))
                check_oracle_args(words[3:], f"{f.relative_to(ROOT)}:{n}", s)
    assert not s.failures, "\n".join(s.failures)


@pytest.mark.parametrize("line, why", [
    ("python -m oracle compare zoo/cutlass_sm90/cutlass_sm90.toml zoo/cutlass_sm90/e4m3.toml", "parser refuses"),
    ("python -m oracle compare --problem harness/examples/simple_gemm.toml --input random:1", "parser refuses"),
    ("python -m oracle compare --problem zoo/no_such_case.toml", "no such file"),
    ("python -m oracle compare --problem harness/examples/simple_gemm.toml --set activation=gelu_fast", "does not load"),
    ("python -m oracle compare --problem harness/examples/simple_gemm.toml --trace-tiles 9,9", "does not load"),
    ("python benchmarks/gemm_bench.py --no-such-flag", "not an option"),
    ("export ORACLE_NO_SUCH_KNOB=1", "not an ORACLE_* knob"),
    ("pip install gemm-oracle", "install command"),
    ("make -C /tmp/never_written", "no reproducer was written"),
    ("cp a b", "no check for this command"),
])
def test_the_checker_refuses_a_broken_command(line, why, tmp_path):
    """What the page test would say about commands that do not work (the README's CUTLASS command
    before it named --problem, a flag abbreviated, a case that does not load, ...)."""
    s = Session(tmp_path)
    block = Block(README, 1, "bash", "gpu", (line,))
    for words, background in simple_commands(line):
        check_command(words, background, block, s)
    assert s.failures and why in s.failures[0], s.failures

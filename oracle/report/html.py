"""One self-contained HTML page of a judgement (`compare --html PATH`, `Report.to_html()`), and the
index page of a sweep (`bench` / `verify --html DIR`).

The page needs no network and no plotting library: CSS, a few lines of JavaScript (the copy
buttons) and every picture are inline; pictures are SVG drawn here, and an element map is a PNG
made here (zlib) inside its SVG. It shows the problem, the inputs and the environment; the stage
table with the first divergence and the inherited stages marked; for every diverging stage the
worst err/bound of each tile, the worst unit element by element (elements not compared drawn
apart) and, where its units carry k-blocks (KV blocks for attention), the worst err/bound per
k-block; NaN/Inf provenance; the lines below the table; the closing sentence; and the commands
that re-run it (`Command`, made by the caller, which knows the request). Every string is escaped:
a kernel or file name from the user's files is text, never markup.
"""

from __future__ import annotations

import base64
import html
import math
import re
import shlex
import struct
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

from oracle.judging.compare import Status
from oracle.report.table import (_attention, _deciding, _fmt, _numerics, as_judgement, findings_lines,
                                 performance_table, races_section, sentence, table_headers, table_rows)

MAX_SERIES = 8  # lines of a k-block curve (the worst ones)
MAX_RECT_CELLS = 4096  # a tile heatmap of more cells is one PNG instead of SVG rectangles
MAX_MAP_SIDE = 512  # an element map larger than this is max-pooled down to it


@dataclass(frozen=True)
class Command:
    """A command that re-runs the judgement, shown copyable: `argv` words (quoted for a shell
    when shown), what it does (`label`)."""

    label: str
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(w, str) for w in self.argv):
            raise ValueError(f"Command {self.label!r}: argv = {self.argv!r} must be a non-empty tuple of strings")
        object.__setattr__(self, "argv", tuple(self.argv))

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class IndexEntry:
    """One case of a sweep's index page: its name, verdict, first divergence (a short text),
    the page (a file name beside the index; None when the case made none) and its error."""

    name: str
    verdict: str
    first: str = ""
    page: Optional[str] = None
    error: str = ""

    def __post_init__(self) -> None:
        if self.page is not None and (not _SAFE_PAGE.fullmatch(self.page)):
            raise ValueError(f"IndexEntry {self.name!r}: page = {self.page!r} must be a plain .html file name")


_SAFE_PAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.html")


def _e(x) -> str:
    """Text as HTML (quotes too: safe in an attribute)."""
    return html.escape(str(x), quote=True)


def page_name(index: int, name: str) -> str:
    """A case's page file name: its index and its name reduced to safe characters."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:60] or "case"
    return f"{index:04d}-{slug}.html"


# -- colours ------------------------------------------------------------------------------------
_PASS = ((0.93, 0.96, 0.99), (0.13, 0.44, 0.71))  # err/bound 1e-6 .. 1: pale to mid blue
_FAIL = ((0.99, 0.80, 0.36), (0.70, 0.0, 0.05))  # err/bound 1 .. cap: yellow to dark red
_ZERO = (0.97, 0.98, 0.99)
_INF = (0.0, 0.0, 0.0)
_MASKED = ((0.80, 0.80, 0.80), (0.93, 0.93, 0.93))  # a checker: not compared
FLOOR = 1e-6


def _mix(a, b, t: float):
    t = min(max(t, 0.0), 1.0)
    return tuple(x + (y - x) * t for x, y in zip(a, b))


def _colour(v: float, cap: float):
    """The colour of an err/bound: NaN (not compared) None, 0, passing (<= 1), failing, inf."""
    if v != v:
        return None
    if v == 0:
        return _ZERO
    if math.isinf(v):
        return _INF
    if v <= 1:
        return _mix(*_PASS, (math.log10(max(v, FLOOR)) - math.log10(FLOOR)) / -math.log10(FLOOR))
    return _mix(*_FAIL, math.log10(v) / math.log10(max(cap, 10.0)))


def _hex(c) -> str:
    return "#" + "".join(f"{round(x * 255):02x}" for x in c)


def _png(rows: list[bytes], width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of `rows` (each width * 3 bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _png_of(grid: list[list[float]], cap: float) -> str:
    """A data: URI of the PNG of an err/bound grid (a checker where not compared)."""
    rows = []
    for i, line in enumerate(grid):
        out = bytearray()
        for j, v in enumerate(line):
            c = _colour(v, cap) or _MASKED[(i + j) % 2]
            out += bytes(round(x * 255) for x in c)
        rows.append(bytes(out))
    data = _png(rows, len(grid[0]), len(grid))
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _cap(values) -> float:
    finite = [v for v in values if v == v and not math.isinf(v)]
    return max(finite + [10.0])


# -- pictures -----------------------------------------------------------------------------------
def _svg(width: int, height: int, body: str, *, ident: str, label: str) -> str:
    return (f'<svg id="{ident}" class="fig" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}">{body}</svg>')


def _legend(x: int, y: int, cap: float, masked_label: str, ident: str) -> str:
    """A colour bar for err/bound (log scale) and the swatches of 0, inf and not compared."""
    w, h = 220, 10
    stops = []
    for i in range(11):
        t = i / 10
        v = 10 ** (math.log10(FLOOR) * (1 - 2 * t)) if t <= 0.5 else 10 ** (math.log10(max(cap, 10)) * (2 * t - 1))
        stops.append(f'<stop offset="{t:.2f}" stop-color="{_hex(_colour(v, cap))}"/>')
    grad = f'<defs><linearGradient id="grad-{ident}">{"".join(stops)}</linearGradient></defs>'
    out = [grad, f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="url(#grad-{ident})" stroke="#888"/>']
    for t, text in ((0, _fmt(FLOOR)), (0.5, "1 (bound)"), (1, _fmt(max(cap, 10)))):
        out.append(f'<text x="{x + w * t}" y="{y + h + 11}" class="tick" text-anchor="middle">{_e(text)}</text>')
    out.append(f'<text x="{x}" y="{y - 4}" class="tick">err/bound (log): blue passes, red fails</text>')
    for k, (fill, text) in enumerate(((_hex(_ZERO), "0 (equal)"), (_hex(_INF), "inf (bit-exact differs, non-finite, "
                                                                                "never written)"),
                                      (f"url(#chk-{ident})", masked_label))):
        sx, yy = x, y + h + 18 + k * 13
        out.append(f'<rect x="{sx}" y="{yy}" width="10" height="10" fill="{fill}" stroke="#888"/>'
                   f'<text x="{sx + 14}" y="{yy + 9}" class="tick">{_e(text)}</text>')
    return "".join(out)


def _checker(ident: str) -> str:
    """The pattern of "not compared", named for one figure (ids are unique in a page)."""
    return (f'<defs><pattern id="chk-{ident}" width="6" height="6" patternUnits="userSpaceOnUse">'
            '<rect width="6" height="6" fill="#eee"/><rect width="3" height="3" fill="#ccc"/>'
            '<rect x="3" y="3" width="3" height="3" fill="#ccc"/></pattern></defs>')


def _tile_heatmap(cmp, stage: str, attention: bool, ident: str) -> str:
    """The worst err/bound of every tile (over its k-blocks and partials) of one comparison."""
    worst: dict = {}
    where: dict = {}
    for t in cmp.all_units():
        if t.max_ratio >= worst.get(t.tile, -1.0):
            worst[t.tile] = t.max_ratio
            where[t.tile] = t
    rows = max(t[0] for t in worst) + 1
    cols = max(t[1] for t in worst) + 1
    cap = _cap(worst.values())
    cell = max(4, min(36, 440 // max(cols, 1), 360 // max(rows, 1)))
    left, top = 24, 34
    width, height = max(left + cols * cell + 20, 300), top + rows * cell + 110
    body = [_checker(ident),
            f'<rect x="{left}" y="{top}" width="{cols * cell}" height="{rows * cell}" fill="url(#chk-{ident})"/>']
    if rows * cols <= MAX_RECT_CELLS:
        for (tm, tn), v in sorted(worst.items()):
            t = where[(tm, tn)]
            kb = "" if t.k_block is None else f", {'KV block' if attention else 'k-block'} {t.k_block}"
            part = "" if t.partial is None else f", partial {t.partial}"
            tip = f"tile ({tm}, {tn}){part}{kb}: worst err/bound {_fmt(v)}, {t.mismatches}/{t.compared} bad"
            body.append(f'<rect x="{left + tn * cell}" y="{top + tm * cell}" width="{cell}" height="{cell}" '
                        f'fill="{_hex(_colour(v, cap))}" stroke="#fff" stroke-width="{0.5 if cell > 6 else 0}">'
                        f'<title>{_e(tip)}</title></rect>')
    else:
        grid = [[float("nan")] * cols for _ in range(rows)]
        for (tm, tn), v in worst.items():
            grid[tm][tn] = v
        body.append(f'<image x="{left}" y="{top}" width="{cols * cell}" height="{rows * cell}" '
                    f'preserveAspectRatio="none" style="image-rendering:pixelated" href="{_png_of(grid, cap)}"/>')
    xl, yl = ("query block", "batch x heads_q + head") if attention else ("tile n", "tile m")
    body.append(f'<text x="{left}" y="{top - 8}" class="tick">rows: {_e(yl)} 0 .. {rows - 1} &#8595;   columns: '
                f'{_e(xl)} 0 .. {cols - 1} &#8594;</text>')
    body.append(_legend(left, top + rows * cell + 36, cap, "not compared (not traced)", ident))
    return _svg(width, height, "".join(body), ident=ident, label=f"{stage}: worst err/bound per tile")


def _pooled(m) -> list[list[float]]:
    """An element map as lists, max-pooled (NaN only where every pooled element is NaN) to at most
    MAX_MAP_SIDE a side."""
    import torch

    m = m.float()
    f = max(1, math.ceil(max(m.shape) / MAX_MAP_SIDE))
    if f > 1:
        h, w = m.shape
        pad = torch.full((-(-h // f) * f, -(-w // f) * f), float("nan"))
        pad[:h, :w] = m
        blocks = pad.reshape(pad.shape[0] // f, f, pad.shape[1] // f, f).permute(0, 2, 1, 3).reshape(
            pad.shape[0] // f, pad.shape[1] // f, f * f)
        m = torch.where(torch.isnan(blocks), float("-inf"), blocks).amax(-1)
        m = torch.where(torch.isneginf(m), float("nan"), m)
    return m.tolist()


def _element_map(unit, stage: str, ident: str, masked: str) -> str:
    """The err/bound of every element of one failing unit, as a PNG in an SVG with its axes."""
    grid = _pooled(unit.ratio_map)
    rows, cols = len(grid), len(grid[0])
    cap = _cap(v for line in grid for v in line)
    scale = max(1, min(440 // cols, 320 // rows)) if cols <= 440 and rows <= 320 else 1
    w, h = max(cols * scale, 120), max(rows * scale, 60)
    left, top = 24, 34
    width, height = max(left + w + 20, 300), top + h + 110
    pooled = "" if (rows, cols) == tuple(unit.ratio_map.shape) else \
        f" (each pixel the worst of {math.ceil(unit.ratio_map.shape[0] / rows)}^2 elements)"
    body = [_checker(ident),
            f'<image x="{left}" y="{top}" width="{w}" height="{h}" preserveAspectRatio="none" '
            f'style="image-rendering:pixelated" href="{_png_of(grid, cap)}"/>',
            f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#888"/>',
            f'<text x="{left}" y="{top - 8}" class="tick">rows 0 .. {unit.ratio_map.shape[0] - 1} &#8595;   '
            f'columns 0 .. {unit.ratio_map.shape[1] - 1} &#8594; (in the unit){_e(pooled)}</text>',
            _legend(left, top + h + 36, cap, masked, ident)]
    return _svg(width, height, "".join(body), ident=ident, label=f"{stage}: err/bound per element of the worst unit")


_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _series(st) -> dict:
    """(comparison, tile, partial) -> {k-block: worst err/bound}, over the units that have a k-block."""
    out: dict = {}
    for label, cmp in (("teacher-forced", st.teacher_forced), ("chained", st.chained)):
        for t in cmp.all_units():
            if t.k_block is not None:
                pts = out.setdefault((label, tuple(t.tile), t.partial), {})
                pts[t.k_block] = max(pts.get(t.k_block, 0.0), t.max_ratio)
    return out


def _kblock_curve(st, attention: bool, ident: str) -> Optional[str]:
    """The worst err/bound after each k-block (KV block) of every traced tile, teacher-forced solid,
    chained dashed, on a log scale with the bound at 1; None when no unit has a k-block."""
    series = _series(st)
    if not series:
        return None
    ranked = sorted(series.items(), key=lambda kv: (-max(v if v == v else 0 for v in kv[1].values()), kv[0][0],
                                                     kv[0][1], kv[0][2] or 0))
    shown = ranked[:MAX_SERIES]
    values = [v for _, pts in shown for v in pts.values() if v > 0 and v == v]
    finite = [v for v in values if not math.isinf(v)]
    lo = math.floor(math.log10(max(min(finite + [1.0]), FLOOR))) - 1
    hi = math.ceil(math.log10(max(finite + [1.0]))) + 1
    kbs = sorted({k for _, pts in shown for k in pts})
    left, top, pw, ph = 52, 24, 300, 200
    width, height = 540, top + ph + 56
    x_of = (lambda k: left + (pw / 2 if len(kbs) == 1 else pw * (k - kbs[0]) / (kbs[-1] - kbs[0])))

    def y_of(v: float) -> float:
        if math.isinf(v) or v != v:
            return top
        return top + ph * (hi - math.log10(max(v, 10.0 ** lo))) / (hi - lo)

    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fcfcfc" stroke="#888"/>']
    for p in range(lo, hi + 1):
        y = y_of(10.0 ** p)
        body.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                    f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">1e{p}</text>')
    step = max(1, len(kbs) // 16)
    for k in kbs[::step]:
        body.append(f'<text x="{x_of(k):.1f}" y="{top + ph + 14}" class="tick" text-anchor="middle">{k}</text>')
    y1 = y_of(1.0)
    body.append(f'<line x1="{left}" x2="{left + pw}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="#d00" stroke-dasharray="5 3"/>'
                f'<text x="{left + pw - 4}" y="{y1 - 4:.1f}" class="tick" text-anchor="end" fill="#d00">bound: above '
                f'fails</text>')
    what = "KV block" if attention else "k-block"
    body.append(f'<text x="{left + pw / 2}" y="{top + ph + 32}" class="tick" text-anchor="middle">{what}</text>'
                f'<text x="{left}" y="{top - 8}" class="tick">worst err/bound per {what} (inf drawn at the top)</text>')
    for n, ((label, tile, part), pts) in enumerate(shown):
        colour = _PALETTE[n % len(_PALETTE)]
        xy = [(x_of(k), y_of(pts[k]), k, pts[k]) for k in sorted(pts)]
        dash = "" if label == "teacher-forced" else ' stroke-dasharray="6 4"'
        if len(xy) > 1:
            body.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="'
                        + " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in xy) + '"/>')
        name = f"tile {tile}" + ("" if part is None else f" partial {part}") + f" {label}"
        for x, y, k, v in xy:
            body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"><title>'
                        f'{_e(f"{name}, {what} {k}: err/bound {_fmt(v)}")}</title></circle>')
        ly = top + 8 + 16 * n
        body.append(f'<line x1="{left + pw + 16}" x2="{left + pw + 40}" y1="{ly}" y2="{ly}" stroke="{colour}" '
                    f'stroke-width="2"{dash}/><text x="{left + pw + 46}" y="{ly + 4}" class="tick">{_e(name)}</text>')
    if len(ranked) > len(shown):
        body.append(f'<text x="{left + pw + 16}" y="{top + 8 + 16 * len(shown)}" class="tick">and '
                    f'{len(ranked) - len(shown)} more (the worst shown)</text>')
    return _svg(width, height, "".join(body), ident=ident, label=f"{st.name}: worst err/bound per {what}")


# -- sections -----------------------------------------------------------------------------------
def _ident(stage: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", stage.lower())


def _dl(items) -> str:
    return "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _value(v) -> str:
    if isinstance(v, dict):
        return _dl((k, _value(x)) for k, x in v.items())
    return _e(v)


def _collapsed(text: str) -> str:
    """A long text as its first clause, the whole of it one click away."""
    head, sep, _ = text.partition(";")
    if not sep or len(text) < 160:
        return _e(text)
    return f"<details><summary>{_e(head)}; ...</summary>{_e(text)}</details>"


def _facts(j) -> str:
    an = j.analysis
    rec = an.recording
    whole = an.whole or rec
    items = [("kernel", _e(rec.kernel)), ("problem", _e(whole.spec.describe())),
             ("numerics", _collapsed(_numerics(rec.spec))), ("inputs", _e(rec.provenance.describe())
                                                     + ("" if rec.provenance.controlled else " (not controlled)")),
             ("references on", _e(an.device))]
    if j.source:
        items.insert(0, ("source", _e(j.source)))
    if rec.kernel_error:
        items.append(("kernel error", _e(rec.kernel_error)))
    if j.kernel_run is not None:
        items.append(("kernel run", _value(j.kernel_run.to_json())))
    if an.groups:
        items.append(("groups", "<br>".join(_e(o.describe()) for o in an.groups)
                      + f"<br>the stages below are group {_e(an.group)}'s"))
    if j.phases_s:
        items.append(("seconds", _e(", ".join(f"{k} {v:.3g}" for k, v in j.phases_s.items()))))
    env = dict(rec.environment)
    out = _dl(items)
    if env:
        out += f"<details><summary>environment ({len(env)} entries)</summary>{_value(env)}</details>"
    return out


def _stage_table(an) -> str:
    heads = table_headers(an)
    first = an.first.stage if an.first is not None else an.diagnosis.stage
    inherited = set(an.diagnosis.inherited)
    rows = []
    for st, cells in zip(an.stages, table_rows(an)):
        cls, mark = [], ""
        if st.name == first:
            cls.append("first")
            mark = ' <span class="mark">&#9664; first divergence</span>'
        elif st.name in inherited:
            cls.append("inherited")
            mark = ' <span class="mark">inherited</span>'
        if st.teacher_forced.status is Status.NOT_RUN and st.chained.status is Status.NOT_RUN:
            cls.append("notrun")
        for c in (st.teacher_forced, st.chained):
            if c.status is Status.MISMATCH:
                cls.append("bad")
                break
        name = _e(cells[0])
        if _diverges(st):
            name = f'<a href="#stage-{_ident(st.name)}">{name}</a>'
        tds = [f"<td>{name}{mark}</td>"] + [f'<td class="{_e(_cell_class(c))}">{_e(c)}</td>' for c in cells[1:]]
        rows.append(f'<tr class="{" ".join(cls)}" data-stage="{_e(st.name)}">{"".join(tds)}</tr>')
    return (f'<div class="scroll"><table id="stages"><thead><tr>{"".join(f"<th>{_e(h)}</th>" for h in heads)}'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def _cell_class(text: str) -> str:
    return {"MISMATCH": "st-bad", "MATCH": "st-ok", "MISTRUSTED": "st-warn"}.get(text, "")


def _diverges(st) -> bool:
    return any(c.status is Status.MISMATCH and c.tiles for c in (st.teacher_forced, st.chained))


def _stage_section(st, attention: bool) -> str:
    cmp = st.teacher_forced if st.teacher_forced.status is Status.MISMATCH and st.teacher_forced.tiles else st.chained
    label = "teacher-forced" if cmp is st.teacher_forced else "chained"
    ident = _ident(st.name)
    parts = [f'<section class="stage" id="stage-{ident}"><h3>{_e(st.name)} <small>({label}; '
             f'{cmp.failing_units} of {cmp.units} unit(s) fail, {cmp.mismatches}/{cmp.compared} elements)</small></h3>']
    parts.append('<div class="figs">')
    parts.append(f"<div><h4>worst err/bound per tile</h4>{_tile_heatmap(cmp, st.name, attention, f'heatmap-{ident}')}"
                 "</div>")
    unit = max((t for t in cmp.tiles if not t.passed and t.ratio_map is not None),
               key=lambda t: (t.max_ratio, t.mismatches), default=None)
    unit_name = "unit" if attention else "tile"
    if unit is not None:
        kb = "" if unit.k_block is None else f", {'KV block' if attention else 'k-block'} {unit.k_block}"
        part = "" if unit.partial is None else f", partial {unit.partial}"
        masked = _deciding_masked(cmp)
        parts.append(f"<div><h4>the worst {unit_name}, {_e(unit.tile)}{_e(part)}{_e(kb)}, element by element</h4>"
                     + _element_map(unit, st.name, f"worst-{ident}", masked) + "</div>")
    else:
        parts.append(f'<p class="quiet">No element map was kept for this stage\'s failing {unit_name}s.</p>')
    curve = _kblock_curve(st, attention, f"kblocks-{ident}")
    if curve is not None:
        parts.append(f"<div><h4>per {'KV block' if attention else 'k-block'}</h4>{curve}</div>")
    parts.append("</div>")
    bad = cmp.worst.first_bad if cmp.worst is not None else ()
    if bad:
        rows = "".join(f"<tr><td>({b.row}, {b.col})</td><td>{_e(_fmt(b.received, 6))}</td>"
                       f"<td>{_e(_fmt(b.expected, 6))}</td><td>{_e(_fmt(b.bound))}</td>"
                       f"<td>{'never written' if b.unwritten else ''}</td></tr>" for b in bad)
        parts.append(f"<h4>first bad elements of the worst {unit_name}</h4><table class=\"small\"><thead><tr>"
                     f"<th>element (global)</th><th>received</th><th>expected</th><th>bound</th><th></th></tr>"
                     f"</thead><tbody>{rows}</tbody></table>")
    parts.append("</section>")
    return "".join(parts)


def _deciding_masked(cmp) -> str:
    ev = cmp.evidence
    what = ev.describe_masked() if ev.masked_total else "none in this comparison"
    return f"not compared ({what})"


def _nonfinite(an) -> str:
    rows = []
    for st in an.stages:
        for label, c in (("teacher-forced", st.teacher_forced), ("chained", st.chained)):
            units = c.all_units()
            counts = [sum(getattr(t, f) for t in units) for f in ("nan_received", "nan_expected", "inf_received",
                                                                   "inf_expected")]
            if any(counts):
                rows.append(f"<tr><td>{_e(st.name)}</td><td>{label}</td>"
                            + "".join(f"<td>{n}</td>" for n in counts) + "</tr>")
    first = (f"<p>The first NaN or Inf received, in pipeline order: <b>{_e(an.first_nonfinite.describe())}</b>.</p>"
             if an.first_nonfinite else "<p>No stage received a NaN or Inf that its reference did not have.</p>")
    if not rows:
        return first + "<p class=\"quiet\">No compared element held a NaN or Inf, on either side.</p>"
    return first + ("<table class=\"small\"><thead><tr><th>stage</th><th>comparison</th><th>NaN received</th>"
                    "<th>NaN expected</th><th>Inf received</th><th>Inf expected</th></tr></thead><tbody>"
                    + "".join(rows) + "</tbody></table>")


def _notes(j) -> str:
    an = j.analysis
    lines = findings_lines(an)
    lines += [("not seen", u) for u in an.unobserved]
    lines += [("incomplete trace", u) for u in an.incomplete_trace]
    lines += [("cross-check", c) for c in an.cross_check]
    items = "".join(f'<li><span class="label">{_e(label)}</span> {_e(text)}</li>' for label, text in lines)
    out = f"<ul class=\"notes\">{items}</ul>" if items else "<p class=\"quiet\">Nothing to add.</p>"
    extra = races_section(j.races, j.sanitizer)
    if extra:
        out += f"<h3>races and sanitizer</h3><pre>{_e(chr(10).join(extra))}</pre>"
    if j.notices:
        out += "<h3>notices</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in j.notices) + "</ul>"
    return out


def _commands(commands: Sequence[Command], an) -> str:
    cmds = list(commands)
    if an.first is not None and an.first.rerun:
        cmds.append(Command("re-run with the failing tile traced", tuple(shlex.split(an.first.rerun))))
    if not cmds:
        return "<p class=\"quiet\">The request that made this judgement is not known here.</p>"
    out = []
    for n, c in enumerate(cmds):
        out.append(f'<div class="cmd"><div class="cmdlabel">{_e(c.label)}</div><pre id="cmd-{n}"><code>'
                   f'{_e(c.text)}</code></pre><button type="button" data-copy="cmd-{n}">copy</button></div>')
    return "".join(out)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1b1b;background:#fff}
main{max-width:1280px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:20px;margin:4px 0 8px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}h4{font-size:13px;margin:12px 0 4px;color:#444}small{color:#555;font-weight:normal}
.badge{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:bold;margin-right:8px}
.v-MATCH{background:#2e7d32}.v-DIVERGED{background:#c62828}.v-KERNEL_ERROR{background:#6a1b9a}
.v-ORACLE_UNTRUSTED,.v-MISTRUSTED,.v-NONDETERMINISTIC{background:#ef6c00}
#sentence{background:#fff8e1;border-left:4px solid #f9a825;padding:8px 12px;margin:8px 0}
.synthetic{background:#fde;padding:6px 10px;border-left:4px solid #c2185b}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:4px 0}dt{color:#555}dd{margin:0}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:12.5px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;white-space:nowrap}th{background:#f3f3f3}
tr.first td{background:#ffebee;font-weight:bold}tr.first td:first-child{border-left:4px solid #c62828}
tr.inherited td{background:#fff6f6}tr.notrun td{color:#999}.mark{font-size:11px;color:#c62828;font-weight:bold}
tr.inherited .mark{color:#a66;font-weight:normal}.st-bad{color:#c62828;font-weight:bold}.st-ok{color:#2e7d32}
.st-warn{color:#ef6c00}.figs{display:flex;flex-wrap:wrap;gap:4px 16px;align-items:flex-start}svg.fig{display:block;margin:4px 0 8px;max-width:100%;height:auto}
svg .tick{font-size:11px;fill:#333}.quiet{color:#777}.notes .label{color:#555;font-weight:bold}
.cmd{position:relative;margin:6px 0}.cmd pre{background:#f6f8fa;border:1px solid #ddd;padding:8px 60px 8px 10px;
overflow-x:auto;margin:2px 0}.cmd button{position:absolute;right:6px;bottom:8px}.cmdlabel{color:#555;font-size:12px}
"""

_JS = """
document.querySelectorAll('button[data-copy]').forEach(function (b) {
  b.addEventListener('click', function () {
    var text = document.getElementById(b.getAttribute('data-copy')).textContent;
    function done() { b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1500); }
    function select() {
      var r = document.createRange(); r.selectNodeContents(document.getElementById(b.getAttribute('data-copy')));
      var s = window.getSelection(); s.removeAllRanges(); s.addRange(r); b.textContent = 'selected: Ctrl+C';
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, select);
    } else { select(); }
  });
});
"""


def _document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
            f'style-src \'unsafe-inline\'; script-src \'unsafe-inline\'">'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>{body}</main>"
            f"<script>{_JS}</script></body></html>\n")


def render(judgement, commands: Sequence[Command] = ()) -> str:
    """The page of a judgement (or an Analysis), with `commands` that re-run it."""
    j = as_judgement(judgement)
    an = j.analysis
    rec = an.recording
    attention = _attention(rec.spec)
    verdict = j.verdict.value
    head = [f'<h1><span class="badge v-{_e(verdict)}">{_e(verdict)}</span>{_e(rec.kernel)}</h1>']
    if rec.synthetic:
        head.append('<p class="synthetic">SYNTHETIC: this recording was made by a Python model of a kernel with an '
                    'injected defect, not by a real kernel.</p>')
    head.append(f'<p id="sentence">{_e(sentence(j))}</p>')
    body = head + ["<h2>Problem, inputs and environment</h2>", _facts(j),
                   "<h2>Stages</h2>", _stage_table(an)]
    diverging = [st for st in an.stages if _diverges(st)]
    if diverging:
        body.append("<h2>Diverging stages</h2>")
        body.extend(_stage_section(st, attention) for st in diverging)
    body += ["<h2>NaN and Inf</h2>", _nonfinite(an), "<h2>Notes and confounds</h2>", _notes(j)]
    if j.performance is not None:
        body.append(f"<h2>Performance</h2><pre>{_e(performance_table(j.performance))}</pre>")
    body += ["<h2>Closing sentence</h2>", f"<p>{_e(sentence(j))}</p>", "<h2>Re-run</h2>", _commands(commands, an)]
    return _document(f"{verdict}: {rec.kernel} ({rec.spec.describe()})", "".join(body))


def write_html(judgement, path: str, commands: Sequence[Command] = ()) -> None:
    """The page at `path`, written whole, never through a link (harness.output_files)."""
    from harness.output_files import write_text_atomically

    write_text_atomically(path, render(judgement, commands), "HTML report")


def index_page(title: str, entries: Sequence[IndexEntry]) -> str:
    """A sweep's index: one row per case, linking its page."""
    rows = []
    for e in entries:
        name = f'<a href="{_e(e.page)}">{_e(e.name)}</a>' if e.page else _e(e.name)
        rows.append(f'<tr><td>{name}</td><td><span class="badge v-{_e(e.verdict)}">{_e(e.verdict)}</span></td>'
                    f"<td>{_e(e.first)}</td><td>{_e(e.error)}</td></tr>")
    counts: dict = {}
    for e in entries:
        counts[e.verdict] = counts.get(e.verdict, 0) + 1
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    body = (f"<h1>{_e(title)}</h1><p>{_e(summary)}</p><div class=\"scroll\"><table id=\"cases\"><thead><tr>"
            f"<th>case</th><th>verdict</th><th>first divergence</th><th>error</th></tr></thead><tbody>"
            f"{''.join(rows)}</tbody></table></div>")
    return _document(title, body)


def write_index(path: str, title: str, entries: Sequence[IndexEntry]) -> None:
    from harness.output_files import write_text_atomically

    write_text_atomically(path, index_page(title, entries), "HTML index")

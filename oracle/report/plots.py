"""Pictures of a divergence (`compare --plots DIR`; matplotlib, the `plots` extra).

For every stage that diverges: a heatmap of the worst err/bound of each output tile (over k-blocks
and partials), the err/bound of every element of the worst failing unit, and for mma the worst
err/bound after each k-block of every traced tile. err/bound above 1 fails; bit-exact stages show
inf where the data differ. Cells that were not compared (a tile nothing was compared in; an element
masked as padding past M or N, or not recorded) are drawn in NOT_COMPARED_COLOUR, named in a legend,
never in the colour of zero error. Tile and k-block axes have integer ticks; every figure is laid
out so that its title, colour bar and legend lie inside it. Files: <stage>_tiles.png,
<stage>_worst_tile.png, mma_k_blocks.png.
"""

from __future__ import annotations

import math
import os

from oracle.judging.compare import Status

NOT_COMPARED_COLOUR = "#4fc3f7"  # light blue: outside magma, whose darkest end is zero error
FLOOR = 1e-12  # err/bound drawn at log10 = -12 when it is 0
MAX_LABELLED_TICKS = 16  # up to this many tiles along an axis: a tick per tile


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("pictures need matplotlib: pip install 'gemm-oracle[plots]'") from None
    return plt


def _finite(v: float, cap: float) -> float:
    return cap if (math.isinf(v) or math.isnan(v)) else v


def write_plots(an, directory: str) -> list[str]:
    """The pictures of every diverging stage of `an` in `directory`; returns the paths written."""
    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    return [_save(fig, plt, directory, name) for name, fig in figures(an)]


def figures(an):
    """(file name, matplotlib Figure) of every picture of `an`, one at a time; the caller closes each."""
    import numpy as np

    plt = _pyplot()
    for st in an.stages:
        cmp = st.teacher_forced if st.teacher_forced.status is Status.MISMATCH else st.chained
        if cmp.status is not Status.MISMATCH or not cmp.tiles:
            continue
        label = "teacher-forced" if cmp is st.teacher_forced else "chained"
        worst: dict = {}
        for t in cmp.all_units():
            worst[t.tile] = max(worst.get(t.tile, 0.0), t.max_ratio)
        finite = [v for v in worst.values() if math.isfinite(v)]
        cap = max(finite + [1.0]) * 2
        rows = max(t[0] for t in worst) + 1
        cols = max(t[1] for t in worst) + 1
        grid = np.full((rows, cols), np.nan)  # NaN: nothing compared in the tile
        for (tm, tn), v in worst.items():
            grid[tm, tn] = _finite(v, cap)
        fig, ax = plt.subplots(figsize=(min(4.5 + cols * 0.4, 14), min(3.5 + rows * 0.4, 12)), layout="constrained")
        _heatmap(fig, ax, grid, "log10 worst err/bound\n(> 0 fails)", "tile", aspect="equal")
        _integer_ticks(ax, rows, cols)
        ax.set_title(f"{st.name} ({label})\nworst err/bound per tile")
        ax.set_xlabel("tile n")
        ax.set_ylabel("tile m")
        yield f"{st.name}_tiles.png", fig
        unit = max((t for t in cmp.tiles if not t.passed and t.ratio_map is not None),
                   key=lambda t: (t.max_ratio, t.mismatches), default=None)
        if unit is not None:
            m = unit.ratio_map.numpy().astype("float64")
            m[np.isinf(m)] = cap  # NaN stays: not compared
            fig, ax = plt.subplots(figsize=(6.5, 5.5), layout="constrained")
            _heatmap(fig, ax, m, "log10 err/bound (> 0 fails)", "element", aspect="auto")
            kb = "" if unit.k_block is None else f", k-block {unit.k_block}"
            part = "" if unit.partial is None else f", partial {unit.partial}"
            ax.set_title(f"{st.name}: tile {unit.tile}{part}{kb}\nerr/bound per element")
            ax.set_xlabel("column in tile")
            ax.set_ylabel("row in tile")
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            yield f"{st.name}_worst_tile.png", fig
        if st.name == "mma":
            yield "mma_k_blocks.png", _k_block_figure(plt, st, cap)


def _heatmap(fig, ax, values, bar_label: str, what: str, aspect: str) -> None:
    """log10 of `values` in magma, NaN cells in NOT_COMPARED_COLOUR with a legend entry when any."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    cmap = colormaps["magma"].with_extremes(bad=NOT_COMPARED_COLOUR)
    shown = np.ma.masked_invalid(np.log10(np.maximum(values, FLOOR)))
    im = ax.imshow(shown, cmap=cmap, interpolation="nearest", aspect=aspect)
    fig.colorbar(im, ax=ax, label=bar_label)
    if np.isnan(values).any():
        why = "no comparison in the tile" if what == "tile" else "masked (padding or unrecorded)"
        ax.legend(handles=[Patch(facecolor=NOT_COMPARED_COLOUR, edgecolor="black", label=f"not compared: {why}")],
                  loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize="small", frameon=False)


def _integer_ticks(ax, rows: int, cols: int) -> None:
    """A tick per tile on short axes, integer ticks on long ones."""
    from matplotlib.ticker import MaxNLocator

    for axis, n in ((ax.xaxis, cols), (ax.yaxis, rows)):
        if n <= MAX_LABELLED_TICKS:
            axis.set_ticks(range(n))
        else:
            axis.set_major_locator(MaxNLocator(integer=True))


def _k_block_figure(plt, st, cap: float):
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    series: dict = {}
    for t in list(st.teacher_forced.tiles) + list(st.chained.tiles):
        if t.k_block is not None:
            series.setdefault((t.tile, t.partial), {})
            series[(t.tile, t.partial)][t.k_block] = max(series[(t.tile, t.partial)].get(t.k_block, 0.0),
                                                         _finite(t.max_ratio, cap))
    for (tile, part), pts in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        kbs = sorted(pts)
        ax.semilogy(kbs, [max(pts[k], FLOOR) for k in kbs], marker="o",
                    label=f"tile {tile}" + ("" if part is None else f" partial {part}"))
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k-block")
    ax.set_ylabel("worst err/bound")
    ax.set_title("mma: error per k-block\n(above the red line fails)")
    ax.legend(fontsize="small")
    return fig


def _save(fig, plt, directory: str, name: str) -> str:
    """The picture written whole, never through a link at its (fixed) name (harness.output_files)."""
    import io

    from harness.output_files import write_atomically

    path = os.path.join(directory, name)
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png", bbox_inches="tight")
    plt.close(fig)
    write_atomically(path, lambda f: f.write(png.getvalue()), "picture")
    return path

"""Pictures of a divergence (`compare --plots DIR`; matplotlib, the `plots` extra).

For every stage that diverges: a heatmap of the worst err/bound of each output tile (over k-blocks
and partials), the err/bound of every element of the worst failing unit, and for mma the worst
err/bound after each k-block of every traced tile. err/bound above 1 fails; bit-exact stages show
inf where the data differ. Files: <stage>_tiles.png, <stage>_worst_tile.png, mma_k_blocks.png.
"""

from __future__ import annotations

import math
import os

from oracle.judging.compare import Status


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
    import numpy as np

    plt = _pyplot()
    os.makedirs(directory, exist_ok=True)
    written = []
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
        grid = np.full((rows, cols), np.nan)
        for (tm, tn), v in worst.items():
            grid[tm, tn] = _finite(v, cap)
        fig, ax = plt.subplots(figsize=(max(4, cols * 0.6 + 2), max(3, rows * 0.6 + 1.5)))
        im = ax.imshow(np.log10(np.maximum(grid, 1e-12)), cmap="magma", interpolation="nearest")
        fig.colorbar(im, ax=ax, label="log10 worst err/bound (> 0 fails; blank: not compared)")
        ax.set_title(f"{st.name} ({label}): worst err/bound per tile")
        ax.set_xlabel("tile n")
        ax.set_ylabel("tile m")
        written.append(_save(fig, plt, directory, f"{st.name}_tiles.png"))
        unit = max((t for t in cmp.tiles if not t.passed and t.ratio_map is not None),
                   key=lambda t: (t.max_ratio, t.mismatches), default=None)
        if unit is not None:
            m = unit.ratio_map.numpy().copy()
            m[np.isinf(m)] = cap  # NaN (not compared) stays blank
            fig, ax = plt.subplots(figsize=(6, 5))
            im = ax.imshow(np.log10(np.maximum(m, 1e-12)), cmap="magma", interpolation="nearest", aspect="auto")
            fig.colorbar(im, ax=ax, label="log10 err/bound (blank: not compared)")
            kb = "" if unit.k_block is None else f", k-block {unit.k_block}"
            part = "" if unit.partial is None else f", partial {unit.partial}"
            ax.set_title(f"{st.name}: tile {unit.tile}{part}{kb}, per element")
            ax.set_xlabel("column in tile")
            ax.set_ylabel("row in tile")
            written.append(_save(fig, plt, directory, f"{st.name}_worst_tile.png"))
        if st.name == "mma":
            fig, ax = plt.subplots(figsize=(7, 4))
            series: dict = {}
            for t in list(st.teacher_forced.tiles) + list(st.chained.tiles):
                if t.k_block is not None:
                    series.setdefault((t.tile, t.partial), {})
                    series[(t.tile, t.partial)][t.k_block] = max(series[(t.tile, t.partial)].get(t.k_block, 0.0),
                                                                 _finite(t.max_ratio, cap))
            for (tile, part), pts in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
                kbs = sorted(pts)
                ax.semilogy(kbs, [max(pts[k], 1e-12) for k in kbs], marker="o",
                            label=f"tile {tile}" + ("" if part is None else f" partial {part}"))
            ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("k-block")
            ax.set_ylabel("worst err/bound")
            ax.set_title("mma: error per k-block (above the red line fails)")
            ax.legend(fontsize="small")
            written.append(_save(fig, plt, directory, "mma_k_blocks.png"))
    return written


def _save(fig, plt, directory: str, name: str) -> str:
    """The picture written whole, never through a link at its (fixed) name (harness.output_files)."""
    import io

    from harness.output_files import write_atomically

    path = os.path.join(directory, name)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    write_atomically(path, lambda f: f.write(png.getvalue()), "picture")
    return path

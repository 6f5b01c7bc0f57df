"""Pictures of a divergence (oracle.report.plots) read well for a one-tile stage: integer tile ticks,
the title and the colour bar inside the figure, and elements that were not compared (padding past M
and N) in a colour of their own with a legend entry; `compare --quiet --plots` prints nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

import numpy as np  # noqa: E402

from oracle.judging.differential import analyze  # noqa: E402
from oracle.problem.spec import ProblemSpec, Tile  # noqa: E402
from oracle.report import plots  # noqa: E402
from oracle.run.inputs import Provenance, make_operands  # noqa: E402
from oracle.run.simulate import Injection, simulate  # noqa: E402
from oracle.tools.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def one_tile():
    """A 40 x 40 problem in one 64 x 64 tile (rows and columns 40..63 are padding), mma defective."""
    import matplotlib.pyplot as plt

    spec = ProblemSpec(m=40, n=40, k=64, tile=Tile(64, 64, 32))
    rec = simulate(spec, make_operands(spec, "ones", 0), Provenance("ones"),
                   injection=Injection("mma_kblock_twice", (0, 0), 1))
    figs = dict(plots.figures(analyze(rec)))
    yield figs
    for fig in figs.values():
        plt.close(fig)


def _inside(fig, artist) -> bool:
    renderer = fig.canvas.get_renderer()
    box, page = artist.get_window_extent(renderer), fig.bbox
    return box.x0 >= page.x0 - 1 and box.y0 >= page.y0 - 1 and box.x1 <= page.x1 + 1 and box.y1 <= page.y1 + 1


def test_a_one_tile_heatmap_has_integer_ticks_and_its_title_and_colour_bar_inside(one_tile):
    fig = one_tile["mma_tiles.png"]
    fig.canvas.draw()
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [0] and list(ax.get_yticks()) == [0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0"]
    bar = fig.axes[1]
    for artist in (ax.title, bar, bar.yaxis.label):
        assert _inside(fig, artist), artist
    worst = one_tile["mma_worst_tile.png"]
    worst.canvas.draw()
    assert all(float(x).is_integer() for x in worst.axes[0].get_xticks())
    assert _inside(worst, worst.axes[0].title) and _inside(worst, worst.axes[1].yaxis.label)


def test_padding_is_drawn_in_its_own_colour_with_a_legend_entry(one_tile):
    fig = one_tile["mma_worst_tile.png"]
    ax = fig.axes[0]
    image = ax.images[0]
    data = image.get_array()
    assert data.mask[40:, :].all() and data.mask[:, 40:].all() and not data.mask[:40, :40].any()
    rgba = image.to_rgba(data)
    colour = tuple(np.round(np.array(plots_colour()), 3))
    assert tuple(np.round(rgba[50, 50], 3)) == colour
    zero = tuple(np.round(image.cmap(0.0), 3))  # the colour of the smallest error
    assert colour != zero and tuple(np.round(rgba[5, 5], 3)) != colour
    legend = ax.get_legend()
    assert legend is not None and "not compared" in legend.get_texts()[0].get_text()
    fig.canvas.draw()
    assert _inside(fig, legend)


def plots_colour():
    from matplotlib.colors import to_rgba

    return to_rgba(plots.NOT_COMPARED_COLOUR)


def test_quiet_plots_print_nothing(tmp_path, capsys):
    assert main(["compare", "--demo", "--quiet", "--plots", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err == "", out
    assert (tmp_path / "mma_tiles.png").read_bytes()[:4] == b"\x89PNG"

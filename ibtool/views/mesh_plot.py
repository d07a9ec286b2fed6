"""`ibtool mesh --plot FILE.png`: the heat map as a picture, with matplotlib (the `plot` extra),
imported only here and only when a plot is asked for.

An endpoint a row and a column up to PLOT_ENDPOINTS endpoints, else a node a row (each cell
the worst pair between the two nodes), else bins of nodes; coloured by health as the terminal's
heat map is (ibtool.views.mesh).
"""

from __future__ import annotations

from ibtool.errors import DataError, UnsupportedError
from ibtool.model.mesh import NONE, SELF, Health, fold, nodes_of
from ibtool.views import mesh as view

PLOT_ENDPOINTS = 64  # an endpoint a cell up to this many; nodes past it
PLOT_CELLS = 256  # cells a side at most (bins of nodes past it: a cell of 1,024 stays visible)
LABELLED = 64  # every label shown up to this many cells; every k-th past it
# the cells' colours, in the order of their codes on the image
KINDS = [
    (NONE, "no pair", "#f2f2f2"),
    (SELF, "self", "#b0b0b0"),
    (Health.OK, "OK", "#2ca02c"),
    (Health.SLOW, "SLOW", "#ffd11a"),
    (Health.LOSSY, "LOSSY", "#c040c0"),
    (Health.FAILED, "FAILED", "#d62728"),
]
HINT = "install matplotlib: apt install python3-matplotlib, or pip install 'ibtool[plot]'"


def require() -> None:
    """Raises UnsupportedError (exit 6) unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UnsupportedError("--plot needs matplotlib, which is not installed", HINT) from None


def plot(result, path: str) -> None:
    """The heat map of `result` as a PNG at `path`."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import BoundaryNorm, ListedColormap
        from matplotlib.figure import Figure
    except ImportError:
        raise UnsupportedError("--plot needs matplotlib, which is not installed", HINT) from None
    n = len(result.endpoints)
    if not n:
        raise DataError(f"--plot {path}: the mesh has no endpoints to draw")
    nodes = len(nodes_of(result))
    f = fold(result, n if n <= PLOT_ENDPOINTS else min(nodes, PLOT_CELLS))
    index = {code: k for k, (code, _, _) in enumerate(KINDS)}
    image = [[index[c] for c in row] for row in f.cells]
    g = len(f.labels)
    size = min(16.0, max(6.0, 0.16 * min(g, LABELLED) + 3.5))
    fig = Figure(figsize=(size + 1.6, size), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = ListedColormap([color for _, _, color in KINDS])
    norm = BoundaryNorm([k - 0.5 for k in range(len(KINDS) + 1)], cmap.N)
    shown = ax.imshow(image, cmap=cmap, norm=norm, interpolation="nearest", aspect="equal")
    step = 1 if g <= LABELLED else -(-g // LABELLED)
    ticks = list(range(0, g, step))
    labels = [f.labels[k] for k in ticks]
    font = 8 if g <= 32 else 6
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, rotation=90, fontsize=font)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=font)
    what = {"endpoint": "endpoint", "node": "node", "nodes": f"nodes (bins of {f.per_cell})"}
    ax.set_xlabel(f"destination {what.get(f.unit, f.unit)}")
    ax.set_ylabel(f"source {what.get(f.unit, f.unit)}")
    s = result.settings
    _, probed, _, _ = view.counts(result)
    worst = result.worst
    count = len(result.verdicts)
    status = (
        "healthy"
        if worst is None
        else f"{count} verdict{'' if count == 1 else 's'}, worst {worst.name}"
    )
    title = (
        f"ibtool mesh: {n:,} endpoints on {nodes:,} nodes, "
        f"{probed:,} pairs probed ({s.count} pings each): {status}"
    )
    if f.unit != "endpoint":
        title += "\neach cell: the worst pair between its " + (
            "two nodes" if f.unit == "node" else f"two bins of {f.per_cell} nodes"
        )
    ax.set_title(title, fontsize=10)
    bar = fig.colorbar(
        shown, ax=ax, ticks=list(range(len(KINDS))), fraction=0.04, pad=0.03, shrink=0.6
    )
    bar.ax.set_yticklabels([name for _, name, _ in KINDS])
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as e:
        raise DataError(f"--plot {path}: {e.strerror or e}") from None

"""The report's charts (``scripts/report.py``): each :class:`analysis.panels.Panel` as an interactive plotly figure for
the page and as a matplotlib PNG, in one colour per variant."""

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from matplotlib.colors import to_hex
from matplotlib.ticker import MaxNLocator

from analysis.panels import Heatmap, Line, Panel
from reporting.scales import block_name, heatmap_figure, heatmap_grid, log_grid

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MPL_DASH = {"solid": "-", "dash": "--", "dot": ":"}
SHADES = matplotlib.colormaps["viridis"]  # shaded lines (Line.shade), e.g. blocks by depth
DIVERGED_LABEL = "x: a diverged run's last finite value"
DRAWN_JS = "document.body.dataset.plotsDrawn = String(Number(document.body.dataset.plotsDrawn || 0) + 1);"


def variant_colors(variants: list) -> dict[str, str]:
    """Variant (or LR family: anything with a ``label``) label -> colour, the same in the HTML and the PNGs."""
    return {v.label: COLORS[i % len(COLORS)] for i, v in enumerate(variants)}


def line_color(line: Line, colors: dict[str, str]) -> str:
    """The line's colour: its variant's, or for a shaded line its place on viridis (up to 0.9 of it: the
    last yellow hardly shows on white)."""
    return colors[line.variant] if line.shade is None else to_hex(SHADES(0.9 * line.shade))


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def plotly_figure(panel: Panel, colors: dict[str, str]) -> go.Figure:
    """The plotly version of ``panel``. Every trace carries ``meta = {"role", "variant"}`` (``run``,
    ``mean``, ``band``, ``diverged`` or ``profile``), so the page's figure JSON says which curve is which; a
    ``mean`` line's band is one trace before it, its outlines (:meth:`Line.band_outline`) filled ``toself``."""
    fig = go.Figure()
    for line in panel.lines:
        _add_traces(fig, line, line_color(line, colors))
    if panel.heatmap is not None:
        _add_heatmap(fig, panel.heatmap)
    fig.update_layout(
        title=panel.title,
        template="plotly_white",
        margin={"t": 50, "b": 40},
        legend={"orientation": "h", "yanchor": "top", "y": -0.15, "font": {"size": 10}},
    )
    fig.update_xaxes(title=panel.xlabel, **({"dtick": 1} if panel.integer_x else {}), **({"type": "log"} if panel.log_x else {}))
    fig.update_yaxes(title=panel.ylabel, type="log" if panel.log_y else "linear")
    if panel.note:  # at the centre of an empty chart, else at the bottom, under the lines
        y = {"y": 0.5} if not panel.lines else {"y": 0.01, "yanchor": "bottom"}
        fig.add_annotation(text=panel.note, showarrow=False, xref="paper", yref="paper", x=0.5, **y)
    return fig


def _add_traces(fig: go.Figure, line: Line, color: str) -> None:
    """The trace(s) of one line. A point with no finite neighbour gets a marker (plotly draws no line through
    a lone point); a ``diverged`` line is an ``x`` marker. Lines of one variant told apart by shade toggle
    one by one in the legend, the others by variant."""
    meta = {"role": line.role, "variant": line.variant}
    group = line.variant if line.shade is None else line.name
    common = {"x": line.x, "mode": "lines", "legendgroup": group, "connectgaps": False, "hovertext": line.hover}
    if (lone := line.isolated) and line.role in ("run", "mean", "series"):
        common["mode"] = "lines+markers"
        common["marker"] = {"size": [7 if i in lone else 0 for i in range(len(line.y))], "color": color}
    if line.role == "run":
        fig.add_scatter(
            y=line.y,
            name=line.name,
            line={"color": color, "width": 1},
            opacity=0.45,
            showlegend=False,
            meta={**meta, "run": line.name},
            **common,
        )
    elif line.role == "mean":  # the band: one trace of closed outlines, never spanning a gap (Line.band_outline)
        x, y = line.band_outline()
        fig.add_scatter(
            x=x,
            y=y,
            name=f"{line.variant} band",
            mode="lines",
            fill="toself",
            fillcolor=_rgba(color, 0.15),
            connectgaps=False,
            line={"width": 0},
            legendgroup=group,
            showlegend=False,
            hoverinfo="skip",
            meta={**meta, "role": "band"},
        )
        fig.add_scatter(y=line.y, name=line.name, line={"color": color, "width": 2.5}, meta=meta, **common)
    elif line.role == "diverged":
        fig.add_scatter(
            y=line.y,
            name=line.name,
            **{**common, "mode": "markers"},
            showlegend=False,
            meta=meta,
            marker={"symbol": "x", "size": 11, "color": color, "line": {"width": 1, "color": "#222"}},
        )
    elif line.role == "series":
        fig.add_scatter(y=line.y, name=line.name, line={"color": color, "dash": line.dash, "width": 1.5}, meta=meta, **common)
    elif line.role == "interval":
        fig.add_scatter(
            y=line.y,
            name=line.name,
            **{**common, "mode": "markers"},
            meta=meta,
            marker={"size": 10, "color": color},
            error_y=_error_bars(line),
        )
    else:
        common["mode"] = "lines+markers"
        fig.add_scatter(y=line.y, name=line.name, line={"color": color, "dash": line.dash}, meta=meta, **common)


def _add_heatmap(fig: go.Figure, heatmap: Heatmap) -> None:
    """The heatmap's trace (``meta.role`` ``heatmap``), as ``reporting.scales.heatmap_figure`` draws it: blocks x
    steps, colour log10 of the value (``z``), the value itself in ``customdata`` and on hover; no cell where none."""
    steps, grid = heatmap_grid(heatmap.profiles, heatmap.site, heatmap.stat)
    depths = list(range(grid.shape[0]))
    fig.update_yaxes(tickvals=depths, ticktext=[block_name(d, heatmap.n_enc) for d in depths])
    fig.add_heatmap(
        x=steps,
        y=depths,
        z=_nulls(log_grid(grid)),
        customdata=_nulls(grid),
        colorscale="Viridis",
        colorbar={"title": {"text": f"log10 {heatmap.stat}"}},
        hovertemplate=f"step %{{x}}, %{{y}}: {heatmap.stat} %{{customdata:.4g}}<extra></extra>",
        meta={"role": "heatmap", "variant": heatmap.variant},
    )


def _nulls(grid: np.ndarray) -> list[list[float | None]]:
    """``grid`` as nested lists, NaN as None (JSON null: no cell)."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in grid]


def _error_bars(line: Line) -> dict | None:
    """plotly's ``error_y`` of an ``interval`` line: from ``y`` down to ``lo`` and up to ``hi``; None without them."""
    if line.lo is None or line.hi is None:
        return None
    up = [None if y is None or h is None else h - y for y, h in zip(line.y, line.hi, strict=True)]
    down = [None if y is None or lo is None else y - lo for y, lo in zip(line.y, line.lo, strict=True)]
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "width": 6}


def figure_html(fig: go.Figure, div_id: str, include_plotlyjs: bool) -> str:
    """A ``<div>`` drawing ``fig``; bumps ``<body data-plots-drawn>`` once plotly has drawn it."""
    return pio.to_html(
        fig,
        include_plotlyjs=include_plotlyjs,
        full_html=False,
        div_id=div_id,
        post_script=DRAWN_JS,
        default_height="100%",
        config={"responsive": True},
    )


def panel_figure(panel: Panel, colors: dict[str, str]) -> plt.Figure:
    """The matplotlib version of ``panel`` (markers as in :func:`plotly_figure`; a heatmap as ``plot_scales``
    draws one, ``reporting.scales.heatmap_figure``, under the panel's title); the caller closes it."""
    if (heatmap := panel.heatmap) is not None:
        fig = heatmap_figure(heatmap.profiles, heatmap.site, heatmap.stat, heatmap.n_enc)
        fig.axes[0].set_title(textwrap.fill(panel.title, 90), fontsize=9)
        return fig
    fig, ax = plt.subplots(figsize=(9, 5))
    for line in panel.lines:
        x, y, color = np.asarray(line.x, dtype=float), np.asarray(line.y, dtype=float), line_color(line, colors)
        lone: dict[str, Any] = {"marker": "o", "ms": 5, "markevery": line.isolated} if line.isolated else {}
        if line.role == "run":
            ax.plot(x, y, color=color, lw=0.8, alpha=0.4, **lone)
        elif line.role == "mean":
            ax.fill_between(x, np.asarray(line.lo, dtype=float), np.asarray(line.hi, dtype=float), color=color, alpha=0.15, lw=0)
            ax.plot(x, y, color=color, lw=2, label=line.name, **lone)
        elif line.role == "diverged":  # one legend entry for all the x's of the chart
            text = panel.diverged_label or DIVERGED_LABEL
            label = text if text not in ax.get_legend_handles_labels()[1] else None
            ax.plot(x, y, color=color, ls="none", marker="x", ms=9, mew=2, label=label)
        elif line.role == "interval":
            yerr = None if line.lo is None else [y - np.asarray(line.lo, dtype=float), np.asarray(line.hi, dtype=float) - y]
            ax.errorbar(x, y, yerr=yerr, color=color, fmt="o", ms=7, capsize=5, label=line.name)
        elif line.role == "series":
            ax.plot(x, y, color=color, ls=MPL_DASH.get(line.dash, "-"), lw=1.2, label=line.name, **lone)
        else:
            ax.plot(x, y, color=color, ls=MPL_DASH.get(line.dash, "-"), marker="o", ms=3, label=line.name)
    has_positive = any(v is not None and v > 0 for line in panel.lines for v in line.y)
    if panel.log_y and has_positive:
        ax.set_yscale("log")
    if panel.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.log_x:
        ax.set_xscale("log")
    if panel.note:  # at the centre of an empty chart, else at the bottom, under the lines
        at, va = (0.5, "center") if not panel.lines else (0.01, "bottom")
        ax.text(0.5, at, panel.note, ha="center", va=va, transform=ax.transAxes, color="#666", wrap=True)
    ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
    if n_labels := len(ax.get_legend_handles_labels()[0]):  # one block per line: more columns
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2 if n_labels < 12 else 4, frameon=False)
    return fig


def save_png(panel: Panel, colors: dict[str, str], out_dir: Path) -> Path:
    """Draw ``panel`` with matplotlib into ``out_dir/<panel.key>.png``; returns the path."""
    fig = panel_figure(panel, colors)
    path = out_dir / f"{panel.key}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path

"""The activation-scale figures of ``python -m scripts.plot_scales``: per-layer statistics as step x depth heatmaps and
depth profiles at chosen steps, read from a run's metrics.jsonl."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axis import Axis
from matplotlib.ticker import MaxNLocator

from analysis.depth import block_name
from analysis.load import read_config
from runlog.metric_names import depth_profile, n_enc_layers_seen, parse

LOG_SPAN = 10.0  # a depth panel's y axis is logarithmic when its largest value is at least this many times its smallest


def read_profiles(run_dir: Path, stat: str) -> dict[int, dict[str, list[tuple[int, float]]]]:
    """step -> site -> [(depth, value)] from every row of metrics.jsonl that carries telemetry.

    Raises:
        FileNotFoundError: no metrics.jsonl in run_dir.
        ValueError: the file holds no ``act/...`` statistics (telemetry was off).
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {str(run_dir)!r}; pass a run directory written by train.py")
    profiles = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        profile = depth_profile({k: v for k, v in row.items() if isinstance(v, float)}, stat)
        if profile:
            profiles[row["step"]] = profile
    if not profiles:
        raise ValueError(
            f"{path} has no act/.../{stat} statistics: the run had telemetry off "
            f"(telemetry=off or telemetry.every=0) or did not record this stat (telemetry.stats)"
        )
    return profiles


def encoder_depth(run_dir: Path) -> int:
    """The encoder's blocks: ``model.n_enc_layers`` of the run's ``config.yaml``, else as many as the telemetry names
    (``act/enc.{i}...`` in metrics.jsonl)."""
    config = read_config(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
    if isinstance(n_enc := config.get("model.n_enc_layers"), int):
        return n_enc
    with (run_dir / "metrics.jsonl").open(encoding="utf-8") as f:
        seen = {(m.stack, m.layer) for line in f for m in map(parse, json.loads(line)) if m and m.layer is not None}
    return n_enc_layers_seen(seen)


def _name_blocks(axis: Axis, depths: list[int], n_enc: int) -> None:
    """Ticks at ``depths`` on ``axis``, labelled with the blocks' names."""
    axis.set_ticks(depths, [block_name(d, n_enc) for d in depths])


def heatmap_grid(profiles: dict, site: str, stat: str) -> tuple[list[int], np.ndarray]:
    """(steps, grid) of ``stat`` at ``site``: the steps that recorded the site, ascending, and a block x step array
    of its values (NaN where a block has none).

    Raises:
        ValueError: no step recorded ``site``.
    """
    steps = sorted(s for s in profiles if site in profiles[s])
    if not steps:
        raise ValueError(f"no act/*.{site}/{stat} metrics; sites present: {sorted({k for p in profiles.values() for k in p})}")
    depth = max((d for s in steps for d, _ in profiles[s][site]), default=0) + 1
    grid = np.full((depth, len(steps)), np.nan)
    for j, s in enumerate(steps):
        for d, v in profiles[s][site]:
            grid[d, j] = v
    return steps, grid


def log_grid(grid: np.ndarray) -> np.ndarray:
    """log10 of ``grid``'s values, the heatmaps' colour (values below 1e-12 as 1e-12; NaN stays NaN)."""
    return np.log10(np.maximum(grid, 1e-12))


def cell_edges(steps: list[int]) -> list[float]:
    """The edges of the heatmap's columns, each centred on its step (halfway between neighbours; a lone step ± 0.5),
    so a column stands at the step it shows however the steps are spaced."""
    if len(steps) == 1:
        return [steps[0] - 0.5, steps[0] + 0.5]
    middles = [(a + b) / 2 for a, b in zip(steps, steps[1:], strict=False)]
    return [steps[0] - (middles[0] - steps[0]), *middles, steps[-1] + (steps[-1] - middles[-1])]


def heatmap_figure(profiles: dict, site: str, stat: str, n_enc: int) -> plt.Figure:
    """Block (rows, named ``enc.0`` ... ``dec.{n}``) x training step (a column centred on each recorded step:
    :func:`cell_edges`), colour = log10 of ``stat`` at ``site``, blank where not recorded, with a labelled colour bar;
    the caller closes it."""
    steps, grid = heatmap_grid(profiles, site, stat)
    depth = grid.shape[0]
    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.9 + 0.35 * depth)))  # room for the y label of a shallow model
    im = ax.pcolormesh(cell_edges(steps), np.arange(depth + 1) - 0.5, np.ma.masked_invalid(log_grid(grid)), cmap="viridis")
    _name_blocks(ax.yaxis, list(range(depth)), n_enc)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("block (encoder, then decoder)")
    ax.set_title(f"{stat} at site '{site}' of each block")
    fig.colorbar(im, ax=ax, label=f"log10 {stat}")
    return fig


def plot_heatmap(profiles: dict, site: str, stat: str, out: Path, n_enc: int) -> Path:
    """Draw :func:`heatmap_figure` into ``out/scale_heatmap.png``; returns the path."""
    fig = heatmap_figure(profiles, site, stat, n_enc)
    path = out / "scale_heatmap.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def depth_figure(profiles: dict, steps: list[int] | None, stat: str, n_enc: int) -> plt.Figure:
    """``stat`` vs block (named ``enc.0`` ... ``dec.{n}``) at a few steps (the nearest recorded to ``steps``; default:
    the first, middle and last), one panel per site and one legend for all of them. A panel's y axis is logarithmic
    only where its values span a factor of ``LOG_SPAN`` or more: on a narrow range a log axis reads as a flat line
    with unreadable ticks. The caller closes it."""
    available = sorted(profiles)
    if steps:
        chosen = sorted({min(available, key=lambda s: abs(s - want)) for want in steps})  # nearest recorded step
    else:
        chosen = sorted({available[0], available[len(available) // 2], available[-1]})
    sites = sorted({site for s in chosen for site in profiles[s]})
    cols = min(len(sites), 3)
    rows = -(-len(sites) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, site in zip(axes.flat, sites, strict=False):
        for s in chosen:
            points = sorted(profiles[s].get(site, []))
            ax.plot([d for d, _ in points], [v for _, v in points], marker="o", label=f"step {s}")
        values = [v for s in chosen for _, v in profiles[s].get(site, []) if v > 0]
        if values and max(values) >= LOG_SPAN * min(values):
            ax.set_yscale("log")
        _name_blocks(ax.xaxis, sorted({d for s in chosen for d, _ in profiles[s].get(site, [])}), n_enc)
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_title(site)
        ax.set_xlabel("block")
        ax.set_ylabel(stat)
    for ax in list(axes.flat)[len(sites) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.06 if rows == 1 else 0.03, 1, 1))  # room for the shared legend below
    return fig


def plot_depth(profiles: dict, steps: list[int] | None, stat: str, out: Path, n_enc: int) -> Path:
    """Draw :func:`depth_figure` into ``out/scale_vs_depth.png``; returns the path."""
    fig = depth_figure(profiles, steps, stat, n_enc)
    path = out / "scale_vs_depth.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

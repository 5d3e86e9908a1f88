"""Each variant's per-layer activation scale over training, the seed mean of what ``python -m scripts.plot_scales
RUN_DIR`` draws for one run (its heatmap, ``reporting/scales.py``): the RMS of the residual stream leaving each block,
``act/{block}.out/rms`` (the run's ``rms`` profile, ``analysis.load.PROFILES``), per telemetry step and block.

- :func:`scale_panels`: per variant whose runs recorded it, a step x block heatmap (``scale_heatmap_<j>.png``, j the
  variant's place in the variants table; the page's chart shows each cell's value on hover);
- :func:`write_scales`: ``scales.csv``, one row per variant, step and block (``SCALE_COLUMNS``).

A variant's steps are those every one of its runs that recorded the profile recorded (a seed that stopped early ends
the chart there, as it ends the variant's mean curve); a cell is the mean over those runs, None where one of them
has no finite value there. Runs without telemetry record nothing: no chart, no CSV.
"""

from pathlib import Path

from analysis.csvs import write_csv
from analysis.depth import block_name
from analysis.panels import Heatmap, Panel
from analysis.runs import Run
from analysis.stats import mean_stderr
from analysis.variants import Variant, averaged_runs

PROFILE = "rms"  # act/{block}.out/rms: plot_scales' default site (out) and statistic (rms)
SITE, STAT = "out", "rms"
SCALE_COLUMNS = ("variant", "step", "depth", "block", "mean", "stderr", "n")


def recorded(variant: Variant) -> list[Run]:
    """The variant's averaged runs that recorded the RMS profile at least once."""
    return [r for r in averaged_runs(variant.runs) if r.profile(PROFILE)]


def scale_cells(runs: list[Run]) -> dict[int, dict[int, tuple[float | None, float | None, int]]]:
    """step -> depth -> (mean, stderr, n) of the RMS over ``runs`` at each step every one of them recorded: n counts
    the runs with a value at that block; mean and stderr (:func:`~analysis.stats.mean_stderr`: sample std / √n, None
    for one run) are None where n is short of ``len(runs)``. {} without runs."""
    records = [r.profile(PROFILE) for r in runs]
    steps = sorted(set.intersection(*(set(rec) for rec in records))) if records else []
    cells: dict[int, dict[int, tuple[float | None, float | None, int]]] = {}
    for step in steps:
        depths = sorted({d for rec in records for d in rec[step]})
        values = {d: [rec[step][d] for rec in records if d in rec[step]] for d in depths}
        cells[step] = {d: (*(mean_stderr(v) if len(v) == len(runs) else (None, None)), len(v)) for d, v in values.items()}
    return cells


def scale_panels(variants: list[Variant]) -> list[Panel]:
    """One heatmap panel per variant whose runs recorded the RMS profile (module docstring), in variant order: block x
    step, colour log10 of the seed mean."""
    panels = []
    for j, variant in enumerate(variants, 1):
        runs = recorded(variant)
        if not (cells := scale_cells(runs)):
            continue
        profiles = {s: {SITE: [(d, m) for d, (m, _, _) in at.items() if m is not None]} for s, at in cells.items()}
        title = f"Residual RMS per block over training: {variant.shown} (mean of {len(runs)})"
        heatmap = Heatmap(variant.label, profiles, SITE, STAT, max(r.n_enc for r in runs))
        panels.append(Panel(f"scale_heatmap_{j}", title, "training step", "block (encoder, then decoder)", [], heatmap=heatmap))
    return panels


def scale_rows(variants: list[Variant]) -> list[tuple]:
    """The rows of ``scales.csv`` (``SCALE_COLUMNS``): per variant, step and depth (ascending), the block's name
    (``enc.1``; ``model.n_enc_layers`` of its runs places the decoder's) and :func:`scale_cells`' mean, stderr, n."""
    rows: list[tuple] = []
    for variant in variants:
        runs = recorded(variant)
        n_enc = max((r.n_enc for r in runs), default=0)
        for step, at in scale_cells(runs).items():
            rows.extend((variant.label, step, d, block_name(d, n_enc), mean, stderr, n) for d, (mean, stderr, n) in at.items())
    return rows


def write_scales(variants: list[Variant], out: Path) -> Path | None:
    """Write ``out/scales.csv`` (:func:`scale_rows`) when a run recorded the RMS profile; returns its path, or None."""
    rows = scale_rows(variants)
    return write_csv(out / "scales.csv", SCALE_COLUMNS, rows) if rows else None

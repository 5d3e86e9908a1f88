"""The report's view of hyper-connections' composite residual gain, ``hc/{stack}/{fwd_gain|bwd_gain}`` (the metric:
``telemetry/hyper_connections.py``; Xie et al. 2025, mHC, arXiv 2512.24880, sec. 3.1, Fig. 3: the "Amax Gain
Magnitude", max row sum (forward) and max column sum (backward) of the product of a stack's residual mixing matrices):

- ``hc_gain_<j>.png``, for the j-th variant (its place in the variants table) when its runs recorded the gain:
  gain vs step, log y, a line per stack and statistic (forward solid, backward dashed), the mean over its runs;
- ``hc_gains.csv``, when any run recorded it: one row per variant, stack and statistic: ``variant, stack, stat,
  runs`` (runs with a finite value), ``last_step`` (the latest step any of them recorded), ``last_mean``,
  ``last_max`` (mean and largest of each run's last finite value), ``max`` (the largest finite value any run
  recorded at any step), ``nonfinite`` (records whose gain was not a finite number: an overflow is an explosion,
  not a missing value).

Runs without ``norm.hc`` record no gain; a report of such runs has neither file.
"""

from pathlib import Path

from analysis.csvs import write_csv
from analysis.panels import Line, Panel
from analysis.stats import curves_band
from analysis.variants import Variant, averaged_runs
from runlog.metric_names import FAMILY_STATS, STACKS, hc_gain

HC_STATS = FAMILY_STATS["hc"]  # fwd_gain, bwd_gain
HC_COLUMNS = ("variant", "stack", "stat", "runs", "last_step", "last_mean", "last_max", "max", "nonfinite")


def _gain_series(variant: Variant, stack: str, stat: str) -> list[list[tuple[int, float | None]]]:
    """Each of ``variant``'s averaged runs' ``hc/{stack}/{stat}`` series: (step, value, None where not finite)."""
    name = hc_gain(stack, stat).name
    return [r.series.get(name, []) for r in averaged_runs(variant.runs)]


def hc_gain_panels(variants: list[Variant]) -> list[Panel]:
    """One panel per variant whose runs recorded a composite gain (module docstring), in variant order."""
    panels = []
    for j, variant in enumerate(variants, 1):
        lines = []
        for k, stack in enumerate(STACKS):
            for stat in HC_STATS:
                if curves := [c for c in _gain_series(variant, stack, stat) if any(v is not None for _, v in c)]:
                    steps, mean, _, _, n = curves_band(curves)
                    lines.append(
                        Line(
                            f"{stack} {stat}",
                            variant.label,
                            "series",
                            steps,
                            mean,
                            shade=k / (len(STACKS) - 1),
                            dash="solid" if stat == "fwd_gain" else "dash",
                            hover=[f"n = {m} of {len(curves)}" for m in n],
                        )
                    )
        if lines:
            title = f"Hyper-connections' composite residual gain vs step: {variant.shown}"
            panels.append(Panel(f"hc_gain_{j}", title, "training step", "amax gain (1: no amplification)", lines, log_y=True))
    return panels


def hc_gain_rows(variants: list[Variant]) -> list[tuple]:
    """The rows of ``hc_gains.csv`` (columns ``HC_COLUMNS``; module docstring), variants in order, then stack, stat."""
    rows = []
    for variant in variants:
        for stack in STACKS:
            for stat in HC_STATS:
                series = _gain_series(variant, stack, stat)
                finite = [[(s, v) for s, v in run if v is not None] for run in series]
                finite = [f for f in finite if f]
                if not finite:
                    continue
                lasts = [f[-1][1] for f in finite]
                overflows = sum(v is None for run in series for _, v in run)
                rows.append(
                    (
                        variant.label,
                        stack,
                        stat,
                        len(finite),
                        max(f[-1][0] for f in finite),
                        sum(lasts) / len(lasts),
                        max(lasts),
                        max(v for f in finite for _, v in f),
                        overflows,
                    )
                )
    return rows


def write_hc_gains(variants: list[Variant], out: Path) -> Path | None:
    """Write ``out/hc_gains.csv`` when any run recorded a composite gain; returns its path, or None (no file)."""
    rows = hc_gain_rows(variants)
    return write_csv(out / "hc_gains.csv", HC_COLUMNS, rows) if rows else None

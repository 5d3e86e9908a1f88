"""The data-regime tables of ``python -m scripts.report_regime``: per (preset, train fraction) the mean final valid loss and
saturation over seeds, and the paired difference against LayerNorm, as CSV rows."""

import statistics

from analysis.regime import Regime

RUN_FIELDS = ("preset", "train_fraction", "seed", "state", "final_val_loss", "saturation")
REGIME_FIELDS = (
    "preset",
    "train_fraction",
    "runs",
    "n",
    "val_loss_mean",
    "saturation_mean",
    "diff_mean",
    "diff_ci95_lo",
    "diff_ci95_hi",
    "pairs",
    "significant",
    "rel_diff",
    "saturation_step",
)


def _mean(values: dict) -> float | None:
    return statistics.fmean(values.values()) if values else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def regime_row(r: Regime, step: int) -> list[object]:
    """``r`` as a row of ``regime.csv`` (``REGIME_FIELDS``), its saturation read at telemetry step ``step``."""
    d = r.diff
    ci = d.ci95 if d is not None and d.ci95 else (None, None)
    paired = [d.mean, *ci, d.n, d.significant] if d is not None else [None] * 5
    return [r.preset, r.fraction, r.runs, len(r.val_loss), _mean(r.val_loss), _mean(r.saturation), *paired, r.rel_diff, step]


def summary_line(r: Regime, step: int, baseline: str) -> str:
    """The line printed per (preset, fraction): runs used of those run, mean valid loss and saturation at ``step``, and
    the mean paired difference from ``baseline`` (absolute and relative) where there is one."""
    # rel_diff is set wherever there are pairs
    vs = "" if r.diff is None or r.rel_diff is None else f"  vs {baseline}: {r.diff.mean:+.3f} ({100 * r.rel_diff:+.1f} %)"
    sat, loss = (_shown(_mean(values)) for values in (r.saturation, r.val_loss))
    return f"fraction {r.fraction:g}  {r.preset:<10} n {len(r.val_loss)}/{r.runs}  val loss {loss}  saturation@{step} {sat}{vs}"

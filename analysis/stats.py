"""Statistics over a variant's runs: the mean curve with its min-max or standard-error band, the mean of
per-run records at one step, the mean ± standard error, and the t interval of a mean.

Diverged runs are never averaged as if they had finished: :func:`curves_band` gives a mean only at
steps where every run has a finite value, leaving out a step that one run logged off the others' grid (a resumed
run's interrupted step, :func:`skipped_steps`). :func:`mean_stderr` and :func:`t_interval` take finite numbers only:
a NaN or an infinity is a ``ValueError`` naming it and its position, never a mean. :func:`zero_spread` says when
values agree to float rounding, where a t interval has width 0 and says nothing (see ``analysis.paired``).
"""

import math
import numbers
import statistics
from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np
from scipy import stats as scipy_stats

from analysis.runs import Run

Values = list[float | None]  # a series with gaps (None: no finite value)
Curve = Sequence[tuple[int, float | None]]  # (step, value or None) of one run
K = TypeVar("K", bound=Hashable)  # a profile's key: a depth or a BlockSite
SPREADS = ("minmax", "stderr")
ZERO_SPREAD_RTOL = 1e-9  # values agreeing to 9 significant digits differ by float rounding, not by seed


def curves_band(curves: Sequence[Curve], spread: str = "minmax") -> tuple[list[int], Values, Values, Values, list[int]]:
    """(steps, mean, lo, hi, n) of ``curves`` (one per run) at every step any of them has, but the steps one of them
    skipped (:func:`skipped_steps`: a resumed run's row at the step it was stopped at). ``n`` counts the curves
    with a finite value at that step; mean, lo and hi are None wherever ``n < len(curves)``, so a diverged or
    stopped seed ends the mean instead of leaving it to the survivors. ``spread`` ``minmax``: lo, hi = min, max;
    ``stderr``: mean ∓ the standard error of :func:`mean_stderr` (None for one curve).

    Raises:
        ValueError: ``spread`` not in ``SPREADS``.
    """
    if spread not in SPREADS:
        raise ValueError(f"unknown spread {spread!r}; valid: {', '.join(SPREADS)}")
    by_step: dict[int, list[float]] = {}
    for curve in curves:
        for step, value in curve:
            by_step.setdefault(step, [])
            if value is not None:
                by_step[step].append(value)
    steps = sorted(set(by_step) - skipped_steps(curves))
    stats = [_band(by_step[s], spread) if len(by_step[s]) == len(curves) else (None, None, None) for s in steps]
    return steps, [s[0] for s in stats], [s[1] for s in stats], [s[2] for s in stats], [len(by_step[s]) for s in steps]


def skipped_steps(curves: Sequence[Curve]) -> set[int]:
    """The steps some curve skipped: it has none there, but steps before and after. A run stopped by SIGTERM or
    Ctrl-C logs a row at the step it stopped at (``train.py``), off its logging grid (162 between 160 and 170),
    and continues on the grid once resumed; a run that never stopped has no row there. Averaging the curves
    there would leave a gap in their mean, so :func:`curves_band` leaves such steps out (each run's own curve
    keeps them). Steps after a curve's last one are not skipped: a run that stopped for good ends the mean."""
    logged = [{step for step, _ in curve} for curve in curves]
    spans = [(min(steps), max(steps), steps) for steps in logged if steps]
    return {s for steps in logged for s in steps if any(lo < s < hi and s not in own for lo, hi, own in spans)}


def _band(values: list[float], spread: str) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    if spread == "minmax":
        return float(np.mean(values)), min(values), max(values)
    mean, stderr = mean_stderr(values)
    if mean is None or stderr is None:  # one value
        return mean, None, None
    return mean, mean - stderr, mean + stderr


def mean_band(runs: list[Run], metric: str) -> tuple[list[int], Values, Values, Values, list[int]]:
    """(steps, mean, min, max, n) of ``metric`` over ``runs``' series (:func:`curves_band`, min-max)."""
    return curves_band([run.series.get(metric, []) for run in runs])


def mean_at(records: list[dict[int, dict[K, float]]], step: int) -> dict[K, float]:
    """key -> the mean of its values at ``step`` over ``records`` (step -> key -> value, one per run);
    a run without ``step``, or without the key there, is left out of that key's mean."""
    pooled: dict[K, list[float]] = {}
    for record in records:
        for key, value in record.get(step, {}).items():
            pooled.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in pooled.items()}


def check_finite(values: Sequence[float]) -> None:
    """Raises ValueError naming the first value of ``values`` that is not a finite number, and its position."""
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"value {i} of {len(values)} is {value!r}: statistics need finite numbers")


def zero_spread(values: Sequence[float]) -> bool:
    """Whether two or more ``values`` all agree: max - min <= ``ZERO_SPREAD_RTOL`` * max |value| (exactly equal when
    all are 0). Their sample std is then 0 or float rounding, and a t interval around their mean has width ~0."""
    if len(values) < 2:
        return False
    check_finite(values)
    return max(values) - min(values) <= ZERO_SPREAD_RTOL * max(abs(v) for v in values)


def mean_stderr(values: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean) of ``values``: stderr = sample std (n - 1 in the denominator) / sqrt(n);
    None for a mean of no values or a stderr of fewer than two.

    Raises:
        ValueError: a value is not a finite number (:func:`check_finite`).
    """
    check_finite(values)
    mean = statistics.fmean(values) if values else None
    return mean, statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The ``confidence`` interval of the mean of ``values``: mean ∓ t.ppf((1 + confidence) / 2, n - 1) * stderr
    (Student's t, n - 1 degrees of freedom, ``scipy.stats.t``; stderr of :func:`mean_stderr`); None for n < 2.

    Raises:
        ValueError: a value is not a finite number (:func:`check_finite`).
    """
    mean, stderr = mean_stderr(list(values))
    if mean is None or stderr is None:  # fewer than two values
        return None
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, len(values) - 1)) * stderr
    return mean - half, mean + half

"""Statistics over a variant's runs: the mean curve with its min-max band, and the mean ± standard error.

Diverged runs are never averaged as if they had finished: :func:`mean_band` gives a mean only at
steps where every run has a finite value.
"""

import math
import statistics

import numpy as np

from analysis.runs import Run

Values = list[float | None]  # a series with gaps (None: no finite value)


def mean_band(runs: list[Run], metric: str) -> tuple[list[int], Values, Values, Values, list[int]]:
    """(steps, mean, min, max, n) of ``metric`` over ``runs`` at every step any of them logged it. ``n`` counts
    the runs with a finite value at that step; mean, min and max are None wherever ``n < len(runs)``, so a
    diverged or stopped seed ends the mean instead of leaving it to the survivors."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for step, value in run.series.get(metric, []):
            by_step.setdefault(step, [])
            if value is not None:
                by_step[step].append(value)
    steps = sorted(by_step)
    complete = [by_step[s] if len(by_step[s]) == len(runs) else [] for s in steps]
    stats = [(float(np.mean(v)), min(v), max(v)) if v else (None, None, None) for v in complete]
    return steps, [s[0] for s in stats], [s[1] for s in stats], [s[2] for s in stats], [len(by_step[s]) for s in steps]


def mean_stderr(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean) of ``values``: stderr = sample std (n - 1 in the denominator) / sqrt(n);
    None for a mean of no values or a stderr of fewer than two."""
    mean = statistics.fmean(values) if values else None
    return mean, statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None

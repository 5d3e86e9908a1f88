"""Comparing variants seed by seed: each variant's difference to a baseline variant over the seeds both
finished, with a 95% confidence interval from the paired t test; the baseline's noise floor (its seed-to-seed
sample standard deviation); and the rows of the report's ``summary.csv``.

A paired difference whose per-seed differences all agree (zero spread, :func:`analysis.stats.zero_spread`) is
*degenerate*: sd = 0 makes the t interval a point and the t statistic mean / 0, so it has no interval and is not
significant, whatever its mean; the table says ``degenerate (zero spread)``. A non-finite value is a ``ValueError``.

As in the report's variants table, only finished runs enter: a diverged (or crashed, or running) run is
counted, never averaged and never paired. Metrics are the run's values as stored (PER/WER as fractions).
"""

import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from analysis.load import ReportError
from analysis.params import params_ratio, shared_count
from analysis.runs import Run, finite
from analysis.stats import check_finite, mean_stderr, t_interval, zero_spread
from analysis.variants import Variant
from runlog.tasks import TaskSpec

Getter = Callable[[Run], float | None]
CI_LEVEL = 0.95
SUMMARY_COLUMNS = ("variant", "metric", "runs", "finished", "diverged", "n", "mean", "stderr", "std")
BASELINE_COLUMNS = ("baseline", "diff_mean", "diff_ci95_lo", "diff_ci95_hi", "pairs", "significant", "degenerate")  # --baseline
PARAMS_COLUMNS = ("params", "hc_params")  # after the older ones (committed summary.csv files keep their columns)
PARAMS_BASELINE_COLUMNS = ("params_ratio",)  # --baseline
NAME_COLUMNS = ("name", "preset")  # last: the variant as the page names it, the norm preset its runs used (analysis.names)
DEGENERATE = "degenerate (zero spread)"


@dataclass(frozen=True)
class PairedDifference:
    """values − baseline over the seeds both have.

    Attributes:
        n: the number of pairs (seeds in both).
        mean: the mean difference; None without a pair.
        ci95: (lo, hi), mean ∓ t(0.975, n − 1) · sd(differences) / √n; None with fewer than two pairs, and when
            ``degenerate``.
        significant: whether ``ci95`` excludes 0; None with fewer than two pairs; False when ``degenerate``.
        degenerate: two or more pairs whose differences all agree (zero spread): no interval, not significant.
        note: why seeds were left out of the pairs beyond not being in both (e.g. an LR family's seeds that did
            not learn); empty when none were.
    """

    n: int
    mean: float | None
    ci95: tuple[float, float] | None
    significant: bool | None
    degenerate: bool = False
    note: str = ""


def paired_difference(values: dict[Hashable, float], baseline: dict[Hashable, float]) -> PairedDifference:
    """The paired t test of ``values`` against ``baseline`` (seed -> value each); seeds in only one are dropped.

    Example: {0: 1.5, 1: 2.4, 2: 3.8} vs {0: 1.0, 1: 2.0, 2: 3.0}: differences 0.5, 0.4, 0.8, mean 0.5667,
    sd 0.2082, t(0.975, 2) = 4.3027, so 95% CI [0.0496, 1.0838]: significant. {0: 1.5, 1: 2.5} vs {0: 1.0,
    1: 2.0}: differences 0.5, 0.5, degenerate (zero spread): no interval, not significant.

    Raises:
        ValueError: a value of either is not a finite number; the message names it and its seed.
    """
    for name, given in (("values", values), ("baseline", baseline)):
        for seed, value in given.items():
            if finite(value) is None:
                raise ValueError(f"{name}[{seed!r}] is {value!r}: a paired difference needs finite numbers")
    return of_differences([values[seed] - baseline[seed] for seed in values if seed in baseline])


def of_differences(diffs: list[float], confidence: float = CI_LEVEL) -> PairedDifference:
    """The paired t test of per-pair differences ``diffs`` (:func:`paired_difference`'s), its interval (``ci95``) at
    ``confidence`` (0.95 unless asked; a claims file's 1 - alpha, :mod:`analysis.verdicts`).

    Raises:
        ValueError: a difference is not a finite number.
    """
    check_finite(diffs)
    mean = statistics.fmean(diffs) if diffs else None
    if zero_spread(diffs):
        return PairedDifference(len(diffs), mean, None, False, degenerate=True)
    ci = t_interval(diffs, confidence)  # the paired t test's interval: the t interval of the mean difference
    return PairedDifference(len(diffs), mean, ci, None if ci is None else not ci[0] <= 0.0 <= ci[1])


def delta_text(diff: PairedDifference, signed: Callable[[float], str]) -> str:
    """``+0.57 [+0.05, +1.08] (3)``; ``n.s.`` appended when the interval covers 0, ``degenerate (zero spread)``
    instead of an interval when every pair differs by the same amount; then ``; `` and the note, if any."""
    note = f"; {diff.note}" if diff.note else ""
    if diff.mean is None:
        return f"— (0){note}"
    ci = "" if diff.ci95 is None else f" [{signed(diff.ci95[0])}, {signed(diff.ci95[1])}]"
    verdict = f" {DEGENERATE}" if diff.degenerate else " n.s." if diff.significant is False else ""
    return f"{signed(diff.mean)}{ci} ({diff.n}){verdict}{note}"


def quality_metrics(task: TaskSpec) -> dict[str, Getter]:
    """The metrics compared between variants, by the variants table's column key: each test metric of ``task``
    (``test/per``, ``test/wer``; ``test/bleu``, ``test/chrf``) and ``best_val_loss`` (the run's lowest valid loss)."""
    return {**{f"test/{m.key}": _final(f"test/{m.key}") for m in task.metrics}, "best_val_loss": lambda r: r.best("val/loss")}


def _final(metric: str) -> Getter:
    return lambda run: run.final(metric)


def finished_values(runs: list[Run], get: Getter) -> list[float]:
    """``get(run)`` of each finished run that has a value: what the variants table averages."""
    return [x for x in (get(r) for r in runs if r.finished) if x is not None]


def seed_values(runs: list[Run], get: Getter) -> dict[Hashable, float]:
    """seed -> ``get(run)`` over the finished runs that have a value. Runs of one seed (the same run given
    twice) are averaged; a run without a seed cannot be paired and is left out."""
    by_seed: dict[Hashable, list[float]] = {}
    for run in runs:
        if run.finished and run.seed is not None and (value := get(run)) is not None:
            by_seed.setdefault(run.seed, []).append(value)
    return {seed: statistics.fmean(vs) for seed, vs in by_seed.items()}


def noise_floor(baseline: Variant, get: Getter) -> float | None:
    """The baseline's seed-to-seed sample standard deviation (n − 1) of a metric over its finished runs;
    None with fewer than two."""
    return _std(finished_values(baseline.runs, get))


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def versus(variant: Variant, baseline: Variant, get: Getter) -> PairedDifference | None:
    """``variant`` − ``baseline`` in a metric, paired by seed (:func:`paired_difference`); None for the baseline itself."""
    if variant is baseline:
        return None
    return paired_difference(seed_values(variant.runs, get), seed_values(baseline.runs, get))


def find_baseline(variants: list[Variant], label: str | None, others: Sequence[str] = ()) -> Variant | None:
    """The variant labelled ``label`` (None for None, or for a label in ``others``: e.g. an LR family's, which
    the LR-sensitivity table compares against instead).

    Raises:
        ReportError: neither a variant nor one of ``others`` has that label; the message lists the valid ones.
    """
    if label is None or label in others:
        return None
    for variant in variants:
        if variant.label == label:
            return variant
    valid = ", ".join(repr(label) for label in [*(v.label for v in variants), *others])
    raise ReportError(f"unknown --baseline {label!r}; valid: {valid}")


def summary_rows(variants: list[Variant], task: TaskSpec, baseline: Variant | None) -> list[dict[str, object]]:
    """One row per (variant, metric of :func:`quality_metrics`), keyed by ``SUMMARY_COLUMNS``, ``PARAMS_COLUMNS``
    (+ ``BASELINE_COLUMNS`` and ``PARAMS_BASELINE_COLUMNS`` with a baseline), ``NAME_COLUMNS``: run counts, n (finished
    runs with the value), mean, stderr and sample std over them, the variant's parameter counts
    (``analysis.params.shared_count``), the paired difference and parameter ratio to the baseline (left None in the
    baseline's own rows), the variant's name and norm preset (``Variant.shown``, ``Variant.preset``). Unformatted
    values; None: no value."""
    rows = []
    for variant in variants:
        for metric, get in quality_metrics(task).items():
            values = finished_values(variant.runs, get)
            mean, stderr = mean_stderr(values)
            row = {
                "variant": variant.label,
                "metric": metric,
                "runs": len(variant.runs),
                "finished": sum(r.finished for r in variant.runs),
                "diverged": sum(r.diverged for r in variant.runs),
                "n": len(values),
                "mean": mean,
                "stderr": stderr,
                "std": _std(values),
            }
            row |= {"params": shared_count(variant.runs), "hc_params": shared_count(variant.runs, hc=True)}
            if baseline is not None:
                row |= _baseline_fields(versus(variant, baseline, get), baseline.label)
                row["params_ratio"] = None if variant is baseline else params_ratio(variant.runs, baseline.runs)
            rows.append(row | {"name": variant.shown, "preset": variant.preset})
    return rows


def _baseline_fields(diff: PairedDifference | None, baseline: str) -> dict[str, object]:
    """The ``BASELINE_COLUMNS`` of a summary row; all but ``baseline`` None in the baseline's own rows; ``degenerate``
    None with fewer than two pairs (no test)."""
    if diff is None:
        return {"baseline": baseline} | dict.fromkeys(BASELINE_COLUMNS[1:])
    lo, hi = diff.ci95 if diff.ci95 is not None else (None, None)
    return {
        "baseline": baseline,
        "diff_mean": diff.mean,
        "diff_ci95_lo": lo,
        "diff_ci95_hi": hi,
        "pairs": diff.n,
        "significant": diff.significant,
        "degenerate": diff.degenerate if diff.n > 1 else None,
    }

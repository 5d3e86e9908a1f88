"""Paired contrasts between rows of committed per-run CSVs (a results section's ``runs.csv``, ``regime_runs.csv``):
what docs/results.md quotes beyond its report's own tables, recomputed from the CSVs alone, so a reader needs no run
dirs to check it.

A contrast (one entry of a spec file, ``docs/results/<section>/paired.yaml``):

- ``contrast``: its name, the key of its row in the output;
- ``csv``: the per-run CSV, relative to the spec's folder; ``metric``: its column;
- ``arm`` and ``baseline``: each a selector ``{column: value}`` picking one cell's rows (one row per seed; how a
  selector matches: :mod:`analysis.selection`); a side may name its own ``csv`` (a diagnostic run's CSV beside the
  study's);
- ``minus`` (optional): ``{arm: ..., baseline: ...}``, a second arm-minus-baseline subtracted seed by seed: a
  difference of differences (does the first difference change with the setting?);
- ``relative`` (optional, true): also the difference over the baseline's mean over the paired seeds (the paper's unit
  where it quotes a relative change); not with ``minus``.

Only finished rows with a value enter (an unfinished row, :mod:`analysis.selection`'s, is left out). Seeds pair by
the ``seed`` column, over the seeds every side has; the interval is :func:`analysis.paired.of_differences`'s (95 %, t
with n - 1 dof). Every error is a :class:`ContrastError` of one line naming the spec file, the contrast, the bad value
and the valid choices.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis.paired import PairedDifference, of_differences
from analysis.selection import Measure, SelectionError, Tables, differences, keys, parse_contrast, parse_minus, side_values

COLUMNS = (
    "contrast",
    "metric",
    "diff_mean",
    "diff_ci95_lo",
    "diff_ci95_hi",
    "pairs",
    "significant",
    "rel_diff",
    "rel_ci95_lo",
    "rel_ci95_hi",
)
SPEC_KEYS = ("contrast", "csv", "metric", "arm", "baseline", "minus", "relative")
SPEC_REQUIRED = ("contrast", "csv", "metric", "arm", "baseline")
PAIR_BY = "seed"


class ContrastError(SelectionError):
    """A spec or CSV that cannot give a contrast; the message is one line naming the spec file, the contrast, the bad
    value and the valid choices."""


@dataclass(frozen=True)
class Contrast:
    """One computed contrast: its paired difference and, for a ``relative`` one, that difference's mean and interval
    over the baseline's mean (fractions; None otherwise)."""

    name: str
    metric: str
    diff: PairedDifference
    relative: tuple[float, float, float] | None

    def row(self) -> list[object]:
        """The contrast as a row of ``COLUMNS`` (None: no value)."""
        d = self.diff
        lo, hi = d.ci95 or (None, None)
        return [self.name, self.metric, d.mean, lo, hi, d.n, d.significant, *(self.relative or (None, None, None))]


def compute(spec: dict, path: Path) -> Contrast:
    """The contrast of one entry of the spec file at ``path`` (module docstring), its CSVs read under its folder.

    Raises:
        ContrastError: an unknown or missing key, ``relative`` with ``minus``, a selector or CSV that
            :func:`analysis.selection.differences` refuses (no CSV, no column, no finished row matching, a seed
            twice, no seed on every side).
    """
    name = spec.get("contrast", "?")
    here = f"{path}: contrast {name!r}"
    try:
        keys(spec, SPEC_KEYS, SPEC_REQUIRED, here)
        if spec.get("relative") and "minus" in spec:
            raise ContrastError(f"{here}: 'relative' is for a plain difference, not with 'minus'; valid: one of them")
        csv, metric = str(spec["csv"]), str(spec["metric"])
        contrast = parse_contrast(spec, csv, here, allow_against=False)
        minus = parse_minus(spec["minus"], csv, here) if "minus" in spec else None
        measure, tables = Measure(csv, metric, PAIR_BY), Tables(path.parent)
        diffs = differences(contrast, minus, measure, tables, here, unfinished="skip")
        diff = of_differences(list(diffs.values()))
        assert contrast.baseline is not None  # allow_against=False: parse_contrast requires a baseline
        base = side_values(contrast.baseline, measure, tables, here, unfinished="skip") if spec.get("relative") else {}
    except SelectionError as err:  # the selectors' errors, as this module's
        raise err if isinstance(err, ContrastError) else ContrastError(str(err)) from None
    return Contrast(str(name), metric, diff, _relative(diff, base, diffs) if spec.get("relative") else None)


def _relative(diff: PairedDifference, base: dict, diffs: dict) -> tuple[float, float, float] | None:
    """(mean, lo, hi) of ``diff`` over the baseline's mean over the paired seeds; None without an interval."""
    if diff.mean is None or diff.ci95 is None:
        return None
    b = statistics.fmean(base[s] for s in diffs)
    return diff.mean / b, diff.ci95[0] / b, diff.ci95[1] / b


def load_spec(path: Path) -> list[dict]:
    """The contrasts of a spec file (YAML: ``contrasts:`` a list of entries).

    Raises:
        ContrastError: no such file, not YAML, or no ``contrasts`` list of mappings.
    """
    if not path.is_file():
        raise ContrastError(f"no spec file {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ContrastError(f"{path}: not YAML ({str(err).splitlines()[0]})") from None
    entries = data.get("contrasts") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ContrastError(f"{path}: wants 'contrasts:', a list of mappings (contrast, csv, metric, arm, baseline)")
    return entries
